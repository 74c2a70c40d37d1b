// Framework-free CUDA kernels of distill::AddNorm (trainer/src/models/layers.h): the residual add
// of a pre-norm transformer fused with the norm that follows it,
//   h = x + y,   out = norm(h) * w (+ b)   (norm: LayerNorm or RMSNorm over the last dimension),
// and its backward, which also adds the gradient arriving at h from further on. x, h and every
// statistic are fp32; y and out may be bf16 / fp16 (the branch output and the next matmul's input
// under autocast) or fp32. One block of kThreads threads per row; a row lives in registers
// (kPer values per thread, D <= kThreads * kPer).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "convert.cuh"

namespace distill::kernels {

constexpr int kAddNormThreads = 256;
constexpr int kAddNormMaxPer = 32;  // D <= 8192

__device__ __forceinline__ float2 WarpSum2(float2 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  return v;
}

// The sum over the block of two values per thread, returned to every thread.
__device__ __forceinline__ float2 BlockSum2(float2 v) {
  __shared__ float2 partial[kAddNormThreads / 32];
  __shared__ float2 total;
  v = WarpSum2(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float2 s = lane < kAddNormThreads / 32 ? partial[lane] : make_float2(0.f, 0.f);
    s = WarpSum2(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float2 result = total;
  __syncthreads();  // the next call may overwrite partial and total
  return result;
}

// Row `blockIdx.x`: h = x + y (written), mean / rstd (written), out = norm(h) * w + b.
// Two passes over the row held in registers (the mean, then the centred squares), as ATen's
// LayerNorm computes the biased variance; RMSNorm: mean = 0, rstd = rsqrt(mean(h^2) + eps).
template <typename TY, typename TO, bool kRms, int kPer>
__global__ void __launch_bounds__(kAddNormThreads)
    AddNormForwardKernel(const float* __restrict__ x, const TY* __restrict__ y,
                         const float* __restrict__ w, const float* __restrict__ b,
                         float* __restrict__ h, TO* __restrict__ out, float* __restrict__ mean_out,
                         float* __restrict__ rstd_out, int64_t D, float eps) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * D;
  float v[kPer];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kAddNormThreads;
    v[k] = 0.f;
    if (j < D) {
      v[k] = x[offset + j] + ToFloat(y[offset + j]);
      h[offset + j] = v[k];
      sum += v[k];
    }
  }
  const float inv_d = 1.f / static_cast<float>(D);
  const float mean = kRms ? 0.f : BlockSum2(make_float2(sum, 0.f)).x * inv_d;
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kAddNormThreads;
    if (j < D) sq += (v[k] - mean) * (v[k] - mean);
  }
  const float rstd = rsqrtf(BlockSum2(make_float2(sq, 0.f)).x * inv_d + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kAddNormThreads;
    if (j < D) {
      float o = (v[k] - mean) * rstd * w[j];
      if (b != nullptr) o += b[j];
      out[offset + j] = FromFloat<TO>(o);
    }
  }
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}

// Rows blockIdx.x, blockIdx.x + gridDim.x, ...: with g = grad_out * w and x_hat = (h - mean) *
// rstd,
//   grad_h_total = grad_h + rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (RMSNorm: no mean(g)),
// written to grad_x (fp32) and, cast, to grad_y (when not null). The block's
// column sums of grad_out * x_hat and grad_out go to row blockIdx.x of dw_partial / db_partial
// (gridDim.x x D, fp32), summed over blocks afterwards.
template <typename TY, typename TO, bool kRms, int kPer>
__global__ void __launch_bounds__(kAddNormThreads)
    AddNormBackwardKernel(const TO* __restrict__ grad_out, const float* __restrict__ grad_h,
                          const float* __restrict__ h, const float* __restrict__ w,
                          const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                          float* __restrict__ grad_x, TY* __restrict__ grad_y,
                          float* __restrict__ dw_partial, float* __restrict__ db_partial,
                          int64_t rows, int64_t D) {
  float dw[kPer], db[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) dw[k] = db[k] = 0.f;
  const float inv_d = 1.f / static_cast<float>(D);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * D;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float g[kPer], xh[kPer];
    float2 sums = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kAddNormThreads;
      g[k] = xh[k] = 0.f;
      if (j < D) {
        const float go = ToFloat(grad_out[offset + j]);
        xh[k] = (h[offset + j] - mean) * rstd;
        g[k] = go * w[j];
        dw[k] += go * xh[k];
        db[k] += go;
        sums.x += g[k];
        sums.y += g[k] * xh[k];
      }
    }
    sums = BlockSum2(sums);
    const float mean_g = kRms ? 0.f : sums.x * inv_d, mean_gx = sums.y * inv_d;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kAddNormThreads;
      if (j < D) {
        float total = rstd * (g[k] - mean_g - xh[k] * mean_gx);
        if (grad_h != nullptr) total += grad_h[offset + j];
        grad_x[offset + j] = total;
        if (grad_y != nullptr) grad_y[offset + j] = FromFloat<TY>(total);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * kAddNormThreads;
    if (j < D) {
      dw_partial[blockIdx.x * D + j] = dw[k];
      db_partial[blockIdx.x * D + j] = db[k];
    }
  }
}

}  // namespace distill::kernels

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

// kV consecutive values of T at p (kV * sizeof(T)-byte aligned) as floats, and back.
template <int kV, typename T>
__device__ __forceinline__ void LoadVec(const T* __restrict__ p, float (&out)[kV]) {
  if constexpr (kV == 1) {
    out[0] = ToFloat(p[0]);
  } else if constexpr (sizeof(T) == 4) {
    static_assert(kV == 4, "fp32 vectors are 4 wide");
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    static_assert(kV == 4 && sizeof(T) == 2, "16-bit vectors are 4 wide");
    union {
      uint2 raw;
      T v[4];
    } u;
    u.raw = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = ToFloat(u.v[e]);
  }
}
template <int kV, typename T>
__device__ __forceinline__ void StoreVec(T* __restrict__ p, const float (&in)[kV]) {
  if constexpr (kV == 1) {
    p[0] = FromFloat<T>(in[0]);
  } else if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
    union {
      uint2 raw;
      T v[4];
    } u;
#pragma unroll
    for (int e = 0; e < 4; ++e) u.v[e] = FromFloat<T>(in[e]);
    *reinterpret_cast<uint2*>(p) = u.raw;
  }
}

// Rows blockIdx.x, blockIdx.x + gridDim.x, ...: with g = grad_out * w and x_hat = (h - mean) *
// rstd,
//   grad_h_total = grad_h + rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (RMSNorm: no mean(g)),
// written to grad_x (fp32) and, cast, to grad_y (when not null). The block's
// column sums of grad_out * x_hat and grad_out go to row blockIdx.x of dw_partial / db_partial
// (gridDim.x x D, fp32), summed over blocks afterwards.
// A thread holds kPer values of a row as kPer / kV vectors of kV consecutive columns, columns
// (threadIdx.x + i * kThreads) * kV + e: kV = 4 (one 16-byte fp32 load per vector; D a multiple
// of 4 and the rows aligned) makes a quarter of the per-value loads of kV = 1 (at D = 1024 the
// scalar loads ran the kernel at ~57% of the copy bandwidth).
template <typename TY, typename TO, bool kRms, int kPer, int kV = 1>
__global__ void __launch_bounds__(kAddNormThreads)
    AddNormBackwardKernel(const TO* __restrict__ grad_out, const float* __restrict__ grad_h,
                          const float* __restrict__ h, const float* __restrict__ w,
                          const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                          float* __restrict__ grad_x, TY* __restrict__ grad_y,
                          float* __restrict__ dw_partial, float* __restrict__ db_partial,
                          int64_t rows, int64_t D) {
  static_assert(kPer % kV == 0, "a thread's values are whole vectors");
  constexpr int kN = kPer / kV;
  float dw[kN][kV], db[kN][kV];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int e = 0; e < kV; ++e) dw[i][e] = db[i][e] = 0.f;
  }
  const float inv_d = 1.f / static_cast<float>(D);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * D;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float g[kN][kV], xh[kN][kV];
    float2 sums = make_float2(0.f, 0.f);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int64_t j = (threadIdx.x + static_cast<int64_t>(i) * kAddNormThreads) * kV;
#pragma unroll
      for (int e = 0; e < kV; ++e) g[i][e] = xh[i][e] = 0.f;
      if (j < D) {
        float go[kV], hv[kV], wv[kV];
        LoadVec<kV>(grad_out + offset + j, go);
        LoadVec<kV>(h + offset + j, hv);
        LoadVec<kV>(w + j, wv);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          xh[i][e] = (hv[e] - mean) * rstd;
          g[i][e] = go[e] * wv[e];
          dw[i][e] += go[e] * xh[i][e];
          db[i][e] += go[e];
          sums.x += g[i][e];
          sums.y += g[i][e] * xh[i][e];
        }
      }
    }
    sums = BlockSum2(sums);
    const float mean_g = kRms ? 0.f : sums.x * inv_d, mean_gx = sums.y * inv_d;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int64_t j = (threadIdx.x + static_cast<int64_t>(i) * kAddNormThreads) * kV;
      if (j < D) {
        float gh[kV], total[kV];
        if (grad_h != nullptr) {
          LoadVec<kV>(grad_h + offset + j, gh);
        } else {
#pragma unroll
          for (int e = 0; e < kV; ++e) gh[e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          total[e] = rstd * (g[i][e] - mean_g - xh[i][e] * mean_gx);
          if (grad_h != nullptr) total[e] += gh[e];
        }
        StoreVec<kV>(grad_x + offset + j, total);
        if (grad_y != nullptr) StoreVec<kV>(grad_y + offset + j, total);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int64_t j = (threadIdx.x + static_cast<int64_t>(i) * kAddNormThreads) * kV;
    if (j < D) {
      StoreVec<kV>(dw_partial + blockIdx.x * D + j, dw[i]);
      StoreVec<kV>(db_partial + blockIdx.x * D + j, db[i]);
    }
  }
}

}  // namespace distill::kernels

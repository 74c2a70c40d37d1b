// Framework-free CUDA kernels of distill::LinearGelu (trainer/src/models/layers.h): the GPT
// family's MLP activation of the first linear layer's output u, the exact (erf) GELU
//   a = u * 0.5 * (1 + erf(u / sqrt(2)))
// or its tanh approximation (kTanh: GPT-2's gelu_new, at::gelu(u, "tanh"))
//   a = 0.5 * u * (1 + tanh(sqrt(2 / pi) * (u + 0.044715 * u^3))),
// and its backward fused with the bias gradient of that linear layer: the column sums of the
// activation's input gradient du = dy * gelu'(u), which the linear layer's backward would
// otherwise read back in a pass of its own (ColumnSum, col_sum_kernel.cuh).
//
// Rounded as ATen rounds (GeluCUDAKernelImpl and GeluBackwardCUDAKernelImpl in
// ActivationGeluKernel.cu, both approximations: the math in float, the result rounded to the
// storage type T), written as they are written so that the compiler makes the same instructions
// of them; the column sums are ColumnSum's of the rounded du, in the same order (the same tiles,
// row splits and final pass), so the fused backward gives ColumnSum(gelu_backward(dy, u)) bit for
// bit.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "col_sum_kernel.cuh"
#include "convert.cuh"

namespace distill::kernels {

constexpr int kGeluThreads = 256;

template <bool kTanh>
__device__ __forceinline__ float GeluOf(float x) {
  if constexpr (kTanh) {
    constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * 0.5f;
    constexpr float kKappa = 0.044715f;
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return 0.5f * x * (1.f + ::tanhf(inner));
  } else {
    constexpr float kAlpha = M_SQRT1_2;
    return x * 0.5f * (1.f + ::erf(x * kAlpha));
  }
}

template <bool kTanh>
__device__ __forceinline__ float GeluGradOf(float dy, float x) {
  if constexpr (kTanh) {
    constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * 0.5f;
    constexpr float kKappa = 0.044715f;
    const float x_sq = x * x;
    const float x_cube = x_sq * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    const float tanh_inner = ::tanhf(inner);
    const float left = 0.5f * x;
    const float right = 1.f + tanh_inner;
    const float left_derivative = 0.5f * right;
    const float right_derivative = 1.f - tanh_inner * tanh_inner;
    const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
    return dy * (left_derivative + left * right_derivative * inner_derivative);
  } else {
    constexpr float kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5f;
    constexpr float kAlpha = M_SQRT1_2;
    const float cdf = 0.5f * (1.f + ::erf(x * kAlpha));
    const float pdf = ::exp(-0.5f * x * x) * kBeta;
    return dy * (cdf + x * pdf);
  }
}

// a = gelu(u) over n elements: 16-byte vectors when both pointers are aligned (`vec`), then the
// tail.
template <typename T, bool kTanh>
__global__ void __launch_bounds__(kGeluThreads)
    GeluForwardKernel(const T* __restrict__ u, T* __restrict__ a, int64_t n, bool vec) {
  constexpr int N = Pack16<T>::N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t vecs = vec ? n / N : 0;
  for (int64_t i = first; i < vecs; i += stride) {
    Pack16<T> x, o;
    x.raw = __ldg(reinterpret_cast<const uint4*>(u) + i);
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = FromFloat<T>(GeluOf<kTanh>(ToFloat(x.v[k])));
    reinterpret_cast<uint4*>(a)[i] = o.raw;
  }
  for (int64_t j = vecs * N + first; j < n; j += stride)
    a[j] = FromFloat<T>(GeluOf<kTanh>(ToFloat(u[j])));
}

// The backward's occupancy and unrolling by vector width, measured on an H200 at the 235M GPT
// step's shape, 16384 x 4096 (docs/benchmarks.md, sessions 23 and 24; the same bits for every
// choice): 16-bit vectors of 8 unrolled twice with at least 1 block per SM (95 registers, 2 blocks
// per SM), 153-156 us against 165 for the default bounds and unroll 4 (59 registers, 4 blocks);
// float32 vectors of 4 with at least 5 blocks per SM, 210 us against 301 (more blocks per SM spill
// and are slower). The scalar kernel keeps the 32 registers (8 blocks per SM) that ptxas gives
// it by default: an explicit minimum of 1 would let it take 56.
template <int kV>
constexpr int kGeluBackwardMinBlocks = kV == 8 ? 1 : (kV == 4 ? 5 : 8);
template <int kV>
constexpr int kGeluBackwardUnroll = kV == 8 ? 2 : 4;

// du = gelu'(u) * dy for a (rows, n) matrix, written, and its column sums per row split, as
// ColumnSumPartialKernel sums them (its tiles of 32 lanes x kV columns, its warps over the rows of
// a split, the warps' sums added in order): row blockIdx.y of `partial` (splits, n).
template <typename T, int kV, bool kTanh>
__global__ void __launch_bounds__(32 * kColSumWarps, kGeluBackwardMinBlocks<kV>)
    GeluBackwardColumnSumKernel(const T* __restrict__ dy, const T* __restrict__ u,
                                T* __restrict__ du, float* __restrict__ partial, int64_t rows,
                                int64_t n, int64_t rows_per_split) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t col0 = (int64_t(blockIdx.x) * 32 + lane) * kV;
  const int64_t r_begin = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r_end = r_begin + rows_per_split < rows ? r_begin + rows_per_split : rows;
  float acc[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = 0.f;
  constexpr int kUnroll = kGeluBackwardUnroll<kV>;
  if (col0 < n) {
#pragma unroll kUnroll
    for (int64_t r = r_begin + warp; r < r_end; r += kColSumWarps) {
      const int64_t at = r * n + col0;
      if constexpr (kV > 1) {
        Pack16<T> d, x, o;
        d.raw = __ldg(reinterpret_cast<const uint4*>(dy + at));
        x.raw = __ldg(reinterpret_cast<const uint4*>(u + at));
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          o.v[k] = FromFloat<T>(GeluGradOf<kTanh>(ToFloat(d.v[k]), ToFloat(x.v[k])));
          // The stored value added, as ColumnSum adds what it loads: for fp32, no multiply-add
          // contracted from GeluGradOf's last product into the sum.
          acc[k] = __fadd_rn(acc[k], ToFloat(o.v[k]));
        }
        *reinterpret_cast<uint4*>(du + at) = o.raw;
      } else {
        const T o = FromFloat<T>(GeluGradOf<kTanh>(ToFloat(dy[at]), ToFloat(u[at])));
        du[at] = o;
        acc[0] = __fadd_rn(acc[0], ToFloat(o));
      }
    }
  }
  ColumnSumTileToPartial<kV>(acc, partial, n);
}

// a = gelu(u), n elements; `tanh`: the tanh approximation.
template <typename T>
cudaError_t LaunchGeluForward(const T* u, T* a, int64_t n, bool tanh, int num_sms,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(u) && Aligned16(a);
  const int64_t work = vec ? n / Pack16<T>::N + n % Pack16<T>::N : n;
  const int64_t want = (work + kGeluThreads - 1) / kGeluThreads, most = int64_t(num_sms) * 32;
  const int blocks = static_cast<int>(want < 1 ? 1 : want < most ? want : most);
  if (tanh) {
    GeluForwardKernel<T, true><<<blocks, kGeluThreads, 0, stream>>>(u, a, n, vec);
  } else {
    GeluForwardKernel<T, false><<<blocks, kGeluThreads, 0, stream>>>(u, a, n, vec);
  }
  return cudaGetLastError();
}

// du = gelu_backward(dy, u) and out (n,) = its column sums over the rows, for contiguous (rows,
// n) matrices. `splits` (partial: splits * n floats) sets the order of the sums: ColumnSum's for
// du is ColumnSumSplits<T>(rows, n, sms, du 16-byte aligned and n a multiple of 16 / sizeof(T)).
// `vec` (dy, u and du 16-byte aligned, n such a multiple) only picks the kernel: a column's sum is
// in the same order on both. `tanh`: the tanh approximation's gradient.
template <typename T, bool kTanh>
void LaunchGeluBackwardColumnSumOf(const T* dy, const T* u, T* du, float* partial, int64_t rows,
                                   int64_t n, int64_t splits, bool vec, cudaStream_t stream) {
  constexpr int kV = 16 / int(sizeof(T));
  const int64_t rows_per_split = (rows + splits - 1) / splits;
  if (vec) {
    const dim3 grid(unsigned((n + 32 * kV - 1) / (32 * kV)), unsigned(splits));
    GeluBackwardColumnSumKernel<T, kV, kTanh>
        <<<grid, 32 * kColSumWarps, 0, stream>>>(dy, u, du, partial, rows, n, rows_per_split);
  } else {
    const dim3 grid(unsigned((n + 31) / 32), unsigned(splits));
    GeluBackwardColumnSumKernel<T, 1, kTanh>
        <<<grid, 32 * kColSumWarps, 0, stream>>>(dy, u, du, partial, rows, n, rows_per_split);
  }
}

template <typename T>
cudaError_t LaunchGeluBackwardColumnSum(const T* dy, const T* u, T* du, float* partial, float* out,
                                        int64_t rows, int64_t n, int64_t splits, bool vec,
                                        bool tanh, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (tanh) {
    LaunchGeluBackwardColumnSumOf<T, true>(dy, u, du, partial, rows, n, splits, vec, stream);
  } else {
    LaunchGeluBackwardColumnSumOf<T, false>(dy, u, du, partial, rows, n, splits, vec, stream);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ColumnSumFinalKernel<float>
      <<<unsigned((n + 255) / 256), 256, 0, stream>>>(partial, out, n, splits);
  return cudaGetLastError();
}

}  // namespace distill::kernels

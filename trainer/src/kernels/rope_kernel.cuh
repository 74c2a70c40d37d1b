// Framework-free CUDA kernel of distill::ApplyRope (trainer/src/models/layers.h): rotary position
// embeddings as transformers applies them, out = x * cos + rotate_half(x) * sin with
// rotate_half([x1, x2]) = [-x2, x1], and the gradient of that w.r.t. x, in one pass each way
// (the composite is a cast of the tables, a cat, a negation, four products and two sums per
// direction, each a pass over x).
//
// Rounded as the composite rounds (ATen's element-wise ops in x's dtype T: each product and the sum
// computed in float and rounded to T, the fp32 tables first rounded to T), so the result is the
// composite's bit for bit (up to the sign of a zero: autograd adds +0 slices where this keeps a
// -0); products and sums are never fused (__fmul_rn / __fadd_rn).
//   forward,  j < D/2:  out[j]       = T(T(x[j] c[j])        + T(-x[j+h] s[j]))
//                       out[j+h]     = T(T(x[j+h] c[j+h])    + T(x[j] s[j+h]))
//   backward, j < D/2:  grad_x[j]    = T(T(g[j] c[j])        + T(g[j+h] s[j+h]))
//                       grad_x[j+h]  = T(T(g[j+h] c[j+h])    - T(g[j] s[j]))
// (the backward is autograd's: the product's gradient g * c, plus rotate_half's transpose applied
// to g * s). x: (B, T, H, D) contiguous; cos, sin: (T, D) fp32 contiguous; h = D / 2.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "convert.cuh"

namespace distill::kernels {

constexpr int kRopeThreads = 256;

// One pair (x[j], x[j + h]) of the formulas above, a, b the two elements, c*, s* the tables'.
template <typename T, bool kBackward>
__device__ __forceinline__ void RopePair(float xa, float xb, float ca, float cb, float sa, float sb,
                                         T& out_a, T& out_b) {
  ca = RoundTo<T>(ca);
  cb = RoundTo<T>(cb);
  sa = RoundTo<T>(sa);
  sb = RoundTo<T>(sb);
  float oa, ob;
  if constexpr (!kBackward) {
    oa = __fadd_rn(RoundTo<T>(__fmul_rn(xa, ca)), RoundTo<T>(__fmul_rn(-xb, sa)));
    ob = __fadd_rn(RoundTo<T>(__fmul_rn(xb, cb)), RoundTo<T>(__fmul_rn(xa, sb)));
  } else {
    oa = __fadd_rn(RoundTo<T>(__fmul_rn(xa, ca)), RoundTo<T>(__fmul_rn(xb, sb)));
    ob = __fadd_rn(RoundTo<T>(__fmul_rn(xb, cb)), -RoundTo<T>(__fmul_rn(xa, sa)));
  }
  out_a = FromFloat<T>(oa);
  out_b = FromFloat<T>(ob);
}

// N = 16 / sizeof(T) pairs per thread: 16-byte loads and stores of x and out, float4 loads of
// the tables (every pointer 16-byte aligned, h a multiple of N). The scalar kernel below does
// one pair per thread, for any D.
template <typename T, bool kBackward>
__global__ void __launch_bounds__(kRopeThreads)
    RopeVecKernel(const T* __restrict__ x, const float* __restrict__ cos,
                  const float* __restrict__ sin, T* __restrict__ out, int64_t chunks, int64_t heads,
                  int64_t seq, int64_t half) {
  constexpr int N = Pack16<T>::N;
  const int64_t per_row = half / N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, j = (i - row * per_row) * N;  // row over (B, T, H)
    const int64_t t = (row / heads) % seq;
    const int64_t a = row * 2 * half + j, b = a + half;
    const int64_t ta = t * 2 * half + j, tb = ta + half;
    Pack16<T> xa, xb, oa, ob;
    xa.raw = __ldg(reinterpret_cast<const uint4*>(x + a));
    xb.raw = __ldg(reinterpret_cast<const uint4*>(x + b));
    alignas(16) float ca[N], cb[N], sa[N], sb[N];
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      *reinterpret_cast<float4*>(ca + k) = __ldg(reinterpret_cast<const float4*>(cos + ta + k));
      *reinterpret_cast<float4*>(cb + k) = __ldg(reinterpret_cast<const float4*>(cos + tb + k));
      *reinterpret_cast<float4*>(sa + k) = __ldg(reinterpret_cast<const float4*>(sin + ta + k));
      *reinterpret_cast<float4*>(sb + k) = __ldg(reinterpret_cast<const float4*>(sin + tb + k));
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      RopePair<T, kBackward>(ToFloat(xa.v[k]), ToFloat(xb.v[k]), ca[k], cb[k], sa[k], sb[k],
                             oa.v[k], ob.v[k]);
    }
    *reinterpret_cast<uint4*>(out + a) = oa.raw;
    *reinterpret_cast<uint4*>(out + b) = ob.raw;
  }
}

template <typename T, bool kBackward>
__global__ void __launch_bounds__(kRopeThreads)
    RopeKernel(const T* __restrict__ x, const float* __restrict__ cos,
               const float* __restrict__ sin, T* __restrict__ out, int64_t pairs, int64_t heads,
               int64_t seq, int64_t half) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / half, j = i - row * half;  // row over (B, T, H)
    const int64_t t = (row / heads) % seq;
    const int64_t a = row * 2 * half + j, b = a + half;  // x[j], x[j + h]
    const int64_t ta = t * 2 * half + j, tb = ta + half;
    RopePair<T, kBackward>(ToFloat(x[a]), ToFloat(x[b]), cos[ta], cos[tb], sin[ta], sin[tb], out[a],
                           out[b]);
  }
}

template <typename T>
cudaError_t LaunchRope(const T* x, const float* cos, const float* sin, T* out, int64_t rows,
                       int64_t heads, int64_t seq, int64_t dim, bool backward, int num_sms,
                       cudaStream_t stream) {
  const int64_t half = dim / 2, pairs = rows * half;
  if (pairs == 0) return cudaSuccess;
  constexpr int N = Pack16<T>::N;
  const bool vec =
      half % N == 0 && Aligned16(x) && Aligned16(out) && Aligned16(cos) && Aligned16(sin);
  const int64_t work = vec ? pairs / N : pairs;
  const int64_t want = (work + kRopeThreads - 1) / kRopeThreads;
  const int blocks = static_cast<int>(want < int64_t(num_sms) * 32 ? want : int64_t(num_sms) * 32);
  if (vec) {
    if (backward) {
      RopeVecKernel<T, true>
          <<<blocks, kRopeThreads, 0, stream>>>(x, cos, sin, out, work, heads, seq, half);
    } else {
      RopeVecKernel<T, false>
          <<<blocks, kRopeThreads, 0, stream>>>(x, cos, sin, out, work, heads, seq, half);
    }
  } else if (backward) {
    RopeKernel<T, true>
        <<<blocks, kRopeThreads, 0, stream>>>(x, cos, sin, out, pairs, heads, seq, half);
  } else {
    RopeKernel<T, false>
        <<<blocks, kRopeThreads, 0, stream>>>(x, cos, sin, out, pairs, heads, seq, half);
  }
  return cudaGetLastError();
}

}  // namespace distill::kernels

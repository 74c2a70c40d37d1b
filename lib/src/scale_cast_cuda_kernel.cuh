// Framework-free CUDA kernel of lossfns::_scale_cast: out = T(src * *scale), a float32 array scaled
// by a device scalar and rounded once to the storage type T (float, __half, __nv_bfloat16). The
// fused linear loss's backward uses it for the lm_head gradient it accumulated in float32. One
// pass, 32 bytes of src per thread and step (ATen's mixed-dtype multiplication, the op it
// replaces, ran at ~1.4 TB/s on the H200 for want of vectorised loads).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda_common.cuh"

namespace lossfns::kernels {

namespace scale_cast_detail {

template <typename T>
struct alignas(8 * sizeof(T)) Pack8 {
  T v[8];
};

// 8 elements per thread and step where src and out are aligned for it (src to 16 bytes, out to
// 8 elements); the rest, and unaligned arrays, element by element.
template <typename T>
__global__ void scale_cast_kernel(const float* __restrict__ src, T* __restrict__ out, int64_t n,
                                  const float* __restrict__ scale) {
  const float f = *scale;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % sizeof(Pack8<T>) == 0;
  const int64_t n8 = vec ? n / 8 : 0;
  for (int64_t i = tid; i < n8; i += stride) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src) + 2 * i);
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 2 * i + 1);
    Pack8<T> o;
    o.v[0] = from_float<T>(__fmul_rn(a.x, f));
    o.v[1] = from_float<T>(__fmul_rn(a.y, f));
    o.v[2] = from_float<T>(__fmul_rn(a.z, f));
    o.v[3] = from_float<T>(__fmul_rn(a.w, f));
    o.v[4] = from_float<T>(__fmul_rn(b.x, f));
    o.v[5] = from_float<T>(__fmul_rn(b.y, f));
    o.v[6] = from_float<T>(__fmul_rn(b.z, f));
    o.v[7] = from_float<T>(__fmul_rn(b.w, f));
    reinterpret_cast<Pack8<T>*>(out)[i] = o;
  }
  for (int64_t i = n8 * 8 + tid; i < n; i += stride) out[i] = from_float<T>(__fmul_rn(src[i], f));
}

}  // namespace scale_cast_detail

// out[i] = T(src[i] * *scale) for i < n; src, out and scale device pointers (out must not overlap
// src). At most num_sms * 8 blocks of 256 threads (grid-stride).
template <typename T>
cudaError_t scale_cast(const float* src, T* out, int64_t n, const float* scale, int num_sms,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t per_block = 256 * 8;
  const int64_t most = int64_t(num_sms) * 8;
  const int64_t blocks =
      (n + per_block - 1) / per_block < most ? (n + per_block - 1) / per_block : most;
  scale_cast_detail::scale_cast_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(src, out, n, scale);
  return cudaGetLastError();
}

}  // namespace lossfns::kernels

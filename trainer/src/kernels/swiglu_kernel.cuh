// Framework-free CUDA kernels of distill::SwiGlu (trainer/src/models/layers.h): the llama
// family's MLP activation out = silu(gate) * up, and its gradient w.r.t. gate and up, in one
// pass each way (the composite is silu, then the product; backward the product's two gradients
// and silu's backward: 5 passes over (BT, intermediate) forward and backward where these make 2,
// and the composite also keeps silu(gate) for the backward).
//
// Rounded as the composite rounds (ATen's element-wise kernels in the storage type T: each op
// computed in float and rounded to T), so both give the same values:
//   forward:   a = T(silu(g)),  out = T(a * u),          silu(g) = g / (1 + exp(-g))
//   backward:  grad_u = T(dy * a),  d = T(dy * u),
//              grad_g = T(d * s * (1 + g * (1 - s))),    s = 1 / (1 + exp(-g))
// with silu's forward and backward written as ATen's ActivationSiluKernel.cu writes them (expf,
// IEEE division), so the compiler makes the same instructions of them.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "convert.cuh"

namespace distill::kernels {

constexpr int kSwiGluThreads = 256;

__device__ __forceinline__ float SiluOf(float x) { return x / (1.f + expf(-x)); }

template <typename T>
__device__ __forceinline__ T SwiGluOut(T g, T u) {
  return FromFloat<T>(RoundTo<T>(SiluOf(ToFloat(g))) * ToFloat(u));
}

template <typename T>
__device__ __forceinline__ void SwiGluGrad(T dy_t, T g_t, T u_t, T& grad_g, T& grad_u) {
  const float dy = ToFloat(dy_t), x = ToFloat(g_t), u = ToFloat(u_t);
  grad_u = FromFloat<T>(dy * RoundTo<T>(SiluOf(x)));
  const float d = RoundTo<T>(dy * u);
  const float s = 1.f / (1.f + expf(-x));
  grad_g = FromFloat<T>(d * s * (1.f + x * (1.f - s)));
}

// Elements [0, n): 16-byte vectors when every pointer is aligned (`vec`), then the tail.
template <typename T>
__global__ void __launch_bounds__(kSwiGluThreads)
    SwiGluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                        int64_t n, bool vec) {
  constexpr int N = Pack16<T>::N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t vecs = vec ? n / N : 0;
  for (int64_t i = first; i < vecs; i += stride) {
    Pack16<T> g, u, o;
    g.raw = __ldg(reinterpret_cast<const uint4*>(gate) + i);
    u.raw = __ldg(reinterpret_cast<const uint4*>(up) + i);
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = SwiGluOut(g.v[k], u.v[k]);
    reinterpret_cast<uint4*>(out)[i] = o.raw;
  }
  for (int64_t j = vecs * N + first; j < n; j += stride) out[j] = SwiGluOut(gate[j], up[j]);
}

template <typename T>
__global__ void __launch_bounds__(kSwiGluThreads)
    SwiGluBackwardKernel(const T* __restrict__ dy, const T* __restrict__ gate,
                         const T* __restrict__ up, T* __restrict__ grad_gate,
                         T* __restrict__ grad_up, int64_t n, bool vec) {
  constexpr int N = Pack16<T>::N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t vecs = vec ? n / N : 0;
  for (int64_t i = first; i < vecs; i += stride) {
    Pack16<T> d, g, u, gg, gu;
    d.raw = __ldg(reinterpret_cast<const uint4*>(dy) + i);
    g.raw = __ldg(reinterpret_cast<const uint4*>(gate) + i);
    u.raw = __ldg(reinterpret_cast<const uint4*>(up) + i);
#pragma unroll
    for (int k = 0; k < N; ++k) SwiGluGrad(d.v[k], g.v[k], u.v[k], gg.v[k], gu.v[k]);
    reinterpret_cast<uint4*>(grad_gate)[i] = gg.raw;
    reinterpret_cast<uint4*>(grad_up)[i] = gu.raw;
  }
  for (int64_t j = vecs * N + first; j < n; j += stride) {
    SwiGluGrad(dy[j], gate[j], up[j], grad_gate[j], grad_up[j]);
  }
}

inline int SwiGluBlocks(int64_t work, int num_sms) {
  const int64_t want = (work + kSwiGluThreads - 1) / kSwiGluThreads;
  const int64_t most = int64_t(num_sms) * 32;
  return static_cast<int>(want < 1 ? 1 : want < most ? want : most);
}

// out = silu(gate) * up over n elements.
template <typename T>
cudaError_t LaunchSwiGluForward(const T* gate, const T* up, T* out, int64_t n, int num_sms,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(gate) && Aligned16(up) && Aligned16(out);
  const int64_t work = vec ? n / Pack16<T>::N + n % Pack16<T>::N : n;
  SwiGluForwardKernel<T>
      <<<SwiGluBlocks(work, num_sms), kSwiGluThreads, 0, stream>>>(gate, up, out, n, vec);
  return cudaGetLastError();
}

// grad_gate, grad_up from the output's gradient dy.
template <typename T>
cudaError_t LaunchSwiGluBackward(const T* dy, const T* gate, const T* up, T* grad_gate, T* grad_up,
                                 int64_t n, int num_sms, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(dy) && Aligned16(gate) && Aligned16(up) && Aligned16(grad_gate) &&
                   Aligned16(grad_up);
  const int64_t work = vec ? n / Pack16<T>::N + n % Pack16<T>::N : n;
  SwiGluBackwardKernel<T><<<SwiGluBlocks(work, num_sms), kSwiGluThreads, 0, stream>>>(
      dy, gate, up, grad_gate, grad_up, n, vec);
  return cudaGetLastError();
}

}  // namespace distill::kernels

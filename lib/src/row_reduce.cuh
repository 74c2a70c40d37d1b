// Warp- and block-wide all-reductions of any small value (a float, a float2, a struct of a few
// 4- or 8-byte fields) under any associative combine, for the CUDA kernels of every op. Includes
// nothing from Torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace lossfns::kernels {

// __shfl_xor_sync of a value of any size that is a multiple of 4 bytes, word by word.
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int offset) {
  static_assert(sizeof(T) % 4 == 0, "shfl_xor: the value must be whole 32-bit words");
  constexpr int kWords = int(sizeof(T) / 4);
  unsigned w[kWords];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_xor_sync(0xffffffffu, w[i], offset);
  memcpy(&v, w, sizeof(T));
  return v;
}

// op over the 32 lanes of a warp, given to every lane (a butterfly: every lane combines in the
// same order, so every lane gets bit-identical results).
template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  return v;
}

// Words of shared memory block_allreduce needs for a T.
template <typename T>
constexpr int block_reduce_words() {
  return 32 * int(sizeof(T) / 4);
}

// op over every thread of the block, given to every thread; `identity` is op's neutral value.
// `shared`: block_reduce_words<T>() 32-bit words, laid out word-major ([word][warp]), so a float2
// uses the 2 * 32 floats of distill's kernels. Safe to call back to back with the same `shared`.
// Every thread of the block must call it.
template <typename T, typename Op>
__device__ __forceinline__ T block_allreduce(T v, Op op, T identity, void* shared) {
  constexpr int kWords = int(sizeof(T) / 4);
  unsigned* sh = static_cast<unsigned*>(shared);
  v = warp_allreduce(v, op);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) {
    unsigned w[kWords];
    memcpy(w, &v, sizeof(T));
#pragma unroll
    for (int i = 0; i < kWords; ++i) sh[i * 32 + warp] = w[i];
  }
  __syncthreads();
  T r = identity;
  if (lane < warps) {
    unsigned w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = sh[i * 32 + lane];
    memcpy(&r, w, sizeof(T));
  }
  return warp_allreduce(r, op);  // every warp combines the same shared values alike
}

}  // namespace lossfns::kernels

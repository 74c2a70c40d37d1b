// Framework-free pieces every kernel of liblossfns shares: the host/device qualifier, the
// reduction codes the internal ops take, and the reduction's scale. Includes nothing from Torch
// or CUDA.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOSSFNS_HOST_DEVICE __host__ __device__ __forceinline__
#else
// always_inline: a file that instantiates the CPU row kernels for every dtype and divergence is
// large enough that gcc stops inlining these helpers into some loops, which then do not vectorise
// (the JSD forward ran 2.7x slower: docs/benchmarks.md).
#define LOSSFNS_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace lossfns::kernels {

// Reductions, in the integer form the internal ops take (parsed once: detail::parse_reduction).
enum Reduction : int64_t { kNone = 0, kSum = 1, kMean = 2, kBatchMean = 3 };

// Scale that turns the summed loss into the reduced one; 0 when no row counts, so an all-ignored
// batch gives loss 0 and gradient 0, not NaN.
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc reduction_scale(int64_t reduction, int64_t n_valid_rows, int64_t V) {
  if (reduction == kSum) return Acc(1);
  if (n_valid_rows == 0) return Acc(0);
  const Acc denom = reduction == kMean ? Acc(n_valid_rows) * Acc(V) : Acc(n_valid_rows);
  return Acc(1) / denom;
}

}  // namespace lossfns::kernels

// Framework-free pieces every kernel of liblossfns shares: the host/device qualifier, the
// reduction as the internal ops and kernels take it, and the reduction's scale. Includes nothing
// from Torch or CUDA.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define LOSSFNS_HOST_DEVICE __host__ __device__ __forceinline__
#else
// always_inline: a file that instantiates the CPU row kernels for every dtype and divergence is
// large enough that gcc stops inlining these helpers into some loops, which then do not vectorise
// (the JSD forward ran 2.7x slower: docs/benchmarks.md).
#define LOSSFNS_HOST_DEVICE inline __attribute__((always_inline))
#endif

// Per-ISA builds of CPU kernels (x86-64, gcc or clang): a function marked LOSSFNS_TARGET_AVX512 or
// LOSSFNS_TARGET_AVX2 is compiled for that ISA, and so is everything always-inlined into it;
// common.h's cpu_isa() says which one the CPU can run. Helpers that are not inlined stay
// baseline code, so no wider instruction reaches the baseline path through a shared function.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define LOSSFNS_X86_ISA_DISPATCH 1
#define LOSSFNS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define LOSSFNS_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define LOSSFNS_X86_ISA_DISPATCH 0
#endif

namespace lossfns::kernels {

// The reduction below the public ops: the internal ops' `int reduction` is this code, and the
// kernels take it as this type. The only place the codes are written; their names are
// kReductionNames, in this order (the public ops' `str reduction`, lossfns::reduction_name).
// Conversions, each in one place (common.h): name -> code (parse_reduction), an internal op's
// integer -> code (reduction_from_code, checked).
enum Reduction : int64_t { kNone = 0, kSum = 1, kMean = 2, kBatchMean = 3 };
inline constexpr int64_t kNumReductions = 4;
inline constexpr const char* kReductionNames[kNumReductions] = {"none", "sum", "mean", "batchmean"};

// Scale that turns the summed loss into the reduced one; 0 when no row counts, so an all-ignored
// batch gives loss 0 and gradient 0, not NaN.
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc reduction_scale(Reduction reduction, int64_t n_valid_rows, int64_t V) {
  if (reduction == kSum) return Acc(1);
  if (n_valid_rows == 0) return Acc(0);
  const Acc denom = reduction == kMean ? Acc(n_valid_rows) * Acc(V) : Acc(n_valid_rows);
  return Acc(1) / denom;
}

// *dst = T(v), for the CPU kernels' outputs. For a 16-bit float class type (c10::Half,
// c10::BFloat16) the converted value is stored through memcpy: a plain 2-byte store, which gcc
// vectorises, where the class's copy is an aggregate copy it does not (the bf16 distillation
// backward ran 7x slower than the fp32 one).
template <typename T, typename Acc>
inline __attribute__((always_inline)) void store_as(T* dst, Acc v) {
  if constexpr (std::is_arithmetic_v<T>) {
    *dst = static_cast<T>(v);
  } else {
    const T t = static_cast<T>(v);
    std::memcpy(static_cast<void*>(dst), &t, sizeof(T));
  }
}

}  // namespace lossfns::kernels

// The distillation row kernels of the float-computing dtypes (fp32, fp16, bf16) built for AVX2 +
// FMA and for AVX-512 (x86-64, gcc or clang): the loops are exp/log polynomials, compute bound, and
// the SSE2 baseline alone left them at 1.8-3.1x ATen's composite on an AVX-512 machine, whose own
// CPU kernels are built per ISA the same way (issue 16; docs/benchmarks.md). distill_cpu.cpp calls
// the build common.h's cpu_isa() chose.
//
// How no wider instruction reaches a CPU without it: only the functions below carry a target
// attribute; flatten inlines everything they call (the row loops, the kernels, their math) into
// them, so that code is compiled for their ISA, while any out-of-line copy of those templates (and
// of c10's inline Half/BFloat16 conversions), in this file or elsewhere, is baseline code. The
// builds live in their own file because flatten's inlining in distill_cpu.cpp used up gcc's
// inlining budget for the file, and its baseline loops stopped vectorising (3x slower).
#include "distill_cpu_isa.h"

namespace lossfns::detail {

#if LOSSFNS_X86_ISA_DISPATCH
#define LOSSFNS_DEFINE_DISTILL_ROWS(ISA, TARGET, T)                                     \
  TARGET __attribute__((flatten)) void distill_forward_rows_##ISA(                      \
      int64_t divergence, const kernels::CpuRows<T>& rows, int64_t begin, int64_t end,  \
      float inv_t, const kernels::JsdConstants<float>& jsd, float* stats) {             \
    kernels::distill_rows_forward_cpu(divergence, rows, begin, end, inv_t, jsd, stats); \
  }                                                                                     \
  TARGET __attribute__((flatten)) void distill_backward_rows_##ISA(                     \
      int64_t divergence, const kernels::CpuRows<T>& rows, int64_t begin, int64_t end,  \
      float inv_t, const kernels::JsdConstants<float>& jsd, const float* stats,         \
      const float* grad_output, bool none, float reduce_scale, T* grad) {               \
    kernels::distill_rows_backward_cpu(divergence, rows, begin, end, inv_t, jsd, stats, \
                                       grad_output, none, reduce_scale, grad);          \
  }
#define LOSSFNS_DEFINE_DISTILL_ROWS_ALL(ISA, TARGET)  \
  LOSSFNS_DEFINE_DISTILL_ROWS(ISA, TARGET, float)     \
  LOSSFNS_DEFINE_DISTILL_ROWS(ISA, TARGET, c10::Half) \
  LOSSFNS_DEFINE_DISTILL_ROWS(ISA, TARGET, c10::BFloat16)
LOSSFNS_DEFINE_DISTILL_ROWS_ALL(avx2, LOSSFNS_TARGET_AVX2)
LOSSFNS_DEFINE_DISTILL_ROWS_ALL(avx512, LOSSFNS_TARGET_AVX512)
#undef LOSSFNS_DEFINE_DISTILL_ROWS_ALL
#undef LOSSFNS_DEFINE_DISTILL_ROWS
#endif

}  // namespace lossfns::detail

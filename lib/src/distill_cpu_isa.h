// Builds of the distillation row kernels (distill_cpu_kernel.h) for wider x86-64 ISAs, for the
// dtypes that compute in float (fp32, fp16, bf16), defined in distill_cpu_isa.cpp; distill_cpu.cpp
// calls the one common.h's cpu_isa() chose.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "distill_cpu_kernel.h"
#include "kernels_common.h"

namespace lossfns::detail {

#if LOSSFNS_X86_ISA_DISPATCH
#define LOSSFNS_DECLARE_DISTILL_ROWS(ISA, T)                                              \
  void distill_forward_rows_##ISA(int64_t divergence, const kernels::CpuRows<T>& rows,    \
                                  int64_t begin, int64_t end, float inv_t,                \
                                  const kernels::JsdConstants<float>& jsd, float* stats); \
  void distill_backward_rows_##ISA(                                                       \
      int64_t divergence, const kernels::CpuRows<T>& rows, int64_t begin, int64_t end,    \
      float inv_t, const kernels::JsdConstants<float>& jsd, const float* stats,           \
      const float* grad_output, bool none, float reduce_scale, T* grad);
#define LOSSFNS_DECLARE_DISTILL_ROWS_ALL(ISA)  \
  LOSSFNS_DECLARE_DISTILL_ROWS(ISA, float)     \
  LOSSFNS_DECLARE_DISTILL_ROWS(ISA, c10::Half) \
  LOSSFNS_DECLARE_DISTILL_ROWS(ISA, c10::BFloat16)
LOSSFNS_DECLARE_DISTILL_ROWS_ALL(avx2)
LOSSFNS_DECLARE_DISTILL_ROWS_ALL(avx512)
#undef LOSSFNS_DECLARE_DISTILL_ROWS_ALL
#undef LOSSFNS_DECLARE_DISTILL_ROWS
#endif

}  // namespace lossfns::detail

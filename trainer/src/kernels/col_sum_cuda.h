// CUDA entry point of the column sums (col_sum_kernel.cuh), for the bias gradient of
// distill::Linear (models/layers.h). Built only with CUDA (DISTILL_WITH_CUDA).
#pragma once

#include <ATen/core/Tensor.h>

namespace distill::cuda {

// The sums over the rows of x, a contiguous (rows, n) CUDA tensor of fp32, bf16 or fp16, as an
// fp32 (n,) tensor.
at::Tensor ColumnSum(const at::Tensor& x);

}  // namespace distill::cuda

// CUDA entry points of distill::LinearGelu's activation (trainer/src/models/layers.h): the exact
// GELU or its tanh approximation, and its backward fused with the column sums of its result
// (gelu_kernel.cuh). Built only with CUDA (DISTILL_WITH_CUDA).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace distill::cuda {

// gelu(u) as at::gelu(u, tanh ? "tanh" : "none") computes it; u a contiguous CUDA tensor of
// fp32, bf16 or fp16.
at::Tensor Gelu(const at::Tensor& u, bool tanh);

// {du, column sums}: du = at::gelu_backward(grad, u, tanh ? "tanh" : "none") (u's shape and dtype)
// and the sums of du over all but its last dimension as an fp32 (u.size(-1),) tensor, ColumnSum(du)
// bit for bit; grad and u contiguous, of one shape and dtype, at least 1-d.
std::pair<at::Tensor, at::Tensor> GeluBackwardWithColumnSum(const at::Tensor& grad,
                                                            const at::Tensor& u, bool tanh);

}  // namespace distill::cuda

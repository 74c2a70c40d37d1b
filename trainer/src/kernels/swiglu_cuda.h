// CUDA entry points of distill::SwiGlu (trainer/src/models/layers.h). Built only with CUDA
// (DISTILL_WITH_CUDA).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace distill::cuda {

// silu(gate) * up; gate and up contiguous CUDA tensors of one shape and dtype (fp32 / bf16 / fp16).
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);

// The gradients of gate and up from the output's gradient grad (contiguous, same shape and dtype).
std::pair<at::Tensor, at::Tensor> SwiGluBackward(const at::Tensor& grad, const at::Tensor& gate,
                                                 const at::Tensor& up);

}  // namespace distill::cuda

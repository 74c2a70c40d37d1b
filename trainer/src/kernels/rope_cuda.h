// CUDA entry point of distill::ApplyRope (trainer/src/models/layers.h). Built only with CUDA
// (DISTILL_WITH_CUDA).
#pragma once

#include <ATen/core/Tensor.h>

namespace distill::cuda {

// x (B, T, H, D) contiguous fp32 / bf16 / fp16, D even; cos, sin (T, D) fp32 contiguous on x's
// device. backward: x is the gradient of the output and the result the gradient of x.
at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward);

}  // namespace distill::cuda

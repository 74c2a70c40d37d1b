// CUDA entry points of distill::AddNorm (trainer/src/models/layers.h). Built only with CUDA
// (DISTILL_WITH_CUDA); expects contiguous tensors, x / h / weight / bias / statistics fp32.
#pragma once

#include <ATen/core/Tensor.h>

namespace distill::cuda {

// Whether the kernels take rows of D elements.
bool Supported(int64_t D);

struct AddNormForwardResult {
  at::Tensor h, out, mean, rstd;  // h: x + y (fp32); out: out_dtype; mean, rstd: (rows,) fp32
};
AddNormForwardResult AddNormForward(const at::Tensor& x, const at::Tensor& y,
                                    const at::Tensor& weight, const at::Tensor& bias, double eps,
                                    bool rms, at::ScalarType out_dtype);

struct AddNormBackwardResult {
  at::Tensor grad_x, grad_y, grad_weight, grad_bias;
};
// grad_h may be undefined (nothing further on used h). grad_y is grad_x itself when y_dtype is
// fp32. grad_bias is undefined unless need_bias_grad.
AddNormBackwardResult AddNormBackward(const at::Tensor& grad_out, const at::Tensor& grad_h,
                                      const at::Tensor& h, const at::Tensor& weight,
                                      const at::Tensor& mean, const at::Tensor& rstd, bool rms,
                                      at::ScalarType y_dtype, bool need_bias_grad);

}  // namespace distill::cuda

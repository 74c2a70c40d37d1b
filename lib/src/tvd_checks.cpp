// Input validation of the TVD op, shared by the CPU and CUDA adapters.
#include <string>

#include <ATen/ATen.h>

#include "tvd_common.h"
#include "tvd_internal.h"

namespace lossfns::detail {

FlatInputs check_and_flatten(const at::Tensor& p, const at::Tensor& q,
                             const std::optional<at::Tensor>& labels,
                             std::initializer_list<at::ScalarType> supported, const char* backend) {
  TORCH_CHECK(p.defined() && q.defined(), "lossfns.tvd_loss: p and q must be defined tensors");
  TORCH_CHECK(p.dim() == 2 || p.dim() == 3,
              "lossfns.tvd_loss: p must be (BT, V) or (B, T, V) probabilities; got shape ",
              dims(p.sizes()));
  TORCH_CHECK(q.sizes() == p.sizes(), "lossfns.tvd_loss: q must have p's shape ", dims(p.sizes()),
              "; got ", dims(q.sizes()));
  TORCH_CHECK(q.scalar_type() == p.scalar_type(), "lossfns.tvd_loss: q must have p's dtype ",
              p.scalar_type(), "; got ", q.scalar_type(), " (convert one with .to(dtype))");
  TORCH_CHECK(q.device() == p.device(), "lossfns.tvd_loss: q must be on p's device ", p.device(),
              "; got ", q.device());
  bool dtype_ok = false;
  for (auto t : supported) dtype_ok = dtype_ok || t == p.scalar_type();
  TORCH_CHECK(dtype_ok, "lossfns.tvd_loss: on ", backend, " p and q must be one of ",
              dtype_list(supported), "; got ", p.scalar_type());

  FlatInputs in;
  in.V = p.size(-1);
  TORCH_CHECK(in.V > 0, "lossfns.tvd_loss: the vocabulary dimension V (last of p's shape ",
              dims(p.sizes()), ") must be > 0");
  in.rows = p.numel() / in.V;
  in.p = rows_view(p, in.rows);
  in.q = rows_view(q, in.rows);

  in.labels = check_labels(labels, p.sizes().slice(0, p.dim() - 1), in.rows, p.device(),
                           "lossfns.tvd_loss", "p");
  return in;
}

void check_backward_inputs(const at::Tensor& grad_output, const at::Tensor& scale, int64_t rows,
                           int64_t V, kernels::Reduction reduction) {
  if (reduction == kernels::kNone) {
    TORCH_CHECK(grad_output.numel() == rows * V, "lossfns._tvd_backward: grad_output must have ",
                num(rows * V), " elements (the loss's shape) for reduction 'none'; got ",
                dims(grad_output.sizes()));
  } else {
    TORCH_CHECK(grad_output.numel() == 1,
                "lossfns._tvd_backward: grad_output must hold one value for a ",
                "reduced loss; got shape ", dims(grad_output.sizes()));
    TORCH_CHECK(scale.numel() == 1,
                "lossfns._tvd_backward: scale must be the 1-element tensor from _tvd_forward");
  }
}

}  // namespace lossfns::detail

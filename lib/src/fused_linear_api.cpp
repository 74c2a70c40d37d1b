// Public C++ API of lossfns::fused_linear_distill_loss: a thin typed call into the registered op,
// so C++ and Python share one code path (checks, autograd, dispatch).
#include <ATen/core/dispatch/Dispatcher.h>

#include "lossfns/fused_linear.h"

namespace lossfns {

FusedLinearDistillResult fused_linear_distill_loss(const at::Tensor& student_hidden,
                                                   const at::Tensor& student_lm_head,
                                                   const at::Tensor& teacher_hidden,
                                                   const at::Tensor& teacher_lm_head,
                                                   const std::optional<at::Tensor>& labels,
                                                   const FusedLinearDistillOptions& o) {
  using Opt = const std::optional<at::Tensor>&;
  using Out = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::fused_linear_distill_loss", "")
          .typed<Out(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                     Opt, c10::string_view, double, double, int64_t, c10::string_view,
                     std::optional<int64_t>, double, double, std::optional<int64_t>)>();
  const DistillLossOptions& d = o.distill();
  TORCH_CHECK(!d.grad_scale().has_value(),
              "lossfns.fused_linear_distill_loss: options.distill().grad_scale does not "
              "apply (the fused op always computes the gradient in forward); leave it unset");
  auto [loss, divergence, ce] = op.call(
      student_hidden, student_lm_head, teacher_hidden, teacher_lm_head, labels,
      divergence_name(d.divergence()), d.beta(), d.temperature(), d.ignore_index(),
      reduction_name(d.reduction()), d.vocab_size(), o.kd_weight(), o.ce_weight(), o.chunk_size());
  return {loss, divergence, ce};
}

}  // namespace lossfns

// Public C++ API of lossfns::distill_loss: a thin typed call into the registered op, so C++ and
// Python share one code path (checks, autograd, dispatch).
#include <ATen/core/dispatch/Dispatcher.h>

#include "lossfns/distill.h"

namespace lossfns {

at::Tensor distill_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                        const DistillLossOptions& o, const std::optional<at::Tensor>& labels) {
  using Opt = const std::optional<at::Tensor>&;
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::distill_loss", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, Opt, c10::string_view, double,
                            double, int64_t, c10::string_view, std::optional<int64_t>, Opt)>();
  return op.call(student_logits, teacher_logits, labels, divergence_name(o.divergence()), o.beta(),
                 o.temperature(), o.ignore_index(), reduction_name(o.reduction()), o.vocab_size(),
                 o.grad_scale());
}

}  // namespace lossfns

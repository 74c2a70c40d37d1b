// lossfns::DistillLoss module: holds DistillLossOptions and calls lossfns::distill_loss.
#include "lossfns/distill_module.h"

namespace lossfns {

DistillLossImpl::DistillLossImpl(DistillLossOptions options_) : options(std::move(options_)) {}

void DistillLossImpl::reset() {}

void DistillLossImpl::pretty_print(std::ostream& stream) const {
  stream << "lossfns::DistillLoss(divergence=" << divergence_name(options.divergence());
  if (options.divergence() == Divergence::kJsd) stream << ", beta=" << options.beta();
  stream << ", temperature=" << options.temperature()
         << ", reduction=" << reduction_name(options.reduction())
         << ", ignore_index=" << options.ignore_index();
  if (options.vocab_size()) stream << ", vocab_size=" << *options.vocab_size();
  stream << ")";
}

at::Tensor DistillLossImpl::forward(const at::Tensor& student_logits,
                                    const at::Tensor& teacher_logits, const at::Tensor& labels) {
  return distill_loss(student_logits, teacher_logits, options, labels);
}

}  // namespace lossfns

// lossfns::DistillLoss: lossfns::distill_loss as a torch::nn module.
//   lossfns::DistillLoss
//   loss_fn(lossfns::DistillLossOptions().divergence(lossfns::Divergence::kForwardKl)); at::Tensor
//   loss = loss_fn(student_logits, teacher_logits.detach(), labels);
#pragma once

#include <ostream>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/pimpl.h>

#include "lossfns/distill.h"

namespace lossfns {

class DistillLossImpl : public torch::nn::Cloneable<DistillLossImpl> {
 public:
  explicit DistillLossImpl(DistillLossOptions options = {});
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  // labels: (BT,) / (B, T) int64, or an undefined tensor for none (torch::nn's convention for
  // optional tensors, so that AnyModule and Sequential can pass them).
  at::Tensor forward(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                     const at::Tensor& labels = {});

  DistillLossOptions options;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({2, torch::nn::AnyValue(at::Tensor())})
};

TORCH_MODULE(DistillLoss);

}  // namespace lossfns

// lossfns::TVDLoss: the TVD loss as a torch::nn module, like torch::nn::KLDivLoss.
//   lossfns::TVDLoss loss_fn(lossfns::TVDLossOptions().reduction(torch::kSum));
//   at::Tensor loss = loss_fn(p, q);            // or loss_fn(p, q, labels)
#pragma once

#include <ostream>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/pimpl.h>

#include "lossfns/tvd.h"

namespace lossfns {

class TVDLossImpl : public torch::nn::Cloneable<TVDLossImpl> {
 public:
  explicit TVDLossImpl(TVDLossOptions options = {});
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  // p, q: (BT, V) or (B, T, V) probabilities; labels: (BT,) / (B, T) int64, or an undefined
  // tensor for none (torch::nn's convention for optional tensors, so that AnyModule and
  // Sequential can pass them).
  at::Tensor forward(const at::Tensor& p, const at::Tensor& q, const at::Tensor& labels = {});

  TVDLossOptions options;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({2, torch::nn::AnyValue(at::Tensor())})
};

TORCH_MODULE(TVDLoss);

}  // namespace lossfns

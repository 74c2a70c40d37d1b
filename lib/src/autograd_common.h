// The autograd side every op's Function shares. Not installed.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

namespace lossfns::detail {

// The ops' backward is first-order only: a fused kernel without a derivative of its own. Under
// create_graph the gradients it returns come back attached to an error node (as Python's
// @once_differentiable does), so that differentiating them again raises, naming the op, instead
// of silently dropping the second-order term. Call it on backward's results, computed under
// at::NoGradGuard; `create_graph`: whether grad mode was on when backward was called.
inline torch::autograd::variable_list first_order_only(const char* op, bool create_graph,
                                                       torch::autograd::variable_list grads) {
  if (!create_graph) return grads;  // a plain backward
  at::AutoGradMode enable_grad(true);
  torch::autograd::variable_list inputs;
  bool any = false;
  for (const at::Tensor& g : grads) {
    any = any || g.defined();
    inputs.push_back(g.defined() ? g.detach().requires_grad_(true) : at::Tensor());
  }
  if (!any) return grads;
  auto error = std::make_shared<torch::autograd::DelayedError>(
      std::string(op) +
          ": its gradient cannot be differentiated again (the backward is a fused kernel without "
          "a derivative of its own): second-order gradients through it are not supported",
      static_cast<int64_t>(inputs.size()));
  return (*error)(std::move(inputs));
}

}  // namespace lossfns::detail

// The optimizer step's pieces: AdamW as one fused multi-tensor kernel per parameter group, and
// gradient-norm clipping as one multi-tensor norm and one multi-tensor scale.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>

#include "distill/config.h"
#include "distill/model.h"

namespace distill {

// torch::optim::AdamW's update, state and serialisation (checkpoints keep their format), with
// step() done by ATen's fused AdamW (at::_fused_adamw_, CPU and CUDA): one multi-tensor launch
// per parameter group instead of ~10 element-wise launches per parameter (the LibTorch class's
// loop). The arithmetic is the same (decoupled weight decay, bias-corrected moments, eps added
// after the square root); results differ from the loop's only in float rounding.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

// AdamW over `model` as every trainer here uses it: decoupled weight decay on the model's decay
// group only (matrices; biases and norm gains are not decayed), betas/eps/lr from `config`.
std::unique_ptr<torch::optim::AdamW> MakeOptimizer(const OptimConfig& config, CausalLM& model);

// The global L2 norm of the gradients of `parameters` (those without a gradient are skipped),
// returned on the host; when it exceeds `max_norm` the gradients are scaled by
// max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_. max_norm = inf measures without
// touching the gradients. Non-finite norms are returned as they are (the caller decides).
double ClipGradNorm(const std::vector<at::Tensor>& parameters, double max_norm);
// ClipGradNorm without the wait: the norm stays on the device (a 0-d tensor of the gradients'
// dtype; undefined when no parameter has a gradient) and the clipping is queued, so that the caller
// can read the norm together with other results in one transfer.
at::Tensor QueueClipGradNorm(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace distill

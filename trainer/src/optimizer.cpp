#include "distill/optimizer.h"

#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>

namespace distill {

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "FusedAdamW: amsgrad is not supported");
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<int64_t> counts;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) {  // as torch::optim::AdamW initialises its state
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        it = state_.emplace(p.unsafeGetTensorImpl(), std::move(state)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*it->second);
      state.step(state.step() + 1);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      counts.push_back(state.step());
    }
    if (params.empty()) continue;
    // The fused kernel reads each parameter's step count from a float tensor on its device;
    // parameters that have been updated equally often (normally all) share one.
    std::map<int64_t, at::Tensor> step_tensors;
    std::vector<at::Tensor> steps;
    steps.reserve(counts.size());
    for (int64_t count : counts) {
      auto [it, fresh] = step_tensors.try_emplace(count);
      if (fresh) {
        it->second =
            at::full({}, static_cast<double>(count), params[0].options().dtype(at::kFloat));
      }
      steps.push_back(it->second);
    }
    // ATen's fused kernel wants one device and dtype per call (the trainer's parameters are all
    // fp32 on the training device); group them otherwise.
    std::map<std::pair<std::string, int>, std::vector<size_t>> buckets;
    for (const auto i : c10::irange(params.size())) {
      buckets[{params[i].device().str(), static_cast<int>(params[i].scalar_type())}].push_back(i);
    }
    for (const auto& [key, index] : buckets) {
      auto pick = [&](const std::vector<at::Tensor>& all) {
        std::vector<at::Tensor> out;
        out.reserve(index.size());
        for (size_t i : index) out.push_back(all[i]);
        return out;
      };
      at::_fused_adamw_(pick(params), pick(grads), pick(exp_avgs), pick(exp_avg_sqs),
                        /*max_exp_avg_sqs=*/{}, pick(steps), options.lr(),
                        std::get<0>(options.betas()), std::get<1>(options.betas()),
                        options.weight_decay(), options.eps(), /*amsgrad=*/false,
                        /*maximize=*/false, /*grad_scale=*/std::nullopt,
                        /*found_inf=*/std::nullopt);
    }
  }
  return loss;
}

std::unique_ptr<torch::optim::AdamW> MakeOptimizer(const OptimConfig& config, CausalLM& model) {
  ParameterGroups params = model.parameter_groups();
  auto options_for = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(config.lr)
            .betas({config.betas[0], config.betas[1]})
            .eps(config.eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(params.decay, options_for(config.weight_decay));
  groups.emplace_back(params.no_decay, options_for(0.0));
  return std::make_unique<FusedAdamW>(groups, torch::optim::AdamWOptions(config.lr));
}

at::Tensor QueueClipGradNorm(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  at::NoGradGuard no_grad;
  // One multi-tensor launch for the per-tensor norms (fp32 accumulation), one for their norm.
  at::Tensor total = at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)), 2);
  if (std::isfinite(max_norm)) {
    // The scale stays on the device: clamp(max_norm / (norm + 1e-6), max=1), as torch's.
    const at::Tensor scale = at::clamp_max(max_norm / (total + 1e-6), 1.0);
    at::_foreach_mul_(grads, scale);
  }
  return total;
}

double ClipGradNorm(const std::vector<at::Tensor>& parameters, double max_norm) {
  const at::Tensor total = QueueClipGradNorm(parameters, max_norm);
  return total.defined() ? total.item<double>() : 0.0;
}

}  // namespace distill

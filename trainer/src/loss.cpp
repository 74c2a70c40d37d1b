#include "distill/loss.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <lossfns/tvd.h>

namespace distill {

Divergence ParseDivergence(const std::string& name) {
  TORCH_CHECK(name == "tvd", "distill.divergence: expected one of: tvd, got \"", name, "\"");
  return Divergence::kTvd;
}

at::Tensor DivergenceSum(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                         const DistillConfig& config) {
  switch (ParseDivergence(config.divergence)) {
    case Divergence::kTvd:
      return lossfns::tvd_loss(
          p, q,
          lossfns::TVDLossOptions().reduction(torch::kSum).ignore_index(config.ignore_index),
          targets);
  }
  TORCH_CHECK(false, "unreachable");
}

LossSums ComputeLossSums(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const at::Tensor& targets, const DistillConfig& config) {
  const int64_t V = student_logits.size(-1);
  // fp32 for the softmax and the reductions, also under bf16 autocast.
  const at::Tensor s = student_logits.reshape({-1, V}).to(at::kFloat);
  const at::Tensor y = targets.reshape({-1});
  at::Tensor ce = at::cross_entropy_loss(s, y, /*weight=*/{}, at::Reduction::Sum,
                                         config.ignore_index);
  if (!teacher_logits.defined()) return {ce, at::zeros_like(ce), ce.detach()};

  const at::Tensor t = teacher_logits.reshape({-1, V}).to(at::kFloat).detach();
  const at::Tensor p = at::softmax(s / config.temperature, -1);
  const at::Tensor q = at::softmax(t / config.temperature, -1);
  at::Tensor kd = DivergenceSum(p, q, y, config);
  at::Tensor total = config.kd_weight * kd;
  // Skip the CE graph when its weight is 0 (self-distillation stays exactly at the teacher).
  if (config.ce_weight != 0.0) total = total + config.ce_weight * ce;
  return {total, kd.detach(), ce.detach()};
}

}  // namespace distill

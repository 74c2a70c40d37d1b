#include "distill/loss.h"

#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <lossfns/cross_entropy.h>
#include <lossfns/distill.h>

namespace distill {

at::Tensor DivergenceSum(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const at::Tensor& targets, const DistillConfig& config) {
  auto options = lossfns::DistillLossOptions()
                     .divergence(config.divergence)
                     .beta(config.jsd_beta)
                     .temperature(config.temperature)
                     .ignore_index(config.ignore_index)
                     .reduction(torch::kSum);
  if (config.vocab_size > 0) options.vocab_size(config.vocab_size);
  return lossfns::distill_loss(student_logits, teacher_logits.detach(), options, targets);
}

LossSums ComputeLossSums(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const at::Tensor& targets, const DistillConfig& config) {
  // Cross-entropy on the student's real vocabulary, straight from the logits in their own dtype
  // (lossfns::cross_entropy_loss: fp32 math, no fp32 copy of the (BT, V) logits, no log-softmax
  // tensor, the gradient written once in the logits' dtype).
  const int64_t width = student_logits.size(-1);
  auto ce_options =
      lossfns::CrossEntropyLossOptions().ignore_index(config.ignore_index).reduction(torch::kSum);
  if (config.vocab_size > 0 && config.vocab_size < width) ce_options.vocab_size(config.vocab_size);
  at::Tensor ce = lossfns::cross_entropy_loss(student_logits.reshape({-1, width}),
                                              targets.reshape({-1}), ce_options);
  if (!teacher_logits.defined()) return {ce, at::zeros_like(ce), ce.detach()};

  // The divergence straight from the logits in their own dtype (lossfns::distill_loss: no
  // softmax, no fp32 copy). No grad_scale hint: on the H200 the forward-computed gradient it
  // enables measured 5-8% slower than recomputing in backward, and it would keep a (BT, V)
  // gradient alive from the forward to the backward (docs/benchmarks.md).
  at::Tensor kd = DivergenceSum(student_logits, teacher_logits, targets, config);
  at::Tensor total = config.kd_weight * kd;
  // Skip the CE graph when its weight is 0 (self-distillation stays exactly at the teacher).
  if (config.ce_weight != 0.0) total = total + config.ce_weight * ce;
  return {total, kd.detach(), ce.detach()};
}

}  // namespace distill

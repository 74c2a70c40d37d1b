#include "distill/loss.h"

#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <lossfns/cross_entropy.h>
#include <lossfns/distill.h>
#include <lossfns/fused_linear.h>

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

LossSums ComputeFusedLossSums(const at::Tensor& student_hidden, const at::Tensor& student_lm_head,
                              const at::Tensor& teacher_hidden, const at::Tensor& teacher_lm_head,
                              const at::Tensor& targets, const DistillConfig& config,
                              int64_t vocab_size) {
  const auto options = lossfns::FusedLinearDistillOptions()
                           .distill(lossfns::DistillLossOptions()
                                        .divergence(config.divergence)
                                        .beta(config.jsd_beta)
                                        .temperature(config.temperature)
                                        .ignore_index(config.ignore_index)
                                        .reduction(torch::kSum)
                                        .vocab_size(vocab_size))
                           .kd_weight(config.kd_weight)
                           .ce_weight(config.ce_weight);
  // The op picks its own dtypes (its inputs', fp32 accumulation); an enclosing autocast region
  // (Evaluate runs under one) must not recast the matmuls inside it.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const lossfns::FusedLinearDistillResult r =
      lossfns::fused_linear_distill_loss(student_hidden, student_lm_head, teacher_hidden.detach(),
                                         teacher_lm_head.detach(), targets, options);
  return {r.loss, r.divergence, r.ce};
}

}  // namespace distill

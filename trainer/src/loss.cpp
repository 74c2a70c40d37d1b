#include "distill/loss.h"

#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <lossfns/distill.h>

namespace distill {

at::Tensor AlignLogits(const at::Tensor& logits, int64_t width, int64_t vocab_size) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  at::Tensor out = logits;
  const int64_t have = logits.size(-1);
  if (vocab_size > 0 && vocab_size < have) {
    // masked_fill's backward is zero at the masked columns: padding rows get no gradient.
    out = out.masked_fill(at::arange(have, logits.options().dtype(at::kLong)).ge(vocab_size),
                          neg_inf);
  }
  if (width > have) {
    std::vector<int64_t> shape = logits.sizes().vec();
    shape.back() = width - have;
    out = at::cat({out, at::full(shape, neg_inf, out.options())}, -1);
  }
  return out;
}

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
  // Cross-entropy in fp32 (also under bf16 autocast), on the student's real vocabulary.
  const int64_t width = student_logits.size(-1);
  const at::Tensor s =
      AlignLogits(student_logits, width, config.vocab_size).reshape({-1, width}).to(at::kFloat);
  const at::Tensor y = targets.reshape({-1});
  at::Tensor ce = at::cross_entropy_loss(s, y, /*weight=*/{}, at::Reduction::Sum,
                                         config.ignore_index);
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

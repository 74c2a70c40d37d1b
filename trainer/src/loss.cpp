#include "distill/loss.h"

#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <lossfns/tvd.h>

namespace distill {

at::Tensor DivergenceSum(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                         const DistillConfig& config) {
  switch (config.divergence) {
    case Divergence::kTvd:
      return lossfns::tvd_loss(
          p, q,
          lossfns::TVDLossOptions().reduction(torch::kSum).ignore_index(config.ignore_index),
          targets);
  }
  TORCH_CHECK(false, "unreachable");
}

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

LossSums ComputeLossSums(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const at::Tensor& targets, const DistillConfig& config) {
  const int64_t width = std::max(student_logits.size(-1),
                                 teacher_logits.defined() ? teacher_logits.size(-1) : 0);
  // fp32 for the softmax and the reductions, also under bf16 autocast.
  const at::Tensor s =
      AlignLogits(student_logits, width, config.vocab_size).reshape({-1, width}).to(at::kFloat);
  const at::Tensor y = targets.reshape({-1});
  at::Tensor ce = at::cross_entropy_loss(s, y, /*weight=*/{}, at::Reduction::Sum,
                                         config.ignore_index);
  if (!teacher_logits.defined()) return {ce, at::zeros_like(ce), ce.detach()};

  const at::Tensor t = AlignLogits(teacher_logits.detach(), width, config.vocab_size)
                           .reshape({-1, width})
                           .to(at::kFloat);
  const at::Tensor p = at::softmax(s / config.temperature, -1);
  const at::Tensor q = at::softmax(t / config.temperature, -1);
  at::Tensor kd = DivergenceSum(p, q, y, config);
  at::Tensor total = config.kd_weight * kd;
  // Skip the CE graph when its weight is 0 (self-distillation stays exactly at the teacher).
  if (config.ce_weight != 0.0) total = total + config.ce_weight * ce;
  return {total, kd.detach(), ce.detach()};
}

}  // namespace distill

// The training objective, in sums over the non-ignored target tokens of one micro-batch.
//
// The trainer divides the sums by the count of non-ignored targets over all micro-batches of
// the optimizer step, so the step's loss is the batchmean over its tokens whatever the split
// into micro-batches:
//   distill:  total = kd_weight * D(softmax(s / T), softmax(t / T)) + ce_weight * CE(s, y)
//             with D = distill.divergence (tvd | forward_kl | reverse_kl | jsd), computed from the
//             logits by lossfns::distill_loss (distill.fused_linear: both terms from the last
//             hidden states by lossfns::fused_linear_distill_loss, ComputeFusedLossSums)
//   pretrain: total = CE(s, y)
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "distill/config.h"

namespace distill {

struct LossSums {
  at::Tensor total;  // 0-dim fp32, differentiable w.r.t. the student's logits
  at::Tensor kd;     // 0-dim fp32, detached; 0 in pretrain mode
  at::Tensor ce;     // 0-dim fp32, detached
};

// student_logits (B, T, V_s), teacher_logits (B, T, V_t) (V_s and V_t may differ; columns at or
// past config.vocab_size are padding); targets (B, T) int64 with ignore_index for padding.
// teacher_logits undefined in pretrain mode (kd_weight ignored).
LossSums ComputeLossSums(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const at::Tensor& targets, const DistillConfig& config);

// The same sums from the models' last hidden states and lm_heads (distill.fused_linear), through
// lossfns::fused_linear_distill_loss: chunked over tokens, no (BT, V) logits; the gradient
// w.r.t. the student's hidden states and lm_head is computed in forward and total.backward()
// applies it. student_hidden (B, T, H_s) and student_lm_head (V_s, H_s), teacher_hidden
// (B, T, H_t) and teacher_lm_head (V_t, H_t): one dtype (model.h MakeLogitsOperands). vocab_size:
// the columns that count, config.vocab_size when > 0, else the student's real vocab_size (the
// padded rows of the lm_heads, which forward() masks to -inf, are cut instead). Equals
// ComputeLossSums on forward()'s logits up to float rounding.
LossSums ComputeFusedLossSums(const at::Tensor& student_hidden, const at::Tensor& student_lm_head,
                              const at::Tensor& teacher_hidden, const at::Tensor& teacher_lm_head,
                              const at::Tensor& targets, const DistillConfig& config,
                              int64_t vocab_size);

// The divergence alone, summed over non-ignored rows, from the logits (lossfns::distill_loss with
// config's divergence, beta, temperature, ignore_index and vocab_size).
at::Tensor DivergenceSum(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                         const at::Tensor& targets, const DistillConfig& config);

}  // namespace distill

// Distillation loss from the models' last hidden states and lm_heads, chunked over tokens so that
// the (BT, V) logits never exist in full: per chunk the logits (a matmul in the input dtype), the
// divergence (distill_loss's kernels), the hard-label cross-entropy, and their gradient w.r.t. the
// student's hidden states and lm_head, all in forward. CPU and CUDA. docs/fused_linear.md.
//
//   auto out = lossfns::fused_linear_distill_loss(student_hidden, student.lm_head.weight,
//       teacher_hidden.detach(), teacher.lm_head.weight.detach(), labels,
//       lossfns::FusedLinearDistillOptions()
//           .distill(lossfns::DistillLossOptions().divergence(lossfns::Divergence::kForwardKl))
//           .ce_weight(0.5));
//   out.loss.backward();   // out.divergence and out.ce: the two terms, detached, for logging
//
// The teacher is a constant: its hidden states and lm_head get no gradient, and one that requires
// grad is an error (pass .detach()).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>

#include "lossfns/distill.h"

namespace lossfns {

struct FusedLinearDistillOptions {
  // The divergence, beta, temperature, ignore_index, reduction and vocab_size of distill_loss,
  // with its meanings. grad_scale does not apply (the gradient is always computed in forward) and
  // must be unset. The temperature applies to the divergence only, never to the cross-entropy.
  TORCH_ARG(DistillLossOptions, distill) = {};
  // loss = kd_weight * divergence + ce_weight * ce. Both weights are needed in forward (that is
  // where the gradient is computed). A weight of 0 drops its term from the loss and skips its
  // gradient's work; its value is still computed (the result reports both terms).
  TORCH_ARG(double, kd_weight) = 1.0;
  // The weight of the hard-label cross-entropy of the student's (untempered) logits against
  // `labels`; non-zero needs labels.
  TORCH_ARG(double, ce_weight) = 0.0;
  // Tokens (rows) per chunk. std::nullopt: automatic, from V and the memory budget (on CUDA
  // min(free / 8, 2 GiB), free counting the caching allocator's unused blocks; 256 MiB on the CPU).
  TORCH_ARG(std::optional<int64_t>, chunk_size) = std::nullopt;
};

struct FusedLinearDistillResult {
  // kd_weight * divergence + ce_weight * ce: 0-dim float32 (float64 for float64 inputs), or per
  // token for reduction kNone. Differentiable w.r.t. student_hidden and student_lm_head.
  at::Tensor loss;
  // The divergence term, reduced as distill_loss reduces it (batchmean: / N, mean: / (N * V),
  // sum, none: per token), N the tokens whose label is not ignore_index. Not differentiable.
  at::Tensor divergence;
  // The cross-entropy term: -log softmax(s)[label] over the V columns that count, reduced
  // batchmean and mean: / N (torch's cross_entropy 'mean'), sum, none: per token. 0 without
  // labels; +inf where a counted label is outside [0, min(V, V_s)). Not differentiable.
  at::Tensor ce;
};

// student_hidden (BT, H_s) or (B, T, H_s); student_lm_head (V_s, H_s); teacher_hidden the
// student's leading shape, (.., H_t); teacher_lm_head (V_t, H_t). One dtype for all four
// (float32, bfloat16, float16; float64 on the CPU), one device. labels: optional int64 (BT,) or
// (B, T): rows equal to ignore_index count nowhere; the others are the cross-entropy's targets.
// Logits: hidden @ lm_head^T (no bias). V_s and V_t may differ as in distill_loss (vocab_size
// cuts both).
FusedLinearDistillResult fused_linear_distill_loss(
    const at::Tensor& student_hidden, const at::Tensor& student_lm_head,
    const at::Tensor& teacher_hidden, const at::Tensor& teacher_lm_head,
    const std::optional<at::Tensor>& labels = std::nullopt,
    const FusedLinearDistillOptions& options = {});

}  // namespace lossfns

// Distillation losses from logits: total variation distance, forward KL, reverse KL and JSD(beta)
// between softmax(student_logits / T) and softmax(teacher_logits / T), fused: no softmax, no fp32
// copy and no (BT, V) intermediate besides the gradient; CPU and CUDA. docs/distill.md has the
// definitions, conventions, the gradient and the edge cases (ties, -inf, underflow).
//
//   at::Tensor loss = lossfns::distill_loss(student_logits, teacher_logits,
//       lossfns::DistillLossOptions().divergence(lossfns::Divergence::kJsd).beta(0.5), labels);
//
// The teacher is a constant: the gradient goes to the student's logits only, and a teacher that
// requires grad is an error (pass teacher_logits.detach()).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "lossfns/defaults.h"
#include "lossfns/reduction.h"

namespace lossfns {

// With p = softmax(s / T) (student), q = softmax(t / T) (teacher), per row (token):
//   kTvd:       0.5 * sum_j |p_j - q_j|
//   kForwardKl: KL(q || p) = sum_j q_j (log q_j - log p_j)
//   kReverseKl: KL(p || q) = sum_j p_j (log p_j - log q_j)
//   kJsd:       beta * KL(q || m) + (1 - beta) * KL(p || m), m = beta q + (1 - beta) p;
//               beta = 0 is kForwardKl and beta = 1 is kReverseKl (TRL's and Liger's convention)
enum class Divergence : int64_t { kTvd = 0, kForwardKl = 1, kReverseKl = 2, kJsd = 3 };

// The names of Divergence, in its order: the one table behind the op's `divergence` argument,
// Python's lossfns.distill_loss and distill_trainer's `distill.divergence`.
inline constexpr std::array<const char*, 4> kDivergenceNames = {"tvd", "forward_kl", "reverse_kl", "jsd"};
inline const char* divergence_name(Divergence d) { return kDivergenceNames[static_cast<size_t>(d)]; }
// The divergence named `name`, or std::nullopt.
inline std::optional<Divergence> divergence_from_name(std::string_view name) {
  for (size_t i = 0; i < kDivergenceNames.size(); ++i)
    if (name == kDivergenceNames[i]) return static_cast<Divergence>(i);
  return std::nullopt;
}

struct DistillLossOptions {
  TORCH_ARG(Divergence, divergence) = Divergence::kTvd;
  // JSD's mixture weight, in [0, 1] (kJsd only).
  TORCH_ARG(double, beta) = 0.5;
  // Softmax temperature T > 0 (both distributions). The loss is not multiplied by T^2.
  TORCH_ARG(double, temperature) = 1.0;
  // Rows whose label equals ignore_index contribute no loss and get no gradient.
  TORCH_ARG(int64_t, ignore_index) = kDefaultIgnoreIndex;
  // kBatchMean (default): sum / (rows not ignored). kMean: sum / (rows not ignored * V), V the
  // vocabulary's columns (torch's kl_div 'mean'). kSum: the plain sum. kNone: the per-row (per
  // token) loss, the logits' shape without V; ignored rows 0.
  TORCH_ARG(Reduction, reduction) = torch::kBatchMean;
  // Columns at or past vocab_size are padding: -inf in both distributions whatever they hold,
  // gradient 0. std::nullopt: every column counts.
  TORCH_ARG(std::optional<int64_t>, vocab_size) = std::nullopt;
  // Optional 1-element float tensor on the logits' device: the grad_output the caller's backward
  // will bring to this loss (e.g. kd_weight / tokens). Given, the CUDA forward computes the
  // gradient while it has the logits in hand (it reads them once, instead of again in backward);
  // backward then only checks on the device that grad_output equals it (and rescales if not).
  // A hint: the result is the same with or without it; the CPU ignores it.
  TORCH_ARG(std::optional<at::Tensor>, grad_scale) = std::nullopt;
};

// student_logits: (BT, V_s) or (B, T, V_s); teacher_logits: the same leading shape, (.., V_t),
// same dtype (float32, bfloat16, float16; float64 on the CPU) and device. V_s and V_t may differ:
// the narrower one's missing columns are -inf. labels: optional (BT,) or (B, T) int64.
// Returns a 0-dim float32 loss (float64 for float64 logits), or with kNone the per-row losses.
// Any strides with unit stride in V are read in place. Differentiable w.r.t. student_logits.
at::Tensor distill_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                        const DistillLossOptions& options = {},
                        const std::optional<at::Tensor>& labels = std::nullopt);

}  // namespace lossfns

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

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "lossfns/defaults.h"
#include "lossfns/divergence.h"
#include "lossfns/reduction.h"

namespace lossfns {

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
  // Optional 1-element floating-point tensor on the logits' device (checked on every device, also
  // where it is not used): the grad_output the caller's backward
  // will bring to this loss (e.g. kd_weight / tokens). Given, the CUDA forward computes the
  // gradient while it has the logits in hand (it reads them once, instead of again in backward);
  // backward then only checks on the device that grad_output equals it (and rescales if not;
  // a hint of 0 gets a gradient for 1, scaled in backward). A hint: the result is the same with
  // or without it; the CPU checks it, then ignores it. Its value is not checked (on CUDA that
  // would need a host synchronisation): NaN or inf gives a NaN gradient there.
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

// Total variation distance (TVD) loss between a student and a teacher distribution.
//
//   loss = 0.5 * sum_j |p_j - q_j|        per row of V probabilities, reduced over rows
//   d loss / d p_j = 0.5 * sign(p_j - q_j) * scale,  with sign(0) = 0
//
// The gradient is exactly 0.0 where p == q (self-distillation at step 0, padded vocabulary slots
// that are 0.0 in both distributions). CPU and CUDA; see docs/tvd.md for the full contract.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "lossfns/defaults.h"
#include "lossfns/reduction.h"

namespace lossfns {

// Options of tvd_loss() and TVDLoss, in LibTorch's style:
//   lossfns::TVDLossOptions().reduction(torch::kSum).ignore_index(-1)
struct TVDLossOptions {
  using reduction_t = Reduction;

  // kBatchMean (default): sum / (rows not ignored). kMean: sum / (rows not ignored * V).
  // kSum: the plain sum. kNone: the per-element loss 0.5*|p - q|, shape of p, fp32 (fp64 for
  // fp64 inputs), ignored rows 0.
  TORCH_ARG(reduction_t, reduction) = torch::kBatchMean;
  // Rows whose label equals ignore_index contribute no loss and get no gradient.
  TORCH_ARG(int64_t, ignore_index) = kDefaultIgnoreIndex;
};

// p: (BT, V) or (B, T, V) student probabilities; q: teacher probabilities, same shape, dtype and
// device. labels: optional (BT,) or (B, T) int64 on the same device. Returns a 0-dim loss
// (fp32; fp64 for fp64 inputs) or, with kNone, a tensor of p's shape. Differentiable w.r.t. p
// and q (q gets the negated gradient). Throws c10::Error naming the problem on bad input.
at::Tensor tvd_loss(const at::Tensor& p, const at::Tensor& q, const TVDLossOptions& options = {},
                    const std::optional<at::Tensor>& labels = std::nullopt);

}  // namespace lossfns

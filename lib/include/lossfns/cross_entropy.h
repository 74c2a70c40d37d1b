// Hard-label cross-entropy from logits, fused: reads the logits in their own dtype (math in
// float32), keeps only O(BT) statistics between forward and backward, and writes the gradient
// softmax(x) - onehot(y) once, in the logits' dtype; no float32 copy, no log_softmax output. CPU
// and CUDA. docs/cross_entropy.md has the conventions and the edge cases.
//
//   at::Tensor loss = lossfns::cross_entropy_loss(logits, labels,
//       lossfns::CrossEntropyLossOptions().reduction(torch::kSum).vocab_size(32000));
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>

#include "lossfns/defaults.h"
#include "lossfns/reduction.h"

namespace lossfns {

struct CrossEntropyLossOptions {
  // Rows whose label equals ignore_index contribute no loss and get no gradient.
  TORCH_ARG(int64_t, ignore_index) = kDefaultIgnoreIndex;
  // kMean (default) and kBatchMean: sum / (rows not ignored), torch's cross_entropy 'mean' (a
  // row is the unit); 0 when every row is ignored, where torch gives NaN. kSum: the plain sum.
  // kNone: the per-row (per-token) loss, the logits' shape without V; ignored rows 0.
  TORCH_ARG(Reduction, reduction) = torch::kMean;
  // Columns at or past vocab_size are padding: left out of the softmax whatever they hold (never
  // read), gradient 0. std::nullopt: every column counts.
  TORCH_ARG(std::optional<int64_t>, vocab_size) = std::nullopt;
};

// logits: (BT, V) or (B, T, V), float32, bfloat16, float16 (float64 on the CPU); any strides with
// unit stride in V are read in place. labels: (BT,) or (B, T) int64 on the logits' device, each
// ignore_index or in [0, V) (V: vocab_size when given). A label out of range is an error on the
// CPU; on CUDA its row's loss and gradient are NaN (checking would need a host synchronisation).
// Returns a 0-dim float32 loss (float64 for float64 logits), or with kNone the per-row losses.
// Differentiable w.r.t. logits; the gradient has the logits' dtype. Call it qualified
// (lossfns::cross_entropy_loss): with two tensor arguments, argument-dependent lookup also finds
// at::cross_entropy_loss.
at::Tensor cross_entropy_loss(const at::Tensor& logits, const at::Tensor& labels,
                              const CrossEntropyLossOptions& options = {});

}  // namespace lossfns

// Framework-free contract of lossfns::cross_entropy_loss shared by its CPU and CUDA kernels: the
// per-row state between forward and backward, which labels count, and the reduction's scale.
// Includes nothing from Torch or CUDA.
//
// Per row (token) with logits x (V columns that count), label y:
//   loss_row = logsumexp(x) - x_y,   d loss_row / d x_j = softmax(x)_j - [j == y]
// Ignored rows (y == ignore_index): loss 0, gradient 0. Columns at or past V: never read,
// gradient 0.
#pragma once

#include <cstdint>

#include "kernels_common.h"

namespace lossfns::kernels {

// Per-row state, kCeStatsPerRow floats per row (double for double logits on the CPU):
//   [0] max_j x_j, [1] log sum_j exp(x_j - max): logsumexp(x) in two parts, so that
//       log p_j = (x_j - max) - log_sum is exact near the max whatever the logits' magnitude
//       (distill_common.h says why). Natural log on the CPU; on CUDA, of log2(e)-scaled logits,
//       in log2. A row without mass (every column -inf): max -inf (log_sum 0 on the CPU, -inf on
//       CUDA); its loss and gradient are NaN (no distribution).
// Ignored rows hold 0, 0.
constexpr int64_t kCeStatsPerRow = 2;

// Whether a label names a column that counts. A label that is neither this nor ignore_index is
// an error on the CPU (the adapter's TORCH_CHECK) and a NaN row on CUDA (loss and gradient):
// a device kernel cannot raise without a host synchronisation, and a device assert would lose
// the process's CUDA context.
LOSSFNS_HOST_DEVICE bool ce_label_in_range(int64_t y, int64_t V) { return y >= 0 && y < V; }

// Scale that turns the summed row losses into the reduced loss. A row's loss is the unit of
// cross-entropy, so 'mean' (torch's cross_entropy) and 'batchmean' both divide by the rows not
// ignored; 0 when no row counts (loss 0 and gradient 0, where torch gives NaN); 'none' and 'sum'
// keep the rows' losses (scale 1).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc ce_reduction_scale(Reduction reduction, int64_t n_valid_rows) {
  if (reduction == kNone) return Acc(1);
  return reduction_scale<Acc>(reduction, n_valid_rows, /*V=*/1);
}

}  // namespace lossfns::kernels

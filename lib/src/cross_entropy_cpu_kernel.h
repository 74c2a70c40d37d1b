// Framework-free CPU kernels of lossfns::cross_entropy_loss: one row of logits in, the row's
// statistics and loss out (forward), or the row's gradient out (backward). Raw pointers only; the
// Torch adapter (cross_entropy_cpu.cpp) checks inputs and labels, picks the dtype and runs rows
// in parallel.
//
// Forward reads a row twice (its max, then the sum of exp: distill's row_logsumexp) and the
// target once; backward reads it once more and writes the gradient. The inner loops are the
// `omp simd` loops over the polynomial float exp of distill_cpu_kernel.h, accumulating in Acc
// (float; double for double logits, with libm).
#pragma once

#include <cstdint>
#include <limits>

#include "cross_entropy_common.h"
#include "distill_cpu_kernel.h"

namespace lossfns::kernels {

// Forward of one row of V logits with label y in [0, V): stats[0..kCeStatsPerRow) as
// cross_entropy_common.h lays them out; returns the row's loss, logsumexp(x) - x_y (+inf where
// x_y is -inf and the row has mass, NaN where the row holds a NaN or +inf, or has no mass).
template <typename T, typename Acc>
Acc ce_row_forward_cpu(const T* x, int64_t V, int64_t y, Acc* stats) {
  const auto lse = cpu_detail::row_logsumexp<T, Acc>(x, V, Acc(1));
  stats[0] = lse.max;
  stats[1] = lse.log_sum;
  return (lse.max - static_cast<Acc>(x[y])) + lse.log_sum;  // max - x_y is exact near the max
}

// Backward of one row: grad[j] = scale * (softmax(x)_j - [j == y]) for j < V and 0 for the
// padding columns V <= j < width, where scale = grad_output * the reduction's scale (the
// caller's). A row without mass (every column -inf: no softmax) gets NaN at every column < V, as
// its loss and torch's softmax.
template <typename T, typename Acc>
void ce_row_backward_cpu(const T* x, int64_t V, int64_t width, int64_t y, const Acc* stats,
                         Acc scale, T* grad) {
  const cpu_detail::LogSumExp<Acc> lse{stats[0], stats[1]};
  if (lse.max == -std::numeric_limits<Acc>::infinity())
    scale = std::numeric_limits<Acc>::quiet_NaN();
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) {
    Acc lp, p;
    cpu_detail::log_prob(static_cast<Acc>(x[j]), lse, lp, p);
    store_as(grad + j, scale * p);
  }
  Acc lp, p;
  cpu_detail::log_prob(static_cast<Acc>(x[y]), lse, lp, p);
  grad[y] = static_cast<T>(scale * (p - Acc(1)));
  for (int64_t j = V; j < width; ++j) grad[j] = static_cast<T>(0);
}

}  // namespace lossfns::kernels

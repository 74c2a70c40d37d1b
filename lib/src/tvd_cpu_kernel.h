// Framework-free CPU kernels of the TVD loss: one pass over a row in forward (the loss), one pass
// over p and q in backward (sign(p - q) recomputed). Raw pointers and sizes only; the Torch
// adapter (tvd_cpu.cpp) checks inputs, picks the dtype and runs rows in parallel.
//
// Why the CPU recomputes signs instead of saving them as the CUDA path does: on a CPU, packing
// signs costs as much compute as the whole forward, while re-reading p and q (which autograd
// keeps alive anyway) is cheap; it also keeps no extra memory between forward and backward.
#pragma once

#include <cmath>
#include <cstdint>

#include "tvd_common.h"

namespace lossfns::kernels {

// Blocks of 16 elements with 16 independent partial sums: the shape the compiler's SLP
// vectoriser turns into SIMD (it may not reassociate a single float sum).
constexpr int kCpuBlock = 16;

// p, q: one row of V elements (contiguous). Returns sum_j |p_j - q_j| in Acc.
// elem_loss (if kElemLoss): V values of 0.5*|p_j - q_j|.
template <bool kElemLoss, typename T, typename Acc>
Acc tvd_row_forward_cpu(const T* p, const T* q, int64_t V, Acc* elem_loss) {
  Acc s[kCpuBlock] = {};
  int64_t j = 0;
  for (; j + kCpuBlock <= V; j += kCpuBlock) {
    for (int k = 0; k < kCpuBlock; ++k) {
      const Acc a = std::abs(static_cast<Acc>(p[j + k]) - static_cast<Acc>(q[j + k]));
      s[k] += a;
      if constexpr (kElemLoss) elem_loss[j + k] = Acc(0.5) * a;
    }
  }
  for (; j < V; ++j) {
    const Acc a = std::abs(static_cast<Acc>(p[j]) - static_cast<Acc>(q[j]));
    s[0] += a;
    if constexpr (kElemLoss) elem_loss[j] = Acc(0.5) * a;
  }
  Acc total = Acc(0);
  for (int k = 0; k < kCpuBlock; ++k) total += s[k];
  return total;
}

// Backward of one row: grad_j = sign(p_j - q_j) * h_j, sign(0) = 0, where h_j = h (a reduced loss:
// 0.5 * scale * grad_output) or 0.5 * grad_output_j ('none': grad_output is a row of V values).
template <bool kElementwise, typename T, typename Acc>
void tvd_row_backward_cpu(const T* p, const T* q, int64_t V, Acc h, const Acc* grad_output,
                          T* grad) {
  for (int64_t j = 0; j < V; ++j) {
    const Acc hj = kElementwise ? Acc(0.5) * grad_output[j] : h;
    const Acc d = static_cast<Acc>(p[j]) - static_cast<Acc>(q[j]);
    // sign(d) = (d > 0) - (d < 0), branch-free (signs of real data are random); a tie, and a NaN
    // difference as in ATen, gives 0 * h.
    const Acc sign = static_cast<Acc>(d > Acc(0)) - static_cast<Acc>(d < Acc(0));
    grad[j] = static_cast<T>(sign * hj);
  }
}

}  // namespace lossfns::kernels

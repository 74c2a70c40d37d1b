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
#include <cstring>
#include <type_traits>

#include "tvd_common.h"

namespace lossfns::kernels {

// Blocks of 16 elements with 16 independent partial sums: the shape the compiler's SLP
// vectoriser turns into SIMD (it may not reassociate a single float sum).
constexpr int kCpuBlock = 16;
// The fp32 partial sums are folded into a double every kCpuFoldBlocks blocks (1024 elements), so
// that no fp32 chain is longer than 64 terms whatever V is: the row sum keeps ~1e-7 relative error
// at any V (fp32 chains over the whole row lost 1.5e-5 at V = 2M and stopped growing at 2^27 past
// V = 2^31; issue 17). One fold per 1024 elements costs nothing measurable.
constexpr int64_t kCpuFoldBlocks = 64;

// sum_j |p_j - q_j| over n elements (a multiple of kCpuBlock) in kCpuBlock fp32 chains, folded
// into a double; elem_loss as below.
template <bool kElemLoss, typename T, typename Acc>
double tvd_blocks_forward_cpu(const T* p, const T* q, int64_t n, Acc* elem_loss) {
  Acc s[kCpuBlock] = {};
  for (int64_t j = 0; j < n; j += kCpuBlock) {
    for (int k = 0; k < kCpuBlock; ++k) {
      const Acc a = std::abs(static_cast<Acc>(p[j + k]) - static_cast<Acc>(q[j + k]));
      s[k] += a;
      if constexpr (kElemLoss) elem_loss[j + k] = Acc(0.5) * a;
    }
  }
  double total = 0.0;
  for (int k = 0; k < kCpuBlock; ++k) total += static_cast<double>(s[k]);
  return total;
}

// p, q: one row of V elements (contiguous). Returns sum_j |p_j - q_j| (in double for float rows).
// elem_loss (if kElemLoss): V values of 0.5*|p_j - q_j|.
template <bool kElemLoss, typename T, typename Acc>
double tvd_row_forward_cpu(const T* p, const T* q, int64_t V, Acc* elem_loss) {
  constexpr int64_t kChunk = kCpuFoldBlocks * kCpuBlock;
  const int64_t whole = V / kCpuBlock * kCpuBlock;
  double total = 0.0;
  for (int64_t j = 0; j < whole; j += kChunk) {
    const int64_t n = whole - j < kChunk ? whole - j : kChunk;
    total +=
        tvd_blocks_forward_cpu<kElemLoss>(p + j, q + j, n, kElemLoss ? elem_loss + j : elem_loss);
  }
  Acc tail = Acc(0);
  for (int64_t j = whole; j < V; ++j) {
    const Acc a = std::abs(static_cast<Acc>(p[j]) - static_cast<Acc>(q[j]));
    tail += a;
    if constexpr (kElemLoss) elem_loss[j] = Acc(0.5) * a;
  }
  return total + static_cast<double>(tail);
}

// sign(d) * h with sign(0) = 0, as the bits of h with d's sign bit folded in where d is non-zero
// and those of zero_h (= 0 * h, which keeps ATen's NaN for an infinite h) where d is 0 or NaN;
// bit-identical to (float(d > 0) - float(d < 0)) * h but for the sign of a NaN h.
//
// Why bits and not that product: gcc 13 turns the product of a runtime h into a three-way branch
// (h, -h or 0 * h per element), which it no longer vectorises; with random signs the branches
// mispredict, and the CPU backward ran 5x slower than the same loop built by gcc 12 (issue 22:
// 231 against 45 ms for (1024, 32000) fp32 on one thread of the GPU machine's host). Integer
// masks have no branch to take, and both compilers vectorise them.
template <typename Acc>
inline Acc signed_or_zero(Acc d, Acc h, Acc zero_h) {
  static_assert(sizeof(Acc) == 4 || sizeof(Acc) == 8, "a float or a double");
  using U = std::conditional_t<sizeof(Acc) == 4, uint32_t, uint64_t>;
  constexpr U kSignBit = U(1) << (8 * sizeof(U) - 1);
  U db, hb, zb;
  std::memcpy(&db, &d, sizeof d);
  std::memcpy(&hb, &h, sizeof h);
  std::memcpy(&zb, &zero_h, sizeof zero_h);
  const U nonzero = U(0) - static_cast<U>((d > Acc(0)) | (d < Acc(0)));  // all ones, or none
  const U r = ((hb ^ (db & kSignBit)) & nonzero) | (zb & ~nonzero);
  Acc out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// Backward of one row: grad_j = sign(p_j - q_j) * h_j, sign(0) = 0, where h_j = h (a reduced loss:
// 0.5 * scale * grad_output) or 0.5 * grad_output_j ('none': grad_output is a row of V values).
// A tie, and a NaN difference as in ATen, gives 0 * h_j.
template <bool kElementwise, typename T, typename Acc>
void tvd_row_backward_cpu(const T* p, const T* q, int64_t V, Acc h, const Acc* grad_output,
                          T* grad) {
  const Acc zero_h = Acc(0) * h;
  for (int64_t j = 0; j < V; ++j) {
    const Acc hj = kElementwise ? Acc(0.5) * grad_output[j] : h;
    const Acc zj = kElementwise ? Acc(0) * hj : zero_h;
    const Acc d = static_cast<Acc>(p[j]) - static_cast<Acc>(q[j]);
    store_as(grad + j, signed_or_zero(d, hj, zj));
  }
}

}  // namespace lossfns::kernels

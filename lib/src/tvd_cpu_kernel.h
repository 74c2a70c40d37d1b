// Framework-free CPU kernels of the TVD loss: one pass over a row in forward (loss + packed signs),
// one pass over the packed signs in backward. Raw pointers and sizes only; the Torch adapter
// (tvd_cpu.cpp) checks inputs, picks the dtype and runs rows in parallel.
#pragma once

#include <cmath>
#include <cstdint>

#include "tvd_common.h"

namespace lossfns::kernels {

// p, q: one row of V elements (contiguous). Returns sum_j |p_j - q_j| in Acc.
// signs (if kSaveSigns): ceil(V/4) bytes of 2-bit codes (of a row of sign_row_pitch(V) bytes).
// elem_loss (if kElemLoss): V values of 0.5*|p_j - q_j|.
template <bool kSaveSigns, bool kElemLoss, typename T, typename Acc>
Acc tvd_row_forward_cpu(const T* p, const T* q, int64_t V, uint8_t* signs, Acc* elem_loss) {
  // Four partial sums: independent dependency chains (the compiler may not reassociate floats).
  Acc s[kSignsPerByte] = {Acc(0), Acc(0), Acc(0), Acc(0)};
  int64_t j = 0;
  for (; j + kSignsPerByte <= V; j += kSignsPerByte) {
    uint32_t byte = 0;
    for (int k = 0; k < kSignsPerByte; ++k) {
      const Acc d = static_cast<Acc>(p[j + k]) - static_cast<Acc>(q[j + k]);
      const Acc a = std::abs(d);
      s[k] += a;
      if constexpr (kElemLoss) elem_loss[j + k] = Acc(0.5) * a;
      if constexpr (kSaveSigns) byte |= sign_code(d) << (2 * k);
    }
    if constexpr (kSaveSigns) signs[j / kSignsPerByte] = static_cast<uint8_t>(byte);
  }
  if (j < V) {  // tail of V % 4 elements
    uint32_t byte = 0;
    for (int k = 0; j + k < V; ++k) {
      const Acc d = static_cast<Acc>(p[j + k]) - static_cast<Acc>(q[j + k]);
      const Acc a = std::abs(d);
      s[k] += a;
      if constexpr (kElemLoss) elem_loss[j + k] = Acc(0.5) * a;
      if constexpr (kSaveSigns) byte |= sign_code(d) << (2 * k);
    }
    if constexpr (kSaveSigns) signs[j / kSignsPerByte] = static_cast<uint8_t>(byte);
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Backward of a reduced loss: grad_j = sign_j * h with h = 0.5 * scale * grad_output.
template <typename T, typename Acc>
void tvd_row_backward_cpu(const uint8_t* signs, int64_t V, Acc h, T* grad) {
  const T zero = static_cast<T>(Acc(0) * h);  // 0 * h, as the reference: NaN if h is not finite
  const T lut[4] = {zero, static_cast<T>(h), static_cast<T>(-h), zero};
  int64_t j = 0;
  for (; j + kSignsPerByte <= V; j += kSignsPerByte) {
    const uint32_t byte = signs[j / kSignsPerByte];
    for (int k = 0; k < kSignsPerByte; ++k) grad[j + k] = lut[(byte >> (2 * k)) & 3u];
  }
  for (; j < V; ++j) grad[j] = lut[(signs[j / kSignsPerByte] >> (2 * (j % kSignsPerByte))) & 3u];
}

// Backward of reduction 'none': grad_j = sign_j * 0.5 * grad_output_j.
template <typename T, typename Acc>
void tvd_row_backward_none_cpu(const uint8_t* signs, int64_t V, const Acc* grad_output, T* grad) {
  for (int64_t j = 0; j < V; ++j) {
    const uint32_t code = (signs[j / kSignsPerByte] >> (2 * (j % kSignsPerByte))) & 3u;
    grad[j] = static_cast<T>(sign_value<Acc>(code) * (Acc(0.5) * grad_output[j]));
  }
}

}  // namespace lossfns::kernels

// Framework-free pieces shared by the CPU and CUDA TVD kernels: the sign rule and the packed sign
// format the CUDA forward saves for backward. Includes nothing from Torch or CUDA.
//
// Why the CUDA path saves signs and not the gradient: backward needs only sign(p - q) per
// element. Saving it packed, instead of a (BT, V) gradient, lets backward honour any grad_output
// (read on the device) in one write pass: forward reads p and q, backward writes grad, and the
// signs are the only extra traffic, so they are packed as tightly as a fixed layout allows.
#pragma once

#include <cstdint>

#include "kernels_common.h"

namespace lossfns::kernels {

// Sign codes: what backward multiplies 0.5 * scale * grad_output by (0, +1, -1).
enum SignCode : uint32_t { kZero = 0, kPos = 1, kNeg = 2 };

// Packed signs, one row of `sign_row_pitch(V)` bytes per row of p. A row is cut into tiles of
// kTileElems elements (the last one may be partial). Three regions, each starting on a 128-byte
// line:
//   pos   [0, sign_tie_offset):   bit j % 8 of byte j / 8 is (p_j > q_j); 32 bytes per tile.
//   ties  [sign_tie_offset, ...): bit j % 8 of byte j / 8 is "p_j == q_j (or NaN)"; written and
//                                 read only for tiles whose flag is kSomeTies.
//   flags [sign_flag_offset, ...): one flag byte per tile (TileFlag, or kOneTie + i).
// So a tile without ties costs 1 bit per element and its flag byte, where 2-bit codes cost 2 bits
// (fp32 data almost never ties). A tile with exactly one tie, at index i <= kOneTieMaxIndex of
// the tile, says where in its flag (kOneTie + i) and needs no tie bits either: in bf16 a third of
// the tiles of two unrelated softmax rows have a tie, and four in five of those have just one. A
// tile with more ties costs 2 bits per element and the flag, and backward reads its tie bits
// only once it has the flag (nearly every tile of a student close to its teacher, in bf16). A
// tile that is all ties (padded vocabulary slots, self-distillation's first step, ignored rows)
// needs no tie bits at all. docs/benchmarks.md has the measurements.
constexpr int64_t kTileElems = 256;
constexpr int64_t kTileBytes = kTileElems / 8;
enum TileFlag : uint8_t { kNoTies = 0, kSomeTies = 1, kAllTies = 2, kOneTie = 3 };
constexpr uint32_t kOneTieMaxIndex = 255 - kOneTie;  // a single tie past it goes to the tie bits

LOSSFNS_HOST_DEVICE int64_t round_up_128(int64_t n) { return (n + 127) / 128 * 128; }
LOSSFNS_HOST_DEVICE int64_t sign_tiles(int64_t V) { return (V + kTileElems - 1) / kTileElems; }
LOSSFNS_HOST_DEVICE int64_t sign_tie_offset(int64_t V) {
  return round_up_128(sign_tiles(V) * kTileBytes);
}
LOSSFNS_HOST_DEVICE int64_t sign_flag_offset(int64_t V) { return 2 * sign_tie_offset(V); }
LOSSFNS_HOST_DEVICE int64_t sign_row_pitch(int64_t V) {
  return sign_flag_offset(V) + round_up_128(sign_tiles(V));
}

// The code of element j from a packed row (what the element-wise paths read).
LOSSFNS_HOST_DEVICE uint32_t sign_code_at(const uint8_t* srow, int64_t V, int64_t j) {
  const uint8_t flag = srow[sign_flag_offset(V) + j / kTileElems];
  const uint32_t bit = 1u << (j % 8);
  if (flag == kAllTies || (flag == kSomeTies && (srow[sign_tie_offset(V) + j / 8] & bit)) ||
      (flag >= kOneTie && j % kTileElems == flag - kOneTie))
    return kZero;
  return (srow[j / 8] & bit) ? kPos : kNeg;
}

// The signed unit for a code: 0, +1 or -1. Backward multiplies it by 0.5*scale*grad_output, so a
// tie gives exactly 0 (NaN only if grad_output itself is not finite, as in the reference).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc sign_value(uint32_t code) {
  return code == kPos ? Acc(1) : (code == kNeg ? Acc(-1) : Acc(0));
}

}  // namespace lossfns::kernels

// Framework-free pieces shared by the CPU and CUDA TVD kernels: the sign rule, the reduction's
// scale, and the 2-bit sign code the CUDA forward saves for backward with its packed layout.
// Includes nothing from Torch or CUDA.
//
// Why the CUDA path saves signs and not the gradient: backward needs only sign(p - q) per
// element. Saving it as 2 bits (4 per byte) instead of a (BT, V) gradient keeps BT*V/4 bytes alive
// between forward and backward, and lets backward honour any grad_output (read on the device) in one write pass:
// forward reads p and q, backward writes grad, plus 2 * BT*V/4 bytes of signs.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOSSFNS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOSSFNS_HOST_DEVICE inline
#endif

namespace lossfns::kernels {

// Reductions, in the integer form the internal ops take.
enum Reduction : int64_t { kNone = 0, kSum = 1, kMean = 2, kBatchMean = 3 };

// 2-bit codes. A tie (p == q) is code 0, so all-zero bytes mean "no gradient": ignored rows are
// simply zero-filled. Code 3 is never written and decodes as 0.
enum SignCode : uint32_t { kZero = 0, kPos = 1, kNeg = 2 };
constexpr int kSignsPerByte = 4;
// Row pitch of the packed signs, in bytes: a multiple of 128 so that every row starts on a cache
// line and a warp's sign stores cover whole 32-byte sectors (with the CUDA forward's chunks on
// 32-group boundaries).
LOSSFNS_HOST_DEVICE int64_t sign_row_pitch(int64_t V) {
  return ((V + kSignsPerByte - 1) / kSignsPerByte + 127) / 128 * 128;
}

// sign(d) as a code, defined as ATen's sign: (0 < d) - (d < 0). So a tie gives 0, and so does a
// NaN difference (the loss is NaN then; abs's backward in ATen gives 0 there too).
template <typename Acc>
LOSSFNS_HOST_DEVICE uint32_t sign_code(Acc d) {
  // Branch-free: signs of real data are random, and a branch per element mispredicts half the time.
  return static_cast<uint32_t>(d > Acc(0)) | (static_cast<uint32_t>(d < Acc(0)) << 1);
}

// The signed unit for a code: 0, +1 or -1. Backward multiplies it by 0.5*scale*grad_output, so a
// tie gives exactly 0 (NaN only if grad_output itself is not finite, as in the reference).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc sign_value(uint32_t code) {
  return code == kPos ? Acc(1) : (code == kNeg ? Acc(-1) : Acc(0));
}

// Scale that turns the summed loss into the reduced one; 0 when no row counts, so an all-ignored
// batch gives loss 0 and gradient 0, not NaN.
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc reduction_scale(int64_t reduction, int64_t n_valid_rows, int64_t V) {
  if (reduction == kSum) return Acc(1);
  if (n_valid_rows == 0) return Acc(0);
  const Acc denom = reduction == kMean ? Acc(n_valid_rows) * Acc(V) : Acc(n_valid_rows);
  return Acc(1) / denom;
}

}  // namespace lossfns::kernels

// What the distillation workshops (distill_row_on_chip.cu, distill_row_queue.cu) share: random
// bf16 logits made on the device, and a host conversion of bf16 bits.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>

namespace distill_workshop {

// x[i] uniform in [-amp / 2, amp / 2), from a hash of i and the seed (the same values on every
// device and launch shape).
static __global__ void fill_logits(__nv_bfloat16* x, int64_t n, uint32_t seed, float amp) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ (uint32_t(i >> 32) + seed) * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    x[i] = __float2bfloat16_rn(amp * (float(h) * (1.f / 4294967296.f) - 0.5f));
  }
}

// A bf16's bits as the float it is (exact).
inline float bf2f(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace distill_workshop

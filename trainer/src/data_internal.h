// Seeding helpers shared by the data sources (data.cpp, data_tokens.cpp): every batch is drawn
// from a generator whose state is a pure function of (seed, split, index).
#pragma once

#include <cstdint>

#include "distill/data.h"

namespace distill::internal {

inline uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0xD6E8FEB86659FD93ULL);
  return SplitMix64(s);
}

// The generator state of micro-batch `index` of `split` (0 train, 1 validation).
inline uint64_t StreamState(int64_t seed, int split, int64_t index) {
  return Mix(Mix(static_cast<uint64_t>(seed), 0x5EED0000ULL + split), static_cast<uint64_t>(index));
}

}  // namespace distill::internal

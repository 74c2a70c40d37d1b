// Helpers shared by the data sources (data.cpp, data_tokens.cpp): the seeding (every batch is
// drawn from a generator whose state is a pure function of (seed, split, index)) and the files'
// fingerprints (DataSource::Files).
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "distill/data.h"
#include "distill/run_dir.h"  // Fnv1a64

namespace distill::internal {

inline uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0xD6E8FEB86659FD93ULL);
  return SplitMix64(s);
}

// The generator state of micro-batch `index` of `split` (0 train, 1 validation).
inline uint64_t StreamState(int64_t seed, int split, int64_t index) {
  return Mix(Mix(static_cast<uint64_t>(seed), 0x5EED0000ULL + split), static_cast<uint64_t>(index));
}

// A file's entry value in DataSource::Files: "<size>:<fingerprint>", the fingerprint an FNV-1a
// of up to three 64 KiB windows of its `bytes` (the start, the middle and the end: the whole of a
// file up to 192 KiB), so that a file rewritten at the same size (documents tokenized again in
// another order) is told apart without reading gigabytes at every start. A change that misses
// all three windows goes unnoticed.
inline std::string SizeAndFingerprint(int64_t size, const unsigned char* bytes, int64_t n) {
  constexpr int64_t kWindow = 64 << 10;
  uint64_t hash = Fnv1a64(&n, sizeof n);
  if (n <= 3 * kWindow) {
    hash = Fnv1a64(bytes, static_cast<size_t>(n), hash);
  } else {
    for (const int64_t at : {int64_t{0}, n / 2 - kWindow / 2, n - kWindow}) {
      hash = Fnv1a64(bytes + at, static_cast<size_t>(kWindow), hash);
    }
  }
  return fmt::format("{}:{:016x}", size, hash);
}

}  // namespace distill::internal

// llm.c token shards (the .bin files of karpathy/llm.c dev/data/*.py) as a DataSource: shards are
// memory-mapped read-only, never copied, and batches are pure functions of (seed, split, index).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distill/config.h"
#include "distill/data.h"

namespace distill {

// The shard format, as llm.c's dev/data/data_common.py (write_datafile, HEADERS_INFO) writes it:
// a header of 256 little-endian int32 ([0] magic, [1] version, [2] token count, the rest 0),
// then the tokens, little-endian: uint16 for "gpt-2" (magic 20240520, version 1), uint32 for
// "llama-3" (magic 20240801, version 7).
inline constexpr int64_t kShardHeaderBytes = 256 * 4;
inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;

// One shard, checked against its header (size, magic, version, exact file size) before it is
// mapped (read-only, MAP_PRIVATE); unmapped on destruction. Throws std::runtime_error naming
// the file. Cost: one open, one 1 KiB read and one mmap; tokens are paged in on access.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t token_bytes() const { return token_bytes_; }  // 2 (uint16) or 4 (uint32)
  // The index of the first token in [begin, end) at or above `limit`, or -1 when every one is
  // below it (the range's maximum first: a vectorised pass).
  int64_t FirstTokenAtLeast(uint32_t limit, int64_t begin, int64_t end) const;
  // Whether `other` holds the same tokens (a copy of this shard: its count, width and bytes;
  // compared until the first difference).
  bool SameTokens(const TokenShard& other) const;
  // The token bytes (num_tokens() * token_bytes() of them).
  const unsigned char* token_data() const { return tokens_; }
  // Token i, 0 <= i < num_tokens() (unchecked).
  uint32_t Token(int64_t i) const {
    const unsigned char* p = tokens_ + i * token_bytes_;
    return token_bytes_ == 2 ? *reinterpret_cast<const uint16_t*>(p)
                             : *reinterpret_cast<const uint32_t*>(p);
  }

 private:
  std::string path_;
  int64_t num_tokens_ = 0;
  int64_t token_bytes_ = 2;
  void* map_ = nullptr;
  int64_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
};

// data.source "tokens": data.path is a glob of training shards (glob(3), sorted bytewise);
// data.val_path an optional glob of validation shards, else the last data.val_fraction of the
// training tokens (the tail of the concatenated stream) is held out. A training batch is
// data.batch_size windows of data.seq_len + 1 tokens, each inside one shard, starting uniformly
// at random over every valid start; validation batch j is the fixed windows j*B .. j*B+B-1
// (modulo their number) laid end to end over the validation tokens. Every token of every shard
// is checked against `vocab_size` here, before any training (one read of the shards, in chunks
// in parallel: a bad token fails the start, not a run hours in; a shard already checked in this
// process -- a pipeline's next stage -- is not read again unless it changed), and again when a
// batch is built. Throws std::runtime_error naming the key or the file.
std::unique_ptr<DataSource> MakeTokenShardSource(const DataConfig& config, int64_t vocab_size);

// Writes `tokens` as an llm.c shard: uint16 (magic 20240520, version 1) or, when
// `uint32_tokens`, uint32 (magic 20240801, version 7). Atomic: a temporary file beside `path`,
// then rename. Throws std::runtime_error naming the file (also for a token that does not fit).
void WriteTokenShard(const std::string& path, const std::vector<uint32_t>& tokens,
                     bool uint32_tokens);

}  // namespace distill

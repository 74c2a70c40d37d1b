// Token data for training and validation. Every batch is a pure function of (seed, split,
// index): the "data position" of a run is just the number of micro-batches it has consumed, so
// resuming needs no iterator state and runs are deterministic across processes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "distill/config.h"

namespace distill {

struct Batch {
  at::Tensor inputs;    // (B, T) int64 tokens
  at::Tensor targets;   // (B, T) int64: the next token, or ignore_index for padding
  int64_t num_targets;  // targets != ignore_index
};

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Micro-batch `index` of the endless training stream (CPU).
  virtual Batch TrainBatch(int64_t index) const = 0;
  // Micro-batch `index`, in [0, count), of an evaluation that reads `count` micro-batches of the
  // fixed validation set: the same every time (CPU). Token shards spread the evaluation's
  // sequences evenly over their windows; generated and text data draw them by index.
  virtual Batch ValBatch(int64_t index, int64_t count) const = 0;
  // The lowest achievable mean cross-entropy per target token (nats), when known.
  virtual std::optional<double> EntropyFloor() const = 0;
  // How many distinct sequences ValBatch can read before it repeats them, when it does (token
  // shards' fixed windows); nullopt where validation draws them at random.
  virtual std::optional<int64_t> ValidationSequences() const { return std::nullopt; }
  virtual std::string Describe() const = 0;
  // The files the data is read from, their sizes and a fingerprint of their contents, one
  // "<role> <path> <size>:<fingerprint>" line each (role train or val; size in tokens, or bytes
  // for text; data_internal.h's SizeAndFingerprint); "" for generated data. Stored in each
  // checkpoint: a resume on other files says so (its batches, and maybe its validation windows,
  // are not those the run had). Checkpoints before session 47 hold the size alone.
  virtual std::string Files() const { return ""; }
};

// `vocab_size` is the models' real vocabulary. Throws std::runtime_error naming the data key
// when the data cannot be used (unreadable file, too short for one sequence).
std::unique_ptr<DataSource> MakeDataSource(const DataConfig& config, int64_t vocab_size,
                                           int64_t ignore_index);

// A seeded random language: the first `order` tokens of a sequence are uniform; after that,
// each context of `order` tokens has `branching` distinct successors (chosen by hashing the
// context) with Zipf probabilities w_r ~ r^-zipf. Every context has the same conditional
// entropy H(w), so the entropy floor is exact, whatever the stationary distribution.
class SyntheticLanguage {
 public:
  SyntheticLanguage(const SyntheticConfig& config, int64_t vocab_size, uint64_t seed);
  // Fills `tokens` (n tokens) with one sequence drawn with `rng_state` (splitmix64 state).
  void Sample(uint64_t& rng_state, int64_t n, int64_t* tokens) const;
  // log P(token | the `order` tokens at context): log w_r for the r-th successor, else -inf.
  double LogProb(const int64_t* context, int64_t token) const;
  // H(w) in nats: the entropy of a token given its full context.
  double ConditionalEntropy() const;
  int64_t order() const { return order_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  int64_t Successor(const int64_t* context, int64_t rank) const;
  int64_t order_, vocab_size_;
  uint64_t seed_;
  std::vector<double> cumulative_;  // CDF of w over ranks
  std::vector<double> weights_;
};

// splitmix64: a tiny, good, seedable generator; also used as a hash.
uint64_t SplitMix64(uint64_t& state);

}  // namespace distill

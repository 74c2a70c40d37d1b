#include "distill/data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "data_internal.h"
#include "distill/file_io.h"
#include "distill/token_shards.h"

namespace distill {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

namespace {

using internal::Mix;
using internal::StreamState;

double Uniform01(uint64_t& state) { return (SplitMix64(state) >> 11) * 0x1.0p-53; }

class SyntheticSource : public DataSource {
 public:
  SyntheticSource(const DataConfig& c, int64_t vocab_size, int64_t ignore_index)
      : config_(c),
        language_(c.synthetic, vocab_size, static_cast<uint64_t>(c.seed)),
        ignore_index_(ignore_index) {}

  Batch TrainBatch(int64_t index) const override { return Make(0, index); }
  Batch ValBatch(int64_t index, int64_t) const override { return Make(1, index); }

  // Target j (1-based) is uniform (log V) while j < order, else H(w). With the length L uniform
  // in [min_seq_len, seq_len], the token-weighted mean is E[sum of entropies] / E[L].
  std::optional<double> EntropyFloor() const override {
    const double uniform = std::log(static_cast<double>(language_.vocab_size()));
    const double h = language_.ConditionalEntropy();
    double total = 0.0, tokens = 0.0;
    for (int64_t len = config_.min_seq_len; len <= config_.seq_len; ++len) {
      const int64_t n_uniform = std::min(language_.order() - 1, len);
      total += n_uniform * uniform + (len - n_uniform) * h;
      tokens += len;
    }
    return total / tokens;
  }

  std::string Describe() const override {
    return fmt::format("synthetic order-{} Markov language, {} tokens, branching {}, zipf {}",
                       language_.order(), language_.vocab_size(), config_.synthetic.branching,
                       config_.synthetic.zipf);
  }

 private:
  Batch Make(int split, int64_t index) const {
    const int64_t B = config_.batch_size, T = config_.seq_len;
    at::Tensor inputs = at::zeros({B, T}, at::kLong);
    at::Tensor targets = at::full({B, T}, ignore_index_, at::kLong);
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* out = targets.data_ptr<int64_t>();
    uint64_t state = StreamState(config_.seed, split, index);
    std::vector<int64_t> sequence(T + 1);
    int64_t num_targets = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t span = config_.seq_len - config_.min_seq_len + 1;
      const int64_t len = config_.min_seq_len + static_cast<int64_t>(SplitMix64(state) % span);
      language_.Sample(state, len + 1, sequence.data());
      for (int64_t t = 0; t < len; ++t) {
        in[b * T + t] = sequence[t];
        out[b * T + t] = sequence[t + 1];
      }
      num_targets += len;
    }
    return {inputs, targets, num_targets};
  }

  DataConfig config_;
  SyntheticLanguage language_;
  int64_t ignore_index_;
};

class TextSource : public DataSource {
 public:
  TextSource(const DataConfig& c) : config_(c) {
    // Read whole into memory: only a regular file has an end (/dev/zero or a FIFO would be
    // read until memory runs out).
    std::error_code ec;
    if (std::filesystem::exists(c.path, ec) && !std::filesystem::is_regular_file(c.path, ec)) {
      throw std::runtime_error(fmt::format(
          "data.path: \"{}\" is not a regular file (a directory, device or pipe); expected a "
          "text file{}",
          c.path, RelativeTo(c.path)));
    }
    std::ifstream in(c.path, std::ios::binary);
    if (!in) {
      const int error = errno;
      throw std::runtime_error(fmt::format(
          "data.path: cannot read \"{}\"{}: {}{}", c.path, RelativeTo(c.path), std::strerror(error),
          c.path.find_first_of("*?[") != std::string::npos
              ? " (a glob of token shards is read with data.source: tokens; text reads one file)"
              : ""));
    }
    std::stringstream text;
    text << in.rdbuf();
    bytes_ = text.str();
    // An llm.c token shard (data.source tokens forgotten) or another binary file would train
    // on its bytes without a word: refused where it starts with a shard's magic number or where
    // more than 1% of its first MiB are NUL bytes (a stray NUL in a text is U+0000, kept).
    int32_t magic = 0;
    if (bytes_.size() >= 4) std::memcpy(&magic, bytes_.data(), 4);
    const bool shard = magic == kShardMagicU16 || magic == kShardMagicU32;
    const size_t head = std::min<size_t>(bytes_.size(), size_t{1} << 20);
    const auto nuls = static_cast<size_t>(std::count(bytes_.begin(), bytes_.begin() + head, '\0'));
    if (shard || nuls * 100 > head) {
      throw std::runtime_error(fmt::format(
          "data.path: \"{}\"{} is not text: {}; data.source text trains on a UTF-8 text "
          "file's bytes{}",
          c.path, RelativeTo(c.path),
          shard ? fmt::format("it starts with an llm.c token shard's magic number ({})", magic)
                : fmt::format("{} of its first {} bytes are NUL", nuls, head),
          shard ? "; set data.source: tokens to train on token shards" : ""));
    }
    const int64_t n = static_cast<int64_t>(bytes_.size());
    split_ = static_cast<int64_t>(std::llround(n * (1.0 - c.val_fraction)));
    const int64_t window = c.seq_len + 1;
    if (split_ < window || n - split_ < window) {
      throw std::runtime_error(fmt::format(
          "data.path: \"{}\" has {} bytes; with data.val_fraction {} each split needs at least "
          "data.seq_len + 1 = {} bytes (train {}, validation {})",
          c.path, n, c.val_fraction, window, split_, n - split_));
    }
  }

  Batch TrainBatch(int64_t index) const override { return Make(0, index, 0, split_); }
  Batch ValBatch(int64_t index, int64_t) const override {
    return Make(1, index, split_, static_cast<int64_t>(bytes_.size()));
  }
  std::optional<double> EntropyFloor() const override { return std::nullopt; }
  std::string Files() const override {
    return fmt::format(
        "train {} {}\n", config_.path,
        internal::SizeAndFingerprint(static_cast<int64_t>(bytes_.size()),
                                     reinterpret_cast<const unsigned char*>(bytes_.data()),
                                     static_cast<int64_t>(bytes_.size())));
  }
  std::string Describe() const override {
    return fmt::format("text \"{}\": {} bytes ({} train, {} validation)", config_.path,
                       bytes_.size(), split_, bytes_.size() - split_);
  }

 private:
  // B windows of seq_len + 1 bytes at random offsets inside [begin, end).
  Batch Make(int split, int64_t index, int64_t begin, int64_t end) const {
    const int64_t B = config_.batch_size, T = config_.seq_len;
    at::Tensor inputs = at::empty({B, T}, at::kLong);
    at::Tensor targets = at::empty({B, T}, at::kLong);
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* out = targets.data_ptr<int64_t>();
    uint64_t state = StreamState(config_.seed, split, index);
    const uint64_t offsets = static_cast<uint64_t>(end - begin - T);  // valid start positions
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = begin + static_cast<int64_t>(SplitMix64(state) % offsets);
      for (int64_t t = 0; t < T; ++t) {
        in[b * T + t] = static_cast<unsigned char>(bytes_[start + t]);
        out[b * T + t] = static_cast<unsigned char>(bytes_[start + t + 1]);
      }
    }
    return {inputs, targets, B * T};
  }

  DataConfig config_;
  std::string bytes_;
  int64_t split_;  // bytes before this are training data
};

}  // namespace

SyntheticLanguage::SyntheticLanguage(const SyntheticConfig& c, int64_t vocab_size, uint64_t seed)
    : order_(c.order), vocab_size_(vocab_size), seed_(seed) {
  // Successor() draws `branching` distinct tokens: with fewer, it would never return.
  if (c.branching > vocab_size) {
    throw std::invalid_argument(
        fmt::format("data.synthetic.branching: expected at most the {} real tokens, got {}",
                    vocab_size, c.branching));
  }
  double sum = 0.0;
  for (int64_t r = 1; r <= c.branching; ++r) {
    weights_.push_back(std::pow(static_cast<double>(r), -c.zipf));
    sum += weights_.back();
  }
  double acc = 0.0;
  for (double& w : weights_) {
    w /= sum;
    acc += w;
    cumulative_.push_back(acc);
  }
  cumulative_.back() = 1.0;
}

double SyntheticLanguage::ConditionalEntropy() const {
  double h = 0.0;
  // A successor whose weight underflowed to 0 (a large zipf) is never drawn: no entropy
  // (0 * log 0 would make the floor NaN).
  for (double w : weights_) h -= w > 0.0 ? w * std::log(w) : 0.0;
  return h;
}

// The rank-th distinct successor of the `order_` tokens at `context`: successors are drawn by
// hashing (seed, context, rank, attempt) and redrawn on collision with a lower rank. Cost
// O(branching^2) per token, trivial next to the model.
int64_t SyntheticLanguage::Successor(const int64_t* context, int64_t rank) const {
  uint64_t h = Mix(seed_, 0xC0FFEEULL);
  for (int64_t i = 0; i < order_; ++i) h = Mix(h, static_cast<uint64_t>(context[i]));
  int64_t chosen[64];
  const int64_t n = std::min<int64_t>(rank + 1, 64);
  int64_t r = 0;
  for (uint64_t attempt = 0; r < n; ++attempt) {
    const int64_t candidate = static_cast<int64_t>(Mix(h, attempt) % vocab_size_);
    if (std::find(chosen, chosen + r, candidate) == chosen + r) chosen[r++] = candidate;
  }
  return chosen[n - 1];
}

double SyntheticLanguage::LogProb(const int64_t* context, int64_t token) const {
  for (size_t r = 0; r < weights_.size(); ++r) {
    if (Successor(context, static_cast<int64_t>(r)) == token) return std::log(weights_[r]);
  }
  return -std::numeric_limits<double>::infinity();
}

void SyntheticLanguage::Sample(uint64_t& state, int64_t n, int64_t* tokens) const {
  for (int64_t t = 0; t < n; ++t) {
    if (t < order_) {
      tokens[t] = static_cast<int64_t>(SplitMix64(state) % vocab_size_);
      continue;
    }
    const double u = Uniform01(state);
    const int64_t rank =
        std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin();
    tokens[t] = Successor(tokens + t - order_, std::min<int64_t>(rank, weights_.size() - 1));
  }
}

std::unique_ptr<DataSource> MakeDataSource(const DataConfig& config, int64_t vocab_size,
                                           int64_t ignore_index) {
  if (config.source == "text") return std::make_unique<TextSource>(config);
  if (config.source == "tokens") return MakeTokenShardSource(config, vocab_size);
  return std::make_unique<SyntheticSource>(config, vocab_size, ignore_index);
}

}  // namespace distill

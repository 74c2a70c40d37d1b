// data.source "tokens": llm.c token shards, memory-mapped, as a DataSource.
//
// The format, verified against karpathy/llm.c dev/data/data_common.py (write_datafile and its
// HEADERS_INFO table): a header of 256 int32 (np.int32, little-endian on every platform llm.c
// targets) holding [0] magic, [1] version, [2] len(toks), then the tokens as np.uint16 for
// "gpt-2" (magic 20240520, version 1) or np.uint32 for "llama-3" (magic 20240801, version 7).
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "data_internal.h"
#include "distill/file_io.h"
#include "distill/token_shards.h"

namespace distill {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "llm.c shards are little-endian; TokenShard maps them as host integers");

namespace {

std::runtime_error ShardError(const std::string& path, const std::string& what) {
  return std::runtime_error(fmt::format("{}: {}", path, what));
}

std::string Errno() { return std::strerror(errno); }

const char* TokenTypeName(int64_t token_bytes) { return token_bytes == 2 ? "uint16" : "uint32"; }

int32_t ReadLe32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 |
                              static_cast<uint32_t>(p[3]) << 24);
}

void AppendLe(std::vector<unsigned char>& out, uint32_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

// "1.2M", "120k", "999".
std::string HumanCount(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.1f}B", n / 1e9);
  if (n >= 1000000) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}k", n / 1e3);
  return std::to_string(n);
}

// The first directory glob(3) could not read for a reason other than its absence (a directory
// without read or search permission, a symbolic-link loop), and why: glob skips it, so a pattern
// that matched nothing says why rather than "no file matches".
thread_local std::string glob_unreadable;
thread_local int glob_errno = 0;

int OnGlobError(const char* path, int error) {
  if (glob_errno == 0 && error != ENOENT && error != ENOTDIR) {
    glob_unreadable = path;
    glob_errno = error;
  }
  return 0;  // go on: a match elsewhere still counts
}

// The files matching `pattern`, sorted bytewise (glob(3) sorts by the locale's collation).
std::vector<std::string> Glob(const std::string& key, const std::string& pattern) {
  glob_t g{};
  glob_errno = 0;
  const int rc = glob(pattern.c_str(), 0, OnGlobError, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    // A pattern without wildcards is checked with lstat, which reports nothing to OnGlobError.
    struct stat st {};
    if (glob_errno == 0 && pattern.find_first_of("*?[") == std::string::npos &&
        ::lstat(pattern.c_str(), &st) != 0 && errno != ENOENT && errno != ENOTDIR) {
      glob_unreadable = pattern;
      glob_errno = errno;
    }
    if (glob_errno != 0) {
      // The cause where the pattern names that directory before its first wildcard (every match
      // would lie under it); elsewhere (a directory a wildcard reached) a possible one.
      // ("*.bin" is matched in ".", as glob names it.)
      const std::string literal = GlobDirectories(pattern);
      const std::string& dir = glob_unreadable;
      const bool named = literal.rfind(dir, 0) == 0 &&
                         (literal.size() == dir.size() || literal[dir.size()] == '/');
      const std::string why =
          named ? fmt::format(": cannot read \"{}\" ({})", dir, std::strerror(glob_errno))
                : fmt::format(" (a directory it could match in cannot be read: \"{}\", {})", dir,
                              std::strerror(glob_errno));
      throw std::runtime_error(
          fmt::format("{}: no file matches \"{}\"{}{}", key, pattern, why, RelativeTo(pattern)));
    }
    throw std::runtime_error(
        fmt::format("{}: no file matches \"{}\"{}", key, pattern, RelativeTo(pattern)));
  }
  if (rc != 0) {
    throw std::runtime_error(fmt::format("{}: cannot expand \"{}\" (glob error {}{})", key, pattern,
                                         rc, rc == GLOB_ABORTED ? ": read error" : ""));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Whether two paths name one file (links and spellings such as "./a" included).
bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Tokens [begin, end) of one shard.
struct Segment {
  size_t shard;
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};

// A split: segments, and the cumulative number of windows (starts) of each, for lookups.
struct Region {
  std::vector<Segment> segments;
  std::vector<int64_t> cumulative;  // windows in segments[0..i]
  int64_t tokens = 0;
  int64_t longest = 0;  // tokens of the longest segment
  size_t files = 0;
  // The files (and their tokens) too short for one window: counted above, never read.
  size_t short_files = 0;
  int64_t short_tokens = 0;

  // " (N of them, T tokens, shorter than one sequence ...: never read)", or "" where none is.
  std::string Unread(int64_t seq_len) const {
    if (short_files == 0) return "";
    return fmt::format(
        " ({} of them, {} tokens, shorter than one sequence of data.seq_len + 1 = "
        "{} tokens: never read)",
        short_files, HumanCount(short_tokens), seq_len + 1);
  }

  int64_t windows() const { return cumulative.empty() ? 0 : cumulative.back(); }
  // The segment holding window w (0 <= w < windows()) and w's rank inside it.
  std::pair<const Segment*, int64_t> Find(int64_t w) const {
    const size_t i = std::upper_bound(cumulative.begin(), cumulative.end(), w) - cumulative.begin();
    return {&segments[i], w - (i == 0 ? 0 : cumulative[i - 1])};
  }
};

class TokenShardSource : public DataSource {
 public:
  TokenShardSource(const DataConfig& c, int64_t vocab_size) : config_(c), vocab_size_(vocab_size) {
    if (vocab_size <= 0) {
      throw std::runtime_error(
          fmt::format("data.source tokens: vocabulary size {} <= 0", vocab_size));
    }
    const int64_t T = c.seq_len;
    const std::vector<std::string> train_paths = Glob("data.path", c.path);
    for (const std::string& p : train_paths) AddShard("data.path", p);
    const size_t num_train = shards_.size();
    num_train_ = num_train;
    if (!c.val_path.empty()) {
      for (const std::string& p : Glob("data.val_path", c.val_path)) {
        // A validation shard that data.path matches too would be trained on.
        for (const std::string& t : train_paths) {
          if (SameFile(p, t)) {
            throw std::runtime_error(fmt::format(
                "data.val_path: {} is also a training shard (data.path \"{}\" matches {}); "
                "narrow data.path so that it leaves the validation shards out, or point "
                "data.val_path at other shards (e.g. data.path \"train_*.bin\", data.val_path "
                "\"val_*.bin\")",
                p, c.path, t));
          }
        }
        AddShard("data.val_path", p);
        // A copy of a training shard (another file with the same tokens) would be evaluated on
        // what the model trains on, as above. Only shards of the same size are compared, each
        // until its first different byte.
        for (size_t t = 0; t < num_train; ++t) {
          if (shards_.back()->num_tokens() > 0 && shards_.back()->SameTokens(*shards_[t])) {
            throw std::runtime_error(fmt::format(
                "data.val_path: {} holds the same {} tokens as the training shard {} (a copy?); "
                "validation on training data measures nothing: give data.val_path shards the "
                "training glob does not hold",
                p, shards_.back()->num_tokens(), shards_[t]->path()));
          }
        }
      }
    }

    // Training: whole shards, less the held-out tail of the stream when val_path is empty.
    int64_t stream = 0;
    for (size_t s = 0; s < num_train; ++s) stream += shards_[s]->num_tokens();
    const int64_t held_out =
        c.val_path.empty() ? static_cast<int64_t>(std::llround(stream * c.val_fraction)) : 0;
    int64_t train_left = stream - held_out;
    for (size_t s = 0; s < num_train; ++s) {
      const int64_t n = shards_[s]->num_tokens();
      const int64_t cut = std::min(n, train_left);
      train_left -= cut;
      if (cut > 0) Add(train_, {s, 0, cut}, TrainWindows(cut, T));
      if (n == 0) ++train_.files;  // an empty shard is still a file the glob matched
      if (cut < n && c.val_path.empty()) Add(val_, {s, cut, n}, ValWindows(n - cut, T));
    }
    for (size_t s = num_train; s < shards_.size(); ++s) {
      Add(val_, {s, 0, shards_[s]->num_tokens()}, ValWindows(shards_[s]->num_tokens(), T));
    }
    // Every token below the vocabulary, checked now: before any training, and before --fresh
    // deletes the previous run (a bad token found by a batch would stop the run mid-way).
    CheckTokens();
    int64_t longest_shard = 0;
    for (size_t s = 0; s < num_train; ++s) {
      longest_shard = std::max(longest_shard, shards_[s]->num_tokens());
    }
    if (train_.windows() == 0 && held_out > 0 && longest_shard >= T + 1) {
      // The shards hold a sequence; the held-out tail took it.
      throw std::runtime_error(fmt::format(
          "data.val_fraction: {} holds out {} of the {} tokens of \"{}\", leaving {} for training "
          "(the longest run in one shard {}); one sequence needs data.seq_len + 1 = {} tokens: "
          "lower data.val_fraction, or give validation shards of their own in data.val_path",
          c.val_fraction, held_out, stream, c.path, stream - held_out, train_.longest, T + 1));
    }
    CheckSplit(train_, "data.path", fmt::format("training shards \"{}\"", c.path));
    if (c.val_path.empty()) {
      CheckSplit(val_, "data.val_fraction",
                 fmt::format("validation (the last {} of \"{}\")", c.val_fraction, c.path));
    } else {
      CheckSplit(val_, "data.val_path", fmt::format("validation shards \"{}\"", c.val_path));
    }
    // Once: the files are mapped for the run's whole length (every checkpoint records this).
    for (size_t s = 0; s < shards_.size(); ++s) {
      const TokenShard& shard = *shards_[s];
      files_ += fmt::format("{} {} {}\n", s < num_train_ ? "train" : "val", shard.path(),
                            internal::SizeAndFingerprint(shard.num_tokens(), shard.token_data(),
                                                         shard.num_tokens() * shard.token_bytes()));
    }
  }

  Batch TrainBatch(int64_t index) const override {
    uint64_t state = internal::StreamState(config_.seed, 0, index);
    const uint64_t starts = static_cast<uint64_t>(train_.windows());
    std::vector<std::pair<const Segment*, int64_t>> windows;
    for (int64_t b = 0; b < config_.batch_size; ++b) {
      auto [segment, start] = train_.Find(static_cast<int64_t>(SplitMix64(state) % starts));
      windows.push_back({segment, segment->begin + start});
    }
    return Make(windows);
  }

  // The evaluation's n = count * B sequences, i = index * B + b: spread evenly over the W windows
  // when they fit (sequence i reads window floor(i * W / n): a set in document order is measured
  // across its whole length, not by its first n windows), else each window in order and then
  // again (i mod W: the repeat warned about at the start).
  Batch ValBatch(int64_t index, int64_t count) const override {
    const int64_t W = val_.windows(), B = config_.batch_size;
    if (count < 1 || count > (int64_t{1} << 32) || index < 0 || index >= count)
      throw std::runtime_error(
          fmt::format("ValBatch: index {} is not in [0, count = {}), or count is not in [1, 2^32]",
                      index, count));
    // 128-bit products: i < n <= 2^32 * B (B <= 2^20, the schema's bound) and W < 2^63.
    const unsigned __int128 n = static_cast<unsigned __int128>(count) * B;
    std::vector<std::pair<const Segment*, int64_t>> windows;
    for (int64_t b = 0; b < B; ++b) {
      const unsigned __int128 i = static_cast<unsigned __int128>(index) * B + b;
      const int64_t w = n <= static_cast<unsigned __int128>(W)
                            ? static_cast<int64_t>(i * W / n)
                            : static_cast<int64_t>(i % static_cast<unsigned __int128>(W));
      auto [segment, rank] = val_.Find(w);
      windows.push_back({segment, segment->begin + rank * config_.seq_len});
    }
    return Make(windows);
  }

  std::optional<double> EntropyFloor() const override { return std::nullopt; }
  std::optional<int64_t> ValidationSequences() const override { return val_.windows(); }

  std::string Files() const override { return files_; }

  std::string Describe() const override {
    const std::string val = config_.val_path.empty()
                                ? fmt::format("validation the last {:g}% of them ({} tokens){}",
                                              100 * config_.val_fraction, HumanCount(val_.tokens),
                                              val_.Unread(config_.seq_len))
                                : fmt::format("validation {} file{} ({} tokens){}", val_.files,
                                              val_.files == 1 ? "" : "s", HumanCount(val_.tokens),
                                              val_.Unread(config_.seq_len));
    // The files data.path matched, also one that lies wholly in the held-out tail.
    return fmt::format("llm.c token shards: {} train file{} ({} tokens){}, {}, {}", num_train_,
                       num_train_ == 1 ? "" : "s", HumanCount(train_.tokens),
                       train_.Unread(config_.seq_len), val,
                       TokenTypeName(shards_.front()->token_bytes()));
  }

 private:
  // Every shard has the same token width: a mix means shards from different tokenizers. A shard
  // that cannot be read is reported at `key`, the glob that matched it.
  void AddShard(const char* key, const std::string& path) {
    try {
      AddShard(path);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("{}: {}", key, e.what()));
    }
  }
  void AddShard(const std::string& path) {
    shards_.push_back(std::make_unique<TokenShard>(path));
    const TokenShard& first = *shards_.front();
    if (shards_.back()->token_bytes() != first.token_bytes()) {
      throw ShardError(path, fmt::format("{} tokens, but {} has {} tokens (mixed tokenizers?)",
                                         TokenTypeName(shards_.back()->token_bytes()), first.path(),
                                         TokenTypeName(first.token_bytes())));
    }
    // 16-bit tokens cannot hold a larger vocabulary's ids: shards of another tokenizer, or ids
    // cut to 16 bits (every one of them would pass the vocabulary check).
    if (first.token_bytes() == 2 && vocab_size_ > 65536) {
      throw ShardError(path, fmt::format("uint16 tokens, which cannot hold the ids of a "
                                         "vocabulary of {} (above 65536): shards of this "
                                         "tokenizer are uint32 (scripts/tokenize_shards.py "
                                         "writes them); were these made with another "
                                         "tokenizer, or its ids cut to 16 bits?",
                                         vocab_size_));
    }
  }

  // Every shard in chunks of 2^22 tokens, all chunks of all shards in parallel; the first bad
  // token (in shard order) is reported. Shards this process checked already against this
  // vocabulary, unchanged since (path, inode, size, modification time), are skipped.
  void CheckTokens() const {
    constexpr int64_t kChunk = int64_t{1} << 22;
    const auto limit =
        static_cast<uint32_t>(std::min<int64_t>(vocab_size_, std::numeric_limits<uint32_t>::max()));
    std::vector<std::string> keys(shards_.size());
    std::vector<std::pair<size_t, int64_t>> chunks;  // (shard, first token)
    {
      const std::lock_guard<std::mutex> guard(checked_mutex());
      for (size_t s = 0; s < shards_.size(); ++s) {
        keys[s] = CheckedKey(*shards_[s]);
        if (!keys[s].empty() && checked().count(keys[s]) > 0) continue;
        for (int64_t b = 0; b < shards_[s]->num_tokens(); b += kChunk) chunks.push_back({s, b});
      }
    }
    std::vector<int64_t> first(chunks.size(), -1);
    at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const auto [s, b] = chunks[static_cast<size_t>(c)];
        const TokenShard& shard = *shards_[s];
        first[static_cast<size_t>(c)] =
            shard.FirstTokenAtLeast(limit, b, std::min(shard.num_tokens(), b + kChunk));
      }
    });
    for (size_t c = 0; c < chunks.size(); ++c) {  // shard order, then position
      if (first[c] >= 0) {
        const TokenShard& shard = *shards_[chunks[c].first];
        throw BadToken(chunks[c].first, first[c], shard.Token(first[c]));
      }
    }
    const std::lock_guard<std::mutex> guard(checked_mutex());
    for (const std::string& key : keys)
      if (!key.empty()) checked().insert(key);
  }

  // What identifies a shard's bytes and the vocabulary they were checked against ("" when the
  // file cannot be stat'ed: checked every time).
  std::string CheckedKey(const TokenShard& shard) const {
    struct stat st {};
    if (::stat(shard.path().c_str(), &st) != 0) return "";
    return fmt::format("{}:{}:{}:{}:{}:{}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec,
                       st.st_mtim.tv_nsec, vocab_size_);
  }
  static std::mutex& checked_mutex() {
    static std::mutex m;
    return m;
  }
  static std::set<std::string>& checked() {
    static std::set<std::string> keys;
    return keys;
  }

  // Named with its key: shards [0, num_train_) are data.path's, the rest data.val_path's.
  std::runtime_error BadToken(size_t shard, int64_t index, uint32_t token) const {
    return std::runtime_error(fmt::format(
        "{}: {}: the token at position {} is {}, not below the vocabulary size {}: tokenized with "
        "a different tokenizer?",
        shard < num_train_ ? "data.path" : "data.val_path", shards_[shard]->path(), index, token,
        vocab_size_));
  }

  // Windows of T + 1 tokens in a segment of n: any start for training; for validation the
  // windows are laid end to end with stride T (as llm.c's loader), so each token of the segment
  // but the first is a target exactly once.
  static int64_t TrainWindows(int64_t n, int64_t T) { return std::max<int64_t>(n - T, 0); }
  static int64_t ValWindows(int64_t n, int64_t T) { return n > T ? (n - 1) / T : 0; }

  static void Add(Region& region, Segment segment, int64_t windows) {
    ++region.files;  // a shard gives a region at most one segment
    region.tokens += segment.size();
    region.longest = std::max(region.longest, segment.size());
    if (windows == 0) {
      if (segment.size() > 0) {  // (a shard wholly in the held-out tail is no training file's)
        ++region.short_files;
        region.short_tokens += segment.size();
      }
      return;
    }
    region.segments.push_back(segment);
    region.cumulative.push_back(region.windows() + windows);
  }

  // A split needs one sequence of seq_len + 1 tokens inside one shard.
  void CheckSplit(const Region& region, const char* key, const std::string& what) const {
    if (region.windows() > 0) return;
    throw std::runtime_error(fmt::format(
        "{}: {}: {} tokens in {} file{}, the longest run in one shard {}; one sequence needs "
        "data.seq_len + 1 = {} tokens",
        key, what, region.tokens, region.files, region.files == 1 ? "" : "s", region.longest,
        config_.seq_len + 1));
  }

  // inputs = window[0, T), targets = window[1, T]; every token checked against the vocabulary.
  Batch Make(const std::vector<std::pair<const Segment*, int64_t>>& windows) const {
    const int64_t B = config_.batch_size, T = config_.seq_len;
    at::Tensor inputs = at::empty({B, T}, at::kLong);
    at::Tensor targets = at::empty({B, T}, at::kLong);
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* out = targets.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      const size_t shard_index = windows[b].first->shard;
      const TokenShard& shard = *shards_[shard_index];
      const int64_t start = windows[b].second;
      for (int64_t t = 0; t <= T; ++t) {
        const uint32_t token = shard.Token(start + t);
        // (Checked at start-up; a shard overwritten in place since, through the mapping, is
        // caught here. One replaced by a rename is not seen: the mapping keeps the old file.)
        if (token >= static_cast<uint64_t>(vocab_size_))
          throw BadToken(shard_index, start + t, token);
        if (t < T) in[b * T + t] = token;
        if (t > 0) out[b * T + t - 1] = token;
      }
    }
    return {inputs, targets, B * T};
  }

  DataConfig config_;
  int64_t vocab_size_;
  std::vector<std::unique_ptr<TokenShard>> shards_;  // training shards, then validation shards
  size_t num_train_ = 0;                             // how many of shards_ are training shards
  std::string files_;                                // Files(), made once
  Region train_, val_;
};

}  // namespace

TokenShard::TokenShard(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ShardError(path, "cannot open: " + Errno());
  const ScopedFd closer(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0) throw ShardError(path, "cannot stat: " + Errno());
  if (!S_ISREG(st.st_mode)) {
    throw ShardError(path, fmt::format("not a regular file ({}); expected an llm.c token shard, "
                                       "named by a glob such as \"data/train_*.bin\"",
                                       S_ISDIR(st.st_mode) ? "a directory" : "a device or pipe"));
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    throw ShardError(path, fmt::format("{} bytes, shorter than the {}-byte header of an llm.c "
                                       "token shard",
                                       file_bytes, kShardHeaderBytes));
  }
  unsigned char header[kShardHeaderBytes];
  int64_t got = 0;
  while (got < kShardHeaderBytes) {
    const ssize_t n = pread(fd, header + got, kShardHeaderBytes - got, got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw ShardError(path, "cannot read the header: " + (n < 0 ? Errno() : "EOF"));
    got += n;
  }
  const int32_t magic = ReadLe32(header), version = ReadLe32(header + 4);
  const int64_t count = ReadLe32(header + 8);
  int32_t expected_version = 0;
  if (magic == kShardMagicU16) {
    token_bytes_ = 2;
    expected_version = kShardVersionU16;
  } else if (magic == kShardMagicU32) {
    token_bytes_ = 4;
    expected_version = kShardVersionU32;
  } else {
    throw ShardError(path, fmt::format("not an llm.c token shard: magic {} (expected {} for "
                                       "uint16 or {} for uint32 tokens; scripts/tokenize_shards.py "
                                       "makes shards from text: docs/hf.md)",
                                       magic, kShardMagicU16, kShardMagicU32));
  }
  if (version != expected_version) {
    throw ShardError(path,
                     fmt::format("magic {} ({} tokens) goes with version {}, got version {}", magic,
                                 TokenTypeName(token_bytes_), expected_version, version));
  }
  if (count < 0)
    throw ShardError(path, fmt::format("negative token count {} in the header", count));
  const int64_t expected_bytes = kShardHeaderBytes + count * token_bytes_;
  if (file_bytes != expected_bytes) {
    throw ShardError(
        path, fmt::format("expected {} bytes for {} {} tokens (header), got {}", expected_bytes,
                          count, TokenTypeName(token_bytes_), file_bytes));
  }
  void* map = mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) throw ShardError(path, "cannot mmap: " + Errno());
  map_ = map;
  map_bytes_ = file_bytes;
  num_tokens_ = count;
  tokens_ = static_cast<const unsigned char*>(map) + kShardHeaderBytes;
}

bool TokenShard::SameTokens(const TokenShard& other) const {
  return num_tokens_ == other.num_tokens_ && token_bytes_ == other.token_bytes_ &&
         (num_tokens_ == 0 || std::memcmp(tokens_, other.tokens_,
                                          static_cast<size_t>(num_tokens_ * token_bytes_)) == 0);
}

int64_t TokenShard::FirstTokenAtLeast(uint32_t limit, int64_t begin, int64_t end) const {
  const auto scan = [&](const auto* tokens) -> int64_t {
    uint32_t m = 0;
    for (int64_t i = begin; i < end; ++i) m = std::max<uint32_t>(m, tokens[i]);  // vectorised
    if (m < limit) return -1;
    for (int64_t i = begin; i < end; ++i)
      if (tokens[i] >= limit) return i;
    return -1;
  };
  return token_bytes_ == 2 ? scan(reinterpret_cast<const uint16_t*>(tokens_))
                           : scan(reinterpret_cast<const uint32_t*>(tokens_));
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) munmap(map_, static_cast<size_t>(map_bytes_));
}

std::unique_ptr<DataSource> MakeTokenShardSource(const DataConfig& config, int64_t vocab_size) {
  return std::make_unique<TokenShardSource>(config, vocab_size);
}

void WriteTokenShard(const std::string& path, const std::vector<uint32_t>& tokens,
                     bool uint32_tokens) {
  const int bytes = uint32_tokens ? 4 : 2;
  if (tokens.size() >= (1ULL << 31)) {
    throw ShardError(path,
                     fmt::format("{} tokens; an llm.c shard holds fewer than 2^31", tokens.size()));
  }
  std::vector<unsigned char> data;
  data.reserve(kShardHeaderBytes + tokens.size() * bytes);
  AppendLe(data, static_cast<uint32_t>(uint32_tokens ? kShardMagicU32 : kShardMagicU16), 4);
  AppendLe(data, static_cast<uint32_t>(uint32_tokens ? kShardVersionU32 : kShardVersionU16), 4);
  AppendLe(data, static_cast<uint32_t>(tokens.size()), 4);
  data.resize(kShardHeaderBytes, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!uint32_tokens && tokens[i] > 0xFFFF) {
      throw ShardError(
          path, fmt::format("the token at position {} is {}, too large for a uint16 shard", i,
                            tokens[i]));
    }
    AppendLe(data, tokens[i], bytes);
  }
  WriteFileAtomically(path, reinterpret_cast<const char*>(data.data()), data.size(),
                      fmt::format("{}.tmp.{}", path, getpid()));
}

}  // namespace distill

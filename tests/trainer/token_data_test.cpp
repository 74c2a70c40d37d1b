// data.source "tokens": llm.c shards read back exactly, batches are windows inside one shard and
// outside validation, deterministic; every malformed file or config is refused, naming it.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "distill/data.h"
#include "distill/token_shards.h"
#include "test_util.h"

namespace distill {
namespace {

using ::testing::HasSubstr;

// A fresh, empty directory for the running test.
std::string TempDir() {
  const std::string dir = testing::TempRunDir();
  std::filesystem::create_directories(dir);
  return dir;
}

// Shard k holds base + k * stride + i at position i: a token names its shard and position.
struct Layout {
  bool uint32_tokens;
  uint32_t base, stride;
  std::vector<int64_t> sizes;
};

std::vector<uint32_t> ShardTokens(const Layout& l, size_t k) {
  std::vector<uint32_t> tokens(l.sizes[k]);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = l.base + k * l.stride + i;
  return tokens;
}

void WriteShards(const std::string& dir, const std::string& prefix, const Layout& l) {
  for (size_t k = 0; k < l.sizes.size(); ++k) {
    WriteTokenShard(dir + "/" + prefix + "_00000" + std::to_string(k) + ".bin", ShardTokens(l, k),
                    l.uint32_tokens);
  }
}

std::vector<unsigned char> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteBytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void PutLe32(std::vector<unsigned char>& bytes, size_t offset, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<unsigned char>(value >> (8 * i));
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

DataConfig TokensConfig(const std::string& path, const std::string& val_path = "") {
  DataConfig c;
  c.source = "tokens";
  c.path = path;
  c.val_path = val_path;
  c.val_fraction = 0.2;
  c.batch_size = 5;
  c.seq_len = 16;
  c.seed = 7;
  return c;
}

TEST(TokenDataTest, ShardsReadBackExactly) {
  const std::string dir = TempDir();
  for (bool wide : {false, true}) {
    const std::vector<uint32_t> tokens =
        wide ? std::vector<uint32_t>{0, 1, 65535, 65536, 4000000000u, 7}
             : std::vector<uint32_t>{0, 1, 65535, 300, 7};
    const std::string path = dir + (wide ? "/wide.bin" : "/narrow.bin");
    WriteTokenShard(path, tokens, wide);
    EXPECT_EQ(std::filesystem::file_size(path), 1024 + tokens.size() * (wide ? 4 : 2));
    const std::vector<unsigned char> bytes = ReadBytes(path);
    EXPECT_EQ(bytes[0] | bytes[1] << 8 | bytes[2] << 16 | bytes[3] << 24,
              wide ? 20240801 : 20240520);
    EXPECT_EQ(bytes[4], wide ? 7 : 1);
    EXPECT_EQ(bytes[8], tokens.size());
    const TokenShard shard(path);
    EXPECT_EQ(shard.token_bytes(), wide ? 4 : 2);
    ASSERT_EQ(shard.num_tokens(), static_cast<int64_t>(tokens.size()));
    for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard.Token(i), tokens[i]) << i;
  }
  // An empty shard is valid: header only.
  WriteTokenShard(dir + "/empty.bin", {}, false);
  EXPECT_EQ(TokenShard(dir + "/empty.bin").num_tokens(), 0);
  EXPECT_THAT(ErrorOf([&] {
                WriteTokenShard(dir + "/bad.bin", {1, 70000}, false);
              }),
              HasSubstr("bad.bin: the token at position 1 is 70000, too large for a uint16 shard"));
  // A FIFO (no writer) is refused at once, not waited on.
  ASSERT_EQ(::mkfifo((dir + "/fifo.bin").c_str(), 0600), 0);
  EXPECT_THAT(ErrorOf([&] { TokenShard shard(dir + "/fifo.bin"); }),
              HasSubstr("fifo.bin: not a regular file (a device or pipe)"));
}

// Every training row is a window of seq_len + 1 consecutive tokens of one shard, before the
// held-out tail (the last val_fraction of the stream); validation is that tail, end to end.
void CheckWindows(const Layout& l) {
  const std::string dir = TempDir();
  WriteShards(dir, "train", l);
  const DataConfig c = TokensConfig(dir + "/train_*.bin");
  const int64_t vocab = l.base + l.sizes.size() * l.stride;
  const auto source = MakeTokenShardSource(c, vocab);
  const int64_t B = c.batch_size, T = c.seq_len;

  // Training tokens per shard: whole shards until the held-out tail.
  int64_t total = 0;
  for (int64_t n : l.sizes) total += n;
  int64_t left = total - static_cast<int64_t>(std::llround(total * c.val_fraction));
  std::vector<int64_t> train_end;
  for (int64_t n : l.sizes) {
    train_end.push_back(std::min(n, left));
    left -= train_end.back();
  }

  std::set<int64_t> shards_seen;
  for (int64_t index = 0; index < 50; ++index) {
    const Batch batch = source->TrainBatch(index);
    ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{B, T}));
    ASSERT_EQ(batch.targets.sizes(), (std::vector<int64_t>{B, T}));
    EXPECT_EQ(batch.inputs.scalar_type(), at::kLong);
    EXPECT_EQ(batch.num_targets, B * T);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t first = batch.inputs[b][0].item<int64_t>() - l.base;
      const int64_t k = first / l.stride, start = first % l.stride;
      ASSERT_LT(k, static_cast<int64_t>(l.sizes.size()));
      EXPECT_LE(start + T + 1, train_end[k]) << "shard " << k << " start " << start;
      shards_seen.insert(k);
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(batch.inputs[b][t].item<int64_t>(), l.base + k * l.stride + start + t);
        ASSERT_EQ(batch.targets[b][t].item<int64_t>(), l.base + k * l.stride + start + t + 1);
      }
    }
  }
  EXPECT_EQ(shards_seen.size(), l.sizes.size());  // 250 draws reach every shard

  // Validation: the held-out tail is the end of the last shard here; window w starts at w * T.
  // An evaluation of `count` batches spreads its n = count * B sequences over the W windows
  // (sequence i reads window i * W / n) when n <= W, else takes them in order and repeats them.
  const size_t last = l.sizes.size() - 1;
  ASSERT_LT(train_end[last], l.sizes[last]);
  const int64_t held = l.sizes[last] - train_end[last], windows = (held - 1) / T;
  ASSERT_EQ(windows, 19);  // 20% of 1578 tokens: 316 held out
  ASSERT_EQ(source->ValidationSequences(), windows);
  for (int64_t count : {1, 3, 4}) {  // n = 5, 15 (spread) and 20 (one window read twice)
    const int64_t n = count * B;
    for (int64_t index = 0; index < count; ++index) {
      const Batch batch = source->ValBatch(index, count);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t i = index * B + b, w = n <= windows ? i * windows / n : i % windows;
        const int64_t start = train_end[last] + w * T;
        for (int64_t t = 0; t < T; ++t) {
          ASSERT_EQ(batch.inputs[b][t].item<int64_t>(), l.base + last * l.stride + start + t)
              << "count " << count << " index " << index << " b " << b;
          ASSERT_EQ(batch.targets[b][t].item<int64_t>(), l.base + last * l.stride + start + t + 1);
        }
      }
    }
  }
  // The last sequence of a spread evaluation lies in the last fifth of the set, not after the
  // first n windows.
  EXPECT_EQ(source->ValBatch(2, 3).inputs[B - 1][0].item<int64_t>(),
            l.base + last * l.stride + train_end[last] + 17 * T);
  EXPECT_THAT(ErrorOf([&] { source->ValBatch(3, 3); }),
              HasSubstr("index 3 is not in [0, count = 3)"));
  EXPECT_EQ(source->Describe(),
            std::string("llm.c token shards: 3 train files (1.3k tokens), validation the last 20% "
                        "of them (316 tokens), ") +
                (l.uint32_tokens ? "uint32" : "uint16"));
  EXPECT_FALSE(source->EntropyFloor().has_value());
}

// A shard that lies wholly in the held-out tail is still one of the files data.path matched.
TEST(TokenDataTest, DescribeCountsAShardWhollyInTheHeldOutTail) {
  const std::string dir = TempDir();
  const Layout l{false, 100, 1000, {500, 301, 100}};  // 901 tokens: the last 180 held out
  WriteShards(dir, "train", l);
  const auto source = MakeTokenShardSource(TokensConfig(dir + "/train_*.bin"), 3100);
  EXPECT_EQ(source->Describe(),
            "llm.c token shards: 3 train files (721 tokens), validation the last 20% of them (180 "
            "tokens), uint16");
}

// Shards too short for one sequence (data.seq_len + 1 tokens) are never read: the description
// says how many and how many tokens, where it counted them with the rest before.
TEST(TokenDataTest, DescribeNamesShardsTooShortForOneSequence) {
  const std::string dir = TempDir();
  const Layout l{false, 100, 1000, {10, 12, 200}};  // seq_len 16: the first two are too short
  WriteShards(dir, "train", l);
  DataConfig c = TokensConfig(dir + "/train_*.bin", dir + "/val_*.bin");
  WriteShards(dir, "val", {false, 100, 1000, {40, 5}});
  const auto source = MakeTokenShardSource(c, 3100);
  EXPECT_EQ(source->Describe(),
            "llm.c token shards: 3 train files (222 tokens) (2 of them, 22 tokens, shorter than "
            "one sequence of data.seq_len + 1 = 17 tokens: never read), validation 2 files (45 "
            "tokens) (1 of them, 5 tokens, shorter than one sequence of data.seq_len + 1 = 17 "
            "tokens: never read), uint16");
}

TEST(TokenDataTest, Uint16TrainWindowsLieInOneShardBeforeTheHeldOutTail) {
  CheckWindows({false, 100, 1000, {500, 301, 777}});
}

TEST(TokenDataTest, Uint32TrainWindowsLieInOneShardBeforeTheHeldOutTail) {
  CheckWindows({true, 70000, 100000, {500, 301, 777}});
}

TEST(TokenDataTest, HeldOutTailMaySpanShards) {
  // 40% of 300 tokens: the tail is the last 100 tokens of shard 1 and all of shard 2 (20).
  const std::string dir = TempDir();
  WriteShards(dir, "train", {false, 0, 1000, {100, 180, 20}});
  DataConfig c = TokensConfig(dir + "/*.bin");
  c.val_fraction = 0.4;
  const auto source = MakeTokenShardSource(c, 5000);
  for (int64_t index = 0; index < 30; ++index) {
    const Batch batch = source->TrainBatch(index);
    for (int64_t b = 0; b < c.batch_size; ++b) {
      const int64_t first = batch.inputs[b][0].item<int64_t>();
      EXPECT_TRUE(first + c.seq_len < 100 || (first >= 1000 && first + c.seq_len < 1080)) << first;
    }
  }
  // Shard 2 (20 tokens) holds one validation window; shard 1's tail (100 tokens) six.
  std::set<int64_t> val_starts;
  for (int64_t index = 0; index < 7; ++index) {
    const Batch batch = source->ValBatch(index, 7);
    for (int64_t b = 0; b < c.batch_size; ++b) {
      val_starts.insert(batch.inputs[b][0].item<int64_t>());
    }
  }
  EXPECT_EQ(val_starts, (std::set<int64_t>{1080, 1096, 1112, 1128, 1144, 1160, 2000}));
  EXPECT_THAT(source->Describe(), HasSubstr("validation the last 40% of them (120 tokens)"));
}

TEST(TokenDataTest, BatchesAreDeterministicAndDistinct) {
  const std::string dir = TempDir();
  WriteShards(dir, "train", {false, 0, 1000, {900}});
  WriteShards(dir, "val", {false, 0, 1000, {200}});
  const DataConfig c = TokensConfig(dir + "/train_*.bin", dir + "/val_*.bin");
  const auto a = MakeTokenShardSource(c, 1000);
  const auto b = MakeTokenShardSource(c, 1000);
  EXPECT_TRUE(at::equal(a->TrainBatch(3).inputs, b->TrainBatch(3).inputs));
  EXPECT_TRUE(at::equal(a->TrainBatch(3).targets, b->TrainBatch(3).targets));
  EXPECT_FALSE(at::equal(a->TrainBatch(3).inputs, a->TrainBatch(4).inputs));
  EXPECT_TRUE(at::equal(a->ValBatch(2, 3).inputs, b->ValBatch(2, 3).inputs));
  DataConfig other = c;
  other.seed += 1;
  EXPECT_FALSE(
      at::equal(a->TrainBatch(3).inputs, MakeTokenShardSource(other, 1000)->TrainBatch(3).inputs));
  // The validation set does not depend on the seed.
  EXPECT_TRUE(at::equal(a->ValBatch(1, 3).inputs,
                        MakeTokenShardSource(other, 1000)->ValBatch(1, 3).inputs));
  // MakeDataSource routes data.source "tokens" here.
  EXPECT_TRUE(
      at::equal(MakeDataSource(c, 1000, -100)->TrainBatch(3).inputs, a->TrainBatch(3).inputs));
}

TEST(TokenDataTest, ValidationFromValPath) {
  const std::string dir = TempDir();
  WriteShards(dir, "train", {true, 0, 100000, {400, 400}});
  WriteShards(dir, "val", {true, 50000, 100000, {70, 40}});
  const DataConfig c = TokensConfig(dir + "/train_*.bin", dir + "/val_*.bin");
  const auto source = MakeTokenShardSource(c, 200000);
  // Validation windows: shard 0 has (70 - 1) / 16 = 4, shard 1 (40 - 1) / 16 = 2; 6 in all.
  const std::vector<int64_t> starts = {50000, 50016, 50032, 50048, 150000, 150016};
  for (int64_t index = 0; index < 4; ++index) {  // 20 sequences of 6 windows: in order, repeated
    const Batch batch = source->ValBatch(index, 4);
    for (int64_t b = 0; b < c.batch_size; ++b) {
      const int64_t start = starts[(index * c.batch_size + b) % starts.size()];
      for (int64_t t = 0; t < c.seq_len; ++t) {
        ASSERT_EQ(batch.inputs[b][t].item<int64_t>(), start + t);
        ASSERT_EQ(batch.targets[b][t].item<int64_t>(), start + t + 1);
      }
    }
  }
  EXPECT_THAT(source->Describe(),
              HasSubstr("2 train files (800 tokens), validation 2 files (110 tokens), uint32"));
  EXPECT_EQ(source->ValidationSequences(), 6);
}

// Error cases: a valid uint16 shard of 40 tokens at <dir>/shard.bin, then broken.
class TokenDataErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    path_ = dir_ + "/shard.bin";
    WriteTokenShard(path_, std::vector<uint32_t>(40, 5), false);
    WriteTokenShard(dir_ + "/val.bin", std::vector<uint32_t>(40, 6), false);
  }
  std::string Load(int64_t vocab = 100) {
    return ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, dir_ + "/val.bin"), vocab); });
  }
  void Patch(const std::function<void(std::vector<unsigned char>&)>& edit) {
    std::vector<unsigned char> bytes = ReadBytes(path_);
    edit(bytes);
    WriteBytes(path_, bytes);
  }
  std::string dir_, path_;
};

TEST_F(TokenDataErrorTest, ValidShardLoads) { EXPECT_EQ(Load(), "(no error)"); }

TEST_F(TokenDataErrorTest, WrongMagic) {
  Patch([](auto& bytes) { PutLe32(bytes, 0, 20240522); });
  EXPECT_THAT(Load(), HasSubstr("data.path: " + path_ +
                                ": not an llm.c token shard: magic "
                                "20240522 (expected 20240520 for uint16 or 20240801 for uint32 "
                                "tokens; scripts/tokenize_shards.py makes shards from text: "
                                "docs/hf.md)"));
}

// What a glob matched that is no shard is named with the key of that glob: a directory (a
// data.path of the folder rather than of its shards), a text file in the validation glob.
TEST_F(TokenDataErrorTest, ADirectoryOrATextFileWhereAShardShouldBe) {
  const std::string folder = dir_ + "/folder";
  std::filesystem::create_directories(folder);
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(folder, dir_ + "/val.bin"), 100); }),
            "data.path: " + folder +
                ": not a regular file (a directory); expected an llm.c token shard, named by a "
                "glob such as \"data/train_*.bin\"");
  const std::string text = dir_ + "/val.txt";
  WriteBytes(text, std::vector<unsigned char>(2000, 'a'));
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, text), 100); }),
              HasSubstr("data.val_path: " + text + ": not an llm.c token shard: magic "));
}

TEST_F(TokenDataErrorTest, WrongVersionForTheMagic) {
  Patch([](auto& bytes) { PutLe32(bytes, 4, 7); });  // the uint32 format's version
  EXPECT_THAT(Load(), HasSubstr(path_ + ": magic 20240520 (uint16 tokens) goes with version 1, "
                                        "got version 7"));
  Patch([](auto& bytes) {
    PutLe32(bytes, 0, 20240801);
    PutLe32(bytes, 4, 1);
  });
  EXPECT_THAT(Load(), HasSubstr(path_ + ": magic 20240801 (uint32 tokens) goes with version 7, "
                                        "got version 1"));
}

TEST_F(TokenDataErrorTest, TruncatedByOneByte) {
  Patch([](auto& bytes) { bytes.pop_back(); });
  EXPECT_THAT(Load(), HasSubstr(path_ + ": expected 1104 bytes for 40 uint16 tokens (header), "
                                        "got 1103"));
}

TEST_F(TokenDataErrorTest, OneExtraByte) {
  Patch([](auto& bytes) { bytes.push_back(0); });
  EXPECT_THAT(Load(), HasSubstr(path_ + ": expected 1104 bytes for 40 uint16 tokens (header), "
                                        "got 1105"));
}

TEST_F(TokenDataErrorTest, NegativeTokenCount) {
  Patch([](auto& bytes) { PutLe32(bytes, 8, 0xFFFFFFFFu); });
  EXPECT_THAT(Load(), HasSubstr(path_ + ": negative token count -1"));
}

TEST_F(TokenDataErrorTest, ShorterThanTheHeader) {
  Patch([](auto& bytes) { bytes.resize(1000); });
  EXPECT_THAT(Load(), HasSubstr(path_ + ": 1000 bytes, shorter than the 1024-byte header"));
}

// A validation shard that the training glob matches too would be trained on: refused, both
// globs and the file named (also when the two spell the path differently).
TEST_F(TokenDataErrorTest, ValidationShardsThatTheTrainingGlobMatches) {
  const std::string val = dir_ + "/val_000000.bin";
  WriteTokenShard(val, std::vector<uint32_t>(49, 5), false);
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(dir_ + "/*.bin", val), 100); }),
              HasSubstr("data.val_path: " + val + " is also a training shard (data.path \"" + dir_ +
                        "/*.bin\" matches " + val + "); narrow data.path"));
  EXPECT_THAT(
      ErrorOf([&] { MakeTokenShardSource(TokensConfig(dir_ + "/*.bin", dir_ + "/./val_*"), 100); }),
      HasSubstr("is also a training shard"));
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, val), 100); }), "(no error)");
}

// A validation shard that is a copy of a training shard (another file, the same tokens) is
// refused too; one token apart, or another length, it is not.
TEST_F(TokenDataErrorTest, ValidationShardsThatCopyATrainingShard) {
  const std::string copy = dir_ + "/copy/val_000000.bin";
  std::filesystem::create_directories(dir_ + "/copy");
  WriteBytes(copy, ReadBytes(path_));
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, copy), 100); }),
              HasSubstr("data.val_path: " + copy +
                        " holds the same 40 tokens as the training "
                        "shard " +
                        path_ + " (a copy?)"));
  std::vector<uint32_t> tokens(40, 5);
  tokens[39] = 7;
  WriteTokenShard(copy, tokens, false);
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, copy), 100); }), "(no error)");
  WriteTokenShard(copy, std::vector<uint32_t>(41, 5), false);
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, copy), 100); }), "(no error)");
}

TEST_F(TokenDataErrorTest, NoFileMatchesTheGlob) {
  const std::string pattern = dir_ + "/nothing_*.bin";
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(pattern), 100); }),
              HasSubstr("data.path: no file matches \"" + pattern + "\""));
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, pattern), 100); }),
              HasSubstr("data.val_path: no file matches \"" + pattern + "\""));
}

// A directory the pattern cannot be matched in for a reason other than its absence (here a
// symbolic-link loop; a directory without permission, which root passes, gives the same message
// with "Permission denied") is named with the reason, with and without a wildcard.
TEST_F(TokenDataErrorTest, AnUnreadableDirectoryIsNamedWithTheReason) {
  const std::string loop = dir_ + "/loop";
  std::filesystem::create_symlink("loop", loop);
  for (const std::string& pattern : {loop + "/*.bin", loop + "/val_000000.bin"}) {
    EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, pattern), 100); }),
              "data.val_path: no file matches \"" + pattern + "\": cannot read \"" +
                  (pattern.find('*') == std::string::npos ? pattern : loop) +
                  "\" (Too many levels of symbolic links)");
  }
  // A loop beside a match is skipped, as before.
  std::filesystem::create_directories(dir_ + "/a");
  std::filesystem::create_symlink("b", dir_ + "/b");
  WriteTokenShard(dir_ + "/a/val_000000.bin", std::vector<uint32_t>(40, 6), false);
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, dir_ + "/*/val_*.bin"), 100); }),
            "(no error)");
}

// Every token of every shard is checked when the source is made (before any training, and
// before --fresh deletes a previous run), not only those a batch happens to read: the error
// names the file and the first bad token, in the training shards and the validation shards.
TEST_F(TokenDataErrorTest, TokenOutsideTheVocabulary) {
  std::vector<uint32_t> tokens(49, 5);
  tokens[37] = 999;
  const std::string bad = dir_ + "/bad_val.bin";
  WriteTokenShard(bad, tokens, false);
  DataConfig c = TokensConfig(path_, bad);
  c.batch_size = 1;
  EXPECT_THAT(
      ErrorOf([&] { MakeTokenShardSource(c, 100); }),
      HasSubstr("data.val_path: " + bad +
                ": the token at position 37 is 999, not below the vocabulary size 100: tokenized "
                "with a different tokenizer?"));
  // The vocabulary bound is exclusive: the token equal to the vocabulary size is refused.
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(c, 999); }),
              HasSubstr("the token at position 37 is 999, not below the vocabulary size 999"));
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(c, 1000)->ValBatch(2, 3); }), "(no error)");
  // A training shard (uint32) longer than one scanning chunk (2^22 tokens), its bad tokens in
  // the second: the first of them is named.
  const int64_t chunk = int64_t{1} << 22;
  std::vector<uint32_t> many(static_cast<size_t>(chunk + 1000), 7);
  many[static_cast<size_t>(chunk + 500)] = 100000;
  many[static_cast<size_t>(chunk + 10)] = 70000;
  const std::string big = dir_ + "/big_train.bin";
  WriteTokenShard(big, many, true);
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(big), 50000); }),
              HasSubstr(fmt::format(
                  "data.path: {}: the token at position {} is 70000, not below the vocabulary "
                  "size 50000",
                  big, chunk + 10)));
  EXPECT_EQ(ErrorOf([&] { MakeTokenShardSource(TokensConfig(big), 100001); }), "(no error)");
}

TEST_F(TokenDataErrorTest, TooFewTokensForOneSequence) {
  const std::string shorter = dir_ + "/short.bin";
  WriteTokenShard(shorter, std::vector<uint32_t>(16, 1), false);  // seq_len + 1 = 17 needed
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(shorter, path_), 100); }),
              HasSubstr("data.path: training shards \"" + shorter + "\": 16 tokens in 1 file"));
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, shorter), 100); }),
              HasSubstr("data.val_path: validation shards \"" + shorter + "\": 16 tokens"));
  // A shard whose header counts no tokens is still a file the glob matched.
  const std::string empty = dir_ + "/empty.bin";
  WriteTokenShard(empty, {}, false);
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(empty, path_), 100); }),
              HasSubstr("data.path: training shards \"" + empty + "\": 0 tokens in 1 file"));
  // Held out from 40 tokens: 20% is 8, too few for 17.
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_), 100); }),
              HasSubstr("data.val_fraction: validation (the last 0.2 of \"" + path_ +
                        "\"): 8 tokens in 1 file, the longest run in one shard 8; one sequence "
                        "needs data.seq_len + 1 = 17 tokens"));
  // A held-out tail that leaves too little for training is the val_fraction's doing, not the
  // shards' (it was reported as "data.path: ... 0 tokens in 0 files").
  DataConfig most = TokensConfig(path_);
  most.val_fraction = 0.9;
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(most, 100); }),
              HasSubstr("data.val_fraction: 0.9 holds out 36 of the 40 tokens of \"" + path_ +
                        "\", leaving 4 for training (the longest run in one shard 4); one "
                        "sequence needs data.seq_len + 1 = 17 tokens: lower data.val_fraction"));
}

TEST_F(TokenDataErrorTest, MixedTokenWidthsAreRefused) {
  const std::string wide = dir_ + "/wide.bin";
  WriteTokenShard(wide, std::vector<uint32_t>(40, 5), true);
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_, wide), 100); }),
              HasSubstr(wide + ": uint32 tokens, but " + path_ + " has uint16 tokens"));
}

// 16-bit shards for a vocabulary above 65536: another tokenizer's, or ids cut to 16 bits (every
// one of them below the vocabulary, so the token check would pass). 65536 itself fits.
TEST_F(TokenDataErrorTest, Uint16ShardsForAVocabularyAbove65536) {
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_), 65537); }),
              HasSubstr(path_ + ": uint16 tokens, which cannot hold the ids of a vocabulary of "
                                "65537 (above 65536)"));
  EXPECT_THAT(ErrorOf([&] { MakeTokenShardSource(TokensConfig(path_), 65536); }),
              ::testing::Not(HasSubstr("cannot hold")));  // (this shard is too short to train on)
}

}  // namespace
}  // namespace distill

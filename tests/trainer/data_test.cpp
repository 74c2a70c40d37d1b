// Data: batches are pure functions of (seed, split, index); the synthetic language's entropy
// floor is what its samples actually have; padding is marked with ignore_index.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "distill/data.h"
#include "distill/token_shards.h"
#include "test_files.h"
#include "test_util.h"

namespace distill {
namespace {

DataConfig SmallData() {
  DataConfig c;
  c.batch_size = 8;
  c.seq_len = 32;
  c.min_seq_len = 10;
  c.synthetic.order = 2;
  c.synthetic.branching = 5;
  c.synthetic.zipf = 1.0;
  return c;
}

TEST(DataTest, BatchesAreDeterministicAndDistinct) {
  auto a = MakeDataSource(SmallData(), 20, -100);
  auto b = MakeDataSource(SmallData(), 20, -100);
  EXPECT_TRUE(at::equal(a->TrainBatch(7).inputs, b->TrainBatch(7).inputs));
  EXPECT_TRUE(at::equal(a->TrainBatch(7).targets, b->TrainBatch(7).targets));
  EXPECT_FALSE(at::equal(a->TrainBatch(7).inputs, a->TrainBatch(8).inputs));
  EXPECT_FALSE(at::equal(a->TrainBatch(0).inputs, a->ValBatch(0, 1).inputs));
  DataConfig other = SmallData();
  other.seed += 1;
  EXPECT_FALSE(
      at::equal(a->TrainBatch(0).inputs, MakeDataSource(other, 20, -100)->TrainBatch(0).inputs));
}

TEST(DataTest, PaddingIsIgnoredAndCounted) {
  const DataConfig c = SmallData();
  auto data = MakeDataSource(c, 20, -7);
  for (int64_t i = 0; i < 5; ++i) {
    const Batch batch = data->TrainBatch(i);
    ASSERT_EQ(batch.inputs.sizes(), at::IntArrayRef({c.batch_size, c.seq_len}));
    const at::Tensor real = batch.targets.ne(-7);
    EXPECT_EQ(real.sum().item<int64_t>(), batch.num_targets);
    // Each row: a real prefix of length in [min_seq_len, seq_len], then only padding.
    const at::Tensor lengths = real.sum(1);
    EXPECT_GE(lengths.min().item<int64_t>(), c.min_seq_len);
    EXPECT_LE(lengths.max().item<int64_t>(), c.seq_len);
    EXPECT_TRUE(at::equal(real, at::arange(c.seq_len).unsqueeze(0).lt(lengths.unsqueeze(1))));
    // targets are the inputs shifted by one inside the real prefix.
    const at::Tensor shifted_ok =
        batch.targets.slice(1, 0, -1).eq(batch.inputs.slice(1, 1)) | real.slice(1, 1).logical_not();
    EXPECT_TRUE(shifted_ok.all().item<bool>());
    EXPECT_GE(batch.inputs.min().item<int64_t>(), 0);
    EXPECT_LT(batch.inputs.max().item<int64_t>(), 20);
  }
}

// A language of more branches than tokens could never draw its distinct successors (the first
// batch hung, deaf to SIGTERM): refused when it is built, naming the key. (The config refuses
// it first: tests/trainer/config_test.cpp.)
TEST(DataTest, MoreBranchesThanTokensIsRefused) {
  DataConfig c = SmallData();
  c.synthetic.branching = 4;
  try {
    SyntheticLanguage language(c.synthetic, 3, 1);
    FAIL() << "built";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "data.synthetic.branching: expected at most the 3 real tokens, got 4");
  }
  SyntheticLanguage fits(c.synthetic, 4, 1);
  EXPECT_GT(fits.ConditionalEntropy(), 0.0);
}

// The floor is E[-log P(token | context)] over the targets. Measure it on samples with the
// language's own probabilities: every sampled transition must be possible (finite log-prob),
// and the mean must match the floor within 4 standard errors (a false alarm ~ 1 in 16000).
TEST(DataTest, EntropyFloorMatchesSampledCrossEntropy) {
  const DataConfig c = SmallData();
  const int64_t vocab = 20;
  auto data = MakeDataSource(c, vocab, -100);
  SyntheticLanguage language(c.synthetic, vocab, static_cast<uint64_t>(c.seed));
  double sum = 0, sum_sq = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const Batch batch = data->TrainBatch(i);
    const auto in = batch.inputs.accessor<int64_t, 2>();
    const auto out = batch.targets.accessor<int64_t, 2>();
    for (int64_t b = 0; b < c.batch_size; ++b) {
      for (int64_t t = 0; t < c.seq_len && out[b][t] != -100; ++t) {
        // Target t is token t + 1 of the sequence; tokens before `order` are uniform.
        double nll = std::log(static_cast<double>(vocab));
        if (t + 1 >= c.synthetic.order) {
          const int64_t context[2] = {t >= 1 ? in[b][t - 1] : 0, in[b][t]};
          nll = -language.LogProb(context, out[b][t]);
          ASSERT_TRUE(std::isfinite(nll)) << "impossible transition at batch " << i;
        }
        sum += nll;
        sum_sq += nll * nll;
        ++n;
      }
    }
  }
  const double mean = sum / n;
  const double stderr_mean = std::sqrt((sum_sq / n - mean * mean) / n);
  EXPECT_NEAR(mean, *data->EntropyFloor(), 4 * stderr_mean);
  // H(w) for Zipf(1) over 5 successors, by hand: w = (60, 30, 20, 15, 12) / 137.
  double h = 0;
  for (double w : {60.0, 30.0, 20.0, 15.0, 12.0}) h -= w / 137 * std::log(w / 137);
  EXPECT_NEAR(language.ConditionalEntropy(), h, 1e-12);
  // A zipf so large that the lower ranks' weights underflow to 0: the first successor alone, a
  // floor of exactly 0 (0 * log 0 made it NaN, shown as "n/a").
  DataConfig steep = SmallData();
  steep.synthetic.zipf = 2000;
  EXPECT_EQ(SyntheticLanguage(steep.synthetic, vocab, 1).ConditionalEntropy(), 0.0);
}

TEST(DataTest, TextSourceIsByteLevelWithSplit) {
  const std::string path = testing::TempRunDir(".txt");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "héllo wörld " + std::to_string(i) + "\n";
  std::ofstream(path, std::ios::binary) << text;
  DataConfig c;
  c.source = "text";
  c.path = path;
  c.batch_size = 4;
  c.seq_len = 16;
  c.val_fraction = 0.25;
  auto data = MakeDataSource(c, 256, -100);
  const Batch train = data->TrainBatch(3);
  EXPECT_EQ(train.num_targets, 4 * 16);
  EXPECT_TRUE(at::equal(train.targets.slice(1, 0, -1), train.inputs.slice(1, 1)));
  EXPECT_LT(train.inputs.max().item<int64_t>(), 256);
  EXPECT_GE(train.inputs.max().item<int64_t>(), 128);  // UTF-8 bytes of é/ö do occur
  EXPECT_FALSE(data->EntropyFloor().has_value());
  EXPECT_TRUE(
      at::equal(data->ValBatch(1, 2).inputs, MakeDataSource(c, 256, -100)->ValBatch(1, 2).inputs));

  std::ofstream(path, std::ios::binary) << "too short";
  try {
    MakeDataSource(c, 256, -100);
    FAIL() << "a file shorter than one sequence was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("data.path: \"" + path + "\" has 9 bytes"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

// data.source text on what is not text: an llm.c token shard (data.source tokens forgotten) or
// any file with a NUL byte is refused, naming the file and what to set; a path that cannot be
// read says why, and a glob that only the tokens source expands says so.
TEST(DataTest, TextSourceRefusesBinaryFilesAndExplainsUnreadablePaths) {
  const std::string path = testing::TempRunDir(".bin");
  DataConfig c;
  c.source = "text";
  c.path = path;
  c.batch_size = 2;
  c.seq_len = 8;
  auto error = [&] {
    return testing::ErrorOf<std::runtime_error>([&] { MakeDataSource(c, 256, -100); });
  };
  std::string shard(1024 + 400, 'a');  // a header of 256 int32 and 200 uint16 tokens
  const int32_t magic = kShardMagicU16;
  std::memcpy(shard.data(), &magic, 4);
  shard[8] = '\0';
  std::ofstream(path, std::ios::binary) << shard;
  EXPECT_THAT(error(),
              ::testing::AllOf(::testing::HasSubstr("data.path: \"" + path + "\" is not text"),
                               ::testing::HasSubstr("llm.c token shard's magic number (20240520)"),
                               ::testing::HasSubstr("set data.source: tokens")));
  std::string binary(500, 'x');
  for (int i = 0; i < 500; i += 50) binary[i] = '\0';  // 10 NUL bytes: 2%
  std::ofstream(path, std::ios::binary) << binary;
  EXPECT_THAT(error(), ::testing::HasSubstr("is not text: 10 of its first 500 bytes are NUL"));
  binary.assign(500, 'x');
  binary[321] = '\0';  // a stray NUL (U+0000) in a text: kept
  std::ofstream(path, std::ios::binary) << binary;
  EXPECT_NO_THROW(MakeDataSource(c, 256, -100));
  std::filesystem::remove(path);

  c.path = path + "-missing";
  EXPECT_THAT(error(), ::testing::HasSubstr("cannot read \"" + c.path + "\": No such file"));
  c.path = path + "-shards/train_*.bin";
  EXPECT_THAT(error(), ::testing::HasSubstr("a glob of token shards is read with data.source: "
                                            "tokens"));
}

}  // namespace
}  // namespace distill

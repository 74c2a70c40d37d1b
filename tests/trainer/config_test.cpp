// Config parsing: every key round-trips through YAML and overrides; every error path names
// where, which key, what was expected and what was found.
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "config_schema.h"
#include "distill/config.h"
#include "distill/run_dir.h"
#include "test_files.h"

namespace distill {
namespace {

// Parses `yaml` and returns the ConfigError message ("" if it parsed).
std::string ErrorOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    ParseConfig(yaml, "x.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const char* kValidDistill = "train:\n  mode: distill\nteacher:\n  checkpoint: t.pt\n";

TEST(ConfigTest, EmptyDocumentGivesDefaultsWhichNeedATeacher) {
  EXPECT_EQ(ErrorOf(""),
            "(default): teacher.checkpoint: expected a checkpoint file or run directory in "
            "distill mode (or teacher.hf_dir, or teacher.pretrain_steps > 0 to pretrain one "
            "first), got \"\"");
  EXPECT_EQ(ErrorOf(kValidDistill), "");
}

// A run's stored config.yaml holds every key: an empty one is a damaged file, not the defaults
// (whose error would be about teacher.checkpoint, "(default)").
TEST(ConfigTest, AnEmptyStoredConfigIsADamagedFile) {
  try {
    ParseConfig("\n", "runs/x/config.yaml", {}, ConfigOrigin::kStored);
    FAIL() << "an empty stored config parsed";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "runs/x/config.yaml: expected the run's config (distill_trainer writes every key "
                 "there when the run starts), got an empty file");
  }
}

// Every key: print the defaults, parse them back, and compare the dump; then change every key
// through an override to a different valid value and check it was applied.
TEST(ConfigTest, EveryKeyRoundTripsThroughPrintConfig) {
  Config c = ParseConfig(kValidDistill, "x.yaml");
  const std::string dumped = ConfigToYaml(c);
  const Config again = ParseConfig(dumped, "dump.yaml");
  EXPECT_EQ(ConfigToYaml(again), dumped);
  for (const auto& key : ConfigKeys()) {
    EXPECT_NE(dumped.find(key.substr(key.rfind('.') + 1) + ":"), std::string::npos) << key;
  }
}

TEST(ConfigTest, EveryKeyIsSettableByOverride) {
  // One non-default, valid value per key (keeps the config consistent as a whole).
  const std::vector<std::string> overrides = {
      "student.vocab_size=30", "student.pad_vocab_to_multiple_of=8", "student.context_length=100",
      "student.n_layer=3", "student.n_head=2", "student.d_model=32", "student.mlp_ratio=2.5",
      "student.dropout=0.25", "student.tie_embeddings=false", "student.init_from_teacher=false",
      "teacher.vocab_size=30", "teacher.pad_vocab_to_multiple_of=16", "teacher.context_length=80",
      "teacher.n_layer=5", "teacher.n_head=8", "teacher.d_model=256", "teacher.mlp_ratio=3",
      "teacher.dropout=0.5", "teacher.tie_embeddings=false", "teacher.checkpoint=runs/t",
      "teacher.pretrain_steps=0", "data.source=tokens", "data.path=some/*.bin",
      "data.val_fraction=0.25", "data.batch_size=3", "data.seq_len=40", "data.seed=-5",
      "distill.divergence=jsd", "distill.jsd_beta=0.25", "distill.temperature=2.5",
      "distill.kd_weight=0.5", "distill.ce_weight=0.75", "distill.ignore_index=-1", "optim.lr=0.01",
      "optim.betas=[0.8, 0.99]", "optim.eps=1e-6", "optim.weight_decay=0", "optim.grad_clip=0",
      "schedule.kind=linear", "schedule.warmup_steps=0", "schedule.min_lr_ratio=1",
      "train.mode=distill", "train.steps=11", "train.grad_accum=4", "train.seed=9",
      "train.device=cpu", "train.precision=fp32", "train.log_interval=3", "train.eval_interval=0",
      "train.eval_batches=5", "train.checkpoint_interval=0", "train.keep_checkpoints=9",
      "train.resume=false", "train.baseline=true", "train.out_dir=elsewhere",
      "train.export_hf=false", "train.export_from=models/tok", "train.nonfinite=skip",
      "train.max_skipped_steps=3", "train.bucket_mb=7", "train.collective_timeout_s=60",
      "distill.vocab_size=25", "distill.fused_linear=true", "train.cuda_graph=false",
      "train.activation_checkpointing=false",
      // The llama family's keys (hf_dir is tested with real directories in hf_model_test).
      "student.family=llama", "student.n_kv_head=1", "student.head_dim=16",
      "student.intermediate_size=48", "student.norm_eps=1e-6", "student.rope_theta=500000",
      "student.rope_scaling.type=llama3", "student.rope_scaling.factor=4",
      "student.rope_scaling.low_freq_factor=2", "student.rope_scaling.high_freq_factor=8",
      "student.rope_scaling.original_max_position_embeddings=64", "student.attention_bias=true",
      "student.attention_out_bias=true", "student.mlp_bias=true", "student.qk_norm=true",
      "student.hf_model_type=qwen3", "teacher.family=llama", "teacher.n_kv_head=4",
      "teacher.head_dim=64", "teacher.intermediate_size=96", "teacher.norm_eps=1e-4",
      "teacher.rope_theta=1000", "teacher.rope_scaling.type=llama3",
      "teacher.rope_scaling.factor=2", "teacher.rope_scaling.low_freq_factor=0.5",
      "teacher.rope_scaling.high_freq_factor=2",
      "teacher.rope_scaling.original_max_position_embeddings=32", "teacher.attention_bias=true",
      "teacher.attention_out_bias=true", "teacher.mlp_bias=true", "teacher.qk_norm=true",
      "teacher.hf_model_type=mistral", "student.activation=gelu", "teacher.activation=gelu"};
  // Keys that the values above leave unread (refused away from their default: the synthetic
  // language's with data.source tokens, data.val_path with val_fraction): set in configs of
  // their own below.
  const std::vector<std::string> synthetic_only = {"data.min_seq_len=20", "data.synthetic.order=3",
                                                   "data.synthetic.branching=5",
                                                   "data.synthetic.zipf=0"};
  const std::vector<std::string> val_path = {"data.source=tokens", "data.path=some/*.bin",
                                             "data.val_path=v/*.bin"};
  const size_t alone = synthetic_only.size() + 1;
  size_t hf_dir_keys = 0;
  for (const auto& key : ConfigKeys()) hf_dir_keys += key.find("hf_dir") != std::string::npos;
  ASSERT_EQ(overrides.size() + alone + hf_dir_keys, ConfigKeys().size())
      << "a key was added: give it an override";
  const Config synthetic = ParseConfig(kValidDistill, "x.yaml", synthetic_only);
  EXPECT_EQ(synthetic.data.min_seq_len, 20);
  EXPECT_EQ(synthetic.data.synthetic.order, 3);
  EXPECT_EQ(synthetic.data.synthetic.branching, 5);
  EXPECT_DOUBLE_EQ(synthetic.data.synthetic.zipf, 0.0);
  EXPECT_EQ(ParseConfig(kValidDistill, "x.yaml", val_path).data.val_path, "v/*.bin");
  const Config c = ParseConfig("", "x.yaml", overrides);
  const Config defaults;
  const std::string dumped = ConfigToYaml(c);
  // Each override appears in the dump (flow values as given, modulo number formatting).
  EXPECT_EQ(c.student.vocab_size, 30);
  EXPECT_EQ(c.train.collective_timeout_s, 60);
  EXPECT_EQ(c.student.padded_vocab_size(), 32);
  EXPECT_EQ(c.teacher.padded_vocab_size(), 32);
  EXPECT_EQ(c.student.context_length, 100);
  EXPECT_DOUBLE_EQ(c.student.mlp_ratio, 2.5);
  EXPECT_DOUBLE_EQ(c.teacher.dropout, 0.5);
  EXPECT_FALSE(c.teacher.tie_embeddings);
  EXPECT_EQ(c.teacher.checkpoint, "runs/t");
  // pretrain_steps > 0 conflicts with a checkpoint, activation checkpointing with dropout: set on
  // their own.
  EXPECT_TRUE(ParseConfig(kValidDistill, "x.yaml", {"train.activation_checkpointing=true"})
                  .train.activation_checkpointing);
  EXPECT_EQ(ParseConfig("", "x.yaml", {"teacher.pretrain_steps=7"}).teacher.pretrain_steps, 7);
  // The GELU's choice is the gpt family's (the llama one set above has none).
  const Config tanh = ParseConfig(kValidDistill, "x.yaml",
                                  {"student.activation=gelu_tanh", "teacher.activation=gelu_tanh"});
  EXPECT_EQ(tanh.student.activation, Activation::kGeluTanh);
  EXPECT_EQ(tanh.teacher.activation, Activation::kGeluTanh);
  EXPECT_EQ(c.data.path, "some/*.bin");
  EXPECT_DOUBLE_EQ(c.data.val_fraction, 0.25);
  EXPECT_EQ(c.data.seed, -5);
  EXPECT_EQ(c.distill.divergence, Divergence::kJsd);
  EXPECT_DOUBLE_EQ(c.distill.jsd_beta, 0.25);
  EXPECT_DOUBLE_EQ(c.distill.temperature, 2.5);
  EXPECT_EQ(c.distill.ignore_index, -1);
  EXPECT_EQ(c.distill.fused_linear, FusedLinear::kOn);
  EXPECT_EQ(c.train.cuda_graph, CudaGraph::kOff);
  EXPECT_DOUBLE_EQ(c.optim.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optim.betas[1], 0.99);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-6);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::kLinear);
  EXPECT_DOUBLE_EQ(c.schedule.min_lr_ratio, 1.0);
  EXPECT_EQ(c.train.grad_accum, 4);
  EXPECT_FALSE(c.train.resume);
  EXPECT_TRUE(c.train.baseline);
  EXPECT_EQ(c.train.out_dir, "elsewhere");
  EXPECT_EQ(c.train.export_from, "models/tok");
  // A trailing separator names the same run directory.
  EXPECT_EQ(ParseConfig(kValidDistill, "x.yaml", {"train.out_dir=runs/x//"}).train.out_dir,
            "runs/x");
  // And every key's dumped line differs from the default dump (each override took effect).
  const std::string default_dump = ConfigToYaml(ParseConfig(kValidDistill, "x.yaml"));
  std::istringstream a(dumped), b(default_dump);
  std::string la, lb;
  int differing = 0, lines = 0;
  while (std::getline(a, la) && std::getline(b, lb)) {
    if (la.find(": ") == std::string::npos || la.back() == ':') continue;  // section headers
    ++lines;
    differing += la != lb;
  }
  // Overrides equal to the default on purpose (the only valid value, or needed for consistency):
  // train.precision, train.mode, student.init_from_teacher, teacher.pretrain_steps,
  // train.activation_checkpointing, student.activation and teacher.activation (their llama
  // family has no other); the keys set on their own above; and the two hf_dir keys, not set here.
  EXPECT_EQ(lines, static_cast<int>(ConfigKeys().size()));
  EXPECT_EQ(differing, lines - 7 - static_cast<int>(alone + hf_dir_keys)) << dumped;
}

TEST(ConfigTest, YamlFileValuesAndLineNumbers) {
  const std::string yaml =
      "train:\n"
      "  mode: distill\n"
      "teacher:\n"
      "  checkpoint: t.pt\n"
      "distill:\n"
      "  temperature: 2.0\n"
      "optim:\n"
      "  betas: [0.5, 0.6]\n";
  const Config c = ParseConfig(yaml, "x.yaml");
  EXPECT_DOUBLE_EQ(c.distill.temperature, 2.0);
  EXPECT_DOUBLE_EQ(c.optim.betas[1], 0.6);
  EXPECT_EQ(ErrorOf("train:\n  mode: distill\nteacher:\n  checkpoint: t\ndistill:\n"
                    "  temperature: hot\n"),
            "x.yaml:6: distill.temperature: expected a number in [0.001, 1000], got \"hot\"");
}

struct ErrorCase {
  std::string yaml;
  std::string message;
};

TEST(ConfigTest, EveryErrorPathNamesWhereKeyExpectedAndFound) {
  const std::string head = kValidDistill;  // lines 1-4
  const std::vector<ErrorCase> cases = {
      {head + "distill:\n  temprature: 2\n",
       "x.yaml:6: distill.temprature: unknown key; did you mean \"distill.temperature\"?"},
      {head + "distil:\n  temperature: 2\n",
       "x.yaml:5: distil: unknown key; did you mean \"distill\"?"},
      {head + "bogus: 1\n", "x.yaml:5: bogus: unknown key"},
      // A key in the wrong section: the sections that have it, not a prefix of what was typed.
      {head + "schedule:\n  lr: 0.01\n",
       "x.yaml:6: schedule.lr: unknown key; did you mean \"optim.lr\"?"},
      {head + "steps: 2\n", "x.yaml:5: steps: unknown key; did you mean \"train.steps\"?"},
      {head + "optim:\n  n_layer: 2\n",
       "x.yaml:6: optim.n_layer: unknown key; did you mean \"student.n_layer\" or "
       "\"teacher.n_layer\"?"},
      // A null written out is YAML's no-value, not a path's empty string (a model with random
      // weights where hf_dir: ~ was read as none); left empty, the key is "".
      {head + "student:\n  hf_dir: ~\n",
       "x.yaml:6: student.hf_dir: expected a string without NUL characters, got null (YAML's "
       "no-value, written ~ or null); for no path leave the value empty (\"key:\") or write "
       "\"\""},
      {head + "data:\n  val_path: null\n",
       "x.yaml:6: data.val_path: expected a string without NUL characters, got null (YAML's "
       "no-value, written ~ or null); for no path leave the value empty (\"key:\") or write "
       "\"\""},
      {"\xEF\xBB\xBF" + head + "student:\n  hf_dir: ~\n",  // after a UTF-8 byte-order mark
       "x.yaml:6: student.hf_dir: expected a string without NUL characters, got null (YAML's "
       "no-value, written ~ or null); for no path leave the value empty (\"key:\") or write "
       "\"\""},
      {head + "student:\n  hf_dir: &a ~\n",  // behind an anchor
       "x.yaml:6: student.hf_dir: expected a string without NUL characters, got null (YAML's "
       "no-value, written ~ or null); for no path leave the value empty (\"key:\") or write "
       "\"\""},
      {head + "student:\n  hf_dir: !!null ~\n",  // was read as the text "~"
       "x.yaml:6: student.hf_dir: expected a string without NUL characters, got null (YAML's "
       "no-value, written ~ or null); for no path leave the value empty (\"key:\") or write "
       "\"\""},
      {head + "distill:\n  temperature: ~\n",
       "x.yaml:6: distill.temperature: expected a number in [0.001, 1000], got null (YAML's "
       "no-value, written ~ or null)"},
      // A leading zero: YAML 1.1 reads 010 as 8, yaml-cpp as 10; number keys as integer keys.
      {head + "distill:\n  kd_weight: 010\n",
       "x.yaml:6: distill.kd_weight: expected a number in [0, 1000000], got \"010\" (a leading "
       "zero: "
       "YAML "
       "1.1 reads it as octal, YAML 1.2 as decimal; write the number without it)"},
      {head + "student:\n  family: llama\n  rope_scaling:\n    type: yarn\n",
       "x.yaml:8: student.rope_scaling.type: expected one of: \"\", llama3, got \"yarn\""},
      // data.min_seq_len left at its default (64) above a shorter data.seq_len: the key set.
      {head + "data:\n  seq_len: 32\n",
       "x.yaml:6: data.seq_len: expected at least data.min_seq_len (64, its default), got 32; set "
       "data.min_seq_len too, to at most 32"},
      {head + "optim:\n  lr: 0.01\n  weight_decay: 100\n",
       "x.yaml:7: optim.weight_decay: expected below 1 / optim.lr = 100 (AdamW multiplies the "
       "weights by 1 - lr * weight_decay at every step: at 1 or more they vanish or change "
       "sign), got 100"},
      {head + "distill: 3\n",
       "x.yaml:5: distill: expected a mapping (the distill section), got \"3\""},
      {head + "distill:\n  temperature: -1\n",
       "x.yaml:6: distill.temperature: expected a number in [0.001, 1000], got \"-1\""},
      {head + "distill:\n  temperature: [1, 2]\n",
       "x.yaml:6: distill.temperature: expected a number in [0.001, 1000], got a list of 2: "
       "[\"1\", "
       "\"2\"]"},
      {head + "distill:\n  temperature:\n",
       "x.yaml:6: distill.temperature: expected a number in [0.001, 1000], got nothing"},
      {head + "distill:\n  temperature: .inf\n",
       "x.yaml:6: distill.temperature: expected a number in [0.001, 1000], got \".inf\""},
      // The clip is a float32 scalar on the device: 1e39 failed at the first step, with torch's
      // words and no key.
      {head + "optim:\n  grad_clip: 1e39\n",
       "x.yaml:6: optim.grad_clip: expected a number in [0, 1e+30], got \"1e39\""},

      {head + "distill:\n  divergence: kl\n",
       "x.yaml:6: distill.divergence: expected one of: tvd, forward_kl, reverse_kl, jsd, got "
       "\"kl\""},
      {head + "student:\n  n_layer: 1.5\n",
       "x.yaml:6: student.n_layer: expected an integer in [1, 4096], got \"1.5\""},
      {head + "student:\n  n_layer: 0\n",
       "x.yaml:6: student.n_layer: expected an integer in [1, 4096], got \"0\""},
      {head + "student:\n  dropout: 1\n",
       "x.yaml:6: student.dropout: expected a number in [0, 1), got \"1\""},
      {head + "student:\n  tie_embeddings: maybe\n",
       "x.yaml:6: student.tie_embeddings: expected true or false, got \"maybe\""},
      {head + "optim:\n  betas: [0.9]\n",
       "x.yaml:6: optim.betas: expected a list of two numbers in [0, 1), got a list of 1: "
       "[\"0.9\"]"},
      {head + "optim:\n  betas: [0.9, 1.0]\n",
       "x.yaml:6: optim.betas: expected a list of two numbers in [0, 1), got a list of 2: "
       "[\"0.9\", \"1.0\"]"},
      {head + "optim:\n  betas: [[0.9], 0.95]\n",
       "x.yaml:6: optim.betas: expected a list of two numbers in [0, 1), got a list"},
      // yaml-cpp reads an integer with a leading zero as octal (0100 = 64), YAML 1.2 as decimal:
      // refused, saying so, rather than read either way in silence.
      {head + "student:\n  n_layer: 010\n",
       "x.yaml:6: student.n_layer: expected an integer in [1, 4096], got \"010\" (a leading zero: "
       "YAML 1.1 reads it as octal, YAML 1.2 as decimal; write the number without it)"},
      {head + "student:\n  n_layer: -01\n",
       "x.yaml:6: student.n_layer: expected an integer in [1, 4096], got \"-01\" (a leading zero: "
       "YAML 1.1 reads it as octal, YAML 1.2 as decimal; write the number without it)"},
      {head + "data:\n  val_fraction: 1\n",
       "x.yaml:6: data.val_fraction: expected a number in (0, 1), got \"1\""},
      {head + "data:\n  synthetic:\n    branching: 65\n",
       "x.yaml:7: data.synthetic.branching: expected an integer in [1, 64], got \"65\""},
      // The data's tokens must be real (below distill.vocab_size): a synthetic language of more
      // branches than tokens never drew its batch, a text byte past it failed at some batch.
      {head + "distill:\n  vocab_size: 3\ndata:\n  synthetic:\n    branching: 4\n",
       "x.yaml:9: data.synthetic.branching: expected at most distill.vocab_size (3, the tokens the "
       "data draws from), got 4"},
      {"train:\n  mode: pretrain\nstudent:\n  vocab_size: 256\ndistill:\n  vocab_size: 128\n"
       "data:\n  source: text\n  path: x.txt\n",
       "x.yaml:6: distill.vocab_size: expected 256 or 0 (unset) with data.source text (its tokens "
       "are the bytes 0-255, all real), got 128"},
      {head + "train:\n  device: tpu\n", "x.yaml:5: train: duplicate key (first set at x.yaml:1)"},
      {head + "schedule:\n  min_lr_ratio: 1.5\n",
       "x.yaml:6: schedule.min_lr_ratio: expected a number in [0, 1], got \"1.5\""},
      {"- 1\n- 2\n",
       "x.yaml:1: expected a mapping of sections (student, teacher, data, distill, optim, "
       "schedule, train), got a list of 2: [\"1\", \"2\"]"},
      // Cross-key constraints, reported at the key to change.
      {head + "student:\n  d_model: 66\n",
       "x.yaml:6: student.d_model: expected a multiple of student.n_head (4), got 66"},
      {head + "data:\n  seq_len: 200\n",
       "x.yaml:6: data.seq_len: expected at most student.context_length (128), got 200"},
      {head + "data:\n  min_seq_len: 100\n",
       "x.yaml:6: data.min_seq_len: expected at most data.seq_len (64), got 100"},
      {head + "data:\n  source: text\n",
       "(default): student.vocab_size: expected 256 (byte tokens; data.source is text), got 64"},
      {head + "teacher:\n  vocab_size: 65\n",
       "x.yaml:5: teacher: duplicate key (first set at x.yaml:3)"},
      {"train:\n  mode: distill\nteacher:\n  checkpoint: t\n  vocab_size: 63\n",
       "x.yaml:5: teacher.vocab_size: expected student.vocab_size (64) (or set distill.vocab_size "
       "to "
       "the tokenizer's size to align logits of different widths), got 63"},
      {"train:\n  mode: distill\nteacher:\n  checkpoint: t\n  pad_vocab_to_multiple_of: 48\n",
       "x.yaml:5: teacher.pad_vocab_to_multiple_of: expected a value that pads to the student's "
       "64 logits, got 48 (pads to 96); or set distill.vocab_size to 64 (the real vocabulary) to "
       "align logits of different widths"},
      {"train:\n  mode: distill\nteacher:\n  checkpoint: t\nstudent:\n  init_from_teacher: true\n",
       "(default): student.n_layer: expected 4 (= teacher.n_layer; student.init_from_teacher is "
       "true), got 2"},
      {head + "teacher:\n  pretrain_steps: 5\n",
       "x.yaml:5: teacher: duplicate key (first set at x.yaml:3)"},
      {"train: {mode: distill}\nteacher: {checkpoint: t, pretrain_steps: 5}\n",
       "x.yaml:2: teacher.pretrain_steps: expected 0 when teacher.checkpoint is set (the teacher "
       "is loaded, not pretrained), got 5"},
      {"train:\n  mode: pretrain\n  baseline: true\n",
       "x.yaml:3: train.baseline: expected false in pretrain mode, got true"},
      {"train:\n  mode: pretrain\ndistill:\n  fused_linear: true\n",
       "x.yaml:4: distill.fused_linear: expected false or auto in pretrain mode (it fuses the "
       "distillation loss; pretraining computes the cross-entropy from the logits), got true"},
      {head + "distill:\n  fused_linear: yes please\n",
       "x.yaml:6: distill.fused_linear: expected one of: auto, true, false, got \"yes please\""},
      {head + "distill:\n  ignore_index: 3\n",
       "x.yaml:6: distill.ignore_index: expected a value outside the token range [0, 64), got 3"},
      {"train:\n  mode: distill\n  device: cpu\n  precision: bf16\nteacher:\n  checkpoint: t\n",
       "x.yaml:4: train.precision: expected fp32 with train.device cpu (bf16 autocast is "
       "CUDA-only), got \"bf16\""},
      {head + "train: {out_dir: \"\"}\n", "x.yaml:5: train: duplicate key (first set at x.yaml:1)"},
      {"train: {mode: distill, out_dir: \"\"}\nteacher: {checkpoint: t}\n",
       "x.yaml:1: train.out_dir: expected a directory path, got \"\""},
      {head + "data:\n  path: corpus.txt\n",
       "x.yaml:6: data.path: expected \"\" with data.source synthetic (the synthetic language "
       "reads no files; set data.source to text or tokens to train on it), got \"corpus.txt\""},
      {"train: {mode: pretrain}\nstudent: {vocab_size: 256}\ndata:\n  source: text\n  path: "
       "a.txt\n  val_path: b.txt\n",
       "x.yaml:6: data.val_path: expected \"\" with data.source text (validation shards are for "
       "data.source tokens; text holds out data.val_fraction), got \"b.txt\""},
      {head + "distill:\n  kd_weight: 0\n  ce_weight: 0\n",
       "x.yaml:6: distill.kd_weight: expected a weight above 0 for the divergence or for "
       "distill.ce_weight (with both 0 the loss is 0 and the student does not learn), got 0"},
  };
  for (const auto& c : cases) EXPECT_EQ(ErrorOf(c.yaml), c.message) << c.yaml;
  // The system sees a path only up to a NUL: "run\0x" created "run".
  EXPECT_THAT(
      ErrorOf("train:\n  mode: distill\n  out_dir: \"run\\0x\"\nteacher:\n"
              "  checkpoint: t.pt\n"),
      ::testing::StrEq("x.yaml:3: train.out_dir: expected a string without NUL characters, got "
                       "\"run\\x00x\""));
  // Nothing expands '~' in a YAML value (or a quoted override): out_dir "~/runs/x" created a
  // directory named '~' in the working directory.
  EXPECT_THAT(
      ErrorOf("train:\n  mode: distill\n  out_dir: ~/runs/x\nteacher:\n  checkpoint: t.pt\n"),
      ::testing::StrEq("x.yaml:3: train.out_dir: expected a path that does not start with ~ "
                       "(nothing expands it here; write the home directory out, e.g. with $HOME "
                       "unquoted in a shell override), got \"~/runs/x\""));
  // Read while parsing, an hf_dir's message says the same where its file is not found.
  EXPECT_THAT(ErrorOf(kValidDistill, {"teacher.hf_dir=~alice/m"}),
              ::testing::HasSubstr("nothing expands a leading '~' here"));
  EXPECT_EQ(ParseConfig(kValidDistill, "x", {"train.out_dir=runs/~x"}).train.out_dir, "runs/~x");
}

// Every key that holds a path or a glob (the schema's PathOrGlob rule) refuses a leading '~' in a
// requested config: the check walks the schema, so a path key added later gets it too. (The two
// hf_dir keys are read while parsing, so their error is file_io's "nothing expands a leading '~'"
// before the walk: for them the list below is what this test pins.)
TEST(ConfigTest, EveryPathKeyRefusesALeadingTilde) {
  std::vector<std::string> paths;
  for (const auto& k : internal::Keys()) {
    if (k.path_value) paths.push_back(k.path);
  }
  EXPECT_THAT(paths, ::testing::ElementsAre("student.hf_dir", "teacher.hf_dir",
                                            "teacher.checkpoint", "data.path", "data.val_path",
                                            "train.out_dir", "train.export_from"));
  for (const std::string& key : paths) {
    const std::string error = ErrorOf(kValidDistill, {key + "=~/x"});
    EXPECT_THAT(error, ::testing::HasSubstr(key)) << key;
    EXPECT_THAT(error, ::testing::AnyOf(::testing::HasSubstr("does not start with ~"),
                                        ::testing::HasSubstr("nothing expands a leading '~'")))
        << key << ": " << error;
  }
}

// A requested path with a control character (a YAML block scalar ends with a newline) or with
// leading or trailing spaces is refused; a run's stored config keeps any name
// (StringsRoundTripThroughTheDumpExactly).
TEST(ConfigTest, PathsWithControlCharactersOrOuterSpacesAreRefused) {
  const std::string tokens = std::string(kValidDistill) + "data:\n  source: tokens\n";
  EXPECT_EQ(ErrorOf(tokens + "  path: >\n    shards/a.bin\n"),
            "x.yaml:7: data.path: expected a path without control characters (a newline or a "
            "tab: a YAML block scalar, '>' or '|', ends with a newline), got "
            "\"shards/a.bin\\x0a\"");
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.out_dir=\"runs/a\tb\""}),
              ::testing::HasSubstr("train.out_dir: expected a path without control characters"));
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.out_dir=\"runs/x \""}),
            "override \"train.out_dir=\"runs/x \"\": train.out_dir: expected a path without "
            "leading or trailing spaces (quotes keep them), got \"runs/x \"");
  EXPECT_THAT(ErrorOf(kValidDistill, {"teacher.checkpoint=' t.pt'"}),
              ::testing::HasSubstr("teacher.checkpoint: expected a path without leading or "
                                   "trailing spaces"));
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.out_dir=runs/with inner space"}), "");
}

// What a run reads must not lie inside the directory it writes: --fresh deletes that directory
// and the run's export overwrites it (a teacher exported into <out_dir>/hf and distilled again
// with the same out_dir was deleted by --fresh before it was read).
TEST(ConfigTest, InputsInsideTheRunDirectoryAreRefused) {
  const std::string out = "train.out_dir=runs/it";
  EXPECT_EQ(ErrorOf(kValidDistill, {out, "teacher.checkpoint=runs/it/checkpoints/step_8.pt"}),
            "override \"teacher.checkpoint=runs/it/checkpoints/step_8.pt\": teacher.checkpoint: "
            "expected a path outside train.out_dir \"runs/it\" (set at override "
            "\"train.out_dir=runs/it\"): --fresh deletes that directory and the run writes its "
            "checkpoints and export there; copy or export it elsewhere, or choose another "
            "train.out_dir, got \"runs/it/checkpoints/step_8.pt\"");
  const std::string tokens = std::string(kValidDistill) + "data:\n  source: tokens\n";
  for (const std::vector<std::string>& overrides : std::vector<std::vector<std::string>>{
           {out, "teacher.checkpoint=runs/it"},
           {out, "teacher.checkpoint=./runs/x/../it/"},
           {out, "data.path=runs/it/shards/*.bin"},
           {out, "data.val_path=runs/it/v_[0-9].bin"},
           {out, "train.export_from=runs/it/hf"},
           {"train.out_dir=runs/it/", "data.path=runs/it/a.bin"}}) {
    EXPECT_THAT(ErrorOf(tokens, overrides),
                ::testing::HasSubstr("expected a path outside train.out_dir"))
        << overrides[1];
  }
  // Beside it, or a glob that may match names beside it: fine.
  for (const char* path : {"runs/it2/a.bin", "runs/it-baseline/a.bin", "runs/it*.bin",
                           "runs/i?/a.bin", "runs/a.bin"}) {
    EXPECT_EQ(ErrorOf(tokens, {out, std::string("data.path=") + path}), "") << path;
  }
  // Only the token shards' paths are globs: '[' in any other path is a character of its name.
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.out_dir=runs/exp[1]",
                                      "teacher.checkpoint=runs/exp[1]/checkpoints/step_8.pt"}),
              ::testing::HasSubstr("expected a path outside train.out_dir"));
  EXPECT_EQ(
      ErrorOf(kValidDistill, {"train.out_dir=runs/exp1", "teacher.checkpoint=runs/exp[1]/t.pt"}),
      "");
  EXPECT_THAT(
      ErrorOf("data:\n  source: text\n  path: runs/exp[1]/book.txt\n",
              {"train.mode=pretrain", "student.vocab_size=256", "train.out_dir=runs/exp[1]"}),
      ::testing::HasSubstr("data.path: expected a path outside train.out_dir"));
}

// On disk: a glob whose wildcard is above the run directory refused for a file it matches
// inside it (named), a symbolic link inside it leading out (--fresh deletes the link) and one
// outside leading in; a glob matching only beside it, and a link beside it leading beside it,
// are fine.
TEST(ConfigTest, InputsReachingIntoTheRunDirectoryOnDiskAreRefused) {
  namespace fs = std::filesystem;
  const std::string root = testing::FreshTestDir("distill_config_inside_");
  fs::create_directories(root + "/runs/it");
  fs::create_directories(root + "/runs/other");
  fs::create_directories(root + "/data");
  testing::WriteBytes(root + "/runs/other/a.bin", "x");
  testing::WriteBytes(root + "/data/a.bin", "x");
  const std::string tokens = std::string(kValidDistill) + "data:\n  source: tokens\n";
  const std::string out = "train.out_dir=" + root + "/runs/it";
  const std::string glob = root + "/runs/*/a.bin";
  EXPECT_EQ(ErrorOf(tokens, {out, "data.path=" + glob}), "");
  testing::WriteBytes(root + "/runs/it/a.bin", "x");
  EXPECT_THAT(
      ErrorOf(tokens, {out, "data.path=" + glob}),
      ::testing::HasSubstr("expected a path outside train.out_dir \"" + root + "/runs/it\""));
  EXPECT_THAT(
      ErrorOf(tokens, {out, "data.path=" + glob}),
      ::testing::EndsWith("got \"" + glob + "\", which matches \"" + root + "/runs/it/a.bin\""));
  fs::create_symlink(root + "/data/a.bin", root + "/runs/it/link.bin");
  fs::create_symlink(root + "/runs/it/a.bin", root + "/data/into.bin");
  fs::create_symlink(root + "/data/a.bin", root + "/runs/other/link.bin");
  EXPECT_THAT(ErrorOf(tokens, {out, "data.path=" + root + "/runs/it/link.bin"}),
              ::testing::EndsWith("got \"" + root + "/runs/it/link.bin\""));
  EXPECT_THAT(ErrorOf(tokens, {out, "data.path=" + root + "/data/into.bin"}),
              ::testing::EndsWith("got \"" + root + "/data/into.bin\", which leads to \"" + root +
                                  "/runs/it/a.bin\""));
  EXPECT_EQ(ErrorOf(tokens, {out, "data.path=" + root + "/runs/other/link.bin"}), "");
  // A link at any depth: a directory inside it leading out, a file beneath that link.
  fs::create_symlink(root + "/data", root + "/runs/it/datalink");
  const std::string through = ", through the link \"" + root + "/runs/it/datalink\" inside it";
  EXPECT_THAT(ErrorOf(tokens, {out, "data.path=" + root + "/runs/it/datalink/a.bin"}),
              ::testing::EndsWith("got \"" + root + "/runs/it/datalink/a.bin\"" + through));
  EXPECT_THAT(
      ErrorOf(tokens, {out, "data.path=" + root + "/runs/*/datalink/a.bin"}),
      ::testing::EndsWith(", which matches \"" + root + "/runs/it/datalink/a.bin\"" + through));
  // Through the run directory and out again with "..": fine (nothing --fresh deletes is named),
  // also entering it by a link from outside; "sub/.." inside it names it.
  fs::create_symlink(root + "/runs/it", root + "/data/intodir");
  for (const std::string& path :
       {root + "/runs/it/../other/a.bin", root + "/data/intodir/../other/a.bin"}) {
    EXPECT_EQ(ErrorOf(tokens, {out, "data.path=" + path}), "") << path;
  }
  fs::create_directories(root + "/runs/it/sub");
  EXPECT_THAT(ErrorOf(tokens, {out, "data.path=" + root + "/runs/it/sub/.."}),
              ::testing::EndsWith("got \"" + root + "/runs/it/sub/..\""));
  // A model directory outside whose files link into it (a model directory of links, as a Hugging
  // Face cache's snapshot is): --fresh would delete what they lead to. Named by the first such
  // file; a link leading elsewhere is fine.
  const std::string model = root + "/models/m";
  fs::create_directories(model);
  testing::WriteBytes(model + "/config.json", "{}");
  fs::create_symlink(root + "/data/a.bin", model + "/tokenizer.model");
  EXPECT_EQ(ErrorOf(kValidDistill, {out, "train.export_from=" + model}), "");
  fs::create_symlink(root + "/runs/it/hf/model.safetensors", model + "/model.safetensors");
  EXPECT_THAT(ErrorOf(kValidDistill, {out, "train.export_from=" + model}),
              ::testing::EndsWith("got \"" + model + "\", whose file \"" + model +
                                  "/model.safetensors\", which leads to \"" + root +
                                  "/runs/it/hf/model.safetensors\""));
  // Through a chain of links to nothing (yet).
  fs::remove(model + "/model.safetensors");
  fs::create_symlink(root + "/runs/it/blob", root + "/data/mid");
  fs::create_symlink("../../data/mid", model + "/weights.bin");
  EXPECT_THAT(ErrorOf(kValidDistill, {out, "train.export_from=" + model}),
              ::testing::EndsWith("whose file \"" + model + "/weights.bin\", which leads to \"" +
                                  root + "/runs/it/blob\""));
  RemoveTree(root);
}

// A key set away from its default where the run does not read it is refused, naming what reads
// it; at its default (a --print-config dump holds every key) it is fine.
TEST(ConfigTest, KeysTheRunWouldNotReadAreRefused) {
  EXPECT_EQ(ErrorOf(kValidDistill, {"distill.jsd_beta=0.25"}),
            "override \"distill.jsd_beta=0.25\": distill.jsd_beta: expected 0.5, its default (the "
            "run does not read it: read by distill.divergence jsd only, and distill.divergence "
            "is tvd; remove the key), got 0.25");
  EXPECT_EQ(ErrorOf(kValidDistill, {"distill.divergence=jsd", "distill.jsd_beta=0.25"}), "");
  EXPECT_THAT(ErrorOf(kValidDistill, {"schedule.kind=constant", "schedule.min_lr_ratio=0.5"}),
              ::testing::HasSubstr("schedule.min_lr_ratio: expected 0.1, its default (the run "
                                   "does not read it: schedule.kind constant does not decay"));
  const std::vector<std::string> tokens = {"data.source=tokens", "data.path=t/*.bin"};
  for (const char* key : {"data.min_seq_len=20", "data.synthetic.order=3",
                          "data.synthetic.branching=5", "data.synthetic.zipf=0"}) {
    std::vector<std::string> o = tokens;
    o.push_back(key);
    EXPECT_THAT(ErrorOf(kValidDistill, o),
                ::testing::HasSubstr("read by data.source synthetic only; data.source is tokens"))
        << key;
  }
  std::vector<std::string> both = tokens;
  both.insert(both.end(), {"data.val_path=v/*.bin", "data.val_fraction=0.25"});
  EXPECT_THAT(ErrorOf(kValidDistill, both),
              ::testing::HasSubstr("data.val_fraction: expected 0.1, its default (the run does "
                                   "not read it: data.val_path gives the validation shards"));
  EXPECT_THAT(ErrorOf(kValidDistill, {"data.val_fraction=0.25"}),
              ::testing::HasSubstr("synthetic validation is its own generated stream"));
  // Text reads val_fraction: a val_path there is the mistake, named as such.
  EXPECT_THAT(ErrorOf(kValidDistill, {"data.source=text", "data.path=a.txt", "data.val_path=v.txt",
                                      "data.val_fraction=0.25", "student.vocab_size=256",
                                      "teacher.vocab_size=256"}),
              ::testing::HasSubstr("data.val_path: expected \"\" with data.source text"));
  // A stored config (a run made before the check) still loads, and a requested one for a run
  // already in train.out_dir too (resumed, its config must equal the stored one).
  EXPECT_NO_THROW(ParseConfig(ConfigToYaml(ParseConfig(kValidDistill, "x.yaml")), "c.yaml",
                              {"distill.jsd_beta=0.25"}, ConfigOrigin::kStored));
  const std::string run = testing::FreshTestDir("distill_unread_") + "/run";
  std::filesystem::create_directories(run);
  const std::vector<std::string> unread = {"train.out_dir=" + run, "distill.jsd_beta=0.25"};
  EXPECT_THAT(ErrorOf(kValidDistill, {unread[0], unread[1]}),
              ::testing::HasSubstr("distill.jsd_beta: expected 0.5, its default"));
  testing::WriteBytes(run + "/config.yaml", "");
  EXPECT_EQ(ErrorOf(kValidDistill, {unread[0], unread[1]}), "");
}

// yaml-cpp has no merge keys: "<<: *anchor" is named as one, not as an unknown key "<<".
TEST(ConfigTest, YamlMergeKeysAreNamed) {
  EXPECT_EQ(ErrorOf("train:\n  mode: distill\nstudent: &m\n  n_layer: 2\nteacher:\n  <<: *m\n"
                    "  checkpoint: t.pt\n"),
            "x.yaml:6: teacher.<<: a YAML merge key (<<), which the config reader does not "
            "support; write the keys out");
}

// YAML syntax at a value's start: a tag ('!') or an anchor ('&') with nothing after it, an alias
// ('*'): named, with how to quote the value.
TEST(ConfigTest, YamlSyntaxAtAValuesStartIsNamed) {
  EXPECT_EQ(ErrorOf(std::string(kValidDistill) + "data:\n  path: !mydir\n"),
            "x.yaml:6: data.path: expected a string without NUL characters, got the YAML tag "
            "\"!mydir\" (a value that starts with '!' is a tag, not text); quote the value");
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.out_dir=&x"}),
              ::testing::HasSubstr("got an empty value: YAML reads a leading '&' as an anchor; "
                                   "to keep the value as text, quote it"));
  EXPECT_THAT(ErrorOf(kValidDistill, {"data.path=*.bin"}),
              ::testing::HasSubstr("got invalid YAML (the referenced anchor is not defined); to "
                                   "keep the value as text, quote it"));
  EXPECT_THAT(ErrorOf(std::string(kValidDistill) + "data:\n  path: *.bin\n"),
              ::testing::HasSubstr("a value that starts with '*' is a YAML alias: quote it"));
  EXPECT_EQ(ErrorOf(std::string(kValidDistill) + "data:\n  source: tokens\n  path: \"*.bin\"\n"),
            "");
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.out_dir=!!str runs/x"}), "");  // a standard tag
  // Standard tags beyond the core schema's are refused (!!binary was read as its base64 text).
  EXPECT_EQ(ErrorOf(std::string(kValidDistill) + "data:\n  path: !!binary aGVsbG8=\n"),
            "x.yaml:6: data.path: expected a string without NUL characters, got the YAML tag "
            "\"!!binary\", which this config does not read (only the core schema's: !!str, !!int, "
            "!!float, !!bool, !!null, !!seq, !!map); remove it");
  EXPECT_EQ(ErrorOf(kValidDistill, {"optim.betas=!!seq [0.9, 0.95]"}), "");
}

// A llama-family key on a gpt model (the default family) would be ignored: refused, naming the
// family. At its default (a --print-config dump of a gpt config holds every key) it is fine.
TEST(ConfigTest, LlamaKeysOnAGptModelAreRefused) {
  const std::string head = kValidDistill;  // lines 1-4
  EXPECT_EQ(ErrorOf(head + "student:\n  n_kv_head: 2\n"),
            "x.yaml:6: student.n_kv_head: expected 0, its default (n_kv_head is a llama-family key "
            "and student.family is gpt, the default, which does not read it: for a "
            "Llama/Qwen/Mistral-style model set student.family: llama), got 2");
  EXPECT_EQ(ErrorOf(head, {"teacher.family=gpt", "teacher.rope_scaling.type=llama3"}),
            "override \"teacher.rope_scaling.type=llama3\": teacher.rope_scaling.type: expected "
            "\"\", its default (rope_scaling.type is a llama-family key and teacher.family is gpt, "
            "which does not read it: for a Llama/Qwen/Mistral-style model set teacher.family: "
            "llama), got llama3");
  EXPECT_EQ(ErrorOf(head + "student:\n  family: llama\n  n_kv_head: 2\n"), "");
  EXPECT_EQ(ErrorOf(ConfigToYaml(ParseConfig(head, "x.yaml"))), "");
  // A key spelled as Hugging Face's config.json spells it: its name here.
  EXPECT_EQ(
      ErrorOf(head + "student:\n  num_key_value_heads: 2\n"),
      "x.yaml:6: student.num_key_value_heads: unknown key; did you mean \"student.n_kv_head\" "
      "(Hugging Face's num_key_value_heads)? Or set student.hf_dir to the model's directory: "
      "its config.json is read as it is");
}

// A run's stored config.yaml, read back for its identity or an export, skips the checks that
// refuse keys a run would not use: a run written before them still resumes and exports.
TEST(ConfigTest, StoredConfigsSkipTheUnusedKeyChecks) {
  const std::string yaml = std::string(kValidDistill) +
                           "data:\n  path: corpus.txt\n  val_path: v.bin\ndistill:\n  kd_weight: "
                           "0\n  ce_weight: 0\n";
  EXPECT_THAT(ErrorOf(yaml), ::testing::HasSubstr("data.path: expected \"\" with data.source "
                                                  "synthetic"));
  const Config stored = ParseConfig(yaml, "x.yaml", {}, ConfigOrigin::kStored);
  EXPECT_EQ(stored.data.path, "corpus.txt");
  EXPECT_EQ(stored.data.val_path, "v.bin");
  // A llama-family key that a gpt run set before it was refused: the run still reads back.
  EXPECT_EQ(ParseConfig(yaml + "student:\n  norm_eps: 1e-6\n", "x.yaml", {}, ConfigOrigin::kStored)
                .student.norm_eps,
            1e-6);
  // The other checks still apply.
  EXPECT_THROW(ParseConfig(yaml + "student:\n  d_model: 66\n", "x.yaml", {}, ConfigOrigin::kStored),
               ConfigError);
}

// The auto | true | false keys take YAML's other boolean spellings, as the bool keys do.
TEST(ConfigTest, AutoTrueFalseKeysTakeYamlBooleans) {
  const Config on =
      ParseConfig(kValidDistill, "x.yaml", {"distill.fused_linear=yes", "train.cuda_graph=On"});
  EXPECT_EQ(on.distill.fused_linear, FusedLinear::kOn);
  EXPECT_EQ(on.train.cuda_graph, CudaGraph::kOn);
  const Config off = ParseConfig(std::string(kValidDistill) + "distill:\n  fused_linear: no\n",
                                 "x.yaml", {"train.cuda_graph=False"});
  EXPECT_EQ(off.distill.fused_linear, FusedLinear::kOff);
  EXPECT_EQ(off.train.cuda_graph, CudaGraph::kOff);
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.cuda_graph=maybe"}),
            "override \"train.cuda_graph=maybe\": train.cuda_graph: expected one of: auto, true, "
            "false, got \"maybe\"");
}

// Activation checkpointing recomputes the forward: a trained model with dropout would draw other
// masks there. The student always trains; the teacher only when the pipeline pretrains it.
TEST(ConfigTest, ActivationCheckpointingNeedsTheTrainedModelsWithoutDropout) {
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.activation_checkpointing=true", "student.dropout=0.1"}),
            "override \"student.dropout=0.1\": student.dropout: expected 0 with "
            "train.activation_checkpointing true (the recomputed forward would draw other dropout "
            "masks than the first), got 0.1");
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.activation_checkpointing=true", "teacher.dropout=0.1"}),
            "");  // a loaded teacher is not trained
  EXPECT_THAT(
      ErrorOf("train:\n  activation_checkpointing: true\nteacher:\n  pretrain_steps: 5\n"
              "  dropout: 0.2\n"),
      ::testing::HasSubstr("teacher.dropout: expected 0 with train.activation_checkpointing "
                           "true"));
  // How the gradients are computed, not what they are: a run resumes with it switched.
  const Config off = ParseConfig(kValidDistill, "x.yaml");
  const Config on = ParseConfig(kValidDistill, "x.yaml", {"train.activation_checkpointing=true"});
  EXPECT_EQ(RunIdentity(on), RunIdentity(off));
  // Left out of the identity's text: older runs' checkpoints carry a hash of it without the key.
  EXPECT_EQ(RunIdentity(on).find("activation_checkpointing"), std::string::npos);
}

// The models' activation came after runs existed: at its one earlier value (gelu) it is not in
// the identity's text, so that their checkpoints' hashes still match (the pinned hash is what
// a82c71c, before the key, computed for this config); another value is part of the identity.
TEST(ConfigTest, TheActivationKeyLeavesTheIdentityOfEarlierRunsAlone) {
  const Config c = ParseConfig(kValidDistill, "x.yaml");
  EXPECT_EQ(RunIdentity(c).find("activation"), std::string::npos);
  EXPECT_EQ(RunIdentityHash(c), "32ac12abf6820cef");
  const Config tanh = ParseConfig(kValidDistill, "x.yaml", {"student.activation=gelu_tanh"});
  EXPECT_NE(RunIdentity(tanh).find("\n  activation: gelu_tanh\n"), std::string::npos);
  EXPECT_NE(RunIdentityHash(tanh), RunIdentityHash(c));
}

// How long the ranks wait in a collective is not what is trained: any value leaves the identity
// (and the hash older runs' checkpoints carry) as it was.
TEST(ConfigTest, TheCollectiveTimeoutIsNotPartOfTheIdentity) {
  const Config c = ParseConfig(kValidDistill, "x.yaml");
  const Config longer = ParseConfig(kValidDistill, "x.yaml", {"train.collective_timeout_s=7200"});
  EXPECT_EQ(RunIdentity(longer), RunIdentity(c));
  EXPECT_EQ(RunIdentity(c).find("collective_timeout_s"), std::string::npos);
  EXPECT_EQ(RunIdentityHash(longer), "32ac12abf6820cef");
}

// The identity is config.yaml's text, and checkpoints carry it: paths in their usual spellings
// (relative, leading '.', '-' or a digit) stay plain words there, as in runs made before, so
// that those runs' checkpoints still match; only what YAML would read otherwise is quoted.
TEST(ConfigTest, PathsKeepTheirPlainSpellingInTheIdentity) {
  const Config c = ParseConfig(kValidDistill, "x.yaml",
                               {"teacher.checkpoint=./runs/teacher", "data.source=tokens",
                                "data.path=../data/2024-train.bin", "data.val_path=-val.bin"});
  const std::string identity = RunIdentity(c);
  for (const char* line : {"\n  checkpoint: ./runs/teacher\n", "\n  path: ../data/2024-train.bin\n",
                           "\n  val_path: -val.bin\n"}) {
    EXPECT_NE(identity.find(line), std::string::npos) << line << " not in:\n" << identity;
  }
}

// train.export_from says what the export copies, not what is trained: not part of the identity
// (a run resumes with it changed), and absent from its text (earlier runs' hashes still match).
TEST(ConfigTest, ExportFromIsNotPartOfTheRunIdentity) {
  const Config c = ParseConfig(kValidDistill, "x.yaml");
  const Config from = ParseConfig(kValidDistill, "x.yaml",
                                  {"train.export_from=models/tok", "train.export_hf=false"});
  EXPECT_EQ(RunIdentity(from), RunIdentity(c));
  EXPECT_EQ(RunIdentity(c).find("export_from"), std::string::npos);
  EXPECT_NE(ConfigToYaml(from).find("\n  export_from: models/tok\n"), std::string::npos);
}

// train.export_from is checked when the config is read, not found wrong after the training: a
// model directory with a config.json, whose tokenizer's ids the student has rows for.
TEST(ConfigTest, ExportFromIsAModelDirectoryWhoseTokenizerFitsTheStudent) {
  const std::string dir = testing::FreshTestDir("distill_config_");
  const std::string model = dir + "/model";
  std::filesystem::create_directories(model);
  testing::WriteBytes(model + "/notes.txt", "");
  testing::WriteBytes(dir + "/file", "");
  const std::string prefix = "override \"train.export_from=" + dir +
                             "/missing\": train.export_from: expected a Hugging Face model "
                             "directory with a config.json ";
  EXPECT_THAT(
      ErrorOf(kValidDistill, {"train.export_from=" + dir + "/missing"}),
      ::testing::AllOf(::testing::StartsWith(prefix),
                       ::testing::EndsWith("got \"" + dir + "/missing\", which does not exist")));
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.export_from=" + dir + "/file"}),
              ::testing::EndsWith("got \"" + dir + "/file\", a file"));
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.export_from=" + model}),
              ::testing::EndsWith("got \"" + model + "\", a directory without config.json"));
  ASSERT_EQ(::mkfifo((model + "/config.json").c_str(), 0600), 0);  // never opened
  EXPECT_THAT(
      ErrorOf(kValidDistill, {"train.export_from=" + model}),
      ::testing::EndsWith("got \"" + model + "\", whose config.json is not a regular file"));
  std::filesystem::remove(model + "/config.json");
  testing::WriteBytes(model + "/config.json", "{}");
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.export_from=" + model}), "");
  // The student's vocabulary: 64 ids. A BPE vocabulary of ids 0..9 and an added token 63 fits;
  // an added token 64 (65 ids) does not.
  auto tokenizer = [&](int added_id) {
    testing::WriteBytes(model + "/tokenizer.json",
                        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 9}}, "added_tokens": )"
                        R"([{"id": )" +
                            std::to_string(added_id) + R"(, "content": "<x>"}]})");
  };
  tokenizer(63);
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.export_from=" + model}), "");
  // A tokenizer file that links to nothing (a Hugging Face cache whose files were deleted) would
  // be left out of the export: refused now, and read only where the run exports.
  std::filesystem::create_symlink(model + "/gone.json", model + "/tokenizer_config.json");
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.export_from=" + model}),
              ::testing::EndsWith(": train.export_from: expected tokenizer files that the "
                                  "end-of-run export can copy (train.export_hf is on), got \"" +
                                  model + "/tokenizer_config.json\" (a link to \"" + model +
                                  "/gone.json\"): a link that leads to no file; restore "
                                  "it (e.g. download the model again) or set train.export_hf: "
                                  "false"));
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.export_from=" + model, "train.export_hf=false"}), "");
  std::filesystem::remove(model + "/tokenizer_config.json");
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.export_from=" + model}), "");
  // A JSON tokenizer file cut short would be copied as it is and the export would not load.
  testing::WriteBytes(model + "/generation_config.json", R"({"bos_token_id": 1, "eos_to)");
  EXPECT_THAT(
      ErrorOf(kValidDistill, {"train.export_from=" + model}),
      ::testing::AllOf(
          ::testing::HasSubstr(": train.export_from: expected tokenizer files that the end-of-run "
                               "export can copy (train.export_hf is on), got \"" +
                               model + "/generation_config.json\" ("),
          ::testing::HasSubstr("parse error"),
          ::testing::EndsWith("): not valid JSON; restore it (e.g. download the model again) or "
                              "set train.export_hf: false")));
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.export_from=" + model, "train.export_hf=false"}), "");
  testing::WriteBytes(model + "/generation_config.json", R"({"bos_token_id": 1})");
  // A directory where a tokenizer file belongs (the copy refuses it) and a link that loops: refused
  // now, not at the export after the training.
  std::filesystem::create_directories(model + "/merges.txt");
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.export_from=" + model}),
              ::testing::EndsWith(": train.export_from: expected tokenizer files that the "
                                  "end-of-run export can copy (train.export_hf is on), got \"" +
                                  model +
                                  "/merges.txt\": a directory, not a file; restore it (e.g. "
                                  "download the model again) or set train.export_hf: false"));
  std::filesystem::remove(model + "/merges.txt");
  std::filesystem::create_symlink("vocab.json", model + "/vocab.json");
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.export_from=" + model}),
              ::testing::EndsWith(": train.export_from: expected tokenizer files that the "
                                  "end-of-run export can copy (train.export_hf is on), got \"" +
                                  model +
                                  "/vocab.json\" (a link that loops): a link that leads to no "
                                  "file; restore it (e.g. download the model again) or set "
                                  "train.export_hf: false"));
  std::filesystem::remove(model + "/vocab.json");
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.export_from=" + model}), "");
  std::filesystem::remove(model + "/generation_config.json");
  tokenizer(64);
  EXPECT_THAT(ErrorOf(kValidDistill, {"train.export_from=" + model}),
              ::testing::EndsWith(": train.export_from: expected the directory of a model whose "
                                  "tokenizer the student can take (at most student.vocab_size 64 "
                                  "token ids), got \"" +
                                  model +
                                  "\", whose tokenizer.json has 65 ids: the exported model would "
                                  "have no rows for ids from 64 on"));
  // Not exported: not read.
  EXPECT_EQ(
      ErrorOf(kValidDistill, {"train.export_from=" + dir + "/missing", "train.export_hf=false"}),
      "");
}

// A llama student that its hf_model_type's class cannot express is refused when the config is
// read, not by the export at the end of the training; without the export it trains.
TEST(ConfigTest, ExportedStudentMustFitItsHfModelType) {
  const std::vector<std::string> llama = {"student.family=llama", "teacher.family=llama"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), llama.begin(), llama.end());
    return ErrorOf(kValidDistill, more);
  };
  EXPECT_EQ(with({"student.attention_bias=true"}),
            "(default): student.attention_out_bias: expected true (one attention_bias key covers "
            "q, k, v and o) with student.hf_model_type \"llama\" (the end-of-run export writes "
            "that model class's config.json; set student.hf_model_type to a type that has it, or "
            "train.export_hf: false), got false");
  EXPECT_THAT(with({"student.qk_norm=true"}),
              ::testing::HasSubstr("student.qk_norm: expected false (qk-norm is Qwen3's) with "
                                   "student.hf_model_type \"llama\""));
  EXPECT_EQ(with({"student.attention_bias=true", "student.hf_model_type=qwen2"}), "");
  EXPECT_EQ(with({"student.qk_norm=true", "student.hf_model_type=qwen3"}), "");
  EXPECT_EQ(with({"student.attention_bias=true", "train.export_hf=false"}), "");
  // The pipeline's teacher stage is exported too.
  EXPECT_THAT(ErrorOf("train:\n  mode: distill\nteacher:\n  family: llama\n  pretrain_steps: 5\n"
                      "  qk_norm: true\nstudent:\n  family: llama\n"),
              ::testing::HasSubstr("teacher.qk_norm: expected false (qk-norm is Qwen3's) with "
                                   "teacher.hf_model_type \"llama\""));
  // A run's stored config is not checked again (it resumes; its export says the same).
  const Config stored =
      ParseConfig(kValidDistill, "x.yaml",
                  {"student.family=llama", "teacher.family=llama", "student.qk_norm=true"},
                  ConfigOrigin::kStored);
  EXPECT_TRUE(stored.student.qk_norm);
}

TEST(ConfigTest, InvalidYamlNamesTheLine) {
  EXPECT_EQ(ErrorOf("train:\n  mode: [distill\n"),
            "x.yaml:3: invalid YAML: end of sequence flow not found");
  // A tab in the indentation, named (yaml-cpp's own message does not).
  const std::string tab = ErrorOf("train:\n  mode: distill\ndata:\n  seed: 3\n\tbatch_size: 4\n");
  EXPECT_THAT(tab, ::testing::StartsWith("x.yaml:5: invalid YAML: "));
  EXPECT_THAT(tab, ::testing::HasSubstr(
                       "(this line is indented with a tab: YAML indents with spaces only)"));
}

// Where each key was set, for errors a valid value meets when the run starts: the file's line,
// the last override of a key over the file, nothing for a default; WithWhereGiven puts it in
// front of a message about the key, as a config error has it.
TEST(ConfigTest, RemembersWhereEachKeyWasGiven) {
  const Config c = ParseConfig("train:\n  mode: pretrain\n  device: cpu\ndata:\n  seed: 3\n",
                               "x.yaml", {"data.seed=4", "data.seed=5"});
  EXPECT_EQ(c.given_at.at("train.mode"), "x.yaml:2");
  EXPECT_EQ(c.given_at.at("train.device"), "x.yaml:3");
  EXPECT_EQ(c.given_at.at("data.seed"), "override \"data.seed=5\"");
  EXPECT_EQ(c.given_at.count("train.steps"), 0u);
  EXPECT_EQ(WithWhereGiven(c, "train.device: no such device"),
            "x.yaml:3: train.device: no such device");
  EXPECT_EQ(WithWhereGiven(c, "data.seed: odd"), "override \"data.seed=5\": data.seed: odd");
  EXPECT_EQ(WithWhereGiven(c, "train.device \"cpu\" is odd"),
            "x.yaml:3: train.device \"cpu\" is odd");
  EXPECT_EQ(WithWhereGiven(c, "data.seed=5 is odd"),
            "override \"data.seed=5\": data.seed=5 is odd");
  EXPECT_EQ(WithWhereGiven(c, "data.seed, or not"), "data.seed, or not");
  EXPECT_EQ(WithWhereGiven(c, "train.steps: at its default"), "train.steps: at its default");
  EXPECT_EQ(WithWhereGiven(c, "train: a section"), "train: a section");
  EXPECT_EQ(WithWhereGiven(c, "no key here"), "no key here");
}

TEST(ConfigTest, OverridesAreValidatedLikeTheFile) {
  EXPECT_EQ(ErrorOf(kValidDistill, {"distill.temperature=hot"}),
            "override \"distill.temperature=hot\": distill.temperature: expected a number in "
            "[0.001, 1000], "
            "got \"hot\"");
  EXPECT_EQ(ErrorOf(kValidDistill, {"distill.temprature=2"}),
            "override \"distill.temprature=2\": distill.temprature: unknown key; did you mean "
            "\"distill.temperature\"?");
  EXPECT_EQ(ErrorOf(kValidDistill, {"student.hf_dir=~"}),
            "override \"student.hf_dir=~\": student.hf_dir: expected a string without NUL "
            "characters, got null (YAML's no-value, written ~ or null); for no path leave the "
            "value empty (\"key:\") or write \"\"");
  EXPECT_EQ(ParseConfig(kValidDistill, "x.yaml", {"student.hf_dir="}).student.hf_dir, "");
  EXPECT_EQ(
      ParseConfig(std::string(kValidDistill) + "student:\n  hf_dir:\n", "x.yaml").student.hf_dir,
      "");
  // A byte-order mark does not shift what is read as a written-out null: "# ~a" is a comment.
  EXPECT_EQ(ParseConfig("\xEF\xBB\xBF" + std::string(kValidDistill) + "student:\n  hf_dir: # ~a\n",
                        "x.yaml")
                .student.hf_dir,
            "");
  // A path that starts with '~' is text, not a null (and refused as such, naming the '~').
  EXPECT_THAT(ErrorOf(kValidDistill, {"student.hf_dir=~/models/x"}),
              ::testing::Not(::testing::HasSubstr("got null")));
  // A misspelt section: its key, not every key of that name.
  EXPECT_EQ(ErrorOf(kValidDistill, {"techer.hf_dir=t"}),
            "override \"techer.hf_dir=t\": techer.hf_dir: unknown key; did you mean "
            "\"teacher.hf_dir\"?");
  EXPECT_EQ(ErrorOf(kValidDistill, {"distill=2"}),
            "override \"distill=2\": distill: is a section; set one of its keys (see --help)");
  EXPECT_EQ(ErrorOf(kValidDistill, {"temperature"}),
            "override \"temperature\": expected key.path=value");
  EXPECT_EQ(
      ErrorOf(kValidDistill, {"optim.betas=[0.9, 0.9"})
          .rfind("override \"optim.betas=[0.9, 0.9\": optim.betas: expected a list of two numbers "
                 "in [0, 1), got invalid YAML",
                 0),
      0u);
  // A config file given without --config.
  const std::string file = testing::FreshTestDir("distill_cfg_") + "/distill.yaml";
  testing::WriteBytes(file, kValidDistill);
  EXPECT_EQ(ErrorOf(kValidDistill, {file}),
            "override \"" + file +
                "\": expected key.path=value (a config file is given with "
                "--config " +
                file + ")");
  EXPECT_EQ(ErrorOf(kValidDistill, {"distill.yaml"}),
            "override \"distill.yaml\": expected key.path=value");
  // One YAML document, as in the file (YAML::Load kept the first of "2\n---\n3").
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.steps=2\n---\n3"}),
            "override \"train.steps=2\n---\n3\": train.steps: expected an integer in [1, "
            "1099511627776], got more than one YAML document (a \"---\" line, or text after a "
            "closing ']' or '}')");
  // Cross-key errors point at the override that set the key.
  EXPECT_EQ(ErrorOf(kValidDistill, {"student.n_head=3"}),
            "(default): student.d_model: expected a multiple of student.n_head (3), got 64");
  EXPECT_EQ(ErrorOf(kValidDistill, {"data.seq_len=129"}),
            "override \"data.seq_len=129\": data.seq_len: expected at most "
            "student.context_length (128), got 129");
  // A YAML comment in a value is refused: what follows it would be dropped silently (an out_dir
  // "runs/x #2" trained in runs/x). Quoted, or without a space before it, the '#' is kept.
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.out_dir=runs/x #2"}),
            "override \"train.out_dir=runs/x #2\": train.out_dir: expected a string without NUL "
            "characters, got a "
            "YAML comment at \"#2\" (a '#' after a space starts one, and what follows it would be "
            "dropped); quote the whole value in YAML to keep the '#' (in a shell: "
            "train.out_dir='\"...\"'), or leave the comment out");
  EXPECT_NE(ErrorOf(kValidDistill, {"train.steps=#5"}).find("got a YAML comment at \"#5\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(kValidDistill, {"train.out_dir=\"a\" # b"}).find("comment at \"# b\""),
            std::string::npos);
  for (const std::string text :
       {"train.out_dir=it's #1", "train.out_dir=x 'y #1", "train.out_dir=a,'b #1",
        "train.out_dir='a'#1", "train.out_dir=\"a\"#1", "optim.betas=[0.9, 0.95] #1",
        "optim.betas=[0.9,0.95]#1", "train.out_dir=!!str x #1"}) {
    EXPECT_NE(ErrorOf(kValidDistill, {text}).find("comment at \"#1\""), std::string::npos) << text;
  }
  for (const auto& [text, dir] : std::vector<std::pair<std::string, std::string>>{
           {"train.out_dir=\"runs/x #2\"", "runs/x #2"},
           {"train.out_dir='runs/x #2'", "runs/x #2"},
           {"train.out_dir='it''s #2'", "it's #2"},
           {"train.out_dir=\"a\\\" #b\"", "a\" #b"},
           {"train.out_dir=runs/x#2", "runs/x#2"},
           {"train.out_dir=https://example.com/a#b", "https://example.com/a#b"},
           {"train.out_dir=!!str 'a #b'", "a #b"},
           {"train.out_dir=&x \"a #b\"", "a #b"}}) {
    EXPECT_EQ(ParseConfig(kValidDistill, "x", {text}).train.out_dir, dir) << text;
  }
  EXPECT_EQ(ParseConfig(kValidDistill, "x", {"optim.betas=[0.9, 0.99]"}).optim.betas[1], 0.99);
  // A value that starts with ',' is refused before yaml-cpp parses it (0.7 allocated without end).
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.out_dir=,a"}),
            "override \"train.out_dir=,a\": train.out_dir: expected a string without NUL "
            "characters, got invalid YAML (a value cannot start with ',', a "
            "flow indicator; quote "
            "the value to keep it)");
  EXPECT_EQ(ParseConfig(kValidDistill, "x", {"train.out_dir=',a'"}).train.out_dir, ",a");
  // Later overrides win; an override beats the file.
  const Config c = ParseConfig(std::string(kValidDistill) + "distill:\n  temperature: 3\n", "x",
                               {"distill.temperature=4", "distill.temperature=5"});
  EXPECT_DOUBLE_EQ(c.distill.temperature, 5.0);
}

TEST(ConfigTest, HelpListsEveryKeyWithDefault) {
  const std::string help = ConfigHelp();
  for (const auto& key : ConfigKeys()) {
    EXPECT_NE(help.find("  " + key + " = "), std::string::npos) << key;
  }
  EXPECT_NE(help.find("  distill.temperature = 1\n"), std::string::npos) << help;
  EXPECT_NE(help.find("Accepts a number in [0.001, 1000]."), std::string::npos);
}

TEST(ConfigTest, ShippedConfigsParse) {
  for (const char* name : {"quickstart.yaml", "teacher.yaml", "distill.yaml", "text.yaml"}) {
    const std::string path = std::string(DISTILL_CONFIGS_DIR) + "/" + name;
    EXPECT_NO_THROW(LoadConfigFile(path)) << path;
  }
  EXPECT_EQ(QuickstartYaml().find("# The quickstart"), 0u);
  EXPECT_NO_THROW(ParseConfig(QuickstartYaml(), "embedded"));
}

// docs/config.md is the reference: it must document every key (as "| `key.path` |").
TEST(ConfigTest, ReferenceDocumentsEveryKey) {
  std::ifstream in(std::string(DISTILL_DOCS_DIR) + "/config.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& key : ConfigKeys()) {
    EXPECT_NE(text.str().find("| `" + key + "` |"), std::string::npos) << key;
  }
  // Every row exactly as the key table prints it (regenerate the tables with
  // `distill_trainer --print-config-reference`).
  std::istringstream reference(ConfigReference());
  for (std::string row; std::getline(reference, row);) {
    if (row.rfind("| `", 0) == 0) {
      EXPECT_NE(text.str().find(row + "\n"), std::string::npos) << row;
    }
  }
}

// Strings that are not plain YAML words (a data.path with a newline, quotes, a backslash, a
// colon, a leading space, '#', a tab, a control byte) survive config.yaml exactly.
TEST(ConfigTest, StringsRoundTripThroughTheDumpExactly) {
  Config c = ParseConfig(kValidDistill, "x.yaml");
  c.data.source = "tokens";  // (a synthetic run refuses a data.path)
  for (const std::string& path : {std::string("a\nb"),
                                  std::string("say \"hi\""),
                                  std::string("C:\\data\\x.txt"),
                                  std::string("key: value"),
                                  std::string(" leading space"),
                                  std::string("a #comment"),
                                  std::string("tab\there"),
                                  std::string("bell\x07"),
                                  std::string("true"),
                                  std::string("- [x]"),
                                  std::string("\\n is not a newline\n\n"),
                                  std::string("cr\r\nlf"),
                                  std::string("del\x7f"),
                                  std::string("caf\xc3\xa9 \xe2\x82\xac"),
                                  std::string("-"),
                                  std::string("--"),
                                  std::string("---"),
                                  std::string("-x"),
                                  std::string("."),
                                  std::string("..."),
                                  std::string("-.inf"),
                                  std::string(".nan"),
                                  std::string("0x10"),
                                  std::string("1e3"),
                                  std::string("Null"),
                                  std::string("TRUE"),
                                  std::string("~")}) {
    c.data.path = path;
    const Config again = ParseConfig(ConfigToYaml(c), "dump.yaml", {}, ConfigOrigin::kStored);
    EXPECT_EQ(again.data.path, path) << ConfigToYaml(c);
  }
}

TEST(ConfigTest, SecondYamlDocumentIsAnErrorNamingTheLine) {
  EXPECT_EQ(ErrorOf(std::string(kValidDistill) + "---\ntrain:\n  steps: 5\n"),
            "x.yaml:5: a second YAML document (after \"---\"); a config is one document: remove "
            "the marker and merge its keys into the first");
  EXPECT_EQ(ErrorOf("# comment\n---\n" + std::string(kValidDistill) + "---\n").substr(0, 9),
            "x.yaml:7:");
  EXPECT_EQ(ErrorOf("---\n" + std::string(kValidDistill)), "");  // one document, marked
}

// Every number key's range, read from its own "expected" text: a closed bound is accepted (or
// refused by another key's rule, never by its own range), an open bound and a value just beyond
// either bound are refused with the key and its range. The sweep walks the schema: a key added
// later is swept too.
TEST(ConfigTest, EveryNumberRangeAcceptsItsBoundsAndRefusesJustBeyond) {
  const std::regex range(R"(^(a number|an integer) in ([\[(])([^,]+), ([^\])]+)([\])]))");
  auto step = [](const std::string& bound, bool integer, int direction) {
    if (integer) return std::to_string(std::stoll(bound) + direction);
    const double v = std::stod(bound);
    return fmt::format("{}", v == 0 ? direction * 1e-300 : v + direction * std::fabs(v) * 1e-9);
  };
  const std::regex at_least(R"(^(a number|an integer) >= (\S+))");
  int swept = 0;
  for (const auto& k : internal::Keys()) {
    std::smatch m;
    std::vector<std::tuple<std::string, bool, int>> bounds;  // (bound, closed, direction past it)
    if (std::regex_search(k.expected, m, at_least)) {
      bounds = {{m[2], true, -1}};
    } else if (std::regex_search(k.expected, m, range)) {
      bounds = {{m[3], m[2] == "[", -1}, {m[4], m[5] == "]", +1}};
    } else {
      continue;
    }
    ++swept;
    const bool integer = m[1] == "an integer";
    const std::string own = k.path + ": expected " + m[0].str();
    for (const auto& [bound, closed, direction] : bounds) {
      const std::string at = ErrorOf(kValidDistill, {k.path + "=" + bound});
      if (closed) {
        EXPECT_EQ(at.find(own), std::string::npos) << k.path << "=" << bound << ": " << at;
      } else {
        EXPECT_NE(at.find(own), std::string::npos) << k.path << "=" << bound << ": " << at;
      }
      const std::string past = step(bound, integer, direction);
      const std::string beyond = ErrorOf(kValidDistill, {k.path + "=" + past});
      EXPECT_NE(beyond.find(own), std::string::npos) << k.path << "=" << past << ": " << beyond;
    }
  }
  EXPECT_GE(swept, 60);  // the schema's number keys (63 when this test was written)
}

TEST(ConfigTest, SizesAreRangeCheckedAgainstOverflow) {
  EXPECT_EQ(ErrorOf(kValidDistill, {"data.batch_size=9223372036854775807"}),
            "override \"data.batch_size=9223372036854775807\": data.batch_size: expected an "
            "integer in [1, 1048576], got \"9223372036854775807\"");
  EXPECT_NE(ErrorOf(kValidDistill, {"train.steps=1099511627777"})
                .find("train.steps: expected an integer in [1, 1099511627776]"),
            std::string::npos);
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.grad_accum=2000000"}),
            "override \"train.grad_accum=2000000\": train.grad_accum: expected an integer in [1, "
            "1048576], got \"2000000\"");
  EXPECT_EQ(ErrorOf(kValidDistill, {"train.eval_batches=2000000"}),
            "override \"train.eval_batches=2000000\": train.eval_batches: expected an integer in "
            "[1, 1048576], got \"2000000\"");
  // Each in range, the products not: tokens per micro-batch and per step.
  EXPECT_EQ(ErrorOf(kValidDistill, {"student.context_length=4096", "teacher.context_length=4096",
                                    "data.seq_len=4096", "data.batch_size=1048576"}),
            "override \"data.batch_size=1048576\": data.batch_size: expected at most 524288 "
            "(2^31 tokens per micro-batch / data.seq_len 4096), got 1048576");
  EXPECT_EQ(ErrorOf(std::string(kValidDistill) + "data: {batch_size: 65536}\n",
                    {"train.grad_accum=1048576"}),
            "override \"train.grad_accum=1048576\": train.grad_accum: expected at most 262144 "
            "(2^40 tokens per step / 4194304 tokens per micro-batch), got 1048576");
}

TEST(ConfigTest, DirectoryAsConfigIsAnError) {
  try {
    LoadConfigFile(DISTILL_CONFIGS_DIR);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string(DISTILL_CONFIGS_DIR) + ": is a directory; expected a YAML config file");
  }
}

// A stream without end (a device given as --config) is cut off with an error, not read until
// memory runs out.
TEST(ConfigTest, EndlessConfigStreamIsAConfigError) {
  try {
    LoadConfigFile("/dev/zero");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "/dev/zero: more than 16 MiB; expected a YAML config file (a few KiB)");
  }
}

// A config file without a key (empty, or comments only) is refused: it would be every key's
// default, which is not the embedded quickstart. "{}" asks for the defaults.
TEST(ConfigTest, AConfigFileWithoutKeysIsAnError) {
  const std::string path = testing::FreshTestDir("distill_config_") + "/x.yaml";
  for (const std::string text : {"", "\n\n", "# a comment only\n", "---\n"}) {
    testing::WriteBytes(path, text);
    try {
      LoadConfigFile(path);
      FAIL() << "accepted \"" << text << "\"";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()),
                path +
                    ": the file holds no keys (it is empty, or comments only); write the keys "
                    "to set in it ({} for every key's default), or leave --config out to run "
                    "the embedded quickstart")
          << text;
    }
  }
  testing::WriteBytes(path, "{}\n");
  EXPECT_NO_THROW(LoadConfigFile(path, {"train.mode=pretrain"}));
  RemoveTree(std::filesystem::path(path).parent_path().string());
}

// A NUL byte (a write cut short by a crash): yaml-cpp reads it as an escape, which gave an error
// carrying the NUL, or another key. Refused, with the line and the offset, whether the file is
// asked for or is a run's stored config; a UTF-16 file (its zero bytes are its encoding's) reads
// as its UTF-8 twin.
TEST(ConfigTest, ANulByteInTheConfigIsAnErrorNamingItsLine) {
  const std::string path = testing::FreshTestDir("distill_config_") + "/x.yaml";
  struct Case {
    std::string text;
    int line;
    size_t byte;
  };
  const std::string keys = "train:\n  mode: pretrain\n";
  for (const Case& c : {Case{std::string(64, '\0'), 1, 0},
                        Case{keys + std::string(8, '\0') + "  steps: 3\n", 3, keys.size()},
                        Case{std::string("train: {mode: pretrain}") + '\0', 1, 23},
                        Case{"# a comment\n" + std::string(3, '\0'), 2, 12}}) {
    testing::WriteBytes(path, c.text);
    for (ConfigOrigin origin : {ConfigOrigin::kRequested, ConfigOrigin::kStored}) {
      try {
        LoadConfigFile(path, {}, origin);
        FAIL() << "accepted a NUL byte at " << c.byte;
      } catch (const ConfigError& e) {
        EXPECT_EQ(std::string(e.what()),
                  fmt::format("{}:{}: expected YAML text, got a NUL byte (at byte offset {}): "
                              "the file is damaged or not a config",
                              path, c.line, c.byte));
      }
    }
  }
  const std::string utf8 = "train:\n  mode: pretrain\n  steps: 7\n";
  std::string utf16le, utf16be, utf32be;
  for (char ch : utf8) {
    utf16le += std::string{ch, '\0'};
    utf16be += std::string{'\0', ch};
    utf32be += std::string{'\0', '\0', '\0', ch};
  }
  for (const std::string& text : {utf16le, "\xFF\xFE" + utf16le, utf16be, utf32be}) {
    testing::WriteBytes(path, text);
    EXPECT_EQ(ConfigToYaml(LoadConfigFile(path)), ConfigToYaml(ParseConfig(utf8, "utf8.yaml")))
        << text.size();
  }
  RemoveTree(std::filesystem::path(path).parent_path().string());
}

TEST(ConfigTest, MissingFileIsAConfigError) {
  try {
    LoadConfigFile("/nonexistent/x.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/x.yaml: no such file; expected a YAML config file");
  }
}

}  // namespace
}  // namespace distill

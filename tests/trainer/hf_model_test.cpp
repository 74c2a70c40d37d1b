// The llama family against Hugging Face transformers: the fixtures' logits (tiny random models
// made by scripts/make_hf_fixtures.py), export round trips (C++ and transformers), the padded
// vocabulary of different widths, and the real SmolLM2-135M when the set-up prepared it.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "distill/hf_config.h"
#include "distill/hf_export.h"
#include "distill/loss.h"
#include "distill/run.h"
#include "distill/run_dir.h"
#include "distill/safetensors.h"
#include "distill/trainer.h"
#include "test_files.h"
#include "test_util.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadBytes;
using testing::TempRunDir;
using testing::WriteBytes;

const std::string kFixtures = DISTILL_FIXTURES_DIR;
const std::vector<std::string> kFixtureNames = {
    "llama_gqa_rope3", "llama_untied_mha", "mistral",   "qwen2_teacher",
    "qwen2_student",   "qwen3_qknorm",     "gpt2_tanh", "gpt2_erf_untied"};

std::string Fixture(const std::string& name) { return kFixtures + "/" + name; }

ModelConfig HfModelConfig(const std::string& dir) {
  ModelConfig c;
  c.hf_dir = dir;
  ReadHfConfig(dir, c);
  return c;
}

// max |a - b| / max(1, max |b|) over the finite entries; NaN/inf must sit in the same places.
double RelativeMaxDiff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_TRUE(at::equal(at::isfinite(a), at::isfinite(b)));
  const at::Tensor finite = at::isfinite(b);
  const double diff = (a - b).masked_select(finite).abs().max().item<double>();
  const double scale = std::max(1.0, b.masked_select(finite).abs().max().item<double>());
  return diff / scale;
}

// Runs scripts/hf_logits.py: transformers loads `hf_dir` and checks the logits in `check_file`.
// Returns the exit status (0: equal within 1e-4 relative to the logits' scale).
int TransformersCheck(const std::string& hf_dir, const std::string& check_file) {
  const std::string cmd = fmt::format("'{}' '{}/hf_logits.py' --hf-dir '{}' --check '{}'",
                                      LOSSFNS_PYTHON, DISTILL_SCRIPTS_DIR, hf_dir, check_file);
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool PythonHasTransformers() {
  if (std::string(LOSSFNS_PYTHON).empty()) return false;
  const std::string cmd =
      fmt::format("'{}' -c 'import transformers, safetensors' >/dev/null 2>&1", LOSSFNS_PYTHON);
  return std::system(cmd.c_str()) == 0;
}

// fp32 on CPU: the same arithmetic as transformers' modeling code in the same order up to the
// matmul kernels' summation order, so the logits agree to ~1e-6 of their scale; 1e-4 leaves room
// for other BLAS builds and is still far below any mapping error (a wrong RoPE layout or a
// missing bias moves logits by O(1) of their scale).
constexpr double kLogitsTolerance = 1e-4;

TEST(HfModel, ForwardMatchesTransformersLogits) {
  for (const auto& name : kFixtureNames) {
    SCOPED_TRACE(name);
    const ModelConfig config = HfModelConfig(Fixture(name));
    Model model = BuildModel(config, "", at::Device(at::kCPU));
    model->eval();
    SafetensorsFile expected(Fixture(name) + "/expected.safetensors");
    const at::Tensor ids = expected.Tensor("input_ids", at::kLong);
    const at::Tensor ref = expected.Tensor("logits", at::kFloat);
    torch::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(ids);
    ASSERT_EQ(logits.sizes(), ref.sizes());
    EXPECT_LE(RelativeMaxDiff(logits, ref), kLogitsTolerance);
  }
}

TEST(HfModel, ConfigDecidesTheArchitecture) {
  const ModelConfig rope3 = HfModelConfig(Fixture("llama_gqa_rope3"));
  EXPECT_EQ(rope3.family, ModelFamily::kLlama);
  EXPECT_EQ(rope3.rope_scaling.type, "llama3");
  EXPECT_LT(rope3.kv_heads(), rope3.n_head);
  EXPECT_TRUE(rope3.tie_embeddings);
  const ModelConfig qwen2 = HfModelConfig(Fixture("qwen2_teacher"));
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.attention_out_bias);
  const ModelConfig qwen3 = HfModelConfig(Fixture("qwen3_qknorm"));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_NE(qwen3.head_size() * qwen3.n_head, qwen3.d_model);
  const ModelConfig gpt2 = HfModelConfig(Fixture("gpt2_tanh"));
  EXPECT_EQ(gpt2.family, ModelFamily::kGpt);
  EXPECT_EQ(gpt2.activation, Activation::kGeluTanh);
  EXPECT_EQ(gpt2.mlp_width(), 4 * gpt2.d_model);  // n_inner null
  EXPECT_TRUE(gpt2.tie_embeddings);
  EXPECT_EQ(gpt2.padded_vocab_size(), 96);
  const ModelConfig gpt2_untied = HfModelConfig(Fixture("gpt2_erf_untied"));
  EXPECT_EQ(gpt2_untied.activation, Activation::kGelu);
  EXPECT_EQ(gpt2_untied.mlp_width(), 48);
  EXPECT_FALSE(gpt2_untied.tie_embeddings);
}

// The original GPT-2 repositories hold a bare GPT2Model's tensors ("wte.weight", with the
// attention's causal-mask buffers); gpt2_tanh is written that way. A file that mixes in a tensor
// the model lacks is still refused by name.
TEST(HfModel, Gpt2FilesOfTheBareBaseModelLoad) {
  SafetensorsFile file(Fixture("gpt2_tanh") + "/model.safetensors");
  EXPECT_TRUE(file.contains("wte.weight"));
  EXPECT_TRUE(file.contains("h.0.attn.bias"));
  EXPECT_FALSE(file.contains("transformer.wte.weight"));
  const std::string dir = TempRunDir();
  fs::create_directories(dir);
  fs::copy_file(Fixture("gpt2_tanh") + "/config.json", dir + "/config.json");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : file.names())
    tensors.emplace_back(name, file.Tensor(name, at::kFloat));
  tensors.emplace_back("h.0.mlp.c_gate.weight", at::zeros({2, 2}));
  WriteSafetensors(dir + "/model.safetensors", tensors);
  EXPECT_THAT([&] { BuildModel(HfModelConfig(dir), "", at::Device(at::kCPU)); },
              ::testing::ThrowsMessage<WeightsError>(::testing::AllOf(
                  HasSubstr("h.0.mlp.c_gate.weight"), HasSubstr("unexpected tensor"))));
}

// The llama family's bare base model (LlamaModel, Qwen2Model: "embed_tokens.weight" without the
// "model." prefix, no lm_head) loads as transformers loads it into a tied CausalLM: the same
// logits as the full file's.
TEST(HfModel, LlamaFilesOfTheBareBaseModelLoad) {
  SafetensorsFile file(Fixture("llama_gqa_rope3") + "/model.safetensors");
  ASSERT_TRUE(file.contains("model.embed_tokens.weight"));
  ASSERT_FALSE(file.contains("lm_head.weight"));
  const std::string dir = TempRunDir();
  fs::create_directories(dir);
  fs::copy_file(Fixture("llama_gqa_rope3") + "/config.json", dir + "/config.json");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : file.names()) {
    ASSERT_EQ(name.rfind("model.", 0), 0u) << name;
    tensors.emplace_back(name.substr(6), file.Tensor(name, at::kFloat));
  }
  WriteSafetensors(dir + "/model.safetensors", tensors);
  torch::NoGradGuard no_grad;
  Model full = BuildModel(HfModelConfig(Fixture("llama_gqa_rope3")), "", at::Device(at::kCPU));
  Model bare = BuildModel(HfModelConfig(dir), "", at::Device(at::kCPU));
  full->eval();
  bare->eval();
  const at::Tensor ids = at::randint(0, 64, {1, 8}, at::kLong);
  EXPECT_TRUE(at::equal(bare->forward(ids), full->forward(ids)));
}

// A tied model's file may keep the lm_head as a copy of the embedding (transformers then ties
// them); a copy that differs is refused, naming the tensor and the fix: transformers would load
// the two untied, and the trainer's tied module would be another model than the directory's.
TEST(HfModel, ATiedLmHeadInTheFilesMustBeACopyOfTheEmbedding) {
  for (const auto& [fixture, embedding] : std::vector<std::pair<std::string, std::string>>{
           {"llama_gqa_rope3", "model.embed_tokens.weight"}, {"gpt2_tanh", "wte.weight"}}) {
    SCOPED_TRACE(fixture);
    SafetensorsFile file(Fixture(fixture) + "/model.safetensors");
    ASSERT_TRUE(file.contains(embedding));
    ASSERT_FALSE(file.contains("lm_head.weight"));
    const at::Tensor ids = at::randint(0, 64, {1, 8}, at::kLong);
    torch::NoGradGuard no_grad;
    Model original = BuildModel(HfModelConfig(Fixture(fixture)), "", at::Device(at::kCPU));
    original->eval();  // no dropout
    const at::Tensor expected = original->forward(ids);
    for (bool differ : {false, true}) {
      const std::string dir = TempRunDir();
      fs::create_directories(dir);
      fs::copy_file(Fixture(fixture) + "/config.json", dir + "/config.json");
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      for (const std::string& name : file.names())
        tensors.emplace_back(name, file.Tensor(name, at::kFloat));
      at::Tensor head = file.Tensor(embedding, at::kFloat).clone();
      if (differ) head[3][1] += 1.0;
      tensors.emplace_back("lm_head.weight", head);
      WriteSafetensors(dir + "/model.safetensors", tensors);
      if (!differ) {
        Model model = BuildModel(HfModelConfig(dir), "", at::Device(at::kCPU));
        model->eval();
        EXPECT_TRUE(at::equal(model->forward(ids), expected));
        continue;
      }
      EXPECT_THAT([&] { BuildModel(HfModelConfig(dir), "", at::Device(at::kCPU)); },
                  ::testing::ThrowsMessage<WeightsError>(::testing::AllOf(
                      HasSubstr(dir + "/model.safetensors: tensor \"lm_head.weight\""),
                      HasSubstr("expected a copy of \"" + embedding + "\", got 1 of"),
                      HasSubstr("\"tie_word_embeddings\": false"))));
    }
  }
}

// The docs' generation command on an export without tokenizer files (a run that never exported,
// a gpt-family export) says what to pass, in one line and exit status 2, not a traceback.
TEST(HfModel, GeneratingWithoutTokenizerFilesSaysWhatToPass) {
  if (!PythonHasTransformers()) GTEST_SKIP() << "no python with transformers (LOSSFNS_PYTHON)";
  const std::string cmd =
      fmt::format("'{}' '{}/hf_logits.py' --hf-dir '{}' --generate 'To be' 2>&1", LOSSFNS_PYTHON,
                  DISTILL_SCRIPTS_DIR, Fixture("llama_gqa_rope3"));
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_THAT(output, ::testing::HasSubstr("hf_logits: error: no tokenizer files in " +
                                           Fixture("llama_gqa_rope3")));
  EXPECT_THAT(output, ::testing::HasSubstr("takes --tokenizer-dir DIR"));
  EXPECT_THAT(output, ::testing::Not(::testing::HasSubstr("Traceback")));
}

TEST(HfModel, ExportReloadsBitIdenticalAndInTransformers) {
  const bool python = PythonHasTransformers();
  for (const auto& name : kFixtureNames) {
    SCOPED_TRACE(name);
    const std::string out = TempRunDir("_" + name);
    const ModelConfig config = HfModelConfig(Fixture(name));
    Model model = BuildModel(config, "", at::Device(at::kCPU));
    // Move the weights away from the fixture's, so the check is of the export, not the fixture.
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(0.01 * at::randn_like(p));
    }
    Config run;
    run.student = StudentConfig();
    SetArchitecture(run.student, config);
    ExportHf(*model, out, ExportSources(run), /*replace=*/false);
    EXPECT_TRUE(fs::exists(out + "/config.json"));
    EXPECT_FALSE(fs::exists(out + ".tmp-" + std::to_string(::getpid())));

    ModelConfig again = HfModelConfig(out);
    EXPECT_EQ(ArchitectureString(again), ArchitectureString(config));
    Model reloaded = BuildModel(again, "", at::Device(at::kCPU));
    auto want = model->named_parameters();
    for (const auto& p : reloaded->named_parameters()) {
      EXPECT_TRUE(at::equal(p.value(), want[p.key()])) << p.key();
    }
    // An existing directory is never overwritten by a plain export, also named "<dir>/.".
    EXPECT_THAT([&] { ExportHf(*model, out, {}, false); },
                ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("already exists")));
    EXPECT_THAT([&] { ExportHf(*model, out + "/.", {}, false); },
                ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("already exists")));
    // A new one named so is the directory itself (its rename failed with "Device or resource
    // busy").
    RemoveTree(out + "-dot");
    ExportHf(*model, out + "-dot/.", ExportSources(run), /*replace=*/false);
    EXPECT_TRUE(fs::exists(out + "-dot/config.json"));
    RemoveTree(out + "-dot");

    if (!python) continue;
    model->eval();
    SafetensorsFile expected(Fixture(name) + "/expected.safetensors");
    const at::Tensor ids = expected.Tensor("input_ids", at::kLong);
    torch::NoGradGuard no_grad;
    WriteSafetensors(out + "-check.safetensors",
                     {{"input_ids", ids}, {"logits", model->forward(ids)}});
    EXPECT_EQ(TransformersCheck(out, out + "-check.safetensors"), 0);
  }
  if (!python) GTEST_SKIP() << "no python with transformers (LOSSFNS_PYTHON): C++ round trip only";
}

// A random-init llama whose vocabulary was padded (pad_vocab_to_multiple_of) exports its real rows
// only: config.json's vocab_size is the real one, and the logits agree on the real columns.
// A one-layer random llama of `vocab` tokens (untied embeddings).
ModelConfig TinyLlama(int64_t vocab) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = vocab;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.d_model = 16;
  c.intermediate_size = 24;
  c.context_length = 32;
  c.tie_embeddings = false;
  return c;
}

TEST(HfModel, PaddedRandomLlamaExportsItsRealVocabulary) {
  ModelConfig c = TinyLlama(50);
  c.pad_vocab_to_multiple_of = 16;  // 64 rows
  Model model = MakeModel(c);
  model->eval();
  const std::string out = TempRunDir();
  ExportHf(*model, out, {}, false);
  const ModelConfig again = HfModelConfig(out);
  EXPECT_EQ(again.vocab_size, 50);
  EXPECT_EQ(again.padded_vocab_size(), 50);
  Model reloaded = BuildModel(again, "", at::Device(at::kCPU));
  reloaded->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(0, 50, {2, 7}, at::kLong);
  const at::Tensor a = model->forward(ids).narrow(-1, 0, 50), b = reloaded->forward(ids);
  EXPECT_TRUE(at::allclose(a, b, 1e-6, 1e-6));
  EXPECT_TRUE(model->forward(ids).narrow(-1, 50, 14).isneginf().all().item<bool>());
}

// An export that fails leaves nothing behind, not even the missing directories above its target
// that it would have created (here a student the template's model_type cannot hold: qk-norm in
// a "llama" config.json).
TEST(HfModel, AFailedExportLeavesNoDirectoriesBehind) {
  ModelConfig c = TinyLlama(32);
  c.qk_norm = true;
  Model model = MakeModel(c);
  const std::string root = TempRunDir();
  std::filesystem::create_directories(root);
  HfExportSources sources;
  sources.config_template = Fixture("llama_gqa_rope3") + "/config.json";
  EXPECT_THAT([&] { ExportHf(*model, root + "/new/a/b", sources, false); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("qk_norm")));
  EXPECT_TRUE(std::filesystem::is_empty(root));
  // A failure once the directories exist (a tokenizer "file" that is a directory): the same.
  const std::string tokenizer = TempRunDir("_tokenizer");
  std::filesystem::create_directories(tokenizer + "/tokenizer.json");
  sources = {};
  sources.tokenizer_dir = tokenizer;
  EXPECT_THAT([&] { ExportHf(*MakeModel(TinyLlama(32)), root + "/new/a/b", sources, false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("not a regular file")));
  EXPECT_TRUE(std::filesystem::is_empty(root));
  std::filesystem::create_directories(root + "/new");  // not ours: stays
  EXPECT_ANY_THROW(ExportHf(*MakeModel(TinyLlama(32)), root + "/new/a/b", sources, false));
  EXPECT_TRUE(std::filesystem::is_directory(root + "/new"));
  EXPECT_TRUE(std::filesystem::is_empty(root + "/new"));
  // Through "..": "other/.." did not exist as a path before "other" was made, but what it names
  // did, and stays ("new", empty and not the export's).
  EXPECT_ANY_THROW(ExportHf(*MakeModel(TinyLlama(32)), root + "/other/../new/out", sources, false));
  EXPECT_TRUE(std::filesystem::is_directory(root + "/new"));
  EXPECT_FALSE(std::filesystem::exists(root + "/other"));
  // A JSON tokenizer file that does not parse (cut short) is not copied into an export that
  // would not load: the export fails, naming it, and leaves nothing.
  const std::string cut = TempRunDir("_cut");
  std::filesystem::create_directories(cut);
  WriteBytes(cut + "/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {}}})");
  WriteBytes(cut + "/tokenizer_config.json", R"({"model_max_length": 20)");
  sources.tokenizer_dir = cut;
  EXPECT_THAT([&] { ExportHf(*MakeModel(TinyLlama(32)), root + "/cut/out", sources, false); },
              ::testing::ThrowsMessage<std::runtime_error>(::testing::AllOf(
                  HasSubstr("export: " + cut + "/tokenizer_config.json is not valid JSON ("),
                  HasSubstr("export again with `distill_trainer export`"))));
  EXPECT_FALSE(std::filesystem::exists(root + "/cut"));
  // A link on the way whose target is missing (a disk not mounted) is named, as the export's
  // error, and kept.
  std::filesystem::create_symlink(root + "/unmounted", root + "/runs");
  EXPECT_THAT([&] { ExportHf(*MakeModel(TinyLlama(32)), root + "/runs/x/hf", {}, false); },
              ::testing::ThrowsMessage<std::runtime_error>(::testing::StrEq(
                  "export: " + root + "/runs/x/hf: cannot create " + root + "/runs/x: " + root +
                  "/runs is a symbolic link to " + root +
                  "/unmounted, which does not exist (a disk not mounted?); create its target or "
                  "choose another path")));
  EXPECT_TRUE(std::filesystem::is_symlink(root + "/runs"));
  // A loop of links: named too (the export's own check of the way threw "cannot write").
  std::filesystem::create_symlink(root + "/loop", root + "/loop");
  EXPECT_THAT([&] { ExportHf(*MakeModel(TinyLlama(32)), root + "/loop/x/hf", {}, false); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  HasSubstr(root + "/loop is a symbolic link to " + root +
                            "/loop, which cannot be followed: Too many levels of symbolic links")));
}

// "out/" exports to the directory "out" and leaves nothing else behind (the temporary copy used to
// go inside it, and the final rename failed moving it into itself).
TEST(HfModel, ExportToAPathWithATrailingSeparatorWritesThatDirectory) {
  Model model = MakeModel(TinyLlama(32));
  const std::string root = TempRunDir();
  std::filesystem::create_directories(root);
  const std::string out = root + "/exported";
  ExportHf(*model, out + "/", {}, false);
  EXPECT_EQ(HfModelConfig(out).vocab_size, 32);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(root))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"exported"});
  EXPECT_THAT([&] { ExportHf(*model, out + "/", {}, false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("already exists")));
  // No path, or a path under a file: errors that say so, nothing written.
  EXPECT_THAT([&] { ExportHf(*model, "", {}, false); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  HasSubstr("export: expected a directory path to create, got \"\"")));
  const std::string file = out + "/config.json";
  EXPECT_THAT([&] { ExportHf(*model, file + "/sub/x", {}, false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("export: cannot create " +
                                                                     file + "/sub/x: " + file +
                                                                     " is a file, not a "
                                                                     "directory")));
  names.clear();
  for (const auto& entry : std::filesystem::directory_iterator(out))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
}

// Replacing an export (a run's own <out_dir>/hf at its end) does not delete files the export
// does not write: that previous directory is kept beside it, and the returned warning says so.
TEST(HfModel, ReplacingAnExportKeepsAPreviousOneWithForeignFiles) {
  Model model = MakeModel(TinyLlama(32));
  const std::string root = TempRunDir();
  std::filesystem::create_directories(root);
  const std::string out = root + "/hf";
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");  // only its own files: replaced
  EXPECT_FALSE(std::filesystem::exists(out + ".previous"));
  WriteBytes(out + "/README.md", "my notes");
  const std::string warning = ExportHf(*model, out, {}, /*replace=*/true);
  EXPECT_EQ(warning, "warning: the previous " + out +
                         " held files the export does not write (README.md): it was kept as " +
                         out + ".previous");
  EXPECT_EQ(ReadBytes(out + ".previous/README.md"), "my notes");
  EXPECT_FALSE(std::filesystem::exists(out + "/README.md"));
  EXPECT_EQ(HfModelConfig(out).vocab_size, 32);
  WriteBytes(out + "/notes.txt", "more");
  EXPECT_NE(ExportHf(*model, out, {}, /*replace=*/true).find("kept as " + out + ".previous-2"),
            std::string::npos);
  // A user's file where the export goes, a link to a file, a link to an export's directory (its
  // target is not the export's to replace) and a link to nothing: each kept as it was, beside.
  const std::string other = root + "/elsewhere";
  EXPECT_EQ(ExportHf(*model, other, {}, /*replace=*/false), "");
  int n = 3;
  for (const std::string what :
       {"a file", "a link to a file", "a link to a directory", "a link to nothing"}) {
    SCOPED_TRACE(what);
    RemoveTree(out);
    if (what == "a file") {
      WriteBytes(out, "user data");
    } else {
      const std::string target = what == "a link to a file"        ? other + "/config.json"
                                 : what == "a link to a directory" ? other
                                                                   : root + "/nothing";
      std::filesystem::create_symlink(target, out);
    }
    const std::string kept = out + ".previous-" + std::to_string(n++);
    EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true),
              "warning: " + out + " was " + (what == "a file" ? "a file" : "a link") +
                  ", not an export's directory: it was kept as " + kept);
    EXPECT_TRUE(std::filesystem::is_directory(std::filesystem::symlink_status(out)));
    EXPECT_EQ(HfModelConfig(out).vocab_size, 32);
    if (what == "a file") {
      EXPECT_EQ(ReadBytes(kept), "user data");
    } else {
      EXPECT_TRUE(std::filesystem::is_symlink(kept));
    }
  }
  EXPECT_EQ(HfModelConfig(other).vocab_size, 32);  // a link's target untouched
}

// What an export killed before left (another process id) is recovered by the run's next export:
// the previous export it had moved aside is put back (and, holding a user's file, kept as
// .previous when the new export replaces it), its temporary deleted; a temporary holding a file
// the export does not write, or without the export's marker, is left alone.
TEST(HfModel, TheRunsExportRecoversWhatAKilledExportLeft) {
  Model model = MakeModel(TinyLlama(32));
  const std::string root = TempRunDir();
  const std::string out = root + "/hf";
  const auto mark = [](const std::string& dir) {
    WriteBytes(dir + "/" + kExportMarker, "");  // what an export puts there
  };
  std::filesystem::create_directories(out + ".old-2000000001");
  mark(out + ".old-2000000001");
  WriteBytes(out + ".old-2000000001/config.json", "{}");
  WriteBytes(out + ".old-2000000001/README.md", "my model card");
  std::filesystem::create_directories(out + ".tmp-2000000001");
  mark(out + ".tmp-2000000001");
  WriteBytes(out + ".tmp-2000000001/config.json", "{}");
  WriteBytes(out + ".tmp-2000000001/model.safetensors.tmp.2000000001",
             "half a model");  // killed mid-write
  std::filesystem::create_directories(out + ".tmp-2000000002");
  mark(out + ".tmp-2000000002");
  WriteBytes(out + ".tmp-2000000002/notes.txt", "not the export's");
  const std::string warnings = ExportHf(*model, out, {}, /*replace=*/true);
  EXPECT_THAT(warnings, HasSubstr("warning: " + out +
                                  ".old-2000000001 was left by an export that was stopped; it is " +
                                  out + " again\n"));
  EXPECT_THAT(warnings, HasSubstr("it was kept as " + out + ".previous"));
  EXPECT_EQ(ReadBytes(out + ".previous/README.md"), "my model card");
  EXPECT_FALSE(std::filesystem::exists(out + ".previous/" + kExportMarker));
  EXPECT_FALSE(std::filesystem::exists(out + "/" + kExportMarker));  // never shipped
  EXPECT_EQ(HfModelConfig(out).vocab_size, 32);
  EXPECT_FALSE(std::filesystem::exists(out + ".old-2000000001"));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp-2000000001"));
  EXPECT_EQ(ReadBytes(out + ".tmp-2000000002/notes.txt"), "not the export's");
  // A directory that only looks like one (no process id): a user's, left alone.
  std::filesystem::create_directories(out + ".old-before-lr-change");
  WriteBytes(out + ".old-before-lr-change/config.json", "{}");
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");
  EXPECT_EQ(ReadBytes(out + ".old-before-lr-change/config.json"), "{}");
  // One of a process that still runs (`distill_trainer export` into this path): left alone.
  const std::string live = out + ".tmp-" + std::to_string(::getppid());
  std::filesystem::create_directories(live);
  WriteBytes(live + "/config.json", "{}");
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");
  EXPECT_TRUE(std::filesystem::exists(live + "/config.json"));
  RemoveTree(live);

  // What stood at the target and was moved aside, a user's file or a link (to nothing here), left
  // by an export killed before its new copy was in place: kept as hf.previous-N, with a warning.
  WriteBytes(out + ".old-2000000004", "user data");
  std::filesystem::create_symlink(root + "/nothing", out + ".old-2000000005");
  const std::string moved = ExportHf(*model, out, {}, /*replace=*/true);
  EXPECT_THAT(moved, HasSubstr("warning: " + out +
                               ".old-2000000004 (a file, left by an export that was stopped) was "
                               "kept as " +
                               out + ".previous-2\n"));
  EXPECT_THAT(moved, HasSubstr("warning: " + out +
                               ".old-2000000005 (a link, left by an export that was stopped) was "
                               "kept as " +
                               out + ".previous-3"));
  EXPECT_EQ(ReadBytes(out + ".previous-2"), "user data");
  EXPECT_TRUE(std::filesystem::is_symlink(out + ".previous-3"));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(out + ".old-2000000005")));

  // Killed after the new export was in place: the old copy, only export files, is deleted.
  std::filesystem::create_directories(out + ".old-2000000003");
  mark(out + ".old-2000000003");
  WriteBytes(out + ".old-2000000003/config.json", "{}");
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");
  EXPECT_FALSE(std::filesystem::exists(out + ".old-2000000003"));
  // One no export moved there (a user's directory merely named so): kept, never deleted.
  std::filesystem::create_directories(out + ".old-2000000006");
  WriteBytes(out + ".old-2000000006/config.json", "my own");
  EXPECT_THAT(ExportHf(*model, out, {}, /*replace=*/true),
              HasSubstr("warning: " + out +
                        ".old-2000000006 (named like an export's previous copy) was not moved "
                        "there by an export: it was kept as " +
                        out + ".previous-4"));
  EXPECT_EQ(ReadBytes(out + ".previous-4/config.json"), "my own");
  // Left by an earlier process with this process's id (a container's pid 1 at every start): an
  // old copy in the way of this export's own .old-<pid> is tidied first, not renamed onto.
  const std::string own_old = out + ".old-" + std::to_string(::getpid());
  std::filesystem::create_directories(own_old);
  mark(own_old);
  WriteBytes(own_old + "/config.json", "{}");
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");
  EXPECT_FALSE(std::filesystem::exists(own_old));
  // `distill_trainer export` (replace=false): its own stopped export's temporary is tidied too
  // (no .old- copies: it never replaces), not one of a process that still runs.
  std::filesystem::create_directories(root + "/x.tmp-2000000004");
  mark(root + "/x.tmp-2000000004");
  WriteBytes(root + "/x.tmp-2000000004/model.safetensors.tmp.2000000004", "half");
  const std::string running = root + "/x.tmp-" + std::to_string(::getppid());
  std::filesystem::create_directories(running);
  EXPECT_EQ(ExportHf(*model, root + "/x", {}, /*replace=*/false), "");
  EXPECT_FALSE(std::filesystem::exists(root + "/x.tmp-2000000004"));
  EXPECT_TRUE(std::filesystem::exists(running));
}

// A directory merely named like an export's temporary (no marker: an export never wrote it) is
// never deleted: not one of a process gone, nor one with this very process id, which is in the
// export's way and refused, naming it.
TEST(HfModel, AnExportNeverDeletesADirectoryNamedLikeItsTemporary) {
  Model model = MakeModel(TinyLlama(32));
  const std::string root = TempRunDir();
  const std::string gone = root + "/out.tmp-2000000007";
  std::filesystem::create_directories(gone);
  WriteBytes(gone + "/config.json", "{\"my\": \"own\"}");
  EXPECT_EQ(ExportHf(*model, root + "/out", {}, /*replace=*/false), "");
  EXPECT_EQ(ReadBytes(gone + "/config.json"), "{\"my\": \"own\"}");
  EXPECT_EQ(HfModelConfig(root + "/out").vocab_size, 32);

  const std::string own = root + "/mine.tmp-" + std::to_string(::getpid());
  std::filesystem::create_directories(own + "/photos");
  WriteBytes(own + "/photos/a.jpg", "x");
  EXPECT_THAT([&] { ExportHf(*model, root + "/mine", {}, /*replace=*/false); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  HasSubstr("export: " + own +
                            " is in the way of the export's temporary directory and has no export "
                            "marker (not one an export left, or left by an older distill_trainer); "
                            "move it away and export again")));
  EXPECT_EQ(ReadBytes(own + "/photos/a.jpg"), "x");
  EXPECT_FALSE(std::filesystem::exists(root + "/mine"));
  // The same name holding only export files, unmarked: still not the export's.
  RemoveTree(own);
  std::filesystem::create_directories(own);
  WriteBytes(own + "/config.json", "{}");
  EXPECT_THROW(ExportHf(*model, root + "/mine", {}, /*replace=*/false), std::runtime_error);
  EXPECT_EQ(ReadBytes(own + "/config.json"), "{}");
  RemoveTree(own);
  // `distill_trainer export` moves nothing aside: a folder named like its previous copy, with
  // this process's id, is not its own to delete or move.
  const std::string own_old = root + "/mine.old-" + std::to_string(::getpid());
  std::filesystem::create_directories(own_old);
  WriteBytes(own_old + "/config.json", "{}");
  EXPECT_EQ(ExportHf(*model, root + "/mine", {}, /*replace=*/false), "");
  EXPECT_EQ(ReadBytes(own_old + "/config.json"), "{}");
  EXPECT_FALSE(std::filesystem::exists(root + "/mine.previous"));

  // The run's own export (replace): a previous copy no export moved aside, where no export is in
  // place, is kept as .previous, not put in the export's place (where it would be replaced).
  const std::string run_hf = root + "/run/hf";
  std::filesystem::create_directories(run_hf + ".old-2000000008");
  WriteBytes(run_hf + ".old-2000000008/config.json", "my own");
  EXPECT_EQ(ExportHf(*model, run_hf, {}, /*replace=*/true),
            "warning: " + run_hf +
                ".old-2000000008 (named like an export's previous copy) was not moved there by an "
                "export: it was kept as " +
                run_hf + ".previous");
  EXPECT_EQ(ReadBytes(run_hf + ".previous/config.json"), "my own");
  EXPECT_EQ(HfModelConfig(run_hf).vocab_size, 32);
}

// What a kill at any point of an export leaves is tidied by the next export: a temporary stopped
// before its marker (empty) or only marked; an export killed after its rename (the marker still
// in it) beside its marked previous copy; a previous copy whose deletion stopped before its rmdir.
TEST(HfModel, AnExportKilledAtAnyPointIsTidiedByTheNext) {
  Model model = MakeModel(TinyLlama(32));
  const std::string root = TempRunDir();
  const std::string out = root + "/hf";
  std::filesystem::create_directories(out + ".tmp-2000000011");
  std::filesystem::create_directories(out + ".tmp-2000000012");
  WriteBytes(out + ".tmp-2000000012/" + kExportMarker, "");
  std::filesystem::create_directories(out);
  WriteBytes(out + "/config.json", "{}");
  WriteBytes(out + "/" + kExportMarker, "");
  std::filesystem::create_directories(out + ".old-2000000013");
  WriteBytes(out + ".old-2000000013/config.json", "{}");
  WriteBytes(out + ".old-2000000013/" + kExportMarker, "");
  std::filesystem::create_directories(out + ".old-2000000014");  // deleted but for its rmdir
  EXPECT_EQ(ExportHf(*model, out, {}, /*replace=*/true), "");
  for (const char* left : {".tmp-2000000011", ".tmp-2000000012", ".old-2000000013",
                           ".old-2000000014", ".previous", "/.distill_trainer_export"}) {
    EXPECT_FALSE(std::filesystem::exists(out + left)) << left;
  }
  EXPECT_EQ(HfModelConfig(out).vocab_size, 32);
}

// A relative hf_dir that is not found is reported with the working directory it was looked up
// from (the export may run elsewhere than the run did), not as deleted.
TEST(HfModel, ARelativeHfDirNotFoundNamesTheWorkingDirectory) {
  const std::string run = TempRunDir();
  std::filesystem::create_directories(run);
  Config c;
  c.teacher.hf_dir = "models/not-here-smollm2";
  const HfExportSources sources = ExportSources(c, run);
  EXPECT_THAT(sources.note,
              HasSubstr("warning: models/not-here-smollm2/config.json is not found from the "
                        "working directory " +
                        std::filesystem::current_path().string() +
                        " (a relative path: moved or deleted since the run, or the run was "
                        "started in another directory), and the run has no export of its own"));
}

// The tokenizer files come from the first hf_dir with a tokenizer: a SentencePiece
// tokenizer.model alone (older Llama and Mistral repositories) counts.
TEST(HfModel, ExportTakesTokenizerFilesWithoutATokenizerJson) {
  const std::string dir = TempRunDir();
  std::filesystem::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(Fixture("llama_gqa_rope3") + "/" + name, dir + "/" + name);
  }
  WriteBytes(dir + "/tokenizer.model", "sentencepiece");
  WriteBytes(dir + "/generation_config.json", "{}");
  Config c;
  c.teacher.hf_dir = dir;
  EXPECT_EQ(ExportSources(c).tokenizer_dir, dir);
  // A student directory with generation_config.json but no tokenizer (save_pretrained of a model
  // alone) is passed over for the teacher's.
  const std::string student = dir + "-student";
  std::filesystem::create_directories(student);
  WriteBytes(student + "/generation_config.json", "{}");
  c.student.hf_dir = student;
  EXPECT_EQ(ExportSources(c).tokenizer_dir, dir);
  c.student.hf_dir = "";
  Model model = MakeModel(HfModelConfig(dir));
  const std::string out = dir + "-exported";
  ExportHf(*model, out, ExportSources(c), /*replace=*/false);
  EXPECT_EQ(ReadBytes(out + "/tokenizer.model"), "sentencepiece");
  EXPECT_EQ(ReadBytes(out + "/generation_config.json"), "{}");
  // GPT-2's older repositories: vocab.json and merges.txt, no tokenizer.json.
  const std::string gpt2 = dir + "-gpt2";
  std::filesystem::create_directories(gpt2);
  std::filesystem::copy_file(Fixture("gpt2_tanh") + "/config.json", gpt2 + "/config.json");
  WriteBytes(gpt2 + "/vocab.json", "{\"a\": 0}");
  WriteBytes(gpt2 + "/merges.txt", "#version: 0.2\n");
  c.teacher.hf_dir = gpt2;
  EXPECT_EQ(ExportSources(c).tokenizer_dir, gpt2);
  ExportHf(*model, out + "-gpt2", ExportSources(c), /*replace=*/false);
  EXPECT_EQ(ReadBytes(out + "-gpt2/merges.txt"), "#version: 0.2\n");
  EXPECT_EQ(ExportSources(c).note, "");
  // A tokenizer file that links to nothing is left out, and the sources' note says which (the
  // trainer refuses it at start-up; `distill_trainer export` prints the note).
  std::filesystem::create_symlink(gpt2 + "/gone.txt", gpt2 + "/tokenizer_config.json");
  EXPECT_EQ(ExportSources(c).note,
            "warning: the export has no copy of \"" + gpt2 +
                "/tokenizer_config.json\" (a link to \"" + gpt2 +
                "/gone.txt\"): links that lead to no file (a Hugging Face cache whose files "
                "were deleted?); restore them, e.g. by downloading the model again, and export "
                "again with `distill_trainer export`");
  ExportHf(*model, out + "-dangling", ExportSources(c), /*replace=*/false);
  EXPECT_EQ(ReadBytes(out + "-dangling/merges.txt"), "#version: 0.2\n");
  EXPECT_FALSE(std::filesystem::exists(
      std::filesystem::symlink_status(out + "-dangling/tokenizer_config.json")));
  std::filesystem::remove(gpt2 + "/tokenizer_config.json");
  // A tokenizer file that is a FIFO or a device is refused, not copied (a FIFO blocked the export
  // for ever, /dev/zero filled the disk), and the export leaves nothing behind.
  std::filesystem::remove(gpt2 + "/merges.txt");
  ASSERT_EQ(::mkfifo((gpt2 + "/merges.txt").c_str(), 0600), 0);
  EXPECT_THAT([&] { ExportHf(*model, out + "-fifo", ExportSources(c), /*replace=*/false); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  HasSubstr("export: " + gpt2 + "/merges.txt: not a regular file")));
  std::filesystem::remove(gpt2 + "/merges.txt");
  std::filesystem::create_symlink("/dev/zero", gpt2 + "/merges.txt");
  EXPECT_THAT([&] { ExportHf(*model, out + "-zero", ExportSources(c), /*replace=*/false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("not a regular file")));
  EXPECT_FALSE(std::filesystem::exists(out + "-fifo"));
  EXPECT_FALSE(std::filesystem::exists(out + "-fifo.tmp-" + std::to_string(::getpid())));
  EXPECT_FALSE(std::filesystem::exists(out + "-zero"));
  EXPECT_FALSE(std::filesystem::exists(out + "-zero.tmp-" + std::to_string(::getpid())));
}

// The GPT-2 fixtures tell the two GELUs apart: the other one's logits miss transformers' by more
// than the tolerance (what ForwardMatchesTransformersLogits would report), the architecture
// strings differ, and an exact-GELU gpt keeps the string earlier versions wrote.
TEST(HfModel, TheGpt2FixturesTellTheTwoGelusApart) {
  for (const char* name : {"gpt2_tanh", "gpt2_erf_untied"}) {
    SCOPED_TRACE(name);
    ModelConfig config = HfModelConfig(Fixture(name));
    config.activation =
        config.activation == Activation::kGelu ? Activation::kGeluTanh : Activation::kGelu;
    Model model = BuildModel(config, "", at::Device(at::kCPU));
    model->eval();
    SafetensorsFile expected(Fixture(name) + "/expected.safetensors");
    torch::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(expected.Tensor("input_ids", at::kLong));
    EXPECT_GT(RelativeMaxDiff(logits, expected.Tensor("logits", at::kFloat)), kLogitsTolerance);
  }
  ModelConfig gpt;
  EXPECT_EQ(ArchitectureString(gpt).find("activation"), std::string::npos);
  EXPECT_EQ(ArchitectureString(gpt),
            "vocab_size=64 padded_vocab_size=64 context_length=128 n_layer=2 n_head=4 d_model=64 "
            "mlp_ratio=4 tie_embeddings=true");
  gpt.activation = Activation::kGeluTanh;
  EXPECT_THAT(ArchitectureString(gpt), HasSubstr(" activation=gelu_tanh"));
}

// Dropout is a training choice: a key set in the YAML or an override is kept for an hf_dir
// model (it was replaced by config.json's attention_dropout without a word); unset, config.json's.
TEST(HfModel, DropoutSetForAnHfDirModelIsKept) {
  const std::string dir = Fixture("llama_gqa_rope3");
  const std::string yaml = fmt::format(
      "train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\ndata:\n  seq_len: 8\n  min_seq_len: 8\n",
      dir);
  EXPECT_DOUBLE_EQ(ParseConfig(yaml, "x.yaml", {"student.dropout=0.125"}).student.dropout, 0.125);
  EXPECT_DOUBLE_EQ(ParseConfig(yaml, "x.yaml").student.dropout, HfModelConfig(dir).dropout);
}

// A gpt-family model exports as transformers' GPT2LMHeadModel (exact GELU, its Conv1D weights
// transposed, padded vocabulary rows dropped), tied and untied, with the trainer's logits.
TEST(HfModel, GptModelExportsAsGpt2LMHeadModel) {
  const bool python = PythonHasTransformers();
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied, exact GELU" : "untied, tanh GELU");
    ModelConfig gpt;
    gpt.vocab_size = 100;  // padded to 128
    gpt.d_model = 32;
    gpt.n_head = 4;
    gpt.n_layer = 2;
    gpt.mlp_ratio = 3.0;  // n_inner 96, not GPT-2's default 4 * n_embd
    gpt.context_length = 24;
    gpt.tie_embeddings = tied;
    gpt.activation = tied ? Activation::kGelu : Activation::kGeluTanh;
    Model model = MakeModel(gpt);
    {  // every parameter away from its initial value (biases 0, LayerNorm gains 1)
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(0.05 * at::randn_like(p));
    }
    const std::string out = TempRunDir(tied ? "_tied" : "_untied");
    ExportHf(*model, out, {}, /*replace=*/false);
    const std::string json = ReadBytes(out + "/config.json");
    for (const char* key :
         {"\"model_type\": \"gpt2\"", "\"vocab_size\": 100", "\"n_inner\": 96",
          "\"n_positions\": 24", "\"bos_token_id\": null", "\"eos_token_id\": null"}) {
      EXPECT_THAT(json, HasSubstr(key));
    }
    EXPECT_THAT(json, HasSubstr(tied ? "\"activation_function\": \"gelu\""
                                     : "\"activation_function\": \"gelu_new\""));
    {  // read back: the same architecture (the real vocabulary, unpadded) and the same logits
      const ModelConfig again = HfModelConfig(out);
      EXPECT_EQ(again.activation, gpt.activation);
      EXPECT_EQ(again.mlp_width(), 96);
      Model reloaded = BuildModel(again, "", at::Device(at::kCPU));
      model->eval();
      reloaded->eval();
      torch::NoGradGuard no_grad;
      const at::Tensor ids = at::randint(0, 100, {2, 24}, at::kLong);
      EXPECT_TRUE(
          at::allclose(reloaded->forward(ids), model->forward(ids).narrow(2, 0, 100), 1e-5, 1e-5));
    }
    EXPECT_THAT(
        json, HasSubstr(tied ? "\"tie_word_embeddings\": true" : "\"tie_word_embeddings\": false"));
    SafetensorsFile weights(out + "/model.safetensors");
    EXPECT_EQ(weights.Tensor("transformer.wte.weight", at::kFloat).size(0), 100);
    EXPECT_TRUE(at::equal(weights.Tensor("transformer.h.1.attn.c_attn.weight", at::kFloat),
                          model->named_parameters()["blocks.1.qkv.weight"].t()));
    if (!python) continue;
    model->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor ids = at::randint(0, 100, {2, 24}, at::kLong);
    WriteSafetensors(out + "-check.safetensors",
                     {{"input_ids", ids}, {"logits", model->forward(ids).narrow(2, 0, 100)}});
    EXPECT_EQ(TransformersCheck(out, out + "-check.safetensors"), 0);
  }
  if (!python) GTEST_SKIP() << "no python with transformers (LOSSFNS_PYTHON): C++ side only";
}

// config.json's values go into the run's config.yaml, so they must be values its keys accept: one
// past a key's range (max_position_embeddings 2^31, rope_theta 1) trained, and then the run could
// be neither resumed nor exported. Refused at the start, naming the file and the key.
TEST(HfModel, ConfigJsonValuesOutsideTheKeysRangesAreRefused) {
  const std::string original = ReadBytes(Fixture("llama_gqa_rope3") + "/config.json");
  const struct {
    const char* hf_key;
    const char* value;
    const char* message;
  } cases[] = {
      {"max_position_embeddings", "2147483648",
       "student.context_length: expected an integer in [1, 16777216], got 2147483648"},
      {"rope_theta", "1.0", "student.rope_theta: expected a number in (1, 1000000000000), got 1"},
      {"rms_norm_eps", "2.0", "student.norm_eps: expected a number in (0, 1), got 2"},
      {"vocab_size", "9223372036854775807", "student.vocab_size: expected an integer in [2, "},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.hf_key);
    const std::string dir = TempRunDir(std::string("-") + c.hf_key);
    fs::create_directories(dir);
    const std::string key = fmt::format("\"{}\":", c.hf_key);
    const size_t at = original.find(key);
    ASSERT_NE(at, std::string::npos);
    const size_t end = original.find_first_of(",}", at);
    WriteBytes(dir + "/config.json",
               original.substr(0, at) + key + " " + c.value + original.substr(end));
    try {
      ParseConfig(fmt::format("train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\n", dir), "x.yaml");
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr(dir + "/config.json: " + c.message));
    }
  }
}

// The end-of-run export copies the tokenizer of the first hf_dir that has one (here the
// teacher's): a student narrower than it (distill.vocab_size) would be exported with ids it has
// no rows for, which transformers fails on. Refused at start-up where the run exports, as a
// train.export_from tokenizer of too many ids is; a student's own tokenizer is not.
TEST(HfModel, AnExportedTokenizerWiderThanTheStudentIsRefused) {
  const std::string dir = TempRunDir("-wide-tokenizer");
  fs::create_directories(dir);
  fs::copy_file(Fixture("llama_gqa_rope3") + "/config.json", dir + "/config.json");
  const auto tokenizer = [&](int ids) {
    std::string vocab;
    for (int i = 0; i < ids; ++i) vocab += fmt::format("{}\"t{}\": {}", i ? ", " : "", i, i);
    WriteBytes(dir + "/tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {" + vocab + "}}}");
  };
  const auto yaml = [&](const std::string& more) {
    return fmt::format(
        "train:\n  mode: distill\n{}teacher:\n  hf_dir: {}\nstudent:\n  family: llama\n"
        "  vocab_size: 200\n  d_model: 32\n  n_layer: 1\n  n_head: 2\ndistill:\n"
        "  vocab_size: 200\ndata:\n  seq_len: 8\n  min_seq_len: 8\n",
        more, dir);
  };
  tokenizer(256);
  try {
    ParseConfig(yaml(""), "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("teacher.hf_dir: expected a tokenizer the exported student can "
                                    "take (at most student.vocab_size 200 token ids), got \"" +
                                    dir + "\", whose tokenizer.json has 256 ids"));
    EXPECT_THAT(e.what(), HasSubstr("(student.hf_dir has no tokenizer): the exported model would "
                                    "have no rows for ids from 200 on; give the student vocab_size "
                                    "256 or more, or set train.export_hf: false"));
  }
  EXPECT_NO_THROW(ParseConfig(yaml("  export_hf: false\n"), "x.yaml"));
  tokenizer(200);
  EXPECT_NO_THROW(ParseConfig(yaml(""), "x.yaml"));
  // A student's own tokenizer with an id past its rows (a pad token added without resizing the
  // embedding) is exported as it came: not refused.
  const std::string student = TempRunDir("-student-pad");
  fs::create_directories(student);
  fs::copy_file(Fixture("llama_gqa_rope3") + "/config.json", student + "/config.json");
  std::string vocab;
  for (int i = 0; i < 257; ++i) vocab += fmt::format("{}\"t{}\": {}", i ? ", " : "", i, i);
  WriteBytes(student + "/tokenizer.json",
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {" + vocab + "}}}");
  EXPECT_NO_THROW(ParseConfig(
      fmt::format("train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\ndata:\n  seq_len: 8\n"
                  "  min_seq_len: 8\n",
                  student),
      "x.yaml"));
}

// student.init_from_teacher starts the student as the teacher: a student.hf_dir of another
// directory (whose weights the copy was skipped for, silently) is refused, naming both; the
// teacher's own directory, however spelled, and none at all are the copy.
TEST(HfModel, InitFromTeacherRefusesAStudentDirectoryOfItsOwn) {
  const std::string teacher = Fixture("llama_gqa_rope3");
  const std::string other = TempRunDir() + "-other";
  fs::create_directories(other);
  fs::copy_file(teacher + "/config.json", other + "/config.json");
  const auto yaml = [&](const std::string& student_dir) {
    return fmt::format(
        "train:\n  mode: distill\nteacher:\n  hf_dir: {}\nstudent:\n  init_from_teacher: "
        "true\n{}data:\n  seq_len: 8\n  min_seq_len: 8\n",
        teacher, student_dir.empty() ? "" : "  hf_dir: " + student_dir + "\n");
  };
  try {
    ParseConfig(yaml(other), "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("x.yaml:7: student.hf_dir: expected \"" + teacher +
                                    "\" (= teacher.hf_dir) or none (student.init_from_teacher is "
                                    "true: the student starts as an exact copy of the teacher"));
    EXPECT_THAT(e.what(), HasSubstr("got \"" + other + "\""));
  }
  EXPECT_EQ(ParseConfig(yaml(""), "x.yaml").student.hf_dir, teacher);
  EXPECT_EQ(ParseConfig(yaml(teacher + "/."), "x.yaml").student.hf_dir, teacher + "/.");
  // A run's stored config from before the check still reads (to resume or export it).
  EXPECT_EQ(ParseConfig(yaml(other), "x.yaml", {}, ConfigOrigin::kStored).student.hf_dir, other);
}

TEST(HfModel, YamlKeysMustAgreeWithConfigJson) {
  const std::string dir = Fixture("llama_gqa_rope3");
  const std::string yaml = fmt::format(
      "train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\n  n_layer: 7\ndata:\n  seq_len: 8\n"
      "  min_seq_len: 8\n",
      dir);
  try {
    ParseConfig(yaml, "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("x.yaml:5: student.n_layer: expected 2 (from " + dir));
  }
  // Agreeing keys, and keys left out, are fine: config.json fills them in.
  const Config c = ParseConfig(fmt::format("train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\n"
                                           "  n_layer: 2\ndata:\n  seq_len: 8\n  min_seq_len: 8\n",
                                           dir),
                               "x.yaml");
  EXPECT_EQ(c.student.family, ModelFamily::kLlama);
  EXPECT_EQ(c.student.rope_scaling.type, "llama3");
  // The family and the GELU are architecture keys too: GPT-2's config.json says gpt, gelu_new.
  const std::string gpt2 = Fixture("gpt2_tanh");
  for (const std::string key : {"family: llama", "activation: gelu"}) {
    try {
      ParseConfig(fmt::format("train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\n  {}\ndata:\n"
                              "  seq_len: 8\n  min_seq_len: 8\n",
                              gpt2, key),
                  "x.yaml");
      ADD_FAILURE() << key << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr(key == "family: llama" ? "student.family: expected gpt (from "
                                                             : "student.activation: expected "
                                                               "gelu_tanh (from "));
    }
  }
  EXPECT_EQ(ParseConfig(fmt::format("train:\n  mode: pretrain\nstudent:\n  hf_dir: {}\ndata:\n"
                                    "  seq_len: 8\n  min_seq_len: 8\n",
                                    gpt2),
                        "x.yaml")
                .student.activation,
            Activation::kGeluTanh);
  // The llama family has no GELU to choose.
  try {
    ParseConfig("train:\n  mode: pretrain\nstudent:\n  family: llama\n  activation: gelu_tanh\n",
                "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("x.yaml:5: student.activation: expected gelu (the llama "
                                    "family's MLP is SwiGLU"));
  }
  // A vocabulary that differs from a Hugging Face teacher's is reported at the student's key
  // (the teacher's width is fixed by its weights), naming the teacher's config.json.
  try {
    ParseConfig(fmt::format("train:\n  mode: distill\nteacher:\n  hf_dir: {}\nstudent:\n"
                            "  vocab_size: 300\ndata:\n  seq_len: 8\n  min_seq_len: 8\n",
                            dir),
                "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("x.yaml:6: student.vocab_size: expected teacher.vocab_size "
                                    "(256, from " +
                                    dir + "/config.json)"));
    EXPECT_THAT(e.what(), HasSubstr("got 300"));
  }
  try {
    ParseConfig(fmt::format("train:\n  mode: distill\nteacher:\n  hf_dir: {}\nstudent:\n"
                            "  vocab_size: 256\n  pad_vocab_to_multiple_of: 96\ndata:\n"
                            "  seq_len: 8\n  min_seq_len: 8\n",
                            dir),
                "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("x.yaml:7: student.pad_vocab_to_multiple_of: expected a "
                                    "value that pads to the teacher's 256 logits, from " +
                                    dir + "/config.json, got 96 (pads to 288)"));
  }
  // Both from config.json: an error about a key that config.json set names config.json, not
  // "(default)".
  const std::string teacher = Fixture("qwen2_teacher"), student = Fixture("qwen2_student");
  try {
    ParseConfig(fmt::format("train:\n  mode: distill\nteacher:\n  hf_dir: {}\nstudent:\n"
                            "  hf_dir: {}\ndata:\n  seq_len: 8\n  min_seq_len: 8\n",
                            teacher, student),
                "x.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr(teacher + "/config.json: teacher.vocab_size: expected "
                                    "student.vocab_size (144) (or set distill.vocab_size"));
  }
  // A missing directory names the key and the file.
  try {
    ParseConfig("train:\n  mode: pretrain\nstudent:\n  hf_dir: /nonexistent/m\n", "y.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("y.yaml:4: student.hf_dir: "));
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/m/config.json"));
  }
}

// Qwen2-style teacher and student of different logit widths (160 and 144 rows) with a
// tokenizer of 130 tokens: the columns past 130 are exact ties at probability 0, get no
// gradient, and training is finite.
TEST(HfModel, PaddedVocabulariesOfDifferentWidthsDistil) {
  const std::string out = TempRunDir();
  Config c = testing::TinyConfig(out);
  c.train.mode = Mode::kDistill;
  c.teacher.hf_dir = Fixture("qwen2_teacher");
  c.student.hf_dir = Fixture("qwen2_student");
  ReadHfConfig(c.teacher.hf_dir, c.teacher);
  ReadHfConfig(c.student.hf_dir, c.student);
  c.distill.vocab_size = 130;
  c.distill.ce_weight = 0.5;
  c.data.synthetic.branching = 4;
  c.train.steps = 3;
  c.train.export_hf = false;
  Trainer trainer(c, RunOptions::Quiet());
  const StepResult first = trainer.Step();
  EXPECT_TRUE(std::isfinite(first.loss));
  EXPECT_GT(first.kd_loss, 0.0);
  // One more micro-batch by hand, to look at the gradient of the padded lm_head rows.
  trainer.optimizer().zero_grad();
  trainer.AccumulateGradients({trainer.data().TrainBatch(100)});
  const at::Tensor grad = trainer.student().lm_head_weight().grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_TRUE(at::equal(grad.narrow(0, 130, 144 - 130), at::zeros({144 - 130, grad.size(1)})));
  EXPECT_GT(grad.narrow(0, 0, 130).abs().max().item<double>(), 0.0);
}

// GPT-2 from Hugging Face as teacher and as the student's start (self-distillation): the student
// equals the teacher at step 0, so the divergence is exactly 0 there; the run ends with the
// student exported as GPT2LMHeadModel (a gpt run from an HF model exports like a llama one).
TEST(HfModel, Gpt2FromHuggingFaceDistilsAndTheRunExports) {
  const std::string out = TempRunDir();
  Config c = testing::TinyConfig(out);
  c.train.mode = Mode::kDistill;
  c.teacher.hf_dir = c.student.hf_dir = Fixture("gpt2_tanh");
  ReadHfConfig(c.teacher.hf_dir, c.teacher);
  ReadHfConfig(c.student.hf_dir, c.student);
  c.student.dropout = 0.0;  // config.json's 0.1 would make the student differ from the teacher
  c.data.synthetic.branching = 4;
  c.train.steps = 2;
  c.schedule.warmup_steps = 1;
  {
    Config first = c;
    first.train.out_dir = out + "-first";
    first.train.export_hf = false;
    // The teacher's dropout from config.json (attn_pdrop 0.1), where the parser says it came from:
    // a Hugging Face teacher is loaded without dropout, and no warning calls its key unused.
    ASSERT_GT(first.teacher.dropout, 0);
    first.given_at["teacher.dropout"] = first.teacher.hf_dir + "/config.json";
    Trainer trainer(first, RunOptions::Quiet());
    for (const std::string& warning : trainer.warnings()) {
      EXPECT_THAT(warning, Not(HasSubstr("teacher.dropout"))) << warning;
    }
    const StepResult step = trainer.Step();
    EXPECT_EQ(step.kd_loss, 0.0);
  }
  std::ostringstream table;
  distill::Run(c, RunFlags{false, true, nullptr}, table);
  const ModelConfig exported = HfModelConfig(out + "/hf");
  EXPECT_EQ(exported.family, ModelFamily::kGpt);
  EXPECT_EQ(exported.activation, Activation::kGeluTanh);
  EXPECT_EQ(ArchitectureString(exported), ArchitectureString(c.student));
  EXPECT_THAT(ReadBytes(out + "/hf/config.json"), HasSubstr("\"eos_token_id\": 2"));
}

// The hard-label baseline of a distillation from a Hugging Face teacher (train.baseline) trains
// a student on the teacher's tokens, so its export takes config.json's token ids and the
// tokenizer files from the teacher's directory as the distilled student's does: at the end of
// the run and from `distill_trainer export` alike. A gpt-family baseline exports too (it comes
// from a Hugging Face model as much as the distilled student does).
TEST(HfModel, TheBaselineOfAnHfTeacherExportsWithTheTeachersTokenizer) {
  for (const char* name : {"qwen2_teacher", "gpt2_tanh"}) {
    SCOPED_TRACE(name);
    const std::string out = TempRunDir();
    const std::string teacher_dir = out + "-models/" + name;
    fs::create_directories(teacher_dir);
    for (const char* file : {"config.json", "model.safetensors"}) {
      fs::copy_file(Fixture(name) + "/" + file, teacher_dir + "/" + file);
    }
    const std::string tokenizer = std::string("{\"model\": {\"teacher\": \"") + name + "\"}}";
    WriteBytes(teacher_dir + "/tokenizer.json", tokenizer);
    Config c = testing::TinyConfig(out);
    c.train.mode = Mode::kDistill;
    c.teacher.hf_dir = teacher_dir;
    ReadHfConfig(c.teacher.hf_dir, c.teacher);
    // A randomly initialised student of the teacher's vocabulary, one layer deep.
    static_cast<ModelConfig&>(c.student) = c.teacher;
    c.student.hf_dir.clear();
    c.student.n_layer = 1;
    c.student.dropout = 0.0;
    c.data.synthetic.branching = 4;
    c.train.steps = 2;
    c.train.baseline = true;
    c.schedule.warmup_steps = 1;
    std::ostringstream table;
    distill::Run(c, RunFlags{false, true, nullptr}, table);
    EXPECT_THAT(table.str(), HasSubstr("student (hard labels)"));
    for (const std::string& run : {out, out + "-baseline"}) {
      SCOPED_TRACE(run);
      ASSERT_TRUE(fs::exists(run + "/hf/model.safetensors"));
      EXPECT_EQ(ReadBytes(run + "/hf/tokenizer.json"), tokenizer);
      EXPECT_THAT(ReadBytes(run + "/hf/config.json"), HasSubstr("\"eos_token_id\": 2"));
      EXPECT_EQ(ArchitectureString(HfModelConfig(run + "/hf")), ArchitectureString(c.student));
    }
    // The baseline's stored config.yaml keeps the teacher's directory for a later export.
    const std::string exported = out + "-baseline-exported";
    ExportRun(out + "-baseline", exported);
    EXPECT_EQ(ReadBytes(exported + "/tokenizer.json"), tokenizer);
    EXPECT_EQ(ReadBytes(exported + "/model.safetensors"),
              ReadBytes(out + "-baseline/hf/model.safetensors"));
    RemoveTree(out + "-models");
  }
}

// A 2-step distillation between the qwen2 fixtures, copied to <out>-models (the teacher with a
// tokenizer.json), as a Config that Run takes as it is (not parsed: no start-up checks).
Config QwenFixtureDistill(const std::string& out) {
  const std::string models = out + "-models";
  for (const char* name : {"qwen2_teacher", "qwen2_student"}) {
    fs::create_directories(models + "/" + name);
    for (const char* file : {"config.json", "model.safetensors"}) {
      fs::copy_file(Fixture(name) + "/" + file, models + "/" + name + "/" + file);
    }
  }
  WriteBytes(models + "/qwen2_teacher/tokenizer.json", "{\"model\": {}}");
  Config c = testing::TinyConfig(out);
  c.train.mode = Mode::kDistill;
  c.teacher.hf_dir = models + "/qwen2_teacher";
  c.student.hf_dir = models + "/qwen2_student";
  ReadHfConfig(c.teacher.hf_dir, c.teacher);
  ReadHfConfig(c.student.hf_dir, c.student);
  c.distill.vocab_size = 130;
  c.data.synthetic.branching = 4;
  c.train.steps = 2;
  c.schedule.warmup_steps = 1;
  return c;
}

// An end-of-run export that fails (here a tokenizer file made a directory after the start-up
// checks) says that the training is done, where its checkpoint is and how to export it.
TEST(HfModel, AFailedEndOfRunExportSaysTheTrainingIsKept) {
  const std::string out = TempRunDir();
  const std::string models = out + "-models";
  const Config c = QwenFixtureDistill(out);
  fs::create_directories(models + "/qwen2_teacher/merges.txt");
  std::ostringstream table;
  EXPECT_EQ(testing::ErrorOf<std::runtime_error>([&] {
              distill::Run(c, RunFlags{false, true, nullptr}, table);
            }),
            "export: " + models +
                "/qwen2_teacher/merges.txt: not a regular file (a directory, device or pipe); "
                "expected a tokenizer file to copy; the training itself is done, its final "
                "checkpoint in " +
                out + "/checkpoints: once that is fixed, `distill_trainer export " + out +
                " <new directory>` exports it");
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_0000002.pt"));
  EXPECT_FALSE(fs::exists(out + "/hf"));
  RemoveTree(models);
}

// A finished run stays exportable after its Hugging Face directories are moved or deleted: its
// stored config.yaml holds the architecture, and the run's own export (hf/) stands in for
// config.json's other keys and the tokenizer files.
TEST(HfModel, ARunExportsAfterItsHfDirectoriesAreGone) {
  const std::string out = TempRunDir();
  const std::string models = out + "-models";
  const Config c = QwenFixtureDistill(out);
  std::ostringstream table;
  distill::Run(c, RunFlags{false, true, nullptr}, table);
  ASSERT_TRUE(fs::exists(out + "/hf/tokenizer.json"));
  RemoveTree(models);

  const std::string exported = out + "-exported";
  ::testing::internal::CaptureStderr();
  ExportRun(out, exported);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("warning: " + c.student.hf_dir +
                        "/config.json is gone (moved or deleted since the run); config.json's "
                        "other keys and the tokenizer files are taken from the run's own "
                        "export " +
                        out + "/hf"));
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_EQ(ReadBytes(exported + "/" + file), ReadBytes(out + "/hf/" + file)) << file;
  }
  // Without an export of its own: config.json from the run's config alone, no tokenizer files.
  RemoveTree(out + "/hf");
  const std::string bare = out + "-bare";
  ::testing::internal::CaptureStderr();
  ExportRun(out, bare);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("and the run has no export of its own (" + out +
                        "/hf): config.json is written from the run's config alone, and no "
                        "tokenizer files are copied"));
  EXPECT_EQ(ReadBytes(bare + "/model.safetensors"), ReadBytes(exported + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(bare + "/tokenizer.json"));
  EXPECT_EQ(ArchitectureString(HfModelConfig(bare)), ArchitectureString(HfModelConfig(exported)));
  // Only the teacher's directory gone: the student's config.json is the template, and the note
  // says whether a tokenizer came with it (the teacher's is gone with its directory).
  fs::create_directories(c.student.hf_dir);
  fs::copy_file(Fixture("qwen2_student") + "/config.json", c.student.hf_dir + "/config.json");
  const std::string half = out + "-half";
  ::testing::internal::CaptureStderr();
  ExportRun(out, half);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("warning: " + c.teacher.hf_dir +
                        "/config.json is gone (moved or deleted since the run), and the run has "
                        "no export of its own (" +
                        out + "/hf): config.json's other keys are taken from " + c.student.hf_dir +
                        "/config.json, and no tokenizer files are copied"));
  EXPECT_FALSE(fs::exists(half + "/tokenizer.json"));
  WriteBytes(c.student.hf_dir + "/tokenizer.json", "{\"model\": {\"student\": 1}}");
  const std::string with_tokenizer = out + "-with-tokenizer";
  ::testing::internal::CaptureStderr();
  ExportRun(out, with_tokenizer);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("/config.json, and the tokenizer files from " + c.student.hf_dir));
  EXPECT_EQ(ReadBytes(with_tokenizer + "/tokenizer.json"),
            ReadBytes(c.student.hf_dir + "/tokenizer.json"));
  EXPECT_EQ(ReadBytes(with_tokenizer + "/model.safetensors"),
            ReadBytes(exported + "/model.safetensors"));
  // The teacher's directory holding another model now: the error says so and what to do, not
  // "remove the key" from the run's own config.yaml.
  fs::create_directories(c.teacher.hf_dir);
  fs::copy_file(Fixture("llama_gqa_rope3") + "/config.json", c.teacher.hf_dir + "/config.json");
  try {
    ExportRun(out, out + "-replaced");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr(out + "/config.yaml:"));
    EXPECT_THAT(e.what(), HasSubstr("the run was made with "));
    EXPECT_THAT(e.what(), HasSubstr("but " + c.teacher.hf_dir + "/config.json now gives "));
    EXPECT_THAT(e.what(), HasSubstr("put that model back, or move the directory away"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("remove the key")));
  }
  EXPECT_FALSE(fs::exists(out + "-replaced"));
  RemoveTree(models);
}

// A student whose tokenizer gives an id another token than the teacher's is refused at start-up
// (the logits are compared id by id, and the export would copy the student's tokenizer); the
// same tokens, a student tokenizer with more ids, or none at all pass.
TEST(HfModel, AStudentWithAnotherTokenizerIsRefused) {
  const std::string models = TempRunDir() + "-models";
  for (const char* name : {"qwen2_teacher", "qwen2_student"}) {
    fs::create_directories(models + "/" + name);
    for (const char* file : {"config.json", "model.safetensors"}) {
      fs::copy_file(Fixture(name) + "/" + file, models + "/" + name + "/" + file);
    }
  }
  const std::string teacher = models + "/qwen2_teacher", student = models + "/qwen2_student";
  WriteBytes(teacher + "/tokenizer.json",
             R"({"model": {"vocab": {"a": 0, "b": 1, "c": 2}},
                 "added_tokens": [{"id": 3, "content": "<s>"}]})");
  const std::string yaml = "train:\n  mode: distill\n  out_dir: " + models +
                           "/run\nteacher:\n  hf_dir: " + teacher +
                           "\nstudent:\n  hf_dir: " + student + "\ndistill:\n  vocab_size: 130\n";
  const auto error = [&] {
    try {
      ParseConfig(yaml, "x.yaml");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(), "");  // no tokenizer.json in the student's directory
  WriteBytes(student + "/tokenizer.json",
             R"({"model": {"vocab": {"b": 1, "a": 0, "c": 2}},
                 "added_tokens": [{"id": 3, "content": "<s>"}, {"id": 4, "content": "<pad>"}]})");
  EXPECT_EQ(error(), "");
  WriteBytes(student + "/tokenizer.json",
             R"({"model": {"vocab": {"a": 0, "x": 1, "y": 2}},
                 "added_tokens": [{"id": 3, "content": "<s>"}]})");
  EXPECT_EQ(error(),
            "x.yaml:7: student.hf_dir: expected a model with the teacher's tokenizer "
            "(distillation compares the two models' logits id by id, and the data's ids "
            "are the teacher's), got \"" +
                student +
                "\", whose tokenizer.json gives id 1 the token \"x\" where "
                "the teacher's (teacher.hf_dir \"" +
                teacher +
                "\") has \"b\", and 2 ids differ in all; take a student "
                "that uses the teacher's tokenizer");
  // A teacher's tokenizer.json that cannot be read is the teacher's key's error, at its line.
  WriteBytes(teacher + "/tokenizer.json", "{\"model\": ");
  EXPECT_THAT(error(), ::testing::StartsWith("x.yaml:5: teacher.hf_dir: expected a readable "
                                             "tokenizer: "));
  RemoveTree(models);
}

// A Hugging Face model given as teacher.checkpoint (its directory, or a file of it) is named as
// one, with the key that takes it, before the checks its architecture would fail (the teacher's
// default vocab_size); and a context length that config.json gives is said to come from there.
TEST(HfModel, AHuggingFaceModelGivenAsTeacherCheckpointIsNamed) {
  const std::string models = TempRunDir() + "-models";
  const std::string teacher = models + "/qwen2_teacher";
  fs::create_directories(teacher);
  for (const char* file : {"config.json", "model.safetensors"}) {
    fs::copy_file(Fixture("qwen2_teacher") + "/" + file, teacher + "/" + file);
  }
  const auto error = [&](const std::string& yaml) {
    try {
      ParseConfig(yaml, "x.yaml");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string base = "train:\n  mode: distill\nstudent:\n  vocab_size: 128\n";
  EXPECT_EQ(error(base + "teacher:\n  checkpoint: " + teacher + "\n"),
            "x.yaml:6: teacher.checkpoint: expected a distill_trainer checkpoint file or run "
            "directory, got \"" +
                teacher +
                "\": a Hugging Face model directory (config.json, no checkpoints/); give it as "
                "teacher.hf_dir instead (and unset teacher.checkpoint)");
  EXPECT_EQ(error(base + "teacher:\n  checkpoint: " + teacher + "/model.safetensors\n"),
            "x.yaml:6: teacher.checkpoint: expected a distill_trainer checkpoint file or run "
            "directory, got \"" +
                teacher +
                "/model.safetensors\": a file of a Hugging Face model; give its directory \"" +
                teacher + "\" as teacher.hf_dir instead (and unset teacher.checkpoint)");
  const int64_t positions = HfModelConfig(teacher).context_length;
  EXPECT_THAT(
      error("train:\n  mode: distill\nteacher:\n  hf_dir: " + teacher + "\nstudent:\n  hf_dir: " +
            teacher + "\ndata:\n  seq_len: " + std::to_string(positions + 1) + "\n"),
      HasSubstr("data.seq_len: expected at most student.context_length (" +
                std::to_string(positions) + ", " + teacher +
                "/config.json's max_position_embeddings), got " + std::to_string(positions + 1)));
  RemoveTree(models);
}

// --- SmolLM2-135M, prepared by the set-up (scripts/prepare_smollm2.py); skipped without it. ---

std::string SmolDir() { return LOSSFNS_SMOLLM2_DIR; }

TEST(SmolLM2, LogitsMatchTransformersOnRealText) {
  if (SmolDir().empty() || !PythonHasTransformers()) GTEST_SKIP() << "SmolLM2 not prepared";
  const ModelConfig config = HfModelConfig(SmolDir() + "/hf");
  EXPECT_EQ(config.n_layer, 30);
  EXPECT_EQ(config.kv_heads(), 3);
  Model model = BuildModel(config, "", at::Device(at::kCPU));
  model->eval();
  // 48 tokens of a held-out play, as the tokenizer wrote them.
  Config data_config;
  data_config.data.source = "tokens";
  data_config.data.path = SmolDir() + "/shakespeare/val_*.bin";
  data_config.data.batch_size = 1;
  data_config.data.seq_len = 48;
  const at::Tensor ids =
      MakeDataSource(data_config.data, config.vocab_size, -100)->ValBatch(3, 4).inputs;
  torch::NoGradGuard no_grad;
  const std::string check = TempRunDir() + "-check.safetensors";
  WriteSafetensors(check, {{"input_ids", ids}, {"logits", model->forward(ids)}});
  EXPECT_EQ(TransformersCheck(SmolDir() + "/hf", check), 0);
}

TEST(SmolLM2, TwoStepDistillationOnShakespeareRunsAndExports) {
  if (SmolDir().empty()) GTEST_SKIP() << "SmolLM2 not prepared";
  const std::string out = TempRunDir();
  const Config c = LoadConfigFile(
      std::string(DISTILL_CONFIGS_DIR) + "/smollm2_distill.yaml",
      {"teacher.hf_dir=" + SmolDir() + "/hf", "data.path=" + SmolDir() + "/shakespeare/train_*.bin",
       "data.val_path=" + SmolDir() + "/shakespeare/val_*.bin", "train.out_dir=" + out,
       "train.steps=2", "train.device=cpu", "train.precision=fp32", "train.baseline=false",
       "data.batch_size=2", "data.seq_len=64", "train.eval_batches=1", "train.eval_interval=0",
       "schedule.warmup_steps=1"});
  std::ostringstream table;
  distill::Run(c, RunFlags{false, true, nullptr}, table);
  EXPECT_THAT(table.str(), HasSubstr("student (distilled)"));
  ASSERT_TRUE(fs::exists(out + "/hf/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/hf/tokenizer.json"));  // the teacher's tokenizer came along
  if (!PythonHasTransformers()) {
    GTEST_SKIP() << "no python with transformers (LOSSFNS_PYTHON): the export not reloaded there";
  }
  // The export reloads in transformers with the trainer's logits.
  Model student = MakeModel(c.student);
  LoadWeights(out, *student, at::Device(at::kCPU));
  student->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(0, 49152, {2, 24}, at::kLong);
  WriteSafetensors(out + "-check.safetensors",
                   {{"input_ids", ids}, {"logits", student->forward(ids)}});
  EXPECT_EQ(TransformersCheck(out + "/hf", out + "-check.safetensors"), 0);
  // And `distill_trainer export` writes the same model to a new directory.
  const std::string exported = out + "-exported";
  ExportRun(out, exported);
  EXPECT_EQ(TransformersCheck(exported, out + "-check.safetensors"), 0);
}

}  // namespace
}  // namespace distill

// config.json of the llama and gpt families: real configs of each model_type, the rope spellings,
// every kind of bad input (each error names the file and the key), and export -> import round
// trips.
#include "distill/hf_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_files.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string TempDir(const std::string& suffix = "") {
  return testing::FreshTestDir("distill_hf_", suffix);
}

void WriteText(const std::string& path, const std::string& text) {
  testing::WriteBytes(path, text);
}

// A directory holding `config` as config.json.
std::string ConfigDir(const Json& config, const std::string& suffix = "") {
  const std::string dir = TempDir(suffix);
  WriteText(dir + "/config.json", config.dump(2));
  return dir;
}

std::string ErrorOf(const std::function<void()>& f) { return testing::ErrorOf<ConfigError>(f); }
using testing::ExpectContains;

// Llama-3.2-1B's architecture keys.
Json Llama32() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5-0.5B's.
Json Qwen25() {
  return Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// Qwen3-0.6B's.
Json Qwen3() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

// Mistral-7B-v0.3's.
Json Mistral() {
  return Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
    "tie_word_embeddings": false, "vocab_size": 32768})");
}

ModelConfig Read(const Json& config) {
  ModelConfig m;
  ReadHfConfig(ConfigDir(config), m);
  return m;
}

void ExpectSameModel(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.hf_dir, b.hf_dir);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.pad_vocab_to_multiple_of, b.pad_vocab_to_multiple_of);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.mlp_ratio, b.mlp_ratio);
  EXPECT_EQ(a.dropout, b.dropout);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.attention_out_bias, b.attention_out_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.hf_model_type, b.hf_model_type);
}

TEST(ReadHfConfig, Llama3WithRopeScaling) {
  const ModelConfig m = Read(Llama32());
  EXPECT_EQ(m.family, ModelFamily::kLlama);
  EXPECT_EQ(m.hf_model_type, "llama");
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.pad_vocab_to_multiple_of, 1);
  EXPECT_EQ(m.padded_vocab_size(), 128256);
  EXPECT_EQ(m.d_model, 2048);
  EXPECT_EQ(m.n_layer, 16);
  EXPECT_EQ(m.n_head, 32);
  EXPECT_EQ(m.n_kv_head, 8);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.intermediate_size, 8192);
  EXPECT_EQ(m.norm_eps, 1e-5);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.rope_scaling.factor, 32.0);
  EXPECT_EQ(m.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(m.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(m.context_length, 131072);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_FALSE(m.attention_out_bias);
  EXPECT_FALSE(m.mlp_bias);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.dropout, 0.0);
}

TEST(ReadHfConfig, RopeParametersSpelling) {
  // transformers >= 5: rope_theta and the scaling inside rope_parameters.
  Json c = Llama32();
  c.erase("rope_scaling");
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ModelConfig m = Read(c);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.rope_scaling.factor, 8.0);

  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  m = Read(c);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.rope_scaling.type, "");

  // As transformers 5 reads them (seen with 5.24): a rope_theta in rope_parameters wins over the
  // top level's; no rope_type (nor "type") is the default RoPE; llama3 without
  // original_max_position_embeddings takes max_position_embeddings.
  c["rope_theta"] = 500.0;
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
  EXPECT_EQ(Read(c).rope_theta, 1e4);
  c["rope_parameters"] = {{"rope_type", "default"}};
  EXPECT_EQ(Read(c).rope_theta, 500.0);
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_theta", 1234.0}};
  m = Read(c);
  EXPECT_EQ(m.rope_theta, 1234.0);
  EXPECT_EQ(m.rope_scaling.type, "");
  c.erase("rope_parameters");
  c["rope_scaling"] = {{"factor", 2.0}};
  EXPECT_EQ(Read(c).rope_scaling.type, "");
  c["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}};
  m = Read(c);
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, m.context_length);
  EXPECT_EQ(m.context_length, c["max_position_embeddings"].get<int64_t>());
  // rope_scaling, where present, stands for rope_parameters (transformers 5: `rope_scaling or
  // rope_parameters`), its rope_theta included; else the top level's.
  c["rope_theta"] = 5e5;
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  EXPECT_EQ(Read(c).rope_theta, 5e5);
  c["rope_scaling"]["rope_theta"] = 4242.0;
  EXPECT_EQ(Read(c).rope_theta, 4242.0);
  // An empty rope_scaling object is falsy there: rope_parameters holds the RoPE (it ran plain
  // RoPE here, and the export wrote rope_scaling null: another model than the source).
  const Json kept = c["rope_scaling"];
  c["rope_scaling"] = Json::object();
  c["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 2e5},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  m = Read(c);
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.rope_theta, 2e5);
  c["rope_scaling"] = kept;
  c["rope_scaling"].erase("rope_theta");
  c.erase("rope_parameters");
  c.erase("rope_theta");
  // A top-level original_max_position_embeddings (Phi-3's layout) takes priority over the rope
  // object's for llama3, as transformers 5 standardises it; the export keeps the model's in
  // rope_scaling only.
  c["rope_scaling"]["original_max_position_embeddings"] = 8192;
  EXPECT_EQ(Read(c).rope_scaling.original_max_position_embeddings, 8192);
  c["original_max_position_embeddings"] = 4096;
  m = Read(c);
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 4096);
  {
    const Json out = Json::parse(HfConfigJson(m, ConfigDir(c, "_omp") + "/config.json"));
    EXPECT_FALSE(out.contains("original_max_position_embeddings"));
    EXPECT_EQ(out["rope_scaling"]["original_max_position_embeddings"], 4096);
  }
  c.erase("original_max_position_embeddings");
  c["rope_scaling"].erase("original_max_position_embeddings");
  // "swish": transformers' other name of silu.
  c["hidden_act"] = "swish";
  EXPECT_EQ(Read(c).rope_scaling.type, "llama3");
  c["hidden_act"] = "silu";

  // The old "type" key; no rope keys at all: theta 10000, no scaling.
  c.erase("rope_parameters");
  c["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(Read(c).rope_scaling.type, "");
  c.erase("rope_scaling");
  m = Read(c);
  EXPECT_EQ(m.rope_theta, 10000.0);
  EXPECT_EQ(m.rope_scaling.type, "");
}

TEST(ReadHfConfig, Qwen2HasQkvBiases) {
  const ModelConfig m = Read(Qwen25());
  EXPECT_EQ(m.hf_model_type, "qwen2");
  EXPECT_TRUE(m.attention_bias);
  EXPECT_FALSE(m.attention_out_bias);
  EXPECT_FALSE(m.mlp_bias);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.n_head, 14);
  EXPECT_EQ(m.n_kv_head, 2);
  EXPECT_EQ(m.head_dim, 0);
  EXPECT_EQ(m.head_size(), 64);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.context_length, 32768);
  EXPECT_TRUE(m.tie_embeddings);
}

TEST(ReadHfConfig, Qwen3HasQkNormAndExplicitHeadDim) {
  ModelConfig m = Read(Qwen3());
  EXPECT_EQ(m.hf_model_type, "qwen3");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.head_dim, 128);  // != 1024 / 16
  EXPECT_EQ(m.head_size(), 128);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_FALSE(m.attention_out_bias);
  EXPECT_EQ(m.rope_theta, 1e6);  // an integer in the file
  EXPECT_EQ(m.context_length, 40960);
  // Qwen3Config's default head_dim is 128, not hidden_size / heads.
  Json c = Qwen3();
  c.erase("head_dim");
  c["hidden_size"] = 512;
  EXPECT_EQ(Read(c).head_dim, 128);
  c["attention_bias"] = true;
  m = Read(c);
  EXPECT_TRUE(m.attention_bias);
  EXPECT_TRUE(m.attention_out_bias);
}

TEST(ReadHfConfig, MistralAndDefaults) {
  ModelConfig m = Read(Mistral());
  EXPECT_EQ(m.hf_model_type, "mistral");
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_EQ(m.context_length, 32768);
  // Absent keys take the model class's defaults: untied, no kv grouping, eps 1e-6.
  Json c = Llama32();
  for (const char* key : {"tie_word_embeddings", "num_key_value_heads", "rms_norm_eps", "head_dim",
                          "max_position_embeddings", "hidden_act", "attention_bias"}) {
    c.erase(key);
  }
  m = Read(c);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.n_kv_head, 32);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_EQ(m.head_dim, 0);
  EXPECT_EQ(m.context_length, 2048);
  // A null value is an absent one.
  c["num_key_value_heads"] = nullptr;
  c["head_dim"] = nullptr;
  m = Read(c);
  EXPECT_EQ(m.n_kv_head, 32);
  EXPECT_EQ(m.head_dim, 0);
  // num_key_value_heads absent: each config class's default (transformers 5.24: MistralConfig 8,
  // Qwen2Config and Qwen3Config 32, LlamaConfig num_attention_heads); null: num_attention_heads,
  // but MistralConfig refuses it.
  Json mistral = Mistral();  // 32 heads
  mistral.erase("num_key_value_heads");
  EXPECT_EQ(Read(mistral).n_kv_head, 8);
  mistral["num_key_value_heads"] = nullptr;
  ExpectContains(ErrorOf([&] { Read(mistral); }),
                 {"num_key_value_heads: expected an integer (MistralConfig takes no null here), "
                  "got null"});
  Json qwen = Qwen25();  // 14 heads: 32 is no divisor, and the error says where 32 came from
  qwen.erase("num_key_value_heads");
  ExpectContains(ErrorOf([&] { Read(qwen); }),
                 {"num_key_value_heads: expected a divisor of num_attention_heads (14), got no "
                  "such key, which Qwen2ForCausalLM reads as its default, 32"});
  qwen["num_key_value_heads"] = nullptr;
  EXPECT_EQ(Read(qwen).n_kv_head, 14);
  Json qwen3 = Qwen3();
  qwen3["num_attention_heads"] = 64;
  qwen3.erase("num_key_value_heads");
  EXPECT_EQ(Read(qwen3).n_kv_head, 32);
  // Keys ReadHfConfig does not own stay as they were.
  ModelConfig keep;
  keep.hf_dir = "somewhere";
  keep.mlp_ratio = 3.0;
  ReadHfConfig(ConfigDir(Llama32(), "_keep"), keep);
  EXPECT_EQ(keep.hf_dir, "somewhere");
  EXPECT_EQ(keep.mlp_ratio, 3.0);
}

TEST(ReadHfConfig, SlidingWindowIsRefusedUnlessItCoversTheContext) {
  Json c = Mistral();
  c["sliding_window"] = 4096;
  std::string dir = ConfigDir(c);
  ModelConfig m;
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json", "sliding_window", "not supported", "4096", "32768"});
  c.erase("sliding_window");  // MistralConfig's default: 4096
  dir = ConfigDir(c, "_absent");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }), {"sliding_window", "4096"});
  c["sliding_window"] = 32768;
  EXPECT_EQ(Read(c).context_length, 32768);

  c = Qwen25();
  c["use_sliding_window"] = true;
  c["sliding_window"] = 4096;
  c["max_window_layers"] = 21;  // layers 21..23 slide (Qwen2.5-0.5B's 24 would slide none)
  dir = ConfigDir(c, "_qwen");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }), {dir + "/config.json", "sliding_window"});
  c["layer_types"] = {"full_attention", "sliding_attention"};
  dir = ConfigDir(c, "_types");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }), {"sliding_window"});
  // As transformers 5 reads Qwen2Config: no layer slides where every layer type is full
  // attention, where max_window_layers covers every layer (no layer_types), or where
  // use_sliding_window is off (the window is null then, whatever layer_types says).
  c["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_NO_THROW(Read(c));
  c.erase("layer_types");
  c["max_window_layers"] = c["num_hidden_layers"];
  EXPECT_NO_THROW(Read(c));
  c["max_window_layers"] = c["num_hidden_layers"].get<int64_t>() - 1;
  dir = ConfigDir(c, "_window_layers");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }), {"sliding_window", "4096"});
  c["use_sliding_window"] = false;
  c["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NO_THROW(Read(c));
}

TEST(ReadHfConfig, MissingRequiredKeys) {
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size", "model_type"}) {
    SCOPED_TRACE(key);
    Json c = Llama32();
    c.erase(key);
    const std::string dir = ConfigDir(c);
    ModelConfig m;
    const ModelConfig before = m;
    ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                   {dir + "/config.json: " + key + ": expected", "no such key"});
    ExpectSameModel(m, before);  // untouched
    // A null value counts as absent (transformers' None), and is named as what it is.
    c[key] = nullptr;
    const std::string null_dir = ConfigDir(c);
    ExpectContains(ErrorOf([&] { ReadHfConfig(null_dir, m); }),
                   {null_dir + "/config.json: " + key + ": expected", ", got null"});
    ExpectSameModel(m, before);
  }
}

TEST(ReadHfConfig, WrongTypesNameKeyExpectedAndFound) {
  struct Case {
    const char* key;
    Json value;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "2048", {"expected an integer", "got \"2048\""}},
      {"hidden_size", 2048.5, {"expected an integer", "2048.5"}},
      {"hidden_size", 0, {"expected an integer > 0", "got 0"}},
      {"num_key_value_heads", 5, {"divisor of num_attention_heads (32)", "got 5"}},
      {"tie_word_embeddings", "yes", {"expected true or false", "\"yes\""}},
      {"rms_norm_eps", "small", {"expected a", "number", "\"small\""}},
      {"rope_theta", -1, {"> 0", "-1"}},
      {"model_type", 3, {"expected a string", "got 3"}},
      {"hidden_act", "gelu", {"silu", "\"gelu\""}},
      {"rope_scaling", "llama3", {"expected an object or null", "\"llama3\""}},
      {"intermediate_size", Json::array(), {"expected an integer", "an array"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    Json config = Llama32();
    config[c.key] = c.value;
    const std::string dir = ConfigDir(config);
    ModelConfig m;
    const std::string message = ErrorOf([&] { ReadHfConfig(dir, m); });
    ExpectContains(message, {dir + "/config.json: " + c.key + ": "});
    for (const auto& part : c.expect) ExpectContains(message, {part});
  }
}

TEST(ReadHfConfig, UnsupportedModelTypeAndRopeType) {
  Json c = Llama32();
  c["model_type"] = "gemma";
  std::string dir = ConfigDir(c);
  ModelConfig m;
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json: model_type: expected one of gpt2, llama, mistral, qwen2, "
                        "qwen3",
                  "\"gemma\""});

  c = Llama32();
  c["rope_scaling"]["rope_type"] = "yarn";
  dir = ConfigDir(c, "_yarn");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json: rope_scaling.rope_type: ",
                  "rope type \"yarn\" is not supported; supported: default, llama3"});
  c.erase("rope_scaling");
  c["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e4}};
  dir = ConfigDir(c, "_linear");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {"rope_parameters.rope_type", "\"linear\" is not supported"});

  c = Llama32();
  c["rope_scaling"].erase("low_freq_factor");
  dir = ConfigDir(c, "_missing");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json: rope_scaling.low_freq_factor: expected a number"});
  c = Llama32();
  c["rope_scaling"]["rope_type"] = 3;
  dir = ConfigDir(c, "_badtype");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {"rope_scaling.rope_type: expected a string"});
}

// openai-community/gpt2's config.json.
Json Gpt2() {
  return Json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
}

TEST(ReadHfConfig, Gpt2IsTheGptFamily) {
  ModelConfig m;
  m.family = ModelFamily::kLlama;  // what was there before is replaced
  m.n_kv_head = 3;
  m.qk_norm = true;
  ReadHfConfig(ConfigDir(Gpt2()), m);
  EXPECT_EQ(m.family, ModelFamily::kGpt);
  EXPECT_EQ(m.vocab_size, 50257);
  EXPECT_EQ(m.padded_vocab_size(), 50257);
  EXPECT_EQ(m.context_length, 1024);
  EXPECT_EQ(m.d_model, 768);
  EXPECT_EQ(m.n_layer, 12);
  EXPECT_EQ(m.n_head, 12);
  EXPECT_EQ(m.mlp_width(), 3072);  // n_inner absent: 4 * n_embd
  EXPECT_EQ(m.activation, Activation::kGeluTanh);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_DOUBLE_EQ(m.dropout, 0.1);
  EXPECT_EQ(m.n_kv_head, 0);
  EXPECT_FALSE(m.qk_norm);

  // GPT2Config's defaults for what a config.json leaves out; the other tanh spellings.
  for (const char* act : {"gelu_pytorch_tanh", "gelu_fast"}) {
    ModelConfig d;
    ReadHfConfig(ConfigDir(Json{{"model_type", "gpt2"}, {"activation_function", act}}, act), d);
    EXPECT_EQ(d.activation, Activation::kGeluTanh) << act;
    EXPECT_EQ(d.vocab_size, 50257);
    EXPECT_EQ(d.mlp_width(), 3072);
  }
  Json exact = Gpt2();
  exact["activation_function"] = "gelu";
  exact["n_inner"] = 1000;
  exact["tie_word_embeddings"] = false;
  ReadHfConfig(ConfigDir(exact, "_exact"), m);
  EXPECT_EQ(m.activation, Activation::kGelu);
  EXPECT_EQ(m.mlp_width(), 1000);
  EXPECT_FALSE(m.tie_embeddings);
}

TEST(ReadHfConfig, Gpt2ArchitecturesTheFamilyCannotRunAreRefused) {
  const auto error_with = [](const char* key, const Json& value) {
    Json c = Gpt2();
    c[key] = value;
    const std::string dir = ConfigDir(c, std::string("_") + key);
    ModelConfig m;
    return std::make_pair(dir, ErrorOf([&] { ReadHfConfig(dir, m); }));
  };
  auto [dir, error] = error_with("activation_function", "relu");
  ExpectContains(error, {dir + "/config.json: activation_function: expected \"gelu\" (exact) or "
                               "\"gelu_new\", \"gelu_pytorch_tanh\", \"gelu_fast\" (tanh), got "
                               "\"relu\""});
  std::tie(dir, error) = error_with("layer_norm_epsilon", 1e-6);
  ExpectContains(error, {"layer_norm_epsilon: expected 1e-05", "got 1e-06"});
  std::tie(dir, error) = error_with("scale_attn_by_inverse_layer_idx", true);
  ExpectContains(error,
                 {"scale_attn_by_inverse_layer_idx: expected false (not supported), got true"});
  std::tie(dir, error) = error_with("scale_attn_weights", false);
  ExpectContains(error, {"scale_attn_weights: expected true"});
  std::tie(dir, error) = error_with("add_cross_attention", true);
  ExpectContains(error, {"add_cross_attention: expected false (a decoder-only model), got true"});
  std::tie(dir, error) = error_with("n_head", 7);
  ExpectContains(error, {"n_embd: expected a multiple of n_head (7), got 768"});
  std::tie(dir, error) = error_with("n_inner", -1);
  ExpectContains(error, {"n_inner: expected an integer > 0, got -1"});
}

TEST(ReadHfConfig, InvalidJsonAndMissingFile) {
  const std::string dir = TempDir();
  WriteText(dir + "/config.json", "{\"hidden_size\": 12,\n \"model_type\": }");
  ModelConfig m;
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json", "expected JSON, got a parse error at line 2, column 16"});
  WriteText(dir + "/config.json", "[]");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }), {dir + "/config.json", "JSON object"});
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir + "/nope", m); }),
                 {dir + "/nope/config.json", "cannot read"});
  WriteText(dir + "/config.json", "{\"vocab_size\": 1e400}");  // a number past a double
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json: expected JSON that fits", "1e400"});
  // Nesting past any real file (dump() recursed once per level of a 10^5-deep key: a crash).
  WriteText(dir + "/config.json",
            "{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json: expected JSON nested at most 64 levels deep"});
  std::filesystem::remove(dir + "/config.json");  // a FIFO is refused, not waited on
  ASSERT_EQ(::mkfifo((dir + "/config.json").c_str(), 0600), 0);
  ExpectContains(ErrorOf([&] { ReadHfConfig(dir, m); }),
                 {dir + "/config.json: not a regular file"});
}

// The ids of tokenizer.json, counted as large as they are: one past int64 (which get<int64_t>
// wrapped to a negative number) or written as a float, in the vocabulary or the added tokens.
TEST(HfTokenizerSize, CountsEveryIdAsLargeAsItIs) {
  const std::string dir = TempDir();
  const auto size_of = [&](const std::string& vocab, const std::string& added) {
    WriteText(dir + "/tokenizer.json",
              "{\"model\": {\"vocab\": " + vocab + "}, \"added_tokens\": " + added + "}");
    return HfTokenizerSize(dir);
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(size_of("{\"a\": 0, \"b\": 41}", "[{\"id\": 7}]"), 42);
  EXPECT_EQ(size_of("{\"a\": 18446744073709551615}", "[]"), kMax);
  EXPECT_EQ(size_of("{\"a\": 9223372036854775807}", "[]"), kMax);
  EXPECT_EQ(size_of("{\"a\": 1e9}", "[]"), 1000000001);
  EXPECT_EQ(size_of("{\"a\": 3}", "[{\"id\": 9223372036854775808}]"), kMax);
  EXPECT_EQ(size_of("{\"a\": -5, \"b\": \"x\"}", "[{\"id\": 2.5}]"), 3);
  std::filesystem::remove(dir + "/tokenizer.json");
  EXPECT_EQ(HfTokenizerSize(dir), std::nullopt);
  // A link to nothing is a file that cannot be read (the size check is not skipped), not none.
  std::filesystem::create_symlink(dir + "/gone.json", dir + "/tokenizer.json");
  ExpectContains(ErrorOf([&] { HfTokenizerSize(dir); }), {dir + "/tokenizer.json", "cannot read"});
}

// Two tokenizers compared id by id (the model's vocabulary, BPE or Unigram, and the added
// tokens): the lowest id whose tokens differ, and how many do; ids one side lacks do not count.
TEST(HfTokenizerDifference, NamesTheLowestIdWhoseTokensDiffer) {
  const std::string dir = TempDir(), a = dir + "/a", b = dir + "/b";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  WriteText(
      a + "/tokenizer.json",
      R"({"model": {"vocab": {"x": 0, "y": 1, "z": 2}}, "added_tokens": [{"id": 3, "content": "<s>"}]})");
  EXPECT_EQ(HfTokenizerDifference(a, b), std::nullopt);  // b has no tokenizer.json
  EXPECT_EQ(HfTokenizerDifference(a, a), std::nullopt);
  // The same ids in another order, and more of them: no difference.
  WriteText(
      b + "/tokenizer.json",
      R"({"model": {"vocab": {"z": 2, "x": 0, "y": 1, "w": 5}}, "added_tokens": [{"id": 3, "content": "<s>"}]})");
  EXPECT_EQ(HfTokenizerDifference(a, b), std::nullopt);
  // Unigram: [piece, score] by id; an added token's id taken by another token.
  WriteText(
      b + "/tokenizer.json",
      R"({"model": {"vocab": [["x", 0.0], ["q", -1.5], ["z", -2.0], ["<unk>", 0.0]]}, "added_tokens": []})");
  const auto d = HfTokenizerDifference(a, b);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->id, 1);
  EXPECT_EQ(d->a, "y");
  EXPECT_EQ(d->b, "q");
  EXPECT_EQ(d->count, 2);  // ids 1 and 3
  // An id listed twice in one file (an added token over a vocabulary entry): read alike on both
  // sides, so two copies of that file agree.
  const std::string twice =
      R"({"model": {"vocab": {"x": 0, "<pad>": 1}}, "added_tokens": [{"id": 1, "content": "<|pad|>"}]})";
  WriteText(a + "/tokenizer.json", twice);
  WriteText(b + "/tokenizer.json", twice);
  EXPECT_EQ(HfTokenizerDifference(a, b), std::nullopt);
  // Special tokens are not compared (a later release renamed reserved ones); others are.
  WriteText(
      b + "/tokenizer.json",
      R"({"model": {"vocab": {"x": 0, "<pad>": 1}}, "added_tokens": [{"id": 1, "content": "<|eom|>", "special": true}]})");
  const auto special = HfTokenizerDifference(a, b);
  ASSERT_TRUE(special.has_value());  // id 1: "<|pad|>" (a's added, not special) and "<pad>"
  EXPECT_EQ(special->a, "<|pad|>");
  EXPECT_EQ(special->b, "<pad>");
  WriteText(
      a + "/tokenizer.json",
      R"({"model": {"vocab": {"x": 0, "<pad>": 1}}, "added_tokens": [{"id": 1, "content": "<|reserved|>", "special": true}]})");
  EXPECT_EQ(HfTokenizerDifference(a, b), std::nullopt);
  WriteText(b + "/tokenizer.json", "[1]");
  ExpectContains(ErrorOf([&] { HfTokenizerDifference(a, b); }),
                 {b + "/tokenizer.json", "JSON object"});
}

TEST(HfConfigJson, RoundTripsEachFamily) {
  for (const Json& source : {Llama32(), Qwen25(), Qwen3(), Mistral()}) {
    SCOPED_TRACE(source["model_type"].get<std::string>());
    const ModelConfig m = Read(source);
    const std::string text = HfConfigJson(m);
    const Json written = Json::parse(text);
    EXPECT_EQ(written["architectures"], source["architectures"]);
    EXPECT_EQ(written["hidden_act"], "silu");
    EXPECT_EQ(written["torch_dtype"], "float32");
    EXPECT_EQ(written["head_dim"], m.head_size());
    const std::string dir = TempDir("_" + source["model_type"].get<std::string>());
    WriteText(dir + "/config.json", text);
    ModelConfig back;
    ReadHfConfig(dir, back);
    ModelConfig want = m;
    want.head_dim = m.head_size();  // always written explicitly
    ExpectSameModel(back, want);
  }
  // GPT-2, with either GELU: the template (here GPT-2's own config.json) gives the token ids only.
  for (const char* act : {"gelu_new", "gelu"}) {
    SCOPED_TRACE(act);
    Json source = Gpt2();
    source["activation_function"] = act;
    const ModelConfig m = Read(source);
    const std::string dir = TempDir(std::string("_gpt2_") + act);
    WriteText(dir + "/config.json", HfConfigJson(m, ConfigDir(source) + "/config.json"));
    const Json written = Json::parse(testing::ReadBytes(dir + "/config.json"));
    EXPECT_EQ(written["activation_function"], act);
    EXPECT_EQ(written["eos_token_id"], 50256);
    EXPECT_EQ(written["n_inner"], 3072);
    ModelConfig back;
    ReadHfConfig(dir, back);
    ExpectSameModel(back, m);
  }
  // A llama-family model made in YAML (no intermediate_size, no head_dim) exports its widths.
  ModelConfig y;
  y.family = ModelFamily::kLlama;
  y.d_model = 64;
  y.n_head = 4;
  y.mlp_ratio = 2.5;
  const Json j = Json::parse(HfConfigJson(y));
  EXPECT_EQ(j["intermediate_size"], 160);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["num_key_value_heads"], 4);
  EXPECT_EQ(j["rope_scaling"], nullptr);
}

TEST(HfConfigJson, KeepsTheTemplatesOtherKeys) {
  ModelConfig student = Read(Llama32());  // (Read uses the test's directory: first)
  const std::string dir = TempDir("_template");
  Json teacher = Llama32();
  teacher["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1.0}};
  teacher["quantization_config"] = {{"quant_method", "bitsandbytes"}};
  teacher["layer_types"] = {"full_attention"};
  teacher["dtype"] = "bfloat16";
  WriteText(dir + "/teacher.json", teacher.dump());
  student.n_layer = 4;
  student.rope_scaling = RopeScaling{};
  const std::string text = HfConfigJson(student, dir + "/teacher.json");
  EXPECT_EQ(text.rfind("{\n  \"", 0), 0u) << "2-space indent";
  const Json j = Json::parse(text);
  EXPECT_EQ(j["bos_token_id"], 128000);
  EXPECT_EQ(j["eos_token_id"], 128001);
  EXPECT_EQ(j["num_hidden_layers"], 4);
  EXPECT_EQ(j["rope_scaling"], nullptr);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_FALSE(j.contains("rope_parameters"));
  EXPECT_FALSE(j.contains("quantization_config"));
  EXPECT_FALSE(j.contains("layer_types"));
  // Another family's template (a GPT-2 teacher's config.json): its token ids only.
  WriteText(dir + "/gpt2.json", Gpt2().dump());
  const Json from_gpt2 = Json::parse(HfConfigJson(student, dir + "/gpt2.json"));
  EXPECT_EQ(from_gpt2["eos_token_id"], 50256);
  EXPECT_EQ(from_gpt2["model_type"], "llama");
  for (const char* key : {"n_embd", "n_layer", "activation_function", "task_specific_params",
                          "summary_type", "architectures"}) {
    if (std::string(key) == "architectures") {
      EXPECT_EQ(from_gpt2[key], Json::array({"LlamaForCausalLM"}));
    } else {
      EXPECT_FALSE(from_gpt2.contains(key)) << key;
    }
  }
  // A template path that does not exist: start from nothing.
  EXPECT_FALSE(Json::parse(HfConfigJson(student, dir + "/absent.json")).contains("bos_token_id"));
  WriteText(dir + "/bad.json", "{");
  ExpectContains(ErrorOf([&] { HfConfigJson(student, dir + "/bad.json"); }),
                 {dir + "/bad.json", "parse error"});
}

TEST(HfConfigJson, RefusesWhatConfigJsonCannotSay) {
  ModelConfig m = Read(Qwen25());
  m.attention_bias = false;
  ExpectContains(ErrorOf([&] { HfConfigJson(m); }), {"qwen2", "attention_bias"});
  m = Read(Llama32());
  m.attention_out_bias = true;
  ExpectContains(ErrorOf([&] { HfConfigJson(m); }), {"attention_out_bias"});
  m = Read(Llama32());
  m.qk_norm = true;
  ExpectContains(ErrorOf([&] { HfConfigJson(m); }), {"qk_norm"});
  // The gpt family is GPT2LMHeadModel's (hf_model_test checks transformers' logits of it).
  m = Read(Llama32());
  m.family = ModelFamily::kGpt;
  ExpectContains(HfConfigJson(m),
                 {"\"model_type\": \"gpt2\"", "\"activation_function\": \"gelu\""});
  m = Read(Llama32());
  m.hf_model_type = "gemma";
  ExpectContains(ErrorOf([&] { HfConfigJson(m); }), {"hf_model_type", "\"gemma\""});
}

}  // namespace
}  // namespace distill

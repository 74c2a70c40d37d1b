// config.json of the llama and gpt families, read and written by the book: the defaults of absent
// keys are those of transformers' LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config /
// GPT2Config.
#include "distill/hf_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "distill/file_io.h"
#include "json_limits.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

struct Family {
  const char* model_type;
  const char* architecture;
  int64_t default_max_position_embeddings;
  // An absent num_key_value_heads: the config class's default (0: num_attention_heads).
  int64_t default_num_key_value_heads;
};
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", 2048, 0},
    {"mistral", "MistralForCausalLM", 4096 * 32, 8},
    {"qwen2", "Qwen2ForCausalLM", 32768, 32},
    {"qwen3", "Qwen3ForCausalLM", 32768, 32},
};
constexpr const char* kSupportedTypes = "llama, mistral, qwen2, qwen3";

const Family* FindFamily(const std::string& model_type) {
  for (const auto& f : kFamilies) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

std::string Quoted(const std::string& s) { return Json(s).dump(); }

// A JSON value in words for "got ...".
std::string Describe(const Json* v) {
  if (v == nullptr) return "no such key";
  if (v->is_array()) return "an array";
  if (v->is_object()) return "an object";
  std::string s = v->dump();
  return s.size() <= 40 ? s : s.substr(0, 40) + "...";
}

// Typed access to the keys of one JSON object; errors are "<file>: <prefix><key>: expected ...,
// got ...". A key whose value is null counts as absent (transformers' None).
class Keys {
 public:
  Keys(std::string file, const Json& object, std::string prefix = "")
      : file_(std::move(file)), object_(object), prefix_(std::move(prefix)) {}

  const Json* Find(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(const std::string& key) const { return Find(key) != nullptr; }
  // "got ..." for key's value v (Find's): a null value, which counts as absent, is named as null.
  std::string Got(const std::string& key, const Json* v) const {
    return v == nullptr && object_.contains(key) ? "null" : Describe(v);
  }

  [[noreturn]] void Fail(const std::string& key, const std::string& expected,
                         const std::string& got) const {
    throw ConfigError(
        fmt::format("{}: {}{}: expected {}, got {}", file_, prefix_, key, expected, got));
  }

  int64_t Int(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr && fallback) return *fallback;
    if (v == nullptr || !v->is_number_integer()) Fail(key, "an integer", Got(key, v));
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail(key, "an integer that fits in 64 bits", Got(key, v));
    }
    return v->get<int64_t>();
  }
  int64_t PositiveInt(const std::string& key,
                      std::optional<int64_t> fallback = std::nullopt) const {
    const int64_t n = Int(key, fallback);
    if (n <= 0) Fail(key, "an integer > 0", std::to_string(n));
    return n;
  }
  double Number(const std::string& key, std::optional<double> fallback = std::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr && fallback) return *fallback;
    if (v == nullptr || !v->is_number()) Fail(key, "a number", Got(key, v));
    return v->get<double>();
  }
  double PositiveNumber(const std::string& key,
                        std::optional<double> fallback = std::nullopt) const {
    const double x = Number(key, fallback);
    if (!(x > 0) || !std::isfinite(x)) Fail(key, "a finite number > 0", Describe(Find(key)));
    return x;
  }
  bool Bool(const std::string& key, bool fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) Fail(key, "true or false", Got(key, v));
    return v->get<bool>();
  }
  std::string String(const std::string& key,
                     std::optional<std::string> fallback = std::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr && fallback) return *fallback;
    if (v == nullptr || !v->is_string()) Fail(key, "a string", Got(key, v));
    return v->get<std::string>();
  }

 private:
  std::string file_;
  const Json& object_;
  std::string prefix_;
};

// Reads `path` as a JSON object; ConfigError naming the file (and the line and column of a parse
// error).
template <typename J>
J ReadJsonObject(const std::string& path) {
  std::error_code ec;  // a FIFO would block the open, a device never end
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
    throw ConfigError(
        fmt::format("{}: not a regular file (a directory, device or pipe); expected "
                    "a JSON file",
                    path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(
        fmt::format("{}: cannot read: {}{}", path, std::strerror(errno), RelativeTo(path)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  J json;
  const auto bounded = [&path](int depth, typename J::parse_event_t, J&) {
    if (depth > kMaxJsonDepth) throw ConfigError(path + ": " + JsonTooDeep());
    return true;
  };
  try {
    json = J::parse(ss.str(), bounded);
  } catch (const typename J::parse_error& e) {
    throw ConfigError(fmt::format("{}: expected JSON, got a {}", path, JsonReason(e)));
  } catch (const typename J::exception& e) {  // a number out of range (1e400), ...
    throw ConfigError(fmt::format("{}: expected JSON that fits: {}", path, JsonReason(e)));
  }
  if (!json.is_object()) {
    throw ConfigError(fmt::format("{}: expected a JSON object, got {}", path,
                                  json.is_array() ? std::string("an array") : json.dump()));
  }
  return json;
}

// rope_scaling (or the newer rope_parameters spelling) into `scaling`, as transformers 5 reads
// them: no rope_type (nor the older "type") is the default RoPE, and llama3's
// original_max_position_embeddings defaults to the model's max_position_embeddings.
void ReadRopeScaling(const std::string& file, const Json& rope, const std::string& key,
                     int64_t max_position_embeddings, RopeScaling& scaling) {
  if (!rope.is_object()) {
    throw ConfigError(
        fmt::format("{}: {}: expected an object or null, got {}", file, key, Describe(&rope)));
  }
  const Keys keys(file, rope, key + ".");
  const std::string type_key = keys.Has("rope_type") ? "rope_type" : "type";
  const std::string type = keys.String(type_key, "default");
  scaling = RopeScaling{};
  if (type == "default") {
    scaling.type = "";
    return;
  }
  if (type != "llama3") {
    throw ConfigError(
        fmt::format("{}: {}.{}: rope type {} is not supported; supported: default, "
                    "llama3",
                    file, key, type_key, Quoted(type)));
  }
  scaling.type = "llama3";
  scaling.factor = keys.PositiveNumber("factor");
  scaling.low_freq_factor = keys.PositiveNumber("low_freq_factor");
  scaling.high_freq_factor = keys.PositiveNumber("high_freq_factor");
  scaling.original_max_position_embeddings =
      keys.PositiveInt("original_max_position_embeddings", max_position_embeddings);
  if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
    keys.Fail("high_freq_factor",
              fmt::format("a number > low_freq_factor ({})", scaling.low_freq_factor),
              Describe(keys.Find("high_freq_factor")));
  }
}

// transformers' spellings of the two GELUs that GPT2Config's activation_function can name.
constexpr const char* kGeluTanhNames[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"};

// model_type gpt2 (GPT2LMHeadModel, or a bare GPT2Model's weights): the gpt family, with the
// defaults of transformers' GPT2Config. What the family cannot run is refused by name.
ModelConfig ReadGpt2Config(const Keys& keys, const ModelConfig& model) {
  ModelConfig m;  // the llama-only keys at their defaults
  m.hf_dir = model.hf_dir;
  m.family = ModelFamily::kGpt;
  m.vocab_size = keys.PositiveInt("vocab_size", 50257);
  m.pad_vocab_to_multiple_of = 1;
  m.context_length = keys.PositiveInt("n_positions", 1024);
  m.d_model = keys.PositiveInt("n_embd", 768);
  m.n_layer = keys.PositiveInt("n_layer", 12);
  m.n_head = keys.PositiveInt("n_head", 12);
  if (m.d_model % m.n_head != 0) {
    keys.Fail("n_embd", fmt::format("a multiple of n_head ({})", m.n_head),
              std::to_string(m.d_model));
  }
  m.mlp_ratio = model.mlp_ratio;  // unused: intermediate_size is set
  m.intermediate_size = keys.PositiveInt("n_inner", 4 * m.d_model);  // null: 4 * n_embd
  const std::string act = keys.String("activation_function", "gelu_new");
  if (act == "gelu") {
    m.activation = Activation::kGelu;
  } else if (std::find_if(std::begin(kGeluTanhNames), std::end(kGeluTanhNames),
                          [&](const char* name) { return act == name; }) !=
             std::end(kGeluTanhNames)) {
    m.activation = Activation::kGeluTanh;
  } else {
    keys.Fail("activation_function",
              "\"gelu\" (exact) or \"gelu_new\", \"gelu_pytorch_tanh\", \"gelu_fast\" (tanh)",
              Quoted(act));
  }
  const double eps = keys.PositiveNumber("layer_norm_epsilon", 1e-5);
  if (eps != 1e-5) {
    keys.Fail("layer_norm_epsilon", "1e-05 (the gpt family's LayerNorm)",
              Describe(keys.Find("layer_norm_epsilon")));
  }
  if (!keys.Bool("scale_attn_weights", true)) {
    keys.Fail("scale_attn_weights", "true (attention scaled by 1/sqrt(head width))", "false");
  }
  if (keys.Bool("scale_attn_by_inverse_layer_idx", false)) {
    keys.Fail("scale_attn_by_inverse_layer_idx", "false (not supported)", "true");
  }
  if (keys.Bool("add_cross_attention", false)) {
    keys.Fail("add_cross_attention", "false (a decoder-only model)", "true");
  }
  m.tie_embeddings = keys.Bool("tie_word_embeddings", true);  // PretrainedConfig's default
  m.dropout = keys.Number("attn_pdrop", 0.1);
  if (!(m.dropout >= 0 && m.dropout < 1)) {
    keys.Fail("attn_pdrop", "a number in [0, 1)", Describe(keys.Find("attn_pdrop")));
  }
  return m;
}

}  // namespace

void ReadHfConfig(const std::string& hf_dir, ModelConfig& model) {
  const std::string file = (fs::path(hf_dir) / "config.json").string();
  const Json json = ReadJsonObject<Json>(file);
  const Keys keys(file, json);

  const std::string model_type = keys.String("model_type");
  if (model_type == "gpt2") {
    model = ReadGpt2Config(keys, model);
    return;
  }
  const Family* family = FindFamily(model_type);
  if (family == nullptr) {
    keys.Fail("model_type", fmt::format("one of gpt2, {}", kSupportedTypes), Quoted(model_type));
  }
  const std::string act = keys.String("hidden_act", "silu");
  // "swish" is transformers' other name of the same function (ACT2FN: both nn.SiLU).
  if (act != "silu" && act != "swish") {
    keys.Fail("hidden_act", "\"silu\" or \"swish\" (SwiGLU)", Quoted(act));
  }

  ModelConfig m = model;  // assigned back only when everything parsed
  m.family = ModelFamily::kLlama;
  m.activation = Activation::kGelu;  // unused by the family
  m.hf_model_type = model_type;
  m.vocab_size = keys.PositiveInt("vocab_size");
  m.pad_vocab_to_multiple_of = 1;
  m.d_model = keys.PositiveInt("hidden_size");
  m.n_layer = keys.PositiveInt("num_hidden_layers");
  m.n_head = keys.PositiveInt("num_attention_heads");
  // As the config classes read it: absent, their default (MistralConfig 8, Qwen2/3Config 32,
  // LlamaConfig num_attention_heads); null, num_attention_heads, except MistralConfig, which
  // refuses null (transformers 5.24's validation).
  const bool kv_absent = !json.contains("num_key_value_heads");
  if (!kv_absent && json["num_key_value_heads"].is_null() && model_type == "mistral") {
    keys.Fail("num_key_value_heads", "an integer (MistralConfig takes no null here)", "null");
  }
  const int64_t kv_default = kv_absent && family->default_num_key_value_heads > 0
                                 ? family->default_num_key_value_heads
                                 : m.n_head;
  m.n_kv_head = keys.PositiveInt("num_key_value_heads", kv_default);
  if (m.n_head % m.n_kv_head != 0) {
    keys.Fail("num_key_value_heads", fmt::format("a divisor of num_attention_heads ({})", m.n_head),
              kv_absent ? fmt::format("no such key, which {} reads as its default, {}",
                                      family->architecture, m.n_kv_head)
                        : std::to_string(m.n_kv_head));
  }
  // Qwen3Config's head_dim defaults to 128; the others' to hidden_size / num_attention_heads.
  m.head_dim = keys.Has("head_dim")    ? keys.PositiveInt("head_dim")
               : model_type == "qwen3" ? 128
                                       : 0;
  if (m.head_dim == 0 && m.d_model % m.n_head != 0) {
    keys.Fail(
        "hidden_size",
        fmt::format("a multiple of num_attention_heads ({}) when head_dim is absent", m.n_head),
        std::to_string(m.d_model));
  }
  m.intermediate_size = keys.PositiveInt("intermediate_size");
  m.norm_eps = keys.PositiveNumber("rms_norm_eps", 1e-6);
  m.context_length =
      keys.PositiveInt("max_position_embeddings", family->default_max_position_embeddings);
  // transformers' model classes (not PretrainedConfig) default tie_word_embeddings to false.
  m.tie_embeddings = keys.Bool("tie_word_embeddings", false);
  m.dropout = keys.Number("attention_dropout", 0.0);
  if (!(m.dropout >= 0 && m.dropout < 1)) {
    keys.Fail("attention_dropout", "a number in [0, 1)", Describe(keys.Find("attention_dropout")));
  }

  // RoPE as transformers 5 reads it: rope_scaling (the older spelling) if present, else
  // rope_parameters, gives the type and the scaling; rope_theta is that object's, else the top
  // level's, else 10000.
  const Json* rope_parameters = keys.Find("rope_parameters");
  if (rope_parameters != nullptr && !rope_parameters->is_object()) {
    keys.Fail("rope_parameters", "an object or null", Describe(rope_parameters));
  }
  // (`rope_scaling or rope_parameters` in Python: an empty rope_scaling object counts as absent.)
  const Json* rope_scaling = keys.Find("rope_scaling");
  if (rope_scaling != nullptr && rope_scaling->is_object() && rope_scaling->empty()) {
    rope_scaling = nullptr;
  }
  const Json* rope = rope_scaling != nullptr ? rope_scaling : rope_parameters;
  const std::string rope_key = rope_scaling != nullptr ? "rope_scaling" : "rope_parameters";
  if (rope != nullptr && rope->is_object() && Keys(file, *rope, rope_key + ".").Has("rope_theta")) {
    m.rope_theta = Keys(file, *rope, rope_key + ".").PositiveNumber("rope_theta");
  } else if (keys.Has("rope_theta")) {
    m.rope_theta = keys.PositiveNumber("rope_theta");
  } else {
    m.rope_theta = 10000.0;
  }
  m.rope_scaling = RopeScaling{};
  if (rope != nullptr) ReadRopeScaling(file, *rope, rope_key, m.context_length, m.rope_scaling);
  // A top-level original_max_position_embeddings (Phi-3's layout, kept by some converted Llama
  // configs) takes priority over the rope object's, as transformers 5 standardises it.
  if (m.rope_scaling.type == "llama3" && keys.Has("original_max_position_embeddings")) {
    m.rope_scaling.original_max_position_embeddings =
        keys.PositiveInt("original_max_position_embeddings");
  }

  // Biases as each model class builds its layers.
  m.attention_bias = m.attention_out_bias = m.mlp_bias = false;
  if (model_type == "llama") {
    m.attention_bias = m.attention_out_bias = keys.Bool("attention_bias", false);
    m.mlp_bias = keys.Bool("mlp_bias", false);
  } else if (model_type == "qwen2") {
    m.attention_bias = true;  // q, k, v; never o_proj
  } else if (model_type == "qwen3") {
    m.attention_bias = m.attention_out_bias = keys.Bool("attention_bias", false);
  }
  m.qk_norm = model_type == "qwen3";

  // Sliding-window attention is not implemented: only a window that covers the context passes.
  // Mistral slides whenever sliding_window is not null (absent: 4096). Qwen2/3 as their
  // transformers 5 configs say: the window is null unless use_sliding_window, and then slides
  // the layers layer_types names "sliding_attention", or without layer_types those from
  // max_window_layers (default 28) on.
  bool sliding = false;
  const Json* layer_types = keys.Find("layer_types");
  if (layer_types != nullptr) {
    if (!layer_types->is_array()) keys.Fail("layer_types", "an array", Describe(layer_types));
    for (const Json& t : *layer_types) {
      if (t != "full_attention" && t != "sliding_attention") {
        keys.Fail("layer_types", "\"full_attention\" or \"sliding_attention\" entries",
                  Describe(&t));
      }
      sliding = sliding || t == "sliding_attention";
    }
  }
  if (model_type == "qwen2" || model_type == "qwen3") {
    const bool layered =
        layer_types != nullptr ? sliding : keys.Int("max_window_layers", 28) < m.n_layer;
    sliding = keys.Bool("use_sliding_window", false) && layered;
  } else {
    sliding = model_type == "mistral";
  }
  const bool window_null = json.contains("sliding_window") && json["sliding_window"].is_null();
  if (sliding && !window_null) {
    const int64_t window = keys.PositiveInt("sliding_window", 4096);  // the classes' default
    if (window < m.context_length) {
      keys.Fail("sliding_window",
                fmt::format("null or >= max_position_embeddings ({})", m.context_length),
                fmt::format("{} (sliding-window attention is not supported)", window));
    }
  }
  model = m;
}

std::optional<HfMismatch> HfExpressibleMismatch(const ModelConfig& model) {
  const std::string& type = model.hf_model_type;
  const auto tf = [](bool b) { return std::string(b ? "true" : "false"); };
  // What each model class can express.
  if (type == "qwen2") {
    if (!model.attention_bias)
      return HfMismatch{"attention_bias", "true (Qwen2 has q/k/v biases)", "false"};
  } else if (type == "mistral") {
    if (model.attention_bias)
      return HfMismatch{"attention_bias", "false (Mistral has no biases)", "true"};
  } else if (model.attention_bias != model.attention_out_bias) {
    return HfMismatch{
        "attention_out_bias",
        fmt::format("{} (one attention_bias key covers q, k, v and o)", tf(model.attention_bias)),
        tf(model.attention_out_bias)};
  }
  if ((type == "qwen2" || type == "mistral") && model.attention_out_bias) {
    return HfMismatch{"attention_out_bias", "false (o_proj has no bias)", "true"};
  }
  if (type != "llama" && model.mlp_bias) {
    return HfMismatch{"mlp_bias", "false (only llama has MLP biases)", "true"};
  }
  if (model.qk_norm != (type == "qwen3")) {
    return HfMismatch{"qk_norm", fmt::format("{} (qk-norm is Qwen3's)", tf(type == "qwen3")),
                      tf(model.qk_norm)};
  }
  if (!model.rope_scaling.type.empty() && model.rope_scaling.type != "llama3") {
    return HfMismatch{"rope_scaling.type", "\"\" or \"llama3\"", Quoted(model.rope_scaling.type)};
  }
  return std::nullopt;
}

namespace {

// ModelConfig::mlp_width(), spelled out here: this file links against config.h alone.
int64_t MlpWidth(const ModelConfig& model) {
  return model.intermediate_size > 0
             ? model.intermediate_size
             : std::max<int64_t>(
                   1, std::llround(model.mlp_ratio * static_cast<double>(model.d_model)));
}

// The gpt family as transformers' GPT2LMHeadModel: pre-LayerNorm blocks (eps 1e-5, torch's
// default, as the trainer's LayerNorm), learned positions, the model's GELU ("gelu": exact, erf;
// "gelu_new": GPT-2's tanh approximation), biases everywhere, one dropout for attention,
// residual and embeddings. Only the template's token ids are kept: its other keys may belong to
// another architecture (a llama teacher's).
std::string Gpt2ConfigJson(const ModelConfig& model, const std::string& template_path) {
  OrderedJson json = OrderedJson::object();
  json["architectures"] = OrderedJson::array({"GPT2LMHeadModel"});
  json["model_type"] = "gpt2";
  json["vocab_size"] = model.vocab_size;
  json["n_positions"] = model.context_length;
  json["n_embd"] = model.d_model;
  json["n_layer"] = model.n_layer;
  json["n_head"] = model.n_head;
  json["n_inner"] = MlpWidth(model);
  json["activation_function"] = model.activation == Activation::kGelu ? "gelu" : "gelu_new";
  json["resid_pdrop"] = model.dropout;
  json["embd_pdrop"] = model.dropout;
  json["attn_pdrop"] = model.dropout;
  json["layer_norm_epsilon"] = 1e-5;
  json["initializer_range"] = 0.02;
  json["scale_attn_weights"] = true;
  json["scale_attn_by_inverse_layer_idx"] = false;
  json["reorder_and_upcast_attn"] = false;
  json["tie_word_embeddings"] = model.tie_embeddings;
  std::error_code ec;
  OrderedJson from = OrderedJson::object();
  if (!template_path.empty() && fs::exists(template_path, ec)) {
    from = ReadJsonObject<OrderedJson>(template_path);
  }
  // Ids the template does not give are null: GPT2Config's defaults (50256) lie outside most
  // vocabularies.
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    json[key] = from.contains(key) ? from[key] : OrderedJson(nullptr);
  }
  json["torch_dtype"] = "float32";
  return json.dump(2) + "\n";
}

}  // namespace

std::string HfConfigJson(const ModelConfig& model, const std::string& template_path) {
  if (model.family == ModelFamily::kGpt) return Gpt2ConfigJson(model, template_path);
  const std::string where =
      fmt::format("config.json for model_type {}", Quoted(model.hf_model_type));
  const auto fail = [&](const std::string& key, const std::string& expected,
                        const std::string& got) {
    throw ConfigError(fmt::format("{}: {}: expected {}, got {}", where, key, expected, got));
  };
  const Family* family = FindFamily(model.hf_model_type);
  if (family == nullptr) {
    fail("hf_model_type", fmt::format("one of {}", kSupportedTypes), Quoted(model.hf_model_type));
  }
  if (const auto mismatch = HfExpressibleMismatch(model)) {
    fail(mismatch->key, mismatch->expected, mismatch->got);
  }

  OrderedJson json = OrderedJson::object();
  std::error_code ec;
  if (!template_path.empty() && fs::exists(template_path, ec)) {
    json = ReadJsonObject<OrderedJson>(template_path);
    // Another family's config.json (a GPT-2 teacher's): its keys mean nothing here (n_embd,
    // task_specific_params, ...); only its token ids carry over.
    const auto type = json.find("model_type");
    if (type == json.end() || !type->is_string() ||
        FindFamily(type->get<std::string>()) == nullptr) {
      OrderedJson ids = OrderedJson::object();
      for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
        if (json.contains(key)) ids[key] = json[key];
      }
      json = ids;
    }
  }
  // (original_max_position_embeddings: rope_scaling below holds the model's; a top-level copy
  // would take priority over it in transformers.)
  for (const char* key : {"rope_parameters", "layer_types", "quantization_config", "quantization",
                          "compression_config", "original_max_position_embeddings"}) {
    json.erase(key);
  }
  const int64_t intermediate = MlpWidth(model);

  const std::string& type = model.hf_model_type;
  json["model_type"] = type;
  json["architectures"] = OrderedJson::array({family->architecture});
  json["vocab_size"] = model.vocab_size;
  json["hidden_size"] = model.d_model;
  json["intermediate_size"] = intermediate;
  json["num_hidden_layers"] = model.n_layer;
  json["num_attention_heads"] = model.n_head;
  json["num_key_value_heads"] = model.kv_heads();
  json["head_dim"] = model.head_size();
  json["max_position_embeddings"] = model.context_length;
  json["rms_norm_eps"] = model.norm_eps;
  json["rope_theta"] = model.rope_theta;
  if (model.rope_scaling.type.empty()) {
    json["rope_scaling"] = nullptr;
  } else {
    const RopeScaling& s = model.rope_scaling;
    json["rope_scaling"] = {
        {"factor", s.factor},
        {"high_freq_factor", s.high_freq_factor},
        {"low_freq_factor", s.low_freq_factor},
        {"original_max_position_embeddings", s.original_max_position_embeddings},
        {"rope_type", "llama3"}};
  }
  json["tie_word_embeddings"] = model.tie_embeddings;
  if (type == "qwen2") {
    json.erase("attention_bias");
  } else {
    json["attention_bias"] = model.attention_bias;
  }
  json["mlp_bias"] = model.mlp_bias;
  json["attention_dropout"] = model.dropout;
  json["hidden_act"] = "silu";
  if (type == "mistral") json["sliding_window"] = nullptr;
  if (type == "qwen2" || type == "qwen3") json["use_sliding_window"] = false;
  json["torch_dtype"] = "float32";
  if (json.contains("dtype")) json["dtype"] = "float32";  // transformers >= 4.56's spelling
  return json.dump(2) + "\n";
}

namespace {
// One past a token id of tokenizer.json, saturating: an id past int64 (which get<int64_t> would
// wrap to a negative number) or a fractional one (1e9) counts, and counts as large as it is.
int64_t PastId(const Json& id) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (id.is_number_unsigned()) {
    const uint64_t v = id.get<uint64_t>();
    return v >= static_cast<uint64_t>(kMax) ? kMax : static_cast<int64_t>(v) + 1;
  }
  if (id.is_number_integer()) {
    const int64_t v = id.get<int64_t>();
    return v < 0 ? 0 : (v < kMax ? v + 1 : kMax);
  }
  if (id.is_number_float()) {
    const double v = id.get<double>();
    if (!(v >= 0)) return 0;
    return v >= 9.2e18 ? kMax : static_cast<int64_t>(v) + 1;
  }
  return 0;
}

// The tokenizer.json of `dir`, or nullopt without one. Throws ConfigError naming the file when
// it is not a JSON object.
std::optional<Json> ReadTokenizerJson(const std::string& dir) {
  const std::string path = (fs::path(dir) / "tokenizer.json").string();
  std::error_code ec;  // a symbolic link loop, or to nothing: the read below names it
  if (!fs::exists(path, ec) && !ec && !fs::is_symlink(fs::symlink_status(path, ec))) {
    return std::nullopt;
  }
  return ReadJsonObject<Json>(path);
}

// f(past_id, token, special) for every token of a tokenizer.json: the model's vocabulary (BPE
// and WordPiece: token -> id; Unigram: [piece, score] by id), then the added tokens (special:
// their "special" flag). past_id is PastId's (one past the id, saturating; 0 for an id that is no
// number).
template <typename F>
void ForEachTokenizerId(const Json& json, F&& f) {
  const auto text = [](const Json& v) { return v.is_string() ? v.get<std::string>() : ""; };
  const auto model = json.find("model");
  if (model != json.end() && model->is_object()) {
    const auto vocab = model->find("vocab");
    if (vocab != model->end() && vocab->is_object()) {
      for (const auto& [token, id] : vocab->items()) f(PastId(id), token, false);
    } else if (vocab != model->end() && vocab->is_array()) {
      int64_t id = 0;
      for (const auto& piece : *vocab) {
        f(++id, piece.is_array() && !piece.empty() ? text(piece[0]) : std::string(), false);
      }
    }
  }
  const auto added = json.find("added_tokens");
  if (added != json.end() && added->is_array()) {
    for (const auto& token : *added) {
      if (!token.is_object()) continue;
      const auto id = token.find("id");
      if (id == token.end()) continue;
      const auto content = token.find("content"), special = token.find("special");
      f(PastId(*id), content != token.end() ? text(*content) : std::string(),
        special != token.end() && special->is_boolean() && special->get<bool>());
    }
  }
}

}  // namespace

std::optional<int64_t> HfTokenizerSize(const std::string& dir) {
  const std::optional<Json> json = ReadTokenizerJson(dir);
  if (!json) return std::nullopt;
  int64_t size = 0;
  ForEachTokenizerId(
      *json, [&](int64_t past_id, const std::string&, bool) { size = std::max(size, past_id); });
  return size;
}

std::optional<TokenizerDifference> HfTokenizerDifference(const std::string& dir_a,
                                                         const std::string& dir_b) {
  std::error_code ec;
  const fs::path a_file = fs::path(dir_a) / "tokenizer.json",
                 b_file = fs::path(dir_b) / "tokenizer.json";
  if (fs::equivalent(a_file, b_file, ec) && !ec) return std::nullopt;  // one file
  // Each side's id -> token, read the same way (an id listed twice, in the vocabulary and the
  // added tokens, keeps its last token on both sides); special added tokens left out.
  const auto tokens_of = [](const std::string& dir) {
    std::optional<std::map<int64_t, std::string>> tokens;
    const std::optional<Json> json = ReadTokenizerJson(dir);
    if (!json) return tokens;
    tokens.emplace();
    ForEachTokenizerId(*json, [&](int64_t past_id, const std::string& token, bool special) {
      if (past_id > 0 && !special) (*tokens)[past_id - 1] = token;
    });
    return tokens;
  };
  const auto a = tokens_of(dir_a);
  if (!a) return std::nullopt;
  const auto b = tokens_of(dir_b);
  if (!b) return std::nullopt;
  std::optional<TokenizerDifference> first;
  int64_t count = 0;
  for (const auto& [id, token] : *a) {  // in id order: the first difference is the lowest id
    const auto other = b->find(id);
    if (other == b->end() || other->second == token) continue;
    if (count++ == 0) first = TokenizerDifference{id, token, other->second, 0};
  }
  if (first) first->count = count;
  return first;
}

}  // namespace distill

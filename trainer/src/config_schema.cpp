// The key table: every configuration key is declared here exactly once.
#include "config_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distill/metrics.h"  // JsonQuote

namespace distill::internal {
namespace {

// What a key accepts: the description used in error messages, and the test.
template <typename T>
struct Rule {
  std::string expected;
  std::function<bool(const T&)> ok;
  bool path = false;  // a path or a glob (KeyDecl::path_value)
};

Rule<int64_t> IntAtLeast(int64_t lo) {
  return {fmt::format("an integer >= {}", lo), [lo](const int64_t& v) { return v >= lo; }};
}
Rule<int64_t> IntIn(int64_t lo, int64_t hi) {
  return {fmt::format("an integer in [{}, {}]", lo, hi),
          [=](const int64_t& v) { return v >= lo && v <= hi; }};
}
Rule<int64_t> AnyInt() {
  return {"an integer", [](const int64_t&) { return true; }};
}
Rule<double> NumberAtLeast(double lo) {
  return {fmt::format("a number >= {}", lo), [lo](const double& v) { return v >= lo; }};
}
// [lo, hi) when hi_open, else [lo, hi].
Rule<double> NumberIn(double lo, double hi, bool hi_open) {
  return {fmt::format("a number in [{}, {}{}", lo, hi, hi_open ? ")" : "]"),
          [=](const double& v) { return v >= lo && (hi_open ? v < hi : v <= hi); }};
}
Rule<double> NumberStrictlyIn(double lo, double hi) {
  return {fmt::format("a number in ({}, {})", lo, hi),
          [=](const double& v) { return v > lo && v < hi; }};
}
Rule<double> NumberAboveAtMost(double lo, double hi) {
  return {fmt::format("a number in ({}, {}]", lo, hi),
          [=](const double& v) { return v > lo && v <= hi; }};
}
Rule<std::string> OneOf(std::vector<std::string> names) {
  std::vector<std::string> shown;  // the empty choice as "" (an invisible ", llama3" otherwise)
  for (const auto& n : names) shown.push_back(n.empty() ? "\"\"" : n);
  return {fmt::format("one of: {}", fmt::join(shown, ", ")), [names](const std::string& v) {
            for (const auto& n : names) {
              if (v == n) return true;
            }
            return false;
          }};
}
// Paths and globs: a NUL would cut the name the system sees short of the one the config shows
// (a leading '~' is refused for a requested config only: CheckCrossKey, over every key with
// this rule).
Rule<std::string> PathOrGlob() {
  return {"a string without NUL characters",
          [](const std::string& v) { return v.find('\0') == std::string::npos; },
          /*path=*/true};
}
Rule<bool> Bool() {
  return {"true or false", [](const bool&) { return true; }};
}
Rule<std::array<double, 2>> Betas() {
  return {"a list of two numbers in [0, 1)", [](const std::array<double, 2>& b) {
            return b[0] >= 0 && b[0] < 1 && b[1] >= 0 && b[1] < 1;
          }};
}

// YAML node -> value; nullopt when the node is not a scalar of that type.
template <typename T>
std::optional<T> Convert(const YAML::Node& node) {
  // "010": YAML 1.1 reads 8, YAML 1.2 and yaml-cpp 10 (a config other tools read as 8).
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (node.IsScalar() && HasLeadingZero(node.Scalar())) return std::nullopt;
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (node.IsNull()) return std::string();  // `key:` or `key=`: the empty string
  }
  if (!node.IsScalar()) return std::nullopt;
  if constexpr (std::is_enum_v<T>) {  // one of EnumNames<T>'s names (config.h)
    const auto& names = EnumNames<T>::kNames;
    for (size_t i = 0; i < names.size(); ++i) {
      if (node.Scalar() == names[i]) return static_cast<T>(i);
    }
    // An enum named auto | true | false (distill.fused_linear, train.cuda_graph) takes YAML's
    // other boolean spellings as the bool keys do (yes / no, on / off, True / False, ...).
    const auto true_at = std::find(names.begin(), names.end(), std::string_view("true"));
    const auto false_at = std::find(names.begin(), names.end(), std::string_view("false"));
    if (true_at != names.end() && false_at != names.end()) {
      bool value = false;
      if (YAML::convert<bool>::decode(node, value)) {
        return static_cast<T>((value ? true_at : false_at) - names.begin());
      }
    }
    return std::nullopt;
  } else {
    try {
      T value = node.as<T>();
      if constexpr (std::is_floating_point_v<T>) {
        if (!std::isfinite(value)) return std::nullopt;
      }
      return value;
    } catch (const YAML::Exception&) {
      return std::nullopt;
    }
  }
}
template <>
std::optional<std::array<double, 2>> Convert(const YAML::Node& node) {
  if (!node.IsSequence() || node.size() != 2) return std::nullopt;
  auto a = Convert<double>(node[0]);
  auto b = Convert<double>(node[1]);
  if (!a || !b) return std::nullopt;
  return std::array<double, 2>{*a, *b};
}

// Any enum with EnumNames (config.h): one of its names.
template <typename E>
Rule<E> OneOfEnum() {
  return {fmt::format("one of: {}", fmt::join(EnumNames<E>::kNames, ", ")),
          [](const E&) { return true; }};
}

std::string ToYaml(int64_t v) { return std::to_string(v); }
std::string ToYaml(double v) { return fmt::format("{}", v); }
std::string ToYaml(bool v) { return v ? "true" : "false"; }
std::string ToYaml(const std::array<double, 2>& v) { return fmt::format("[{}, {}]", v[0], v[1]); }
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
std::string ToYaml(E v) {
  return EnumName(v);
}
std::string ToYaml(const std::string& v) {
  bool plain = !v.empty();
  for (char c : v) {
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
                      c == '/' || c == '-');
  }
  // Not a word YAML reads as something else: a sequence entry ("-"), null ("null", "Null",
  // "NULL": yaml-cpp reads each as null), true or false. (Only these: the run's identity is this
  // text, and a path like "./data" or "True" must keep the spelling it had in runs made before.)
  std::string lower = v;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (plain && v != "-" && v != "true" && v != "false" && lower != "null") return v;
  // A double-quoted YAML scalar that parses back to exactly `v` (paths with newlines, quotes,
  // '#', control bytes, ...): a JSON string is one (YAML 1.2 reads JSON's escapes).
  return JsonQuote(v);
}

// Declares one key. `access` is a generic lambda `(auto& config) -> auto&` returning the field,
// so one accessor serves both reading (const Config) and writing.
template <typename T, typename Access>
void Add(std::vector<KeyDecl>& keys, std::string path, Access access, Rule<T> rule,
         std::string help) {
  KeyDecl decl;
  decl.path = std::move(path);
  decl.expected = rule.expected;
  decl.help = std::move(help);
  decl.set = [access, ok = rule.ok](const YAML::Node& node, Config& config) {
    std::optional<T> value = Convert<T>(node);
    if (!value || !ok(*value)) return false;
    access(config) = *value;
    return true;
  };
  decl.get = [access](const Config& config) { return ToYaml(access(config)); };
  if constexpr (std::is_same_v<T, std::string>) {
    if (rule.path) {
      decl.path_value = [access](const Config& config) -> const std::string& {
        return access(config);
      };
    }
  }
  keys.push_back(std::move(decl));
}

// The architecture keys shared by `student` and `teacher`; `model(config)` returns the section.
template <typename Model>
void AddModelKeys(std::vector<KeyDecl>& keys, const std::string& section, Model model) {
  auto key = [&](const char* name) { return section + "." + name; };
  Add(
      keys, key("family"), [=](auto& c) -> auto& { return model(c).family; },
      OneOfEnum<ModelFamily>(),
      "gpt: GPT-2-style (the quickstart's model); llama: Llama/Qwen2/Qwen3/Mistral/SmolLM2 "
      "decoders.");
  Add(
      keys, key("hf_dir"), [=](auto& c) -> auto& { return model(c).hf_dir; }, PathOrGlob(),
      "A Hugging Face model directory (config.json + safetensors): architecture and weights "
      "come from it (model_type gpt2: family gpt; llama, mistral, qwen2, qwen3: family llama); "
      "keys set here must agree with its config.json.");
  Add(
      keys, key("vocab_size"), [=](auto& c) -> auto& { return model(c).vocab_size; },
      IntIn(2, int64_t{1} << 31), "Real vocabulary size; data tokens are in [0, vocab_size).");
  Add(
      keys, key("pad_vocab_to_multiple_of"),
      [=](auto& c) -> auto& { return model(c).pad_vocab_to_multiple_of; },
      IntIn(1, int64_t{1} << 20),
      "Round the embedding/lm_head rows up to a multiple of this; padded logits are -inf.");
  Add(
      keys, key("context_length"), [=](auto& c) -> auto& { return model(c).context_length; },
      IntIn(1, int64_t{1} << 24),
      "Longest input sequence (gpt: learned positions; llama: max_position_embeddings).");
  Add(
      keys, key("n_layer"), [=](auto& c) -> auto& { return model(c).n_layer; }, IntIn(1, 4096),
      "Transformer blocks.");
  Add(
      keys, key("n_head"), [=](auto& c) -> auto& { return model(c).n_head; }, IntIn(1, 4096),
      "Attention (query) heads per block; gpt: must divide d_model.");
  Add(
      keys, key("d_model"), [=](auto& c) -> auto& { return model(c).d_model; },
      IntIn(1, int64_t{1} << 20), "Width of the residual stream (HF: hidden_size).");
  Add(
      keys, key("mlp_ratio"), [=](auto& c) -> auto& { return model(c).mlp_ratio; },
      NumberStrictlyIn(0, 1024),
      "MLP hidden width = round(mlp_ratio * d_model), unless intermediate_size is set.");
  Add(
      keys, key("dropout"), [=](auto& c) -> auto& { return model(c).dropout; },
      NumberIn(0, 1, true),
      std::string("Dropout while training: gpt on attention, MLP and embeddings; llama on the "
                  "attention probabilities (HF: attention_dropout, GPT-2's attn_pdrop, which an "
                  "hf_dir model takes from config.json unless this key is set).") +
          (section == "teacher" ? " Only a teacher the pipeline trains (pretrain_steps > 0) uses "
                                  "it: a loaded teacher runs without dropout."
                                : ""));
  Add(
      keys, key("tie_embeddings"), [=](auto& c) -> auto& { return model(c).tie_embeddings; },
      Bool(), "lm_head shares the token embedding matrix.");
  Add(
      keys, key("activation"), [=](auto& c) -> auto& { return model(c).activation; },
      OneOfEnum<Activation>(),
      "gpt: the MLP's GELU, exact (gelu, erf) or the tanh approximation (gelu_tanh: GPT-2's "
      "gelu_new; HF: activation_function). llama: gelu (its MLP is SwiGLU).");
  Add(
      keys, key("n_kv_head"), [=](auto& c) -> auto& { return model(c).n_kv_head; }, IntIn(0, 4096),
      "llama: key/value heads (grouped-query attention); 0: n_head.");
  Add(
      keys, key("head_dim"), [=](auto& c) -> auto& { return model(c).head_dim; }, IntIn(0, 65536),
      "llama: width of one attention head; 0: d_model / n_head.");
  Add(
      keys, key("intermediate_size"), [=](auto& c) -> auto& { return model(c).intermediate_size; },
      IntIn(0, int64_t{1} << 22),
      "MLP hidden width (llama: SwiGLU's; gpt: HF n_inner); 0: round(mlp_ratio * d_model).");
  Add(
      keys, key("norm_eps"), [=](auto& c) -> auto& { return model(c).norm_eps; },
      NumberStrictlyIn(0, 1), "llama: RMSNorm epsilon (HF: rms_norm_eps).");
  Add(
      keys, key("rope_theta"), [=](auto& c) -> auto& { return model(c).rope_theta; },
      NumberStrictlyIn(1, 1e12), "llama: RoPE base.");
  Add(
      keys, key("rope_scaling.type"), [=](auto& c) -> auto& { return model(c).rope_scaling.type; },
      OneOf({"", "llama3"}), "llama: RoPE frequency scaling (\"\": none; llama3).");
  Add(
      keys,
      key("rope_scaling.factor"), [=](auto& c) -> auto& { return model(c).rope_scaling.factor; },
      NumberStrictlyIn(0, 1e6), "llama3 scaling: factor.");
  Add(
      keys, key("rope_scaling.low_freq_factor"),
      [=](auto& c) -> auto& { return model(c).rope_scaling.low_freq_factor; },
      NumberStrictlyIn(0, 1e6), "llama3 scaling: low_freq_factor.");
  Add(
      keys, key("rope_scaling.high_freq_factor"),
      [=](auto& c) -> auto& { return model(c).rope_scaling.high_freq_factor; },
      NumberStrictlyIn(0, 1e6), "llama3 scaling: high_freq_factor (> low_freq_factor).");
  Add(
      keys, key("rope_scaling.original_max_position_embeddings"),
      [=](auto& c) -> auto& { return model(c).rope_scaling.original_max_position_embeddings; },
      IntIn(1, int64_t{1} << 24), "llama3 scaling: the pretraining context length.");
  Add(
      keys, key("attention_bias"), [=](auto& c) -> auto& { return model(c).attention_bias; },
      Bool(), "llama: biases on the q, k, v projections (Qwen2: true).");
  Add(
      keys,
      key("attention_out_bias"), [=](auto& c) -> auto& { return model(c).attention_out_bias; },
      Bool(), "llama: bias on the attention output projection.");
  Add(
      keys, key("mlp_bias"), [=](auto& c) -> auto& { return model(c).mlp_bias; }, Bool(),
      "llama: biases on the MLP projections.");
  Add(
      keys, key("qk_norm"), [=](auto& c) -> auto& { return model(c).qk_norm; }, Bool(),
      "llama: RMSNorm of every query and key head before RoPE (Qwen3).");
  Add(
      keys, key("hf_model_type"), [=](auto& c) -> auto& { return model(c).hf_model_type; },
      OneOf({"llama", "mistral", "qwen2", "qwen3"}),
      "llama: the config.json model_type written when the model is exported.");
}

std::vector<KeyDecl> Declare() {
  std::vector<KeyDecl> k;
  AddModelKeys(
      k, "student", [](auto& c) -> auto& { return c.student; });
  Add(
      k, "student.init_from_teacher", [](auto& c) -> auto& { return c.student.init_from_teacher; },
      Bool(), "Self-distillation: start the student as an exact copy of the teacher.");
  AddModelKeys(
      k, "teacher", [](auto& c) -> auto& { return c.teacher; });
  Add(
      k, "teacher.checkpoint", [](auto& c) -> auto& { return c.teacher.checkpoint; }, PathOrGlob(),
      "Teacher weights: a checkpoint file, or a run directory (its latest intact checkpoint).");
  Add(
      k, "teacher.pretrain_steps", [](auto& c) -> auto& { return c.teacher.pretrain_steps; },
      IntIn(0, int64_t{1} << 40) /* the pretraining stage's train.steps (<= 2^40) */,
      "Without a checkpoint: pretrain the teacher this many steps into <out_dir>/teacher first.");

  Add(
      k, "data.source", [](auto& c) -> auto& { return c.data.source; },
      OneOf({"synthetic", "text", "tokens"}),
      "synthetic: seeded Markov language with a known entropy floor; text: bytes of data.path; "
      "tokens: llm.c token shards.");
  Add(
      k, "data.path", [](auto& c) -> auto& { return c.data.path; }, PathOrGlob(),
      "text: the UTF-8 file to train on (byte-level tokens, vocab_size 256); tokens: a glob of "
      "llm.c .bin shards (training).");
  Add(
      k, "data.val_path", [](auto& c) -> auto& { return c.data.val_path; }, PathOrGlob(),
      "tokens: a glob of validation shards; empty: the last val_fraction of data.path's tokens.");
  Add(
      k, "data.val_fraction", [](auto& c) -> auto& { return c.data.val_fraction; },
      NumberStrictlyIn(0, 1),
      "text, tokens: the last fraction of the data is the validation split (tokens: unless "
      "data.val_path is set). The cut is at a token, not a document boundary.");
  Add(
      k, "data.batch_size", [](auto& c) -> auto& { return c.data.batch_size; },
      IntIn(1, int64_t{1} << 20), "Sequences per micro-batch.");
  Add(
      k, "data.seq_len", [](auto& c) -> auto& { return c.data.seq_len; },
      IntIn(1, int64_t{1} << 24),
      "Tokens predicted per sequence; at most the models' context_length.");
  Add(
      k, "data.min_seq_len", [](auto& c) -> auto& { return c.data.min_seq_len; },
      IntIn(1, int64_t{1} << 24),
      "synthetic: lengths are uniform in [min_seq_len, seq_len]; the rest is ignored padding.");
  Add(
      k, "data.seed", [](auto& c) -> auto& { return c.data.seed; }, AnyInt(),
      "Seed of the data (the synthetic language and its split, the batches' windows); batches "
      "depend only on seed and position.");
  Add(
      k, "data.synthetic.order", [](auto& c) -> auto& { return c.data.synthetic.order; },
      IntAtLeast(1), "Tokens of context that determine the next token's distribution.");
  Add(
      k, "data.synthetic.branching", [](auto& c) -> auto& { return c.data.synthetic.branching; },
      IntIn(1, 64), "Distinct possible successors of every context (<= vocab_size).");
  Add(
      k, "data.synthetic.zipf", [](auto& c) -> auto& { return c.data.synthetic.zipf; },
      NumberAtLeast(0), "Successor r has probability proportional to r^-zipf (0: uniform).");

  Add(
      k, "distill.divergence", [](auto& c) -> auto& { return c.distill.divergence; },
      OneOfEnum<Divergence>(),
      "Divergence between student and teacher distributions, from the logits "
      "(lossfns::distill_loss; "
      "docs/distill.md).");
  Add(
      k, "distill.jsd_beta", [](auto& c) -> auto& { return c.distill.jsd_beta; },
      NumberIn(0, 1, false),
      "JSD's mixture weight beta (divergence jsd): beta*KL(q‖m) + (1-beta)*KL(p‖m), m = beta*q + "
      "(1-beta)*p; 0 is forward_kl, 1 is reverse_kl.");
  Add(
      k, "distill.temperature", [](auto& c) -> auto& { return c.distill.temperature; },
      // Logits up to |100| divided by 1e-3 stay below 1e5, far inside fp32 (and exp() of their
      // differences from the row max underflows to 0 cleanly); 1e3 flattens any such logits to
      // uniform already, so larger values only hide a typo.
      NumberIn(1e-3, 1e3, false),
      "Both models' logits are divided by this before the softmax. The divergence is not "
      "multiplied by temperature^2 (Hinton's convention): set distill.kd_weight to T^2 for it.");
  Add(
      k, "distill.kd_weight", [](auto& c) -> auto& { return c.distill.kd_weight; },
      NumberIn(0, 1e6, false), "Weight of the divergence term.");
  Add(
      k, "distill.ce_weight", [](auto& c) -> auto& { return c.distill.ce_weight; },
      NumberIn(0, 1e6, false), "Weight of the hard-label cross-entropy term.");
  Add(
      k, "distill.ignore_index", [](auto& c) -> auto& { return c.distill.ignore_index; }, AnyInt(),
      "Target value marking padding: no loss, no gradient, not counted (must be outside [0, V)).");
  Add(
      k, "distill.vocab_size", [](auto& c) -> auto& { return c.distill.vocab_size; },
      IntIn(0, int64_t{1} << 31),
      "The tokenizer's real vocabulary: logit columns at or past it are -inf in both models "
      "(and the narrower logits are padded with -inf columns); 0: every column is real.");
  Add(
      k, "distill.fused_linear", [](auto& c) -> auto& { return c.distill.fused_linear; },
      OneOfEnum<FusedLinear>(),
      "Distill mode: the loss from both models' last hidden states and lm_heads in token chunks "
      "(lossfns::fused_linear_distill_loss), so no (BT, V) logits exist: far less memory, the "
      "loss 0.90-0.98x the time with the hard-label term, 1.03-1.13x without "
      "(docs/fused_linear.md). auto: on CUDA, not on the CPU.");

  Add(
      k, "optim.lr", [](auto& c) -> auto& { return c.optim.lr; },
      NumberAboveAtMost(0, 10) /* AdamW moves each weight by up to ~lr per step */,
      "AdamW peak learning rate.");
  Add(
      k, "optim.betas", [](auto& c) -> auto& { return c.optim.betas; }, Betas(),
      "AdamW (beta1, beta2).");
  Add(
      k, "optim.eps", [](auto& c) -> auto& { return c.optim.eps; }, NumberIn(1e-30, 1, false),
      "AdamW eps (>= 1e-30: a normal fp32 number, not 0).");
  Add(
      k, "optim.weight_decay", [](auto& c) -> auto& { return c.optim.weight_decay; },
      NumberAtLeast(0),
      "Decoupled weight decay on matrices (not on biases and norms); below 1 / optim.lr (each "
      "step multiplies the weights by 1 - lr * weight_decay).");
  Add(
      k, "optim.grad_clip", [](auto& c) -> auto& { return c.optim.grad_clip; },
      NumberIn(0, 1e30, false),  // the clip is a float32 scalar on the device
      "Clip the global gradient norm to this; 0 disables clipping.");

  Add(
      k, "schedule.kind", [](auto& c) -> auto& { return c.schedule.kind; },
      OneOfEnum<ScheduleKind>(), "Learning-rate decay after the warmup.");
  Add(
      k, "schedule.warmup_steps", [](auto& c) -> auto& { return c.schedule.warmup_steps; },
      IntAtLeast(0), "Linear warmup from lr/warmup_steps to lr.");
  Add(
      k, "schedule.min_lr_ratio", [](auto& c) -> auto& { return c.schedule.min_lr_ratio; },
      NumberIn(0, 1, false), "The decay ends at lr * min_lr_ratio on the last step.");

  Add(
      k, "train.mode", [](auto& c) -> auto& { return c.train.mode; }, OneOfEnum<Mode>(),
      "pretrain: cross-entropy only, trains the `student` model (how a teacher is made); distill: "
      "trains the student against the frozen teacher with distill.kd_weight x divergence + "
      "distill.ce_weight x cross-entropy (needs a teacher: teacher.hf_dir, teacher.checkpoint or "
      "teacher.pretrain_steps > 0).");
  Add(
      k, "train.steps", [](auto& c) -> auto& { return c.train.steps; },
      IntIn(1, int64_t{1} << 40) /* x grad_accum (<= 2^20): micro-batch counts stay < 2^60 */,
      "Optimizer steps.");
  Add(
      k, "train.grad_accum", [](auto& c) -> auto& { return c.train.grad_accum; },
      IntIn(1, int64_t{1} << 20),
      "Micro-batches per optimizer step; the loss is normalised over all their tokens. "
      "Data-parallel: the global batch, split evenly over the ranks (a multiple of the number "
      "of GPUs).");
  Add(
      k, "train.seed", [](auto& c) -> auto& { return c.train.seed; }, AnyInt(),
      "Seed of initialisation and dropout.");
  Add(
      k, "train.device", [](auto& c) -> auto& { return c.train.device; },
      OneOf({"auto", "cpu", "cuda"}),
      "auto: CUDA when available, else CPU. Under torchrun: `cuda:LOCAL_RANK` (cpu is refused).");
  Add(
      k, "train.precision", [](auto& c) -> auto& { return c.train.precision; },
      OneOfEnum<Precision>(), "bf16: autocast the forward passes to bfloat16 (CUDA only).");
  Add(
      k, "train.log_interval", [](auto& c) -> auto& { return c.train.log_interval; }, IntAtLeast(1),
      "Write a metrics record every this many steps.");
  Add(
      k, "train.eval_interval", [](auto& c) -> auto& { return c.train.eval_interval; },
      IntAtLeast(0), "Evaluate every this many steps (0: only at the end).");
  Add(
      k, "train.eval_batches", [](auto& c) -> auto& { return c.train.eval_batches; },
      IntIn(1, int64_t{1} << 20),
      "Validation micro-batches per evaluation, the same ones every time: tokens, "
      "eval_batches x batch_size windows spread evenly over the validation data (all of them, in "
      "order, when it holds no more; past its count of windows they repeat, with a warning at the "
      "start); text, the same seeded random windows of the validation split; synthetic, the same "
      "generated sequences.");
  Add(
      k, "train.checkpoint_interval", [](auto& c) -> auto& { return c.train.checkpoint_interval; },
      IntAtLeast(0), "Checkpoint every this many steps (0: only at the end).");
  Add(
      k, "train.keep_checkpoints", [](auto& c) -> auto& { return c.train.keep_checkpoints; },
      IntAtLeast(1), "Keep the newest this many checkpoints.");
  Add(
      k, "train.resume", [](auto& c) -> auto& { return c.train.resume; }, Bool(),
      "Continue the run in out_dir if it is the same run; false: refuse an existing run.");
  Add(
      k, "train.baseline", [](auto& c) -> auto& { return c.train.baseline; }, Bool(),
      "distill mode: also train the student on hard labels only, into <out_dir>-baseline (the "
      "pipeline: <out_dir>/baseline).");
  Add(
      k, "train.out_dir", [](auto& c) -> auto& { return c.train.out_dir; }, PathOrGlob(),
      "Run directory: config, metrics.jsonl, checkpoints/, summary.json.");
  Add(
      k, "train.export_hf", [](auto& c) -> auto& { return c.train.export_hf; }, Bool(),
      "At the end, write the student as a Hugging Face directory <out_dir>/hf: llama family, "
      "and gpt-family runs with a student or teacher hf_dir (GPT2LMHeadModel; other gpt runs: "
      "distill_trainer export RUN_DIR OUT_DIR).");
  Add(
      k, "train.export_from", [](auto& c) -> auto& { return c.train.export_from; }, PathOrGlob(),
      "A Hugging Face model directory whose config.json keys (token ids) and tokenizer files the "
      "export takes where the student's and teacher's hf_dir give none (\"\": none; a gpt-family "
      "run with it exports too). The hard-label baseline of a distillation from a Hugging Face "
      "teacher (train.baseline) gets the teacher's hf_dir here.");
  Add(
      k, "train.nonfinite", [](auto& c) -> auto& { return c.train.nonfinite; },
      OneOfEnum<NonFinite>(),
      "A step whose kd/ce loss or gradient norm is NaN/inf: stop (an error before the optimizer "
      "step; the last checkpoint stays good) or skip (no update; counted and logged).");
  Add(
      k, "train.max_skipped_steps", [](auto& c) -> auto& { return c.train.max_skipped_steps; },
      IntIn(0, 1000000),
      "skip: more skipped steps than this in the run (over resumes) is an error.");
  Add(
      k, "train.bucket_mb", [](auto& c) -> auto& { return c.train.bucket_mb; }, IntIn(1, 4096),
      "Data-parallel: MiB of gradients per all-reduce bucket; each bucket's all-reduce starts "
      "during the last micro-batch's backward as soon as its gradients are final.");
  Add(
      k, "train.collective_timeout_s",
      [](auto& c) -> auto& { return c.train.collective_timeout_s; }, IntIn(1, 7 * 24 * 3600),
      "Data-parallel: seconds a rank waits in a collective for the others (a rank writing a "
      "large checkpoint, or one that failed) before NCCL ends every process; raise it where "
      "rank 0's checkpoints take minutes to write.");
  Add(
      k, "train.cuda_graph", [](auto& c) -> auto& { return c.train.cuda_graph; },
      OneOfEnum<CudaGraph>(),
      "CUDA: each micro-batch's forward, loss and backward is captured once as a CUDA graph "
      "(after 2 eager steps) and replayed, so small models are not bound by kernel launches "
      "(docs/trainer.md). auto: on for one CUDA process; off data-parallel, under "
      "--profile-steps, with student dropout and on the CPU. true: also with dropout; refused on "
      "the CPU and data-parallel.");
  Add(
      k, "train.activation_checkpointing",
      [](auto& c) -> auto& { return c.train.activation_checkpointing; }, Bool(),
      "Keep only each transformer block's inputs for the backward and run the block again there: "
      "the same gradients with a fraction of the activation memory, for about a third more "
      "compute (docs/trainer.md). Needs dropout 0 in the trained model.");
  return k;
}

}  // namespace

std::vector<std::pair<std::string, double>> TrainedModelDropouts(const Config& c) {
  std::vector<std::pair<std::string, double>> trained = {{"student", c.student.dropout}};
  if (c.train.mode == Mode::kDistill && c.teacher.pretrain_steps > 0) {
    trained.emplace_back("teacher", c.teacher.dropout);
  }
  return trained;
}

bool HasLeadingZero(const std::string& scalar) {
  const size_t start = !scalar.empty() && (scalar[0] == '-' || scalar[0] == '+') ? 1 : 0;
  if (scalar.size() < start + 2 || scalar[start] != '0') return false;
  return std::all_of(scalar.begin() + static_cast<std::ptrdiff_t>(start), scalar.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

const std::vector<KeyDecl>& Keys() {
  static const std::vector<KeyDecl> keys = Declare();
  return keys;
}

}  // namespace distill::internal

// distill_trainer's configuration: one plain struct per component, nested in Config.
//
// The defaults below are the single source of truth: the key table in config_schema.cpp reads
// them for --help and --print-config, and the parser starts from a default-constructed Config.
// No torch headers here: every TU may include this cheaply.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "lossfns/defaults.h"
#include "lossfns/divergence.h"

namespace distill {

// The string-valued keys are parsed once, when the config is loaded, into these enums; each
// enum's table of names (EnumNames<E>::kNames, in the enum's order) serves the schema, the
// parser, --help, --print-config and messages (EnumName). Adding a value is one enumerator and
// one name.
template <typename E>
struct EnumNames;

template <typename E>
const char* EnumName(E value) {
  return EnumNames<E>::kNames[static_cast<size_t>(value)];
}

// The model families (trainer/src/models/, one file each; MakeModel in models/factory.cpp).
enum class ModelFamily { kGpt, kLlama };
template <>
struct EnumNames<ModelFamily> {
  static constexpr std::array<const char*, 2> kNames = {"gpt", "llama"};
};
inline constexpr const auto& kModelFamilyNames = EnumNames<ModelFamily>::kNames;

// The gpt family's MLP activation: the exact GELU (erf) or its tanh approximation (GPT-2's
// "gelu_new"; transformers also spells it "gelu_pytorch_tanh" and "gelu_fast").
enum class Activation { kGelu, kGeluTanh };
template <>
struct EnumNames<Activation> {
  static constexpr std::array<const char*, 2> kNames = {"gelu", "gelu_tanh"};
};

// train.mode: pretrain (cross-entropy only) | distill.
enum class Mode { kPretrain, kDistill };
template <>
struct EnumNames<Mode> {
  static constexpr std::array<const char*, 2> kNames = {"pretrain", "distill"};
};

// train.precision: fp32 | bf16 (autocast of the forward passes, CUDA only).
enum class Precision { kFp32, kBf16 };
template <>
struct EnumNames<Precision> {
  static constexpr std::array<const char*, 2> kNames = {"fp32", "bf16"};
};

// schedule.kind: the learning-rate decay after the warmup.
enum class ScheduleKind { kCosine, kLinear, kConstant };
template <>
struct EnumNames<ScheduleKind> {
  static constexpr std::array<const char*, 3> kNames = {"cosine", "linear", "constant"};
};

// distill.divergence: lossfns's divergences, by lossfns's own table of names.
using Divergence = lossfns::Divergence;
template <>
struct EnumNames<Divergence> {
  static constexpr const auto& kNames = lossfns::kDivergenceNames;
};

// distill.fused_linear: auto (on where the device is CUDA, off on the CPU) | true | false.
enum class FusedLinear { kAuto, kOn, kOff };
template <>
struct EnumNames<FusedLinear> {
  static constexpr std::array<const char*, 3> kNames = {"auto", "true", "false"};
};

// Llama-3 style frequency-dependent RoPE scaling (config.json "rope_scaling" / "rope_parameters"
// with rope_type "llama3"). type "" means no scaling.
struct RopeScaling {
  std::string type;  // "" | "llama3"
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// A decoder-only transformer. The logits have padded_vocab_size() columns; the padded ones are
// masked to -inf, so the model never predicts them and they never get gradient.
//
// family gpt: pre-LayerNorm, learned positions, GELU MLP (mlp_width() wide); GPT-2 and its
// distilled and fine-tuned descendants. family llama: RMSNorm, RoPE, SwiGLU MLP (intermediate_size
// wide), grouped-query attention; covers Llama 2/3, Qwen2/2.5/3, Mistral and SmolLM2. With hf_dir
// set, every architecture key comes from <hf_dir>/config.json (see docs/hf.md; model_type gpt2
// is the gpt family) and the weights from its safetensors.
struct ModelConfig {
  ModelFamily family = ModelFamily::kGpt;
  std::string hf_dir;  // a Hugging Face model directory: config.json + *.safetensors
  int64_t vocab_size = 64;
  int64_t pad_vocab_to_multiple_of = 64;
  int64_t context_length = 128;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t d_model = 64;
  double mlp_ratio = 4.0;
  double dropout = 0.0;
  bool tie_embeddings = true;
  Activation activation = Activation::kGelu;  // gpt family only: the MLP's GELU
  // llama family only.
  int64_t n_kv_head = 0;          // key/value heads (grouped-query attention); 0: n_head
  int64_t head_dim = 0;           // 0: d_model / n_head
  int64_t intermediate_size = 0;  // MLP width (gpt: HF n_inner); 0: round(mlp_ratio * d_model)
  double norm_eps = 1e-5;         // RMSNorm epsilon
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool attention_bias = false;      // biases on q, k, v (Qwen2: true)
  bool attention_out_bias = false;  // bias on the attention output projection
  bool mlp_bias = false;
  bool qk_norm = false;                 // RMSNorm of each query/key head before RoPE (Qwen3)
  std::string hf_model_type = "llama";  // config.json model_type written on export

  // vocab_size rounded up to a multiple of pad_vocab_to_multiple_of.
  int64_t padded_vocab_size() const {
    const int64_t m = pad_vocab_to_multiple_of;
    return (vocab_size + m - 1) / m * m;
  }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : d_model / n_head; }
  int64_t mlp_width() const;  // intermediate_size, or round(mlp_ratio * d_model) (at least 1)
};

struct StudentConfig : ModelConfig {
  // Self-distillation: the student starts as an exact copy of the teacher (same architecture).
  bool init_from_teacher = false;
};

struct TeacherConfig : ModelConfig {
  TeacherConfig() {
    n_layer = 4;
    d_model = 128;
  }
  // A checkpoint file or a run directory (its latest checkpoint) holding the teacher's weights.
  std::string checkpoint;
  // When > 0 and no checkpoint is given: pretrain the teacher first, for this many steps, into
  // <train.out_dir>/teacher (the quickstart pipeline).
  int64_t pretrain_steps = 0;
};

struct SyntheticConfig {
  int64_t order = 2;      // tokens of context that determine the next token's distribution
  int64_t branching = 4;  // possible successors of each context
  double zipf = 1.0;      // successor r (1-based) has probability proportional to r^-zipf
};

struct DataConfig {
  std::string source = "synthetic";  // synthetic | text | tokens
  std::string path;           // text: a UTF-8 file, read as bytes; tokens: a glob of llm.c shards
  std::string val_path;       // tokens: a glob of validation shards ("": val_fraction of path's)
  double val_fraction = 0.1;  // text, tokens: the last fraction of the data is validation
  int64_t batch_size = 16;    // sequences per micro-batch
  int64_t seq_len = 64;       // tokens predicted per sequence (inputs are seq_len long)
  int64_t min_seq_len = 64;   // synthetic: shorter sequences are padded, targets ignored
  int64_t seed = 1234;
  SyntheticConfig synthetic;
};

struct DistillConfig {
  Divergence divergence = Divergence::kTvd;
  double jsd_beta = 0.5;  // JSD's mixture weight (divergence jsd): 0 is forward KL, 1 reverse KL
  double temperature = 1.0;
  double kd_weight = 1.0;
  double ce_weight = 0.0;
  int64_t ignore_index = lossfns::kDefaultIgnoreIndex;
  // The tokenizer's real vocabulary: logit columns at or past it are padding, -inf in both
  // models for the losses (exact ties at probability 0, no gradient). 0: every column of the
  // logits is real. Teacher and student logits may have different widths: the narrower one's
  // missing columns are -inf.
  int64_t vocab_size = 0;
  // Compute the loss from both models' last hidden states and lm_heads, chunked over tokens
  // (lossfns::fused_linear_distill_loss), so that no (BT, V) logits exist. auto: on CUDA (on an
  // H200, 8192 tokens, V = 151936, bf16, the loss peaks at 2.1 instead of 7-9.5 GB and takes
  // 0.96-0.97x the logits path's time with a hard-label term, 1.06-1.13x without; a real-size
  // step: the same tokens/s, 44% less memory), not on the CPU. Distill mode only
  // (docs/trainer.md); UsesFusedLinear says whether a run uses it.
  FusedLinear fused_linear = FusedLinear::kAuto;
};

// Whether distill.fused_linear's setting means the fused loss on a CUDA (or other) device.
inline bool UsesFusedLinear(FusedLinear setting, bool cuda) {
  return setting == FusedLinear::kOn || (setting == FusedLinear::kAuto && cuda);
}

struct OptimConfig {
  double lr = 3e-3;
  std::array<double, 2> betas = {0.9, 0.95};
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // max global gradient norm; 0 disables clipping
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  int64_t warmup_steps = 20;
  double min_lr_ratio = 0.1;  // the decay ends at lr * min_lr_ratio
};

// What a step with a non-finite loss term or gradient norm does (train.nonfinite).
enum class NonFinite { kStop, kSkip };
template <>
struct EnumNames<NonFinite> {
  static constexpr std::array<const char*, 2> kNames = {"stop", "skip"};
};

// train.cuda_graph: auto (on for a single CUDA process) | true | false.
enum class CudaGraph { kAuto, kOn, kOff };
template <>
struct EnumNames<CudaGraph> {
  static constexpr std::array<const char*, 3> kNames = {"auto", "true", "false"};
};

struct TrainConfig {
  Mode mode = Mode::kDistill;
  int64_t steps = 300;
  int64_t grad_accum = 1;
  int64_t seed = 0;
  std::string device = "auto";  // auto | cpu | cuda
  Precision precision = Precision::kFp32;
  int64_t log_interval = 10;
  int64_t eval_interval = 100;  // 0: evaluate only at the end
  int64_t eval_batches = 8;
  int64_t checkpoint_interval = 100;  // 0: checkpoint only at the end
  int64_t keep_checkpoints = 2;
  bool resume = true;
  bool baseline = false;  // distill mode: also train the student on hard labels, for comparison
  std::string out_dir = "runs/default";
  bool export_hf = true;  // llama family: write <out_dir>/hf (config.json + safetensors) at the end
  // A Hugging Face model directory that the export also takes config.json's other keys and the
  // tokenizer files from, after the student's and the teacher's hf_dir ("": none). The
  // hard-label baseline of a distillation from a Hugging Face teacher gets the teacher's.
  std::string export_from;
  // stop: a non-finite kd/ce loss or gradient norm is an error before the optimizer step;
  // skip: the step's update is skipped (at most max_skipped_steps times in the run, counted over
  // resumes; a run whose every step was skipped is an error at its end).
  NonFinite nonfinite = NonFinite::kStop;
  int64_t max_skipped_steps = 10;
  // Data-parallel: MiB of gradients per all-reduce bucket (25, as PyTorch's DDP).
  int64_t bucket_mb = 25;
  // Data-parallel: seconds a collective (an all-reduce, a barrier) may wait for the other ranks
  // before NCCL's watchdog ends the process (600, as torch.distributed's default for NCCL).
  int64_t collective_timeout_s = 600;
  // A micro-batch's forward, loss and backward captured once as a CUDA graph and replayed
  // (step_graph.h): no per-kernel launch cost. auto: on CUDA in one process (not data-parallel,
  // not under --profile-steps); true: the same, and an error where it cannot be.
  CudaGraph cuda_graph = CudaGraph::kAuto;
  // Keep only each transformer block's inputs for the backward and recompute the rest there
  // (CausalLM::set_activation_checkpointing): the same gradients, less activation memory, one
  // more forward of the trained model's blocks per micro-batch.
  bool activation_checkpointing = false;
};

// Gives `to` (a student or teacher section) the architecture of `from`, keeping its own
// section-specific keys (init_from_teacher; checkpoint, pretrain_steps): how the pipeline
// pretrains a teacher in the student's place, and how self-distillation copies an architecture.
template <typename Section>
void SetArchitecture(Section& to, const ModelConfig& from) {
  static_cast<ModelConfig&>(to) = from;
}

struct Config {
  StudentConfig student;
  TeacherConfig teacher;
  DataConfig data;
  DistillConfig distill;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  // Where each key and section the user set was given, by key path: "<file>:<line>" or
  // `override "key=value"` (the last override of a key); keys left at their default are absent.
  // Not a key: for errors a valid value meets at run start (WithWhereGiven) and the start-up's
  // warnings about keys a run does not read.
  std::map<std::string, std::string> given_at;
};

// "<where>: <message>" when `message` starts with a key path the user set, followed by ':', ' '
// or '=' (no CUDA device for train.device: cuda, an unreadable data.path, a train.out_dir that
// is a file), in the format of ConfigError's messages; else `message` unchanged.
std::string WithWhereGiven(const Config& config, const std::string& message);

// A configuration error, already formatted as "<where>: <key.path>: expected ..., got ...".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whose config is parsed: one requested now (every check), or a run's stored config.yaml, read
// back for its identity or an export, which skips the checks that refuse keys a run would not use
// (data.path with synthetic data, ...): a run written before those checks still resumes and
// exports.
enum class ConfigOrigin { kRequested, kStored };

// Parses YAML text (`source_name` is used in messages, e.g. the file path), then applies
// `overrides` ("key.path=value", each value parsed as YAML and validated like the file), then
// checks the cross-key constraints. Throws ConfigError.
Config ParseConfig(const std::string& yaml_text, const std::string& source_name,
                   const std::vector<std::string>& overrides = {},
                   ConfigOrigin origin = ConfigOrigin::kRequested);
// Reads `path` and parses it as above. Throws ConfigError (also when the file cannot be read).
Config LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides = {},
                      ConfigOrigin origin = ConfigOrigin::kRequested);

// The resolved config as YAML, every key, in declaration order.
std::string ConfigToYaml(const Config& config);
// Every key with its type, default and meaning, generated from the key table.
std::string ConfigHelp();
// Markdown tables (one per section: key, default, accepts, meaning) from the key table: the
// reference part of docs/config.md, printed by `distill_trainer --print-config-reference`.
std::string ConfigReference();
// Key paths in declaration order ("student.vocab_size", ...).
std::vector<std::string> ConfigKeys();

// The embedded configs/quickstart.yaml (the run when distill_trainer gets no --config).
const std::string& QuickstartYaml();

}  // namespace distill

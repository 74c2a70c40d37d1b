// Hugging Face config.json <-> ModelConfig: the llama family (Llama 2/3, Mistral, Qwen2/2.5,
// Qwen3, SmolLM2) and the gpt family (GPT-2: model_type gpt2). Defaults of absent keys are those
// of the transformers config class of the model_type, so a config.json means here what it means
// to transformers.
#pragma once

#include <optional>
#include <string>

#include "distill/config.h"

namespace distill {

// Reads <hf_dir>/config.json into the architecture fields of `model` (the family from its
// model_type, pad_vocab_to_multiple_of 1; hf_dir, mlp_ratio and the fields of derived structs
// untouched; a gpt2 model's llama-only fields at their defaults). Throws ConfigError,
// "<hf_dir>/config.json: <key>: expected ..., got ...", for a missing or unreadable file, invalid
// JSON (with the byte position), a missing or mistyped key, or an architecture the families
// cannot run (model_type, hidden_act / activation_function, rope type, sliding window, GPT-2's
// layer_norm_epsilon other than 1e-5, scale_attn_by_inverse_layer_idx, cross-attention).
void ReadHfConfig(const std::string& hf_dir, ModelConfig& model);

// The config.json text (2-space indent) of `model`. Llama family: the JSON of `template_path`
// when it is non-empty and exists (e.g. the teacher's config.json, to keep the token ids), with
// every architecture key set from `model`, "rope_parameters", "layer_types" and quantization keys
// removed. Gpt family: transformers' GPT2LMHeadModel (model_type gpt2, "gelu" or "gelu_new"), with
// only the template's bos/eos/pad token ids. Throws ConfigError when a llama-family `model` has no
// config.json spelling (a bias / qk-norm choice its hf_model_type cannot express) or the
// template is not a JSON object.
std::string HfConfigJson(const ModelConfig& model, const std::string& template_path = "");

// Whether the model class of `model.hf_model_type` can express the llama-family `model`'s biases,
// qk-norm and RoPE scaling (what HfConfigJson checks): nullopt, or the first key it cannot, with
// what that key must be for the type and what it is. The config check runs it on a student that
// will be exported (train.export_hf), so that a run does not find it out only at its end.
struct HfMismatch {
  std::string key, expected, got;
};
std::optional<HfMismatch> HfExpressibleMismatch(const ModelConfig& model);

// The number of token ids of the tokenizer in `dir` (its tokenizer.json's largest id, of the
// model's vocabulary or the added tokens, plus one), or nullopt without a tokenizer.json. Throws
// ConfigError naming the file when it is not a JSON object.
std::optional<int64_t> HfTokenizerSize(const std::string& dir);

// Where two directories' tokenizers give one token id different tokens (tokenizer.json: the
// model's vocabulary and the added tokens that are not special; special tokens, such as the
// reserved ones a later release of a model renamed, are not compared): the lowest such id, its
// token in each, and how many ids differ. nullopt when they agree on every id both have (one may
// have more ids), or when either has no tokenizer.json. Throws ConfigError naming a
// tokenizer.json that is not a JSON object.
struct TokenizerDifference {
  int64_t id;
  std::string a, b;  // the id's token in dir_a's tokenizer and in dir_b's
  int64_t count;     // ids that differ
};
std::optional<TokenizerDifference> HfTokenizerDifference(const std::string& dir_a,
                                                         const std::string& dir_b);

}  // namespace distill

// The model seam: every model family is a CausalLM (tokens in, logits or last hidden states
// out). The trainer, the
// checkpoints, the optimizer set-up, the HF import/export and the convergence harness see only
// this interface; a new family is one file under trainer/src/models/ and one line in the table
// of MakeModel (models/factory.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "distill/config.h"

namespace distill {

// Parameters that get weight decay and those that do not (biases, norm gains).
struct ParameterGroups {
  std::vector<at::Tensor> decay, no_decay;
};

class CausalLM : public torch::nn::Module {
 public:
  explicit CausalLM(const ModelConfig& config) : config_(config) {}
  // tokens (B, T) int64 in [0, vocab_size), T <= context_length
  //   -> logits (B, T, logits_width()); columns of padded_mask() are exactly -inf, so a softmax
  //      gives them probability 0.0 and no gradient reaches their lm_head rows.
  virtual at::Tensor forward(const at::Tensor& tokens) = 0;
  // tokens as forward() takes them -> the final norm's output (B, T, d_model), what forward()
  // multiplies by lm_head_weight() before masking the padded columns. Its dtype is the norm's:
  // fp32 on the CPU; on CUDA under bf16 autocast bf16 (the fused AddNorm kernel) or fp32 (the
  // composite norm); LogitsOperands gives the dtype the logits' matmul runs in.
  virtual at::Tensor forward_hidden(const at::Tensor& tokens) = 0;
  // The output projection, (logits_width(), d_model); the token embedding when tied.
  virtual at::Tensor lm_head_weight() const = 0;

  const ModelConfig& config() const { return config_; }
  int64_t logits_width() const { return config_.padded_vocab_size(); }
  // (logits_width(),) bool, true for the columns the model masks to -inf: the rows past
  // vocab_size that pad_vocab_to_multiple_of added (every family), made on `device`.
  at::Tensor padded_mask(const at::Device& device = at::kCPU) const;
  // Matrices decay; vectors (biases, LayerNorm/RMSNorm gains) do not.
  virtual ParameterGroups parameter_groups();
  int64_t num_parameters() const;
  // Names of tensors that a Hugging Face file of this family may hold and this module does not
  // (rotary caches, causal-mask buffers); "*suffix" matches by suffix. Empty for non-HF families.
  virtual std::vector<std::string> hf_ignorable_tensors() const { return {}; }
  // Tensors a Hugging Face file may hold as copies of one this module ties (the lm_head of tied
  // embeddings): (the copy's name in the files, the module's name of the tensor it must equal).
  virtual std::vector<std::pair<std::string, std::string>> hf_tied_copies() const { return {}; }
  // A parameter's or buffer's name in the family's Hugging Face files, and whether they hold its
  // transpose (GPT-2's Conv1D weights); nullopt for a tensor that is not a weight of the format
  // (the gpt family's padded-column mask). By default the same name: the llama family names its
  // tensors as transformers does.
  struct HfName {
    std::string name;
    bool transpose = false;
  };
  virtual std::optional<HfName> hf_name(const std::string& name) const {
    return HfName{name, false};
  }
  // transformers' base_model_prefix where files of the bare base model (GPT2Model's, as the
  // original GPT-2 repositories hold them) name the tensors without it; "" for none.
  virtual std::string hf_base_prefix() const { return ""; }
  // Activation checkpointing (train.activation_checkpointing): with gradients enabled, each
  // transformer block keeps only its inputs for the backward and runs again there
  // (CheckpointedBlock in models/layers.h): the same gradients, less memory, one more forward of
  // the blocks. Off by default; not part of the architecture or the weights.
  void set_activation_checkpointing(bool on) { checkpoint_blocks_ = on; }
  bool activation_checkpointing() const { return checkpoint_blocks_; }

 protected:
  ModelConfig config_;
  bool checkpoint_blocks_ = false;
};

using Model = std::shared_ptr<CausalLM>;

// The two operands of the logits' matmul as forward() runs it: hidden (B, T, d_model) from
// forward_hidden and model.lm_head_weight() (logits_width(), d_model), in one dtype: autocast's
// for hidden's device type when autocast is on there (at::linear casts both operands to it),
// else hidden's. Call it under the autocast state of the forward_hidden call. The casts are
// differentiable (.to), so the gradient reaches the fp32 lm_head as it does through forward().
// No padded-column mask: a loss on these operands cuts the columns itself (vocab_size).
struct LogitsOperands {
  at::Tensor hidden, lm_head;
};
LogitsOperands MakeLogitsOperands(const CausalLM& model, const at::Tensor& hidden);

// The factory: config.family -> a freshly initialised model (weights from torch's default
// generator: seed it first for determinism), on the CPU.
Model MakeModel(const ModelConfig& config);

// Copies every parameter and buffer of `from` into `to` (same architecture), bit for bit.
void CopyWeights(const CausalLM& from, CausalLM& to);

// Stores a frozen model's matmul operands in `dtype`: every torch::nn::Linear's weight and bias
// and an lm_head that is not the token embedding. Embeddings and norms keep their dtype (the
// residual stream starts from the embedding in fp32, the norm kernels read fp32 weights). Under
// autocast to `dtype` the model then computes the same bits (autocast's cast of an fp32 weight
// is the same round-to-nearest-even .to(dtype), which is a no-op on a weight already in it) with
// none of those casts: autocast caches them only for tensors that require grad, so a frozen
// model's were redone at every forward. Returns the number of tensors converted. For a model
// that will not be trained again (its parameters must not require grad).
int64_t StoreMatmulWeightsAs(CausalLM& model, at::ScalarType dtype);

// The architecture keys as one line, stored in checkpoints to reject mismatched loads.
std::string ArchitectureString(const ModelConfig& config);

}  // namespace distill

// A decoder-only transformer language model (GPT-style, pre-LayerNorm, learned positions).
//
// forward: tokens (B, T) int64 in [0, vocab_size), T <= context_length
//       -> logits (B, T, padded_vocab_size), with the padded columns exactly -inf, so a softmax
//          gives them probability 0.0 and no gradient reaches the padded lm_head rows.
// Cost per token ~ 2 * parameters + 2 * n_layer * T * d_model FLOPs (forward).
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "distill/config.h"

namespace distill {

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  // x: (B, T, d_model) -> (B, T, d_model), causal self-attention then MLP, both residual.
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t n_head_;
  double dropout_;
  torch::nn::LayerNorm ln_attn_{nullptr}, ln_mlp_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attn_out_{nullptr}, mlp_in_{nullptr}, mlp_out_{nullptr};
  torch::nn::Dropout resid_dropout_{nullptr};
};
TORCH_MODULE(Block);

class TransformerLMImpl : public torch::nn::Module {
 public:
  // Parameters are initialised from torch's default generator: seed it first for determinism.
  explicit TransformerLMImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& tokens);

  const ModelConfig& config() const { return config_; }
  // The output projection, (padded_vocab_size, d_model); the token embedding when tied.
  at::Tensor lm_head_weight() const;
  int64_t num_parameters() const;

 private:
  ModelConfig config_;
  torch::nn::Embedding token_embedding_{nullptr}, position_embedding_{nullptr};
  torch::nn::Dropout embedding_dropout_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_final_{nullptr};
  at::Tensor lm_head_;      // (padded_vocab_size, d_model); undefined when tied
  at::Tensor padded_mask_;  // (padded_vocab_size,) bool buffer, true for padded columns
};
TORCH_MODULE(TransformerLM);

// Copies every parameter and buffer of `from` into `to` (same architecture), bit for bit.
void CopyWeights(const TransformerLM& from, TransformerLM& to);

// The architecture keys as one line, stored in checkpoints to reject mismatched loads.
std::string ArchitectureString(const ModelConfig& config);

}  // namespace distill

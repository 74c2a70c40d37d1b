#include "distill/model.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/init.h>

namespace distill {

BlockImpl::BlockImpl(const ModelConfig& c) : n_head_(c.n_head), dropout_(c.dropout) {
  const int64_t d = c.d_model;
  const int64_t hidden = std::max<int64_t>(1, std::llround(c.mlp_ratio * d));
  ln_attn_ = register_module("ln_attn", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
  attn_out_ = register_module("attn_out", torch::nn::Linear(d, d));
  ln_mlp_ = register_module("ln_mlp", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  mlp_in_ = register_module("mlp_in", torch::nn::Linear(d, hidden));
  mlp_out_ = register_module("mlp_out", torch::nn::Linear(hidden, d));
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  // (B, T, 3D) -> 3 x (B, n_head, T, D / n_head)
  auto qkv = qkv_->forward(ln_attn_->forward(x)).view({B, T, 3, n_head_, D / n_head_});
  qkv = qkv.permute({2, 0, 3, 1, 4});
  at::Tensor attn = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], /*attn_mask=*/{},
                                                     is_training() ? dropout_ : 0.0,
                                                     /*is_causal=*/true);
  attn = attn.transpose(1, 2).reshape({B, T, D});
  at::Tensor h = x + resid_dropout_->forward(attn_out_->forward(attn));
  at::Tensor m = mlp_out_->forward(at::gelu(mlp_in_->forward(ln_mlp_->forward(h))));
  return h + resid_dropout_->forward(m);
}

TransformerLMImpl::TransformerLMImpl(const ModelConfig& c) : config_(c) {
  const int64_t v = c.padded_vocab_size();
  token_embedding_ = register_module("token_embedding", torch::nn::Embedding(v, c.d_model));
  position_embedding_ =
      register_module("position_embedding", torch::nn::Embedding(c.context_length, c.d_model));
  embedding_dropout_ = register_module("embedding_dropout", torch::nn::Dropout(c.dropout));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_->push_back(Block(c));
  ln_final_ =
      register_module("ln_final", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  if (!c.tie_embeddings) lm_head_ = register_parameter("lm_head", at::empty({v, c.d_model}));
  padded_mask_ = register_buffer("padded_mask", at::arange(v).ge(c.vocab_size));

  // GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2 n_layer).
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    if (p.dim() == 1) continue;  // biases, LayerNorm: keep the defaults (0, 1)
    const bool residual = name.find("attn_out") != std::string::npos ||
                          name.find("mlp_out") != std::string::npos;
    torch::nn::init::normal_(p, 0.0, residual ? residual_std : 0.02);
  }
  for (auto& item : named_parameters()) {
    if (item.value().dim() == 1 && item.key().find("bias") != std::string::npos) {
      item.value().zero_();
    }
  }
}

at::Tensor TransformerLMImpl::lm_head_weight() const {
  return config_.tie_embeddings ? token_embedding_->weight : lm_head_;
}

at::Tensor TransformerLMImpl::forward(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
              "TransformerLM: tokens must be (B, T) int64, got ", tokens.sizes(), " ",
              tokens.scalar_type());
  const int64_t T = tokens.size(1);
  TORCH_CHECK(T <= config_.context_length, "TransformerLM: sequence length ", T,
              " exceeds context_length ", config_.context_length);
  at::Tensor positions = at::arange(T, tokens.options());
  at::Tensor h = token_embedding_->forward(tokens) + position_embedding_->forward(positions);
  h = embedding_dropout_->forward(h);
  for (const auto& block : *blocks_) h = block->as<Block>()->forward(h);
  at::Tensor logits = at::linear(ln_final_->forward(h), lm_head_weight());  // (B, T, V_padded)
  if (config_.padded_vocab_size() == config_.vocab_size) return logits;
  // masked_fill's backward is zero at the masked columns: padded rows never get gradient.
  return logits.masked_fill(padded_mask_, -std::numeric_limits<double>::infinity());
}

int64_t TransformerLMImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void CopyWeights(const TransformerLM& from, TransformerLM& to) {
  torch::NoGradGuard no_grad;
  auto src = from->named_parameters();
  for (auto& item : to->named_parameters()) item.value().copy_(src[item.key()]);
  auto src_buffers = from->named_buffers();
  for (auto& item : to->named_buffers()) item.value().copy_(src_buffers[item.key()]);
}

std::string ArchitectureString(const ModelConfig& c) {
  return fmt::format(
      "vocab_size={} padded_vocab_size={} context_length={} n_layer={} n_head={} d_model={} "
      "mlp_ratio={} tie_embeddings={}",
      c.vocab_size, c.padded_vocab_size(), c.context_length, c.n_layer, c.n_head, c.d_model,
      c.mlp_ratio, c.tie_embeddings);
}

}  // namespace distill

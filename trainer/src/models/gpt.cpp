// Family "gpt": a decoder-only transformer (GPT-2 style: pre-LayerNorm, learned positions, GELU
// MLP, exact or tanh). The quickstart's model; read from and exported as transformers'
// GPT2LMHeadModel (hf_name() below maps the tensor names).
// Cost per token ~ 2 * parameters + 2 * n_layer * T * d_model FLOPs (forward).
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "distill/model.h"
#include "layers.h"

namespace distill {
namespace {

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& c)
      : n_head_(c.n_head), dropout_(c.dropout), tanh_(c.activation == Activation::kGeluTanh) {
    const int64_t d = c.d_model;
    const int64_t hidden = c.mlp_width();
    ln_attn_ = register_module("ln_attn", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    attn_out_ = register_module("attn_out", torch::nn::Linear(d, d));
    ln_mlp_ = register_module("ln_mlp", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    mlp_in_ = register_module("mlp_in", torch::nn::Linear(d, hidden));
    mlp_out_ = register_module("mlp_out", torch::nn::Linear(hidden, d));
    resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
  }

  // One block, causal self-attention then MLP, both residual. `x`: the residual stream (B, T,
  // d_model); `pending`: the previous block's MLP output, not yet added to it (undefined for the
  // first block). Returns the same pair for the next block: each residual add runs fused with
  // the LayerNorm that follows it (AddLayerNorm), the last one with ln_final.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& pending) {
    const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
    AddNormResult attn_in = pending.defined() ? AddLayerNorm(x, pending, ln_attn_)
                                              : AddNormResult{x, LayerNorm(ln_attn_, x)};
    // (B, T, 3D) -> 3 x (B, n_head, T, D / n_head), views. unbind, not indexing: its backward
    // stacks the three gradients in one pass, where three selects each zero-fill and add a
    // whole (3, B, T, D) gradient.
    const std::vector<at::Tensor> qkv =
        Linear(qkv_, attn_in.out).view({B, T, 3, n_head_, D / n_head_}).unbind(2);
    at::Tensor attn = at::scaled_dot_product_attention(
        qkv[0].transpose(1, 2), qkv[1].transpose(1, 2), qkv[2].transpose(1, 2),
        /*attn_mask=*/{}, is_training() ? dropout_ : 0.0, /*is_causal=*/true);
    attn = attn.transpose(1, 2).reshape({B, T, D});
    const AddNormResult mlp_in =
        AddLayerNorm(attn_in.h, resid_dropout_->forward(Linear(attn_out_, attn)), ln_mlp_);
    at::Tensor m = Linear(mlp_out_, LinearGelu(mlp_in_, mlp_in.out, tanh_));
    return {mlp_in.h, resid_dropout_->forward(m)};
  }

 private:
  int64_t n_head_;
  double dropout_;
  bool tanh_;  // the tanh approximation of GELU (GPT-2's gelu_new)
  torch::nn::LayerNorm ln_attn_{nullptr}, ln_mlp_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attn_out_{nullptr}, mlp_in_{nullptr}, mlp_out_{nullptr};
  torch::nn::Dropout resid_dropout_{nullptr};
};
TORCH_MODULE(Block);

class GptLM : public CausalLM {
 public:
  explicit GptLM(const ModelConfig& c) : CausalLM(c) {
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
    padded_mask_ = register_buffer("padded_mask", padded_mask());

    // GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2 n_layer).
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& p = item.value();
      if (p.dim() == 1) continue;  // biases, LayerNorm: keep the defaults (0, 1)
      const bool residual =
          name.find("attn_out") != std::string::npos || name.find("mlp_out") != std::string::npos;
      torch::nn::init::normal_(p, 0.0, residual ? residual_std : 0.02);
    }
    for (auto& item : named_parameters()) {
      if (item.value().dim() == 1 && item.key().find("bias") != std::string::npos) {
        item.value().zero_();
      }
    }
  }

  at::Tensor lm_head_weight() const override {
    return config_.tie_embeddings ? token_embedding_->weight : lm_head_;
  }

  // transformers' GPT2LMHeadModel: its Conv1D layers hold (in, out) weights, the transpose of
  // torch's Linear (out, in); the padded-column mask is not a weight.
  std::optional<HfName> hf_name(const std::string& name) const override {
    static const std::pair<const char*, const char*> kTop[] = {
        {"token_embedding.weight", "transformer.wte.weight"},
        {"position_embedding.weight", "transformer.wpe.weight"},
        {"ln_final.weight", "transformer.ln_f.weight"},
        {"ln_final.bias", "transformer.ln_f.bias"},
        {"lm_head", "lm_head.weight"}};
    if (name == "padded_mask") return std::nullopt;
    for (const auto& [ours, theirs] : kTop) {
      if (name == ours) return HfName{theirs, false};
    }
    // blocks.<i>.<layer>.<weight|bias>
    static const std::pair<const char*, const char*> kBlock[] = {
        {"ln_attn", "ln_1"}, {"qkv", "attn.c_attn"}, {"attn_out", "attn.c_proj"},
        {"ln_mlp", "ln_2"},  {"mlp_in", "mlp.c_fc"}, {"mlp_out", "mlp.c_proj"}};
    const std::string prefix = "blocks.";
    if (name.rfind(prefix, 0) == 0) {
      const size_t layer_at = name.find('.', prefix.size());
      const size_t tensor_at = name.rfind('.');
      if (layer_at != std::string::npos && tensor_at > layer_at) {
        const std::string index = name.substr(prefix.size(), layer_at - prefix.size());
        const std::string layer = name.substr(layer_at + 1, tensor_at - layer_at - 1);
        const std::string tensor = name.substr(tensor_at + 1);
        for (const auto& [ours, theirs] : kBlock) {
          if (layer != ours) continue;
          const bool linear = layer.rfind("ln_", 0) != 0;
          return HfName{"transformer.h." + index + "." + theirs + "." + tensor,
                        linear && tensor == "weight"};
        }
      }
    }
    TORCH_CHECK(false, "gpt model: tensor ", name, " has no GPT-2 name");
  }

  // The original GPT-2 repositories hold GPT2Model's tensors: "wte.weight", "h.0.attn.c_attn...".
  std::string hf_base_prefix() const override { return "transformer"; }

  // The causal-mask buffers of older GPT-2 files.
  std::vector<std::string> hf_ignorable_tensors() const override {
    return {"*.attn.bias", "*.attn.masked_bias"};
  }

  // The tied lm_head where a file keeps it.
  std::vector<std::pair<std::string, std::string>> hf_tied_copies() const override {
    if (!config_.tie_embeddings) return {};
    return {{"lm_head.weight", "token_embedding.weight"}};
  }

  at::Tensor forward_hidden(const at::Tensor& tokens) override {
    TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
                "gpt model: tokens must be (B, T) int64, got ", tokens.sizes(), " ",
                tokens.scalar_type());
    const int64_t T = tokens.size(1);
    TORCH_CHECK(T <= config_.context_length, "gpt model: sequence length ", T,
                " exceeds context_length ", config_.context_length);
    at::Tensor positions = at::arange(T, tokens.options());
    at::Tensor h = token_embedding_->forward(tokens) + position_embedding_->forward(positions);
    h = embedding_dropout_->forward(h);
    at::Tensor pending;  // the last block's MLP output, added to h by the final norm
    for (const auto& module : *blocks_) {
      const std::shared_ptr<BlockImpl> block = std::dynamic_pointer_cast<BlockImpl>(module);
      if (checkpoint_blocks_) {
        std::tie(h, pending) = CheckpointedBlock(
            [block](const at::Tensor& x, const at::Tensor& p) { return block->forward(x, p); }, h,
            pending);
      } else {
        std::tie(h, pending) = block->forward(h, pending);
      }
    }
    return pending.defined() ? AddLayerNorm(h, pending, ln_final_).out : LayerNorm(ln_final_, h);
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    at::Tensor logits = at::linear(forward_hidden(tokens), lm_head_weight());  // (B, T, V_padded)
    if (config_.padded_vocab_size() == config_.vocab_size) return logits;
    // masked_fill's backward is zero at the masked columns: padded rows never get gradient.
    return logits.masked_fill(padded_mask_, -std::numeric_limits<double>::infinity());
  }

 private:
  torch::nn::Embedding token_embedding_{nullptr}, position_embedding_{nullptr};
  torch::nn::Dropout embedding_dropout_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_final_{nullptr};
  at::Tensor lm_head_;      // (padded_vocab_size, d_model); undefined when tied
  at::Tensor padded_mask_;  // (padded_vocab_size,) bool buffer, true for padded columns
};

}  // namespace

Model MakeGptModel(const ModelConfig& config) { return std::make_shared<GptLM>(config); }

}  // namespace distill

// Family "llama": the Llama 2/3, Mistral, Qwen2/2.5, Qwen3 and SmolLM2 decoders. RMSNorm, rotary
// position embeddings (with Llama-3 frequency scaling), grouped-query attention through
// at::scaled_dot_product_attention (causal), SwiGLU MLP; optional q/k/v and output biases
// (Qwen2), per-head q/k RMSNorm (Qwen3), tied or untied embeddings.
//
// The module tree mirrors transformers' *ForCausalLM exactly ("model.layers.0.self_attn.q_proj.
// weight", ...), so a Hugging Face safetensors file maps onto named_parameters() one to one and
// the export writes the same names back. The arithmetic follows transformers' modeling_llama.py
// step by step (fp32 RoPE tables cast to the activations' dtype, RMSNorm in fp32 with the gain
// applied after casting back), so fp32 logits agree to rounding.
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "distill/model.h"
#include "layers.h"

namespace distill {
namespace {

// y = weight * (x / sqrt(mean(x^2) + eps)), the mean and division in fp32.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", at::ones({dim}));
  }
  at::Tensor forward(const at::Tensor& x) { return RmsNorm(x, weight, eps_); }
  // h = x + y and the norm of h, fused on CUDA (layers.h: AddRmsNorm).
  AddNormResult forward(const at::Tensor& x, const at::Tensor& y) {
    return AddRmsNorm(x, y, weight, eps_);
  }
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// (head_dim / 2,) fp32 inverse frequencies, as transformers computes them (default or llama3).
at::Tensor InverseFrequencies(const ModelConfig& c) {
  const int64_t dim = c.head_size();
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv_freq = 1.0 / at::pow(c.rope_theta, exponents);
  const RopeScaling& r = c.rope_scaling;
  if (r.type != "llama3") return inv_freq;
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth =
      (old_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const at::Tensor medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen));
  return at::where(medium, smoothed, scaled);
}

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c)
      : n_head_(c.n_head), n_kv_head_(c.kv_heads()), head_dim_(c.head_size()), dropout_(c.dropout) {
    const int64_t d = c.d_model;
    q_proj_ = register_module("q_proj", MakeLinear(d, n_head_ * head_dim_, c.attention_bias));
    k_proj_ = register_module("k_proj", MakeLinear(d, n_kv_head_ * head_dim_, c.attention_bias));
    v_proj_ = register_module("v_proj", MakeLinear(d, n_kv_head_ * head_dim_, c.attention_bias));
    o_proj_ = register_module("o_proj", MakeLinear(n_head_ * head_dim_, d, c.attention_out_bias));
    if (c.qk_norm) {
      q_norm_ = register_module("q_norm", RMSNorm(head_dim_, c.norm_eps));
      k_norm_ = register_module("k_norm", RMSNorm(head_dim_, c.norm_eps));
    }
  }

  // x: (B, T, d_model); cos, sin: (T, head_dim) fp32 -> (B, T, d_model)
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t B = x.size(0), T = x.size(1);
    at::Tensor q = Linear(q_proj_, x).view({B, T, n_head_, head_dim_});
    at::Tensor k = Linear(k_proj_, x).view({B, T, n_kv_head_, head_dim_});
    at::Tensor v = Linear(v_proj_, x).view({B, T, n_kv_head_, head_dim_}).transpose(1, 2);
    if (q_norm_) {
      q = q_norm_->forward(q);
      k = k_norm_->forward(k);
    }
    q = ApplyRope(q, cos, sin).transpose(1, 2);  // (B, heads, T, head_dim)
    k = ApplyRope(k, cos, sin).transpose(1, 2);
    at::Tensor out = at::scaled_dot_product_attention(
        q, k, v, /*attn_mask=*/{}, is_training() ? dropout_ : 0.0, /*is_causal=*/true,
        /*scale=*/std::nullopt, /*enable_gqa=*/n_kv_head_ != n_head_);
    out = out.transpose(1, 2).reshape({B, T, n_head_ * head_dim_});
    return Linear(o_proj_, out);
  }

 private:
  int64_t n_head_, n_kv_head_, head_dim_;
  double dropout_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  RMSNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& c) {
    const int64_t d = c.d_model, h = c.mlp_width();
    gate_proj_ = register_module("gate_proj", MakeLinear(d, h, c.mlp_bias));
    up_proj_ = register_module("up_proj", MakeLinear(d, h, c.mlp_bias));
    down_proj_ = register_module("down_proj", MakeLinear(h, d, c.mlp_bias));
  }
  at::Tensor forward(const at::Tensor& x) {
    return Linear(down_proj_, SwiGlu(Linear(gate_proj_, x), Linear(up_proj_, x)));
  }

 private:
  torch::nn::Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& c) {
    self_attn_ = register_module("self_attn", Attention(c));
    mlp_ = register_module("mlp", Mlp(c));
    input_layernorm_ = register_module("input_layernorm", RMSNorm(c.d_model, c.norm_eps));
    post_attention_layernorm_ =
        register_module("post_attention_layernorm", RMSNorm(c.d_model, c.norm_eps));
  }
  // `x`: the residual stream; `pending`: the previous layer's MLP output, not yet added to it
  // (undefined for the first layer). Returns the same pair for the next layer: each residual
  // add runs fused with the RMSNorm that follows it (AddRmsNorm), the last one with the final
  // norm.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& pending,
                                            const at::Tensor& cos, const at::Tensor& sin) {
    const AddNormResult attn_in = pending.defined()
                                      ? input_layernorm_->forward(x, pending)
                                      : AddNormResult{x, input_layernorm_->forward(x)};
    const AddNormResult mlp_in =
        post_attention_layernorm_->forward(attn_in.h, self_attn_->forward(attn_in.out, cos, sin));
    return {mlp_in.h, mlp_->forward(mlp_in.out)};
  }

 private:
  Attention self_attn_{nullptr};
  Mlp mlp_{nullptr};
  RMSNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
};
TORCH_MODULE(DecoderLayer);

// transformers' LlamaModel: embeddings, the layers, the final norm.
class BackboneImpl : public torch::nn::Module {
 public:
  explicit BackboneImpl(const ModelConfig& c) {
    embed_tokens =
        register_module("embed_tokens", torch::nn::Embedding(c.padded_vocab_size(), c.d_model));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) layers->push_back(DecoderLayer(c));
    norm = register_module("norm", RMSNorm(c.d_model, c.norm_eps));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Backbone);

class LlamaLM : public CausalLM {
 public:
  explicit LlamaLM(const ModelConfig& c) : CausalLM(c), inv_freq_(InverseFrequencies(c)) {
    TORCH_CHECK(c.n_head % c.kv_heads() == 0, "llama model: n_head (", c.n_head,
                ") must be a multiple of n_kv_head (", c.kv_heads(), ")");
    TORCH_CHECK(c.head_size() % 2 == 0, "llama model: head_dim must be even for RoPE, got ",
                c.head_size());
    model_ = register_module("model", Backbone(c));
    if (!c.tie_embeddings) {
      lm_head_ = register_module("lm_head", MakeLinear(c.d_model, c.padded_vocab_size(), false));
    }
    // transformers' initialisation: N(0, 0.02) for matrices and embeddings, zero biases, unit
    // norm gains (the constructors' defaults).
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      at::Tensor& p = item.value();
      if (p.dim() >= 2) {
        torch::nn::init::normal_(p, 0.0, 0.02);
      } else if (item.key().size() >= 4 &&
                 item.key().compare(item.key().size() - 4, 4, "bias") == 0) {
        p.zero_();
      }
    }
  }

  at::Tensor lm_head_weight() const override {
    return lm_head_ ? lm_head_->weight : model_->embed_tokens->weight;
  }

  std::vector<std::string> hf_ignorable_tensors() const override {
    return {"*rotary_emb.inv_freq"};
  }

  // A bare LlamaModel's (Qwen2Model's, ...) file names its tensors without "model.".
  std::string hf_base_prefix() const override { return "model"; }

  std::vector<std::pair<std::string, std::string>> hf_tied_copies() const override {
    if (!config_.tie_embeddings) return {};
    return {{"lm_head.weight", "model.embed_tokens.weight"}};
  }

  at::Tensor forward_hidden(const at::Tensor& tokens) override {
    TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
                "llama model: tokens must be (B, T) int64, got ", tokens.sizes(), " ",
                tokens.scalar_type());
    const int64_t T = tokens.size(1);
    TORCH_CHECK(T <= config_.context_length, "llama model: sequence length ", T,
                " exceeds context_length (max_position_embeddings) ", config_.context_length);
    // RoPE tables in fp32 (outside autocast, as transformers does), (T, head_dim).
    at::Tensor cos, sin;
    {
      at::Tensor positions = at::arange(T, tokens.options().dtype(at::kFloat));
      // The inverse frequencies on the tokens' device, copied there once (a copy per forward
      // would wait for the host, and could not be captured in a CUDA graph).
      if (!inv_freq_device_.defined() || inv_freq_device_.device() != tokens.device()) {
        inv_freq_device_ = inv_freq_.to(tokens.device());
      }
      at::Tensor freqs = at::outer(positions, inv_freq_device_);
      at::Tensor emb = at::cat({freqs, freqs}, -1);
      cos = emb.cos();
      sin = emb.sin();
    }
    at::Tensor h = model_->embed_tokens->forward(tokens);
    at::Tensor pending;  // the last layer's MLP output, added to h by the final norm
    for (const auto& module : *model_->layers) {
      const std::shared_ptr<DecoderLayerImpl> layer =
          std::dynamic_pointer_cast<DecoderLayerImpl>(module);
      if (checkpoint_blocks_) {
        std::tie(h, pending) = CheckpointedBlock(
            [layer, cos, sin](const at::Tensor& x, const at::Tensor& p) {
              return layer->forward(x, p, cos, sin);
            },
            h, pending);
      } else {
        std::tie(h, pending) = layer->forward(h, pending, cos, sin);
      }
    }
    return pending.defined() ? model_->norm->forward(h, pending).out : model_->norm->forward(h);
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    at::Tensor logits = at::linear(forward_hidden(tokens), lm_head_weight());
    if (config_.padded_vocab_size() == config_.vocab_size) return logits;
    // The mask made on the logits' device (no host copy per forward).
    return logits.masked_fill(padded_mask(logits.device()),
                              -std::numeric_limits<double>::infinity());
  }

 private:
  at::Tensor inv_freq_;         // (head_dim / 2,) fp32, not a parameter or buffer (not in HF files)
  at::Tensor inv_freq_device_;  // inv_freq_ on the device of the last forward
  Backbone model_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};

}  // namespace

Model MakeLlamaModel(const ModelConfig& config) { return std::make_shared<LlamaLM>(config); }

}  // namespace distill

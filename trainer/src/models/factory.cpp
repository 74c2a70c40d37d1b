// The model factory (family name -> constructor) and what every CausalLM shares.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <vector>

#include "distill/model.h"

namespace distill {

// One line per family; each is defined in its own file under trainer/src/models/.
Model MakeGptModel(const ModelConfig& config);
Model MakeLlamaModel(const ModelConfig& config);

Model MakeModel(const ModelConfig& config) {
  switch (config.family) {
    case ModelFamily::kGpt:
      return MakeGptModel(config);
    case ModelFamily::kLlama:
      return MakeLlamaModel(config);
  }
  TORCH_CHECK(false, "MakeModel: unknown model family ", static_cast<int>(config.family));
}

int64_t ModelConfig::mlp_width() const {
  if (intermediate_size > 0) return intermediate_size;
  return std::max<int64_t>(1, std::llround(mlp_ratio * d_model));
}

at::Tensor CausalLM::padded_mask(const at::Device& device) const {
  return at::arange(logits_width(), at::TensorOptions(device).dtype(at::kLong))
      .ge(config_.vocab_size);
}

LogitsOperands MakeLogitsOperands(const CausalLM& model, const at::Tensor& hidden) {
  const c10::DeviceType device = hidden.device().type();
  const at::ScalarType dtype = at::autocast::is_autocast_enabled(device)
                                   ? at::autocast::get_autocast_dtype(device)
                                   : hidden.scalar_type();
  return {hidden.to(dtype), model.lm_head_weight().to(dtype)};
}

ParameterGroups CausalLM::parameter_groups() {
  ParameterGroups groups;
  for (auto& p : parameters()) (p.dim() >= 2 ? groups.decay : groups.no_decay).push_back(p);
  return groups;
}

int64_t CausalLM::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void CopyWeights(const CausalLM& from, CausalLM& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(src[item.key()]);
  auto src_buffers = from.named_buffers();
  for (auto& item : to.named_buffers()) item.value().copy_(src_buffers[item.key()]);
}

int64_t StoreMatmulWeightsAs(CausalLM& model, at::ScalarType dtype) {
  for (const auto& p : model.parameters()) {  // checked before anything changes
    TORCH_CHECK(!p.requires_grad(),
                "StoreMatmulWeightsAs: for a frozen model; a parameter requires grad (freeze "
                "the model first: set_requires_grad(false) on every parameter)");
  }
  torch::NoGradGuard no_grad;
  int64_t converted = 0;
  auto store = [&](const at::Tensor& p) {
    if (!p.defined() || p.scalar_type() == dtype) return;
    p.set_data(p.to(dtype));  // the parameter itself (its TensorImpl), not a copy
    ++converted;
  };
  std::vector<at::Tensor> embeddings;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (const auto* e = m->as<torch::nn::EmbeddingImpl>()) embeddings.push_back(e->weight);
  }
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto* linear = m->as<torch::nn::LinearImpl>()) {
      store(linear->weight);
      store(linear->bias);
    }
  }
  const at::Tensor head = model.lm_head_weight();  // a Linear's (done), a raw parameter, or tied
  const bool tied = std::any_of(embeddings.begin(), embeddings.end(),
                                [&](const at::Tensor& e) { return e.is_same(head); });
  if (!tied) store(head);
  return converted;
}

std::string ArchitectureString(const ModelConfig& c) {
  std::string s = fmt::format(
      "vocab_size={} padded_vocab_size={} context_length={} n_layer={} n_head={} d_model={} "
      "mlp_ratio={} tie_embeddings={}",
      c.vocab_size, c.padded_vocab_size(), c.context_length, c.n_layer, c.n_head, c.d_model,
      c.mlp_ratio, c.tie_embeddings);
  if (c.family == ModelFamily::kGpt) {  // as earlier versions wrote it, plus what they lacked
    if (c.intermediate_size > 0) s += fmt::format(" intermediate_size={}", c.intermediate_size);
    if (c.activation != Activation::kGelu)
      s += fmt::format(" activation={}", EnumName(c.activation));
    return s;
  }
  const RopeScaling& r = c.rope_scaling;
  return s + fmt::format(
                 " family=llama n_kv_head={} head_dim={} intermediate_size={} norm_eps={} "
                 "rope_theta={} rope_scaling={}{} attention_bias={} attention_out_bias={} "
                 "mlp_bias={} qk_norm={}",
                 c.kv_heads(), c.head_size(), c.mlp_width(), c.norm_eps, c.rope_theta,
                 r.type.empty() ? "none" : r.type,
                 r.type.empty()
                     ? ""
                     : fmt::format("({},{},{},{})", r.factor, r.low_freq_factor, r.high_freq_factor,
                                   r.original_max_position_embeddings),
                 c.attention_bias, c.attention_out_bias, c.mlp_bias, c.qk_norm);
}

}  // namespace distill

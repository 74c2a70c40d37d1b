#include "layers.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <optional>
#include <utility>
#include <vector>

#if DISTILL_WITH_CUDA
#include "../kernels/add_norm_cuda.h"
#include "../kernels/col_sum_cuda.h"
#include "../kernels/gelu_cuda.h"
#include "../kernels/rope_cuda.h"
#include "../kernels/swiglu_cuda.h"
#endif

namespace distill {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    auto [out, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, weight, bias, eps);
    ctx->save_for_backward({x, weight, mean, rstd});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const at::Tensor grad = grads[0].contiguous();
    const int64_t d = x.size(-1);
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_x = std::get<0>(at::native_layer_norm_backward(grad, x, {d}, mean, rstd, weight,
                                                          /*bias=*/{}, {true, false, false}));
    }
    const at::Tensor g2 = grad.reshape({-1, d});
    if (ctx->needs_input_grad(1)) {
      const at::Tensor x_hat = (x.reshape({-1, d}) - mean.reshape({-1, 1})) * rstd.reshape({-1, 1});
      grad_weight = (g2 * x_hat).sum(0).to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(2)) grad_bias = g2.sum(0).to(weight.scalar_type());
    return {grad_x, grad_weight, grad_bias, at::Tensor()};
  }
};

#if DISTILL_WITH_CUDA
class AddNormFunction : public torch::autograd::Function<AddNormFunction> {
 public:
  // `bias` must be a defined tensor (autograd records every tensor argument as an input): without
  // a bias (RMSNorm) the caller passes the weight again and has_bias = false.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y,
                               const at::Tensor& weight, const at::Tensor& bias, bool has_bias,
                               double eps, bool rms, int64_t out_dtype) {
    // The backward's kernel reads the weight's memory as the forward's: the contiguous one.
    const at::Tensor w = weight.contiguous();
    auto r = cuda::AddNormForward(x.contiguous(), y.contiguous(), w,
                                  has_bias ? bias.contiguous() : at::Tensor(), eps, rms,
                                  static_cast<at::ScalarType>(out_dtype));
    ctx->save_for_backward({r.h, w, r.mean, r.rstd});
    // An output nobody used (h after the last layer) gets an undefined gradient, not a zero-filled
    // one: the kernel then reads no grad_h.
    ctx->set_materialize_grads(false);
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["y_dtype"] = static_cast<int64_t>(y.scalar_type());
    ctx->saved_data["has_bias"] = has_bias;
    return {r.h, r.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto y_dtype = static_cast<at::ScalarType>(ctx->saved_data["y_dtype"].toInt());
    const at::Tensor grad_h = grads[0].defined() ? grads[0].contiguous() : at::Tensor();
    if (!grads[1].defined()) {  // only h was used further on
      return {grad_h, grad_h.defined() ? grad_h.to(y_dtype) : grad_h, {}, {}, {}, {}, {}, {}};
    }
    auto r = cuda::AddNormBackward(grads[1].contiguous(), grad_h, saved[0], saved[1], saved[2],
                                   saved[3], ctx->saved_data["rms"].toBool(), y_dtype,
                                   ctx->saved_data["has_bias"].toBool());
    return {r.grad_x, r.grad_y, r.grad_weight, r.grad_bias, {}, {}, {}, {}};
  }
};
#endif

#if DISTILL_WITH_CUDA
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return cuda::Rope(x, cos, sin, /*backward=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    return {cuda::Rope(grads[0].contiguous(), saved[0], saved[1], /*backward=*/true), {}, {}};
  }
};
#endif

#if DISTILL_WITH_CUDA
class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return cuda::SwiGlu(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] = cuda::SwiGluBackward(grads[0].contiguous(), saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};
#endif

#if DISTILL_WITH_CUDA
// x, W and b as at::linear under autocast would take them: cast to its dtype (the same
// round-to-nearest-even .to) when autocast is on. Plain casts, not autocast's cache: forward runs
// with grad mode off, and a cast cached there would carry no gradient history to a later autocast
// op on the same parameter in the region (review, session 17); each operand is used once per
// forward.
struct LinearOperands {
  at::Tensor x, w, b;
};
LinearOperands AutocastOperands(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!at::autocast::is_autocast_enabled(at::kCUDA)) return {x, w, b};
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  return {x.to(dtype), w.to(dtype), b.to(dtype)};  // all fp32, bf16 or fp16 (Linear checks)
}

// Saves what LinearBackward needs: the operands the matmul took and the dtypes of the originals.
void SaveLinear(AutogradContext* ctx, const LinearOperands& c, const at::Tensor& x,
                const at::Tensor& w, const at::Tensor& b, at::TensorList more = {}) {
  std::vector<at::Tensor> saved{c.x, c.w};
  saved.insert(saved.end(), more.begin(), more.end());
  ctx->save_for_backward(saved);
  ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
  ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
  ctx->saved_data["b_dtype"] = static_cast<int64_t>(b.scalar_type());
}

// The gradients of y = x W^T + b from the output's gradient g (tokens, out) and, when given, the
// column sums of g (the bias gradient in fp32; else ColumnSum(g) here): the input's is at::linear's
// matmul g W, cast back to x's dtype; the weight's is g^T x, and for an fp32 weight under autocast
// the GEMM writes it in fp32 (cuBLAS accumulates in fp32 either way): no bf16 rounding of the
// gradient and no cast kernel after it, where at::linear's backward writes bf16 and autocast's
// cast then makes the fp32 copy.
variable_list LinearBackward(AutogradContext* ctx, const at::Tensor& g, at::Tensor col_sums) {
  const variable_list saved = ctx->get_saved_variables();
  const at::Tensor &xc = saved[0], &wc = saved[1];
  auto dtype = [&](const char* key) {
    return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
  };
  at::Tensor grad_x, grad_w, grad_b;
  if (ctx->needs_input_grad(0)) grad_x = at::mm(g, wc).view(xc.sizes()).to(dtype("x_dtype"));
  if (ctx->needs_input_grad(1)) {
    const at::Tensor x2 = xc.reshape({-1, wc.size(1)});
    const at::ScalarType w_dtype = dtype("w_dtype");
    grad_w = w_dtype == at::kFloat && g.scalar_type() != at::kFloat ? at::mm(g.t(), x2, at::kFloat)
                                                                    : at::mm(g.t(), x2).to(w_dtype);
  }
  if (ctx->needs_input_grad(2)) {
    grad_b = (col_sums.defined() ? col_sums : cuda::ColumnSum(g)).to(dtype("b_dtype"));
  }
  return {grad_x, grad_w, grad_b};
}

// at::linear with the bias gradient as a column sum (layers.h, Linear): the forward is
// at::linear's on AutocastOperands, the backward LinearBackward.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    const LinearOperands c = AutocastOperands(x, weight, bias);
    SaveLinear(ctx, c, x, weight, bias);
    return at::linear(c.x, c.w, c.b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t out = ctx->get_saved_variables()[1].size(0);
    return LinearBackward(ctx, grads[0].reshape({-1, out}).contiguous(), at::Tensor());
  }
};

// gelu(at::linear(x, W, b)) (layers.h, LinearGelu): the activation by cuda::Gelu, and in the
// backward its gradient and the bias gradient (the column sums of that gradient) in one pass.
class LinearGeluFunction : public torch::autograd::Function<LinearGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, bool tanh) {
    const LinearOperands c = AutocastOperands(x, weight, bias);
    const at::Tensor u = at::linear(c.x, c.w, c.b);
    SaveLinear(ctx, c, x, weight, bias, {u});
    ctx->saved_data["tanh"] = tanh;
    return cuda::Gelu(u, tanh);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor u = ctx->get_saved_variables()[2];
    auto [du, sums] =
        cuda::GeluBackwardWithColumnSum(grads[0].contiguous(), u, ctx->saved_data["tanh"].toBool());
    variable_list result = LinearBackward(ctx, du.view({-1, u.size(-1)}), sums);
    result.emplace_back();  // tanh
    return result;
  }
};
#endif

// The dtypes the model kernels (kernels/*.cuh) are built for.
[[maybe_unused]] bool KernelDtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// The fused kernel's output dtype when it applies, else nullopt (use the composite).
std::optional<at::ScalarType> FusedOutDtype([[maybe_unused]] const at::Tensor& x,
                                            [[maybe_unused]] const at::Tensor& y,
                                            [[maybe_unused]] const at::Tensor& weight,
                                            [[maybe_unused]] const at::Tensor& bias) {
#if DISTILL_WITH_CUDA
  if (x.is_cuda() && x.scalar_type() == at::kFloat && x.sizes() == y.sizes() &&
      y.device() == x.device() && KernelDtype(y.scalar_type()) &&
      weight.scalar_type() == at::kFloat && (!bias.defined() || bias.scalar_type() == at::kFloat) &&
      x.dim() >= 1 && cuda::Supported(x.size(-1))) {
    return at::autocast::is_autocast_enabled(at::kCUDA)
               ? at::autocast::get_autocast_dtype(at::kCUDA)
               : at::kFloat;
  }
#endif
  return std::nullopt;
}

AddNormResult Fused([[maybe_unused]] const at::Tensor& x, [[maybe_unused]] const at::Tensor& y,
                    [[maybe_unused]] const at::Tensor& weight,
                    [[maybe_unused]] const at::Tensor& bias, [[maybe_unused]] double eps,
                    [[maybe_unused]] bool rms, [[maybe_unused]] at::ScalarType out_dtype) {
#if DISTILL_WITH_CUDA
  const variable_list r =
      AddNormFunction::apply(x, y, weight, bias.defined() ? bias : weight, bias.defined(), eps, rms,
                             static_cast<int64_t>(out_dtype));
  return {r[0], r[1]};
#else
  TORCH_CHECK(false, "AddNorm: built without CUDA");
#endif
}

// Whether Linear and LinearGelu take their CUDA autograd functions: a bias that takes a gradient
// (the column-sum kernels are its gradient), grad mode on, one device, the kernels' dtypes.
[[maybe_unused]] bool LinearOnCuda(const torch::nn::Linear& layer, const at::Tensor& x) {
  const at::Tensor &w = layer->weight, &b = layer->bias;
  return x.is_cuda() && x.dim() >= 1 && b.defined() && b.requires_grad() &&
         at::GradMode::is_enabled() && w.device() == x.device() && b.device() == x.device() &&
         KernelDtype(x.scalar_type()) && KernelDtype(w.scalar_type()) &&
         KernelDtype(b.scalar_type());
}

// The block of a checkpointed call, which its autograd node keeps until the backward.
struct BlockHolder : torch::CustomClassHolder {
  explicit BlockHolder(ResidualBlock block) : block(std::move(block)) {}
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& in) const {
    auto [h, pending] = block(in[0], in.size() > 1 ? in[1] : at::Tensor());
    return {h, pending};
  }
  ResidualBlock block;
};

// CUDA autocast as a checkpointed forward ran under it, for the recomputation in the backward
// (which runs outside the forward's autocast region, possibly on autograd's device thread).
class AutocastAs {
 public:
  AutocastAs(bool enabled, at::ScalarType dtype)
      : previous_(at::autocast::is_autocast_enabled(at::kCUDA)),
        previous_dtype_(at::autocast::get_autocast_dtype(at::kCUDA)) {
    at::autocast::set_autocast_enabled(at::kCUDA, enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
  }
  ~AutocastAs() {
    at::autocast::set_autocast_enabled(at::kCUDA, previous_);
    at::autocast::set_autocast_dtype(at::kCUDA, previous_dtype_);
    // The weights' casts that the recomputation cached, unless a region of the caller's is on.
    if (!previous_) at::autocast::clear_cache();
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  bool previous_;
  at::ScalarType previous_dtype_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<BlockHolder>& block,
                               at::TensorList inputs) {
    ctx->saved_data["block"] = c10::IValue::make_capsule(block);
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(at::kCUDA);
    ctx->saved_data["autocast_dtype"] = at::autocast::get_autocast_dtype(at::kCUDA);
    ctx->save_for_backward(inputs.vec());
    ctx->set_materialize_grads(false);  // an output nobody used sends no gradient into the block
    return (*block)(inputs.vec());      // autograd records nothing inside: gradients are off here
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::intrusive_ptr<torch::CustomClassHolder> capsule =
        ctx->saved_data["block"].toCapsule();
    const auto* block = static_cast<const BlockHolder*>(capsule.get());
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;  // leaves of the recomputed graph: their .grad is the block's gradient
    for (const at::Tensor& x : saved)
      inputs.push_back(x.detach().requires_grad_(x.requires_grad()));
    variable_list outputs;
    {
      const torch::AutoGradMode grad_mode(true);
      const AutocastAs autocast(ctx->saved_data["autocast"].toBool(),
                                ctx->saved_data["autocast_dtype"].toScalarType());
      outputs = (*block)(inputs);
    }
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grads[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list result = {at::Tensor()};  // the block argument
    for (const at::Tensor& x : inputs) result.push_back(x.grad());
    return result;
  }
};

}  // namespace

at::Tensor Linear(const torch::nn::Linear& layer, const at::Tensor& x) {
#if DISTILL_WITH_CUDA
  if (LinearOnCuda(layer, x)) return LinearFunction::apply(x, layer->weight, layer->bias);
#endif
  return at::linear(x, layer->weight, layer->bias);
}

at::Tensor LinearGelu(const torch::nn::Linear& layer, const at::Tensor& x, bool tanh) {
#if DISTILL_WITH_CUDA
  if (LinearOnCuda(layer, x)) return LinearGeluFunction::apply(x, layer->weight, layer->bias, tanh);
  const at::Tensor u = at::linear(x, layer->weight, layer->bias);
  if (u.is_cuda() && u.is_contiguous() && u.dim() >= 1 && KernelDtype(u.scalar_type()) &&
      !(at::GradMode::is_enabled() && u.requires_grad())) {
    return cuda::Gelu(u, tanh);  // no gradient to keep (e.g. the frozen teacher): the kernel alone
  }
  return at::gelu(u, tanh ? "tanh" : "none");
#else
  return at::gelu(at::linear(x, layer->weight, layer->bias), tanh ? "tanh" : "none");
#endif
}

at::Tensor LayerNorm(const torch::nn::LayerNorm& layer, const at::Tensor& x) {
  const auto& options = layer->options;
  TORCH_CHECK(options.normalized_shape().size() == 1 && options.elementwise_affine(),
              "distill::LayerNorm: one normalised dimension with weight and bias expected");
  return LayerNormFunction::apply(x, layer->weight, layer->bias, options.eps());
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

AddNormResult AddLayerNorm(const at::Tensor& x, const at::Tensor& y,
                           const torch::nn::LayerNorm& layer) {
  if (auto dtype = FusedOutDtype(x, y, layer->weight, layer->bias)) {
    return Fused(x, y, layer->weight, layer->bias, layer->options.eps(), /*rms=*/false, *dtype);
  }
  at::Tensor h = x + y;
  return {h, LayerNorm(layer, h)};
}

AddNormResult AddRmsNorm(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight,
                         double eps) {
  if (auto dtype = FusedOutDtype(x, y, weight, at::Tensor())) {
    return Fused(x, y, weight, at::Tensor(), eps, /*rms=*/true, *dtype);
  }
  at::Tensor h = x + y;
  return {h, RmsNorm(h, weight, eps)};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 2 && sin.sizes() == cos.sizes() &&
                  cos.size(0) == x.size(1) && cos.size(1) == x.size(3),
              "ApplyRope: x (B, T, H, D) and cos, sin (T, D) expected, got ", x.sizes(), ", ",
              cos.sizes(), ", ", sin.sizes());
#if DISTILL_WITH_CUDA
  if (x.is_cuda() && x.is_contiguous() && x.size(3) % 2 == 0 && KernelDtype(x.scalar_type()) &&
      cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
      cos.device() == x.device() && sin.device() == x.device()) {
    return RopeFunction::apply(x, cos.contiguous(), sin.contiguous());
  }
#endif
  const at::Tensor c = cos.to(x.scalar_type()).unsqueeze(1),
                   s = sin.to(x.scalar_type()).unsqueeze(1);
  return x * c + RotateHalf(x) * s;
}

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "SwiGlu: gate and up must have one shape, got ",
              gate.sizes(), " and ", up.sizes());
#if DISTILL_WITH_CUDA
  if (gate.is_cuda() && up.device() == gate.device() && gate.scalar_type() == up.scalar_type() &&
      KernelDtype(gate.scalar_type()) && gate.is_contiguous() && up.is_contiguous()) {
    return SwiGluFunction::apply(gate, up);
  }
#endif
  return at::silu(gate) * up;
}

std::pair<at::Tensor, at::Tensor> CheckpointedBlock(const ResidualBlock& block, const at::Tensor& x,
                                                    const at::Tensor& pending) {
  // Without gradients, or with inputs that take none (the parameters are not the checkpoint's
  // inputs: it would record no node, and they would get no gradient), the block as it is.
  if (!at::GradMode::is_enabled() ||
      !(x.requires_grad() || (pending.defined() && pending.requires_grad()))) {
    return block(x, pending);
  }
  std::vector<at::Tensor> inputs = {x};
  if (pending.defined()) inputs.push_back(pending);
  const variable_list out =
      CheckpointFunction::apply(c10::make_intrusive<BlockHolder>(block), at::TensorList(inputs));
  return {out[0], out[1]};
}

}  // namespace distill

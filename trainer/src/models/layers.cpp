#include "layers.h"

#include <torch/autograd.h>

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

}  // namespace

at::Tensor LayerNorm(const torch::nn::LayerNorm& layer, const at::Tensor& x) {
  const auto& options = layer->options;
  TORCH_CHECK(options.normalized_shape().size() == 1 && options.elementwise_affine(),
              "distill::LayerNorm: one normalised dimension with weight and bias expected");
  return LayerNormFunction::apply(x, layer->weight, layer->bias, options.eps());
}

}  // namespace distill

// Float64 reference of lossfns::cross_entropy_loss (ATen's log_softmax in double, an explicit
// mask and one-hot: the loss and its gradient in closed form), and the comparison of the op
// against it that the CPU and CUDA tests share. CrossEntropyReference.MatchesAten checks the
// reference against at::cross_entropy_loss and its autograd.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "lossfns/cross_entropy.h"
#include "tvd_reference.h"  // all_close

namespace lossfns::testing {

struct CeRefResult {
  at::Tensor row_loss;  // (rows,) double; 0 for ignored rows
  at::Tensor grad;      // (rows, width) double: d(sum of row losses * row_weight) / d x
};

// x: (rows, width), any dtype and device (taken as its double values); labels: (rows,) int64;
// V: the columns that count (the rest is padding: never looked at, gradient 0). row_weight:
// (rows,) double, the factor on each row's gradient (grad_output * the reduction's scale).
inline CeRefResult reference_cross_entropy(const at::Tensor& x_in, const at::Tensor& labels_in,
                                           int64_t ignore_index, int64_t V,
                                           const at::Tensor& row_weight) {
  const at::Tensor x = x_in.to(at::kCPU, at::kDouble).narrow(1, 0, V);
  const at::Tensor labels = labels_in.to(at::kCPU).reshape({-1});
  const at::Tensor valid = labels.ne(ignore_index);
  const at::Tensor y =
      at::where(valid, labels, at::zeros_like(labels));  // any column for ignored rows
  const at::Tensor lp = at::log_softmax(x, 1);
  const at::Tensor zero = at::zeros({}, x.options());
  CeRefResult r;
  r.row_loss = at::where(valid, -lp.gather(1, y.unsqueeze(1)).squeeze(1),
                         zero);  // where: inf/NaN rows ignored
  const at::Tensor onehot = at::one_hot(y, V).to(at::kDouble);
  const at::Tensor g = (lp.exp() - onehot) * row_weight.to(at::kCPU, at::kDouble).unsqueeze(1);
  r.grad = at::zeros({x_in.size(0), x_in.size(1)}, x.options());
  r.grad.narrow(1, 0, V).copy_(at::where(valid.unsqueeze(1), g, zero));
  return r;
}

// Tolerances of the op against the reference, per logits dtype (the reference runs on the values
// the op sees, so the inputs' rounding is no error). The loss: float math (exp/log accurate to a
// few ulp, logsumexp kept as max + log-sum) on a row loss of ~log V. The gradient: p's relative
// error is the absolute error of log p, |x - max| * eps (scaled by kappa below for large logits),
// then one rounding to the dtype: 2^-8 (bf16), 2^-11 (fp16).
struct CeTol {
  double loss_rtol, loss_atol, grad_rtol, grad_atol_rel;
};
inline CeTol ce_tolerance(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return {1e-10, 1e-12, 1e-9, 1e-13};
    case at::kFloat:
      return {2e-5, 2e-5, 1e-4, 1e-6};
    case at::kHalf:
      return {2e-5, 2e-5, 1e-3, 1e-6};
    default:
      return {2e-5, 2e-5, 5e-3, 1e-6};  // bfloat16
  }
}

// The scale a reduction puts on the summed rows: 1, or 1 / (rows not ignored), 0 if none counts.
inline double ce_scale(const Reduction& red, int64_t n_valid) {
  if (std::holds_alternative<torch::enumtype::kNone>(red) ||
      std::holds_alternative<torch::enumtype::kSum>(red))
    return 1.0;
  return n_valid ? 1.0 / double(n_valid) : 0.0;
}

// Runs the op on x (its device and dtype; a (rows, width) or (B, T, width) tensor) with autograd
// and grad_output go (a 0-dim double, or (rows,) for kNone), and compares the loss and the
// gradient with the reference, element by element.
inline ::testing::AssertionResult matches_reference(const at::Tensor& x, const at::Tensor& labels,
                                                    const CrossEntropyLossOptions& o,
                                                    const at::Tensor& go) {
  const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(width, 1);
  const int64_t V = std::min(o.vocab_size().value_or(width), width);
  const at::Tensor valid = labels.reshape({-1}).ne(o.ignore_index()).cpu();
  const bool none = std::holds_alternative<torch::enumtype::kNone>(o.reduction());
  const double scale = ce_scale(o.reduction(), valid.sum().item<int64_t>());
  const at::Tensor weight = none ? go.reshape({-1}) : go.reshape({1}).expand({rows}) * scale;
  const CeRefResult ref =
      reference_cross_entropy(x.reshape({rows, width}), labels, o.ignore_index(), V, weight);

  const at::Tensor xl = x.detach().clone().set_requires_grad(true);
  const at::Tensor loss = lossfns::cross_entropy_loss(xl, labels, o);
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (loss.scalar_type() != acc)
    return ::testing::AssertionFailure() << "loss dtype " << loss.scalar_type();
  if (loss.sizes() != (none ? x.sizes().slice(0, x.dim() - 1) : c10::IntArrayRef{}))
    return ::testing::AssertionFailure() << "loss shape " << loss.sizes();
  loss.backward(go.to(loss.options()).reshape(loss.sizes()));
  if (xl.grad().scalar_type() != x.scalar_type())
    return ::testing::AssertionFailure() << "gradient dtype " << xl.grad().scalar_type();

  const CeTol tol = ce_tolerance(x.scalar_type());
  const at::Tensor ref_loss = none ? ref.row_loss : ref.row_loss.sum() * scale;
  auto r = all_close(loss, ref_loss, tol.loss_rtol,
                     tol.loss_atol * (none ? 1.0 : std::max<double>(1.0, rows * scale)));
  if (!r) return r << " (loss)";
  // kappa: the logits' magnitude; log p = (x - max) - log_sum loses |x| * eps absolutely.
  const double kappa =
      std::max(1.0, x.narrow(-1, 0, V).abs().nan_to_num(0, 0, 0).max().item<double>() / 10);
  const double gscale = weight.abs().max().item<double>() * kappa;
  const double subnormal = x.scalar_type() == at::kHalf ? 0x1p-24 : 0.0;  // fp16 below 2^-14
  r = all_close(xl.grad(), ref.grad, tol.grad_rtol * kappa, tol.grad_atol_rel * gscale + subnormal);
  if (!r) return r << " (gradient)";
  return ::testing::AssertionSuccess();
}

}  // namespace lossfns::testing

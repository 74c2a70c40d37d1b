// Float64 reference of lossfns::distill_loss: the definitions of docs/distill.md written with ATen
// ops in double (log_softmax, explicit masks), the per-row loss and the gradient w.r.t. the
// student's logits in closed form. DistillReference.GradientIsTheLossDerivative checks that
// closed form against central finite differences of the reference loss.
#pragma once

#include <limits>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "lossfns/distill.h"

namespace lossfns::testing {

struct RefResult {
  at::Tensor row_loss;  // (rows,) double; 0 for ignored rows
  at::Tensor grad;      // (rows, ws) double: d(sum of row losses * row_weight) / d s
};

// s: (rows, ws), t: (rows, wt) (any dtype: taken as their double values). V: the columns that
// count (min(vocab_size, max(ws, wt))). row_weight: (rows,) double, the factor on each row's
// gradient (grad_output * reduction scale); ignored rows are masked by `valid` (rows,) bool.
inline RefResult reference_distill(const at::Tensor& s_in, const at::Tensor& t_in, Divergence div,
                                   double beta, double T, int64_t V, const at::Tensor& valid,
                                   const at::Tensor& row_weight) {
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  const int64_t rows = s_in.size(0), ws = s_in.size(1), wt = t_in.size(1), W = std::max(ws, wt);
  const double ninf = -std::numeric_limits<double>::infinity();
  auto widen = [&](const at::Tensor& x) {
    at::Tensor full = at::full({rows, W}, ninf, dbl);
    full.narrow(1, 0, x.size(1)).copy_(x.to(at::kCPU, at::kDouble));
    if (V < W) full.narrow(1, V, W - V).fill_(ninf);
    return full;
  };
  const at::Tensor a = widen(s_in) / T, b = widen(t_in) / T;
  // log_softmax of a row with -inf entries is -inf there; p = exp(lp) is exactly 0 there.
  const at::Tensor lp = at::log_softmax(a, 1), lq = at::log_softmax(b, 1);
  const at::Tensor p = lp.exp(), q = lq.exp();
  const at::Tensor zero = at::zeros({}, dbl);
  at::Tensor term, g, grad_a;
  switch (div) {
    case Divergence::kTvd:
      term = 0.5 * (p - q).abs();
      g = 0.5 * (p - q).sign();
      break;
    case Divergence::kForwardKl:
      term = at::where(q > 0, q * (lq - lp), zero);
      grad_a = p - q;
      break;
    case Divergence::kReverseKl:
      g = at::where(p > 0, lp - lq, zero);
      term = p * g;
      break;
    case Divergence::kJsd: {
      const at::Tensor m = p + beta * (q - p);
      const at::Tensor lpm = at::where(p > 0, (p / m).log(), zero),
                       lqm = at::where(q > 0, (q / m).log(), zero);
      term = beta * q * lqm + (1 - beta) * p * lpm;
      g = (1 - beta) * lpm;
      break;
    }
  }
  if (!grad_a.defined()) grad_a = p * (g - (p * g).sum(1, true));
  // A row -inf at every column on one side has no distribution there: its loss and gradient are
  // NaN (for forward KL too, whose masked terms above would give 0); on both sides, 0.
  const at::Tensor no_p = (a == ninf).all(1), no_q = (b == ninf).all(1);
  const at::Tensor nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), dbl);
  const at::Tensor row_nan = no_p.logical_xor(no_q), row_zero = no_p.logical_and(no_q);
  at::Tensor row_loss = at::where(row_nan, nan, at::where(row_zero, zero, term.sum(1)));
  grad_a = at::where(row_nan.unsqueeze(1), nan, at::where(row_zero.unsqueeze(1), zero, grad_a));
  const at::Tensor keep = valid.to(at::kCPU, at::kBool);
  RefResult r;
  r.row_loss = at::where(keep, row_loss, zero);  // where, not a product: an ignored row may be inf
  r.grad = at::where(keep.unsqueeze(1),
                     grad_a / T * row_weight.to(at::kCPU, at::kDouble).unsqueeze(1), zero)
               .narrow(1, 0, ws)
               .contiguous();
  return r;
}

}  // namespace lossfns::testing

// Input validation of lossfns::distill_loss, shared by its CPU and CUDA adapters.
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "distill_common.h"
#include "distill_internal.h"
#include "lossfns/divergence.h"

namespace lossfns::detail {

c10::SymIntArrayRef row_shape(const at::Tensor& logits) {
  return logits.sym_sizes().slice(0, logits.dim() - 1);
}

Resolved resolve_distill_args(const char* op, std::string_view divergence, double beta,
                              std::string_view reduction, std::optional<int64_t> vocab_size,
                              const c10::SymInt& width) {
  const auto d = divergence_from_name(divergence);
  TORCH_CHECK(d.has_value(), op,
              ": divergence must be one of 'tvd', 'forward_kl', 'reverse_kl', 'jsd'; got '",
              std::string(divergence), "'");
  int64_t code = static_cast<int64_t>(*d);
  if (code == kernels::kJsd) {
    TORCH_CHECK(beta >= 0.0 && beta <= 1.0, op, ": beta must be in [0, 1] for 'jsd'; got ",
                num(beta));
    if (beta == 0.0) code = kernels::kForwardKl;
    if (beta == 1.0) code = kernels::kReverseKl;
  }
  return {code, parse_reduction(reduction, op), resolve_vocab_size(vocab_size, width, op)};
}

void check_temperature(const char* op, double temperature) {
  const float t32 = static_cast<float>(temperature);
  TORCH_CHECK(
      std::isfinite(temperature) && temperature > 0.0 && std::isfinite(t32) && t32 > 0.0f &&
          std::isfinite(1.0f / t32),
      op,
      ": temperature must be > 0 and representable with its inverse in float32 (about 3e-38 to "
      "3e38); got ",
      num(temperature));
}

void check_grad_scale(const at::Tensor& s, const std::optional<at::Tensor>& grad_scale) {
  if (!grad_scale.has_value() || !grad_scale->defined()) return;
  const at::Tensor& g = *grad_scale;
  TORCH_CHECK(g.sym_numel() == 1 && g.device() == s.device() && at::isFloatingType(g.scalar_type()),
              "lossfns.distill_loss: grad_scale must be a 1-element floating-point tensor on the "
              "logits' device ",
              s.device(), "; got ", g.scalar_type(), " ", dims(g.sizes()), " on ", g.device());
  TORCH_CHECK(!(at::GradMode::is_enabled() && g.requires_grad()),
              "lossfns.distill_loss: grad_scale must not require grad (it is a hint of the value "
              "backward's grad_output will have, and gets no gradient); pass grad_scale.detach()");
}

DistillInputs check_distill_inputs(const at::Tensor& s, const at::Tensor& t,
                                   const std::optional<at::Tensor>& labels, int64_t divergence,
                                   double beta, double temperature, int64_t V,
                                   std::initializer_list<at::ScalarType> supported,
                                   const char* backend) {
  constexpr const char* op = "lossfns.distill_loss";
  TORCH_CHECK(s.defined() && t.defined(), op,
              ": student_logits and teacher_logits must be defined tensors");
  TORCH_CHECK(s.dim() == 2 || s.dim() == 3, op,
              ": student_logits must be (BT, V) or (B, T, V); got shape ", dims(s.sizes()));
  const auto lead = s.sizes().slice(0, s.dim() - 1);
  TORCH_CHECK(t.dim() == s.dim() && t.sizes().slice(0, t.dim() - 1) == lead, op,
              ": teacher_logits must have the leading shape ", dims(lead), " of student_logits ",
              dims(s.sizes()),
              " (every dimension but the last; the vocabulary sizes may differ); got ",
              dims(t.sizes()));
  TORCH_CHECK(t.scalar_type() == s.scalar_type(), op,
              ": teacher_logits must have the student's dtype ", s.scalar_type(), "; got ",
              t.scalar_type(), " (convert one with .to(dtype))");
  TORCH_CHECK(t.device() == s.device(), op, ": teacher_logits must be on the student's device ",
              s.device(), "; got ", t.device());
  bool dtype_ok = false;
  for (auto d : supported) dtype_ok = dtype_ok || d == s.scalar_type();
  TORCH_CHECK(dtype_ok, op, ": on ", backend, " the logits must be one of ", dtype_list(supported),
              "; got ", s.scalar_type());
  TORCH_CHECK(s.size(-1) > 0 && t.size(-1) > 0, op,
              ": the vocabulary dimension (last) must be > 0; got ", dims(s.sizes()), " and ",
              dims(t.sizes()));
  TORCH_CHECK(divergence >= kernels::kTvd && divergence <= kernels::kJsd, op,
              ": divergence code must be 0..3 (tvd, forward_kl, reverse_kl, jsd); got ",
              num(divergence));
  TORCH_CHECK(divergence != kernels::kJsd || (beta > 0.0 && beta < 1.0), op,
              ": the JSD kernels take beta in (0, 1) (0 and 1 are the KLs); got ", num(beta));
  check_temperature(op, temperature);

  DistillInputs in;
  in.ws = s.size(-1);
  in.wt = t.size(-1);
  TORCH_CHECK(V >= 1 && V <= std::max(in.ws, in.wt), op,
              ": the vocabulary's column count must be in [1, ", num(std::max(in.ws, in.wt)),
              "]; got ", num(V));
  in.V = V;
  in.rows = c10::multiply_integers(lead);
  in.s = rows_view(s, in.rows);
  in.t = rows_view(t, in.rows);
  in.labels = check_labels(labels, lead, in.rows, s.device(), op, "student_logits");
  return in;
}

void check_distill_backward(const DistillInputs& in, const at::Tensor& stats,
                            at::ScalarType stats_dtype, const at::Tensor& grad_output,
                            kernels::Reduction reduction) {
  TORCH_CHECK(stats.dim() == 2 && stats.size(0) == in.rows &&
                  stats.size(1) == kernels::kStatsPerRow && stats.scalar_type() == stats_dtype &&
                  stats.is_contiguous() && stats.device() == in.s.device(),
              "lossfns._distill_backward: stats must be the contiguous (", num(in.rows), ", ",
              num(kernels::kStatsPerRow), ") ", stats_dtype, " tensor from _distill_forward; got ",
              stats.scalar_type(), " ", dims(stats.sizes()), " on ", stats.device());
  const int64_t n = reduction == kernels::kNone ? in.rows : 1;
  TORCH_CHECK(grad_output.numel() == n, "lossfns._distill_backward: grad_output must have ", num(n),
              " element(s) (the loss's shape); got ", dims(grad_output.sizes()));
  TORCH_CHECK(grad_output.device() == in.s.device(),
              "lossfns._distill_backward: grad_output must be on the device of student_logits, ",
              in.s.device(), "; got ", grad_output.device());
}

void check_distill_ce_grad(const DistillInputs& in, const at::Tensor& grad, const at::Tensor& stats,
                           at::ScalarType stats_dtype, const at::Tensor& kd_weight,
                           const std::optional<at::Tensor>& ce_weight,
                           const std::optional<at::Tensor>& ce_stats) {
  constexpr const char* op = "lossfns._distill_ce_grad_";
  TORCH_CHECK(
      grad.dim() == 2 && grad.size(0) == in.rows && grad.size(1) == in.ws && grad.is_contiguous() &&
          grad.scalar_type() == in.s.scalar_type() && grad.device() == in.s.device(),
      op, ": grad must be a contiguous (", num(in.rows), ", ", num(in.ws), ") ", in.s.scalar_type(),
      " tensor on ", in.s.device(), " (the student's logits' shape); got ", grad.scalar_type(), " ",
      dims(grad.sizes()), " on ", grad.device());
  TORCH_CHECK(kd_weight.device() == in.s.device(), op, ": kd_weight must be on ", in.s.device(),
              "; got ", kd_weight.device());
  check_distill_backward(in, stats, stats_dtype, kd_weight, kernels::kNone);
  if (!ce_weight.has_value() || !ce_weight->defined()) return;
  TORCH_CHECK(in.labels.defined(), op, ": a cross-entropy weight needs labels");
  TORCH_CHECK(ce_weight->numel() == in.rows && ce_weight->device() == in.s.device(), op,
              ": ce_weight must have ", num(in.rows), " elements (one per row) on ", in.s.device(),
              "; got ", dims(ce_weight->sizes()), " on ", ce_weight->device());
  TORCH_CHECK(ce_stats.has_value() && ce_stats->defined() && ce_stats->dim() == 2 &&
                  ce_stats->size(0) == in.rows && ce_stats->size(1) >= 2 &&
                  ce_stats->stride(1) == 1 && ce_stats->scalar_type() == stats_dtype &&
                  ce_stats->device() == in.s.device(),
              op, ": ce_stats must be a (", num(in.rows), ", >= 2) ", stats_dtype,
              " tensor with unit column stride on ", in.s.device(),
              " (the student's max and log-sum at temperature 1)");
}

}  // namespace lossfns::detail

// Registration of lossfns::distill_loss with the dispatcher, and its autograd.
//
//   lossfns::distill_loss            public op (Python: torch.ops.lossfns.distill_loss)
//   lossfns::_distill_forward        internal: loss, per-row stats, reduction scale, and the
//                                    gradient when the CUDA forward computes it (grad_scale given)
//   lossfns::_distill_backward       internal: the gradient recomputed from the logits and stats
//   lossfns::_distill_rescale_grad_  internal: a forward-computed gradient, made right for the
//                                    grad_output backward actually brings (on the device, no sync)
//   lossfns::_distill_ce_grad_       internal: per-row-weighted divergence + cross-entropy
//                                    gradient into a given tensor (fused_linear_distill_loss's
//                                    chunks; one pass on CUDA, the composite elsewhere)
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "autograd_common.h"
#include "cross_entropy_common.h"
#include "cross_entropy_internal.h"
#include "distill_common.h"
#include "distill_internal.h"
#include "lossfns/defaults.h"
#include "lossfns/distill.h"

namespace lossfns::detail {

using Opt = const std::optional<at::Tensor>&;

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> distill_forward_op(
    const at::Tensor& s, const at::Tensor& t, Opt labels, int64_t divergence, double beta,
    double temperature, int64_t ignore_index, int64_t reduction, c10::SymInt V, Opt grad_scale,
    bool save) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lossfns::_distill_forward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, Opt, int64_t, double, double,
                                 int64_t, int64_t, c10::SymInt, Opt, bool)>();
  return op.call(s, t, labels, divergence, beta, temperature, ignore_index, reduction, V,
                 grad_scale, save);
}

at::Tensor distill_backward_op(const at::Tensor& grad_output, const at::Tensor& s,
                               const at::Tensor& t, Opt labels, const at::Tensor& stats,
                               const at::Tensor& scale, int64_t divergence, double beta,
                               double temperature, int64_t ignore_index, int64_t reduction,
                               c10::SymInt V) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_distill_backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Opt,
                            const at::Tensor&, const at::Tensor&, int64_t, double, double, int64_t,
                            int64_t, c10::SymInt)>();
  return op.call(grad_output, s, t, labels, stats, scale, divergence, beta, temperature,
                 ignore_index, reduction, V);
}

void distill_rescale_grad_op(at::Tensor& grad, const at::Tensor& grad_output,
                             const at::Tensor& grad_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lossfns::_distill_rescale_grad_", "")
                             .typed<void(at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  op.call(grad, grad_output, grad_scale);
}

void distill_ce_grad_op(at::Tensor& grad, const at::Tensor& s, const at::Tensor& t, Opt labels,
                        const at::Tensor& stats, const at::Tensor& kd_weight, Opt ce_weight,
                        Opt ce_stats, int64_t divergence, double beta, double temperature,
                        int64_t ignore_index, int64_t V) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_distill_ce_grad_", "")
          .typed<void(at::Tensor&, const at::Tensor&, const at::Tensor&, Opt, const at::Tensor&,
                      const at::Tensor&, Opt, Opt, int64_t, double, double, int64_t, int64_t)>();
  op.call(grad, s, t, labels, stats, kd_weight, ce_weight, ce_stats, divergence, beta, temperature,
          ignore_index, V);
}

namespace {

// _distill_ce_grad_ where no kernel fuses it (the CPU): the two backward ops, added, copied in.
void distill_ce_grad_composite(at::Tensor& grad, const at::Tensor& s, const at::Tensor& t,
                               Opt labels, const at::Tensor& stats, const at::Tensor& kd_weight,
                               Opt ce_weight, Opt ce_stats, int64_t divergence, double beta,
                               double temperature, int64_t ignore_index, int64_t V) {
  TORCH_CHECK(s.dim() == 2,
              "lossfns._distill_ce_grad_: the student's logits must be (rows, V); got ",
              dims(s.sizes()));
  TORCH_CHECK(grad.sizes() == s.sizes() && grad.scalar_type() == s.scalar_type() &&
                  grad.device() == s.device(),
              "lossfns._distill_ce_grad_: grad must be a ", s.scalar_type(), " ", dims(s.sizes()),
              " tensor on ", s.device(), "; got ", grad.scalar_type(), " ", dims(grad.sizes()),
              " on ", grad.device());
  const auto acc = stats.options();
  const at::Tensor one = at::ones({1}, acc);
  at::Tensor g =
      distill_backward_op(kd_weight.reshape({-1}).to(acc.dtype()), s, t, labels, stats, one,
                          divergence, beta, temperature, ignore_index, kernels::kNone, V);
  if (ce_weight.has_value() && ce_weight->defined()) {
    TORCH_CHECK(
        labels.has_value() && labels->defined() && ce_stats.has_value() && ce_stats->defined(),
        "lossfns._distill_ce_grad_: a cross-entropy weight needs labels and ce_stats");
    // Labels outside the cross-entropy's columns (their rows' weight is 0) as ignored: the
    // cross-entropy's CPU kernels refuse them.
    const int64_t Vce = std::min(V, s.size(1));
    const at::Tensor& l = *labels;
    const at::Tensor y =
        at::where(l.ne(ignore_index).logical_and(l.lt(0).logical_or(l.ge(Vce))), ignore_index, l);
    g.add_(cross_entropy_backward_op(ce_weight->reshape({-1}).to(acc.dtype()), s, y,
                                     ce_stats->narrow(1, 0, kernels::kCeStatsPerRow).contiguous(),
                                     one, ignore_index, kernels::kNone, Vce));
  }
  grad.copy_(g);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kOp = "lossfns.distill_loss";

// The public arguments in kernel form (resolve_distill_args), V from the wider logits.
Resolved resolve(const at::Tensor& s, const at::Tensor& t, c10::string_view divergence, double beta,
                 c10::string_view reduction, std::optional<int64_t> vocab_size) {
  TORCH_CHECK(s.dim() >= 1 && t.dim() >= 1, kOp, ": the logits must be (BT, V) or (B, T, V); got ",
              dims(s.sizes()), " and ", dims(t.sizes()));
  return resolve_distill_args(kOp, std::string_view(divergence.data(), divergence.size()), beta,
                              std::string_view(reduction.data(), reduction.size()), vocab_size,
                              s.sym_size(-1).max(t.sym_size(-1)));
}

at::Tensor view_loss(const at::Tensor& loss, const at::Tensor& s, int64_t reduction) {
  return reduction == kernels::kNone ? loss.view_symint(row_shape(s)) : loss;
}

// What forward keeps for backward: the logits (references, no copies) and O(rows) statistics;
// or, when the CUDA forward computed the gradient (grad_scale given), that gradient and the
// scale it was computed for.
class DistillFunction : public torch::autograd::Function<DistillFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& s, const at::Tensor& t,
                            Opt labels, int64_t divergence, double beta, double temperature,
                            int64_t ignore_index, int64_t reduction, c10::SymInt V,
                            Opt grad_scale) {
    at::AutoDispatchBelowADInplaceOrView guard;
    // Whether the forward computes the gradient: the CUDA forward does when given grad_scale for
    // a reduced loss (distill_cuda.cu); decided from the arguments, not from sizes, which are
    // symbolic under torch.compile.
    const bool saved_grad = s.is_cuda() && grad_scale.has_value() && grad_scale->defined() &&
                            reduction != kernels::kNone;
    auto [loss, stats, scale, grad] =
        distill_forward_op(s, t, labels, divergence, beta, temperature, ignore_index, reduction, V,
                           grad_scale, /*save=*/true);
    // The promise the forward computed the gradient for, kept for backward (which updates it):
    // the promised grad_output, where a promise of 0 got a gradient for 1 (the kernels'
    // hinted_scale, which the first backward's rescale applies too), scaled by the grad_output
    // the first backward brings (0 if the promise holds). A gradient computed for 0 is all
    // zeros, and no other grad_output could be made from it (it gave NaN, go / 0, up to session
    // 44); the same holds after a first backward with grad_output 0 (a later one through a
    // retained graph gives NaN: docs/distill.md). A new tensor, never the caller's, made after
    // the forward's kernels are queued (on the same stream, so it reads the value they read):
    // host-side ops before them left the device idle (+0.2 ms a call on an H100 in session 45).
    const at::Tensor none;
    at::Tensor gs;
    if (saved_grad) {
      // A copy even where it is float32 already (to(kFloat) would return its input itself).
      gs = grad_scale->detach().reshape({1}).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    }
    const at::Tensor out = view_loss(loss, s, reduction);
    // The output too: its node's edges lead first_order_only's error node to the input.
    ctx->save_for_backward({saved_grad ? none : s, saved_grad ? none : t, labels ? *labels : none,
                            stats, scale, grad, gs, out});
    ctx->saved_data["saved_grad"] = saved_grad;
    ctx->saved_data["rescaled"] = false;
    ctx->saved_data["divergence"] = divergence;
    ctx->saved_data["beta"] = beta;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["V"] = V;
    ctx->saved_data["shape"] = c10::IValue(s.sym_sizes());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toSymIntVector();
    at::Tensor grad;
    const bool create_graph = at::GradMode::is_enabled();
    at::NoGradGuard no_grad;  // first-order only: see first_order_only
    if (ctx->saved_data["saved_grad"].toBool()) {
      const at::Tensor& go = grad_outputs[0];
      if (!ctx->saved_data["rescaled"].toBool()) {
        // The first backward hands out the saved gradient itself, scaled in place on the device
        // (nothing to do when grad_output is the promised scale), and records the scale it is
        // now for. A later backward of a retained graph leaves it alone (it is the first
        // backward's result): a new tensor, scaled from the recorded scale.
        grad = saved[5];
        at::Tensor gs = saved[6];
        at::AutoDispatchBelowADInplaceOrView guard;  // the op's own state: no version bump
        distill_rescale_grad_op(grad, go, gs);
        gs.copy_(go.reshape({1}));
        ctx->saved_data["rescaled"] = true;
      } else {
        grad = saved[5] * (go.to(at::kFloat).reshape({}) / saved[6].reshape({}));
      }
    } else {
      auto opt = [](const at::Tensor& x) {
        return x.defined() ? std::optional<at::Tensor>(x) : std::nullopt;
      };
      grad = distill_backward_op(
          grad_outputs[0], saved[0], saved[1], opt(saved[2]), saved[3], saved[4],
          ctx->saved_data["divergence"].toInt(), ctx->saved_data["beta"].toDouble(),
          ctx->saved_data["temperature"].toDouble(), ctx->saved_data["ignore_index"].toInt(),
          ctx->saved_data["reduction"].toInt(), ctx->saved_data["V"].toSymInt());
    }
    return first_order_only(
        kOp, saved[7], create_graph,
        {grad.view_symint(shape), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
         at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()});
  }
};

void check_teacher_constant(const at::Tensor& t) {
  TORCH_CHECK(
      !(at::GradMode::is_enabled() && t.requires_grad()), kOp,
      ": teacher_logits must not require grad (the teacher is a constant and gets no gradient); "
      "pass teacher_logits.detach()");
}

// The public op's tensors, on either path (autograd, or below it): defined, dense, and on the
// student's device.
void check_tensors(const at::Tensor& s, const at::Tensor& t, Opt labels, Opt grad_scale) {
  check_inputs(kOp, "student_logits and teacher_logits", {s, t});
  check_inputs(kOp, "labels", labels);
  check_inputs(kOp, "grad_scale", grad_scale);
  check_device(kOp, t, s.device(), "teacher_logits must be on the student's device ");
  check_device(kOp, labels, s.device(), "labels must be on the device of student_logits, ");
  check_grad_scale(s, grad_scale);
}

at::Tensor distill_loss_autograd(const at::Tensor& s, const at::Tensor& t, Opt labels,
                                 c10::string_view divergence, double beta, double temperature,
                                 int64_t ignore_index, c10::string_view reduction,
                                 std::optional<int64_t> vocab_size, Opt grad_scale) {
  check_tensors(s, t, labels, grad_scale);
  check_teacher_constant(t);
  check_no_forward_ad(kOp, {s, t});
  const Resolved r = resolve(s, t, divergence, beta, reduction, vocab_size);
  if (!(at::GradMode::is_enabled() && s.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    // grad_scale passed for its check only: without save, no gradient is computed.
    auto out = distill_forward_op(s, t, labels, r.divergence, beta, temperature, ignore_index,
                                  r.reduction, r.V, grad_scale, false);
    return view_loss(std::get<0>(out), s, r.reduction);
  }
  return DistillFunction::apply(s, t, labels, r.divergence, beta, temperature, ignore_index,
                                r.reduction, r.V, grad_scale);
}

// Below autograd (inference mode, tensors without autograd): forward only.
at::Tensor distill_loss_no_grad(const at::Tensor& s, const at::Tensor& t, Opt labels,
                                c10::string_view divergence, double beta, double temperature,
                                int64_t ignore_index, c10::string_view reduction,
                                std::optional<int64_t> vocab_size, Opt grad_scale) {
  check_tensors(s, t, labels, grad_scale);
  const Resolved r = resolve(s, t, divergence, beta, reduction, vocab_size);
  auto out = distill_forward_op(s, t, labels, r.divergence, beta, temperature, ignore_index,
                                r.reduction, r.V, grad_scale, false);  // checked, not used
  return view_loss(std::get<0>(out), s, r.reduction);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lossfns, m) {
  static const std::string schema =
      "distill_loss(Tensor student_logits, Tensor teacher_logits, Tensor? labels=None, str "
      "divergence='tvd', "
      "float beta=0.5, float temperature=1.0, int ignore_index=" +
      std::to_string(kDefaultIgnoreIndex) +
      ", str reduction='batchmean', int? vocab_size=None, Tensor? grad_scale=None) -> Tensor";
  m.def(schema.c_str());
  m.def(
      "_distill_forward(Tensor student_logits, Tensor teacher_logits, Tensor? labels, int "
      "divergence, "
      "float beta, float temperature, int ignore_index, int reduction, SymInt V, Tensor? "
      "grad_scale, "
      "bool save) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "_distill_backward(Tensor grad_output, Tensor student_logits, Tensor teacher_logits, Tensor? "
      "labels, "
      "Tensor stats, Tensor scale, int divergence, float beta, float temperature, int "
      "ignore_index, "
      "int reduction, SymInt V) -> Tensor");
  m.def("_distill_rescale_grad_(Tensor(a!) grad, Tensor grad_output, Tensor grad_scale) -> ()");
  m.def(
      "_distill_ce_grad_(Tensor(a!) grad, Tensor student_logits, Tensor teacher_logits, Tensor? "
      "labels, Tensor stats, Tensor kd_weight, Tensor? ce_weight, Tensor? ce_stats, int "
      "divergence, float beta, float temperature, int ignore_index, int V) -> ()");
}

TORCH_LIBRARY_IMPL(lossfns, Autograd, m) { m.impl("distill_loss", &distill_loss_autograd); }
TORCH_LIBRARY_IMPL(lossfns, CompositeExplicitAutograd, m) {
  m.impl("distill_loss", &distill_loss_no_grad);
  m.impl("_distill_ce_grad_", &distill_ce_grad_composite);
}

}  // namespace lossfns::detail

// Registration of lossfns::fused_linear_distill_loss with the dispatcher, and its autograd.
//
//   lossfns::fused_linear_distill_loss       public op (Python:
//                                            torch.ops.lossfns.fused_linear_distill_loss)
//   lossfns::_fused_linear_distill_forward   internal: the losses, and for a reduced loss the
//                                            gradients for a grad_output of 1 (the chunk
//                                            driver, fused_linear_driver.cpp)
//   lossfns::_fused_linear_distill_backward  internal: reduction 'none' only, every chunk again
//                                            with the per-token grad_output
//   lossfns::_scale_cast                     internal: float32 src * scale rounded once to a
//                                            dtype (CPU: ATen; CUDA: fused_linear_cuda.cu)
// A reduced loss's backward is two multiplications by the scalar grad_output: the (BT, H_s) and
// (V_s, H_s) gradients are what forward keeps (the latter in float32 for half inputs, rounded to
// their dtype by that multiplication), never the logits.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "autograd_common.h"
#include "distill_common.h"
#include "distill_internal.h"
#include "fused_linear_internal.h"
#include "lossfns/defaults.h"

namespace lossfns::detail {

using Opt = const std::optional<at::Tensor>&;
using Tensor5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_forward_op(
    const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th, const at::Tensor& tw,
    Opt labels, const FusedArgs& a, bool grad_hidden, bool grad_lm_head) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_fused_linear_distill_forward", "")
          .typed<Tensor5(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         Opt, int64_t, double, double, int64_t, int64_t, c10::SymInt, double,
                         double, int64_t, bool, bool)>();
  return op.call(sh, sw, th, tw, labels, a.divergence, a.beta, a.temperature, a.ignore_index,
                 a.reduction, a.V, a.kd_weight, a.ce_weight, a.chunk_size, grad_hidden,
                 grad_lm_head);
}

std::tuple<at::Tensor, at::Tensor> fused_linear_backward_op(
    const at::Tensor& grad_output, const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
    const at::Tensor& tw, Opt labels, const FusedArgs& a, bool grad_hidden, bool grad_lm_head) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lossfns::_fused_linear_distill_backward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, Opt, int64_t, double, double,
                                 int64_t, c10::SymInt, double, double, int64_t, bool, bool)>();
  return op.call(grad_output, sh, sw, th, tw, labels, a.divergence, a.beta, a.temperature,
                 a.ignore_index, a.V, a.kd_weight, a.ce_weight, a.chunk_size, grad_hidden,
                 grad_lm_head);
}

at::Tensor scale_cast_op(const at::Tensor& src, const at::Tensor& scale, at::ScalarType dtype) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_scale_cast", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType)>();
  return op.call(src, scale, dtype);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The public arguments in kernel form, after the checks that need the original shapes: the
// hidden states (BT, H) or (B, T, H) with one leading shape, and the scalars.
FusedArgs resolve(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                  const at::Tensor& tw, c10::string_view divergence, double beta,
                  double temperature, int64_t ignore_index, c10::string_view reduction,
                  std::optional<int64_t> vocab_size, double kd_weight, double ce_weight,
                  std::optional<int64_t> chunk_size) {
  check_inputs(kFusedOp, "the hidden states and lm_heads", {sh, sw, th, tw});
  check_same_dtype_and_device(sh, sw, th, tw);
  TORCH_CHECK(sh.dim() == 2 || sh.dim() == 3, kFusedOp,
              ": student_hidden must be (BT, H_s) or (B, T, H_s); got ", dims(sh.sym_sizes()));
  // (Messages too print sym_sizes: under torch.compile's dynamic shapes sizes() throws.)
  const auto lead = row_shape(sh);
  TORCH_CHECK(th.dim() == sh.dim() && row_shape(th) == lead, kFusedOp,
              ": teacher_hidden must have the leading shape ", dims(lead), " of student_hidden ",
              dims(sh.sym_sizes()),
              " (every dimension but the last; the hidden sizes may differ); got ",
              dims(th.sym_sizes()));
  TORCH_CHECK(sw.dim() == 2 && tw.dim() == 2, kFusedOp,
              ": the lm_heads must be (V_s, H_s) and (V_t, H_t); got ", dims(sw.sym_sizes()),
              " and ", dims(tw.sym_sizes()));
  TORCH_CHECK(sh.sym_size(-1) >= 1 && th.sym_size(-1) >= 1, kFusedOp,
              ": the hidden sizes H_s and H_t must be >= 1; got student_hidden ",
              dims(sh.sym_sizes()), " and teacher_hidden ", dims(th.sym_sizes()));
  TORCH_CHECK(!chunk_size || *chunk_size >= 1, kFusedOp, ": chunk_size must be >= 1 (or ", kUnset,
              ", for automatic); got ", num(*chunk_size));
  const Resolved r =
      resolve_distill_args(kFusedOp, std::string_view(divergence.data(), divergence.size()), beta,
                           std::string_view(reduction.data(), reduction.size()), vocab_size,
                           sw.sym_size(0).max(tw.sym_size(0)));
  return {r.divergence, beta,      temperature, ignore_index,          r.reduction,
          r.V,          kd_weight, ce_weight,   chunk_size.value_or(0)};
}

// (BT, H) views of the hidden states; the per-token outputs go back to the leading shape.
// Sizes stay symbolic (torch.compile's dynamic shapes): nothing here reads sizes() or size(i),
// which would make them constants of the compiled graph.
at::Tensor rows(const at::Tensor& x) { return x.reshape_symint({-1, x.sym_size(-1)}); }
// Labels of the hidden states' leading shape (or (BT,)) as (BT,).
std::optional<at::Tensor> row_labels(Opt labels, const at::Tensor& sh) {
  const c10::SymIntArrayRef lead = row_shape(sh);
  c10::SymInt n = 1;
  for (const c10::SymInt& d : lead) n = n * d;
  const at::Tensor l = check_labels(labels, lead, n, sh.device(), kFusedOp, "student_hidden");
  return l.defined() ? std::optional<at::Tensor>(l) : std::nullopt;
}

// Names the teacher input(s) that require grad (a head tied between student and teacher is one
// tensor: only teacher_lm_head's argument needs the detach).
void check_teacher_constant(const at::Tensor& th, const at::Tensor& tw) {
  if (!at::GradMode::is_enabled() || !(th.requires_grad() || tw.requires_grad())) return;
  const bool both = th.requires_grad() && tw.requires_grad();
  const char* name = both                 ? "teacher_hidden and teacher_lm_head"
                     : th.requires_grad() ? "teacher_hidden"
                                          : "teacher_lm_head";
  const char* fix = both                 ? "teacher_hidden.detach() and teacher_lm_head.detach()"
                    : th.requires_grad() ? "teacher_hidden.detach()"
                                         : "teacher_lm_head.detach()";
  TORCH_CHECK(false, kFusedOp, ": ", name,
              " must not require grad (the teacher is a constant and gets no gradient); pass ",
              fix);
}

void save_args(AutogradContext* ctx, const FusedArgs& a) {
  ctx->saved_data["divergence"] = a.divergence;
  ctx->saved_data["beta"] = a.beta;
  ctx->saved_data["temperature"] = a.temperature;
  ctx->saved_data["ignore_index"] = a.ignore_index;
  ctx->saved_data["reduction"] = a.reduction;
  ctx->saved_data["V"] = a.V;
  ctx->saved_data["kd_weight"] = a.kd_weight;
  ctx->saved_data["ce_weight"] = a.ce_weight;
  ctx->saved_data["chunk_size"] = a.chunk_size;
}

FusedArgs saved_args(AutogradContext* ctx) {
  auto& d = ctx->saved_data;
  return {d["divergence"].toInt(),   d["beta"].toDouble(),      d["temperature"].toDouble(),
          d["ignore_index"].toInt(), d["reduction"].toInt(),    d["V"].toSymInt(),
          d["kd_weight"].toDouble(), d["ce_weight"].toDouble(), d["chunk_size"].toInt()};
}

// On (BT, H) hidden states. A reduced loss keeps the gradients forward computed; 'none' keeps the
// inputs (references) and recomputes in backward with the per-token grad_output.
// Empty tensors made from the hidden states and the lm_head by differentiable ops (a narrow to 0
// rows, cloned): their gradient edges lead to the inputs' own, and they hold no data. A reduced
// loss saves them, not the inputs, for first_order_only_to's error node: the hidden states (a
// reshaped copy of a (B, T, H) slice, perhaps) are not kept alive for it, and the inputs may be
// changed in place before backward.
struct Anchors {
  at::Tensor h, w;
};

class FusedLinearFunction : public torch::autograd::Function<FusedLinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& sh, const at::Tensor& sw,
                               const at::Tensor& th, const at::Tensor& tw, Opt labels,
                               const FusedArgs& a, const Anchors& anchors) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const bool need_h = sh.requires_grad(), need_w = sw.requires_grad();
    const bool none = a.reduction == kernels::kNone;
    auto [loss, div, ce, gh, gw] =
        fused_linear_forward_op(sh, sw, th, tw, labels, a, need_h && !none, need_w && !none);
    const at::Tensor undefined;
    // A reduced loss keeps the anchors of the inputs that require grad, for the edges of
    // first_order_only_to's error node; not the loss, which the caller may change in place
    // before backward (loss /= k).
    if (none)
      ctx->save_for_backward({sh, sw, th, tw, labels ? *labels : undefined});
    else
      ctx->save_for_backward({need_h ? gh : undefined, need_w ? gw : undefined,
                              need_h ? anchors.h : undefined, need_w ? anchors.w : undefined});
    ctx->saved_data["need_h"] = need_h;
    ctx->saved_data["need_w"] = need_w;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(sw.scalar_type());
    save_args(ctx, a);
    // div and ce are detached by the caller (fused_linear_autograd), not marked
    // non-differentiable: compiled autograd refuses a node with non-differentiable outputs.
    return {loss, div, ce};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const FusedArgs a = saved_args(ctx);
    const bool need_h = ctx->saved_data["need_h"].toBool(),
               need_w = ctx->saved_data["need_w"].toBool();
    const at::Tensor& go = grad_outputs[0];
    const bool none = a.reduction == kernels::kNone;
    // The op's differentiable inputs (a reduced loss: their anchors); for 'none' grad_output too,
    // whose gradient is recomputed by kernels that are not differentiable in it either.
    const std::vector<at::Tensor> inputs = none ? std::vector<at::Tensor>{saved[0], saved[1], go}
                                                : std::vector<at::Tensor>{saved[2], saved[3]};
    const bool create_graph = at::GradMode::is_enabled();
    at::NoGradGuard no_grad;  // first-order only: see first_order_only
    at::Tensor gh, gw;
    const at::Tensor undefined;
    if (go.defined() && !none) {
      const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
      if (create_graph && go.requires_grad()) {
        // Differentiable in grad_output (a learned loss weight): the saved gradients, attached
        // to the error node (their own derivative in the hidden states and lm_head is not
        // computed: differentiating through them raises), times grad_output.
        const auto g = first_order_only_to(
            kFusedOp, inputs, true, {need_h ? saved[0] : undefined, need_w ? saved[1] : undefined});
        at::AutoGradMode enable_grad(true);
        if (need_h) gh = g[0] * go;
        if (need_w) gw = (g[1] * go).to(dtype);
        return {gh, gw, undefined, undefined, undefined, undefined, undefined};
      }
      if (need_h) gh = saved[0] * go;
      // float32 for half inputs: scaled and rounded in one pass
      if (need_w) gw = scale_cast_op(saved[1], go, dtype);
    } else if (go.defined()) {
      auto opt = [](const at::Tensor& x) {
        return x.defined() ? std::optional<at::Tensor>(x) : std::nullopt;
      };
      std::tie(gh, gw) = fused_linear_backward_op(go, saved[0], saved[1], saved[2], saved[3],
                                                  opt(saved[4]), a, need_h, need_w);
      if (!need_h) gh = at::Tensor();
      if (!need_w) gw = at::Tensor();
    }
    return first_order_only_to(kFusedOp, inputs, create_graph,
                               {gh, gw, undefined, undefined, undefined, undefined, undefined});
  }
};

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Outputs shaped(const variable_list& out, const at::Tensor& sh, int64_t reduction) {
  if (reduction != kernels::kNone) return {out[0], out[1], out[2]};
  const auto lead = row_shape(sh);
  return {out[0].view_symint(lead), out[1].view_symint(lead), out[2].view_symint(lead)};
}

// The losses alone (no gradient computed), shaped.
Outputs forward_only(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                     const at::Tensor& tw, Opt labels, const FusedArgs& a) {
  auto [loss, div, ce, gh, gw] =
      fused_linear_forward_op(rows(sh), sw, rows(th), tw, row_labels(labels, sh), a, false, false);
  return shaped({loss, div, ce}, sh, a.reduction);
}

Outputs fused_linear_autograd(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                              const at::Tensor& tw, Opt labels, c10::string_view divergence,
                              double beta, double temperature, int64_t ignore_index,
                              c10::string_view reduction, std::optional<int64_t> vocab_size,
                              double kd_weight, double ce_weight,
                              std::optional<int64_t> chunk_size) {
  check_teacher_constant(th, tw);
  check_no_forward_ad(kFusedOp, {sh, sw, th, tw});
  check_inputs(kFusedOp, "labels", labels);
  const FusedArgs a = resolve(sh, sw, th, tw, divergence, beta, temperature, ignore_index,
                              reduction, vocab_size, kd_weight, ce_weight, chunk_size);
  if (!(at::GradMode::is_enabled() && (sh.requires_grad() || sw.requires_grad()))) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward_only(sh, sw, th, tw, labels, a);
  }
  // The reshape to rows is a differentiable view: a (B, T, H) input gets its gradient through it.
  const at::Tensor h = rows(sh);
  Anchors anchors;
  if (a.reduction != kernels::kNone) {
    auto anchor = [](const at::Tensor& x) {
      return x.requires_grad() ? x.narrow(0, 0, 0).clone() : at::Tensor();
    };
    anchors = {anchor(h), anchor(sw)};
  }
  variable_list out =
      FusedLinearFunction::apply(h, sw, rows(th), tw, row_labels(labels, sh), a, anchors);
  out[1] = out[1].detach();  // the parts: values to log, not to differentiate
  out[2] = out[2].detach();
  return shaped(out, sh, a.reduction);
}

// Below autograd (inference mode, tensors without autograd): forward only.
Outputs fused_linear_no_grad(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                             const at::Tensor& tw, Opt labels, c10::string_view divergence,
                             double beta, double temperature, int64_t ignore_index,
                             c10::string_view reduction, std::optional<int64_t> vocab_size,
                             double kd_weight, double ce_weight,
                             std::optional<int64_t> chunk_size) {
  check_inputs(kFusedOp, "labels", labels);
  const FusedArgs a = resolve(sh, sw, th, tw, divergence, beta, temperature, ignore_index,
                              reduction, vocab_size, kd_weight, ce_weight, chunk_size);
  return forward_only(sh, sw, th, tw, labels, a);
}

// Under autocast (torch.autocast, at::autocast): the op is a linear layer's matmuls and a loss, so
// it takes autocast's policy for matmuls, as at::linear does: the hidden states and lm_heads, if
// floating and not float64, are cast to the region's dtype (bfloat16 by default on the CPU,
// float16 on CUDA), each cast's gradient going back to its input in the input's dtype; then the
// op runs on them with autocast off (the driver excludes it too), its accumulation in float32 as
// always. Without this the op's internal matmuls were recast by autocast while its gradient
// buffers kept the inputs' float32 (an error about an out tensor's dtype), and under no_grad the
// logits changed dtype silently.
template <c10::DeviceType kDevice>
Outputs fused_linear_autocast(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                              const at::Tensor& tw, Opt labels, c10::string_view divergence,
                              double beta, double temperature, int64_t ignore_index,
                              c10::string_view reduction, std::optional<int64_t> vocab_size,
                              double kd_weight, double ce_weight,
                              std::optional<int64_t> chunk_size) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(kDevice);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::fused_linear_distill_loss", "")
          .typed<Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         Opt, c10::string_view, double, double, int64_t, c10::string_view,
                         std::optional<int64_t>, double, double, std::optional<int64_t>)>();
  const auto cast = [&](const at::Tensor& x) {
    return at::autocast::cached_cast(dtype, x, kDevice);
  };
  const at::Tensor csh = cast(sh), csw = cast(sw), cth = cast(th), ctw = cast(tw);
  // Inputs that the casts leave of different dtypes (float64 beside float32) are refused by the
  // op's checks: on the inputs as given, so that the error names the dtypes the caller passed.
  const auto t = csh.scalar_type();
  const bool mixed = csw.scalar_type() != t || cth.scalar_type() != t || ctw.scalar_type() != t;
  return mixed ? op.call(sh, sw, th, tw, labels, divergence, beta, temperature, ignore_index,
                         reduction, vocab_size, kd_weight, ce_weight, chunk_size)
               : op.call(csh, csw, cth, ctw, labels, divergence, beta, temperature, ignore_index,
                         reduction, vocab_size, kd_weight, ce_weight, chunk_size);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lossfns, m) {
  static const std::string schema =
      "fused_linear_distill_loss(Tensor student_hidden, Tensor student_lm_head, Tensor "
      "teacher_hidden, "
      "Tensor teacher_lm_head, Tensor? labels=None, str divergence='tvd', float beta=0.5, float "
      "temperature=1.0, "
      "int ignore_index=" +
      std::to_string(kDefaultIgnoreIndex) +
      ", str reduction='batchmean', int? vocab_size=None, float kd_weight=1.0, float "
      "ce_weight=0.0, "
      "int? chunk_size=None) -> (Tensor loss, Tensor divergence, Tensor ce)";
  m.def(schema.c_str());
  m.def(
      "_fused_linear_distill_forward(Tensor student_hidden, Tensor student_lm_head, Tensor "
      "teacher_hidden, "
      "Tensor teacher_lm_head, Tensor? labels, int divergence, float beta, float temperature, int "
      "ignore_index, "
      "int reduction, SymInt V, float kd_weight, float ce_weight, int chunk_size, bool "
      "grad_hidden, "
      "bool grad_lm_head) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "_fused_linear_distill_backward(Tensor grad_output, Tensor student_hidden, Tensor "
      "student_lm_head, "
      "Tensor teacher_hidden, Tensor teacher_lm_head, Tensor? labels, int divergence, float beta, "
      "float temperature, int ignore_index, SymInt V, float kd_weight, float ce_weight, int "
      "chunk_size, "
      "bool grad_hidden, bool grad_lm_head) -> (Tensor, Tensor)");
  m.def("_scale_cast(Tensor src, Tensor scale, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(lossfns, Autograd, m) {
  m.impl("fused_linear_distill_loss", &fused_linear_autograd);
}
TORCH_LIBRARY_IMPL(lossfns, CompositeExplicitAutograd, m) {
  m.impl("fused_linear_distill_loss", &fused_linear_no_grad);
}
TORCH_LIBRARY_IMPL(lossfns, AutocastCPU, m) {
  m.impl("fused_linear_distill_loss", &fused_linear_autocast<c10::DeviceType::CPU>);
}
TORCH_LIBRARY_IMPL(lossfns, AutocastCUDA, m) {
  m.impl("fused_linear_distill_loss", &fused_linear_autocast<c10::DeviceType::CUDA>);
}

}  // namespace lossfns::detail

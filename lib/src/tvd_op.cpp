// Registration of the TVD op with the dispatcher, and its autograd.
//
//   lossfns::tvd_loss      public op (Python: torch.ops.lossfns.tvd_loss), differentiable
//   lossfns::_tvd_forward  internal: loss + scale (+ packed signs on CUDA); CPU and CUDA kernels
//   lossfns::_tvd_backward internal: the gradient (CUDA: from the signs; CPU: from p and q)
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "autograd_common.h"
#include "lossfns/defaults.h"
#include "tvd_common.h"
#include "tvd_internal.h"

namespace lossfns::detail {

std::tuple<at::Tensor, at::Tensor, at::Tensor> tvd_forward_op(
    const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& labels,
    int64_t ignore_index, int64_t reduction, bool save_signs) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lossfns::_tvd_forward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&, int64_t, int64_t, bool)>();
  return op.call(p, q, labels, ignore_index, reduction, save_signs);
}

at::Tensor tvd_backward_op(const at::Tensor& grad_output, const at::Tensor& signs,
                           const at::Tensor& scale, const std::optional<at::Tensor>& p,
                           const std::optional<at::Tensor>& q,
                           const std::optional<at::Tensor>& labels, int64_t ignore_index,
                           c10::SymInt V, at::ScalarType dtype, int64_t reduction) {
  using Opt = const std::optional<at::Tensor>&;
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_tvd_backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Opt, Opt, Opt,
                            int64_t, c10::SymInt, at::ScalarType, int64_t)>();
  return op.call(grad_output, signs, scale, p, q, labels, ignore_index, V, dtype, reduction);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What forward keeps for backward: on CUDA the packed signs (tvd_common.h: sign_row_pitch(V)
// bytes per row, about BT*V/4) and a 1-element scale; on the CPU, which saves no signs,
// references to p, q and labels (no copies) and the scale.
class TVDFunction : public torch::autograd::Function<TVDFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& p, const at::Tensor& q,
                            const std::optional<at::Tensor>& labels, int64_t ignore_index,
                            int64_t reduction, bool save_signs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, signs, scale] = tvd_forward_op(p, q, labels, ignore_index, reduction, save_signs);
    // The backend saved no signs (the CPU returns 0 rows of them): backward recomputes from p
    // and q. With 0 rows both backends return 0 rows of signs, so p and q (empty, free) are kept
    // then too. (No p.numel() here: under torch.compile's symbolic shapes it cannot be called.)
    const bool recompute = save_signs && signs.sym_size(0) == 0;
    const at::Tensor none;
    const at::Tensor out = reduction == kernels::kNone ? loss.view_symint(p.sym_sizes()) : loss;
    // The output too: its node's edges lead first_order_only's error node to the inputs.
    ctx->save_for_backward({signs, scale, recompute ? p : none, recompute ? q : none,
                            recompute && labels ? *labels : none, out});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["shape"] = c10::IValue(p.sym_sizes());
    ctx->saved_data["dtype"] = static_cast<int64_t>(p.scalar_type());
    ctx->saved_data["reduction"] = reduction;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toSymIntVector();
    const bool create_graph = at::GradMode::is_enabled();
    at::NoGradGuard no_grad;  // first-order only: see first_order_only
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    auto opt = [](const at::Tensor& t) {
      return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
    };
    const at::Tensor grad_p =
        tvd_backward_op(grad_outputs[0], saved[0], saved[1], opt(saved[2]), opt(saved[3]),
                        opt(saved[4]), ctx->saved_data["ignore_index"].toInt(), shape.back(), dtype,
                        reduction)
            .view_symint(shape);
    // d/dq of 0.5*|p - q| is the negation; computed only when asked for.
    at::Tensor grad_q = ctx->needs_input_grad(1) ? grad_p.neg() : at::Tensor();
    return first_order_only("lossfns.tvd_loss", saved[5], create_graph,
                            {ctx->needs_input_grad(0) ? grad_p : at::Tensor(), grad_q, at::Tensor(),
                             at::Tensor(), at::Tensor(), at::Tensor()});
  }
};

// The public op's tensors, on either path: defined, dense, on p's device.
void check_tensors(const at::Tensor& p, const at::Tensor& q,
                   const std::optional<at::Tensor>& labels) {
  check_inputs("lossfns.tvd_loss", "p and q", {p, q});
  check_inputs("lossfns.tvd_loss", "labels", labels);
  check_device("lossfns.tvd_loss", q, p.device(), "q must be on p's device ");
  check_device("lossfns.tvd_loss", labels, p.device(), "labels must be on the device of p, ");
}

at::Tensor tvd_loss_autograd(const at::Tensor& p, const at::Tensor& q,
                             const std::optional<at::Tensor>& labels, int64_t ignore_index,
                             c10::string_view reduction) {
  check_tensors(p, q, labels);
  check_no_forward_ad("lossfns.tvd_loss", {p, q});
  const bool needs_grad = at::GradMode::is_enabled() && (p.requires_grad() || q.requires_grad());
  return TVDFunction::apply(p, q, labels, ignore_index,
                            parse_reduction(reduction, "lossfns.tvd_loss"), needs_grad);
}

// Below autograd (inference mode, or tensors without autograd): forward only, no signs saved.
at::Tensor tvd_loss_no_grad(const at::Tensor& p, const at::Tensor& q,
                            const std::optional<at::Tensor>& labels, int64_t ignore_index,
                            c10::string_view reduction) {
  check_tensors(p, q, labels);
  const int64_t r = parse_reduction(reduction, "lossfns.tvd_loss");
  at::Tensor loss =
      std::get<0>(tvd_forward_op(p, q, labels, ignore_index, r, /*save_signs=*/false));
  return r == kernels::kNone ? loss.view_symint(p.sym_sizes()) : loss;
}

}  // namespace

TORCH_LIBRARY(lossfns, m) {
  static const std::string tvd_loss_schema =
      "tvd_loss(Tensor p, Tensor q, Tensor? labels=None, int ignore_index=" +
      std::to_string(kDefaultIgnoreIndex) + ", str reduction='batchmean') -> Tensor";
  m.def(tvd_loss_schema.c_str());
  m.def(
      "_tvd_forward(Tensor p, Tensor q, Tensor? labels, int ignore_index, int reduction, "
      "bool save_signs) -> (Tensor, Tensor, Tensor)");
  m.def(
      "_tvd_backward(Tensor grad_output, Tensor signs, Tensor scale, Tensor? p, Tensor? q, "
      "Tensor? labels, int ignore_index, SymInt V, ScalarType dtype, int reduction) -> Tensor");
}

TORCH_LIBRARY_IMPL(lossfns, Autograd, m) { m.impl("tvd_loss", &tvd_loss_autograd); }
TORCH_LIBRARY_IMPL(lossfns, CompositeExplicitAutograd, m) { m.impl("tvd_loss", &tvd_loss_no_grad); }

}  // namespace lossfns::detail

// lossfns::cross_entropy_loss: its input checks, its registration with the dispatcher, its
// autograd, and the public C++ API (a thin typed call into the registered op, so C++ and Python
// share one code path).
//
//   lossfns::cross_entropy_loss        public op (Python: torch.ops.lossfns.cross_entropy_loss)
//   lossfns::_cross_entropy_forward    internal: loss, per-row stats (max, log-sum), the scale
//   lossfns::_cross_entropy_backward   internal: the gradient recomputed from logits and stats
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>

#include "autograd_common.h"
#include "cross_entropy_common.h"
#include "cross_entropy_internal.h"
#include "distill_internal.h"  // row_shape
#include "lossfns/cross_entropy.h"

namespace lossfns::detail {

namespace {
constexpr const char* kOp = "lossfns.cross_entropy_loss";
}  // namespace

CrossEntropyInputs check_ce_inputs(const at::Tensor& logits, const at::Tensor& labels,
                                   int64_t reduction, int64_t V,
                                   std::initializer_list<at::ScalarType> supported,
                                   const char* backend) {
  TORCH_CHECK(logits.defined() && labels.defined(), kOp,
              ": logits and labels must be defined tensors");
  TORCH_CHECK(logits.dim() == 2 || logits.dim() == 3, kOp,
              ": logits must be (BT, V) or (B, T, V); got shape ", dims(logits.sizes()),
              " (labels ", dims(labels.sizes()), ")");
  bool dtype_ok = false;
  for (auto d : supported) dtype_ok = dtype_ok || d == logits.scalar_type();
  TORCH_CHECK(dtype_ok, kOp, ": on ", backend, " the logits must be one of ", dtype_list(supported),
              "; got ", logits.scalar_type());
  TORCH_CHECK(logits.size(-1) > 0, kOp,
              ": the vocabulary dimension (last) of the logits must be > 0; got ",
              dims(logits.sizes()));
  CrossEntropyInputs in;
  in.reduction = reduction_from_code(reduction, kOp);
  in.width = logits.size(-1);
  TORCH_CHECK(V >= 1 && V <= in.width, kOp, ": the vocabulary's column count must be in [1, ",
              num(in.width), "]; got ", num(V));
  in.V = V;
  const auto lead = logits.sizes().slice(0, logits.dim() - 1);
  in.rows = c10::multiply_integers(lead);
  in.x = rows_view(logits, in.rows);
  TORCH_CHECK(labels.scalar_type() == at::kLong, kOp, ": labels must be int64 (Long); got ",
              labels.scalar_type(), " (logits ", logits.scalar_type(), " ", dims(logits.sizes()),
              "; ", kLabelsToLong, ")");
  in.labels = check_labels(labels, lead, in.rows, logits.device(), kOp, "logits");
  return in;
}

void check_ce_backward_inputs(const CrossEntropyInputs& in, const at::Tensor& logits,
                              const at::Tensor& stats, at::ScalarType stats_dtype,
                              const at::Tensor& grad_output, int64_t reduction) {
  constexpr const char* op = "lossfns._cross_entropy_backward";
  TORCH_CHECK(stats.dim() == 2 && stats.size(0) == in.rows &&
                  stats.size(1) == kernels::kCeStatsPerRow && stats.scalar_type() == stats_dtype &&
                  stats.is_contiguous() && stats.device() == logits.device(),
              op, ": stats must be the contiguous (", num(in.rows), ", ",
              num(kernels::kCeStatsPerRow), ") ", stats_dtype, " tensor on ", logits.device(),
              " from _cross_entropy_forward; got ", stats.scalar_type(), " ", dims(stats.sizes()),
              " on ", stats.device());
  const int64_t n = reduction == kernels::kNone ? in.rows : 1;
  TORCH_CHECK(grad_output.numel() == n, op, ": grad_output must have ", num(n),
              " element(s) (the loss's shape); got ", dims(grad_output.sizes()));
  TORCH_CHECK(grad_output.device() == logits.device(), op,
              ": grad_output must be on the device of logits, ", logits.device(), "; got ",
              grad_output.device());
}

void check_ce_label_values(const CrossEntropyInputs& in, int64_t ignore_index,
                           c10::IntArrayRef logits_shape) {
  const int64_t* l = in.labels.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < in.rows; ++r) {
    if (l[r] == ignore_index || kernels::ce_label_in_range(l[r], in.V)) continue;
    TORCH_CHECK(false, kOp, ": labels must be in [0, ", num(in.V), ") (the vocabulary's columns",
                in.V < in.width ? ", vocab_size" : "", ") or ignore_index (", num(ignore_index),
                "); got ", num(l[r]), " at row ", num(r), " (logits ", dims(logits_shape), ")");
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_op(const at::Tensor& logits,
                                                                        const at::Tensor& labels,
                                                                        int64_t ignore_index,
                                                                        int64_t reduction,
                                                                        c10::SymInt V) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_cross_entropy_forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, int64_t, int64_t, c10::SymInt)>();
  return op.call(logits, labels, ignore_index, reduction, V);
}

at::Tensor cross_entropy_backward_op(const at::Tensor& grad_output, const at::Tensor& logits,
                                     const at::Tensor& labels, const at::Tensor& stats,
                                     const at::Tensor& scale, int64_t ignore_index,
                                     int64_t reduction, c10::SymInt V) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_cross_entropy_backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, int64_t, int64_t, c10::SymInt)>();
  return op.call(grad_output, logits, labels, stats, scale, ignore_index, reduction, V);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The public arguments in kernel form: the reduction code and V, the columns that count.
std::pair<int64_t, c10::SymInt> resolve(const at::Tensor& logits, c10::string_view reduction,
                                        std::optional<int64_t> vocab_size) {
  TORCH_CHECK(logits.dim() >= 1, kOp, ": logits must be (BT, V) or (B, T, V); got ",
              dims(logits.sizes()));
  return {parse_reduction(std::string_view(reduction.data(), reduction.size()), kOp),
          resolve_vocab_size(vocab_size, logits.sym_size(-1), kOp)};
}

at::Tensor view_loss(const at::Tensor& loss, const at::Tensor& logits, int64_t reduction) {
  return reduction == kernels::kNone ? loss.view_symint(row_shape(logits)) : loss;
}

// What forward keeps for backward: the logits and labels (references, no copies), the (rows, 2)
// statistics and the scale.
class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels, int64_t ignore_index, int64_t reduction,
                            c10::SymInt V) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, stats, scale] =
        cross_entropy_forward_op(logits, labels, ignore_index, reduction, V);
    const at::Tensor out = view_loss(loss, logits, reduction);
    // The output too: its node's edges lead first_order_only's error node to the input.
    ctx->save_for_backward({logits, labels, stats, scale, out});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["V"] = V;
    ctx->saved_data["shape"] = c10::IValue(logits.sym_sizes());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const bool create_graph = at::GradMode::is_enabled();
    at::NoGradGuard no_grad;  // first-order only: see first_order_only
    const at::Tensor grad = cross_entropy_backward_op(
        grad_outputs[0], saved[0], saved[1], saved[2], saved[3],
        ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["reduction"].toInt(),
        ctx->saved_data["V"].toSymInt());
    return first_order_only(kOp, saved[4], create_graph,
                            {grad.view_symint(ctx->saved_data["shape"].toSymIntVector()),
                             at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()});
  }
};

at::Tensor cross_entropy_loss_autograd(const at::Tensor& logits, const at::Tensor& labels,
                                       int64_t ignore_index, c10::string_view reduction,
                                       std::optional<int64_t> vocab_size) {
  check_inputs(kOp, "logits and labels", {logits, labels});
  check_device(kOp, labels, logits.device(), "labels must be on the device of logits, ");
  check_no_forward_ad(kOp, {logits});
  const auto [red, V] = resolve(logits, reduction, vocab_size);
  if (!(at::GradMode::is_enabled() && logits.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return view_loss(std::get<0>(cross_entropy_forward_op(logits, labels, ignore_index, red, V)),
                     logits, red);
  }
  return CrossEntropyFunction::apply(logits, labels, ignore_index, red, V);
}

// Below autograd (inference mode, tensors without autograd): forward only.
at::Tensor cross_entropy_loss_no_grad(const at::Tensor& logits, const at::Tensor& labels,
                                      int64_t ignore_index, c10::string_view reduction,
                                      std::optional<int64_t> vocab_size) {
  check_inputs(kOp, "logits and labels", {logits, labels});
  check_device(kOp, labels, logits.device(), "labels must be on the device of logits, ");
  const auto [red, V] = resolve(logits, reduction, vocab_size);
  return view_loss(std::get<0>(cross_entropy_forward_op(logits, labels, ignore_index, red, V)),
                   logits, red);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lossfns, m) {
  static const std::string schema =
      "cross_entropy_loss(Tensor logits, Tensor labels, int ignore_index=" +
      std::to_string(kDefaultIgnoreIndex) +
      ", str reduction='mean', int? vocab_size=None) -> Tensor";
  m.def(schema.c_str());
  m.def(
      "_cross_entropy_forward(Tensor logits, Tensor labels, int ignore_index, int reduction, "
      "SymInt V) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "_cross_entropy_backward(Tensor grad_output, Tensor logits, Tensor labels, Tensor stats, "
      "Tensor scale, "
      "int ignore_index, int reduction, SymInt V) -> Tensor");
}

TORCH_LIBRARY_IMPL(lossfns, Autograd, m) {
  m.impl("cross_entropy_loss", &cross_entropy_loss_autograd);
}
TORCH_LIBRARY_IMPL(lossfns, CompositeExplicitAutograd, m) {
  m.impl("cross_entropy_loss", &cross_entropy_loss_no_grad);
}

}  // namespace lossfns::detail

namespace lossfns {

at::Tensor cross_entropy_loss(const at::Tensor& logits, const at::Tensor& labels,
                              const CrossEntropyLossOptions& o) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lossfns::cross_entropy_loss", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                               c10::string_view, std::optional<int64_t>)>();
  return op.call(logits, labels, o.ignore_index(), reduction_name(o.reduction()), o.vocab_size());
}

}  // namespace lossfns

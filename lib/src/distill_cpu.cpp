// CPU adapter of lossfns::distill_loss: checks inputs, picks dtype and divergence, runs the
// framework-free row kernels (distill_cpu_kernel.h) over rows in parallel, and registers them for
// the CPU dispatch key. The CPU always recomputes the gradient in backward (a grad_scale hint is
// accepted and ignored): its forward saves only the per-row statistics.
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "distill_cpu_kernel.h"
#include "distill_internal.h"

namespace lossfns::detail {
namespace {

constexpr std::initializer_list<at::ScalarType> kCpuDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                                              at::kBFloat16};

// Rows per parallel task: about 64K elements each, so small V does not drown in task overhead.
int64_t grain_rows(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 16) / V); }

bool ignored(const int64_t* labels, int64_t row, int64_t ignore_index) {
  return labels != nullptr && labels[row] == ignore_index;
}

// Calls f with the divergence as a compile-time constant (the row kernels are specialised on it).
template <typename F>
void with_divergence(int64_t divergence, F&& f) {
  switch (divergence) {
    case kernels::kTvd:
      return f(std::integral_constant<int64_t, kernels::kTvd>{});
    case kernels::kForwardKl:
      return f(std::integral_constant<int64_t, kernels::kForwardKl>{});
    case kernels::kReverseKl:
      return f(std::integral_constant<int64_t, kernels::kReverseKl>{});
    default:
      return f(std::integral_constant<int64_t, kernels::kJsd>{});
  }
}

template <typename scalar_t>
kernels::CpuRow<scalar_t> row_of(const DistillInputs& in, int64_t r) {
  return {in.s.const_data_ptr<scalar_t>() + r * in.s.stride(0),
          in.t.const_data_ptr<scalar_t>() + r * in.t.stride(0), in.ws, in.wt, in.V};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> distill_forward_cpu(
    const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& labels,
    int64_t divergence, double beta, double temperature, int64_t ignore_index,
    int64_t reduction_code, int64_t V,
    const std::optional<at::Tensor>& /*grad_scale: the CPU recomputes in backward*/,
    bool /*save*/) {
  const kernels::Reduction reduction =
      reduction_from_code(reduction_code, "lossfns._distill_forward");
  const DistillInputs in =
      check_distill_inputs(s, t, labels, divergence, beta, temperature, V, kCpuDtypes, "CPU");
  const auto acc_dtype = s.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto acc_opts = s.options().dtype(acc_dtype);
  at::Tensor stats = at::empty({in.rows, kernels::kStatsPerRow}, acc_opts);
  at::Tensor loss, scale = at::empty({1}, acc_opts);
  const int64_t* l = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, s.scalar_type(), "lossfns_distill_forward_cpu", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const acc_t inv_t = acc_t(1.0 / temperature);
        const kernels::JsdConstants<acc_t> jsd(divergence == kernels::kJsd ? beta : 0.5);
        acc_t* st = stats.mutable_data_ptr<acc_t>();
        with_divergence(divergence, [&](auto div) {
          at::parallel_for(0, in.rows, grain_rows(in.V), [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
              acc_t* row_stats = st + r * kernels::kStatsPerRow;
              if (ignored(l, r, ignore_index)) {
                std::fill(row_stats, row_stats + kernels::kStatsPerRow, acc_t(0));
                continue;
              }
              kernels::distill_row_forward_cpu<decltype(div)::value>(row_of<scalar_t>(in, r), inv_t,
                                                                     jsd, row_stats);
            }
          });
        });
        double sum = 0.0;  // rows summed in double: many rows must not lose the small ones
        int64_t valid = 0;
        for (int64_t r = 0; r < in.rows; ++r) {
          sum += static_cast<double>(st[r * kernels::kStatsPerRow + kernels::kStatLoss]);
          valid += ignored(l, r, ignore_index) ? 0 : 1;
        }
        const double sc = kernels::distill_reduction_scale<double>(reduction, valid, in.V);
        scale.fill_(sc);
        loss = reduction == kernels::kNone ? stats.select(1, kernels::kStatLoss).clone()
                                           : at::scalar_tensor(sum * sc, acc_opts);
      });
  return {loss, stats, scale, at::empty({0, in.ws}, s.options())};
}

at::Tensor distill_backward_cpu(const at::Tensor& grad_output, const at::Tensor& s,
                                const at::Tensor& t, const std::optional<at::Tensor>& labels,
                                const at::Tensor& stats, const at::Tensor& scale,
                                int64_t divergence, double beta, double temperature,
                                int64_t ignore_index, int64_t reduction_code, int64_t V) {
  const kernels::Reduction reduction =
      reduction_from_code(reduction_code, "lossfns._distill_backward");
  const DistillInputs in =
      check_distill_inputs(s, t, labels, divergence, beta, temperature, V, kCpuDtypes, "CPU");
  const auto acc_dtype = s.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  check_distill_backward(in, stats, acc_dtype, grad_output, reduction);
  const bool none = reduction == kernels::kNone;
  at::Tensor grad =
      at::empty({in.rows, in.ws}, s.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t* l = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, s.scalar_type(), "lossfns_distill_backward_cpu", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const acc_t inv_t = acc_t(1.0 / temperature);
        const kernels::JsdConstants<acc_t> jsd(divergence == kernels::kJsd ? beta : 0.5);
        const at::Tensor go = grad_output.reshape({-1}).to(acc_dtype).contiguous();
        const acc_t* gop = go.const_data_ptr<acc_t>();
        const acc_t sc = scale.to(acc_dtype).item<acc_t>();
        const acc_t* st = stats.const_data_ptr<acc_t>();
        scalar_t* g = grad.mutable_data_ptr<scalar_t>();
        with_divergence(divergence, [&](auto div) {
          at::parallel_for(0, in.rows, grain_rows(in.V), [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
              scalar_t* grow = g + r * in.ws;
              if (ignored(l, r, ignore_index)) {
                std::fill(grow, grow + in.ws, scalar_t(0));
                continue;
              }
              const acc_t row_scale = (none ? gop[r] : gop[0] * sc) * inv_t;
              kernels::distill_row_backward_cpu<decltype(div)::value>(
                  row_of<scalar_t>(in, r), inv_t, jsd, st + r * kernels::kStatsPerRow, row_scale,
                  grow);
            }
          });
        });
      });
  return grad;
}

// The saved-gradient path's check (CUDA only saves a gradient; kept for completeness).
void distill_rescale_grad_cpu(at::Tensor& grad, const at::Tensor& grad_output,
                              const at::Tensor& grad_scale) {
  if (grad.numel() == 0) return;
  const double go = grad_output.item<double>(), gs = grad_scale.item<double>();
  if (go != gs) grad.mul_(go / gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CPU, m) {
  m.impl("_distill_forward", &distill_forward_cpu);
  m.impl("_distill_backward", &distill_backward_cpu);
  m.impl("_distill_rescale_grad_", &distill_rescale_grad_cpu);
}

}  // namespace lossfns::detail

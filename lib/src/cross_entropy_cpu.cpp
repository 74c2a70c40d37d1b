// CPU adapter of lossfns::cross_entropy_loss: checks inputs and label values, picks the dtype,
// runs the framework-free row kernels (cross_entropy_cpu_kernel.h) over rows in parallel, and
// registers them for the CPU dispatch key.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "cross_entropy_cpu_kernel.h"
#include "cross_entropy_internal.h"

namespace lossfns::detail {
namespace {

constexpr std::initializer_list<at::ScalarType> kCpuDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                                              at::kBFloat16};

// Rows per parallel task: about 64K elements each, so small V does not drown in task overhead.
int64_t grain_rows(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 16) / V); }

at::ScalarType acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_cpu(const at::Tensor& logits,
                                                                         const at::Tensor& labels,
                                                                         int64_t ignore_index,
                                                                         int64_t reduction,
                                                                         int64_t V) {
  const CrossEntropyInputs in = check_ce_inputs(logits, labels, reduction, V, kCpuDtypes, "CPU");
  check_ce_label_values(in, ignore_index, logits.sizes());
  const auto acc_opts = logits.options().dtype(acc_dtype(logits));
  at::Tensor stats = at::empty({in.rows, kernels::kCeStatsPerRow}, acc_opts);
  at::Tensor row_loss = at::empty({in.rows}, acc_opts);
  at::Tensor loss, scale = at::empty({1}, acc_opts);
  const int64_t* l = in.labels.const_data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, logits.scalar_type(), "lossfns_ce_forward_cpu", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        acc_t* st = stats.mutable_data_ptr<acc_t>();
        acc_t* rl = row_loss.mutable_data_ptr<acc_t>();
        const scalar_t* x = in.x.const_data_ptr<scalar_t>();
        const int64_t stride = in.x.stride(0);
        at::parallel_for(0, in.rows, grain_rows(in.V), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            acc_t* row_stats = st + r * kernels::kCeStatsPerRow;
            if (l[r] == ignore_index) {
              std::fill(row_stats, row_stats + kernels::kCeStatsPerRow, acc_t(0));
              rl[r] = acc_t(0);
              continue;
            }
            rl[r] =
                kernels::ce_row_forward_cpu<scalar_t, acc_t>(x + r * stride, in.V, l[r], row_stats);
          }
        });
        double sum = 0.0;  // rows summed in double: many rows must not lose the small ones
        int64_t valid = 0;
        for (int64_t r = 0; r < in.rows; ++r) {
          sum += static_cast<double>(rl[r]);
          valid += l[r] == ignore_index ? 0 : 1;
        }
        const double sc = kernels::ce_reduction_scale<double>(in.reduction, valid);
        scale.fill_(sc);
        loss = reduction == kernels::kNone ? row_loss : at::scalar_tensor(sum * sc, acc_opts);
      });
  return {loss, stats, scale};
}

at::Tensor cross_entropy_backward_cpu(const at::Tensor& grad_output, const at::Tensor& logits,
                                      const at::Tensor& labels, const at::Tensor& stats,
                                      const at::Tensor& scale, int64_t ignore_index,
                                      int64_t reduction, int64_t V) {
  const CrossEntropyInputs in = check_ce_inputs(logits, labels, reduction, V, kCpuDtypes, "CPU");
  check_ce_label_values(in, ignore_index, logits.sizes());  // rows only; the kernels index by label
  const auto acc = acc_dtype(logits);
  check_ce_backward_inputs(in, logits, stats, acc, grad_output, reduction);
  const bool none = reduction == kernels::kNone;
  at::Tensor grad =
      at::empty({in.rows, in.width}, logits.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t* l = in.labels.const_data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, logits.scalar_type(), "lossfns_ce_backward_cpu", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const at::Tensor go = grad_output.reshape({-1}).to(acc).contiguous();
        const acc_t* gop = go.const_data_ptr<acc_t>();
        const acc_t sc = scale.to(acc).item<acc_t>();
        const acc_t* st = stats.const_data_ptr<acc_t>();
        const scalar_t* x = in.x.const_data_ptr<scalar_t>();
        const int64_t stride = in.x.stride(0);
        scalar_t* g = grad.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, in.rows, grain_rows(in.V), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            scalar_t* grow = g + r * in.width;
            if (l[r] == ignore_index) {
              std::fill(grow, grow + in.width, scalar_t(0));
              continue;
            }
            const acc_t row_scale = none ? gop[r] : gop[0] * sc;
            const acc_t* row_stats = st + r * kernels::kCeStatsPerRow;
            kernels::ce_row_backward_cpu(x + r * stride, in.V, in.width, l[r], row_stats, row_scale,
                                         grow);
          }
        });
      });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CPU, m) {
  m.impl("_cross_entropy_forward", &cross_entropy_forward_cpu);
  m.impl("_cross_entropy_backward", &cross_entropy_backward_cpu);
}

}  // namespace lossfns::detail

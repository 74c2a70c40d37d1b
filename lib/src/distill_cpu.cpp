// CPU adapter of lossfns::distill_loss: checks inputs, picks dtype and divergence, runs the
// framework-free row kernels (distill_cpu_kernel.h) over rows in parallel, and registers them for
// the CPU dispatch key. The CPU always recomputes the gradient in backward (a grad_scale hint is
// checked and ignored): its forward saves only the per-row statistics.
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "distill_cpu_isa.h"
#include "distill_cpu_kernel.h"
#include "distill_internal.h"

namespace lossfns::detail {
namespace {

constexpr std::initializer_list<at::ScalarType> kCpuDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                                              at::kBFloat16};

// Rows per parallel task: about 64K elements each, so small V does not drown in task overhead.
int64_t grain_rows(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 16) / V); }

// Rows of the dtypes that compute in float (fp32, fp16, bf16) also have AVX2 + FMA and AVX-512
// builds (distill_cpu_isa.cpp); each call runs the one cpu_isa() chose. fp64, and other platforms,
// run the baseline build.
template <typename T, typename Acc>
void forward_rows(int64_t divergence, const kernels::CpuRows<T>& rows, int64_t begin, int64_t end,
                  Acc inv_t, const kernels::JsdConstants<Acc>& jsd, Acc* stats) {
#if LOSSFNS_X86_ISA_DISPATCH
  if constexpr (std::is_same_v<Acc, float>) {
    const CpuIsa isa = cpu_isa();  // chosen once per process
    if (isa == CpuIsa::kAvx512)
      return distill_forward_rows_avx512(divergence, rows, begin, end, inv_t, jsd, stats);
    if (isa == CpuIsa::kAvx2)
      return distill_forward_rows_avx2(divergence, rows, begin, end, inv_t, jsd, stats);
  }
#endif
  kernels::distill_rows_forward_cpu(divergence, rows, begin, end, inv_t, jsd, stats);
}
template <typename T, typename Acc>
void backward_rows(int64_t divergence, const kernels::CpuRows<T>& rows, int64_t begin, int64_t end,
                   Acc inv_t, const kernels::JsdConstants<Acc>& jsd, const Acc* stats,
                   const Acc* grad_output, bool none, Acc reduce_scale, T* grad) {
#if LOSSFNS_X86_ISA_DISPATCH
  if constexpr (std::is_same_v<Acc, float>) {
    const CpuIsa isa = cpu_isa();  // chosen once per process
    if (isa == CpuIsa::kAvx512)
      return distill_backward_rows_avx512(divergence, rows, begin, end, inv_t, jsd, stats,
                                          grad_output, none, reduce_scale, grad);
    if (isa == CpuIsa::kAvx2)
      return distill_backward_rows_avx2(divergence, rows, begin, end, inv_t, jsd, stats,
                                        grad_output, none, reduce_scale, grad);
  }
#endif
  kernels::distill_rows_backward_cpu(divergence, rows, begin, end, inv_t, jsd, stats, grad_output,
                                     none, reduce_scale, grad);
}

template <typename scalar_t>
kernels::CpuRows<scalar_t> rows_of(const DistillInputs& in, const int64_t* labels,
                                   int64_t ignore_index) {
  return {in.s.const_data_ptr<scalar_t>(),
          in.t.const_data_ptr<scalar_t>(),
          in.s.stride(0),
          in.t.stride(0),
          in.ws,
          in.wt,
          in.V,
          labels,
          ignore_index};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> distill_forward_cpu(
    const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& labels,
    int64_t divergence, double beta, double temperature, int64_t ignore_index,
    int64_t reduction_code, int64_t V, const std::optional<at::Tensor>& grad_scale, bool /*save*/) {
  const kernels::Reduction reduction =
      reduction_from_code(reduction_code, "lossfns._distill_forward");
  const DistillInputs in =
      check_distill_inputs(s, t, labels, divergence, beta, temperature, V, kCpuDtypes, "CPU");
  check_grad_scale(s, grad_scale);  // unused here (the CPU recomputes in backward), yet checked
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
        const auto rows = rows_of<scalar_t>(in, l, ignore_index);
        at::parallel_for(0, in.rows, grain_rows(in.V), [&](int64_t b, int64_t e) {
          forward_rows(divergence, rows, b, e, inv_t, jsd, st);
        });
        double sum = 0.0;  // rows summed in double: many rows must not lose the small ones
        int64_t valid = 0;
        for (int64_t r = 0; r < in.rows; ++r) {
          sum += static_cast<double>(st[r * kernels::kStatsPerRow + kernels::kStatLoss]);
          valid += rows.ignored(r) ? 0 : 1;
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
        const auto rows = rows_of<scalar_t>(in, l, ignore_index);
        at::parallel_for(0, in.rows, grain_rows(in.V), [&](int64_t b, int64_t e) {
          backward_rows(divergence, rows, b, e, inv_t, jsd, st, gop, none, sc, g);
        });
      });
  return grad;
}

// The saved-gradient path's check (CUDA only saves a gradient; kept for completeness).
void distill_rescale_grad_cpu(at::Tensor& grad, const at::Tensor& grad_output,
                              const at::Tensor& grad_scale) {
  if (grad.numel() == 0) return;
  const double go = grad_output.item<double>(), hint = grad_scale.item<double>();
  const double gs = hint == 0 ? 1 : hint;  // the CUDA kernels' hinted_scale
  if (go != gs) grad.mul_(go / gs);
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CPU, m) {
  m.impl("_distill_forward", &distill_forward_cpu);
  m.impl("_distill_backward", &distill_backward_cpu);
  m.impl("_distill_rescale_grad_", &distill_rescale_grad_cpu);
}

}  // namespace lossfns::detail

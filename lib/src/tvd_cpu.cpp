// CPU adapter of the TVD op: checks inputs, picks the dtype, runs the framework-free row kernels
// (tvd_cpu_kernel.h) over rows in parallel, and registers them for the CPU dispatch key.
// The CPU forward saves no signs; backward recomputes them from p and q (see tvd_cpu_kernel.h).
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "tvd_cpu_kernel.h"
#include "tvd_internal.h"

namespace lossfns::detail {
namespace {

constexpr std::initializer_list<at::ScalarType> kCpuDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                                              at::kBFloat16};

// Rows per parallel task: about 64K elements each, so small V does not drown in task overhead.
int64_t grain_rows(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 16) / V); }

// A fresh (rows, V) output is first touched by our kernel, and on Linux the first touch of every
// 4 KiB page is a fault plus zeroing: for a 131 MB gradient that costs more than the kernel's own
// pass (2-core development machine: 38 ms to fill a fresh 1024 x 32000 float tensor, 8 ms to fill
// it again). Transparent huge pages on the buffer's 2 MiB-aligned interior cut that to ~20 ms:
// the madvise that c10's CPU allocator itself does under THP_MEM_ALLOC_ENABLE=1, here for our
// outputs only. A hint: a no-op where THP is off or unsupported.
void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const size_t bytes = t.nbytes();
  if (bytes < 4 * kHuge) return;
  const auto data = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const uintptr_t begin = (data + kHuge - 1) & ~(kHuge - 1), end = (data + bytes) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

bool ignored(const int64_t* labels, int64_t row, int64_t ignore_index) {
  return labels != nullptr && labels[row] == ignore_index;
}

template <typename scalar_t, typename acc_t, bool kElem>
void forward_rows(const FlatInputs& in, int64_t ignore_index, acc_t* elem, double* row_loss) {
  const scalar_t* p = in.p.const_data_ptr<scalar_t>();
  const scalar_t* q = in.q.const_data_ptr<scalar_t>();
  const int64_t ps = in.p.stride(0), qs = in.q.stride(0), V = in.V;
  const int64_t* labels = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, in.rows, grain_rows(V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (ignored(labels, r, ignore_index)) {  // no loss, no gradient
        if (kElem) std::fill(elem + r * V, elem + (r + 1) * V, acc_t(0));
        row_loss[r] = 0.0;
        continue;
      }
      row_loss[r] = kernels::tvd_row_forward_cpu<kElem>(p + r * ps, q + r * qs, V,
                                                        kElem ? elem + r * V : nullptr);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tvd_forward_cpu(
    const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& labels,
    int64_t ignore_index, int64_t reduction_code, bool /*save_signs: the CPU recomputes them*/) {
  const kernels::Reduction reduction = reduction_from_code(reduction_code, "lossfns._tvd_forward");
  const FlatInputs in = check_and_flatten(p, q, labels, kCpuDtypes, "CPU");
  const auto acc_dtype = p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const bool none = reduction == kernels::kNone;
  at::Tensor signs = at::empty({0, kernels::sign_row_pitch(in.V)}, p.options().dtype(at::kByte));
  at::Tensor loss = none ? at::empty({in.rows, in.V}, p.options().dtype(acc_dtype)) : at::Tensor();
  if (none) advise_huge_pages(loss);
  at::Tensor scale = at::empty({none ? 0 : 1}, p.options().dtype(acc_dtype));

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, p.scalar_type(), "lossfns_tvd_forward_cpu", [&] {
        using acc_t =
            at::opmath_type<scalar_t>;  // float for half/bfloat16/float, double for double
        std::vector<double> row_loss(static_cast<size_t>(in.rows));
        if (none) {
          forward_rows<scalar_t, acc_t, true>(in, ignore_index, loss.mutable_data_ptr<acc_t>(),
                                              row_loss.data());
          return;
        }
        forward_rows<scalar_t, acc_t, false>(in, ignore_index, nullptr, row_loss.data());
        double sum = 0.0;  // rows summed in double: BT*V terms must not lose the small ones
        int64_t valid = 0;
        const int64_t* l = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
        for (int64_t r = 0; r < in.rows; ++r) {
          sum += row_loss[r];
          valid += ignored(l, r, ignore_index) ? 0 : 1;
        }
        const double sc = kernels::reduction_scale<double>(reduction, valid, in.V);
        loss = at::scalar_tensor(0.5 * sum * sc, p.options().dtype(acc_dtype));
        scale.fill_(sc);
      });
  return {loss, signs, scale};
}

at::Tensor tvd_backward_cpu(const at::Tensor& grad_output, const at::Tensor& /*signs: CUDA only*/,
                            const at::Tensor& scale, const std::optional<at::Tensor>& p_opt,
                            const std::optional<at::Tensor>& q_opt,
                            const std::optional<at::Tensor>& labels, int64_t ignore_index,
                            int64_t V, at::ScalarType dtype, int64_t reduction_code) {
  const kernels::Reduction reduction = reduction_from_code(reduction_code, "lossfns._tvd_backward");
  TORCH_CHECK(p_opt && q_opt && p_opt->defined() && q_opt->defined(),
              "lossfns._tvd_backward: on CPU, p and q (the forward's inputs) are required");
  const FlatInputs in = check_and_flatten(*p_opt, *q_opt, labels, kCpuDtypes, "CPU");
  TORCH_CHECK(in.V == V && in.p.scalar_type() == dtype, "lossfns._tvd_backward: V ", num(V),
              " and dtype ", dtype, " must match p's (", num(in.V), ", ", in.p.scalar_type(), ")");
  check_backward_inputs(grad_output, scale, in.rows, V, reduction);
  at::Tensor grad =
      at::empty({in.rows, V}, in.p.options().memory_format(at::MemoryFormat::Contiguous));
  advise_huge_pages(grad);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lossfns_tvd_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_dtype = c10::CppTypeToScalarType<acc_t>::value;
    const bool none = reduction == kernels::kNone;
    const at::Tensor go =
        none ? grad_output.reshape({in.rows, V}).to(acc_dtype).contiguous() : at::Tensor();
    const acc_t h = none ? acc_t(0)
                         : acc_t(0.5) * grad_output.to(acc_dtype).item<acc_t>() *
                               scale.to(acc_dtype).item<acc_t>();
    const scalar_t* p = in.p.const_data_ptr<scalar_t>();
    const scalar_t* q = in.q.const_data_ptr<scalar_t>();
    const int64_t* l = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
    scalar_t* g = grad.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, in.rows, grain_rows(V), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        scalar_t* grow = g + r * V;
        if (ignored(l, r, ignore_index)) {
          std::fill(grow, grow + V, scalar_t(0));
        } else if (none) {
          kernels::tvd_row_backward_cpu<true>(p + r * in.p.stride(0), q + r * in.q.stride(0), V, h,
                                              go.const_data_ptr<acc_t>() + r * V, grow);
        } else {
          kernels::tvd_row_backward_cpu<false>(p + r * in.p.stride(0), q + r * in.q.stride(0), V, h,
                                               static_cast<const acc_t*>(nullptr), grow);
        }
      }
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CPU, m) {
  m.impl("_tvd_forward", &tvd_forward_cpu);
  m.impl("_tvd_backward", &tvd_backward_cpu);
}

}  // namespace lossfns::detail

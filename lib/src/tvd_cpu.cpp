// CPU adapter of the TVD op: checks inputs, picks the dtype, runs the framework-free row kernels
// (tvd_cpu_kernel.h) over rows in parallel, and registers them for the CPU dispatch key.
#include <vector>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "tvd_cpu_kernel.h"
#include "tvd_internal.h"

namespace lossfns::detail {
namespace {

using kernels::sign_row_pitch;

// Rows per parallel task: about 64K elements each, so small V does not drown in task overhead.
int64_t grain_rows(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 16) / V); }

template <typename scalar_t, typename acc_t, bool kSave, bool kElem>
void forward_rows(const FlatInputs& in, int64_t ignore_index, uint8_t* signs, acc_t* elem,
                  acc_t* row_loss) {
  const scalar_t* p = in.p.const_data_ptr<scalar_t>();
  const scalar_t* q = in.q.const_data_ptr<scalar_t>();
  const int64_t ps = in.p.stride(0), qs = in.q.stride(0), V = in.V, pitch = sign_row_pitch(V);
  const int64_t* labels = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, in.rows, grain_rows(V), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uint8_t* srow = kSave ? signs + r * pitch : nullptr;
      acc_t* erow = kElem ? elem + r * V : nullptr;
      if (labels != nullptr && labels[r] == ignore_index) {  // no loss, no gradient
        if (kSave) std::fill(srow, srow + pitch, uint8_t{0});
        if (kElem) std::fill(erow, erow + V, acc_t(0));
        row_loss[r] = acc_t(0);
        continue;
      }
      row_loss[r] = kernels::tvd_row_forward_cpu<kSave, kElem>(p + r * ps, q + r * qs, V, srow, erow);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tvd_forward_cpu(
    const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& labels,
    int64_t ignore_index, int64_t reduction, bool save_signs) {
  const FlatInputs in = check_and_flatten(p, q, labels, reduction,
                                          {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}, "CPU");
  const auto acc_dtype = p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const bool none = reduction == kernels::kNone;
  at::Tensor signs = at::empty({save_signs ? in.rows : 0, sign_row_pitch(in.V)}, p.options().dtype(at::kByte));
  at::Tensor elem = none ? at::empty({in.rows, in.V}, p.options().dtype(acc_dtype)) : at::Tensor();
  at::Tensor loss, scale = at::empty({none ? 0 : 1}, p.options().dtype(acc_dtype));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.scalar_type(), "lossfns_tvd_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;  // float for half/bfloat16/float, double for double
    std::vector<acc_t> row_loss(static_cast<size_t>(in.rows));
    uint8_t* s = save_signs ? signs.mutable_data_ptr<uint8_t>() : nullptr;
    acc_t* e = none ? elem.mutable_data_ptr<acc_t>() : nullptr;
    if (save_signs && none) forward_rows<scalar_t, acc_t, true, true>(in, ignore_index, s, e, row_loss.data());
    else if (save_signs) forward_rows<scalar_t, acc_t, true, false>(in, ignore_index, s, e, row_loss.data());
    else if (none) forward_rows<scalar_t, acc_t, false, true>(in, ignore_index, s, e, row_loss.data());
    else forward_rows<scalar_t, acc_t, false, false>(in, ignore_index, s, e, row_loss.data());
    if (none) {
      loss = elem;
      return;
    }
    double sum = 0.0;  // rows summed in double: BT*V terms must not lose the small ones
    int64_t valid = 0;
    const int64_t* l = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
    for (int64_t r = 0; r < in.rows; ++r) {
      sum += static_cast<double>(row_loss[r]);
      valid += (l == nullptr || l[r] != ignore_index) ? 1 : 0;
    }
    const double sc = kernels::reduction_scale<double>(reduction, valid, in.V);
    loss = at::scalar_tensor(0.5 * sum * sc, p.options().dtype(acc_dtype));
    scale.fill_(sc);
  });
  return {loss, signs, scale};
}

at::Tensor tvd_backward_cpu(const at::Tensor& grad_output, const at::Tensor& signs, const at::Tensor& scale,
                            int64_t V, at::ScalarType dtype, int64_t reduction) {
  check_backward_inputs(grad_output, signs, scale, V, reduction);
  const int64_t rows = signs.size(0), pitch = sign_row_pitch(V);
  at::Tensor grad = at::empty({rows, V}, signs.options().dtype(dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lossfns_tvd_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_dtype = c10::CppTypeToScalarType<acc_t>::value;
    const uint8_t* s = signs.const_data_ptr<uint8_t>();
    scalar_t* g = grad.mutable_data_ptr<scalar_t>();
    if (reduction == kernels::kNone) {
      const at::Tensor go = grad_output.reshape({rows, V}).to(acc_dtype).contiguous();
      const acc_t* gop = go.const_data_ptr<acc_t>();
      at::parallel_for(0, rows, grain_rows(V), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          kernels::tvd_row_backward_none_cpu<scalar_t, acc_t>(s + r * pitch, V, gop + r * V, g + r * V);
      });
      return;
    }
    const acc_t h = acc_t(0.5) * grad_output.to(acc_dtype).item<acc_t>() * scale.to(acc_dtype).item<acc_t>();
    at::parallel_for(0, rows, grain_rows(V), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) kernels::tvd_row_backward_cpu<scalar_t, acc_t>(s + r * pitch, V, h, g + r * V);
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

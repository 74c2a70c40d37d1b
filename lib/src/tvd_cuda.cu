// CUDA adapter of the TVD op: checks inputs, maps ATen dtypes to CUDA's, launches the
// framework-free kernels (tvd_cuda_kernel.cuh) on the current stream, checks every launch, and
// registers them for the CUDA dispatch key. No host-device synchronisation anywhere.
#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda_adapter.h"
#include "tvd_cuda_kernel.cuh"
#include "tvd_internal.h"

namespace lossfns::detail {
namespace {

constexpr const char* kOp = "lossfns.tvd_loss";

using kernels::sign_row_pitch;

std::tuple<at::Tensor, at::Tensor, at::Tensor> tvd_forward_cuda(
    const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& labels,
    int64_t ignore_index, int64_t reduction_code, bool save_signs) {
  const kernels::Reduction reduction = reduction_from_code(reduction_code, "lossfns._tvd_forward");
  const FlatInputs in = check_and_flatten(p, q, labels, kCudaDtypes, "CUDA");
  TORCH_CHECK(in.rows <= int64_t{INT32_MAX}, "lossfns.tvd_loss: at most 2^31-1 rows on CUDA; got ",
              num(in.rows));
  const c10::cuda::CUDAGuard guard(p.device());
  const auto f32 = p.options().dtype(at::kFloat);
  const bool none = reduction == kernels::kNone;
  at::Tensor signs =
      at::empty({save_signs ? in.rows : 0, sign_row_pitch(in.V)}, p.options().dtype(at::kByte));
  at::Tensor loss = none ? at::empty({in.rows, in.V}, f32) : at::empty({}, f32);
  at::Tensor scale = at::empty({none ? 0 : 1}, f32);
  if (in.rows == 0) {  // nothing to launch (a grid of 0 blocks is invalid): as the CPU does
    if (!none) {
      loss.zero_();
      scale.fill_(kernels::reduction_scale<double>(reduction, 0, in.V));
    }
    return {loss, signs, scale};
  }
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;

  AT_DISPATCH_V2(
      p.scalar_type(), "lossfns_tvd_forward_cuda", AT_WRAP([&] {
        using T = typename CudaType<scalar_t>::type;
        kernels::TvdForwardArgs<T> a{};
        a.p = reinterpret_cast<const T*>(in.p.const_data_ptr<scalar_t>());
        a.q = reinterpret_cast<const T*>(in.q.const_data_ptr<scalar_t>());
        a.p_row_stride = in.p.stride(0);
        a.q_row_stride = in.q.stride(0);
        a.labels = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
        a.ignore_index = ignore_index;
        a.rows = in.rows;
        a.V = in.V;
        a.num_sms = num_sms;
        a.pdl = true;  // the finalize: programmatic dependent launch where built for it (sm_90+)
        at::Tensor row_loss =
            none ? at::Tensor()
                 : at::empty({kernels::tvd_forward_scratch<T>(in.rows, in.V, num_sms)}, f32);
        a.row_loss = none ? nullptr : row_loss.mutable_data_ptr<float>();
        a.elem_loss = none ? loss.mutable_data_ptr<float>() : nullptr;
        a.signs = save_signs ? signs.mutable_data_ptr<uint8_t>() : nullptr;
        check_cuda(
            kernels::tvd_forward<T>(a, reduction, none ? nullptr : loss.mutable_data_ptr<float>(),
                                    none ? nullptr : scale.mutable_data_ptr<float>(),
                                    at::cuda::getCurrentCUDAStream()),
            kOp, "forward");
      }),
      at::kFloat, at::kHalf, at::kBFloat16);
  return {loss, signs, scale};
}

at::Tensor tvd_backward_cuda(const at::Tensor& grad_output, const at::Tensor& signs,
                             const at::Tensor& scale, const std::optional<at::Tensor>& /*p*/,
                             const std::optional<at::Tensor>& /*q*/,
                             const std::optional<at::Tensor>& /*labels: zero signs already*/,
                             int64_t /*ignore_index*/, int64_t V, at::ScalarType dtype,
                             int64_t reduction_code) {
  const kernels::Reduction reduction = reduction_from_code(reduction_code, "lossfns._tvd_backward");
  TORCH_CHECK(signs.dim() == 2 && signs.scalar_type() == at::kByte && signs.is_contiguous() &&
                  signs.size(1) == sign_row_pitch(V) && signs.is_cuda(),
              "lossfns._tvd_backward: signs must be contiguous CUDA uint8 (rows, ",
              num(sign_row_pitch(V)), ") from _tvd_forward(save_signs=True); got ",
              signs.scalar_type(), " ", dims(signs.sizes()));
  check_backward_inputs(grad_output, scale, signs.size(0), V, reduction);
  // (An argument on another device would be read through a pointer of the wrong device.)
  TORCH_CHECK(grad_output.device() == signs.device(),
              "lossfns._tvd_backward: grad_output must be on the device of signs, ", signs.device(),
              "; got ", grad_output.device());
  TORCH_CHECK(reduction == kernels::kNone || scale.device() == signs.device(),
              "lossfns._tvd_backward: scale must be on the device of signs, ", signs.device(),
              "; got ", scale.device());
  TORCH_CHECK(signs.size(0) <= int64_t{INT32_MAX},
              "lossfns._tvd_backward: at most 2^31-1 rows on CUDA; got ", num(signs.size(0)));
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
      "lossfns._tvd_backward: on CUDA the gradient dtype must be Float, Half or BFloat16; got ",
      dtype);
  const c10::cuda::CUDAGuard guard(signs.device());
  const int64_t rows = signs.size(0);
  at::Tensor grad = at::empty({rows, V}, signs.options().dtype(dtype));
  if (rows == 0) return grad;  // nothing to launch
  // A float copy only if grad_output is not already float and contiguous (it is, from our forward).
  const at::Tensor go = grad_output.to(at::kFloat).contiguous();
  AT_DISPATCH_V2(
      dtype, "lossfns_tvd_backward_cuda", AT_WRAP([&] {
        using T = typename CudaType<scalar_t>::type;
        kernels::TvdBackwardArgs<T> a{};
        a.signs = signs.const_data_ptr<uint8_t>();
        a.rows = rows;
        a.V = V;
        a.grad_output = go.const_data_ptr<float>();
        a.scale = reduction == kernels::kNone ? nullptr : scale.const_data_ptr<float>();
        a.grad = reinterpret_cast<T*>(grad.mutable_data_ptr<scalar_t>());
        a.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
        a.pdl = true;  // may start while the kernel before it finishes, where built for it (sm_90+)
        check_cuda(kernels::tvd_backward<T>(a, reduction, at::cuda::getCurrentCUDAStream()), kOp,
                   "backward");
      }),
      at::kFloat, at::kHalf, at::kBFloat16);
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CUDA, m) {
  m.impl("_tvd_forward", &tvd_forward_cuda);
  m.impl("_tvd_backward", &tvd_backward_cuda);
}

}  // namespace lossfns::detail

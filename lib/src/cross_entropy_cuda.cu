// CUDA adapter of lossfns::cross_entropy_loss: checks inputs, maps ATen dtypes to CUDA's,
// launches the framework-free kernels (cross_entropy_cuda_kernel.cuh) on the current stream,
// checks every launch, and registers them for the CUDA dispatch key. No host-device
// synchronisation: the labels' values are not checked here (an out-of-range label makes its
// row's loss and gradient NaN: cross_entropy_common.h).
#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cross_entropy_cuda_kernel.cuh"
#include "cross_entropy_internal.h"
#include "cuda_adapter.h"

namespace lossfns::detail {
namespace {

constexpr const char* kOp = "lossfns.cross_entropy_loss";

template <typename T, typename scalar_t>
kernels::CrossEntropyArgs<T> args_of(const CrossEntropyInputs& in, int64_t ignore_index) {
  kernels::CrossEntropyArgs<T> a{};
  a.x = reinterpret_cast<const T*>(in.x.const_data_ptr<scalar_t>());
  a.stride = in.x.stride(0);
  a.width = in.width;
  a.V = in.V;
  a.rows = in.rows;
  a.labels = in.labels.const_data_ptr<int64_t>();
  a.ignore_index = ignore_index;
  a.reduction = in.reduction;
  a.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return a;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_cuda(const at::Tensor& logits,
                                                                          const at::Tensor& labels,
                                                                          int64_t ignore_index,
                                                                          int64_t reduction,
                                                                          int64_t V) {
  const CrossEntropyInputs in = check_ce_inputs(logits, labels, reduction, V, kCudaDtypes, "CUDA");
  TORCH_CHECK(in.rows <= int64_t{INT32_MAX},
              "lossfns.cross_entropy_loss: at most 2^31 - 1 rows on CUDA; got ", num(in.rows));
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto f32 = logits.options().dtype(at::kFloat);
  const bool none = reduction == kernels::kNone;
  at::Tensor stats = at::empty({in.rows, kernels::kCeStatsPerRow}, f32);
  at::Tensor row_loss = at::empty({in.rows}, f32);
  at::Tensor scale = at::empty({1}, f32);
  at::Tensor loss = none ? row_loss : at::empty({}, f32);
  if (in.rows == 0) {  // nothing to launch: as the CPU does
    scale.fill_(kernels::ce_reduction_scale<double>(in.reduction, 0));
    if (!none) loss.zero_();
    return {loss, stats, scale};
  }
  AT_DISPATCH_V2(logits.scalar_type(), "lossfns_ce_forward_cuda", AT_WRAP([&] {
                   using T = typename CudaType<scalar_t>::type;
                   auto a = args_of<T, scalar_t>(in, ignore_index);
                   a.stats = stats.mutable_data_ptr<float>();
                   a.row_loss = row_loss.mutable_data_ptr<float>();
                   a.scale = scale.mutable_data_ptr<float>();
                   a.loss = none ? nullptr : loss.mutable_data_ptr<float>();
                   check_cuda(
                       kernels::cross_entropy_forward<T>(a, at::cuda::getCurrentCUDAStream()), kOp,
                       "forward");
                 }),
                 at::kFloat, at::kHalf, at::kBFloat16);
  return {loss, stats, scale};
}

at::Tensor cross_entropy_backward_cuda(const at::Tensor& grad_output, const at::Tensor& logits,
                                       const at::Tensor& labels, const at::Tensor& stats,
                                       const at::Tensor& scale, int64_t ignore_index,
                                       int64_t reduction, int64_t V) {
  const CrossEntropyInputs in = check_ce_inputs(logits, labels, reduction, V, kCudaDtypes, "CUDA");
  check_ce_backward_inputs(in, logits, stats, at::kFloat, grad_output, reduction);
  TORCH_CHECK(scale.device() == logits.device(),
              "lossfns._cross_entropy_backward: scale must be on the device of logits, ",
              logits.device(), "; got ", scale.device());
  TORCH_CHECK(in.rows <= int64_t{INT32_MAX},
              "lossfns._cross_entropy_backward: at most 2^31 - 1 rows on CUDA; got ", num(in.rows));
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor grad =
      at::empty({in.rows, in.width}, logits.options().memory_format(at::MemoryFormat::Contiguous));
  if (in.rows == 0) return grad;
  const at::Tensor go = grad_output.reshape({-1}).to(at::kFloat).contiguous();
  const at::Tensor sc = scale.to(at::kFloat).contiguous();
  AT_DISPATCH_V2(
      logits.scalar_type(), "lossfns_ce_backward_cuda", AT_WRAP([&] {
        using T = typename CudaType<scalar_t>::type;
        auto a = args_of<T, scalar_t>(in, ignore_index);
        a.stats = const_cast<float*>(stats.const_data_ptr<float>());  // read only in backward
        a.scale = const_cast<float*>(sc.const_data_ptr<float>());
        a.grad_output = go.const_data_ptr<float>();
        a.grad = reinterpret_cast<T*>(grad.mutable_data_ptr<scalar_t>());
        check_cuda(kernels::cross_entropy_backward<T>(a, at::cuda::getCurrentCUDAStream()), kOp,
                   "backward");
      }),
      at::kFloat, at::kHalf, at::kBFloat16);
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CUDA, m) {
  m.impl("_cross_entropy_forward", &cross_entropy_forward_cuda);
  m.impl("_cross_entropy_backward", &cross_entropy_backward_cuda);
}

}  // namespace lossfns::detail

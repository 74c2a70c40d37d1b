// CUDA adapter of lossfns::distill_loss: checks inputs, maps ATen dtypes to CUDA's, launches the
// framework-free kernels (distill_cuda_kernel.cuh) on the current stream, checks every launch,
// and registers them for the CUDA dispatch key. No host-device synchronisation.
#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda_adapter.h"
#include "distill_cuda_kernel.cuh"
#include "distill_internal.h"

namespace lossfns::detail {
namespace {

constexpr const char* kOp = "lossfns.distill_loss";

template <typename T, typename scalar_t>
kernels::DistillArgs<T> args_of(const DistillInputs& in, int64_t divergence, double beta,
                                double temperature, int64_t ignore_index,
                                kernels::Reduction reduction) {
  kernels::DistillArgs<T> a{};
  a.s = reinterpret_cast<const T*>(in.s.const_data_ptr<scalar_t>());
  a.t = reinterpret_cast<const T*>(in.t.const_data_ptr<scalar_t>());
  a.s_stride = in.s.stride(0);
  a.t_stride = in.t.stride(0);
  a.ws = in.ws;
  a.wt = in.wt;
  a.V = in.V;
  a.rows = in.rows;
  a.labels = in.labels.defined() ? in.labels.const_data_ptr<int64_t>() : nullptr;
  a.ignore_index = ignore_index;
  a.divergence = divergence;
  a.beta = static_cast<float>(beta);
  a.inv_t = static_cast<float>(1.0 / temperature);
  a.reduction = reduction;
  a.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return a;
}

// The kernels' grids and row offsets are 32-bit: every entry point checks, the backward ops too
// (callable on their own, with statistics of any origin).
void check_cuda_rows(const DistillInputs& in) {
  TORCH_CHECK(in.rows <= kCudaMaxRows,
              "lossfns.distill_loss: at most 2^27 - 1 (134217727) rows per call on CUDA; got ",
              num(in.rows),
              ": call it on slices of the rows (with reduction \"sum\" or \"none\", the slices' "
              "results add up or concatenate to the whole's) or on the CPU");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> distill_forward_cuda(
    const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& labels,
    int64_t divergence, double beta, double temperature, int64_t ignore_index,
    int64_t reduction_code, int64_t V, const std::optional<at::Tensor>& grad_scale, bool save) {
  const kernels::Reduction reduction =
      reduction_from_code(reduction_code, "lossfns._distill_forward");
  const DistillInputs in =
      check_distill_inputs(s, t, labels, divergence, beta, temperature, V, kCudaDtypes, "CUDA");
  check_cuda_rows(in);
  const c10::cuda::CUDAGuard guard(s.device());
  const auto f32 = s.options().dtype(at::kFloat);
  const bool none = reduction == kernels::kNone;
  check_grad_scale(s, grad_scale);
  // The gradient in forward: asked for (grad_scale), for a reduced loss, when backward will run.
  const bool grad_now = save && grad_scale.has_value() && grad_scale->defined() && !none;
  at::Tensor gs;
  if (grad_now) gs = grad_scale->to(at::kFloat).contiguous();
  at::Tensor stats = at::empty({in.rows, kernels::kStatsPerRow}, f32);
  at::Tensor scale = at::empty({1}, f32);
  at::Tensor loss = none ? at::empty({in.rows}, f32) : at::empty({}, f32);
  at::Tensor grad = at::empty({grad_now ? in.rows : 0, in.ws},
                              s.options().memory_format(at::MemoryFormat::Contiguous));
  if (in.rows == 0) {  // nothing to launch: as the CPU does
    scale.fill_(kernels::distill_reduction_scale<double>(reduction, 0, in.V));
    if (!none) loss.zero_();
    return {loss, stats, scale, grad};
  }
  AT_DISPATCH_V2(
      s.scalar_type(), "lossfns_distill_forward_cuda", AT_WRAP([&] {
        using T = typename CudaType<scalar_t>::type;
        auto a = args_of<T, scalar_t>(in, divergence, beta, temperature, ignore_index, reduction);
        a.stats = stats.mutable_data_ptr<float>();
        a.scale = scale.mutable_data_ptr<float>();
        a.loss = loss.mutable_data_ptr<float>();
        a.grad = grad_now ? reinterpret_cast<T*>(grad.mutable_data_ptr<scalar_t>()) : nullptr;
        a.grad_scale = grad_now ? gs.const_data_ptr<float>() : nullptr;
        check_cuda(kernels::distill_forward<T>(a, at::cuda::getCurrentCUDAStream()), kOp,
                   "forward");
      }),
      at::kFloat, at::kHalf, at::kBFloat16);
  return {loss, stats, scale, grad};
}

at::Tensor distill_backward_cuda(const at::Tensor& grad_output, const at::Tensor& s,
                                 const at::Tensor& t, const std::optional<at::Tensor>& labels,
                                 const at::Tensor& stats, const at::Tensor& scale,
                                 int64_t divergence, double beta, double temperature,
                                 int64_t ignore_index, int64_t reduction_code, int64_t V) {
  const kernels::Reduction reduction =
      reduction_from_code(reduction_code, "lossfns._distill_backward");
  const DistillInputs in =
      check_distill_inputs(s, t, labels, divergence, beta, temperature, V, kCudaDtypes, "CUDA");
  check_distill_backward(in, stats, at::kFloat, grad_output, reduction);
  TORCH_CHECK(scale.device() == s.device(),
              "lossfns._distill_backward: scale must be on the device of student_logits, ",
              s.device(), "; got ", scale.device());
  check_cuda_rows(in);
  const c10::cuda::CUDAGuard guard(s.device());
  at::Tensor grad =
      at::empty({in.rows, in.ws}, s.options().memory_format(at::MemoryFormat::Contiguous));
  if (in.rows == 0) return grad;
  const at::Tensor go = grad_output.reshape({-1}).to(at::kFloat).contiguous();
  const at::Tensor sc = scale.to(at::kFloat).contiguous();
  AT_DISPATCH_V2(
      s.scalar_type(), "lossfns_distill_backward_cuda", AT_WRAP([&] {
        using T = typename CudaType<scalar_t>::type;
        auto a = args_of<T, scalar_t>(in, divergence, beta, temperature, ignore_index, reduction);
        a.stats = const_cast<float*>(stats.const_data_ptr<float>());  // read only in backward
        a.scale = const_cast<float*>(sc.const_data_ptr<float>());
        a.grad_output = go.const_data_ptr<float>();
        a.grad = reinterpret_cast<T*>(grad.mutable_data_ptr<scalar_t>());
        check_cuda(kernels::distill_backward<T>(a, at::cuda::getCurrentCUDAStream()), kOp,
                   "backward");
      }),
      at::kFloat, at::kHalf, at::kBFloat16);
  return grad;
}

// _distill_ce_grad_: the weighted divergence's and cross-entropy's gradients in one pass, into
// `grad` (which may be `s` itself). The arguments are checked by check_distill_ce_grad.
void distill_ce_grad_cuda(at::Tensor& grad, const at::Tensor& s, const at::Tensor& t,
                          const std::optional<at::Tensor>& labels, const at::Tensor& stats,
                          const at::Tensor& kd_weight, const std::optional<at::Tensor>& ce_weight,
                          const std::optional<at::Tensor>& ce_stats, int64_t divergence,
                          double beta, double temperature, int64_t ignore_index, int64_t V) {
  const DistillInputs in =
      check_distill_inputs(s, t, labels, divergence, beta, temperature, V, kCudaDtypes, "CUDA");
  check_distill_ce_grad(in, grad, stats, at::kFloat, kd_weight, ce_weight, ce_stats);
  check_cuda_rows(in);
  if (in.rows == 0) return;
  const c10::cuda::CUDAGuard guard(s.device());
  const at::Tensor kw = kd_weight.reshape({-1}).to(at::kFloat).contiguous();
  const bool ce = ce_weight.has_value() && ce_weight->defined();
  const at::Tensor cw = ce ? ce_weight->reshape({-1}).to(at::kFloat).contiguous() : at::Tensor();
  AT_DISPATCH_V2(s.scalar_type(), "lossfns_distill_ce_grad_cuda", AT_WRAP([&] {
                   using T = typename CudaType<scalar_t>::type;
                   auto a = args_of<T, scalar_t>(in, divergence, beta, temperature, ignore_index,
                                                 kernels::kNone);
                   a.stats =
                       const_cast<float*>(stats.const_data_ptr<float>());  // read only in backward
                   a.grad_output = kw.const_data_ptr<float>();
                   a.grad = reinterpret_cast<T*>(grad.mutable_data_ptr<scalar_t>());
                   if (ce) {
                     a.ce_weight = cw.const_data_ptr<float>();
                     a.ce_stats = ce_stats->const_data_ptr<float>();
                     a.ce_stats_stride = ce_stats->stride(0);
                   }
                   check_cuda(kernels::distill_backward<T>(a, at::cuda::getCurrentCUDAStream()),
                              kOp, "backward");
                 }),
                 at::kFloat, at::kHalf, at::kBFloat16);
}

void distill_rescale_grad_cuda(at::Tensor& grad, const at::Tensor& grad_output,
                               const at::Tensor& grad_scale) {
  TORCH_CHECK(grad.is_contiguous() && grad_output.numel() == 1 && grad_scale.numel() == 1,
              "lossfns._distill_rescale_grad_: a contiguous gradient and 1-element grad_output and "
              "grad_scale");
  TORCH_CHECK(grad_output.device() == grad.device(),
              "lossfns._distill_rescale_grad_: grad_output must be on the device of grad, ",
              grad.device(), "; got ", grad_output.device());
  TORCH_CHECK(grad_scale.device() == grad.device(),
              "lossfns._distill_rescale_grad_: grad_scale must be on the device of grad, ",
              grad.device(), "; got ", grad_scale.device());
  if (grad.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(grad.device());
  const at::Tensor go = grad_output.to(at::kFloat).contiguous(),
                   gs = grad_scale.to(at::kFloat).contiguous();
  AT_DISPATCH_V2(grad.scalar_type(), "lossfns_distill_rescale_cuda", AT_WRAP([&] {
                   using T = typename CudaType<scalar_t>::type;
                   check_cuda(
                       kernels::distill_rescale<T>(
                           reinterpret_cast<T*>(grad.mutable_data_ptr<scalar_t>()), grad.numel(),
                           go.const_data_ptr<float>(), gs.const_data_ptr<float>(),
                           at::cuda::getCurrentDeviceProperties()->multiProcessorCount,
                           at::cuda::getCurrentCUDAStream()),
                       kOp, "rescale");
                 }),
                 at::kFloat, at::kHalf, at::kBFloat16);
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CUDA, m) {
  m.impl("_distill_forward", &distill_forward_cuda);
  m.impl("_distill_backward", &distill_backward_cuda);
  m.impl("_distill_rescale_grad_", &distill_rescale_grad_cuda);
  m.impl("_distill_ce_grad_", &distill_ce_grad_cuda);
}

}  // namespace lossfns::detail

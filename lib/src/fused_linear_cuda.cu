// CUDA adapter of lossfns::_scale_cast (the fused linear loss's backward: its float32 lm_head
// gradient times grad_output, rounded once to the lm_head's dtype): checks the inputs, launches
// the framework-free kernel (scale_cast_cuda_kernel.cuh) on the current stream and registers it
// for the CUDA dispatch key. No host-device synchronisation.
#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "common.h"
#include "cuda_adapter.h"
#include "scale_cast_cuda_kernel.cuh"

namespace lossfns::detail {
namespace {

at::Tensor scale_cast_cuda(const at::Tensor& src, const at::Tensor& scale, at::ScalarType dtype) {
  constexpr const char* op = "lossfns._scale_cast";
  TORCH_CHECK(src.scalar_type() == at::kFloat, op, ": src must be float32 on CUDA; got ",
              src.scalar_type());
  TORCH_CHECK(scale.numel() == 1 && scale.device() == src.device(), op,
              ": scale must be a 1-element tensor on src's device ", src.device(), "; got ",
              dims(scale.sizes()), " on ", scale.device());
  TORCH_CHECK(std::find(kCudaDtypes.begin(), kCudaDtypes.end(), dtype) != kCudaDtypes.end(), op,
              ": dtype must be one of ", dtype_list(kCudaDtypes), " on CUDA; got ", dtype);
  const c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor x = src.contiguous();
  const at::Tensor f = scale.reshape({1}).to(at::kFloat).contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(dtype));
  AT_DISPATCH_V2(dtype, "lossfns_scale_cast_cuda", AT_WRAP([&] {
                   using T = typename CudaType<scalar_t>::type;
                   check_cuda(kernels::scale_cast<T>(
                                  x.const_data_ptr<float>(),
                                  reinterpret_cast<T*>(out.mutable_data_ptr<scalar_t>()), x.numel(),
                                  f.const_data_ptr<float>(),
                                  at::cuda::getCurrentDeviceProperties()->multiProcessorCount,
                                  at::cuda::getCurrentCUDAStream()),
                              op, "scale_cast");
                 }),
                 at::kFloat, at::kHalf, at::kBFloat16);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lossfns, CUDA, m) { m.impl("_scale_cast", &scale_cast_cuda); }

}  // namespace lossfns::detail

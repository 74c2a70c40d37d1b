// Torch adapter of the RoPE kernel (rope_kernel.cuh): checks, allocates, launches on the current
// stream, checks the launch.
#include "rope_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "rope_kernel.cuh"

namespace distill::cuda {

at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4 && x.is_contiguous() && x.size(3) % 2 == 0,
              "Rope (CUDA): x must be a contiguous (B, T, H, D) CUDA tensor with D even, got ",
              x.sizes(), " on ", x.device());
  const int64_t T = x.size(1), D = x.size(3);
  for (const at::Tensor* table : {&cos, &sin}) {
    TORCH_CHECK(table->device() == x.device() && table->scalar_type() == at::kFloat &&
                    table->is_contiguous() && table->dim() == 2 && table->size(0) == T &&
                    table->size(1) == D,
                "Rope (CUDA): cos and sin must be contiguous float32 (", T, ", ", D, ") on ",
                x.device(), ", got ", table->scalar_type(), " ", table->sizes(), " on ",
                table->device());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaError_t err = cudaSuccess;
  switch (x.scalar_type()) {
    case at::kFloat:
      err =
          kernels::LaunchRope(x.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                              out.data_ptr<float>(), rows, x.size(2), T, D, backward, sms, stream);
      break;
    case at::kBFloat16:
      err = kernels::LaunchRope(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()),
                                cos.data_ptr<float>(), sin.data_ptr<float>(),
                                reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), rows, x.size(2),
                                T, D, backward, sms, stream);
      break;
    case at::kHalf:
      err =
          kernels::LaunchRope(reinterpret_cast<const __half*>(x.data_ptr()), cos.data_ptr<float>(),
                              sin.data_ptr<float>(), reinterpret_cast<__half*>(out.data_ptr()),
                              rows, x.size(2), T, D, backward, sms, stream);
      break;
    default:
      TORCH_CHECK(false, "Rope (CUDA): x must be float32, bfloat16 or float16, got ",
                  x.scalar_type());
  }
  TORCH_CHECK(err == cudaSuccess, "Rope (CUDA): launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace distill::cuda

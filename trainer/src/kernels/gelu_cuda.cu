// Torch adapter of the GELU kernels (gelu_kernel.cuh): checks, allocates, launches on the current
// stream, checks the launch.
#include "gelu_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dispatch.h"
#include "gelu_kernel.cuh"

namespace distill::cuda {
namespace {

void CheckInput(const at::Tensor& u) {
  TORCH_CHECK(u.is_cuda() && u.is_contiguous() && u.dim() >= 1,
              "Gelu (CUDA): the input must be a contiguous CUDA tensor of at least 1 dimension, "
              "got ",
              u.scalar_type(), " ", u.sizes(), " on ", u.device(),
              u.is_contiguous() ? "" : ", not contiguous");
}

void CheckLike(const at::Tensor& t, const at::Tensor& u, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.device() == u.device() &&
                  t.scalar_type() == u.scalar_type() && t.sizes() == u.sizes(),
              "Gelu (CUDA): ", name, " must be a contiguous CUDA ", u.scalar_type(),
              " tensor of shape ", u.sizes(), " on ", u.device(), " (as the input), got ",
              t.scalar_type(), " ", t.sizes(), " on ", t.device(),
              t.is_contiguous() ? "" : ", not contiguous");
}

}  // namespace

at::Tensor Gelu(const at::Tensor& u, bool tanh) {
  CheckInput(u);
  const c10::cuda::CUDAGuard guard(u.device());
  at::Tensor a = at::empty_like(u);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = WithKernelType(u.scalar_type(), "Gelu", "the input", [&](auto tag) {
    using T = decltype(tag);
    return kernels::LaunchGeluForward(reinterpret_cast<const T*>(u.const_data_ptr()),
                                      reinterpret_cast<T*>(a.mutable_data_ptr()), u.numel(), tanh,
                                      sms, stream);
  });
  TORCH_CHECK(err == cudaSuccess, "Gelu (CUDA): launch failed: ", cudaGetErrorString(err));
  return a;
}

std::pair<at::Tensor, at::Tensor> GeluBackwardWithColumnSum(const at::Tensor& grad,
                                                            const at::Tensor& u, bool tanh) {
  CheckInput(u);
  CheckLike(grad, u, "the output's gradient");
  const c10::cuda::CUDAGuard guard(u.device());
  const int64_t n = u.size(-1), rows = n == 0 ? 0 : u.numel() / n;
  at::Tensor du = at::empty_like(u);
  at::Tensor sums = at::empty({n}, u.options().dtype(at::kFloat));
  if (n == 0) return {du, sums};
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = WithKernelType(u.scalar_type(), "Gelu", "the input", [&](auto tag) {
    using T = decltype(tag);
    // The row splits ColumnSum would take for du (col_sum_cuda.cu): they alone set the order of
    // the sums (a column's sum is in the same order on the vector and the scalar path).
    const bool du_vec =
        kernels::Aligned16(du.const_data_ptr()) && n % (16 / static_cast<int64_t>(sizeof(T))) == 0;
    const bool vec = du_vec && kernels::Aligned16(grad.const_data_ptr()) &&
                     kernels::Aligned16(u.const_data_ptr());
    const int64_t splits = kernels::ColumnSumSplits<T>(rows, n, sms, du_vec);
    at::Tensor partial = at::empty({splits, n}, sums.options());
    return kernels::LaunchGeluBackwardColumnSum(
        reinterpret_cast<const T*>(grad.const_data_ptr()),
        reinterpret_cast<const T*>(u.const_data_ptr()), reinterpret_cast<T*>(du.mutable_data_ptr()),
        partial.mutable_data_ptr<float>(), sums.mutable_data_ptr<float>(), rows, n, splits, vec,
        tanh, stream);
  });
  TORCH_CHECK(err == cudaSuccess, "Gelu (CUDA): launch failed: ", cudaGetErrorString(err));
  return {du, sums};
}

}  // namespace distill::cuda

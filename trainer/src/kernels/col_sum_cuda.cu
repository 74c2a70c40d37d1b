// Torch adapter of the column sums (col_sum_kernel.cuh): checks, allocates, launches on the current
// stream, checks the launch.
#include "col_sum_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "col_sum_kernel.cuh"
#include "dispatch.h"

namespace distill::cuda {

at::Tensor ColumnSum(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(),
              "ColumnSum (CUDA): x must be a contiguous 2-d CUDA tensor, got ", x.sizes(), " on ",
              x.device(), x.is_contiguous() ? "" : ", not contiguous");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({n}, x.options().dtype(at::kFloat));
  if (n == 0) return out;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = WithKernelType(x.scalar_type(), "ColumnSum", "x", [&](auto tag) {
    using T = decltype(tag);
    const bool vec =
        kernels::Aligned16(x.const_data_ptr()) && n % (16 / static_cast<int64_t>(sizeof(T))) == 0;
    const int64_t splits = kernels::ColumnSumSplits<T>(rows, n, sms, vec);
    at::Tensor partial = at::empty({splits, n}, out.options());
    return kernels::LaunchColumnSum(reinterpret_cast<const T*>(x.const_data_ptr()),
                                    partial.mutable_data_ptr<float>(),
                                    out.mutable_data_ptr<float>(), rows, n, splits, vec, stream);
  });
  TORCH_CHECK(err == cudaSuccess, "ColumnSum (CUDA): launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace distill::cuda

// Host-side glue every CUDA adapter of liblossfns shares (tvd_cuda.cu, distill_cuda.cu,
// cross_entropy_cuda.cu): the dtypes the kernels take, ATen's scalar types mapped to the CUDA
// storage types the kernels are written for, and the check of a kernel launch's status.
// The device-side counterpart is cuda_common.cuh. Not installed.
#pragma once

#include <initializer_list>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace lossfns::detail {

inline constexpr std::initializer_list<at::ScalarType> kCudaDtypes = {at::kFloat, at::kHalf,
                                                                      at::kBFloat16};

// at::Half -> __half, at::BFloat16 -> __nv_bfloat16, float -> float.
template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<at::Half> {
  using type = __half;
};
template <>
struct CudaType<at::BFloat16> {
  using type = __nv_bfloat16;
};

// A kernel launcher's status: an error names the op ("lossfns.tvd_loss") and the step.
inline void check_cuda(cudaError_t err, const char* op, const char* what) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA ", what, " failed: ", cudaGetErrorString(err));
}

}  // namespace lossfns::detail

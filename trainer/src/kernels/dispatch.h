// The model kernels' dtype dispatch, shared by their Torch adapters (*_cuda.cu): calls f with a
// value of the kernels' storage type for t (float, __nv_bfloat16, __half) and returns what f
// returns; any other dtype is an error naming the op and the operand. Built only with CUDA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

namespace distill::cuda {

template <typename F>
decltype(auto) WithKernelType(at::ScalarType t, const char* op, const char* what, F&& f) {
  switch (t) {
    case at::kFloat:
      return f(float{});
    case at::kBFloat16:
      return f(__nv_bfloat16{});
    case at::kHalf:
      return f(__half{});
    default:
      TORCH_CHECK(false, op, " (CUDA): ", what, " must be float32, bfloat16 or float16, got ", t);
  }
}

}  // namespace distill::cuda

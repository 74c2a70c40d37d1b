// Torch adapter of the SwiGLU kernels (swiglu_kernel.cuh): checks, allocates, launches on the
// current stream, checks the launch.
#include "swiglu_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dispatch.h"
#include "swiglu_kernel.cuh"

namespace distill::cuda {
namespace {

void CheckLike(const at::Tensor& t, const at::Tensor& gate, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.device() == gate.device() &&
                  t.scalar_type() == gate.scalar_type() && t.sizes() == gate.sizes(),
              "SwiGlu (CUDA): ", name, " must be a contiguous ", gate.scalar_type(), " tensor of ",
              "shape ", gate.sizes(), " on ", gate.device(), " (as gate), got ", t.scalar_type(),
              " ", t.sizes(), " on ", t.device(), t.is_contiguous() ? "" : ", not contiguous");
}

template <typename T>
const T* In(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.data_ptr());
}
template <typename T>
T* Out(at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

}  // namespace

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  CheckLike(gate, gate, "gate");
  CheckLike(up, gate, "up");
  const c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor out = at::empty_like(gate);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = WithKernelType(gate.scalar_type(), "SwiGlu", "gate", [&](auto tag) {
    using T = decltype(tag);
    return kernels::LaunchSwiGluForward(In<T>(gate), In<T>(up), Out<T>(out), gate.numel(), sms,
                                        stream);
  });
  TORCH_CHECK(err == cudaSuccess, "SwiGlu (CUDA): launch failed: ", cudaGetErrorString(err));
  return out;
}

std::pair<at::Tensor, at::Tensor> SwiGluBackward(const at::Tensor& grad, const at::Tensor& gate,
                                                 const at::Tensor& up) {
  CheckLike(gate, gate, "gate");
  CheckLike(up, gate, "up");
  CheckLike(grad, gate, "the output's gradient");
  const c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor grad_gate = at::empty_like(gate), grad_up = at::empty_like(up);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = WithKernelType(gate.scalar_type(), "SwiGlu", "gate", [&](auto tag) {
    using T = decltype(tag);
    return kernels::LaunchSwiGluBackward(In<T>(grad), In<T>(gate), In<T>(up), Out<T>(grad_gate),
                                         Out<T>(grad_up), gate.numel(), sms, stream);
  });
  TORCH_CHECK(err == cudaSuccess, "SwiGlu (CUDA): launch failed: ", cudaGetErrorString(err));
  return {grad_gate, grad_up};
}

}  // namespace distill::cuda

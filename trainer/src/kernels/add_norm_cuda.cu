// Torch adapter of the AddNorm kernels (add_norm_kernel.cuh): allocates, picks the template
// instance for the dtypes and the row width, launches on the current stream, checks the launch.
#include "add_norm_cuda.h"

#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "add_norm_kernel.cuh"
#include "col_sum_cuda.h"
#include "dispatch.h"

namespace distill::cuda {
namespace {

using kernels::kAddNormThreads;

// AddNorm's dtypes: WithKernelType (dispatch.h) named for this op.
template <typename F>
void WithType(at::ScalarType t, const char* what, F&& f) {
  WithKernelType(t, "AddNorm", what, std::forward<F>(f));
}

// kPer, the values per thread: the smallest power of two with kThreads * kPer >= D.
template <typename F>
void WithPer(int64_t D, F&& f) {
  TORCH_CHECK(D >= 1 && D <= kAddNormThreads * kernels::kAddNormMaxPer,
              "AddNorm (CUDA): rows of 1 to ", kAddNormThreads * kernels::kAddNormMaxPer,
              " elements, got ", D);
  if (D <= kAddNormThreads) return f(std::integral_constant<int, 1>{});
  if (D <= 2 * kAddNormThreads) return f(std::integral_constant<int, 2>{});
  if (D <= 4 * kAddNormThreads) return f(std::integral_constant<int, 4>{});
  if (D <= 8 * kAddNormThreads) return f(std::integral_constant<int, 8>{});
  if (D <= 16 * kAddNormThreads) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 32>{});
}

void CheckLaunch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "AddNorm (CUDA): ", what,
              " launch failed: ", cudaGetErrorString(err));
}

}  // namespace

bool Supported(int64_t D) { return D >= 1 && D <= kAddNormThreads * kernels::kAddNormMaxPer; }

AddNormForwardResult AddNormForward(const at::Tensor& x, const at::Tensor& y,
                                    const at::Tensor& weight, const at::Tensor& bias, double eps,
                                    bool rms, at::ScalarType out_dtype) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t D = x.size(-1), rows = x.numel() / D;
  AddNormForwardResult r;
  r.h = at::empty_like(x);
  r.out = at::empty(x.sizes(), x.options().dtype(out_dtype));
  r.mean = at::empty({rows}, x.options());
  r.rstd = at::empty({rows}, x.options());
  if (rows == 0) return r;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  WithType(y.scalar_type(), "y", [&](auto ty) {
    WithType(out_dtype, "the output", [&](auto to) {
      WithPer(D, [&](auto per) {
        using TY = decltype(ty);
        using TO = decltype(to);
        auto launch = [&](auto kernel) {
          kernel<<<static_cast<unsigned>(rows), kAddNormThreads, 0, stream>>>(
              x.const_data_ptr<float>(), reinterpret_cast<const TY*>(y.const_data_ptr()),
              weight.const_data_ptr<float>(),
              bias.defined() ? bias.const_data_ptr<float>() : nullptr,
              r.h.mutable_data_ptr<float>(), reinterpret_cast<TO*>(r.out.mutable_data_ptr()),
              r.mean.mutable_data_ptr<float>(), r.rstd.mutable_data_ptr<float>(), D,
              static_cast<float>(eps));
        };
        if (rms) {
          launch(kernels::AddNormForwardKernel<TY, TO, true, decltype(per)::value>);
        } else {
          launch(kernels::AddNormForwardKernel<TY, TO, false, decltype(per)::value>);
        }
      });
    });
  });
  CheckLaunch("forward");
  return r;
}

AddNormBackwardResult AddNormBackward(const at::Tensor& grad_out, const at::Tensor& grad_h,
                                      const at::Tensor& h, const at::Tensor& weight,
                                      const at::Tensor& mean, const at::Tensor& rstd, bool rms,
                                      at::ScalarType y_dtype, bool need_bias_grad) {
  const c10::cuda::CUDAGuard guard(h.device());
  const int64_t D = h.size(-1), rows = h.numel() / D;
  AddNormBackwardResult r;
  // A fresh buffer, not grad_h's: autograd may hand the same gradient tensor to other functions.
  r.grad_x = at::empty_like(h);
  r.grad_y = y_dtype == at::kFloat ? r.grad_x : at::empty(h.sizes(), h.options().dtype(y_dtype));
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(rows, 8 * sms));
  at::Tensor dw = at::empty({blocks, D}, h.options()), db = at::empty({blocks, D}, h.options());
  if (rows > 0) {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    WithType(y_dtype, "y", [&](auto ty) {
      WithType(grad_out.scalar_type(), "the output gradient", [&](auto to) {
        WithPer(D, [&](auto per) {
          using TY = decltype(ty);
          using TO = decltype(to);
          auto launch = [&](auto kernel) {
            kernel<<<static_cast<unsigned>(blocks), kAddNormThreads, 0, stream>>>(
                reinterpret_cast<const TO*>(grad_out.const_data_ptr()),
                grad_h.defined() ? grad_h.const_data_ptr<float>() : nullptr,
                h.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
                r.grad_x.mutable_data_ptr<float>(),
                y_dtype == at::kFloat ? nullptr
                                      : reinterpret_cast<TY*>(r.grad_y.mutable_data_ptr()),
                dw.mutable_data_ptr<float>(), db.mutable_data_ptr<float>(), rows, D);
          };
          constexpr int kPer = decltype(per)::value;
          if constexpr (kPer == 4) {
            // Vectors of 4 columns where every row starts on a vector's boundary (rows of 513 to
            // 1024 values; measured there. At kPer = 8 ptxas spills the RMS instances.)
            const auto aligned = [](const void* p, size_t bytes) {
              return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
            };
            const bool vec = D % 4 == 0 && aligned(grad_out.const_data_ptr(), 4 * sizeof(TO)) &&
                             aligned(grad_h.defined() ? grad_h.const_data_ptr() : nullptr, 16) &&
                             aligned(h.const_data_ptr(), 16) &&
                             aligned(weight.const_data_ptr(), 16) &&
                             aligned(r.grad_x.const_data_ptr(), 16) &&
                             aligned(r.grad_y.const_data_ptr(), 4 * sizeof(TY));
            if (vec) {
              if (rms) {
                launch(kernels::AddNormBackwardKernel<TY, TO, true, kPer, 4>);
              } else {
                launch(kernels::AddNormBackwardKernel<TY, TO, false, kPer, 4>);
              }
              return;
            }
          }
          if (rms) {
            launch(kernels::AddNormBackwardKernel<TY, TO, true, kPer>);
          } else {
            launch(kernels::AddNormBackwardKernel<TY, TO, false, kPer>);
          }
        });
      });
    });
    CheckLaunch("backward");
  } else {
    dw.zero_();
    db.zero_();
  }
  // The blocks' partial column sums summed (ColumnSum: ATen's sum over dim 0 of these
  // (8 x SMs, D) partials took ~10 us a call, a third of some steps' norm backward).
  r.grad_weight = ColumnSum(dw);
  if (need_bias_grad) r.grad_bias = ColumnSum(db);
  return r;
}

}  // namespace distill::cuda

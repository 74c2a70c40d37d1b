// Internal glue between the TVD op's layers: input validation shared by the CPU and CUDA
// adapters, and typed handles to the internal dispatcher ops. Not installed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "common.h"

namespace lossfns::detail {

// Inputs as every kernel wants them: (rows, V) views with unit stride inside a row, and labels
// (rows,) contiguous int64 (undefined when absent).
struct FlatInputs {
  at::Tensor p, q, labels;
  int64_t rows = 0;
  int64_t V = 0;
};

// TORCH_CHECKs shape, dtype, device and label agreement (messages name what was expected and what
// was passed); `supported` lists the dtypes of the calling backend, `backend` names it.
FlatInputs check_and_flatten(const at::Tensor& p, const at::Tensor& q,
                             const std::optional<at::Tensor>& labels,
                             std::initializer_list<at::ScalarType> supported, const char* backend);

// Checks of _tvd_backward's grad_output and scale (they come from our own forward unless someone
// calls the internal op directly); rows: the forward's row count.
void check_backward_inputs(const at::Tensor& grad_output, const at::Tensor& scale, int64_t rows,
                           int64_t V, kernels::Reduction reduction);

// The internal ops, through the dispatcher (so CPU/CUDA kernels are picked by device).
std::tuple<at::Tensor, at::Tensor, at::Tensor> tvd_forward_op(
    const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& labels,
    int64_t ignore_index, int64_t reduction, bool save_signs);
// signs: from a CUDA forward (packed signs, tvd_common.h); p, q, labels: what a CPU forward (which
// saves no signs and recomputes them) needs. Each backend reads only its own.
at::Tensor tvd_backward_op(const at::Tensor& grad_output, const at::Tensor& signs,
                           const at::Tensor& scale, const std::optional<at::Tensor>& p,
                           const std::optional<at::Tensor>& q,
                           const std::optional<at::Tensor>& labels, int64_t ignore_index,
                           c10::SymInt V, at::ScalarType dtype, int64_t reduction);

}  // namespace lossfns::detail

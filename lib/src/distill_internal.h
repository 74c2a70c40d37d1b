// Internal glue of lossfns::distill_loss between its layers: the input checks both adapters run,
// and typed handles to the internal dispatcher ops. Not installed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "common.h"

namespace lossfns::detail {

// The logits as every kernel wants them: (rows, width) views with unit stride inside a row,
// labels (rows,) contiguous int64 (undefined when absent), and V: the columns that count
// (min(vocab_size, max(ws, wt))).
struct DistillInputs {
  at::Tensor s, t, labels;
  int64_t rows = 0, ws = 0, wt = 0, V = 0;
};

// The public arguments of the divergence ops in kernel form: the divergence code (JSD at beta 0 /
// 1 is forward / reverse KL, as TRL and Liger define it), the reduction code and V, the columns
// that count (min(vocab_size, width), width: the wider vocabulary). TORCH_CHECKs the names, beta
// and vocab_size; `op` names the caller in the errors.
struct Resolved {
  int64_t divergence, reduction, V;
};
Resolved resolve_distill_args(const char* op, std::string_view divergence, double beta,
                              std::string_view reduction, std::optional<int64_t> vocab_size,
                              int64_t width);

// TORCH_CHECKs that the temperature is usable by the kernels (> 0, finite with its inverse in
// float32).
void check_temperature(const char* op, double temperature);

// TORCH_CHECKs shapes, dtypes, devices, labels and the scalar options (messages name what was
// expected and what was passed); `supported` lists the calling backend's dtypes.
DistillInputs check_distill_inputs(const at::Tensor& s, const at::Tensor& t,
                                   const std::optional<at::Tensor>& labels, int64_t divergence,
                                   double beta, double temperature, int64_t V,
                                   std::initializer_list<at::ScalarType> supported,
                                   const char* backend);

// Checks of _distill_backward's own inputs (they come from our forward unless someone calls the
// internal op directly): stats, the (rows, kStatsPerRow) `stats_dtype` tensor _distill_forward
// returned on the logits' device, and grad_output, one value per row for 'none', else one.
void check_distill_backward(const DistillInputs& in, const at::Tensor& stats,
                            at::ScalarType stats_dtype, const at::Tensor& grad_output,
                            kernels::Reduction reduction);

// Output shape of a 'none' loss: the logits' shape without V.
std::vector<int64_t> row_shape(const at::Tensor& logits);

// The internal ops (lossfns::_distill_forward / _distill_backward / _distill_rescale_grad_),
// through the dispatcher so that the device picks the kernels.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> distill_forward_op(
    const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& labels,
    int64_t divergence, double beta, double temperature, int64_t ignore_index, int64_t reduction,
    int64_t V, const std::optional<at::Tensor>& grad_scale, bool save);
at::Tensor distill_backward_op(const at::Tensor& grad_output, const at::Tensor& s,
                               const at::Tensor& t, const std::optional<at::Tensor>& labels,
                               const at::Tensor& stats, const at::Tensor& scale, int64_t divergence,
                               double beta, double temperature, int64_t ignore_index,
                               int64_t reduction, int64_t V);
void distill_rescale_grad_op(at::Tensor& grad, const at::Tensor& grad_output,
                             const at::Tensor& grad_scale);

}  // namespace lossfns::detail

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

// The most rows one CUDA call of the distillation kernels takes, 2^27 - 1: their grids and row
// offsets are 32-bit (16 slots per row). Checked at every CUDA entry point (check_cuda_rows);
// the fused op's chunks stay within it.
inline constexpr int64_t kCudaMaxRows = int64_t{INT32_MAX} / 16;

// The public arguments of the divergence ops in kernel form: the divergence code (JSD at beta 0 /
// 1 is forward / reverse KL, as TRL and Liger define it), the reduction code and V, the columns
// that count (min(vocab_size, width), width: the wider vocabulary). TORCH_CHECKs the names, beta
// and vocab_size; `op` names the caller in the errors.
struct Resolved {
  int64_t divergence, reduction;
  c10::SymInt V;  // symbolic where the width is (torch.compile's dynamic shapes)
};
Resolved resolve_distill_args(const char* op, std::string_view divergence, double beta,
                              std::string_view reduction, std::optional<int64_t> vocab_size,
                              const c10::SymInt& width);

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

// TORCH_CHECKs a given grad_scale (the promised grad_output): one floating-point value on the
// logits' device. Checked on every backend, also where it is not used (the CPU recomputes the
// gradient in backward), so that a call that works on one device works on the other.
void check_grad_scale(const at::Tensor& s, const std::optional<at::Tensor>& grad_scale);

// Checks of _distill_backward's own inputs (they come from our forward unless someone calls the
// internal op directly): stats, the (rows, kStatsPerRow) `stats_dtype` tensor _distill_forward
// returned on the logits' device, and grad_output, one value per row for 'none', else one.
void check_distill_backward(const DistillInputs& in, const at::Tensor& stats,
                            at::ScalarType stats_dtype, const at::Tensor& grad_output,
                            kernels::Reduction reduction);

// Checks of _distill_ce_grad_'s inputs: grad (rows, ws) contiguous in the logits' dtype (it may
// be the student's logits), the forward's stats, kd_weight one value per row, and when ce_weight
// is given (one value per row) labels and ce_stats, (rows, >= 2) `stats_dtype` with unit column
// stride.
void check_distill_ce_grad(const DistillInputs& in, const at::Tensor& grad, const at::Tensor& stats,
                           at::ScalarType stats_dtype, const at::Tensor& kd_weight,
                           const std::optional<at::Tensor>& ce_weight,
                           const std::optional<at::Tensor>& ce_stats);

// Output shape of a 'none' loss: the logits' shape without V (symbolic under torch.compile's
// dynamic shapes, where reading sizes() would make the row count a constant of the graph).
c10::SymIntArrayRef row_shape(const at::Tensor& logits);

// The internal ops (lossfns::_distill_forward / _distill_backward / _distill_rescale_grad_ /
// _distill_ce_grad_),
// through the dispatcher so that the device picks the kernels.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> distill_forward_op(
    const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& labels,
    int64_t divergence, double beta, double temperature, int64_t ignore_index, int64_t reduction,
    c10::SymInt V, const std::optional<at::Tensor>& grad_scale, bool save);
at::Tensor distill_backward_op(const at::Tensor& grad_output, const at::Tensor& s,
                               const at::Tensor& t, const std::optional<at::Tensor>& labels,
                               const at::Tensor& stats, const at::Tensor& scale, int64_t divergence,
                               double beta, double temperature, int64_t ignore_index,
                               int64_t reduction, c10::SymInt V);
void distill_rescale_grad_op(at::Tensor& grad, const at::Tensor& grad_output,
                             const at::Tensor& grad_scale);
// lossfns::_distill_ce_grad_: into `grad` (which may be `s` itself: in place), for each row r
// that is not ignored, kd_weight[r] times the divergence's gradient ('none' reduction: the
// backward of distill_loss with grad_output kd_weight) plus, with ce_weight, ce_weight[r] *
// (softmax(s)_j - [j == labels[r]]) over the student's columns [0, min(ws, V)) (a hard-label
// cross-entropy at temperature 1; ce_stats: its max and log-sum per row, in the units of the
// device's kernels, e.g. the first two columns of a temperature-1 distill forward's stats; a row
// with ce_weight 0 gets no cross-entropy term). CUDA: one pass over the logits; elsewhere the
// composite of the two backward ops.
void distill_ce_grad_op(at::Tensor& grad, const at::Tensor& s, const at::Tensor& t,
                        const std::optional<at::Tensor>& labels, const at::Tensor& stats,
                        const at::Tensor& kd_weight, const std::optional<at::Tensor>& ce_weight,
                        const std::optional<at::Tensor>& ce_stats, int64_t divergence, double beta,
                        double temperature, int64_t ignore_index, int64_t V);

}  // namespace lossfns::detail

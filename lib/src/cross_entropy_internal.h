// Internal glue of lossfns::cross_entropy_loss between its layers: the input checks both
// adapters run, and typed handles to the internal dispatcher ops. Not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <tuple>

#include "common.h"

namespace lossfns::detail {

// The logits as the kernels want them: a (rows, width) view with unit stride inside a row, the
// labels as a contiguous (rows,) int64 tensor, and V: the columns that count (<= width).
struct CrossEntropyInputs {
  at::Tensor x, labels;
  int64_t rows = 0, width = 0, V = 0;
  kernels::Reduction reduction = kernels::kNone;  // the internal op's code, checked
};

// TORCH_CHECKs the logits' shape and dtype, the labels' dtype, device and shape, and the codes
// (messages name what was expected and what was passed); `supported` lists the calling
// backend's dtypes. The labels' values are checked by the CPU adapter (check_ce_label_values);
// CUDA cannot check them without a host synchronisation (cross_entropy_common.h).
CrossEntropyInputs check_ce_inputs(const at::Tensor& logits, const at::Tensor& labels,
                                   int64_t reduction, int64_t V,
                                   std::initializer_list<at::ScalarType> supported,
                                   const char* backend);

// The backward's own inputs: the forward's stats, (rows, kCeStatsPerRow) contiguous, `stats_dtype`
// (the accumulation type) on the logits' device; grad_output with the loss's element count.
void check_ce_backward_inputs(const CrossEntropyInputs& in, const at::Tensor& logits,
                              const at::Tensor& stats, at::ScalarType stats_dtype,
                              const at::Tensor& grad_output, int64_t reduction);

// CPU labels: every one is ignore_index or in [0, V); else an error naming the first bad label,
// its row, V and the logits' shape.
void check_ce_label_values(const CrossEntropyInputs& in, int64_t ignore_index,
                           c10::IntArrayRef logits_shape);

// The internal ops (lossfns::_cross_entropy_forward / _cross_entropy_backward), through the
// dispatcher so that the device picks the kernels. Forward returns the loss ((rows,) for 'none',
// else 0-dim), the (rows, kCeStatsPerRow) statistics and the reduction's scale (1,).
std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_op(const at::Tensor& logits,
                                                                        const at::Tensor& labels,
                                                                        int64_t ignore_index,
                                                                        int64_t reduction,
                                                                        c10::SymInt V);
at::Tensor cross_entropy_backward_op(const at::Tensor& grad_output, const at::Tensor& logits,
                                     const at::Tensor& labels, const at::Tensor& stats,
                                     const at::Tensor& scale, int64_t ignore_index,
                                     int64_t reduction, c10::SymInt V);

}  // namespace lossfns::detail

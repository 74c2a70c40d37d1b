// Internal glue of lossfns::fused_linear_distill_loss between its layers: the arguments the chunk
// driver takes, and typed handles to its internal dispatcher ops. Not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace lossfns::detail {

inline constexpr const char* kFusedOp = "lossfns.fused_linear_distill_loss";

// The scalar arguments of the internal ops, in kernel form (distill_internal.h's Resolved).
// chunk_size 0: automatic.
struct FusedArgs {
  int64_t divergence = 0;
  double beta = 0.5, temperature = 1.0;
  int64_t ignore_index = 0, reduction = 0;
  c10::SymInt V = 0;  // symbolic in the public op's kernels under torch.compile's dynamic shapes
  double kd_weight = 1.0, ce_weight = 0.0;
  int64_t chunk_size = 0;
};

// The four inputs on one device, in one dtype (student_hidden's), else an error naming the one
// that is not. Checked by the public op before it dispatches (an input on another device, e.g.
// a teacher lm_head left on "meta", would pick another device's kernel for the whole call) and
// by the internal ops, which are callable on their own.
void check_same_dtype_and_device(const at::Tensor& student_hidden,
                                 const at::Tensor& student_lm_head,
                                 const at::Tensor& teacher_hidden,
                                 const at::Tensor& teacher_lm_head);

// lossfns::_fused_linear_distill_forward: the hidden states as (BT, H) matrices. Returns the loss,
// the divergence and the cross-entropy (0-dim, or (BT,) for kNone), then the gradients of the
// loss w.r.t. student_hidden (BT, H_s, the inputs' dtype) and student_lm_head (V_s, H_s, in the
// accumulation dtype: float32 for the half types, so that backward's multiplication by the
// grad_output and the rounding to the inputs' dtype are one pass) for a grad_output of 1, each
// only when asked for and the reduction is not kNone, else (0, H_s).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_forward_op(
    const at::Tensor& student_hidden, const at::Tensor& student_lm_head,
    const at::Tensor& teacher_hidden, const at::Tensor& teacher_lm_head,
    const std::optional<at::Tensor>& labels, const FusedArgs& args, bool grad_hidden,
    bool grad_lm_head);

// lossfns::_fused_linear_distill_backward: kNone's backward, which recomputes every chunk with the
// per-token grad_output (BT,) as the rows' weights. Returns the gradients as the forward does.
std::tuple<at::Tensor, at::Tensor> fused_linear_backward_op(
    const at::Tensor& grad_output, const at::Tensor& student_hidden,
    const at::Tensor& student_lm_head, const at::Tensor& teacher_hidden,
    const at::Tensor& teacher_lm_head, const std::optional<at::Tensor>& labels,
    const FusedArgs& args, bool grad_hidden, bool grad_lm_head);

// lossfns::_scale_cast: src * scale (scale a 1-element tensor) rounded once to dtype, in one pass
// (the backward of a reduced loss: the float32 lm_head gradient times grad_output).
at::Tensor scale_cast_op(const at::Tensor& src, const at::Tensor& scale, at::ScalarType dtype);

}  // namespace lossfns::detail

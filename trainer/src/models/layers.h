// Pieces shared by the model families (trainer/src/models/*.cpp).
#pragma once

#include <functional>
#include <utility>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

namespace distill {

// y = x W^T + b through at::linear, not torch::nn::Linear::forward. The C++ frontend's
// functional linear is matmul then `output += bias`: under bf16 autocast that in-place add
// mixes a bf16 output with the fp32 bias in a slow non-vectorised kernel (measured on an H200:
// ~11% of a 235M-parameter GPT's training step), and its backward sums the bias gradient in a
// separate pass. at::linear is autocast-aware (the bias is cast with the weight) and folds the
// bias into the matmul (addmm on the flattened batch).
//
// On CUDA, for a bias that takes a gradient, the backward is at::linear's but for the bias
// gradient: the column sums of the output's gradient by one kernel at the copy bandwidth
// (kernels/col_sum_kernel.cuh), in fp32 and kept so, where autograd's sum of the bf16 gradient
// over the tokens ran at ~44% of it (~21 ms of a 235M GPT's 460 ms step, docs/benchmarks.md,
// session 17) and rounded it to bf16 before the fp32 bias took it. The input's and weight's
// gradients are the same matmuls as at::linear's backward, but for an fp32 weight under autocast
// the weight gradient's GEMM writes it in fp32 (not bf16 and then a cast kernel): the product
// is not rounded to bf16 before the fp32 gradient takes it.
at::Tensor Linear(const torch::nn::Linear& layer, const at::Tensor& x);

// gelu(Linear(layer, x)) with the exact (erf) GELU, or with `tanh` its tanh approximation, as
// at::gelu(u, "none" / "tanh") computes it: the GPT family's MLP input. On CUDA the activation is
// one vectorised kernel (kernels/gelu_kernel.cuh: ATen's formulas, the same values as at::gelu's
// with the toolkit's erff, expf and tanhf; a test checks them),
// and where Linear takes its CUDA path, its backward computes the activation's
// gradient and the layer's bias gradient (the column sums of that gradient) in one pass, where
// at::gelu_backward wrote the gradient and the column sums read it back (~4 ms of a 235M GPT's
// step). The same values as gelu(Linear(layer, x)), bias gradient included (the same sums in the
// same order).
at::Tensor LinearGelu(const torch::nn::Linear& layer, const at::Tensor& x, bool tanh = false);

// y = LayerNorm(x) * weight + bias over the last dimension: at::native_layer_norm forward and
// its input gradient, but the weight and bias gradients as plain column sums. ATen's fused
// gamma/beta backward kernel took ~0.65 ms for an fp32 (16384, 1024) activation on an H200, ~15x
// what reading its two inputs costs; the sums below take a few passes at full bandwidth. Same
// arithmetic (fp32 accumulation); results differ from at::layer_norm's in float rounding only.
at::Tensor LayerNorm(const torch::nn::LayerNorm& layer, const at::Tensor& x);

// RMSNorm as transformers' LlamaRMSNorm computes it: weight * (x / sqrt(mean(x^2) + eps)), the
// mean and division in fp32, the result cast back to x's dtype before the gain.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The residual add of a pre-norm block and the norm that follows it:
//   h = x + y (the residual stream, x's dtype),  out = norm(h) * weight (+ bias).
// On CUDA with an fp32 residual stream this is one fused kernel each way (the add, the norm, the
// cast of `out` to the autocast dtype that the next matmul would do, and in the backward the
// norm's gradient plus the gradient arriving at h): on a 235M-parameter GPT it replaced ~9
// element-wise passes over (BT, d_model) per block. Elsewhere (CPU, other dtypes, rows wider
// than 8192) the composite: x + y, then LayerNorm / RmsNorm above; the two agree to float
// rounding, except that on CUDA under autocast `out` comes back in the autocast dtype.
struct AddNormResult {
  at::Tensor h, out;
};
AddNormResult AddLayerNorm(const at::Tensor& x, const at::Tensor& y,
                           const torch::nn::LayerNorm& layer);
AddNormResult AddRmsNorm(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight,
                         double eps);

// Rotary position embeddings as transformers' apply_rotary_pos_emb computes them:
//   out = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1],
// with x (B, T, H, D) and cos, sin (T, D) float32 tables, cast to x's dtype first. On CUDA (x
// contiguous) one kernel each way (kernels/rope_kernel.cuh) where the composite makes ~7 passes
// over x forward and more backward; it rounds as the composite does, so both give the same values
// bit for bit (but for the sign of a zero gradient: the composite adds +0 where the kernel keeps
// -0).
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The SwiGLU MLP's activation, silu(gate) * up, as transformers' LlamaMLP computes it. On CUDA
// (gate and up contiguous, of one shape and dtype) one kernel each way (kernels/swiglu_kernel.cuh)
// where the composite makes 2 passes forward and 3 backward, and keeps silu(gate) beside gate and
// up for the backward; it rounds as the composite does, so both give the same values.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);

// Activation checkpointing of one residual block, (x, pending) -> (h, pending') as the families'
// blocks take and return them (`pending` undefined for the first block). With gradients enabled
// the block runs without keeping its intermediates for the backward: only x and pending are kept,
// and the backward runs the block again -- under the forward's autocast state, with gradients --
// then back-propagates through that copy (gradients into the block's parameters and to x and
// pending). The recomputation does the same arithmetic, so the gradients are the same bits as
// without checkpointing. What it cannot reproduce: random draws (dropout; the config refuses
// train.activation_checkpointing with dropout), and a backward through torch::autograd::grad or
// backward(inputs=...): the parameters get their gradients from a backward run inside this
// block's backward, as PyTorch's reentrant checkpoint, which adds into every parameter's .grad
// however the outer backward was called (grad() naming the parameters does not reach them;
// grad() of anything else adds into their .grad); backward() is what the trainer calls. Without
// gradients (evaluation, the frozen teacher), or when neither input takes a gradient, it just
// calls the block.
using ResidualBlock = std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& x,
                                                                      const at::Tensor& pending)>;
std::pair<at::Tensor, at::Tensor> CheckpointedBlock(const ResidualBlock& block, const at::Tensor& x,
                                                    const at::Tensor& pending);

}  // namespace distill

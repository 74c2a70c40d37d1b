// The autograd side every op's Function shares. Not installed.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

namespace lossfns::detail {

// The ops' backward is first-order only: a fused kernel without a derivative of its own. Under
// create_graph the gradients it returns come back attached to an error node whose edges lead to
// the op's differentiable inputs, so that differentiating them again raises, naming the op,
// instead of silently dropping the second-order term -- with backward() and with
// autograd.grad(..., inputs) alike (Python's @once_differentiable links its error node to
// detached copies, which autograd.grad with respect to the inputs never reaches). Call one of
// the two below on backward's results, computed under at::NoGradGuard; `create_graph`: whether
// grad mode was on when backward was called.
inline torch::autograd::variable_list first_order_only_with_edges(
    const char* op, torch::autograd::edge_list edges, torch::autograd::variable_list grads) {
  if (edges.empty()) return grads;
  auto error = std::make_shared<torch::autograd::Error>(
      std::string(op) +
          ": its gradient cannot be differentiated again (the backward is a fused kernel without "
          "a derivative of its own): second-order gradients through it are not supported",
      std::move(edges));
  at::AutoGradMode enable_grad(true);
  for (at::Tensor& g : grads) {
    if (!g.defined()) continue;
    g = g.detach();
    torch::autograd::create_gradient_edge(g, error);
  }
  return grads;
}

// The edges of `output`'s node: the op's output, saved for backward and unpacked there with this
// node as its grad_fn (an op whose inputs are too large to keep: an in-place change of the output
// before backward is then an error, as for torch's ops that save their outputs).
inline torch::autograd::variable_list first_order_only(const char* op, const at::Tensor& output,
                                                       bool create_graph,
                                                       torch::autograd::variable_list grads) {
  if (!create_graph || !output.defined() || output.grad_fn() == nullptr) return grads;
  torch::autograd::edge_list edges;
  for (const auto& edge : output.grad_fn()->next_edges()) {
    if (edge.is_valid()) edges.push_back(edge);
  }
  return first_order_only_with_edges(op, std::move(edges), std::move(grads));
}

// As first_order_only, with the error node's edges leading to `tensors` (those that require
// grad): the op's differentiable inputs, saved for backward, and any tensor of backward's own
// (its grad_output) that the gradients would depend on.
inline torch::autograd::variable_list first_order_only_to(const char* op,
                                                          const std::vector<at::Tensor>& tensors,
                                                          bool create_graph,
                                                          torch::autograd::variable_list grads) {
  if (!create_graph) return grads;
  torch::autograd::edge_list edges;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) edges.push_back(torch::autograd::impl::gradient_edge(t));
  }
  return first_order_only_with_edges(op, std::move(edges), std::move(grads));
}

// Forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not supported: an input that
// carries a tangent is refused, where the forward-only path would drop the tangent silently.
// Every input defined (not None from Python), checked before autograd's Function::apply, whose
// VariableInfo of an undefined input fails with "tensor does not have a device" (the kernels'
// own checks say the same words); and dense: a sparse or nested tensor would reach an internal
// op that has no kernel for it, and the dispatcher's message names that op, not the argument.
inline void check_dense(const char* op, const char* names, const at::Tensor& x,
                        const char* must = " must be dense (strided) tensors") {
  TORCH_CHECK(x.layout() == at::kStrided && !x.is_nested(), op, ": ", names, must, "; got a ",
              x.is_nested() ? std::string("nested") : c10::str(x.layout()),
              " tensor (convert it: .to_dense() for a sparse one, .to_padded_tensor() for a "
              "nested one)");
  // A quantized tensor is strided too, and would reach an internal op without a kernel for it.
  TORCH_CHECK(!x.is_quantized(), op, ": ", names, " must not be quantized; got a quantized ",
              x.scalar_type(), " tensor (convert it: .dequantize())");
}

inline void check_inputs(const char* op, const char* names,
                         std::initializer_list<at::Tensor> inputs) {
  for (const at::Tensor& x : inputs) {
    TORCH_CHECK(x.defined(), op, ": ", names, " must be defined tensors");
    check_dense(op, names, x);
  }
}

// An input on `device` (the first tensor's), checked before the dispatcher picks a kernel by the
// tensors' devices: a meta (or other) tensor among CPU ones reached no kernel (from C++) or the
// Python package's fakes, and the message named an internal op. `must` is the kernels' own words
// ("q must be on p's device "), the devices follow.
inline void check_device(const char* op, const at::Tensor& x, const at::Device& device,
                         const char* must) {
  TORCH_CHECK(x.device() == device, op, ": ", must, device, "; got ", x.device());
}
inline void check_device(const char* op, const std::optional<at::Tensor>& x,
                         const at::Device& device, const char* must) {
  if (x.has_value() && x->defined()) check_device(op, *x, device, must);
}

// An optional input (labels, grad_scale): dense where given.
inline void check_inputs(const char* op, const char* name, const std::optional<at::Tensor>& x) {
  if (x.has_value() && x->defined()) check_dense(op, name, *x, " must be a dense (strided) tensor");
}

inline void check_no_forward_ad(const char* op, std::initializer_list<at::Tensor> inputs) {
  for (const at::Tensor& x : inputs) {
    TORCH_CHECK(!x.defined() || !x._fw_grad(/*level=*/0).defined(), op,
                ": forward-mode AD (torch.autograd.forward_ad, torch.func.jvp / jacfwd) is not "
                "supported: the op has no forward derivative; use reverse mode (backward() or "
                "torch.autograd.grad)");
  }
}

}  // namespace lossfns::detail

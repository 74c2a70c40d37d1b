// distill::StepGraph: a training step's micro-batches replayed from a CUDA graph
// (train.cuda_graph).
//
// A small model's step is bound by the host, not the GPU: every micro-batch launches a few
// thousand kernels (forward, loss, backward) and each launch costs the CPU more than the GPU
// spends on it. StepGraph captures one micro-batch's forward, loss and backward once as a CUDA
// graph and then launches it whole, with the micro-batch copied into the graph's input tensors.
//
//  - Work runs on a side stream (CUDA graphs cannot capture the default stream); the caller's
//    stream waits for it at the end of Accumulate, so what follows (clipping, the optimizer,
//    evaluation, checkpoints) sees finished gradients and sums.
//  - The first `warmup_calls` calls run eagerly on that stream (cuBLAS / cuDNN plans, lazy
//    state); the next micro-batch of the graph's shape is captured, then replayed. A micro-batch
//    of another shape runs eagerly (the data sources' batches all have one shape).
//  - Gradients accumulate into the parameters' .grad tensors that existed at capture (the graph
//    adds into that memory); Accumulate puts them back where the caller replaced them (zero_grad
//    with set_to_none, a test's model.zero_grad()), carrying over their values. A parameter
//    without a gradient at capture that gets one in the graph, a parameter whose storage changed,
//    or a failed capture (an op in the step that synchronises with the host) is reported by
//    TakeWarning and the step falls back to eager launches for good, with the same results.
//
// Results: the same kernels run on the same data, so a replayed step gives the eager step's loss
// and gradients up to float rounding (cuBLAS may pick another algorithm on the side stream;
// tests/trainer/step_graph_test.cpp compares them on CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "distill/data.h"

namespace distill {

class StepGraph {
 public:
  // One micro-batch on the device: forward, loss and backward (.grad += the gradient of its loss
  // times `scale`, a 0-dim float tensor), adding its loss sums into kd_sum and ce_sum (0-dim
  // float). It must not read device values on the host (a capture cannot contain that).
  using MicroBatch =
      std::function<void(const at::Tensor& inputs, const at::Tensor& targets,
                         const at::Tensor& scale, at::Tensor& kd_sum, at::Tensor& ce_sum)>;

  // `parameters`: those whose .grad the micro-batch accumulates into (the student's).
  StepGraph(const at::Device& device, std::vector<at::Tensor> parameters, int warmup_calls = 2);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs `batches` (host tensors) through `body`; returns the sums {kd, ce} over them (device
  // tensors, valid until the next call), the caller's stream synchronised with the work.
  std::pair<at::Tensor, at::Tensor> Accumulate(const std::vector<Batch>& batches, double scale,
                                               const MicroBatch& body);

  // Whether micro-batches are replayed from a graph now.
  bool captured() const;
  // Once: why the graph was given up (then every later step runs eagerly), or nullopt.
  std::optional<std::string> TakeWarning();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distill

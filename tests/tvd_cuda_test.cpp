// CUDA-only behaviour of the TVD op: launches on the current (non-default) stream, no host
// synchronisation in forward or backward, capture in a CUDA graph. Built when the CUDA kernels
// are; skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include "lossfns/tvd.h"

namespace lossfns::testing {
namespace {

at::Tensor probs(std::vector<int64_t> shape, at::ScalarType dtype) {
  return at::softmax(at::randn(shape, at::kCUDA), -1).to(dtype);
}

// The op mixed with ordinary ops on a non-default stream gives the same numbers as on the default
// stream: every launch must go to the current stream.
TEST(TvdCuda, RunsOnTheCurrentNonDefaultStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(7);
  const at::Tensor logits = at::randn({512, 32000}, at::kCUDA),
                   teacher = probs({512, 32000}, at::kFloat);
  auto run = [&] {
    const at::Tensor x = logits.detach().requires_grad_(true);
    const at::Tensor loss = tvd_loss(at::softmax(x * 1.5, -1), teacher) * 2.0;
    return std::make_pair(loss.detach(), torch::autograd::grad({loss}, {x})[0]);
  };
  const auto [loss0, grad0] = run();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor loss1, grad1;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    std::tie(loss1, grad1) = run();
  }
  side.synchronize();
  EXPECT_TRUE(loss0.equal(loss1));
  EXPECT_TRUE(grad0.equal(grad1));
}

// Forward and backward never wait for the device: with sync debug mode set to error, any
// synchronising call (an .item(), a blocking copy) inside them throws.
TEST(TvdCuda, ForwardAndBackwardDoNotSynchronise) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor p = probs({64, 1000}, at::kBFloat16).requires_grad_(true);
  const at::Tensor q = probs({64, 1000}, at::kBFloat16);
  const at::Tensor labels = (at::arange(64, at::kLong) % 3 - 1).to(at::kCUDA);
  const at::Tensor grad_out = at::full({}, 0.5, at::TensorOptions().device(at::kCUDA));
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  at::Tensor grad;
  EXPECT_NO_THROW({
    const at::Tensor loss = tvd_loss(p, q, TVDLossOptions().ignore_index(-1), labels);
    grad = torch::autograd::grad({loss}, {p}, {grad_out})[0];
  });
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  ASSERT_TRUE(grad.defined());
  EXPECT_TRUE(grad[0].eq(0).all().item<bool>()) << "row 0 has label -1: ignored";
  EXPECT_FALSE(grad[1].eq(0).all().item<bool>()) << "row 1 (label 0) counts";
}

// Captured in a CUDA graph with autograd, then replayed on new inputs copied into the captured
// ones: the same loss and gradient, bit for bit, as eager calls on those inputs. On Hopper the
// finalize and the backward are programmatic dependent launches, which a capture records as
// programmatic edges of the graph.
TEST(TvdCuda, CapturedInACudaGraphReplaysOnNewInputs) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(11);
  const int64_t BT = 1024, V = 32000;
  const at::Tensor p = probs({BT, V}, at::kBFloat16).requires_grad_(true);
  const at::Tensor q = probs({BT, V}, at::kBFloat16);
  const at::Tensor rows = at::arange(BT, at::kLong);
  const at::Tensor labels =
      (rows % 5).masked_fill(rows % 3 == 0, kDefaultIgnoreIndex).to(at::kCUDA);
  const at::Tensor grad_out = at::full({}, 0.5, at::TensorOptions().device(at::kCUDA));
  auto step = [&] {
    const at::Tensor loss = tvd_loss(p, q, TVDLossOptions(), labels);
    return std::make_pair(loss.detach(), torch::autograd::grad({loss}, {p}, {grad_out})[0]);
  };
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  at::Tensor loss_g, grad_g;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    step();  // warm-up on the capture stream
    side.synchronize();
    graph.capture_begin();
    std::tie(loss_g, grad_g) = step();
    graph.capture_end();
  }
  for (int round = 0; round < 2; ++round) {
    {
      c10::AutoGradMode no_grad(false);
      p.copy_(probs({BT, V}, at::kBFloat16));
      q.copy_(probs({BT, V}, at::kBFloat16));
    }
    graph.replay();
    const auto [loss_e, grad_e] = step();
    EXPECT_TRUE(loss_g.equal(loss_e))
        << "round " << round << ": " << loss_g.item<float>() << " against " << loss_e.item<float>();
    EXPECT_TRUE(grad_g.equal(grad_e)) << "round " << round;
    EXPECT_TRUE(grad_e[1].ne(0).any().item<bool>()) << "row 1 counts: its gradient is not all zero";
  }
}

}  // namespace
}  // namespace lossfns::testing

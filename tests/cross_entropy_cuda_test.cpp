// CUDA-only behaviour of lossfns::cross_entropy_loss: the kernels against the float64 reference at
// the trainer's vocabularies (bf16 and fp32, ignored rows, V = 151936), launches on the current
// non-default stream, no host synchronisation, and an out-of-range label (NaN, no crash). Built
// when the CUDA kernels are; skips without a GPU. The CPU sweep (cross_entropy_test.cpp) runs on
// CUDA too where there is a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cmath>

#include "cross_entropy_reference.h"
#include "lossfns/cross_entropy.h"

namespace lossfns::testing {
namespace {

const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA);

at::Tensor labels_with_ignored(int64_t rows, int64_t V) {
  at::Tensor l = at::randint(0, V, {rows}, at::kLong);
  l.index_put_({at::arange(rows) % 3 == 1}, kDefaultIgnoreIndex);
  return l.to(at::kCUDA);
}

TEST(CrossEntropyCuda, MatchesTheReferenceAtTrainerVocabularies) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(7);
  struct Shape {
    int64_t rows, width;
    std::optional<int64_t> vocab_size;
  };
  // 151936 (Qwen), 128256 (Llama 3) padded to 128264 with garbage, 32003 (rows not 16-byte
  // aligned: the scalar path), 50 (one vector per thread or less).
  for (const Shape& s : {Shape{7, 151936, std::nullopt}, Shape{5, 128264, 128256},
                         Shape{9, 32003, std::nullopt}, Shape{33, 50, std::nullopt}})
    for (at::ScalarType dtype : {at::kBFloat16, at::kFloat})
      for (const Reduction& red :
           {Reduction(torch::kMean), Reduction(torch::kSum), Reduction(torch::kNone)}) {
        SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.width) + " " +
                     c10::toString(dtype) + " " + reduction_name(red));
        at::Tensor x = at::randn({s.rows, s.width}, kCuda) * 3;
        if (s.vocab_size) x.narrow(1, *s.vocab_size, s.width - *s.vocab_size).fill_(std::nan(""));
        const at::Tensor labels = labels_with_ignored(s.rows, s.vocab_size.value_or(s.width));
        const at::Tensor go = std::holds_alternative<torch::enumtype::kNone>(red)
                                  ? at::rand({s.rows}, at::kDouble)
                                  : at::full({}, 0.5, at::kDouble);
        EXPECT_TRUE(matches_reference(
            x.to(dtype), labels, CrossEntropyLossOptions().reduction(red).vocab_size(s.vocab_size),
            go));
      }
}

// A row wider than 65535 of the backward's column chunks (16384 bf16 columns each) takes wider
// chunks, as distill_loss's backward does: it was an "invalid configuration argument" error. One
// row of 2^30 + 16 zero logits (2 GiB in bf16, 4 GiB with its gradient): every column but the
// label's gets the same gradient, 1/W, bit for bit, so a column chunk left out would show.
TEST(CrossEntropyCuda, ARowWiderThanTheBackwardsGridGetsItsWholeGradient) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t W = (int64_t{1} << 30) + 16, label = W - 3;
  const at::Tensor x = at::zeros({1, W}, kCuda.dtype(at::kBFloat16)).requires_grad_(true);
  const at::Tensor loss = cross_entropy_loss(x, at::full({1}, label, kCuda.dtype(at::kLong)),
                                             CrossEntropyLossOptions());
  EXPECT_NEAR(loss.item<double>(), std::log(double(W)), 1e-5 * std::log(double(W)));
  loss.backward();
  const at::Tensor g = x.grad();
  const at::Tensor p = at::full({}, 1.0 / double(W), kCuda).to(at::kBFloat16);
  EXPECT_EQ(g.eq(p).sum().item<int64_t>(), W - 1);
  EXPECT_NEAR(g[0][label].item<double>(), 1.0 / double(W) - 1.0, 4e-3);
}

// The op mixed with ordinary ops on a non-default stream gives the same numbers as on the default
// stream: every launch must go to the current stream.
TEST(CrossEntropyCuda, RunsOnTheCurrentNonDefaultStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(8);
  const at::Tensor logits = at::randn({512, 32000}, kCuda),
                   labels = labels_with_ignored(512, 32000);
  auto run = [&] {
    const at::Tensor x = logits.detach().requires_grad_(true);
    const at::Tensor loss = lossfns::cross_entropy_loss((x * 1.5).to(at::kBFloat16), labels) * 2.0;
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
TEST(CrossEntropyCuda, ForwardAndBackwardDoNotSynchronise) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor x = at::randn({64, 1000}, kCuda).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor labels = labels_with_ignored(64, 1000);
  const at::Tensor grad_out = at::full({}, 0.5, kCuda);
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  at::Tensor grad;
  EXPECT_NO_THROW({
    const at::Tensor loss =
        lossfns::cross_entropy_loss(x, labels, CrossEntropyLossOptions().reduction(torch::kSum));
    grad = torch::autograd::grad({loss}, {x}, {grad_out})[0];
  });
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  ASSERT_TRUE(grad.defined());
  EXPECT_TRUE(grad[1].eq(0).all().item<bool>()) << "row 1 is ignored";
  EXPECT_FALSE(grad[0].eq(0).all().item<bool>()) << "row 0 counts";
}

// A label outside [0, V) (not ignore_index) cannot be checked without a synchronisation: its row's
// loss and gradient are NaN, nothing is read out of bounds, and the CUDA context survives (where
// torch's device assert would end it).
TEST(CrossEntropyCuda, OutOfRangeLabelGivesANaNRowNotACrash) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor x = at::randn({4, 100}, kCuda).requires_grad_(true);
  const at::Tensor labels =
      at::tensor(std::vector<int64_t>{3, 100, -5, 1}, at::kLong).to(at::kCUDA);
  const at::Tensor loss =
      lossfns::cross_entropy_loss(x, labels, CrossEntropyLossOptions().reduction(torch::kNone));
  loss.sum().backward();
  c10::cuda::device_synchronize();  // no sticky error
  const at::Tensor l = loss.cpu(), g = x.grad().cpu();
  EXPECT_TRUE(std::isfinite(l[0].item<double>()) && std::isfinite(l[3].item<double>()));
  EXPECT_TRUE(std::isnan(l[1].item<double>()) && std::isnan(l[2].item<double>()));
  EXPECT_TRUE(g[1].isnan().all().item<bool>() && g[2].isnan().all().item<bool>());
  EXPECT_FALSE(g[0].isnan().any().item<bool>());
  EXPECT_TRUE(
      std::isnan(lossfns::cross_entropy_loss(x.detach(), labels).item<double>()));  // the mean too
  EXPECT_EQ(at::ones({2}, kCuda).sum().item<double>(), 2.0);  // the context still works
}

}  // namespace
}  // namespace lossfns::testing

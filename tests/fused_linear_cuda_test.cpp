// CUDA-only behaviour of lossfns::fused_linear_distill_loss: it runs on the current (non-default)
// stream, never waits for the device in forward or backward, and never holds more than a chunk
// of logits. Built when the CUDA kernels are; skips without a GPU. The numbers against the
// composite are in fused_linear_test.cpp.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <limits>

#include "lossfns/fused_linear.h"

namespace lossfns::testing {
namespace {

struct Problem {
  at::Tensor sh, sw, th, tw, labels;
};
Problem make_problem(int64_t rows, int64_t hs, int64_t ht, int64_t V, bool labels) {
  const auto bf16 = at::TensorOptions(at::kCUDA).dtype(at::kBFloat16);
  Problem p{at::randn({rows, hs}, bf16), at::randn({V, hs}, bf16) * 0.1,
            at::randn({rows, ht}, bf16), at::randn({V, ht}, bf16) * 0.1, at::Tensor()};
  if (labels) p.labels = at::randint(0, V, {rows}, at::TensorOptions(at::kCUDA).dtype(at::kLong));
  return p;
}

FusedLinearDistillOptions jsd_with_ce(std::optional<int64_t> chunk) {
  return FusedLinearDistillOptions()
      .distill(DistillLossOptions().divergence(Divergence::kJsd).temperature(2.0))
      .ce_weight(0.5)
      .chunk_size(chunk);
}

// The backward's float32 lm_head gradient times grad_output, rounded once to the lm_head's dtype:
// the CUDA kernel gives ATen's multiplication into that dtype bit for bit, at sizes that are and
// are not a multiple of its 8-element vectors, from an unaligned float32 view, with NaN and inf.
TEST(FusedLinearCuda, ScaleCastEqualsAtenMultiplicationIntoTheDtype) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_scale_cast", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType)>();
  at::manual_seed(3);
  const auto f32 = at::TensorOptions(at::kCUDA).dtype(at::kFloat);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    // The last size takes every block of the grid (at most 8 per SM) through its loop 3 times.
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1003}, int64_t{1} << 20,
                            sms * 8 * 2048 * 3 + 5}) {
      for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
        at::Tensor base = at::randn({n + offset}, f32) * 1e3;
        base.index_put_({0}, std::numeric_limits<float>::quiet_NaN());
        if (n + offset > 2) base.index_put_({2}, std::numeric_limits<float>::infinity());
        const at::Tensor src = base.narrow(0, offset, n);
        const at::Tensor go = at::full({}, 0.7, f32);
        at::Tensor want = at::empty({n}, f32.dtype(dtype));
        at::mul_out(want, src, go);
        const at::Tensor got = op.call(src, go, dtype);
        ASSERT_EQ(got.scalar_type(), dtype);
        // NaN where ATen has NaN (the two round NaN to different bit patterns), equal elsewhere.
        EXPECT_TRUE(got.isnan().equal(want.isnan()) && got.nan_to_num().equal(want.nan_to_num()))
            << "dtype " << dtype << " n " << n << " offset " << offset;
      }
    }
    // A non-contiguous source (a transposed view): taken as its contiguous copy.
    const at::Tensor t = (at::randn({300, 17}, f32) * 10).t();
    const at::Tensor go = at::full({1}, -1.5, f32);
    at::Tensor want = at::empty(t.sizes(), f32.dtype(dtype));
    at::mul_out(want, t, go);
    EXPECT_TRUE(op.call(t, go, dtype).equal(want)) << "dtype " << dtype << " transposed";
  }
}

TEST(FusedLinearCuda, RunsOnTheCurrentNonDefaultStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(7);
  const Problem p = make_problem(1000, 256, 384, 32000, true);
  auto run = [&] {
    const at::Tensor h = p.sh.detach().requires_grad_(true), w = p.sw.detach().requires_grad_(true);
    const at::Tensor x = h * 1.5;  // an ordinary op before, and after
    const at::Tensor loss =
        fused_linear_distill_loss(x, w, p.th, p.tw, p.labels, jsd_with_ce(128)).loss * 2.0;
    const auto grads = torch::autograd::grad({loss}, {h, w});
    return std::make_tuple(loss.detach(), grads[0], grads[1]);
  };
  const auto [loss0, gh0, gw0] = run();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor loss1, gh1, gw1;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    std::tie(loss1, gh1, gw1) = run();
  }
  side.synchronize();
  EXPECT_TRUE(loss0.equal(loss1));
  EXPECT_TRUE(gh0.equal(gh1));
  EXPECT_TRUE(gw0.equal(gw1));
}

// With sync debug mode set to error, a synchronising call (.item(), a blocking copy) inside
// forward or backward throws. The first call is outside: it may probe the device once (whether
// addmm accumulates bf16 products into float32 in place: fused_linear_driver.cpp).
TEST(FusedLinearCuda, ForwardAndBackwardDoNotSynchronise) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Problem p = make_problem(300, 128, 64, 5000, true);
  for (const char* red : {"batchmean", "none"}) {
    DistillLossOptions d;
    if (std::string(red) == "none") d.reduction(torch::kNone);
    const auto o = jsd_with_ce(std::nullopt).distill(d);
    const at::Tensor h = p.sh.detach().requires_grad_(true), w = p.sw.detach().requires_grad_(true);
    torch::autograd::grad({fused_linear_distill_loss(h, w, p.th, p.tw, p.labels, o).loss.sum()},
                          {h, w});
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    EXPECT_NO_THROW({
      const at::Tensor loss = fused_linear_distill_loss(h, w, p.th, p.tw, p.labels, o).loss.sum();
      torch::autograd::grad({loss}, {h, w});
    }) << red;
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
}

// Forward + backward peak beyond the inputs: chunk logits, the float32 lm_head gradient and the
// two gradients; below one (BT, V) bf16 logits tensor (the composite holds three, and a float32
// copy for its cross-entropy).
TEST(FusedLinearCuda, HoldsOneChunkOfLogitsNotTheWholeBatch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 4096, V = 32000, hs = 256;
  const Problem p = make_problem(rows, hs, hs, V, false);
  const at::Tensor h = p.sh.detach().requires_grad_(true), w = p.sw.detach().requires_grad_(true);
  const auto o = FusedLinearDistillOptions().chunk_size(128);
  torch::autograd::grad({fused_linear_distill_loss(h, w, p.th, p.tw, std::nullopt, o).loss},
                        {h, w});  // warm-up
  c10::cuda::device_synchronize();
  const auto device = c10::cuda::current_device();
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t base =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[agg].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  {
    const auto grads = torch::autograd::grad(
        {fused_linear_distill_loss(h, w, p.th, p.tw, std::nullopt, o).loss}, {h, w});
    c10::cuda::device_synchronize();
  }
  const int64_t peak =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[agg].peak;
  EXPECT_LT(peak - base, rows * V * 2)
      << "peak " << (peak - base) / (1 << 20) << " MiB beyond the inputs";
}

}  // namespace
}  // namespace lossfns::testing

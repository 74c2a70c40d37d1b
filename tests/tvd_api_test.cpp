// The TVD loss's public surface: every bad-input path and its message, the module, the version,
// the dispatcher op.
#include <string>
#include <variant>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/modules/container/any.h>

#include "lossfns/lossfns.h"
#include "tvd_reference.h"

namespace lossfns::testing {
namespace {

// Expects tvd_loss(args...) to throw c10::Error whose message contains every fragment.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << *fragments.begin() << "'";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const char* f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

at::Tensor probs(std::vector<int64_t> shape, at::ScalarType dtype = at::kFloat,
                 at::Device dev = at::kCPU) {
  return at::softmax(at::randn(shape), -1).to(dev, dtype);
}

TEST(TvdErrors, ShapesDtypesAndLabelsAreCheckedWithBothSidesNamed) {
  const at::Tensor p = probs({4, 10}), q = probs({4, 10});
  expect_error([&] { tvd_loss(probs({10}), probs({10})); },
               {"p must be (BT, V) or (B, T, V)", "[10]"});
  expect_error(
      [&] {
        tvd_loss(probs({2, 2, 2, 3}), probs({2, 2, 2, 3}));
      },
      {"(B, T, V)", "[2, 2, 2, 3]"});
  expect_error(
      [&] {
        tvd_loss(p, probs({4, 11}));
      },
      {"q must have p's shape [4, 10]", "got [4, 11]"});
  expect_error([&] { tvd_loss(p, q.to(at::kDouble)); },
               {"q must have p's dtype Float", "got Double"});
  expect_error([&] { tvd_loss(p.to(at::kInt), q.to(at::kInt)); },
               {"on CPU p and q must be one of", "got Int"});
  expect_error([&] { tvd_loss(at::empty({4, 0}), at::empty({4, 0})); }, {"V", "must be > 0"});
  const auto opts = TVDLossOptions();
  expect_error([&] { tvd_loss(p, q, opts, at::zeros({4}, at::kInt)); },
               {"labels must be int64", "got Int",
                "convert with .long() in Python, .to(torch::kLong) in C++"});
  expect_error([&] { tvd_loss(p, q, opts, at::zeros({5}, at::kLong)); },
               {"labels must have shape [4]", "got [5]"});
  expect_error(
      [&] {
        tvd_loss(probs({2, 3, 10}), probs({2, 3, 10}), opts, at::zeros({3, 2}, at::kLong));
      },
      {"labels must have shape [2, 3]", "got [3, 2]"});
}

TEST(TvdErrors, BadReductionNameThroughTheDispatcherOp) {
  const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::tvd_loss", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            int64_t, c10::string_view)>();
  expect_error(
      [&] {
        op.call(probs({2, 5}), probs({2, 5}), std::nullopt, -100, "avg");
      },
      {"reduction must be one of 'none', 'sum', 'mean', 'batchmean'", "got 'avg'"});
}

TEST(TvdErrors, CudaDevicesAndDtypesMustAgree) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor p = probs({4, 10}, at::kFloat, at::kCUDA);
  expect_error([&] { tvd_loss(p, probs({4, 10})); }, {"q must be on p's device cuda:0", "got cpu"});
  expect_error([&] { tvd_loss(p, p.clone(), {}, at::zeros({4}, at::kLong)); },
               {"labels must be on the device of p, cuda:0", "got cpu"});
  expect_error([&] { tvd_loss(p.to(at::kDouble), p.to(at::kDouble)); },
               {"on CUDA p and q must be one of", "got Double"});
}

// A tensor on another device than the first input (meta here: weights never loaded) is named by
// the public ops before the dispatcher picks a kernel by the devices; from C++ there is no meta
// kernel, and the dispatcher's message named an internal op (lossfns::_distill_forward).
TEST(TvdErrors, EveryOpNamesATensorOnAnotherDevice) {
  at::manual_seed(3);
  const at::Tensor s = at::randn({4, 10}), t = at::randn({4, 10});
  const at::Tensor p = t.softmax(-1), labels = at::zeros({4}, at::kLong);
  const at::Device meta(at::kMeta);
  for (const bool grad : {true, false}) {
    const at::Tensor x = grad ? s.clone().requires_grad_(true) : s;
    expect_error(
        [&] { distill_loss(x, t.to(meta)); },
        {"lossfns.distill_loss: teacher_logits must be on the student's device cpu", "got meta"});
    expect_error([&] { distill_loss(x, t, DistillLossOptions(), labels.to(meta)); },
                 {"labels must be on the device of student_logits, cpu", "got meta"});
    expect_error([&] { distill_loss(x, t, DistillLossOptions().grad_scale(at::ones({1}, meta))); },
                 {"grad_scale must be a 1-element floating-point tensor on the logits' device cpu",
                  "on meta"});
    expect_error(
        [&] { lossfns::cross_entropy_loss(x, labels.to(meta)); },
        {"lossfns.cross_entropy_loss: labels must be on the device of logits, cpu", "got meta"});
    const at::Tensor pp = grad ? p.clone().requires_grad_(true) : p;
    expect_error([&] { tvd_loss(pp, p.to(meta)); }, {"q must be on p's device cpu", "got meta"});
    expect_error([&] { tvd_loss(pp, p, TVDLossOptions(), labels.to(meta)); },
                 {"labels must be on the device of p, cpu", "got meta"});
  }
}

// An empty batch (0 rows, e.g. (0, V) or (B, 0, V)): the loss is 0 (kNone: an empty tensor) and
// the backward gives zero-size gradients of p's shape, with and without labels, every reduction.
void ExpectEmptyBatchWorks(at::Device dev) {
  const std::vector<TVDLossOptions::reduction_t> reductions = {torch::kNone, torch::kBatchMean,
                                                               torch::kSum, torch::kMean};
  for (const auto& reduction : reductions) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0, 7}, {3, 0, 7}}) {
      for (bool with_labels : {false, true}) {
        SCOPED_TRACE(std::string(reduction_name(reduction)) + (with_labels ? " labels " : " ") +
                     std::to_string(shape.size()) + "d");
        at::Tensor p = at::empty(shape, at::TensorOptions(dev)).requires_grad_(true);
        at::Tensor q = at::empty(shape, at::TensorOptions(dev)).requires_grad_(true);
        std::optional<at::Tensor> labels;
        if (with_labels) {
          labels = at::empty(std::vector<int64_t>(shape.begin(), shape.end() - 1),
                             at::TensorOptions(dev).dtype(at::kLong));
        }
        const at::Tensor loss = tvd_loss(p, q, TVDLossOptions().reduction(reduction), labels);
        if (std::holds_alternative<torch::enumtype::kNone>(reduction)) {
          EXPECT_EQ(loss.sizes(), p.sizes());
        } else {
          EXPECT_EQ(loss.dim(), 0);
          EXPECT_EQ(loss.item<double>(), 0.0);
        }
        loss.sum().backward();
        ASSERT_TRUE(p.grad().defined());
        ASSERT_TRUE(q.grad().defined());
        EXPECT_EQ(p.grad().sizes(), p.sizes());
        EXPECT_EQ(q.grad().sizes(), q.sizes());
      }
    }
  }
}

TEST(TvdEmptyBatch, ZeroRowsForwardAndBackwardCpu) { ExpectEmptyBatchWorks(at::kCPU); }

TEST(TvdEmptyBatch, ZeroRowsForwardAndBackwardCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectEmptyBatchWorks(at::Device(at::kCUDA, 0));
}

TEST(TvdModule, MatchesTheFunctionAndPrintsItsOptions) {
  at::manual_seed(0);
  const at::Tensor p = probs({6, 33}), q = probs({6, 33});
  const at::Tensor labels = at::tensor({1, -1, 2, 3, -1, 0}, at::kLong);
  TVDLoss module(TVDLossOptions().reduction(torch::kMean).ignore_index(-1));
  EXPECT_TRUE(module(p, q, labels).equal(tvd_loss(p, q, module->options, labels)));
  EXPECT_TRUE(module(p, q).equal(tvd_loss(p, q, module->options)));
  // Through AnyModule (what Sequential holds), with and without the labels.
  torch::nn::AnyModule any(module);
  EXPECT_TRUE(any.forward(p, q, labels).equal(tvd_loss(p, q, module->options, labels)));
  EXPECT_TRUE(any.forward(p, q).equal(tvd_loss(p, q, module->options)));
  std::ostringstream s;
  s << *module;
  EXPECT_EQ(s.str(), "lossfns::TVDLoss(reduction=mean, ignore_index=-1)");
}

TEST(TvdVersion, HeaderAndLibraryAgree) {
  EXPECT_STREQ(lossfns::version(), LOSSFNS_VERSION);
  EXPECT_EQ(std::string(LOSSFNS_VERSION), std::to_string(LOSSFNS_VERSION_MAJOR) + "." +
                                              std::to_string(LOSSFNS_VERSION_MINOR) + "." +
                                              std::to_string(LOSSFNS_VERSION_PATCH));
}

}  // namespace
}  // namespace lossfns::testing

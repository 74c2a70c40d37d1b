// lossfns::cross_entropy_loss against the float64 reference (cross_entropy_reference.h) and
// against at::cross_entropy_loss: loss and gradient, swept over dtypes, reductions, shapes,
// strides, padding, ignored rows, -inf and NaN logits; a float64 finite-difference gradcheck; the
// errors. Runs on the CPU, and on CUDA too where there is a GPU (cross_entropy_cuda_test.cpp
// holds the CUDA-only cases).
#include "lossfns/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cross_entropy_reference.h"

namespace lossfns::testing {
namespace {

const double kInf = std::numeric_limits<double>::infinity();
const std::vector<Reduction> kReductions = {torch::kNone, torch::kSum, torch::kMean,
                                            torch::kBatchMean};

std::vector<at::Device> devices() {
  std::vector<at::Device> d = {at::kCPU};
  if (torch::cuda::is_available()) d.emplace_back(at::kCUDA);
  return d;
}
std::vector<at::ScalarType> dtypes(const at::Device& d) {
  if (d.is_cuda()) return {at::kFloat, at::kBFloat16, at::kHalf};
  return {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf};
}

// Labels in [0, V), every third row ignored when `ignore`.
at::Tensor make_labels(int64_t rows, int64_t V, bool ignore, const at::Device& dev) {
  at::Tensor l = at::randint(0, V, {rows}, at::kLong);
  if (ignore) l.index_put_({at::arange(rows) % 3 == 1}, kDefaultIgnoreIndex);
  return l.to(dev);
}

// Garbage in the padding columns [V, width): NaN, -inf, +inf, +1e4 in turn (never read).
void fill_padding(at::Tensor& x, int64_t V) {
  const double garbage[] = {std::nan(""), -kInf, kInf, 1e4};
  for (int64_t j = V; j < x.size(1); ++j) x.select(1, j).fill_(garbage[j % 4]);
}

struct Case {
  int64_t rows, width;
  std::optional<int64_t> vocab_size;
  double magnitude = 2.0;  // logits ~ N(0, magnitude^2)
  bool strided = false, ignore = false;
};
std::string describe(const Case& c) {
  std::ostringstream o;
  o << c.rows << "x" << c.width << " vocab " << (c.vocab_size ? std::to_string(*c.vocab_size) : "-")
    << " x" << c.magnitude << (c.strided ? " strided" : "") << (c.ignore ? " ignored rows" : "");
  return o.str();
}

// The case's logits on dev in dtype; strided: a view into a wider buffer (row stride > width).
at::Tensor make_logits(const Case& c, at::ScalarType dtype, const at::Device& dev) {
  at::Tensor x = at::randn({c.rows, c.width}, at::kDouble) * c.magnitude;
  if (c.vocab_size) fill_padding(x, *c.vocab_size);
  x = x.to(dev, dtype);
  if (!c.strided) return x;
  at::Tensor wide = at::full({c.rows, c.width + 9}, 7.0, x.options());
  wide.narrow(1, 3, c.width).copy_(x);
  return wide.narrow(1, 3, c.width);
}

CrossEntropyLossOptions options(const Reduction& red,
                                std::optional<int64_t> vocab_size = std::nullopt) {
  return CrossEntropyLossOptions().reduction(red).vocab_size(vocab_size);
}
at::Tensor grad_output(const Reduction& red, int64_t rows) {
  return std::holds_alternative<torch::enumtype::kNone>(red) ? at::rand({rows}, at::kDouble) + 0.5
                                                             : at::full({}, 0.75, at::kDouble);
}

TEST(CrossEntropyReference, MatchesAtenCrossEntropyAndItsAutograd) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({9, 37}, at::kDouble) * 3;
  const at::Tensor labels = make_labels(9, 37, true, at::kCPU);
  const at::Tensor xl = x.clone().set_requires_grad(true);
  const at::Tensor loss =
      at::cross_entropy_loss(xl, labels, {}, at::Reduction::None, kDefaultIgnoreIndex);
  const at::Tensor w = at::rand({9}, at::kDouble);
  loss.backward(w);
  const CeRefResult r = reference_cross_entropy(x, labels, kDefaultIgnoreIndex, 37, w);
  EXPECT_TRUE(all_close(r.row_loss, loss, 1e-13, 1e-13));
  EXPECT_TRUE(all_close(r.grad, xl.grad(), 1e-13, 1e-15));
}

TEST(CrossEntropyLoss, MatchesTheFloat64ReferenceAcrossTheSweep) {
  at::manual_seed(0);
  const std::vector<Case> cases = {
      {1, 1, std::nullopt},                        // V = 1: loss 0, gradient 0
      {13, 7, std::nullopt, 2.0, false, true},     // prime rows, V below a vector
      {5, 255, std::nullopt, 2.0, true, false},    // strided, V not a multiple of the vector width
      {6, 256, 200, 2.0, false, true},             // padded vocabulary holding NaN / inf / 1e4
      {4, 1003, std::nullopt, 40.0, true, true},   // logits of +-300: most p underflow to 0
      {4, 500, std::nullopt, 0.01, false, false},  // nearly uniform
      {3, 32000, std::nullopt, 2.0, false, true},
      {3, (1 << 17) + 3, std::nullopt, 2.0, false, true},  // large V
  };
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev))
      for (const Case& c : cases)
        for (const Reduction& red : kReductions) {
          if (c.width > 100000 && dtype == at::kHalf) continue;
          SCOPED_TRACE(describe(c) + " " + c10::toString(dtype) + " " + dev.str() + " " +
                       reduction_name(red));
          const at::Tensor x = make_logits(c, dtype, dev);
          const at::Tensor labels =
              make_labels(c.rows, c.vocab_size.value_or(c.width), c.ignore, dev);
          EXPECT_TRUE(
              matches_reference(x, labels, options(red, c.vocab_size), grad_output(red, c.rows)));
        }
}

TEST(CrossEntropyLoss, MatchesAtenCrossEntropyForEveryReduction) {
  // torch's cross_entropy on the same float32 logits: 'mean' divides by the rows not ignored, and
  // 'batchmean' is the same here (a row is cross-entropy's unit).
  at::manual_seed(2);
  for (const auto& dev : devices()) {
    const at::Tensor x = at::randn({37, 301}, at::TensorOptions(dev)) * 3;
    const at::Tensor labels = make_labels(37, 301, true, dev);
    const std::vector<std::pair<Reduction, at::Reduction::Reduction>> pairs = {
        {torch::kNone, at::Reduction::None},
        {torch::kSum, at::Reduction::Sum},
        {torch::kMean, at::Reduction::Mean},
        {torch::kBatchMean, at::Reduction::Mean}};
    for (const auto& [ours, theirs] : pairs) {
      SCOPED_TRACE(std::string(reduction_name(ours)) + " " + dev.str());
      const at::Tensor a = x.clone().set_requires_grad(true), b = x.clone().set_requires_grad(true);
      const at::Tensor la = lossfns::cross_entropy_loss(a, labels, options(ours));
      const at::Tensor lb = at::cross_entropy_loss(b, labels, {}, theirs, kDefaultIgnoreIndex);
      EXPECT_TRUE(all_close(la, lb, 1e-5, 1e-5));
      const at::Tensor go = at::rand_like(la) + 0.5;
      la.backward(go);
      lb.backward(go);
      EXPECT_TRUE(all_close(a.grad(), b.grad(), 1e-4, 1e-7));
    }
    EXPECT_EQ(CrossEntropyLossOptions().reduction().index(),
              Reduction(torch::kMean).index());  // torch's default
  }
}

TEST(CrossEntropyLoss, AllIgnoredAndEmptyBatchesGiveZeroNotNaN) {
  for (const auto& dev : devices())
    for (const Reduction& red : kReductions) {
      SCOPED_TRACE(std::string(reduction_name(red)) + " " + dev.str());
      const at::Tensor x = at::randn({3, 20}, at::TensorOptions(dev)).set_requires_grad(true);
      const at::Tensor labels =
          at::full({3}, kDefaultIgnoreIndex, at::TensorOptions(dev).dtype(at::kLong));
      const at::Tensor loss = lossfns::cross_entropy_loss(x, labels, options(red));
      loss.backward(at::ones_like(loss));
      EXPECT_EQ(loss.abs().max().item<double>(), 0.0);
      EXPECT_EQ(x.grad().abs().max().item<double>(), 0.0);
      const at::Tensor e = at::randn({0, 20}, at::TensorOptions(dev)).set_requires_grad(true);
      const at::Tensor le = lossfns::cross_entropy_loss(
          e, at::zeros({0}, at::TensorOptions(dev).dtype(at::kLong)), options(red));
      le.backward(at::ones_like(le));
      EXPECT_EQ(le.numel(), std::holds_alternative<torch::enumtype::kNone>(red) ? 0 : 1);
      if (le.numel()) {
        EXPECT_EQ(le.item<double>(), 0.0);
      }
      EXPECT_EQ(e.grad().sizes(), e.sizes());
    }
}

TEST(CrossEntropyLoss, PaddingColumnsAreNeverReadAndGetZeroGradient) {
  // Columns at or past vocab_size hold NaN, -inf, +inf, 1e4: the result is the unpadded one
  // exactly, and their gradient is exactly 0.
  at::manual_seed(3);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + dev.str());
      at::Tensor x = at::randn({5, 41}, at::kDouble);
      fill_padding(x, 33);
      x = x.to(dev, dtype);
      const at::Tensor labels = make_labels(5, 33, true, dev);
      const at::Tensor a = x.clone().set_requires_grad(true);
      const at::Tensor b = x.narrow(1, 0, 33).clone().set_requires_grad(true);
      const at::Tensor la = lossfns::cross_entropy_loss(a, labels, options(torch::kSum, 33));
      const at::Tensor lb = lossfns::cross_entropy_loss(b, labels, options(torch::kSum));
      EXPECT_EQ(la.item<double>(), lb.item<double>());
      la.backward();
      lb.backward();
      EXPECT_TRUE(at::equal(a.grad().narrow(1, 0, 33), b.grad()));
      EXPECT_EQ(a.grad().narrow(1, 33, 8).abs().max().item<double>(), 0.0);
      // vocab_size past the width counts every column.
      EXPECT_EQ(lossfns::cross_entropy_loss(b.detach(), labels, options(torch::kSum, 1000))
                    .item<double>(),
                lb.item<double>());
    }
}

TEST(CrossEntropyLoss, NegativeInfinityLogitsAreSafe) {
  // -inf columns (masked tokens) have p = 0 exactly: gradient exactly 0, never NaN. A target at
  // -inf has probability 0: loss +inf, gradient finite (-grad_output there), as the reference's.
  at::manual_seed(4);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev)) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + dev.str());
      at::Tensor x = at::randn({6, 300}, at::kDouble) * 2;
      at::Tensor labels = at::randint(0, 100, {6}, at::kLong) * 3 + 1;  // never a multiple of 3
      for (int64_t j = 0; j < 300; j += 3) x.select(1, j).fill_(-kInf);
      labels[5] = 0;  // this row's target is -inf
      x = x.to(dev, dtype);
      labels = labels.to(dev);
      for (const Reduction& red : kReductions)
        EXPECT_TRUE(matches_reference(x, labels, options(red), grad_output(red, 6)))
            << reduction_name(red);
      const at::Tensor xl = x.clone().set_requires_grad(true);
      const at::Tensor loss = lossfns::cross_entropy_loss(xl, labels, options(torch::kNone));
      loss.backward(at::ones_like(loss));
      const at::Tensor g = xl.grad().cpu().to(at::kDouble);
      EXPECT_FALSE(g.isnan().any().item<bool>());
      EXPECT_EQ(g.narrow(0, 0, 5)
                    .index({at::indexing::Slice(), at::indexing::Slice(0, at::indexing::None, 3)})
                    .abs()
                    .max()
                    .item<double>(),
                0.0);
      EXPECT_EQ(loss[5].item<double>(), kInf);
      EXPECT_EQ(g[5][0].item<double>(), -1.0);
      EXPECT_TRUE(std::isfinite(loss.narrow(0, 0, 5).sum().item<double>()));
    }
}

TEST(CrossEntropyLoss, LowestFiniteMaskValuesWeighZero) {
  // Columns masked with the dtype's lowest finite value (torch.finfo(dtype).min, a common way to
  // ban tokens) have p = 0 as -inf ones: the reference's loss and gradient, never NaN. On CUDA
  // the logits are scaled by log2(e), and bfloat16's and float32's lowest overflow to -inf there;
  // float16's stays finite. A row masked whole, or a target at the mask, differs between the
  // devices (docs/cross_entropy.md) and is not tested here.
  at::manual_seed(41);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev)) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + dev.str());
      const double lowest = dtype == at::kFloat ? double(std::numeric_limits<float>::lowest())
                            : dtype == at::kBFloat16
                                ? double(std::numeric_limits<c10::BFloat16>::lowest())
                                : double(std::numeric_limits<c10::Half>::lowest());
      at::Tensor x = at::randn({6, 1000}, at::kDouble) * 2;
      x.narrow(1, 0, 512).fill_(lowest);   // every CUDA thread's first vector, and more
      x.narrow(1, 700, 37).fill_(lowest);  // a run that starts and ends inside vectors
      at::Tensor labels = at::randint(520, 690, {6}, at::kLong);
      x = x.to(dev, dtype);
      labels = labels.to(dev);
      for (const Reduction& red : kReductions)
        EXPECT_TRUE(matches_reference(x, labels, options(red), grad_output(red, 6)))
            << reduction_name(red);
      const at::Tensor xl = x.clone().set_requires_grad(true);
      const at::Tensor loss = lossfns::cross_entropy_loss(xl, labels, options(torch::kNone));
      loss.backward(at::ones_like(loss));
      EXPECT_TRUE(loss.isfinite().all().item<bool>()) << loss;
      EXPECT_TRUE(xl.grad().isfinite().all().item<bool>());
      EXPECT_EQ(xl.grad().narrow(1, 0, 512).abs().max().item<double>(), 0.0);
    }
}

// A float32 row of 2^20 columns on the CPU: the sum of exp runs in float over blocks that add up
// in double (distill_cpu_kernel.h), within a float rounding or two of float64's cross-entropy.
TEST(CrossEntropyLoss, LongFloat32RowsSumAccuratelyOnTheCpu) {
  at::manual_seed(22);
  const at::Tensor x = at::randn({2, int64_t{1} << 20}) * 2;
  const at::Tensor labels = at::tensor(std::vector<int64_t>{3, 700000}, at::kLong);
  const at::Tensor loss = lossfns::cross_entropy_loss(x, labels, options(torch::kNone));
  const at::Tensor expected =
      at::cross_entropy_loss(x.to(at::kDouble), labels, {}, at::Reduction::None);
  EXPECT_TRUE(all_close(loss, expected, 1e-6, 0)) << loss << expected;
}

TEST(CrossEntropyLoss, NaNPropagatesToItsRowOnly) {
  // A NaN logit makes its row's loss and gradient NaN (as the reference's), not its neighbours';
  // in an ignored row it changes nothing. A row without mass (all -inf) has a NaN loss and a NaN
  // gradient at every column but the padding.
  for (const auto& dev : devices()) {
    at::Tensor x = at::randn({4, 50}, at::TensorOptions(dev));
    x[1][7] = std::nan("");
    x[2][3] = std::nan("");
    x[3].fill_(-kInf);
    const at::Tensor labels =
        at::tensor(std::vector<int64_t>{0, 1, kDefaultIgnoreIndex, 2}, at::kLong).to(dev);
    EXPECT_TRUE(matches_reference(x.narrow(0, 0, 3), labels.narrow(0, 0, 3), options(torch::kNone),
                                  at::ones({3}, at::kDouble)));
    const at::Tensor loss = lossfns::cross_entropy_loss(x, labels, options(torch::kNone)).cpu();
    EXPECT_TRUE(std::isfinite(loss[0].item<double>()));
    EXPECT_TRUE(std::isnan(loss[1].item<double>()));
    EXPECT_EQ(loss[2].item<double>(), 0.0);
    EXPECT_TRUE(std::isnan(loss[3].item<double>()));
    EXPECT_TRUE(std::isnan(lossfns::cross_entropy_loss(x, labels).item<double>()));
    for (int64_t vocab : {int64_t{50}, int64_t{40}}) {
      const at::Tensor a = x.clone().set_requires_grad(true);
      lossfns::cross_entropy_loss(a, labels, options(torch::kNone).vocab_size(vocab))
          .narrow(0, 3, 1)
          .sum()
          .backward();
      const at::Tensor g = a.grad().cpu();
      EXPECT_TRUE(g[3].narrow(0, 0, vocab).isnan().all().item<bool>()) << dev << " " << vocab;
      EXPECT_EQ(g[3].narrow(0, vocab, 50 - vocab).abs().sum().item<double>(), 0.0) << dev;
      EXPECT_EQ(g[0].abs().max().item<double>(), 0.0) << dev;  // grad_output 0 (row 1: NaN)
    }
  }
}

TEST(CrossEntropyLoss, ThreeDimensionalAndNonContiguousInputs) {
  at::manual_seed(5);
  for (const auto& dev : devices()) {
    const at::Tensor x = at::randn({5, 3, 70}, at::TensorOptions(dev))
                             .transpose(0, 1);  // (3, 5, 70), not a view of rows
    at::Tensor labels = at::randint(0, 70, {3, 5}, at::TensorOptions(dev).dtype(at::kLong));
    labels[1][2] = kDefaultIgnoreIndex;
    for (const Reduction& red : kReductions)
      EXPECT_TRUE(matches_reference(x, labels, options(red), grad_output(red, 15)))
          << reduction_name(red);
    const at::Tensor a = x.clone().set_requires_grad(true),
                     b = x.contiguous().set_requires_grad(true);
    const at::Tensor la = lossfns::cross_entropy_loss(a, labels, options(torch::kNone));
    const at::Tensor lb = lossfns::cross_entropy_loss(b, labels.reshape({-1}),
                                                      options(torch::kNone));  // (BT,) labels
    EXPECT_EQ(la.sizes(), (std::vector<int64_t>{3, 5}));
    EXPECT_TRUE(at::equal(la, lb));
    la.sum().backward();
    lb.sum().backward();
    EXPECT_EQ(a.grad().sizes(), x.sizes());
    EXPECT_TRUE(at::equal(a.grad(), b.grad()));
  }
}

TEST(CrossEntropyLoss, GradcheckInFloat64) {
  // Central differences of the op's own loss (float64: the CPU's libm path) against its gradient,
  // for every reduction, with an ignored row and a padding column. (CUDA has no float64 kernels.)
  at::manual_seed(6);
  const at::Tensor x = at::randn({4, 9}, at::kDouble);
  const at::Tensor labels =
      at::tensor(std::vector<int64_t>{3, kDefaultIgnoreIndex, 0, 7}, at::kLong);
  for (const Reduction& red : kReductions) {
    SCOPED_TRACE(reduction_name(red));
    const auto o = options(red, 8);
    const at::Tensor w = at::rand({4}, at::kDouble);  // weights the 'none' rows
    auto f = [&](const at::Tensor& in) {
      const at::Tensor l = lossfns::cross_entropy_loss(in, labels, o);
      return (l.dim() ? (l * w).sum() : l).item<double>();
    };
    const at::Tensor xl = x.clone().set_requires_grad(true);
    const at::Tensor l = lossfns::cross_entropy_loss(xl, labels, o);
    (l.dim() ? (l * w).sum() : l).backward();
    const double h = 1e-6;
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 9; ++j) {
        at::Tensor xp = x.clone(), xm = x.clone();
        xp[i][j] += h;
        xm[i][j] -= h;
        EXPECT_NEAR(xl.grad()[i][j].item<double>(), (f(xp) - f(xm)) / (2 * h), 1e-8)
            << i << ", " << j;
      }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(CrossEntropyLoss, BadInputsAreErrorsNamingWhatWasExpectedAndFound) {
  const at::Tensor x = at::randn({4, 10}),
                   labels =
                       at::tensor(std::vector<int64_t>{1, 2, kDefaultIgnoreIndex, 9}, at::kLong);
  auto err = [&](const at::Tensor& a, const at::Tensor& l, CrossEntropyLossOptions o = {}) {
    return error_of([&] { lossfns::cross_entropy_loss(a, l, o); });
  };
  auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "'" << p << "' not in: " << msg;
    return ::testing::AssertionSuccess();
  };
  EXPECT_EQ(err(x, labels), "");  // a good call is none
  EXPECT_TRUE(has(err(x, at::tensor(std::vector<int64_t>{1, 2, 3, 10}, at::kLong)),
                  {"labels must be in [0, 10)", "got 10 at row 3", "[4, 10]"}));
  EXPECT_TRUE(has(err(x, at::tensor(std::vector<int64_t>{1, -1, 3, 4}, at::kLong)),
                  {"got -1 at row 1", "ignore_index (-100)"}));
  EXPECT_TRUE(has(err(x, labels, CrossEntropyLossOptions().vocab_size(8)),
                  {"[0, 8)", "vocab_size", "got 9 at row 3"}));
  EXPECT_TRUE(has(err(x, labels, CrossEntropyLossOptions().ignore_index(9)),
                  {"got -100 at row 2", "ignore_index (9)"}));
  EXPECT_TRUE(has(err(x, at::zeros({5}, at::kLong)), {"labels must have shape [4]", "got [5]"}));
  EXPECT_TRUE(has(err(x.view({2, 2, 10}), at::zeros({4, 1}, at::kLong)),
                  {"[2, 2] (the shape of logits without its last dimension) or (4,)", "got [4, 1]",
                   "flatten them with reshape(-1)"}));
  EXPECT_TRUE(
      has(err(x, at::zeros({2, 2}, at::kLong)),
          {"labels must have shape [4] (the shape of logits without its last dimension); got "
           "[2, 2] (the same number of labels: flatten them with reshape(-1))"}));
  EXPECT_TRUE(
      has(err(x, labels.to(at::kInt)), {"labels must be int64", "got Int", "Float [4, 10]"}));
  EXPECT_TRUE(has(err(x.to(at::kInt), labels), {"logits must be one of", "got Int"}));
  EXPECT_TRUE(has(err(x.view({40}), labels), {"(BT, V) or (B, T, V)", "[40]", "labels [4]"}));
  EXPECT_TRUE(has(err(x.view({1, 2, 2, 10}), labels), {"(BT, V) or (B, T, V)", "[1, 2, 2, 10]"}));
  EXPECT_TRUE(has(err(at::randn({4, 0}), labels), {"must be > 0", "[4, 0]"}));
  EXPECT_TRUE(has(err(x, labels, CrossEntropyLossOptions().vocab_size(0)),
                  {"vocab_size must be >= 1", "got 0"}));
  EXPECT_TRUE(has(err(x, at::Tensor()), {"must be defined"}));
  // The registered op's string reduction.
  const auto op = c10::Dispatcher::singleton()
                      .findSchemaOrThrow("lossfns::cross_entropy_loss", "")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                        c10::string_view, std::optional<int64_t>)>();
  EXPECT_TRUE(has(error_of([&] { op.call(x, labels, -100, "avg", std::nullopt); }),
                  {"reduction must be one of", "'avg'"}));
}

}  // namespace
}  // namespace lossfns::testing

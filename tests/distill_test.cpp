// lossfns::distill_loss against the float64 reference (distill_reference.h): loss and gradient,
// swept over devices, dtypes, divergences, reductions, shapes, strides, widths, padding, ties,
// -inf columns and extreme temperatures; the exactness rules; the errors. CUDA cases skip without
// a GPU.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/modules/container/any.h>

#include "common.h"  // cpu_isa(): which CPU build of the kernels runs
#include "distill_reference.h"
#include "lossfns/cross_entropy.h"
#include "lossfns/distill.h"
#include "lossfns/distill_module.h"
#include "lossfns/tvd.h"
#include "tvd_reference.h"  // all_close, error_of

namespace lossfns::testing {
namespace {

constexpr std::array<Divergence, 4> kAll = {Divergence::kTvd, Divergence::kForwardKl,
                                            Divergence::kReverseKl, Divergence::kJsd};
const double kInf = std::numeric_limits<double>::infinity();

std::vector<at::Device> devices() {
  std::vector<at::Device> d = {at::kCPU};
  if (torch::cuda::is_available()) d.emplace_back(at::kCUDA);
  return d;
}
std::vector<at::ScalarType> dtypes(const at::Device& d) {
  if (d.is_cuda()) return {at::kFloat, at::kBFloat16, at::kHalf};
  return {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf};
}

// A requires-grad leaf holding x's values.
at::Tensor leaf(const at::Tensor& x) { return x.detach().clone().set_requires_grad(true); }

// One case of the sweep.
struct Case {
  int64_t rows, ws, wt;
  std::optional<int64_t> vocab_size;
  std::string pattern;  // "random" | "tied" | "partial" | "neginf" | "large"
  double temperature = 1.0;
  bool strided = false, labels = false;
};
std::string describe(const Case& c) {
  std::ostringstream o;
  o << c.rows << "x(" << c.ws << "," << c.wt << ") vocab "
    << (c.vocab_size ? std::to_string(*c.vocab_size) : "-") << " " << c.pattern
    << " T=" << c.temperature << (c.strided ? " strided" : "") << (c.labels ? " labels" : "");
  return o.str();
}

// Student and teacher logits of the case, in double on the CPU (the dtype cast comes later).
std::pair<at::Tensor, at::Tensor> make_logits(const Case& c) {
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  at::Tensor s = at::randn({c.rows, c.ws}, dbl) * 2, t = at::randn({c.rows, c.wt}, dbl) * 2;
  const int64_t n = std::min(c.ws, c.wt);
  if (c.pattern == "tied") {
    t.narrow(1, 0, n).copy_(s.narrow(1, 0, n));
  } else if (c.pattern == "partial") {
    // Ties at the probability level on non-zero probabilities, beside elements that differ: the
    // teacher is the student except every 4th column of the first half, where the student's
    // logit is its row's max - 46 and the teacher's max - 47 (probabilities ~1e-20 and ~4e-21,
    // non-zero in float too). Such terms vanish in the normalisers' sums (every other term is
    // >= 1e-4 of the sum), so both normalisers are bit-identical in any summation order, and the
    // other columns' p and q are too: exact ties, in the kernels and in the reference alike.
    t.narrow(1, 0, n).copy_(s.narrow(1, 0, n));
    const at::Tensor mx = std::get<0>(s.max(1));
    for (int64_t j = 0; j < n / 2; j += 4) {
      s.select(1, j).copy_(mx - 46);
      t.select(1, j).copy_(mx - 47);
    }
  } else if (c.pattern == "probtie") {
    // Ties at the probability level with different logits: every 3rd column is -2000 in the
    // student and -3000 in the teacher (p = q = 0 exactly), the rest identical.
    t.narrow(1, 0, n).copy_(s.narrow(1, 0, n));
    for (int64_t j = 0; j < n; j += 3) {
      s.select(1, j).fill_(-2000);
      t.select(1, j).fill_(-3000);
    }
  } else if (c.pattern == "neginf") {
    // Every 3rd column -inf in both, every 5th in the teacher only (documented per divergence;
    // the sweep uses it only where the result is finite: tvd, forward_kl, jsd).
    for (int64_t j = 0; j < n; j += 3) {
      s.select(1, j).fill_(-kInf);
      t.select(1, j).fill_(-kInf);
    }
    for (int64_t j = 1; j < c.wt; j += 5) t.select(1, j).fill_(-kInf);
  } else if (c.pattern == "large") {
    s = s * 40;
    t = t * 40;
  }
  return {s, t};
}

// Rows and a (B, T) shape over them; strided: a view into a wider buffer (row stride > width).
at::Tensor place(const at::Tensor& x, at::ScalarType dtype, const at::Device& dev, bool strided) {
  at::Tensor y = x.to(dev, dtype);
  if (!strided) return y;
  at::Tensor wide = at::full({x.size(0), x.size(1) + 9}, 7.0, y.options());
  wide.narrow(1, 3, x.size(1)).copy_(y);
  return wide.narrow(1, 3, x.size(1));
}

struct Tol {
  double loss_rtol, loss_atol, grad_rtol, grad_atol_rel;
};
Tol tolerance(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return {1e-10, 1e-12, 1e-9, 1e-13};
    case at::kFloat:
      return {2e-4, 2e-6, 2e-4, 2e-5};
    case at::kHalf:
      return {2e-4, 2e-6, 2e-3, 2e-4};
    default:
      return {2e-4, 2e-6, 1.6e-2, 1e-3};  // bfloat16: one rounding of the gradient
  }
}

void run_case(const Case& c, Divergence div, const at::Device& dev, at::ScalarType dtype,
              const std::string& red) {
  SCOPED_TRACE(describe(c) + " " + divergence_name(div) + " " + c10::toString(dtype) + " " +
               dev.str() + " " + red);
  auto [s64, t64] = make_logits(c);
  at::Tensor s = place(s64, dtype, dev, c.strided), t = place(t64, dtype, dev, c.strided);
  at::Tensor labels, valid = at::ones({c.rows}, at::kBool);
  if (c.labels) {
    labels = at::randint(0, 10, {c.rows}, at::kLong);
    labels.index_put_({at::arange(c.rows) % 3 == 1}, kDefaultIgnoreIndex);
    valid = labels.ne(kDefaultIgnoreIndex);
    labels = labels.to(dev);
  }
  const int64_t V = std::min(c.vocab_size.value_or(std::max(c.ws, c.wt)), std::max(c.ws, c.wt));
  const int64_t n_valid = valid.sum().item<int64_t>();
  const double beta = 0.3;
  DistillLossOptions o;
  o.divergence(div).beta(beta).temperature(c.temperature).vocab_size(c.vocab_size);
  at::Tensor go =
      red == "none" ? at::rand({c.rows}, at::kDouble) + 0.5 : at::full({}, 0.75, at::kDouble);
  double scale = 1.0;
  if (red == "sum") o.reduction(torch::kSum);
  if (red == "mean")
    o.reduction(torch::kMean), scale = n_valid ? 1.0 / (double(n_valid) * double(V)) : 0.0;
  if (red == "batchmean")
    o.reduction(torch::kBatchMean), scale = n_valid ? 1.0 / double(n_valid) : 0.0;
  if (red == "none") o.reduction(torch::kNone);

  // The reference on the values the op sees (after rounding to dtype).
  const at::Tensor weight = red == "none" ? go : go.expand({c.rows}) * scale;
  const RefResult ref =
      reference_distill(s.cpu(), t.cpu(), div, beta, c.temperature, V, valid, weight);

  at::Tensor sl = leaf(s);
  at::Tensor loss =
      distill_loss(sl, t, o, c.labels ? std::optional<at::Tensor>(labels) : std::nullopt);
  const Tol tol = tolerance(dtype);
  const at::Tensor ref_loss = red == "none" ? ref.row_loss : ref.row_loss.sum() * scale;
  EXPECT_EQ(loss.scalar_type(), dtype == at::kDouble ? at::kDouble : at::kFloat);
  EXPECT_EQ(loss.dim(), red == "none" ? 1 : 0);
  EXPECT_TRUE(
      all_close(loss, ref_loss, tol.loss_rtol, tol.loss_atol * std::max<double>(1.0, c.rows)));
  loss.backward(go.to(loss.options()));
  // The gradient's natural scale: the row weight / T, times kappa, the logits' magnitude after
  // the temperature (lp = a - logsumexp(a) loses |a| * eps absolutely: T = 1e-3 or logits of
  // +-300 cost that many digits in any float implementation, the composite included).
  const double kappa =
      std::max(1.0, s64.abs().nan_to_num(0, 0, 0).max().item<double>() / c.temperature / 10);
  const double gscale = weight.abs().max().item<double>() / c.temperature * kappa;
  EXPECT_EQ(sl.grad().scalar_type(), dtype);
  // fp16 gradients below 2^-14 are subnormal, spaced 2^-24: rounding there is absolute.
  const double subnormal = dtype == at::kHalf ? 0x1p-24 : 0.0;
  EXPECT_TRUE(all_close(sl.grad(), ref.grad, tol.grad_rtol * kappa,
                        tol.grad_atol_rel * gscale + subnormal));
  if (c.pattern == "tied" || c.pattern == "probtie") {  // exactly 0, not merely small
    EXPECT_EQ(loss.abs().max().item<double>(), 0.0);
    EXPECT_EQ(sl.grad().abs().max().item<double>(), 0.0);
  }
}

// ctest runs this file under LOSSFNS_CPU_CAPABILITY=default and =avx2 as well
// (tests/CMakeLists.txt): the kernels those runs check must be the builds asked for.
TEST(DistillCpuIsa, RunsTheRequestedBuild) {
  const char* want = std::getenv("LOSSFNS_CPU_CAPABILITY");
  const std::string got = detail::cpu_isa_name(detail::cpu_isa());
  std::printf("CPU build of the kernels: %s\n", got.c_str());
  if (want == nullptr || *want == '\0') return;
  if (got != want) {
    const std::string w(want);
    const bool narrower = w == "default" || (w == "avx2" && got == "avx512");
    ASSERT_FALSE(narrower) << "asked for " << w << ", got " << got;
    GTEST_SKIP() << "this CPU or build has no " << w << " (it runs " << got << ")";
  }
}

TEST(DistillReference, GradientIsTheLossDerivative) {
  // Central differences of the reference loss in double, away from ties (random logits), with a
  // padded column and temperature 1.7: the closed-form gradient the sweep trusts is the loss's.
  at::manual_seed(1);
  const at::Tensor s = at::randn({3, 9}, at::kDouble), t = at::randn({3, 9}, at::kDouble);
  const at::Tensor valid = at::ones({3}, at::kBool), w = at::ones({3}, at::kDouble);
  for (Divergence div : kAll) {
    SCOPED_TRACE(divergence_name(div));
    const RefResult r = reference_distill(s, t, div, 0.3, 1.7, 8, valid, w);
    const double h = 1e-6;
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 9; ++j) {
        at::Tensor sp = s.clone(), sm = s.clone();
        sp[i][j] += h;
        sm[i][j] -= h;
        const double fd =
            (reference_distill(sp, t, div, 0.3, 1.7, 8, valid, w).row_loss.sum().item<double>() -
             reference_distill(sm, t, div, 0.3, 1.7, 8, valid, w).row_loss.sum().item<double>()) /
            (2 * h);
        EXPECT_NEAR(r.grad[i][j].item<double>(), fd, 1e-7) << "row " << i << " column " << j;
      }
    }
  }
}

TEST(DistillLoss, MatchesTheFloat64ReferenceAcrossTheSweep) {
  at::manual_seed(0);
  const std::vector<Case> cases = {
      {1, 1, 1, std::nullopt, "random"},
      {13, 7, 7, std::nullopt, "random", 1.0, false, true},
      {5, 255, 255, std::nullopt, "random", 2.0, true, false},
      {6, 256, 256, 200, "random", 1.0, false, true},    // padded vocabulary
      {7, 300, 260, std::nullopt, "random"},             // the teacher is narrower
      {3, 1000, 1200, 1100, "random", 0.5, true, true},  // wider teacher, padding past 1100
      {4, 64, 64, std::nullopt, "tied"},
      {4, 200, 200, std::nullopt, "partial"},
      {5, 100, 100, std::nullopt, "probtie", 0.5},
      {4, 500, 500, std::nullopt, "random", 1e-3},  // most probabilities underflow to exactly 0
      {4, 500, 500, std::nullopt, "random", 100.0},
      {4, 500, 500, std::nullopt, "large"},
      {3, 32000, 32000, std::nullopt, "random", 1.0, false, true},
      {2, 151936, 151936, std::nullopt, "random"},
  };
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev))
      for (const Case& c : cases)
        for (Divergence div : kAll)
          for (const char* red : {"sum", "batchmean", "mean", "none"}) {
            if (c.rows * std::max(c.ws, c.wt) > 100000 &&
                (std::string(red) != "batchmean" || dtype == at::kHalf))
              continue;  // the big shapes once per dtype and divergence
            run_case(c, div, dev, dtype, red);
          }
}

TEST(DistillLoss, NegativeInfinityColumnsAreExactlyZeroAndNeverNaN) {
  // -inf in both: no term, gradient exactly 0. The teacher -inf alone: finite for tvd, forward_kl
  // and jsd (reverse_kl is +inf there by definition: docs/distill.md).
  at::manual_seed(2);
  const Case c{6, 300, 300, std::nullopt, "neginf", 1.0, false, true};
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev))
      for (Divergence div : {Divergence::kTvd, Divergence::kForwardKl, Divergence::kJsd}) {
        run_case(c, div, dev, dtype, "sum");
        auto [s64, t64] = make_logits(c);
        at::Tensor s = leaf(s64.to(dev, dtype));
        distill_loss(s, t64.to(dev, dtype),
                     DistillLossOptions().divergence(div).reduction(torch::kSum))
            .backward();
        const at::Tensor g = s.grad().cpu().to(at::kDouble);
        EXPECT_FALSE(g.isnan().any().item<bool>());
        EXPECT_EQ(g.index({at::indexing::Slice(), at::indexing::Slice(0, at::indexing::None, 3)})
                      .abs()
                      .max()
                      .item<double>(),
                  0.0);
      }
}

// A row -inf everywhere on one side has no distribution (docs/distill.md): its loss and its
// gradient are NaN at every column, as the composite's (softmax of an all -inf row is NaN), for
// every divergence (a KL or JSD term whose weight is 0 would drop a NaN probability: the kernels
// must not let it). The NaN stays in its row, and with ignore_index the row is nothing at all. A
// row -inf everywhere on both sides is padding: loss 0, gradient 0.
TEST(DistillLoss, RowsWithoutMassStayInTheirRow) {
  at::manual_seed(12);
  for (const auto& dev : devices())
    for (Divergence div : kAll) {
      const auto opts = at::TensorOptions(dev);
      const at::Tensor s0 = at::randn({4, 33}, opts), t0 = at::randn({4, 33}, opts);
      at::Tensor s1 = s0.clone(), t1 = t0.clone();
      t1[0].fill_(-kInf);  // no teacher mass
      s1[0][5] = -kInf;    // (a -inf column on the side with mass: p = q = 0 there)
      s1[1].fill_(-kInf);  // no student mass
      t1[1][7] = -kInf;
      s1[2].fill_(-kInf);  // neither
      t1[2].fill_(-kInf);
      const auto o = DistillLossOptions().divergence(div).reduction(torch::kNone);
      at::Tensor a = leaf(s1), b = leaf(s0.narrow(0, 3, 1));
      const at::Tensor la = distill_loss(a, t1, o), lb = distill_loss(b, t0.narrow(0, 3, 1), o);
      la.sum().backward();
      lb.sum().backward();
      const std::string what = std::string(divergence_name(div)) + " " + dev.str();
      EXPECT_TRUE(at::equal(la.narrow(0, 3, 1), lb)) << what;
      EXPECT_TRUE(at::equal(a.grad().narrow(0, 3, 1), b.grad())) << what;
      for (int64_t r : {0, 1}) {
        EXPECT_TRUE(std::isnan(la[r].item<double>())) << what << " row " << r;
        EXPECT_TRUE(a.grad()[r].isnan().all().item<bool>()) << what << " row " << r;
      }
      EXPECT_EQ(la[2].item<double>(), 0.0) << what;
      EXPECT_EQ(a.grad()[2].abs().max().item<double>(), 0.0) << what;
      // The float64 reference says the same, row by row.
      const RefResult ref = reference_distill(s1.cpu(), t1.cpu(), div, 0.5, 1.0, 33,
                                              at::ones({4}, at::kBool), at::ones({4}, at::kDouble));
      EXPECT_TRUE(all_close(la, ref.row_loss, 1e-5, 1e-6)) << what;
      EXPECT_TRUE(all_close(a.grad(), ref.grad, 1e-5, 1e-6)) << what;
      // With grad_scale (on CUDA the forward writes the gradient): the same rows.
      at::Tensor d = leaf(s1);
      distill_loss(d, t1, DistillLossOptions().divergence(div).grad_scale(at::ones({1}, opts)))
          .backward();
      for (int64_t r : {0, 1})
        EXPECT_TRUE(d.grad()[r].isnan().all().item<bool>()) << what << " grad_scale row " << r;
      EXPECT_EQ(d.grad()[2].abs().max().item<double>(), 0.0) << what << " grad_scale";
      EXPECT_TRUE(d.grad()[3].isfinite().all().item<bool>()) << what << " grad_scale";
      // A teacher narrower than the student (its missing columns are -inf), and padding past
      // vocab_size, which stays exactly 0.
      at::Tensor sw = at::randn({2, 9}, opts), tw = at::randn({2, 5}, opts);
      tw[0].fill_(-kInf);
      sw[1].fill_(-kInf);
      for (bool hint : {false, true}) {
        auto ow = DistillLossOptions().divergence(div).vocab_size(8);
        if (hint) ow.grad_scale(at::ones({1}, opts));
        at::Tensor e = leaf(sw);
        const at::Tensor le = distill_loss(e, tw, ow);
        le.backward();
        EXPECT_TRUE(std::isnan(le.item<double>())) << what << " widths";
        EXPECT_TRUE(e.grad().narrow(1, 0, 8).isnan().all().item<bool>()) << what << " widths";
        EXPECT_EQ(e.grad().narrow(1, 8, 1).abs().max().item<double>(), 0.0) << what << " widths";
      }
      // Ignored, they are not there: the batch mean over row 3 alone, its gradient alone.
      const at::Tensor labels =
          at::tensor({kDefaultIgnoreIndex, kDefaultIgnoreIndex, kDefaultIgnoreIndex, int64_t{5}},
                     opts.dtype(at::kLong));
      at::Tensor c = leaf(s1);
      const at::Tensor lc = distill_loss(c, t1, DistillLossOptions().divergence(div), labels);
      lc.backward();
      EXPECT_TRUE(at::equal(lc, lb.sum())) << what;
      EXPECT_EQ(c.grad().narrow(0, 0, 3).abs().max().item<double>(), 0.0) << what;
      EXPECT_TRUE(at::equal(c.grad().narrow(0, 3, 1), b.grad())) << what;
    }
}

// A float32 row of 2^20 columns on the CPU: the row sums run in float over blocks and add up in
// double, so every ISA build (ctest runs this file under each) stays within a few float
// roundings of the float64 reference. (One float sum per vector lane over the whole row erred by
// ~1e-3 relative in the baseline build.)
TEST(DistillLoss, LongFloat32RowsSumAccuratelyOnTheCpu) {
  at::manual_seed(21);
  const int64_t V = int64_t{1} << 20;
  const at::Tensor s = at::randn({2, V}) * 2, t = at::randn({2, V}) * 2;
  for (Divergence div : kAll) {
    const at::Tensor loss =
        distill_loss(s, t, DistillLossOptions().divergence(div).reduction(torch::kNone));
    const RefResult ref = reference_distill(s, t, div, 0.5, 1.0, V, at::ones({2}, at::kBool),
                                            at::ones({2}, at::kDouble));
    EXPECT_TRUE(all_close(loss, ref.row_loss, 2e-6, 0)) << divergence_name(div);
  }
}

TEST(DistillLoss, ReverseKlIsInfiniteWhereOnlyTheTeacherIsNegativeInfinity) {
  for (const auto& dev : devices()) {
    at::Tensor s = at::zeros({1, 4}, at::TensorOptions(dev));
    at::Tensor t = at::zeros({1, 4}, at::TensorOptions(dev));
    t[0][1] = -kInf;
    const auto o = DistillLossOptions().divergence(Divergence::kReverseKl);
    EXPECT_EQ(distill_loss(s, t, o).item<double>(), kInf);
    // ... and forward KL is +inf where only the student is -inf.
    EXPECT_EQ(
        distill_loss(t, s, DistillLossOptions().divergence(Divergence::kForwardKl)).item<double>(),
        kInf);
  }
}

TEST(DistillLoss, KlTermsThatUnderflowAreZeroAndNaNRowsAreNaN) {
  // A column where the weighting distribution's probability underflows to 0 while the other is
  // -inf adds 0, not +inf or NaN (the CUDA forward's one-pass KLs decide this after the row's
  // normaliser is known, wherever the column lies); a row of NaN gives NaN, never 0 or +inf.
  at::manual_seed(6);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev))
      for (int64_t col : {int64_t{0}, int64_t{37}}) {
        SCOPED_TRACE(dev.str() + " " + c10::toString(dtype) + " column " + std::to_string(col));
        const at::Tensor a = at::randn({3, 64}, at::kDouble) * 2,
                         b = at::randn({3, 64}, at::kDouble) * 2;
        for (Divergence div : {Divergence::kForwardKl, Divergence::kReverseKl}) {
          // forward KL weighs by the teacher, reverse KL by the student
          const bool rev = div == Divergence::kReverseKl;
          at::Tensor w_low = (rev ? a : b).clone(), o_inf = (rev ? b : a).clone();
          w_low.select(1, col).fill_(-1e4);
          o_inf.select(1, col).fill_(-kInf);
          at::Tensor w_inf = w_low.clone();
          w_inf.select(1, col).fill_(-kInf);
          const auto o = DistillLossOptions().divergence(div).reduction(torch::kNone);
          auto loss = [&](const at::Tensor& w, const at::Tensor& other) {
            const at::Tensor s = (rev ? w : other).to(dev, dtype),
                             t = (rev ? other : w).to(dev, dtype);
            return distill_loss(s, t, o).cpu().to(at::kDouble);
          };
          const at::Tensor low = loss(w_low, o_inf), none = loss(w_inf, o_inf);
          EXPECT_TRUE(low.isfinite().all().item<bool>()) << divergence_name(div) << " " << low;
          EXPECT_TRUE(at::allclose(low, none, 1e-6, 1e-7))
              << divergence_name(div) << " " << low << " vs " << none;
          at::Tensor w_nan = (rev ? a : b).clone();
          w_nan.select(0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
          const at::Tensor nan_rows = loss(w_nan, rev ? b : a);
          EXPECT_TRUE(std::isnan(nan_rows[1].item<double>()))
              << divergence_name(div) << " " << nan_rows;
          EXPECT_TRUE(std::isfinite(nan_rows[0].item<double>()));
        }
      }
}

TEST(DistillLoss, PaddingColumnsAreNeverRead) {
  // Columns at or past vocab_size hold NaN: the loss is the unpadded one and their gradient is 0.
  at::manual_seed(3);
  for (const auto& dev : devices())
    for (Divergence div : kAll) {
      at::Tensor s = at::randn({5, 40}, at::TensorOptions(dev)),
                 t = at::randn({5, 40}, at::TensorOptions(dev));
      at::Tensor sn = s.clone(), tn = t.clone();
      sn.narrow(1, 33, 7).fill_(std::nan(""));
      tn.narrow(1, 33, 7).fill_(std::nan(""));
      const auto o = DistillLossOptions().divergence(div).vocab_size(33);
      at::Tensor a = leaf(sn), b = leaf(s.narrow(1, 0, 33));
      at::Tensor la = distill_loss(a, tn, o),
                 lb = distill_loss(b, t.narrow(1, 0, 33),
                                   DistillLossOptions(o).vocab_size(std::nullopt));
      EXPECT_EQ(la.item<double>(), lb.item<double>()) << divergence_name(div);
      la.backward();
      lb.backward();
      EXPECT_TRUE(at::equal(a.grad().narrow(1, 0, 33), b.grad())) << divergence_name(div);
      EXPECT_EQ(a.grad().narrow(1, 33, 7).abs().max().item<double>(), 0.0);
    }
}

TEST(DistillLoss, ARowWithANaNOrInfGetsNaNGradientsAndZeroPadding) {
  // A NaN or +inf logit, in the student or the teacher, makes its row's loss NaN and its gradient
  // NaN at every real column (here all finite but one) for every divergence: TVD's sign(p - q)
  // is 0 where q is NaN and JSD's logs of ratios are clamped, so before the saved row constant
  // carried the NaN (saved_row_constant) a NaN teacher row gave TVD a zero gradient and JSD a
  // finite one. The padding columns past vocab_size still get gradient exactly 0, with and
  // without grad_scale (on CUDA the forward that writes the gradient and the backward that
  // recomputes it both zero them), and the other rows keep their gradient.
  at::manual_seed(8);
  const std::vector<int64_t> others{0, 1, 3};
  const at::Tensor other_rows = at::tensor(others);
  for (const auto& dev : devices())
    for (Divergence div : kAll)
      for (double bad : {std::nan(""), kInf})
        for (bool student : {true, false}) {
          std::ostringstream what;
          what << divergence_name(div) << " " << dev << " " << bad << " in the "
               << (student ? "student" : "teacher");
          const auto opts = at::TensorOptions(dev).dtype(at::kBFloat16);
          at::Tensor s = at::randn({4, 1000}, opts), t = at::randn({4, 1000}, opts);
          (student ? s : t).select(0, 2).select(0, 17).fill_(bad);
          const auto o = DistillLossOptions().divergence(div).vocab_size(990);
          at::Tensor a = leaf(s), b = leaf(s);
          const at::Tensor la = distill_loss(a, t, o);
          la.backward();
          distill_loss(b, t,
                       DistillLossOptions(o).grad_scale(at::ones({1}, at::TensorOptions(dev))))
              .backward();
          EXPECT_TRUE(std::isnan(la.item<double>())) << what.str();
          for (const at::Tensor& g : {a.grad(), b.grad()}) {
            EXPECT_TRUE(g.select(0, 2).narrow(0, 0, 990).isnan().all().item<bool>()) << what.str();
            EXPECT_EQ(g.narrow(1, 990, 10).abs().max().item<double>(), 0.0) << what.str();
            EXPECT_TRUE(g.index_select(0, other_rows.to(dev)).isfinite().all().item<bool>())
                << what.str();
          }
          EXPECT_TRUE(at::equal(a.grad().index_select(0, other_rows.to(dev)),
                                b.grad().index_select(0, other_rows.to(dev))))
              << what.str();
        }
}

TEST(DistillLoss, IdenticalRowsGiveExactlyZeroForEveryDivergenceDtypeAndTemperature) {
  at::manual_seed(4);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : dtypes(dev))
      for (Divergence div : kAll)
        for (double T : {1e-3, 0.7, 1.0, 100.0}) {
          at::Tensor s = leaf((at::randn({9, 3001}) * 3).to(dev, dtype));
          at::Tensor loss = distill_loss(s, s.detach().clone(),
                                         DistillLossOptions().divergence(div).temperature(T));
          loss.backward();
          EXPECT_EQ(loss.item<double>(), 0.0) << divergence_name(div) << " T=" << T;
          EXPECT_EQ(s.grad().abs().max().item<double>(), 0.0) << divergence_name(div) << " T=" << T;
        }
}

// Logits 1e-4 apart: the KLs' float32 row sums rounded to about -1e-6 and JSD's at beta near 1 to
// about -1e-8 before the rows were clamped at 0 (stored_row_loss). The gradient is unchanged: no
// backward reads the stored loss (the sweep compares it with the reference's).
TEST(DistillLoss, NearTiesNeverGiveANegativeLoss) {
  at::manual_seed(14);
  for (const auto& dev : devices())
    for (Divergence div : kAll)
      for (double beta : {0.5, 1.0 - 1e-8}) {
        if (div != Divergence::kJsd && beta != 0.5) continue;
        for (int64_t V : {7, 255, 32000}) {
          at::Tensor s = at::randn({64, V});
          at::Tensor t = s + 1e-4 * at::randn({64, V});
          const auto opts = DistillLossOptions().divergence(div).beta(beta);
          at::Tensor rows =
              distill_loss(s.to(dev), t.to(dev), DistillLossOptions(opts).reduction(torch::kNone));
          EXPECT_GE(rows.min().item<double>(), 0.0)
              << divergence_name(div) << " beta=" << beta << " V=" << V << " on " << dev;
          EXPECT_TRUE(rows.isfinite().all().item<bool>());
        }
      }
}

// Columns masked with the dtype's lowest finite value (a common mask: padded vocabulary slots,
// banned tokens) weigh 0. At T = 2 the CUDA kernels' log2-scaled mask (-2.4e38) stays finite:
// while a thread has read only masked columns its running max is the mask, and the mask's own
// exponent must be exactly 0 (an FMA of the raw logit, tried in session 40, left it the
// product's rounding error, ~1e30, whose exp2 is +inf or 0, and the row NaN). At T = 1 and 0.5
// it overflows to -inf there and must count as a column without mass (the KLs' dot once took it
// as finite and gave NaN). A row of masks alone is uniform, as the float64 reference says.
TEST(DistillLoss, LowestFiniteMaskValuesWeighZeroAndNeverGiveNaN) {
  at::manual_seed(16);
  const int64_t rows = 4, V = 1000;
  for (const auto& dev : devices())
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
      for (Divergence div : kAll)
        for (double T : {2.0, 1.0, 0.5}) {
          SCOPED_TRACE(std::string(divergence_name(div)) + " " + c10::toString(dtype) + " " +
                       dev.str() + " T=" + std::to_string(T));
          const double lowest = dtype == at::kFloat
                                    ? double(std::numeric_limits<float>::lowest())
                                    : double(std::numeric_limits<c10::BFloat16>::lowest());
          at::Tensor s64 = at::randn({rows, V}, at::kDouble) * 2;
          at::Tensor t64 = at::randn({rows, V}, at::kDouble) * 2;
          for (at::Tensor x : {s64, t64}) {     // handles: the fills reach s64 and t64
            x.narrow(1, 0, 512).fill_(lowest);  // every CUDA thread's first vector, and more
            x[rows - 1].fill_(lowest);          // a row of masks alone
          }
          const at::Tensor s = s64.to(dev, dtype), t = t64.to(dev, dtype);
          const auto opts = DistillLossOptions().divergence(div).temperature(T);
          const RefResult ref =
              reference_distill(s.cpu(), t.cpu(), div, 0.5, T, V, at::ones({rows}, at::kBool),
                                at::ones({rows}, at::kDouble));
          at::Tensor sl = leaf(s);
          at::Tensor loss = distill_loss(sl, t, DistillLossOptions(opts).reduction(torch::kNone));
          loss.sum().backward();
          const Tol tol = tolerance(dtype);
          EXPECT_TRUE(loss.isfinite().all().item<bool>()) << loss;
          EXPECT_TRUE(sl.grad().isfinite().all().item<bool>());
          EXPECT_TRUE(all_close(loss, ref.row_loss, tol.loss_rtol, tol.loss_atol));
          EXPECT_TRUE(all_close(sl.grad(), ref.grad, tol.grad_rtol, tol.grad_atol_rel / T));
          EXPECT_EQ(loss[rows - 1].item<double>(), 0.0);  // uniform against uniform
          // Identical masked rows: exactly 0, loss and gradient.
          at::Tensor same = leaf(s);
          at::Tensor zero = distill_loss(same, s, opts);
          zero.backward();
          EXPECT_EQ(zero.item<double>(), 0.0);
          EXPECT_EQ(same.grad().abs().max().item<double>(), 0.0);
        }
}

// Masks on one side only (banned tokens, padded columns of one model's vocabulary), at the
// dtype's lowest value: the masked side's columns weigh 0 as with -inf, so only the divergences
// whose masked side weighs the sum are finite there: TVD and JSD with either side masked, forward
// KL with the teacher masked, reverse KL with the student. The CUDA KLs' online dot once summed
// the masked columns' scaled values (-2.4e38 each at T = 2, where they stay finite) while they
// led a thread's maximum: -inf, then NaN (-inf * 0) once a real column rescaled it. A row masked
// whole on one side: uniform there where the scaled mask stays finite, a side without mass (a
// NaN loss, as for -inf) where it overflows, which depends on the device (docs/distill.md).
TEST(DistillLoss, OneSidedLowestMasksWeighZeroOnTheMaskedSide) {
  at::manual_seed(17);
  const int64_t rows = 4, V = 1000;
  struct Case {
    Divergence div;
    bool mask_student;
  };
  const Case cases[] = {{Divergence::kTvd, true},        {Divergence::kTvd, false},
                        {Divergence::kJsd, true},        {Divergence::kJsd, false},
                        {Divergence::kForwardKl, false}, {Divergence::kReverseKl, true}};
  for (const auto& dev : devices())
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
      for (const Case& c : cases)
        for (double T : {2.0, 1.0, 0.5}) {
          SCOPED_TRACE(std::string(divergence_name(c.div)) + (c.mask_student ? " s" : " t") +
                       " masked " + c10::toString(dtype) + " " + dev.str() +
                       " T=" + std::to_string(T));
          const double lowest = dtype == at::kFloat
                                    ? double(std::numeric_limits<float>::lowest())
                                    : double(std::numeric_limits<c10::BFloat16>::lowest());
          at::Tensor s64 = at::randn({rows, V}, at::kDouble) * 2;
          at::Tensor t64 = at::randn({rows, V}, at::kDouble) * 2;
          at::Tensor masked = c.mask_student ? s64 : t64;  // a handle: fills reach s64 or t64
          masked.narrow(1, 0, 512).fill_(lowest);   // every CUDA thread's first vector, and more
          masked.narrow(1, 700, 37).fill_(lowest);  // a run that starts and ends inside vectors
          masked[rows - 1].fill_(lowest);           // a row masked whole on one side
          const at::Tensor s = s64.to(dev, dtype), t = t64.to(dev, dtype);
          const auto opts =
              DistillLossOptions().divergence(c.div).temperature(T).reduction(torch::kNone);
          const RefResult ref =
              reference_distill(s.cpu(), t.cpu(), c.div, 0.5, T, V, at::ones({rows}, at::kBool),
                                at::ones({rows}, at::kDouble));
          at::Tensor sl = leaf(s);
          at::Tensor loss = distill_loss(sl, t, opts);
          loss.sum().backward();
          const Tol tol = tolerance(dtype);
          // Whether the mask stays finite once scaled: the CPU kernels scale by 1 / T, the CUDA
          // kernels by log2(e) / T (finite at T = 2 on both, at T = 1 on the CPU only).
          const double k = (dev.is_cuda() ? 1.4426950408889634 : 1.0) / T;
          const bool whole_finite = std::abs(lowest * k) <= std::numeric_limits<float>::max();
          const int64_t n = whole_finite ? rows : rows - 1;
          EXPECT_TRUE(loss.narrow(0, 0, n).isfinite().all().item<bool>()) << loss;
          EXPECT_TRUE(sl.grad().narrow(0, 0, n).isfinite().all().item<bool>());
          EXPECT_TRUE(all_close(loss.narrow(0, 0, n), ref.row_loss.narrow(0, 0, n), tol.loss_rtol,
                                tol.loss_atol))
              << loss << ref.row_loss;
          EXPECT_TRUE(all_close(sl.grad().narrow(0, 0, n), ref.grad.narrow(0, 0, n), tol.grad_rtol,
                                tol.grad_atol_rel / T));
          if (!whole_finite) {  // the masked side has no mass left: NaN, as for -inf
            EXPECT_TRUE(std::isnan(loss[rows - 1].item<double>())) << loss;
            EXPECT_TRUE(sl.grad()[rows - 1].isnan().all().item<bool>());
          }
        }
}

// Identical rows whose finite logits span nearly the whole range (the dtype's largest value next
// to its lowest, a mask): exactly 0, loss and gradient. The lowest column's exponent against the
// largest overflows to -inf though both logits are finite once scaled; the CUDA KLs' dot once
// took that column's term as 0 * (-inf - -inf) = NaN (review, session 41).
TEST(DistillLoss, IdenticalRowsSpanningTheWholeRangeGiveExactlyZero) {
  at::manual_seed(18);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
      for (Divergence div : kAll)
        for (double T : {2.0, 1.5}) {
          SCOPED_TRACE(std::string(divergence_name(div)) + " " + c10::toString(dtype) + " " +
                       dev.str() + " T=" + std::to_string(T));
          const bool f32 = dtype == at::kFloat;
          const double lowest = f32 ? double(std::numeric_limits<float>::lowest())
                                    : double(std::numeric_limits<c10::BFloat16>::lowest());
          at::Tensor x64 = at::randn({3, 300}, at::kDouble) * 4;
          x64.select(1, 0).fill_(-lowest);     // the largest finite value: the row's max
          x64.narrow(1, 1, 20).fill_(lowest);  // masks in the max's vector and the next ones
          x64.narrow(1, 150, 9).fill_(lowest);
          const at::Tensor x = x64.to(dev, dtype);
          at::Tensor sl = leaf(x);
          at::Tensor loss = distill_loss(
              sl, x.clone(),
              DistillLossOptions().divergence(div).temperature(T).reduction(torch::kNone));
          loss.sum().backward();
          EXPECT_EQ(loss.abs().max().item<double>(), 0.0) << loss;
          EXPECT_EQ(sl.grad().abs().max().item<double>(), 0.0);
        }
}

TEST(DistillLoss, JsdAtBetaZeroAndOneIsForwardAndReverseKl) {
  at::manual_seed(5);
  at::Tensor s = at::randn({4, 50}), t = at::randn({4, 50});
  auto loss = [&](Divergence d, double beta) {
    return distill_loss(s, t, DistillLossOptions().divergence(d).beta(beta)).item<double>();
  };
  EXPECT_EQ(loss(Divergence::kJsd, 0.0), loss(Divergence::kForwardKl, 0.5));
  EXPECT_EQ(loss(Divergence::kJsd, 1.0), loss(Divergence::kReverseKl, 0.5));
}

// JSD at a beta so small that 1 / beta overflows float (or beta itself rounds to 0 in float): the
// bound on log(q/m) was +inf there and the loss inf or NaN; the float64 reference is finite (about
// beta). Columns the student lacks (-inf, q > 0 = m) are where the bound is reached.
TEST(DistillLoss, JsdAtATinyBetaStaysFinite) {
  at::manual_seed(6);
  for (const auto& dev : devices())
    for (at::ScalarType dtype : {at::kFloat, at::kDouble})
      for (double beta : {1e-30, 1e-40, 1e-46, 1e-300}) {
        if (dev.is_cuda() && dtype == at::kDouble) continue;  // CUDA takes fp32/bf16/fp16
        SCOPED_TRACE(dev.str() + " " + c10::toString(dtype) + " beta=" + std::to_string(beta));
        at::Tensor s64 = at::randn({3, 40}, at::kDouble);
        s64.narrow(1, 0, 5).fill_(-std::numeric_limits<double>::infinity());
        s64[0][7] = -200;
        const at::Tensor t64 = at::randn({3, 40}, at::kDouble);
        at::Tensor s = s64.to(dev, dtype).requires_grad_(true);
        at::Tensor loss = distill_loss(
            s, t64.to(dev, dtype),
            DistillLossOptions().divergence(Divergence::kJsd).beta(beta).reduction(torch::kSum));
        loss.backward();
        const RefResult ref =
            reference_distill(s64, t64, Divergence::kJsd, beta, 1.0, 40, at::ones({3}, at::kBool),
                              at::ones({3}, at::kDouble));
        EXPECT_TRUE(loss.isfinite().item<bool>()) << loss.item<double>();
        EXPECT_TRUE(s.grad().isfinite().all().item<bool>());
        EXPECT_NEAR(loss.item<double>(), ref.row_loss.sum().item<double>(), 1e-6);
        EXPECT_LT((s.grad().cpu().to(at::kDouble) - ref.grad).abs().max().item<double>(), 1e-6);
      }
}

TEST(DistillLoss, AllIgnoredAndEmptyBatchesGiveZeroNotNaN) {
  for (const auto& dev : devices())
    for (Divergence div : kAll)
      for (auto red : std::vector<Reduction>{torch::kSum, torch::kMean, torch::kBatchMean}) {
        at::Tensor s = leaf(at::randn({3, 20}, at::TensorOptions(dev)));
        at::Tensor labels =
            at::full({3}, kDefaultIgnoreIndex, at::TensorOptions(dev).dtype(at::kLong));
        at::Tensor loss = distill_loss(s, at::randn({3, 20}, at::TensorOptions(dev)),
                                       DistillLossOptions().divergence(div).reduction(red), labels);
        loss.backward();
        EXPECT_EQ(loss.item<double>(), 0.0);
        EXPECT_EQ(s.grad().abs().max().item<double>(), 0.0);
        at::Tensor e = leaf(at::randn({0, 20}, at::TensorOptions(dev)));
        at::Tensor le = distill_loss(e, at::randn({0, 20}, at::TensorOptions(dev)),
                                     DistillLossOptions().divergence(div).reduction(red));
        le.backward();
        EXPECT_EQ(le.item<double>(), 0.0);
        EXPECT_EQ(e.grad().sizes(), e.sizes());
      }
}

TEST(DistillLoss, GradScaleHintGivesTheSameGradientForAnyGradOutput) {
  // grad_scale is a promise of the grad_output; kept (the CUDA forward computes the gradient) or
  // broken (backward rescales on the device), the gradient is the one without the hint.
  // The loss too, bit for bit: the hint changes which pass writes the gradient, never how the row
  // sums are ordered (on CUDA, the same block size; 12000 columns take more threads per row
  // than 4096 wherever the launch depends on the row's width). A promise of 0 too: its gradient
  // is computed for 1 and scaled in backward (a gradient computed for 0 could not be rescaled,
  // and a broken promise of 0 gave NaN on CUDA up to session 44).
  at::manual_seed(6);
  for (const auto& dev : devices())
    for (int64_t V : {4096, 12000})
      for (Divergence div : kAll)
        for (double hint : {0.25, 0.0})
          for (double go : {0.25, 3.0, 0.0}) {
            const auto opts = at::TensorOptions(dev).dtype(at::kBFloat16);
            at::Tensor s0 = at::randn({64, V}, opts), t = at::randn({64, V}, opts);
            at::Tensor a = leaf(s0), b = leaf(s0);
            const auto o = DistillLossOptions().divergence(div);
            const at::Tensor la = distill_loss(a, t, o);
            la.backward(at::full({}, go, at::TensorOptions(dev)));
            const at::Tensor h = at::full({1}, hint, at::TensorOptions(dev));
            const at::Tensor lb = distill_loss(b, t, DistillLossOptions(o).grad_scale(h));
            lb.backward(at::full({}, go, at::TensorOptions(dev)));
            std::ostringstream what;
            what << divergence_name(div) << " " << dev << " V " << V << " grad_scale " << hint
                 << " grad_output " << go;
            EXPECT_TRUE(at::equal(lb, la)) << what.str();
            // Bit for bit where the promise is kept or the grad_output is 0; else one more
            // rounding to bfloat16.
            const double tol = go == hint || go == 0.0 ? 0.0 : 1.6e-2;
            EXPECT_TRUE(all_close(b.grad(), a.grad(), tol, 0.0)) << what.str();
            EXPECT_FALSE(b.grad().isnan().any().item<bool>()) << what.str();
            EXPECT_EQ(h.item<double>(), hint) << what.str();  // the caller's tensor untouched
          }
}

// 'mean' divides by rows * V, which past 2^24 is no float: the scale a forward that computes the
// gradient uses is the one the loss and the backward use (a double, rounded once), so the kept
// hint's gradient is the hintless one bit for bit. At 335 x 50257 the float product of the two
// counts, rounded, gave a scale one ulp off.
TEST(DistillLoss, GradScaleHintKeepsTheMeanScaleBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "the hint changes the pass only on CUDA";
  at::manual_seed(7);
  const at::Device dev(at::kCUDA);
  for (Divergence div : kAll) {
    const auto opts = at::TensorOptions(dev).dtype(at::kBFloat16);
    at::Tensor s0 = at::randn({335, 50257}, opts), t = at::randn({335, 50257}, opts);
    at::Tensor a = leaf(s0), b = leaf(s0);
    const auto o = DistillLossOptions().divergence(div).reduction(torch::kMean);
    const at::Tensor la = distill_loss(a, t, o);
    la.backward();
    const at::Tensor lb =
        distill_loss(b, t, DistillLossOptions(o).grad_scale(at::ones({1}, at::TensorOptions(dev))));
    lb.backward();
    EXPECT_TRUE(at::equal(lb, la)) << divergence_name(div) << " " << dev;
    EXPECT_TRUE(at::equal(b.grad(), a.grad())) << divergence_name(div) << " " << dev;
  }
}

// The ops' backward is first-order only. A gradient taken with create_graph=True is returned,
// and equals the plain one; differentiating it again raises, naming the op, where it used to
// drop the second-order term silently (a gradient penalty got the loss's plain gradient).
TEST(DistillLoss, SecondOrderGradientsRaiseInsteadOfBeingWrong) {
  const at::Tensor s0 = at::randn({3, 7}, at::kDouble), t = at::randn({3, 7}, at::kDouble);
  const at::Tensor labels = at::randint(0, 7, {3}, at::kLong);
  const std::vector<std::pair<std::string, std::function<at::Tensor(const at::Tensor&)>>> ops = {
      {"lossfns.distill_loss",
       [&](const at::Tensor& s) {
         return distill_loss(s, t, DistillLossOptions().divergence(Divergence::kForwardKl));
       }},
      {"lossfns.tvd_loss",
       [&](const at::Tensor& s) { return tvd_loss(at::softmax(s, -1), at::softmax(t, -1)); }},
      {"lossfns.cross_entropy_loss", [&](const at::Tensor& s) {
         return cross_entropy_loss(s, labels, CrossEntropyLossOptions());
       }}};
  for (const auto& [name, op] : ops) {
    const at::Tensor s = s0.clone().requires_grad_();
    const at::Tensor plain = torch::autograd::grad({op(s)}, {s})[0];
    const at::Tensor g = torch::autograd::grad({op(s)}, {s}, {}, /*retain_graph=*/true,
                                               /*create_graph=*/true)[0];
    EXPECT_TRUE(at::allclose(g.detach(), plain, 0, 0)) << name;
    std::string error = "(no error)";
    try {
      (g * g).sum().backward();
    } catch (const std::exception& e) {  // autograd's error node throws std::runtime_error
      error = e.what();
    }
    EXPECT_NE(error.find(name + ": its gradient cannot be differentiated again"), std::string::npos)
        << name << ": " << error;
    // The same through autograd.grad with respect to the input (the error node leads to it; a
    // node linked to a detached copy was never reached there, and the penalty's gradient came
    // back as zeros).
    const at::Tensor g2 = torch::autograd::grad({op(s)}, {s}, {}, /*retain_graph=*/true,
                                                /*create_graph=*/true)[0];
    error = "(no error)";
    try {
      torch::autograd::grad({(g2 * g2).sum()}, {s});
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(name + ": its gradient cannot be differentiated again"), std::string::npos)
        << name << ": " << error;
  }
}

TEST(DistillLoss, GradScaleIsCheckedOnEveryDevice) {
  // One floating-point value on the logits' device, also on the CPU, which does not use it: a
  // call that works on one device works on the other.
  for (const auto& dev : devices()) {
    const auto opts = at::TensorOptions(dev);
    const at::Tensor s = at::randn({4, 16}, opts).requires_grad_(), t = at::randn({4, 16}, opts);
    for (const at::Tensor& bad : {at::ones({2}, opts), at::ones({1}, opts.dtype(at::kLong)),
                                  at::ones({1}).to(at::kDouble), at::ones({0}, opts)}) {
      if (bad.device() == dev && bad.numel() == 1 && bad.is_floating_point()) continue;
      std::ostringstream what;
      what << dev << ": " << bad.scalar_type() << " " << bad.sizes() << " on " << bad.device();
      try {
        distill_loss(s, t, DistillLossOptions().grad_scale(bad));
        ADD_FAILURE() << "accepted grad_scale " << what.str();
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("grad_scale must be a 1-element floating-point "
                                             "tensor on the logits' device"),
                  std::string::npos)
            << what.str() << ": " << e.what();
      }
    }
    EXPECT_NO_THROW(distill_loss(s, t, DistillLossOptions().grad_scale(at::ones({1, 1}, opts))));
  }
}

TEST(DistillLoss, GradScaleHintSurvivesARetainedGraphAndLeavesItsTensorAlone) {
  // Backward twice through a retained graph, with grad_outputs other than the hint: each
  // gradient is the one without the hint, the first one is not changed by the second backward,
  // and the caller's grad_scale tensor is never written.
  at::manual_seed(7);
  for (const auto& dev : devices()) {
    const auto opts = at::TensorOptions(dev).dtype(at::kBFloat16);
    const at::Tensor s0 = at::randn({32, 2048}, opts), t = at::randn({32, 2048}, opts);
    const auto o = DistillLossOptions().divergence(Divergence::kReverseKl);
    auto reference = [&](double go) {
      at::Tensor a = leaf(s0);
      distill_loss(a, t, o).backward(at::full({}, go, at::TensorOptions(dev)));
      return a.grad();
    };
    const at::Tensor hint = at::full({1}, 0.25, at::TensorOptions(dev));
    at::Tensor b = leaf(s0);
    const at::Tensor loss = distill_loss(b, t, DistillLossOptions(o).grad_scale(hint));
    auto grad_of = [&](double go) {
      return torch::autograd::grad({loss}, {b}, {at::full({}, go, at::TensorOptions(dev))},
                                   /*retain_graph=*/true)[0];
    };
    const at::Tensor g1 = grad_of(3.0);
    const at::Tensor g1_copy = g1.clone();
    const at::Tensor g2 = grad_of(0.5);
    const at::Tensor g3 = grad_of(0.25);
    EXPECT_TRUE(all_close(g1, reference(3.0), 1.6e-2, 0.0)) << dev;
    EXPECT_TRUE(all_close(g2, reference(0.5), 1.6e-2, 0.0)) << dev;
    EXPECT_TRUE(all_close(g3, reference(0.25), 1.6e-2, 0.0)) << dev;
    EXPECT_TRUE(g1.equal(g1_copy)) << dev;
    EXPECT_EQ(hint.item<double>(), 0.25) << dev;
  }
}

TEST(DistillLoss, ThreeDimensionalAndNonContiguousInputs) {
  at::manual_seed(7);
  for (const auto& dev : devices()) {
    at::Tensor s = at::randn({5, 3, 70}, at::TensorOptions(dev))
                       .transpose(0, 1);  // (3, 5, 70), not a view of rows
    at::Tensor t = at::randn({3, 5, 70}, at::TensorOptions(dev));
    at::Tensor labels = at::randint(0, 5, {3, 5}, at::TensorOptions(dev).dtype(at::kLong));
    at::Tensor a = leaf(s), b = leaf(s.contiguous());
    const auto o = DistillLossOptions().divergence(Divergence::kJsd).reduction(torch::kNone);
    at::Tensor la = distill_loss(a, t, o, labels), lb = distill_loss(b, t, o, labels);
    EXPECT_EQ(la.sizes(), (std::vector<int64_t>{3, 5}));
    EXPECT_TRUE(at::equal(la, lb));
    la.sum().backward();
    lb.sum().backward();
    EXPECT_TRUE(at::equal(a.grad(), b.grad()));
  }
}

TEST(DistillLoss, BadInputsAreErrorsNamingWhatWasExpectedAndFound) {
  const at::Tensor s = at::randn({4, 10}), t = at::randn({4, 10});
  auto err = [&](const at::Tensor& a, const at::Tensor& b, DistillLossOptions o = {},
                 std::optional<at::Tensor> l = std::nullopt) {
    return error_of([&] { distill_loss(a, b, o, l); });
  };
  EXPECT_NE(err(s, at::randn({5, 10}))
                .find("leading shape [4] of student_logits [4, 10] (every dimension but the last; "
                      "the vocabulary sizes may differ); got [5, 10]"),
            std::string::npos);
  EXPECT_NE(err(s, t.to(at::kBFloat16)).find("BFloat16"), std::string::npos);
  EXPECT_NE(err(s.to(at::kInt), t.to(at::kInt)).find("Int"), std::string::npos);
  EXPECT_NE(err(s, t, DistillLossOptions().temperature(0)).find("temperature"), std::string::npos);
  EXPECT_NE(err(s, t, DistillLossOptions().temperature(1e-40)).find("temperature"),
            std::string::npos);
  EXPECT_NE(err(s, t, DistillLossOptions().temperature(kInf)).find("temperature"),
            std::string::npos);
  EXPECT_NE(err(s, t, DistillLossOptions().divergence(Divergence::kJsd).beta(1.5)).find("beta"),
            std::string::npos);
  EXPECT_NE(err(s, t, DistillLossOptions().vocab_size(0)).find("vocab_size"), std::string::npos);
  EXPECT_NE(err(s, t, {}, at::zeros({4}, at::kInt)).find("int64"), std::string::npos);
  EXPECT_NE(err(s, t, {}, at::zeros({3}, at::kLong)).find("labels must have shape"),
            std::string::npos);
  EXPECT_NE(err(s, leaf(t)).find("teacher_logits must not require grad"), std::string::npos);
  EXPECT_EQ(err(s, t, DistillLossOptions().reduction(torch::kSum)),
            "");  // and a good call is none
}

// One CUDA call takes at most 2^27 - 1 rows (32-bit grids): one more is refused with what to do
// instead, and 2^27 - 1 runs. The rows are one broadcast row (stride 0): no memory for them.
TEST(DistillLoss, CudaRefusesMoreRowsThanItsGridsTakeAndSaysWhatToDo) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor row = at::randn({1, 3}, opts);
  const int64_t most = (int64_t{1} << 27) - 1;
  const std::string refused = error_of([&] {
    distill_loss(row.expand({most + 1, 3}), row.expand({most + 1, 3}), {});
  });
  EXPECT_NE(refused.find("at most 2^27 - 1 (134217727) rows per call on CUDA; got 134217728: "
                         "call it on slices of the rows"),
            std::string::npos)
      << refused;
  const at::Tensor s = row.expand({most, 3}).detach().requires_grad_(true);
  const at::Tensor loss = distill_loss(s, row.expand({most, 3}), DistillLossOptions());
  loss.backward();
  EXPECT_EQ(loss.item<float>(), 0.0f);  // identical rows
  EXPECT_EQ(s.grad().abs().max().item<float>(), 0.0f);
}

TEST(DistillLoss, ModuleWrapperCallsTheOp) {
  DistillLoss fn(DistillLossOptions().divergence(Divergence::kJsd).beta(0.25).vocab_size(8));
  std::ostringstream o;
  o << *fn;
  EXPECT_EQ(o.str(),
            "lossfns::DistillLoss(divergence=jsd, beta=0.25, temperature=1, reduction=batchmean, "
            "ignore_index=-100, vocab_size=8)");
  const at::Tensor s = at::randn({2, 10}), t = at::randn({2, 10});
  EXPECT_EQ(fn(s, t).item<double>(), distill_loss(s, t, fn->options).item<double>());
  const at::Tensor labels = at::tensor({3, -100}, at::kLong);
  EXPECT_EQ(fn(s, t, labels).item<double>(),
            distill_loss(s, t, fn->options, labels).item<double>());
  // Through AnyModule (what Sequential holds), with and without the labels.
  torch::nn::AnyModule any(fn);
  EXPECT_EQ(any.forward(s, t, labels).item<double>(),
            distill_loss(s, t, fn->options, labels).item<double>());
  EXPECT_EQ(any.forward(s, t).item<double>(), distill_loss(s, t, fn->options).item<double>());
}

}  // namespace
}  // namespace lossfns::testing

// lossfns::fused_linear_distill_loss against the unfused composite: logits = hidden @ lm_head^T
// (autograd through the matmuls), then the float64 divergence reference (distill_reference.h) and
// a float64 cross-entropy, or, for the lower precisions, distill_loss + ATen's cross_entropy as a
// user would write them. Loss, both terms, and the gradients of the student's hidden states and
// lm_head, swept over divergences, reductions, weights, chunk sizes, widths, padding, ties and
// ignored rows; the errors. CUDA cases skip without a GPU.
#include "lossfns/fused_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "distill_reference.h"
#include "tvd_reference.h"  // all_close, error_of, reduction_from

namespace lossfns::testing {
namespace {

constexpr std::array<Divergence, 4> kAll = {Divergence::kTvd, Divergence::kForwardKl,
                                            Divergence::kReverseKl, Divergence::kJsd};
const double kInf = std::numeric_limits<double>::infinity();

at::Tensor leaf(const at::Tensor& x) { return x.detach().clone().set_requires_grad(true); }

// One problem: BT tokens, student (H_s, V_s), teacher (H_t, V_t).
struct Shape {
  int64_t rows, hs, ht, vs, vt;
  std::optional<int64_t> vocab_size;
  std::string pattern = "random";  // "random" | "tied" (the teacher is the student)
  double temperature = 1.0;
  std::string labels = "some";  // "none" | "some" (every 3rd ignored) | "all" (every row ignored)
};
std::string describe(const Shape& c) {
  std::ostringstream o;
  o << c.rows << " rows, H " << c.hs << "/" << c.ht << ", V " << c.vs << "/" << c.vt << ", vocab "
    << (c.vocab_size ? std::to_string(*c.vocab_size) : "-") << ", " << c.pattern << ", T "
    << c.temperature << ", labels " << c.labels;
  return o.str();
}
int64_t columns(const Shape& c) {
  return std::min(c.vocab_size.value_or(std::max(c.vs, c.vt)), std::max(c.vs, c.vt));
}

struct Inputs {
  at::Tensor sh, sw, th, tw, labels;  // labels undefined when absent
};

// float64 on the CPU; hidden states and weights scaled so the logits are O(1)-O(5).
Inputs make_inputs(const Shape& c) {
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  Inputs in;
  in.sh = at::randn({c.rows, c.hs}, dbl);
  in.sw = at::randn({c.vs, c.hs}, dbl) * (2.0 / std::sqrt(double(c.hs)));
  if (c.pattern == "tied") {
    in.th = in.sh.clone();
    in.tw = in.sw.clone();
  } else {
    in.th = at::randn({c.rows, c.ht}, dbl);
    in.tw = at::randn({c.vt, c.ht}, dbl) * (2.0 / std::sqrt(double(c.ht)));
  }
  if (c.labels != "none") {
    // Targets among the columns that count (the student's), every 3rd row (or every row) ignored.
    in.labels = at::randint(0, std::min(columns(c), c.vs), {c.rows}, at::kLong);
    in.labels.index_put_(
        {c.labels == "all" ? at::ones({c.rows}, at::kBool) : at::arange(c.rows) % 3 == 1},
        kDefaultIgnoreIndex);
  }
  return in;
}

struct Expected {
  at::Tensor loss, divergence, ce, grad_h, grad_w;
};

// The float64 composite: the divergence's value and logit gradient from reference_distill, the
// cross-entropy's in closed form (softmax - onehot over the columns that count), chained through
// the two matmuls by autograd. go: the grad_output (0-dim, or (rows,) for "none").
Expected composite_reference(const Inputs& in, const Shape& c, Divergence div, double beta,
                             const std::string& red, double kd_w, double ce_w,
                             const at::Tensor& go) {
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor h = leaf(in.sh.to(at::kDouble)), w = leaf(in.sw.to(at::kDouble));
  const at::Tensor s = h.mm(w.t());
  const at::Tensor t = in.th.to(at::kDouble).mm(in.tw.to(at::kDouble).t());
  const int64_t V = columns(c), Vce = std::min(V, c.vs);
  const at::Tensor valid =
      in.labels.defined() ? in.labels.ne(kDefaultIgnoreIndex) : at::ones({c.rows}, at::kBool);
  const double n = valid.sum().item<double>();
  const double inv = n > 0 ? 1.0 / n : 0.0;
  const double kd_scale = red == "sum" || red == "none" ? 1.0
                          : red == "mean"               ? inv / double(V)
                                                        : inv;
  const double ce_scale = red == "sum" || red == "none" ? 1.0 : inv;
  const at::Tensor go_rows = red == "none" ? go : go.expand({c.rows});
  const RefResult ref = reference_distill(s.detach(), t, div, beta, c.temperature, V, valid,
                                          go_rows * (kd_w * kd_scale));
  at::Tensor ce_rows = at::zeros({c.rows}, dbl), ce_grad = at::zeros({c.rows, c.vs}, dbl);
  if (in.labels.defined()) {
    const at::Tensor lp = at::log_softmax(s.detach().narrow(1, 0, Vce), 1);
    const at::Tensor index = at::where(valid, in.labels, 0).unsqueeze(1);
    ce_rows = at::where(valid, -lp.gather(1, index).squeeze(1), 0);
    const at::Tensor onehot = at::zeros_like(lp).scatter_(1, index, 1.0);
    const at::Tensor row_w = at::where(valid, go_rows * (ce_w * ce_scale), 0).unsqueeze(1);
    ce_grad.narrow(1, 0, Vce).copy_((lp.exp() - onehot) * row_w);
  }
  // A weight of 0 drops its term: the divergence may be +inf (reverse KL where only the teacher
  // is -inf), and 0 * inf is not the 0 the op defines.
  s.backward(kd_w != 0.0 ? ref.grad + ce_grad : ce_grad);
  Expected e;
  e.divergence = red == "none" ? ref.row_loss : ref.row_loss.sum() * kd_scale;
  e.ce = red == "none" ? ce_rows : ce_rows.sum() * ce_scale;
  e.loss = (kd_w != 0.0 ? e.divergence * kd_w : at::zeros_like(e.divergence)) + e.ce * ce_w;
  e.grad_h = h.grad();
  e.grad_w = w.grad();
  return e;
}

FusedLinearDistillOptions options_of(Divergence div, double beta, const Shape& c,
                                     const std::string& red, double kd_w, double ce_w,
                                     std::optional<int64_t> chunk) {
  DistillLossOptions d;
  d.divergence(div).beta(beta).temperature(c.temperature).vocab_size(c.vocab_size);
  d.reduction(reduction_from(red));
  return FusedLinearDistillOptions().distill(d).kd_weight(kd_w).ce_weight(ce_w).chunk_size(chunk);
}

std::optional<at::Tensor> opt(const at::Tensor& x) {
  return x.defined() ? std::optional<at::Tensor>(x) : std::nullopt;
}

// Float64 on the CPU: every element within 1e-10 relative of the float64 composite (the two
// differ only in summation order: chunked GEMMs and the kernels' per-row sums).
void run_float64_case(const Shape& c, Divergence div, const std::string& red, double kd_w,
                      double ce_w, std::optional<int64_t> chunk) {
  SCOPED_TRACE(describe(c) + ", " + divergence_name(div) + ", " + red + ", kd " +
               std::to_string(kd_w) + ", ce " + std::to_string(ce_w) + ", chunk " +
               (chunk ? std::to_string(*chunk) : "auto"));
  const Inputs in = make_inputs(c);
  const double beta = 0.3;
  const at::Tensor go =
      red == "none" ? at::rand({c.rows}, at::kDouble) + 0.5 : at::full({}, 0.75, at::kDouble);
  const Expected e = composite_reference(in, c, div, beta, red, kd_w, ce_w, go);
  const at::Tensor h = leaf(in.sh), w = leaf(in.sw);
  const FusedLinearDistillResult r = fused_linear_distill_loss(
      h, w, in.th, in.tw, opt(in.labels), options_of(div, beta, c, red, kd_w, ce_w, chunk));
  EXPECT_EQ(r.loss.scalar_type(), at::kDouble);
  EXPECT_EQ(r.loss.dim(), red == "none" ? 1 : 0);
  EXPECT_FALSE(r.divergence.requires_grad());
  EXPECT_FALSE(r.ce.requires_grad());
  const double scale = std::max(1.0, e.loss.abs().max().item<double>());
  EXPECT_TRUE(all_close(r.loss, e.loss, 1e-10, 1e-12 * scale));
  EXPECT_TRUE(all_close(r.divergence, e.divergence, 1e-10, 1e-12 * scale));
  EXPECT_TRUE(all_close(r.ce, e.ce, 1e-10, 1e-12 * scale));
  r.loss.backward(go);
  const double gh = std::max(1e-30, e.grad_h.abs().max().item<double>());
  const double gw = std::max(1e-30, e.grad_w.abs().max().item<double>());
  EXPECT_TRUE(all_close(h.grad(), e.grad_h, 1e-9, 1e-12 * gh));
  EXPECT_TRUE(all_close(w.grad(), e.grad_w, 1e-9, 1e-12 * gw));
  if (c.pattern == "tied" && ce_w == 0.0) {  // exactly 0, not merely small
    EXPECT_EQ(r.loss.abs().max().item<double>(), 0.0);
    EXPECT_EQ(h.grad().abs().max().item<double>(), 0.0);
    EXPECT_EQ(w.grad().abs().max().item<double>(), 0.0);
  }
}

TEST(FusedLinearDistillLoss, MatchesTheFloat64CompositeAcrossTheSweep) {
  at::manual_seed(0);
  const std::vector<Shape> shapes = {
      {13, 8, 6, 37, 37, std::nullopt},
      {1, 4, 4, 9, 9, std::nullopt, "random", 1.0, "none"},
      {7, 5, 9, 40, 33, std::nullopt, "random", 2.0},  // the teacher's vocabulary is narrower
      {6, 4, 7, 30, 44, 35, "random", 0.5},            // wider teacher: V = 35 > V_s
      {9, 6, 6, 48, 48, 40, "random", 1.0},            // padded vocabulary, both sides
      {11, 6, 6, 25, 25, std::nullopt, "tied"},
      {5, 6, 3, 20, 20, std::nullopt, "random", 1.0, "all"},
  };
  struct Weights {
    double kd, ce;
  };
  for (const Shape& c : shapes)
    for (Divergence div : kAll)
      for (const char* red : {"sum", "batchmean", "mean", "none"})
        for (Weights wt : {Weights{1.0, 0.0}, Weights{0.7, 0.4}, Weights{0.0, 1.0}})
          for (std::optional<int64_t> chunk : {std::optional<int64_t>(1), std::optional<int64_t>(3),
                                               std::optional<int64_t>(std::nullopt)}) {
            if (wt.ce != 0.0 && c.labels == "none") continue;  // CE needs labels
            run_float64_case(c, div, red, wt.kd, wt.ce, chunk);
          }
}

TEST(FusedLinearDistillLoss, ThreeDimensionalInputsAndPerTokenLosses) {
  at::manual_seed(1);
  const Shape c{12, 5, 7, 30, 30, std::nullopt};
  const Inputs in = make_inputs(c);
  const auto o = options_of(Divergence::kJsd, 0.5, c, "none", 1.0, 0.5, 5);
  const at::Tensor h2 = leaf(in.sh), h3 = leaf(in.sh.view({3, 4, 5}));
  const auto r2 = fused_linear_distill_loss(h2, in.sw, in.th, in.tw, in.labels, o);
  const auto r3 =
      fused_linear_distill_loss(h3, in.sw, in.th.view({3, 4, 7}), in.tw, in.labels.view({3, 4}), o);
  EXPECT_EQ(r3.loss.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r3.divergence.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(at::equal(r3.loss.reshape({-1}), r2.loss));
  r2.loss.sum().backward();
  r3.loss.sum().backward();
  EXPECT_EQ(h3.grad().sizes(), h3.sizes());
  EXPECT_TRUE(at::equal(h3.grad().reshape({12, 5}), h2.grad()));
}

TEST(FusedLinearDistillLoss, TheTeacherGetsNoGradientAndEitherStudentInputMayBeConstant) {
  at::manual_seed(2);
  const Shape c{6, 4, 5, 20, 20, std::nullopt};
  const Inputs in = make_inputs(c);
  const auto o = options_of(Divergence::kForwardKl, 0.5, c, "batchmean", 1.0, 0.3, 2);
  const Expected e = composite_reference(in, c, Divergence::kForwardKl, 0.5, "batchmean", 1.0, 0.3,
                                         at::ones({}, at::kDouble));
  // The hidden states alone, the lm_head alone.
  at::Tensor h = leaf(in.sh);
  fused_linear_distill_loss(h, in.sw, in.th, in.tw, in.labels, o).loss.backward();
  EXPECT_TRUE(all_close(h.grad(), e.grad_h, 1e-9, 1e-14));
  at::Tensor w = leaf(in.sw);
  fused_linear_distill_loss(in.sh, w, in.th, in.tw, in.labels, o).loss.backward();
  EXPECT_TRUE(all_close(w.grad(), e.grad_w, 1e-9, 1e-14));
  // The teacher's tensors (constants) get no gradient; neither student input requiring grad
  // gives a constant loss.
  at::Tensor h2 = leaf(in.sh), th = in.th.clone(), tw = in.tw.clone();
  fused_linear_distill_loss(h2, in.sw, th, tw, in.labels, o).loss.backward();
  EXPECT_FALSE(th.grad().defined());
  EXPECT_FALSE(tw.grad().defined());
  EXPECT_FALSE(fused_linear_distill_loss(in.sh, in.sw, th, tw, in.labels, o).loss.requires_grad());
}

TEST(FusedLinearDistillLoss, PaddingRowsOfTheLmHeadAreNeverReadAndGetZeroGradient) {
  // lm_head rows at or past vocab_size hold NaN: the result is the unpadded problem's, and those
  // rows' gradient is exactly 0.
  at::manual_seed(3);
  for (Divergence div : kAll) {
    const Shape c{7, 4, 6, 40, 40, 33};
    const Inputs in = make_inputs(c);
    at::Tensor sw = in.sw.clone(), tw = in.tw.clone();
    sw.narrow(0, 33, 7).fill_(std::nan(""));
    tw.narrow(0, 33, 7).fill_(std::nan(""));
    // NaN rows give NaN logits in those columns; the divergence never reads them, the
    // cross-entropy never sees them (only the first vocab_size columns count).
    const auto o = options_of(div, 0.5, c, "batchmean", 1.0, 0.5, 3);
    at::Tensor a = leaf(sw), b = leaf(in.sw.narrow(0, 0, 33));
    at::Tensor ha = leaf(in.sh), hb = leaf(in.sh);
    auto ra = fused_linear_distill_loss(ha, a, in.th, tw, in.labels, o);
    auto rb =
        fused_linear_distill_loss(hb, b, in.th, in.tw.narrow(0, 0, 33), in.labels,
                                  FusedLinearDistillOptions(o).distill(
                                      DistillLossOptions(o.distill()).vocab_size(std::nullopt)));
    EXPECT_TRUE(all_close(ra.loss, rb.loss, 1e-12, 0)) << divergence_name(div);
    ra.loss.backward();
    rb.loss.backward();
    EXPECT_TRUE(all_close(a.grad().narrow(0, 0, 33), b.grad(), 1e-12, 1e-15))
        << divergence_name(div);
    EXPECT_EQ(a.grad().narrow(0, 33, 7).abs().max().item<double>(), 0.0) << divergence_name(div);
    // The hidden states' gradient too (the NaN rows times the gradient's 0 made all of it NaN).
    EXPECT_TRUE(all_close(ha.grad(), hb.grad(), 1e-12, 1e-15)) << divergence_name(div);
  }
}

TEST(FusedLinearDistillLoss, IgnoredRowsCountNowhereEvenWithNaNHiddenStates) {
  // A masked position's hidden state may be NaN (a fully masked attention row): an ignored row
  // leaves the loss and both gradients as they are with finite values there, and gets gradient 0.
  at::manual_seed(5);
  for (Divergence div : kAll)
    for (double ce : {0.0, 0.5}) {
      const Shape c{9, 4, 5, 30, 30, std::nullopt};
      const Inputs in = make_inputs(c);  // every 3rd row ignored
      const at::Tensor ignored = in.labels.eq(kDefaultIgnoreIndex).unsqueeze(1);
      const at::Tensor sh_nan = at::where(ignored, std::nan(""), in.sh);
      const at::Tensor th_nan = at::where(ignored, std::nan(""), in.th);
      const auto o = options_of(div, 0.5, c, "batchmean", 1.0, ce, 4);
      at::Tensor ha = leaf(sh_nan), wa = leaf(in.sw), hb = leaf(in.sh), wb = leaf(in.sw);
      auto ra = fused_linear_distill_loss(ha, wa, th_nan, in.tw, in.labels, o);
      auto rb = fused_linear_distill_loss(hb, wb, in.th, in.tw, in.labels, o);
      EXPECT_TRUE(all_close(ra.loss, rb.loss, 1e-12, 0)) << divergence_name(div) << " ce " << ce;
      ra.loss.backward();
      rb.loss.backward();
      EXPECT_TRUE(all_close(wa.grad(), wb.grad(), 1e-12, 1e-15))
          << divergence_name(div) << " ce " << ce;
      EXPECT_TRUE(all_close(ha.grad(), hb.grad(), 1e-12, 1e-15))
          << divergence_name(div) << " ce " << ce;
      EXPECT_EQ(ha.grad().masked_select(ignored.expand_as(ha.grad())).abs().max().item<double>(),
                0.0)
          << divergence_name(div) << " ce " << ce;
    }
}

TEST(FusedLinearDistillLoss, AllIgnoredAndEmptyBatchesGiveZeroNotNaN) {
  for (Divergence div : kAll)
    for (const char* red : {"sum", "mean", "batchmean"}) {
      const Shape c{4, 3, 3, 10, 10, std::nullopt, "random", 1.0, "all"};
      const Inputs in = make_inputs(c);
      const auto o = options_of(div, 0.5, c, red, 1.0, 1.0, 3);
      at::Tensor h = leaf(in.sh), w = leaf(in.sw);
      auto r = fused_linear_distill_loss(h, w, in.th, in.tw, in.labels, o);
      r.loss.backward();
      EXPECT_EQ(r.loss.item<double>(), 0.0);
      EXPECT_EQ(h.grad().abs().max().item<double>(), 0.0);
      EXPECT_EQ(w.grad().abs().max().item<double>(), 0.0);
      at::Tensor e = leaf(at::randn({0, 3}, at::kDouble)), we = leaf(in.sw);
      auto re =
          fused_linear_distill_loss(e, we, at::randn({0, 3}, at::kDouble), in.tw, std::nullopt,
                                    options_of(div, 0.5, c, red, 1.0, 0.0, std::nullopt));
      re.loss.backward();
      EXPECT_EQ(re.loss.item<double>(), 0.0);
      EXPECT_EQ(e.grad().sizes(), e.sizes());
      EXPECT_EQ(we.grad().abs().max().item<double>(), 0.0);
    }
}

TEST(FusedLinearDistillLoss, ALabelOutsideTheVocabularyMakesTheCrossEntropyInfinite) {
  std::vector<at::Device> devs = {at::kCPU};
  if (torch::cuda::is_available()) devs.emplace_back(at::kCUDA);
  for (const auto& dev : devs)
    for (double temperature : {1.0, 0.5}) {  // the CE from the divergence's statistics, or its own
      SCOPED_TRACE(dev.str() + " T " + std::to_string(temperature));
      const Shape c{3, 4, 4, 12, 12, 10, "random", temperature};
      const Inputs in64 = make_inputs(c);
      auto to = [&](const at::Tensor& x) { return x.to(dev, at::kFloat); };
      // 11: a padding column
      const at::Tensor labels = at::tensor({int64_t{2}, int64_t{11}, kDefaultIgnoreIndex}).to(dev);
      const auto r = fused_linear_distill_loss(
          to(in64.sh), to(in64.sw), to(in64.th), to(in64.tw), labels,
          options_of(Divergence::kTvd, 0.5, c, "none", 1.0, 1.0, std::nullopt));
      EXPECT_TRUE(std::isfinite(r.ce[0].item<double>()));
      EXPECT_EQ(r.ce[1].item<double>(), kInf);
      EXPECT_EQ(r.ce[2].item<double>(), 0.0);
      // Its row gets the divergence's gradient and no cross-entropy gradient: the two terms'
      // gradients together (one pass on CUDA) equal each term's alone (the cross-entropy's
      // through its own kernels, kd_weight 0).
      auto grad_w = [&](double kd, double ce) {
        const at::Tensor w = leaf(to(in64.sw));
        fused_linear_distill_loss(
            to(in64.sh), w, to(in64.th), to(in64.tw), labels,
            options_of(Divergence::kTvd, 0.5, c, "none", kd, ce, std::nullopt))
            .loss.backward(at::ones({3}, at::TensorOptions(dev)));
        return w.grad();
      };
      const at::Tensor both = grad_w(1.0, 1.0), sum = grad_w(1.0, 0.0) + grad_w(0.0, 1.0);
      EXPECT_TRUE(both.isfinite().all().item<bool>());
      EXPECT_TRUE(all_close(both, sum, 1e-5, 1e-6));
    }
}

// A row whose teacher logits are -inf everywhere has no divergence (NaN, as distill_loss gives),
// but its cross-entropy is the student's own, at T = 1 too, where the cross-entropy takes its
// normaliser from the divergence's statistics (which must stay the student's, not NaN).
TEST(FusedLinearDistillLoss, ARowWhoseTeacherHasNoMassKeepsItsCrossEntropy) {
  std::vector<at::Device> devs = {at::kCPU};
  if (torch::cuda::is_available()) devs.emplace_back(at::kCUDA);
  for (const auto& dev : devs)
    for (Divergence div : kAll)
      for (double temperature : {1.0, 0.5}) {
        SCOPED_TRACE(dev.str() + " " + divergence_name(div) + " T " + std::to_string(temperature));
        const auto opts = at::TensorOptions(dev).dtype(at::kFloat);
        at::manual_seed(3);
        const at::Tensor sh = at::randn({3, 4}, opts), sw = at::randn({10, 4}, opts);
        at::Tensor th = at::randn({3, 4}, opts);
        th[0].fill_(-kInf);  // times a positive lm_head: -inf in every column
        const at::Tensor tw = at::randn({10, 4}, opts).abs() + 0.1;
        const at::Tensor labels = at::tensor({int64_t{2}, int64_t{7}, int64_t{1}}).to(dev);
        const Shape c{3, 4, 4, 10, 10, std::nullopt, "random", temperature};
        const auto r = fused_linear_distill_loss(sh, sw, th, tw, labels,
                                                 options_of(div, 0.5, c, "none", 0.0, 1.0, 2));
        const at::Tensor expected =
            -at::log_softmax(at::mm(sh, sw.t()), 1).gather(1, labels.unsqueeze(1)).squeeze(1);
        EXPECT_TRUE(std::isnan(r.divergence[0].item<double>()));
        EXPECT_TRUE(r.divergence.narrow(0, 1, 2).isfinite().all().item<bool>());
        EXPECT_TRUE(all_close(r.ce, expected, 1e-5, 1e-6)) << r.ce << expected;
      }
}

// A student row without mass (its hidden state -inf against a positive lm_head: every logit -inf)
// has no softmax: with the cross-entropy term its gradient is NaN, whichever kernel computes it
// (the fused divergence + cross-entropy pass, or the cross-entropy's own with kd_weight 0), as
// cross_entropy_loss's; the other rows are untouched.
TEST(FusedLinearDistillLoss, AStudentRowWithoutMassHasANaNGradient) {
  std::vector<at::Device> devs = {at::kCPU};
  if (torch::cuda::is_available()) devs.emplace_back(at::kCUDA);
  for (const auto& dev : devs)
    for (Divergence div : kAll)
      for (double kd_weight : {1.0, 0.0})
        for (double temperature : {1.0, 0.5}) {
          SCOPED_TRACE(dev.str() + " " + divergence_name(div) + " kd " + std::to_string(kd_weight) +
                       " T " + std::to_string(temperature));
          const auto opts = at::TensorOptions(dev).dtype(at::kFloat);
          at::manual_seed(4);
          at::Tensor sh = at::randn({3, 4}, opts), th = at::randn({3, 4}, opts);
          sh[0].fill_(-kInf);
          th[0].fill_(-kInf);  // neither side has mass: the divergence alone would give 0
          const at::Tensor sw = at::randn({10, 4}, opts).abs() + 0.1,
                           tw = at::randn({10, 4}, opts).abs() + 0.1;
          const at::Tensor labels = at::tensor({int64_t{2}, int64_t{7}, int64_t{1}}).to(dev);
          const Shape c{3, 4, 4, 10, 10, std::nullopt, "random", temperature};
          const at::Tensor h = leaf(sh);
          const at::Tensor loss =
              fused_linear_distill_loss(h, sw, th, tw, labels,
                                        options_of(div, 0.5, c, "sum", kd_weight, 1.0, 2))
                  .loss;
          loss.backward();
          EXPECT_TRUE(std::isnan(loss.item<double>()));
          EXPECT_TRUE(h.grad()[0].isnan().all().item<bool>()) << h.grad();
          EXPECT_TRUE(h.grad().narrow(0, 1, 2).isfinite().all().item<bool>()) << h.grad();
        }
}

// A loss weight that is itself learned, differentiated twice (create_graph): the lm_head's
// gradient is the saved one times the grad_output, differentiable in the grad_output. Its
// derivative in the lm_head or the hidden states (a gradient penalty) is not computed: asking for
// it raises, naming the op, where it used to be dropped silently.
TEST(FusedLinearDistillLoss, CreateGraphThroughALearnedLossWeight) {
  const Shape c{6, 8, 8, 30, 30, std::nullopt};
  const Inputs in64 = make_inputs(c);
  auto f32 = [](const at::Tensor& x) { return x.to(at::kFloat); };
  const at::Tensor w = leaf(f32(in64.sw));
  const auto o = options_of(Divergence::kForwardKl, 0.5, c, "batchmean", 1.0, 0.5, std::nullopt);
  const at::Tensor plain = torch::autograd::grad(
      {fused_linear_distill_loss(f32(in64.sh), w, f32(in64.th), f32(in64.tw), in64.labels, o).loss},
      {w})[0];
  const at::Tensor lam = at::full({}, 2.0).set_requires_grad(true);
  const at::Tensor loss =
      lam *
      fused_linear_distill_loss(f32(in64.sh), w, f32(in64.th), f32(in64.tw), in64.labels, o).loss;
  const at::Tensor gw =
      torch::autograd::grad({loss}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_TRUE(all_close(gw, plain * 2.0, 1e-6, 1e-7));
  // d(sum of lam * plain) / d lam
  EXPECT_TRUE(all_close(torch::autograd::grad({gw.sum()}, {lam}, {}, /*retain_graph=*/true)[0],
                        plain.sum(), 1e-5, 1e-6));
  auto raises = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {  // autograd's error node throws std::runtime_error
      return std::string(e.what()).find(
                 "lossfns.fused_linear_distill_loss: its gradient cannot "
                 "be differentiated again") != std::string::npos;
    }
    return false;
  };
  // backward() wants d/dw of the gradient too (w is a leaf that requires grad).
  EXPECT_TRUE(raises([&] { gw.sum().backward({}, /*retain_graph=*/true); }));
  // A gradient penalty in the hidden states, for a reduced loss and for 'none'.
  for (const std::string red : {"batchmean", "none"}) {
    const auto on = options_of(Divergence::kTvd, 0.5, c, red, 1.0, 0.5, std::nullopt);
    const at::Tensor h = leaf(f32(in64.sh));
    const at::Tensor l =
        fused_linear_distill_loss(h, f32(in64.sw), f32(in64.th), f32(in64.tw), in64.labels, on)
            .loss.sum();
    const at::Tensor gh = torch::autograd::grad({l}, {h}, {}, true, /*create_graph=*/true)[0];
    EXPECT_TRUE(raises([&] { torch::autograd::grad({(gh * gh).sum()}, {h}); })) << red;
  }
  // 'none' recomputes the gradient in backward, not differentiably in its grad_output: a learned
  // per-token weight raises too, naming the op (not "not used in the graph", nor None).
  const auto on = options_of(Divergence::kTvd, 0.5, c, "none", 1.0, 0.5, std::nullopt);
  const at::Tensor lam6 = at::full({6}, 2.0).set_requires_grad(true);
  const at::Tensor wn = leaf(f32(in64.sw));
  const at::Tensor gwn =
      torch::autograd::grad({(lam6 * fused_linear_distill_loss(f32(in64.sh), wn, f32(in64.th),
                                                               f32(in64.tw), in64.labels, on)
                                         .loss)
                                 .sum()},
                            {wn}, {}, true, /*create_graph=*/true)[0];
  EXPECT_TRUE(raises([&] { torch::autograd::grad({gwn.sum()}, {lam6}); }));
}

// A reduced loss keeps what backward needs (the two gradients), not its output nor its inputs:
// the loss may be changed in place before backward (loss /= accumulation steps), so may the
// inputs (an lm_head rescaled under no_grad), and hidden states nobody else holds are freed.
TEST(FusedLinearDistillLoss, TheLossMayBeScaledInPlaceBeforeBackward) {
  const Shape c{6, 8, 8, 30, 30, std::nullopt};
  const Inputs in64 = make_inputs(c);
  for (const std::string red : {"batchmean", "sum"}) {
    const auto o = options_of(Divergence::kTvd, 0.5, c, red, 1.0, 0.5, std::nullopt);
    const at::Tensor a = leaf(in64.sh), b = leaf(in64.sh), w = leaf(in64.sw);
    fused_linear_distill_loss(a, in64.sw, in64.th, in64.tw, in64.labels, o).loss.backward();
    const at::Tensor hidden = b * 1.0;  // an activation: this handle is its only owner
    at::Tensor loss = fused_linear_distill_loss(hidden, w, in64.th, in64.tw, in64.labels, o).loss;
    EXPECT_EQ(hidden.use_count(), 1) << red;
    loss.div_(4);
    {
      at::NoGradGuard no_grad;
      w.mul_(2.0);
      hidden.mul_(3.0);
    }
    loss.backward();
    EXPECT_TRUE(all_close(b.grad(), a.grad() / 4, 1e-12, 0)) << red;
  }
}

// The lower precisions against the composite a user would write in that dtype: logits by
// at::mm, distill_loss, and cross_entropy on a float32 copy, through autograd. Both round the
// logits and their gradient to the dtype (in different places: the composite sums the two
// terms' gradients in the dtype), so the tolerances are a few roundings of the dtype.
// temperature 1.5 runs the cross-entropy's own kernels; 1 takes its normaliser from the
// divergence's statistics (fused_linear_driver.cpp).
void run_low_precision_case(const at::Device& dev, at::ScalarType dtype, Divergence div,
                            const std::string& red, double temperature) {
  SCOPED_TRACE(std::string(divergence_name(div)) + " " + c10::toString(dtype) + " " + dev.str() +
               " " + red + " T " + std::to_string(temperature));
  const Shape c{37, 64, 96, 1000, 1200, 1100, "random", temperature};
  const Inputs in64 = make_inputs(c);
  auto to = [&](const at::Tensor& x) { return x.to(dev, dtype); };
  const Inputs in{to(in64.sh), to(in64.sw), to(in64.th), to(in64.tw), in64.labels.to(dev)};
  const auto o = options_of(div, 0.4, c, red, 1.0, 0.5, 8);
  const at::Tensor go = red == "none" ? at::rand({c.rows}, at::TensorOptions(dev)) + 0.5
                                      : at::full({}, 0.75, at::TensorOptions(dev));
  // The composite.
  const at::Tensor hc = leaf(in.sh), wc = leaf(in.sw);
  const at::Tensor s = hc.mm(wc.t()), t = in.th.mm(in.tw.t());
  const at::Tensor kd = distill_loss(s, t, o.distill(), in.labels);
  const at::Tensor ce = at::cross_entropy_loss(
      s.narrow(1, 0, std::min(columns(c), c.vs)).to(at::kFloat), in.labels, {},
      red == "none"  ? at::Reduction::None
      : red == "sum" ? at::Reduction::Sum
                     : at::Reduction::Mean,
      kDefaultIgnoreIndex);
  const at::Tensor loss_c = kd + 0.5 * ce;
  loss_c.backward(go);
  // Ours.
  const at::Tensor h = leaf(in.sh), w = leaf(in.sw);
  const auto r = fused_linear_distill_loss(h, w, in.th, in.tw, in.labels, o);
  r.loss.backward(go);
  const bool half = dtype != at::kFloat;
  const double rtol = half ? 2e-2 : 2e-4, atol_rel = half ? 1e-2 : 1e-4;
  EXPECT_TRUE(all_close(r.loss, loss_c, rtol, 1e-5));
  for (const auto& [ours, theirs] :
       {std::pair{h.grad(), hc.grad()}, std::pair{w.grad(), wc.grad()}}) {
    EXPECT_EQ(ours.scalar_type(), dtype);
    EXPECT_TRUE(all_close(ours, theirs, rtol, atol_rel * theirs.abs().max().item<double>()));
  }
}

TEST(FusedLinearDistillLoss, LowPrecisionMatchesTheComposite) {
  at::manual_seed(4);
  std::vector<at::Device> devs = {at::kCPU};
  if (torch::cuda::is_available()) devs.emplace_back(at::kCUDA);
  for (const auto& dev : devs)
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf})
      for (Divergence div : kAll)
        for (const char* red : {"batchmean", "none"})
          for (double temperature : {1.5, 1.0})
            run_low_precision_case(dev, dtype, div, red, temperature);
}

// The half types' lm_head gradient is accumulated in float32 a slice of the vocabulary at a time
// where ATen has no in-place float32 matmul of them (the CPU): 128 MiB of float32 per product, so
// 32768 rows at H 1024 and three slices at V 70000, the last a partial one.
TEST(FusedLinearDistillLoss, TheLmHeadGradientIsRightAcrossVocabularySlices) {
  at::manual_seed(9);
  const int64_t rows = 6, H = 1024, V = 70000;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor sh = at::randn({rows, H}, bf16), th = at::randn({rows, H}, bf16);
  const at::Tensor sw = at::randn({V, H}, bf16) * 0.05, tw = at::randn({V, H}, bf16) * 0.05;
  const auto o = FusedLinearDistillOptions().distill(
      DistillLossOptions().divergence(Divergence::kForwardKl).reduction(torch::kSum));
  const at::Tensor w = leaf(sw);
  fused_linear_distill_loss(sh, w, th, tw, std::nullopt, o).loss.backward();
  // The float64 reference: the logits' gradient chained through the matmul.
  const at::Tensor s = sh.to(at::kDouble).mm(sw.to(at::kDouble).t());
  const at::Tensor t = th.to(at::kDouble).mm(tw.to(at::kDouble).t());
  const at::Tensor g = at::softmax(s, 1) - at::softmax(t, 1);  // d forward KL / d s, summed
  const at::Tensor expected = g.t().mm(sh.to(at::kDouble));
  EXPECT_TRUE(all_close(w.grad(), expected, 2e-2, 1e-2 * expected.abs().max().item<double>()));
}

TEST(FusedLinearDistillLoss, CudaFloat32MatchesTheFloat64CompositeAndChunksAgree) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(5);
  // Temperature 2: the cross-entropy's own kernels; 1: its normaliser from the divergence's
  // statistics (log2 units on CUDA).
  for (double temperature : {2.0, 1.0}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    const Shape c{300, 96, 128, 5000, 5000, 4990, "random", temperature};
    const Inputs in64 = make_inputs(c);
    auto to = [](const at::Tensor& x) { return x.to(at::kCUDA, at::kFloat); };
    for (Divergence div : kAll) {
      const at::Tensor go = at::full({}, 0.75, at::kDouble);
      const Inputs rounded{to(in64.sh).to(at::kCPU, at::kDouble),
                           to(in64.sw).to(at::kCPU, at::kDouble),
                           to(in64.th).to(at::kCPU, at::kDouble),
                           to(in64.tw).to(at::kCPU, at::kDouble), in64.labels};
      const Expected e = composite_reference(rounded, c, div, 0.5, "batchmean", 1.0, 0.25, go);
      for (std::optional<int64_t> chunk :
           {std::optional<int64_t>(64), std::optional<int64_t>(std::nullopt)}) {
        const at::Tensor h = leaf(to(in64.sh)), w = leaf(to(in64.sw));
        const auto r =
            fused_linear_distill_loss(h, w, to(in64.th), to(in64.tw), in64.labels.to(at::kCUDA),
                                      options_of(div, 0.5, c, "batchmean", 1.0, 0.25, chunk));
        r.loss.backward(go.to(at::kCUDA, at::kFloat));
        // float32 logits (TF32 off by default) and float32 kernels: ~1e-6 relative per logit.
        EXPECT_TRUE(all_close(r.loss, e.loss, 1e-4, 1e-6)) << divergence_name(div);
        EXPECT_TRUE(
            all_close(h.grad(), e.grad_h, 1e-3, 1e-4 * e.grad_h.abs().max().item<double>()));
        EXPECT_TRUE(
            all_close(w.grad(), e.grad_w, 1e-3, 1e-4 * e.grad_w.abs().max().item<double>()));
      }
    }
  }
}

TEST(FusedLinearDistillLoss, BadInputsAreErrorsNamingWhatWasExpectedAndFound) {
  const Shape c{4, 3, 5, 10, 12, std::nullopt};
  const Inputs in = make_inputs(c);
  using O = FusedLinearDistillOptions;
  auto err = [&](const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                 const at::Tensor& tw, std::optional<at::Tensor> l = std::nullopt, O o = {}) {
    return error_of([&] { fused_linear_distill_loss(sh, sw, th, tw, l, o); });
  };
  auto has = [](const std::string& e, const char* what) {
    return e.find(what) != std::string::npos
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "'" << what << "' not in: " << e;
  };
  EXPECT_TRUE(has(err(in.sh, in.sw.narrow(1, 0, 2), in.th, in.tw),
                  "student_lm_head must be (V_s, H_s) with H_s = 3"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw.narrow(1, 0, 2)),
                  "teacher_lm_head must be (V_t, H_t) with H_t = 5"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th.narrow(0, 0, 3), in.tw),
                  "leading shape [4] of student_hidden [4, 3] (every dimension but the last; the "
                  "hidden sizes may differ); got [3, 5]"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw.to(at::kFloat)),
                  "teacher_lm_head must have student_hidden's dtype"));
  EXPECT_TRUE(has(
      err(in.sh.to(at::kInt), in.sw.to(at::kInt), in.th.to(at::kInt), in.tw.to(at::kInt)), "Int"));
  EXPECT_TRUE(
      has(err(in.sh, in.sw, in.th, in.tw, std::nullopt, O().ce_weight(0.5)), "needs labels"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt, O().chunk_size(0)),
                  "chunk_size must be >= 1"));
  // Hidden size 0 (either side): the op's own error, not a reshape's.
  EXPECT_TRUE(has(err(in.sh.narrow(1, 0, 0), in.sw.narrow(1, 0, 0), in.th, in.tw),
                  "fused_linear_distill_loss: the hidden sizes H_s and H_t must be >= 1"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th.narrow(1, 0, 0), in.tw.narrow(1, 0, 0)),
                  "must be >= 1; got student_hidden [4, 3] and teacher_hidden [4, 0]"));
  // A Divergence value outside the enum is refused as an unknown name, not read out of bounds.
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt,
                      O().distill(DistillLossOptions().divergence(static_cast<Divergence>(7)))),
                  "divergence must be one of 'tvd', 'forward_kl', 'reverse_kl', 'jsd'; got '(not "
                  "a Divergence)'"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt, O().kd_weight(kInf)), "finite"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt,
                      O().distill(DistillLossOptions().temperature(0))),
                  "temperature"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt,
                      O().distill(DistillLossOptions().divergence(Divergence::kJsd).beta(1.5))),
                  "beta must be in [0, 1]"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt,
                      O().distill(DistillLossOptions().vocab_size(0))),
                  "vocab_size"));
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, in.tw, std::nullopt,
                      O().distill(DistillLossOptions().grad_scale(at::ones({1})))),
                  "grad_scale does not apply"));
  EXPECT_TRUE(
      has(err(in.sh, in.sw, in.th, in.tw, at::zeros({3}, at::kLong)), "labels must have shape"));
  // Only the teacher input that requires grad is named (a head tied between the two models is
  // one tensor, and teacher_hidden needs no detach then).
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, leaf(in.tw)),
                  "teacher_lm_head must not require grad (the teacher is a constant and gets no "
                  "gradient); pass teacher_lm_head.detach()"));
  EXPECT_FALSE(has(err(in.sh, in.sw, in.th, leaf(in.tw)), "teacher_hidden"));
  EXPECT_TRUE(has(err(in.sh, in.sw, leaf(in.th), in.tw),
                  "teacher_hidden must not require grad (the teacher is a constant and gets no "
                  "gradient); pass teacher_hidden.detach()"));
  EXPECT_TRUE(has(err(in.sh, in.sw, leaf(in.th), leaf(in.tw)),
                  "teacher_hidden and teacher_lm_head must not require grad"));
  // An input on another device is named before the call is dispatched (on "meta" the whole call
  // went to the fake kernels); a sparse one too.
  EXPECT_TRUE(has(err(in.sh, in.sw, in.th, at::empty(in.tw.sizes(), at::Device(at::kMeta))),
                  "teacher_lm_head must be on student_hidden's device cpu; got meta"));
  EXPECT_TRUE(has(err(in.sh.to_sparse(), in.sw, in.th, in.tw),
                  "the hidden states and lm_heads must be dense (strided) tensors; got a Sparse "
                  "tensor"));
  EXPECT_EQ(err(in.sh, in.sw, in.th, in.tw, in.labels, O().ce_weight(1.0)),
            "");  // and a good call is none
}

}  // namespace
}  // namespace lossfns::testing

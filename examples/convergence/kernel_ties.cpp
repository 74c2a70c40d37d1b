// Examples 1 and 2: the lossfns op against a composite reference, and the tie rule against the
// legacy two-way sign.
#include <cmath>
#include <cstdio>
#include <limits>

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include "experiments.h"
#include "harness.h"

namespace convergence {

namespace {

// Bitwise equality of every parameter.
bool BitIdentical(distill::Model& a, distill::Model& b) {
  auto other = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    if (!at::equal(item.value(), other[item.key()])) return false;
  }
  return true;
}

}  // namespace

// Example 1. One distillation run twice from the same initial weights and data: once with
// lossfns::tvd_loss, once with the composite 0.5 * |p - q|.sum(-1) (ATen, autograd).
//
// Tolerances, and why: both compute the same function with the same tie rule; they differ in
// summation order only (fp32 accumulation in both). fp32: a per-step loss may differ by a few
// ulps of the row sums (~1e-7 relative); Adam divides by sqrt(v), so gradient rounding reaches
// the weights at ~lr * 1e-6 per step: the budget is 1e-5 relative per step and 1e-4 absolute on
// the final weights (|w| ~ 0.1 - 1). bf16: p and q are bf16 in both runs and the gradient is
// rounded to bf16 (8 bits of mantissa) before the softmax backward; the two runs round it
// identically, so they also agree closely, but a one-ulp difference in a bf16 gradient is
// 2^-8 relative, so the budget is 1e-3 per step and 1e-2 on the weights. Measured on CPU: the
// weights stay bit-identical in both dtypes (the gradients are equal bit for bit) and the
// losses differ by < 1e-7 relative (fp32) / not at all (bf16); see docs/convergence.md.
int KernelVsReference(const Options& o) {
  const bool bf16 = o.dtype == "bf16";
  const double loss_tol = bf16 ? 1e-3 : 1e-5;
  const double weight_tol = bf16 ? 1e-2 : 1e-4;
  const int64_t steps = o.small ? 40 : 400;
  distill::Config c = BaseConfig(o, o.out + "/runs/kernel_vs_reference_teacher");
  distill::Model teacher = PretrainTeacher(c, c.train.out_dir, o.small ? 40 : 400);
  const at::Device device = teacher->lm_head_weight().device();

  distill::Model init = MakeModel(c.student, /*seed=*/7, device);
  Loop op(c, teacher, Clone(init, true), o.loss_dtype(), OpDivergence);
  Loop ref(c, teacher, Clone(init, true), o.loss_dtype(), ReferenceDivergence);

  Csv csv(o.CsvPath("kernel_vs_reference"),
          {"step", "loss_op", "loss_ref", "kd_op", "kd_ref", "rel_diff", "weight_diff"});
  std::printf("kernel_vs_reference (%s, %s): %lld steps\n", o.device.c_str(), o.dtype.c_str(),
              static_cast<long long>(steps));
  std::printf("%6s %12s %12s %10s %11s\n", "step", "loss op", "loss ref", "rel diff", "max|dw|");
  double max_rel = 0;
  WeightDiff diff;
  for (int64_t i = 1; i <= steps; ++i) {
    const StepMetrics a = op.Step(), b = ref.Step();
    const double rel = std::abs(a.loss - b.loss) / std::max(std::abs(b.loss), 1e-12);
    max_rel = std::max(max_rel, rel);
    diff = CompareWeights(op.student(), ref.student());
    csv.Row({double(i), a.loss, b.loss, a.kd, b.kd, rel, diff.max_abs});
    if (i == 1 || i % (steps / 8) == 0) {
      std::printf("%6lld %12.6f %12.6f %10.2e %11.2e\n", static_cast<long long>(i), a.loss, b.loss,
                  rel, diff.max_abs);
    }
  }
  const ValMetrics va = op.Validate(c.train.eval_batches), vb = ref.Validate(c.train.eval_batches);
  std::printf("final val CE: op %.6f  ref %.6f\n", va.ce, vb.ce);
  Checks checks;
  checks.Expect(
      max_rel <= loss_tol,
      fmt::format("per-step loss: max relative difference {:.2e} <= {:.0e}", max_rel, loss_tol));
  checks.Expect(diff.max_abs <= weight_tol,
                fmt::format("final weights: max |op - ref| {:.2e} <= {:.0e} (max |w| {:.3f})",
                            diff.max_abs, weight_tol, diff.max_weight));
  return checks.Finish("kernel_vs_reference " + o.dtype);
}

// Example 2. Ties: the op's gradient (sign(0) = 0) against the legacy two-way sign
// (sign(0) = -1), at the op and through the softmax, in self-distillation.
int Ties(const Options& o) {
  Checks checks;
  distill::Config c = BaseConfig(o, o.out + "/runs/ties_teacher");
  distill::SetArchitecture(c.teacher, c.student);  // self-distillation
  distill::Model teacher = PretrainTeacher(c, c.train.out_dir, o.small ? 60 : 600);
  const at::Device device = teacher->lm_head_weight().device();
  const int64_t V = c.student.vocab_size, ignore = c.distill.ignore_index;
  std::printf("ties (%s, %s)\n", o.device.c_str(), o.dtype.c_str());

  // (a) The op level at step 0: student == teacher, every element a tie (the real columns and
  //     the padded 0.0-vs-0.0 ones). Gradients of kd/n w.r.t. p and w.r.t. the logits.
  {
    distill::Model student = Clone(teacher, true);
    const auto data = distill::MakeDataSource(c.data, V, ignore);
    const distill::Batch batch = data->TrainBatch(0);
    const at::Tensor inputs = batch.inputs.to(device);
    const at::Tensor y = batch.targets.to(device).reshape({-1});
    const double scale = 1.0 / batch.num_targets;
    at::Tensor t;
    {
      torch::NoGradGuard no_grad;
      t = teacher->forward(inputs);
    }
    std::printf("%-8s %12s %14s %14s %16s\n", "rule", "tie frac", "max|dp| ties", "dp at ties",
                "max|dlogits|");
    for (const bool legacy : {false, true}) {
      const at::Tensor s = student->forward(inputs);
      const int64_t Vp = s.size(-1);
      const at::Tensor logits = s.reshape({-1, Vp});
      const at::Tensor p = at::softmax(logits, -1).to(o.loss_dtype());
      const at::Tensor q = at::softmax(t.reshape({-1, Vp}), -1).to(o.loss_dtype());
      const at::Tensor kd = (legacy ? LegacySignDivergence : OpDivergence)(p, q, y, ignore) * scale;
      const auto grads = torch::autograd::grad({kd}, {p, logits});
      const at::Tensor rows = y.ne(ignore);
      const at::Tensor ties = p.eq(q) & rows.unsqueeze(-1);
      const double tie_frac = TieFraction(p, q, y, ignore, V);
      const at::Tensor dp_ties = grads[0].to(at::kFloat).masked_select(ties);
      const double max_dp = dp_ties.abs().max().item<double>();
      const double min_dp = dp_ties.min().item<double>();
      const double max_dlogits = grads[1].abs().max().item<double>();
      std::printf("%-8s %12.4f %14.3e %14.3e %16.3e\n", legacy ? "legacy" : "op", tie_frac, max_dp,
                  min_dp, max_dlogits);
      // The expected legacy value, rounded to the loss dtype as the gradient is.
      const double legacy_value =
          at::scalar_tensor(-0.5 * scale, at::kDouble).to(o.loss_dtype()).item<double>();
      if (!legacy) {
        checks.Expect(tie_frac == 1.0, "step 0 of self-distillation: every real element is a tie");
        checks.Expect(max_dp == 0.0,
                      "op: dL/dp is exactly 0 at every tie (also the padded columns)");
        checks.Expect(max_dlogits == 0.0, "op: dL/dlogits is exactly 0 (nothing moves)");
      } else {
        checks.Expect(
            dp_ties.numel() > 0 && dp_ties.eq(legacy_value).all().item<bool>(),
            fmt::format("legacy: dL/dp = -0.5*scale = {:.3e} at every tie", legacy_value));
        // Through the softmax a constant gradient cancels (J^T 1 = p (1 - sum p) = 0) except
        // for the rounding of sum p: tiny, but not exactly 0. Reported, not asserted.
      }
    }
  }

  // (b) Training: self-distillation on a shifted language (branching + 2: new successors),
  //     1.0 * TVD + 1.0 * CE, op vs legacy from the same copy of the teacher.
  // (c) Pure self-distillation: kd only, no weight decay: the op leaves the student exactly at
  //     the teacher; the legacy sign moves it by amplified rounding noise (Adam normalises
  //     gradients of ~1e-11 to steps of ~lr * 1e-3).
  const int64_t steps = o.small ? 40 : 300;
  const int64_t val_every = o.small ? 10 : 25;
  distill::Config shifted = c;
  shifted.data.synthetic.branching += 2;
  shifted.distill.ce_weight = 1.0;
  shifted.optim.lr = 1e-3;
  shifted.train.steps = steps;
  distill::Config pure = c;
  pure.distill.ce_weight = 0.0;
  pure.optim.weight_decay = 0.0;
  pure.train.steps = steps;
  Loop op(shifted, teacher, Clone(teacher, true), o.loss_dtype(), OpDivergence);
  Loop legacy(shifted, teacher, Clone(teacher, true), o.loss_dtype(), LegacySignDivergence);
  Loop pure_op(pure, teacher, Clone(teacher, true), o.loss_dtype(), OpDivergence);
  Loop pure_legacy(pure, teacher, Clone(teacher, true), o.loss_dtype(), LegacySignDivergence);
  Csv csv(o.CsvPath("ties"), {"step", "loss_op", "loss_legacy", "ties_op", "ties_legacy",
                              "val_ce_op", "val_ce_legacy", "val_tvd_op", "val_tvd_legacy",
                              "pure_drift_op", "pure_drift_legacy", "pure_val_tvd_legacy"});
  std::printf("%6s %9s %9s %9s %10s %10s %10s %10s %11s\n", "step", "ties op", "ties leg",
              "val CE op", "val CE leg", "TVD op", "TVD leg", "pure op", "pure leg");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double min_ties = 1.0, later_ties = 0.0;  // later_ties: mean tie fraction over steps 2..N
  ValMetrics last_op, last_legacy;
  WeightDiff drift_op, drift_legacy;
  for (int64_t i = 1; i <= steps; ++i) {
    const StepMetrics a = op.Step(), b = legacy.Step();
    pure_op.Step();
    pure_legacy.Step();
    min_ties = std::min(min_ties, a.tie_fraction);
    if (i >= 2) later_ties += a.tie_fraction / static_cast<double>(steps - 1);
    drift_op = CompareWeights(pure_op.student(), teacher);
    drift_legacy = CompareWeights(pure_legacy.student(), teacher);
    ValMetrics va{nan, nan}, vb{nan, nan}, vp{nan, nan};
    if (i % val_every == 0 || i == 1) {
      va = last_op = op.Validate(c.train.eval_batches);
      vb = last_legacy = legacy.Validate(c.train.eval_batches);
      vp = pure_legacy.Validate(c.train.eval_batches);
      std::printf("%6lld %9.4f %9.4f %9.4f %10.4f %10.5f %10.5f %10.2e %11.2e\n",
                  static_cast<long long>(i), a.tie_fraction, b.tie_fraction, va.ce, vb.ce, va.tvd,
                  vb.tvd, drift_op.max_abs, drift_legacy.max_abs);
    }
    csv.Row({double(i), a.loss, b.loss, a.tie_fraction, b.tie_fraction, va.ce, vb.ce, va.tvd,
             vb.tvd, drift_op.max_abs, drift_legacy.max_abs, vp.tvd});
  }
  checks.Expect(BitIdentical(pure_op.student(), teacher),
                fmt::format("pure self-distillation, op: student bit-identical to the teacher "
                            "after {} steps",
                            steps));
  checks.Expect(drift_legacy.max_abs > 0.0,
                fmt::format("pure self-distillation, legacy: student drifted by max |dw| = {:.2e}",
                            drift_legacy.max_abs));
  // Once the student has moved, exact ties among the real elements are rare in fp32 (24-bit
  // mantissas) and frequent in bf16 (8 bits: p == q whenever they agree to ~0.4%). Measured
  // on CPU (--small): 0 in fp32, ~2% in bf16; the bounds leave 10x room either way.
  if (o.dtype == "bf16") {
    checks.Expect(later_ties > 0.002, fmt::format("bf16: partial ties are frequent: {:.2f}% of "
                                                  "real elements after step 1 (> 0.2%)",
                                                  100 * later_ties));
  } else {
    checks.Expect(later_ties < 0.001, fmt::format("fp32: partial ties are rare: {:.4f}% of real "
                                                  "elements after step 1 (< 0.1%)",
                                                  100 * later_ties));
  }
  const double ce_gap = std::abs(last_op.ce - last_legacy.ce);
  std::printf(
      "shifted data, final: val CE op %.5f legacy %.5f (|diff| %.2e); TVD to the teacher "
      "op %.5f legacy %.5f; min tie fraction (op run) %.4f\n",
      last_op.ce, last_legacy.ce, ce_gap, last_op.tvd, last_legacy.tvd, min_ties);
  return checks.Finish("ties " + o.dtype);
}

}  // namespace convergence

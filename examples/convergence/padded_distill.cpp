// Examples 3 and 4: padded vs unpadded vocabulary, and distillation vs hard labels.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/utils.h>

#include "distill/run.h"
#include "distill/trainer.h"
#include "experiments.h"
#include "harness.h"

namespace convergence {

namespace {

// Copies the parameters of the unpadded `from` into the padded `to` (same architecture except
// the vocabulary rows): the first vocab_size rows of the embedding / lm_head, everything else
// whole. The padded rows of `to` keep their own values. Buffers (the padded mask) are not
// copied: they differ by construction.
void EmbedInto(distill::Model& from, distill::Model& to) {
  torch::NoGradGuard no_grad;
  auto src = from->named_parameters();
  for (auto& item : to->named_parameters()) {
    const at::Tensor& s = src[item.key()];
    if (s.sizes() == item.value().sizes()) {
      item.value().copy_(s);
    } else {
      item.value().narrow(0, 0, s.size(0)).copy_(s);
    }
  }
}

// max |a - b| over the parameters of the unpadded `a`, comparing the matching rows of `b`.
double RealWeightDiff(distill::Model& a, distill::Model& b) {
  torch::NoGradGuard no_grad;
  auto other = b->named_parameters();
  double d = 0;
  for (const auto& item : a->named_parameters()) {
    const at::Tensor& x = item.value();
    const at::Tensor y = other[item.key()].narrow(0, 0, x.size(0));
    d = std::max(d, (x.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>());
  }
  return d;
}

}  // namespace

// Example 3. The same distillation with a 259-token vocabulary (37 with --small) unpadded and
// padded to a multiple of 64. The padded models are the unpadded ones with extra rows whose
// logits are -inf: mathematically the same training. Numerically the padded matmuls and
// softmaxes have other shapes (other blocking and reduction orders), so the runs agree to float
// rounding at first: over the first 50 steps the budget is 1e-4 relative on the per-step loss
// and 1e-3 on the real weights (fp32; bf16 p, q: 1e-2 and 1e-2). On CUDA in bf16 the models
// themselves run under autocast (bf16 matmuls, 8-bit mantissas, and cuBLAS picks other kernels
// for the two shapes), so the gradients differ by bf16 rounding from step 1, and Adam turns a
// rounding difference in a near-zero gradient entry into an lr-sized step: the real weights get a
// budget of 5e-2 at step 50 there (the summed learning rate over 50 steps is 0.12; measured on an
// H200: 1.9e-2), the per-step loss keeps 1e-2 (measured: 3e-4). After that the trajectories
// separate as any two roundings of one training do (measured on CPU, full size: 1e-2 relative
// per-step loss by step 100): Adam divides by sqrt(v), so a rounding difference in a near-zero
// gradient entry becomes a whole lr-sized step. What must still agree is the outcome: the final
// validation loss, within 1e-2 relative (measured: 6e-4).
// The padded lm_head rows get exactly zero gradient, so AdamW changes them only by decoupled
// weight decay: they must equal, bit for bit, their initial values multiplied by
// (1 - lr_t * weight_decay) step after step (replayed here with the same fp32 multiplications).
int Padded(const Options& o) {
  const bool bf16 = o.dtype == "bf16";
  const bool autocast = bf16 && o.device == "cuda";
  const double loss_tol = bf16 ? 1e-2 : 1e-4, val_tol = 1e-2;
  const double weight_tol = autocast ? 5e-2 : (bf16 ? 1e-2 : 1e-3);
  const int64_t early_steps = 50;  // the window of step-by-step agreement
  const int64_t V = o.small ? 37 : 259;
  const int64_t steps = o.small ? 40 : 400;
  distill::Config cu = BaseConfig(o, o.out + "/runs/padded_teacher");
  for (distill::ModelConfig* m : {static_cast<distill::ModelConfig*>(&cu.student),
                                  static_cast<distill::ModelConfig*>(&cu.teacher)}) {
    m->vocab_size = V;
    m->pad_vocab_to_multiple_of = 1;
  }
  cu.data.synthetic.order = 1;
  cu.train.steps = steps;
  distill::Config cp = cu;
  cp.student.pad_vocab_to_multiple_of = cp.teacher.pad_vocab_to_multiple_of = 64;
  const int64_t Vp = cp.student.padded_vocab_size();

  distill::Model teacher_u = PretrainTeacher(cu, cu.train.out_dir, o.small ? 30 : 300);
  const at::Device device = teacher_u->lm_head_weight().device();
  distill::Model teacher_p = MakeModel(cp.teacher, /*seed=*/99, device);
  EmbedInto(teacher_u, teacher_p);
  teacher_p->eval();
  for (auto& p : teacher_p->parameters()) p.set_requires_grad(false);
  distill::Model student_u = MakeModel(cu.student, /*seed=*/7, device);
  distill::Model student_p = MakeModel(cp.student, /*seed=*/8, device);
  EmbedInto(student_u, student_p);
  at::Tensor expected = student_p->lm_head_weight().narrow(0, V, Vp - V).detach().clone();
  const at::Tensor initial = expected.clone();

  Loop lu(cu, teacher_u, student_u, o.loss_dtype(), OpDivergence);
  Loop lp(cp, teacher_p, student_p, o.loss_dtype(), OpDivergence);
  Csv csv(o.CsvPath("padded"), {"step", "loss_unpadded", "loss_padded", "rel_diff",
                                "real_weight_diff", "padded_rows_bit_identical"});
  std::printf("padded (%s, %s): vocabulary %lld -> %lld columns, %lld steps\n", o.device.c_str(),
              o.dtype.c_str(), static_cast<long long>(V), static_cast<long long>(Vp),
              static_cast<long long>(steps));
  std::printf("%6s %12s %12s %10s %11s %8s\n", "step", "unpadded", "padded", "rel diff", "max|dw|",
              "pad rows");
  double max_rel = 0, weight_diff = 0, early_rel = 0, early_weight_diff = 0;
  bool rows_identical = true;
  const double weight_decay = cp.optim.weight_decay;
  for (int64_t i = 1; i <= steps; ++i) {
    const StepMetrics a = lu.Step(), b = lp.Step();
    {
      torch::NoGradGuard no_grad;
      expected.mul_(1 - lp.last_lr() * weight_decay);  // what AdamW does to a zero-grad row
    }
    const bool identical = at::equal(student_p->lm_head_weight().narrow(0, V, Vp - V), expected);
    rows_identical = rows_identical && identical;
    const double rel = std::abs(a.loss - b.loss) / std::max(std::abs(a.loss), 1e-12);
    max_rel = std::max(max_rel, rel);
    weight_diff = RealWeightDiff(student_u, student_p);
    if (i <= early_steps) {
      early_rel = max_rel;
      early_weight_diff = weight_diff;
    }
    csv.Row({double(i), a.loss, b.loss, rel, weight_diff, identical ? 1.0 : 0.0});
    if (i == 1 || i % (steps / 8) == 0) {
      std::printf("%6lld %12.6f %12.6f %10.2e %11.2e %8s\n", static_cast<long long>(i), a.loss,
                  b.loss, rel, weight_diff, identical ? "equal" : "DIFFER");
    }
  }
  const ValMetrics vu = lu.Validate(cu.train.eval_batches), vp = lp.Validate(cp.train.eval_batches);
  std::printf("final val CE: unpadded %.6f  padded %.6f\n", vu.ce, vp.ce);
  const int64_t early = std::min(steps, early_steps);
  const double val_rel = std::abs(vu.ce - vp.ce) / vu.ce;
  std::printf("whole run: max rel. loss diff %.2e, final max |dw| %.2e (reported, not asserted)\n",
              max_rel, weight_diff);
  Checks checks;
  checks.Expect(early_rel <= loss_tol, fmt::format("steps 1-{}: per-step loss max relative "
                                                   "difference {:.2e} <= {:.0e}",
                                                   early, early_rel, loss_tol));
  checks.Expect(early_weight_diff <= weight_tol,
                fmt::format("step {}: real weights max |padded - unpadded| {:.2e} <= {:.0e}", early,
                            early_weight_diff, weight_tol));
  checks.Expect(val_rel <= val_tol, fmt::format("final validation loss: relative difference "
                                                "{:.2e} <= {:.0e}",
                                                val_rel, val_tol));
  checks.Expect(rows_identical,
                "padded lm_head rows bit-identical to init x weight decay, every step");
  // Not vacuous: with weight decay the rows did change (only by the decay).
  checks.Expect(weight_decay == 0 || !at::equal(expected, initial),
                "the replayed decay changed the padded rows (the comparison can fail)");
  return checks.Finish("padded " + o.dtype);
}

// Example 4. The distill library's own Trainer, three runs: the teacher pretrained on hard
// labels, the student distilled from it (1.0 * TVD + 0.1 * CE), and the same student (same
// seed, same data order) on hard labels only, for the same number of steps. The assertion:
// the distilled student ends with the lower validation loss. The entropy floor is the lowest
// loss any model can reach on this language (exact, see docs/trainer.md).
int DistillWorks(const Options& o) {
  distill::Config c = BaseConfig(o, o.out + "/runs/distill_works");
  if (o.dtype == "bf16") {
    if (o.device != "cuda") throw std::runtime_error("distill_works: bf16 needs --device cuda");
    c.train.precision = distill::Precision::kBf16;
  }
  const int64_t steps = o.small ? 100 : 600, eval_every = o.small ? 10 : 50;
  c.train.steps = steps;
  c.teacher.pretrain_steps = o.small ? 200 : 1000;
  const distill::Config tc = distill::TeacherStageConfig(c);
  double teacher_val = 0;
  {
    distill::Trainer teacher(tc, distill::RunOptions::Quiet(/*fresh=*/true));
    teacher.TrainUntil(tc.train.steps);  // ends with a checkpoint: the students load it
    teacher_val = teacher.Evaluate().val_loss;
  }
  distill::Trainer student(distill::StudentStageConfig(c),
                           distill::RunOptions::Quiet(/*fresh=*/true));
  distill::Trainer baseline(distill::BaselineStageConfig(c),
                            distill::RunOptions::Quiet(/*fresh=*/true));
  const double floor = student.data().EntropyFloor().value();

  Csv csv(o.CsvPath("distill_works"), {"step", "val_distilled", "val_hard_labels", "val_teacher",
                                       "entropy_floor", "train_loss_distilled", "train_ce_hard"});
  std::printf("distill_works (%s, %s): teacher %lld steps, students %lld steps\n", o.device.c_str(),
              o.dtype.c_str(), static_cast<long long>(tc.train.steps),
              static_cast<long long>(steps));
  std::printf("%6s %11s %11s %9s %9s\n", "step", "distilled", "hard lbl", "teacher", "floor");
  double val_s = student.Evaluate().val_loss, val_b = baseline.Evaluate().val_loss;
  csv.Row({0, val_s, val_b, teacher_val, floor, NAN, NAN});
  for (int64_t i = 1; i <= steps; ++i) {
    const distill::StepResult rs = student.Step(), rb = baseline.Step();
    if (i % eval_every != 0) continue;
    val_s = student.Evaluate().val_loss;
    val_b = baseline.Evaluate().val_loss;
    csv.Row({double(i), val_s, val_b, teacher_val, floor, rs.loss, rb.ce_loss});
    if ((i / eval_every) % std::max<int64_t>(1, steps / eval_every / 5) == 0) {
      std::printf("%6lld %11.4f %11.4f %9.4f %9.4f\n", static_cast<long long>(i), val_s, val_b,
                  teacher_val, floor);
    }
  }
  std::printf("excess over the floor: teacher %+.4f, distilled %+.4f, hard labels %+.4f\n",
              teacher_val - floor, val_s - floor, val_b - floor);
  Checks checks;
  checks.Expect(val_s < val_b, fmt::format("distilled student {:.4f} < hard-label student {:.4f} "
                                           "after {} steps",
                                           val_s, val_b, steps));
  return checks.Finish("distill_works " + o.dtype);
}

}  // namespace convergence

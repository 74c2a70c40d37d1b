// distill.fused_linear: the trainer's loss from the models' last hidden states and lm_heads
// (lossfns::fused_linear_distill_loss) trains as the logits path does, on CPU in fp32, for both
// model families, with a padded vocabulary and a cross-entropy term. The suite is named
// Training* so that `ctest -R "distill\.Training"` runs it with the other training tests.
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "distill/memory_estimate.h"
#include "distill/model.h"
#include "distill/run.h"
#include "distill/run_dir.h"
#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

using testing::Grads;
using testing::MakeTeacher;
using testing::TempRunDir;
using testing::TinyConfig;

// TinyConfig's models (vocab 24 padded to 32: 8 padded lm_head rows, masked to -inf by
// forward()) in `family`, distilling with a cross-entropy term and kd_weight != 1 from a teacher
// pretrained for a few steps in `<dir>-teacher`, two micro-batches per step. gpt: forward KL,
// tied embeddings; llama: JSD with beta 0.3 and an untied lm_head (as many Hugging Face models),
// so a dropped kd_weight, beta or untied head shows.
Config FamilyDistillConfig(ModelFamily family, const std::string& dir) {
  Config c = TinyConfig(dir);
  c.student.family = family;
  c.teacher.family = family;
  c.train.mode = Mode::kDistill;
  c.train.grad_accum = 2;
  c.distill.divergence = Divergence::kForwardKl;
  if (family == ModelFamily::kLlama) {
    c.distill.divergence = Divergence::kJsd;
    c.distill.jsd_beta = 0.3;
    c.student.tie_embeddings = false;
    c.teacher.tie_embeddings = false;
  }
  c.distill.temperature = 2.0;
  c.distill.ce_weight = 0.5;
  c.distill.kd_weight = 0.7;
  c.teacher.checkpoint = MakeTeacher(c, dir + "-teacher", 5);
  return c;
}

// fp32 on the CPU, the same weights and data: the two paths differ only in rounding. The fused
// op multiplies chunks of rows where forward() multiplies all of them at once (a different
// blocking of the same dot products, ~1e-7 relative each), accumulates the lm_head gradient
// chunk by chunk, and sums the loss in a different order. Each per-token loss term is a sum of
// O(log V) terms that cancel (the divergence is small when the models agree), so its rounding
// error is absolute, ~1e-7 nats whatever the divergence: kAtol = 1e-6 nats per token; kRtol =
// 1e-5 for the rest (measured here: at most 2e-7 nats and 6e-8 relative after 3 AdamW steps,
// whose updates move the two runs' weights apart by the same rounding; identical gradient norms
// to the printed digits). Far below any real difference: counting a padded column, dropping the
// temperature or the CE term changes the loss in its first or second digit.
constexpr double kAtol = 1e-6, kRtol = 1e-5;

void ExpectClose(double fused, double unfused, const std::string& what) {
  EXPECT_NEAR(fused, unfused, kAtol + kRtol * std::abs(unfused)) << what;
}

// The dispatcher ops that `f` calls on this thread (their RecordFunction names, such as
// "lossfns::fused_linear_distill_loss"): which path a trainer took, seen from outside it.
std::set<std::string>* recorded_ops = nullptr;
std::set<std::string> OpsCalledBy(const std::function<void()>& f) {
  std::set<std::string> names;
  // Removed whatever f throws: gtest goes on with the next test on this thread.
  struct Recording {
    at::CallbackHandle handle;
    explicit Recording(std::set<std::string>* into) {
      recorded_ops = into;
      handle = at::addThreadLocalCallback(
          at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                         -> std::unique_ptr<at::ObserverContext> {
            recorded_ops->insert(fn.name());
            return nullptr;
          }).scopes({at::RecordScope::FUNCTION}));
    }
    ~Recording() {
      at::removeCallback(handle);
      recorded_ops = nullptr;
    }
  };
  {
    const Recording recording(&names);
    f();
  }
  return names;
}

class TrainingFusedLinearTest : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(TrainingFusedLinearTest, StepsMatchTheLogitsPath) {
  Config c = FamilyDistillConfig(GetParam(), TempRunDir());
  c.distill.fused_linear = FusedLinear::kOff;  // the logits path (auto is the fused one on CUDA)
  Config fused_config = c;
  fused_config.distill.fused_linear = FusedLinear::kOn;
  fused_config.train.out_dir = c.train.out_dir + "-fused";
  Trainer unfused(c, RunOptions::Quiet());
  Trainer fused(fused_config, RunOptions::Quiet());

  // One micro-batch's gradient, element by element, from identical weights: atol covers the
  // entries that are rounding noise around 0 (1e-5 of the largest gradient entry).
  const Batch batch = unfused.data().TrainBatch(0);
  unfused.optimizer().zero_grad(true);
  fused.optimizer().zero_grad(true);
  StepResult u0, f0;
  // Each trainer took the path it was configured for (the comparison below would pass
  // trivially if both took the same one).
  const std::set<std::string> unfused_ops =
      OpsCalledBy([&] { u0 = unfused.AccumulateGradients({batch}); });
  const std::set<std::string> fused_ops =
      OpsCalledBy([&] { f0 = fused.AccumulateGradients({batch}); });
  EXPECT_EQ(fused_ops.count("lossfns::fused_linear_distill_loss"), 1u);
  EXPECT_EQ(fused_ops.count("lossfns::distill_loss"), 0u);
  EXPECT_EQ(unfused_ops.count("lossfns::fused_linear_distill_loss"), 0u);
  EXPECT_EQ(unfused_ops.count("lossfns::distill_loss"), 1u);
  ExpectClose(f0.kd_loss, u0.kd_loss, "kd_loss");
  ExpectClose(f0.ce_loss, u0.ce_loss, "ce_loss");
  ExpectClose(f0.loss, u0.loss, "loss");
  const auto gu = Grads(unfused.student()), gf = Grads(fused.student());
  ASSERT_EQ(gu.size(), gf.size());
  double max_grad = 0;
  for (const auto& g : gu) max_grad = std::max(max_grad, g.abs().max().item<double>());
  for (size_t i = 0; i < gu.size(); ++i) {
    const double err = (gf[i] - gu[i]).abs().sub(gu[i].abs() * kRtol).max().item<double>();
    EXPECT_LE(err, kRtol * max_grad) << "parameter " << i;
  }
  // The padded lm_head rows get no gradient in either path (the op's vocab_size cuts them).
  const int64_t V = c.student.vocab_size;
  const at::Tensor head_grad = fused.student().lm_head_weight().grad();
  ASSERT_TRUE(head_grad.defined());
  EXPECT_TRUE(head_grad.slice(0, V).eq(0).all().item<bool>());

  // A few optimizer steps: the same losses and gradient norms step after step.
  for (int step = 1; step <= 3; ++step) {
    const StepResult u = unfused.Step(), f = fused.Step();
    const std::string at_step = " at step " + std::to_string(step);
    EXPECT_EQ(f.tokens, u.tokens);
    ExpectClose(f.kd_loss, u.kd_loss, "kd_loss" + at_step);
    ExpectClose(f.ce_loss, u.ce_loss, "ce_loss" + at_step);
    ExpectClose(f.loss, u.loss, "loss" + at_step);
    ExpectClose(f.grad_norm, u.grad_norm, "grad_norm" + at_step);
  }
  // Evaluation takes the fused path too, the teacher's cross-entropy included.
  const EvalResult ue = unfused.Evaluate(), fe = fused.Evaluate();
  ExpectClose(fe.val_loss, ue.val_loss, "val_loss");
  ExpectClose(fe.val_kd, ue.val_kd, "val_kd");
  ExpectClose(fe.teacher_val_loss, ue.teacher_val_loss, "teacher_val_loss");
}

// forward() is the logits of forward_hidden() with the padded columns masked, bit for bit: the
// fused path sees exactly the operands that the logits path multiplies.
TEST_P(TrainingFusedLinearTest, ForwardIsTheLogitsOfForwardHidden) {
  ModelConfig m = TinyConfig("unused").student;
  m.family = GetParam();
  torch::manual_seed(0);
  Model model = MakeModel(m);
  const at::Tensor tokens = at::randint(m.vocab_size, {3, 7}, at::kLong);
  const LogitsOperands ops = MakeLogitsOperands(*model, model->forward_hidden(tokens));
  EXPECT_EQ(ops.hidden.sizes(), (at::IntArrayRef{3, 7, m.d_model}));
  const at::Tensor expected =
      at::linear(ops.hidden, ops.lm_head)
          .masked_fill(model->padded_mask(), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(at::equal(model->forward(tokens), expected));
}

INSTANTIATE_TEST_SUITE_P(, TrainingFusedLinearTest,
                         ::testing::Values(ModelFamily::kGpt, ModelFamily::kLlama),
                         [](const auto& info) { return std::string(EnumName(info.param)); });

// The key says how the loss is computed, not what: a run resumes with it switched, and the
// pipeline's pretraining stages (teacher, baseline) turn it off.
TEST(TrainingFusedLinearConfigTest, NotPartOfTheRunIdentityAndOffWhenPretraining) {
  Config c = FamilyDistillConfig(ModelFamily::kGpt, TempRunDir());
  Config fused = c;
  fused.distill.fused_linear = FusedLinear::kOn;
  Config off = c;
  off.distill.fused_linear = FusedLinear::kOff;
  EXPECT_EQ(RunIdentity(fused), RunIdentity(c));
  EXPECT_EQ(RunIdentity(off), RunIdentity(c));
  EXPECT_EQ(TeacherStageConfig(fused).distill.fused_linear, FusedLinear::kOff);
  EXPECT_EQ(BaselineStageConfig(fused).distill.fused_linear, FusedLinear::kOff);
  EXPECT_EQ(StudentStageConfig(fused).distill.fused_linear, FusedLinear::kOn);
}

// auto (the default) is the fused loss on CUDA and the logits path on the CPU; true and false
// hold everywhere. The memory estimate follows the same rule.
TEST(TrainingFusedLinearConfigTest, AutoIsOnWhereTheDeviceIsCuda) {
  EXPECT_EQ(DistillConfig().fused_linear, FusedLinear::kAuto);
  EXPECT_TRUE(UsesFusedLinear(FusedLinear::kAuto, /*cuda=*/true));
  EXPECT_FALSE(UsesFusedLinear(FusedLinear::kAuto, /*cuda=*/false));
  EXPECT_TRUE(UsesFusedLinear(FusedLinear::kOn, false));
  EXPECT_FALSE(UsesFusedLinear(FusedLinear::kOff, true));
  Config c = TinyConfig("unused");
  c.train.mode = Mode::kDistill;
  c.student.vocab_size = c.teacher.vocab_size = 50000;
  const auto last = [&](c10::DeviceType d) { return EstimateMemory(c, d).terms.back().what; };
  EXPECT_NE(last(c10::DeviceType::CUDA).find("fused loss"), std::string::npos);
  EXPECT_EQ(last(c10::DeviceType::CPU).find("fused loss"), std::string::npos);
}

// The start-up memory estimate counts no (BT, V) tensor with the fused loss: its last term is the
// hidden states and the fp32 lm_head gradient accumulator, far below the logits at a large V.
TEST(TrainingFusedLinearConfigTest, MemoryEstimateHasNoLogitsTerm) {
  Config c = TinyConfig("unused");
  c.train.mode = Mode::kDistill;
  c.student.vocab_size = c.teacher.vocab_size = 50000;
  c.student.pad_vocab_to_multiple_of = c.teacher.pad_vocab_to_multiple_of = 64;
  const MemoryEstimate logits = EstimateMemory(c, c10::DeviceType::CPU);
  c.distill.fused_linear = FusedLinear::kOn;
  const MemoryEstimate fused = EstimateMemory(c, c10::DeviceType::CPU);
  ASSERT_EQ(fused.terms.size(), logits.terms.size());
  const MemoryTerm& term = fused.terms.back();
  const double tokens = 8 * 16, V = 50048, H = 32;  // TinyConfig: batch 8 x 16 tokens, d_model 32
  EXPECT_EQ(term.bytes, tokens * 4 * (2 * H + H) + 4 * V * H);
  EXPECT_NE(term.keys.find("distill.fused_linear"), std::string::npos) << term.keys;
  EXPECT_LT(term.bytes, logits.terms.back().bytes / 10);
}

}  // namespace
}  // namespace distill

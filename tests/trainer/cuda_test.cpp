// CUDA + bf16 autocast: a short distillation run trains, checkpoints and resumes on the GPU.
// distill.fused_linear matches the logits path under bf16. Skipped (GTEST_SKIP) where no CUDA
// device is available.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "distill/autocast.h"
#include "distill/checkpoint.h"
#include "distill/model.h"
#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

// The teacher's fingerprint is computed where its weights are (a loop on the CPU, tensor sums
// on the device): the same integers, so a run resumed on another device sees the same teacher.
TEST(CudaTest, WeightsFingerprintIsTheSameOnTheDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Config c = testing::TinyConfig(testing::TempRunDir());
  c.teacher.vocab_size = 3000;  // an embedding of more than one 2^24-unit slice
  c.teacher.d_model = 3000;
  c.teacher.n_head = 4;
  c.teacher.n_layer = 1;
  c.teacher.mlp_ratio = 1.0;
  Model model = MakeModel(c.teacher);
  const std::string cpu = WeightsFingerprint(*model);
  model->to(at::Device(at::kCUDA, 0));
  EXPECT_EQ(WeightsFingerprint(*model), cpu);
  model->to(at::kBFloat16);  // other bits: another fingerprint, on either device
  const std::string bf16 = WeightsFingerprint(*model);
  EXPECT_NE(bf16, cpu);
  model->to(at::Device(at::kCPU));
  EXPECT_EQ(WeightsFingerprint(*model), bf16);
}

TEST(CudaTest, Bf16DistillationTrainsAndResumes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Config c = testing::TinyConfig(testing::TempRunDir());
  c.train.device = "cuda";
  c.train.precision = Precision::kBf16;
  // As in TrainingTest.DistillStepsReduceValidationKd: a 60-step teacher, 40 distillation steps.
  c.teacher.checkpoint = testing::MakeTeacher(c, c.train.out_dir + "-teacher", 60);
  c.train.mode = Mode::kDistill;
  c.distill.ce_weight = 0.5;
  c.train.steps = 40;

  at::Tensor trained;
  {
    Trainer trainer(c, RunOptions::Quiet());
    ASSERT_TRUE(trainer.device().is_cuda());
    const EvalResult before = trainer.Evaluate();
    const StepResult step = trainer.Step();
    EXPECT_TRUE(std::isfinite(step.loss) && std::isfinite(step.grad_norm));
    // Parameters and optimizer state stay fp32 under autocast; the logits are bf16.
    EXPECT_EQ(trainer.student().lm_head_weight().scalar_type(), at::kFloat);
    const EvalResult after = trainer.Train();
    EXPECT_LT(after.val_kd, before.val_kd) << before.val_kd << " -> " << after.val_kd;
    EXPECT_TRUE(std::isfinite(after.val_loss));
    trained = trainer.student().lm_head_weight().detach().clone();
  }  // (one trainer per run directory: this one lets it go before the resume)

  Config longer = c;
  longer.train.steps = 42;
  Trainer resumed(longer, RunOptions::Quiet());
  EXPECT_EQ(resumed.step(), 40);
  EXPECT_TRUE(at::equal(resumed.student().lm_head_weight(), trained));
  resumed.Train();
  EXPECT_EQ(resumed.step(), 42);
}

// train.activation_checkpointing under bf16 autocast with the micro-batches captured in a CUDA
// graph (the recomputation and its backward inside the capture): the same losses and weights as
// without it, up to what two runs without it differ by (nothing, where the kernels are
// deterministic), in both families.
TEST(CudaTest, Bf16ActivationCheckpointingUnderTheCudaGraph) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  struct Run {
    std::vector<double> losses;
    std::vector<at::Tensor> weights;
  };
  const auto run = [](ModelFamily family, bool checkpoint, const std::string& suffix) {
    Config c = testing::TinyConfig(testing::TempRunDir(suffix));
    c.student.family = family;
    c.train.device = "cuda";
    c.train.precision = Precision::kBf16;
    c.train.grad_accum = 2;
    c.train.cuda_graph = CudaGraph::kOn;
    c.train.activation_checkpointing = checkpoint;
    Trainer trainer(c, RunOptions::Quiet());
    Run r;
    for (int step = 0; step < 6; ++step) r.losses.push_back(trainer.Step().loss);
    EXPECT_TRUE(trainer.cuda_graph_captured()) << suffix;
    for (const auto& p : trainer.student().parameters()) r.weights.push_back(p.detach().cpu());
    return r;
  };
  const auto diff = [](const Run& a, const Run& b) {
    double worst = 0;
    for (size_t i = 0; i < a.losses.size(); ++i) {
      worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]));
    }
    for (size_t i = 0; i < a.weights.size(); ++i) {
      worst = std::max(worst, (a.weights[i] - b.weights[i]).abs().max().item<double>());
    }
    return worst;
  };
  for (const ModelFamily family : {ModelFamily::kGpt, ModelFamily::kLlama}) {
    const std::string name = family == ModelFamily::kGpt ? "gpt" : "llama";
    const Run plain = run(family, false, "-" + name + "-plain");
    const Run again = run(family, false, "-" + name + "-again");
    const Run checkpointed = run(family, true, "-" + name + "-checkpointed");
    EXPECT_LE(diff(checkpointed, plain), diff(again, plain)) << name;
  }
}

// distill.fused_linear under bf16 autocast: the fused op gets both lm_head operands in bf16
// (what at::linear casts them to in forward()) and trains as the logits path does. Not rounding-
// level here: both paths round the logits to bf16 (8 bits of mantissa, 4e-3 relative), but from
// matmuls of different shapes (token chunks vs all tokens), whose fp32 accumulations may round
// to neighbouring bf16 values; the loss sums average that over ~100 tokens. 2e-2 relative is
// ~5 bf16 ulps, far below a real difference (a padded column or the CE term changes the loss
// by tens of percent at this vocabulary).
TEST(CudaTest, Bf16FusedLinearMatchesTheLogitsPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Config c = testing::TinyConfig(testing::TempRunDir());
  c.train.device = "cuda";
  c.train.precision = Precision::kBf16;
  c.teacher.checkpoint = testing::MakeTeacher(c, c.train.out_dir + "-teacher", 5);
  c.train.mode = Mode::kDistill;
  c.distill.ce_weight = 0.5;
  c.distill.fused_linear = FusedLinear::kOff;  // the logits path (auto is the fused one on CUDA)
  Config fused_config = c;
  fused_config.distill.fused_linear = FusedLinear::kOn;
  fused_config.train.out_dir = c.train.out_dir + "-fused";
  Trainer unfused(c, RunOptions::Quiet());
  Trainer fused(fused_config, RunOptions::Quiet());

  {
    AutocastGuard autocast(true);
    const at::Tensor tokens = unfused.data().TrainBatch(0).inputs.to(fused.device());
    const LogitsOperands ops =
        MakeLogitsOperands(fused.student(), fused.student().forward_hidden(tokens));
    EXPECT_EQ(ops.hidden.scalar_type(), at::kBFloat16);
    EXPECT_EQ(ops.lm_head.scalar_type(), at::kBFloat16);
  }
  constexpr double kRtol = 2e-2;
  for (int step = 1; step <= 3; ++step) {
    const StepResult u = unfused.Step(), f = fused.Step();
    EXPECT_NEAR(f.kd_loss, u.kd_loss, kRtol * u.kd_loss) << "step " << step;
    EXPECT_NEAR(f.ce_loss, u.ce_loss, kRtol * u.ce_loss) << "step " << step;
    EXPECT_NEAR(f.grad_norm, u.grad_norm, kRtol * u.grad_norm) << "step " << step;
  }
  const EvalResult ue = unfused.Evaluate(), fe = fused.Evaluate();
  EXPECT_NEAR(fe.val_loss, ue.val_loss, kRtol * ue.val_loss);
  EXPECT_NEAR(fe.val_kd, ue.val_kd, kRtol * ue.val_kd);
}

}  // namespace
}  // namespace distill

// CUDA + bf16 autocast: a short distillation run trains, checkpoints and resumes on the GPU.
// Skipped (GTEST_SKIP) where no CUDA device is available.
#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

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

  Trainer trainer(c, RunOptions{false, true});
  ASSERT_TRUE(trainer.device().is_cuda());
  const EvalResult before = trainer.Evaluate();
  const StepResult step = trainer.Step();
  EXPECT_TRUE(std::isfinite(step.loss) && std::isfinite(step.grad_norm));
  // Parameters and optimizer state stay fp32 under autocast; the logits are bf16.
  EXPECT_EQ(trainer.student().lm_head_weight().scalar_type(), at::kFloat);
  const EvalResult after = trainer.Train();
  EXPECT_LT(after.val_kd, before.val_kd) << before.val_kd << " -> " << after.val_kd;
  EXPECT_TRUE(std::isfinite(after.val_loss));

  Config longer = c;
  longer.train.steps = 42;
  Trainer resumed(longer, RunOptions{false, true});
  EXPECT_EQ(resumed.step(), 40);
  EXPECT_TRUE(at::equal(resumed.student().lm_head_weight(), trainer.student().lm_head_weight()));
  resumed.Train();
  EXPECT_EQ(resumed.step(), 42);
}

}  // namespace
}  // namespace distill

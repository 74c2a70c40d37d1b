// The scenario configs (configs/self_distill_teacher.yaml, self_distill.yaml, padded_vocab.yaml,
// docs/scenarios.md): they parse, say what the docs say they say, and run a few steps.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "distill/config.h"
#include "distill/run.h"
#include "distill/run_dir.h"
#include "distill/trainer.h"

namespace distill {
namespace {

std::string ConfigPath(const std::string& name) {
  return std::string(DISTILL_CONFIGS_DIR) + "/" + name;
}

std::string TempDir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("scenario_" + name)).string();
  RemoveTree(dir);
  return dir;
}

TEST(ScenarioConfigs, SelfDistillStartsFromItsTeacherOnShiftedData) {
  const Config teacher = LoadConfigFile(ConfigPath("self_distill_teacher.yaml"));
  const Config student = LoadConfigFile(ConfigPath("self_distill.yaml"));
  EXPECT_EQ(teacher.train.mode, distill::Mode::kPretrain);
  EXPECT_EQ(student.train.mode, distill::Mode::kDistill);
  EXPECT_TRUE(student.student.init_from_teacher);
  EXPECT_EQ(student.teacher.checkpoint, teacher.train.out_dir);
  // The teacher the distill config describes is the model the teacher config trains.
  EXPECT_EQ(ArchitectureString(student.teacher), ArchitectureString(teacher.student));
  EXPECT_EQ(ArchitectureString(student.student), ArchitectureString(teacher.student));
  // The shift: the same language seed (the old successors keep their ranks), more successors.
  EXPECT_EQ(student.data.seed, teacher.data.seed);
  EXPECT_EQ(student.data.synthetic.order, teacher.data.synthetic.order);
  EXPECT_GT(student.data.synthetic.branching, teacher.data.synthetic.branching);
  EXPECT_GT(student.distill.kd_weight, 0.0);
  EXPECT_GT(student.distill.ce_weight, 0.0);
}

TEST(ScenarioConfigs, PaddedVocabPadsBothModels) {
  const Config c = LoadConfigFile(ConfigPath("padded_vocab.yaml"));
  EXPECT_EQ(c.student.vocab_size, 259);
  EXPECT_EQ(c.student.padded_vocab_size(), 320);
  EXPECT_EQ(c.teacher.padded_vocab_size(), 320);
  EXPECT_TRUE(IsPipeline(c));
  EXPECT_TRUE(c.train.baseline);
}

// The scenario as shipped, a few steps: the teacher, then the self-distilled student, whose
// first step sees only ties (kd exactly 0) although it moves (ce_weight > 0).
TEST(ScenarioConfigs, SelfDistillRunsAndStartsAtExactTies) {
  const std::string dir = TempDir("self_distill");
  const std::string teacher_dir = dir + "/teacher";
  Config teacher = LoadConfigFile(ConfigPath("self_distill_teacher.yaml"),
                                  {"train.steps=3", "train.out_dir=" + teacher_dir});
  Trainer(teacher, RunOptions::Quiet(/*fresh=*/true)).TrainUntil(3);
  Config c = LoadConfigFile(
      ConfigPath("self_distill.yaml"),
      {"train.steps=3", "teacher.checkpoint=" + teacher_dir, "train.out_dir=" + dir + "/student"});
  Trainer student(c, RunOptions::Quiet(/*fresh=*/true));
  const StepResult first = student.Step();
  EXPECT_EQ(first.kd_loss, 0.0);
  EXPECT_GT(first.ce_loss, 0.0);
  EXPECT_GT(first.grad_norm, 0.0);
  const StepResult second = student.Step();
  EXPECT_GT(second.kd_loss, 0.0);  // the CE step moved it off the teacher
  RemoveTree(dir);
}

TEST(ScenarioConfigs, PaddedVocabPipelineRuns) {
  const std::string dir = TempDir("padded_vocab");
  const Config c = LoadConfigFile(ConfigPath("padded_vocab.yaml"),
                                  {"teacher.pretrain_steps=2", "train.steps=2",
                                   "train.eval_batches=1", "train.out_dir=" + dir});
  std::ostringstream table;
  const auto rows = distill::Run(c, RunFlags{false, true}, table);
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) {
    EXPECT_TRUE(std::isfinite(row.val_loss)) << row.name;
    EXPECT_GT(row.val_loss, row.entropy_floor - 0.1) << row.name;
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace distill

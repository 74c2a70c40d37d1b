// Checkpoints and run directories: resuming is bit-identical, different runs are refused, and
// re-running a finished pipeline (the second `make run`) works.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distill/run.h"
#include "distill/run_dir.h"
#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using testing::TempRunDir;
using testing::TinyConfig;

void ExpectBitIdentical(CausalLM& a, CausalLM& b) {
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();
  }
}

std::vector<int64_t> LoggedTrainSteps(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"type\":\"train\"") == std::string::npos) continue;
    steps.push_back(std::stoll(line.substr(line.find("\"step\":") + 7)));
  }
  return steps;
}

// N straight steps and N/2 + resume + N/2 give bit-identical weights. Dropout is on (the RNG
// state must be restored), gradient accumulation is on (the data position must be restored),
// and the schedule is mid-warmup/decay at the split (the step count must be restored).
TEST(ResumeTest, HalfResumeHalfIsBitIdentical) {
  Config c = testing::TinyDistillConfig(TempRunDir());
  c.student.dropout = 0.1;
  c.train.steps = 8;
  c.train.grad_accum = 2;
  c.schedule.warmup_steps = 3;
  c.train.log_interval = 1;

  Config straight_config = c;
  straight_config.train.out_dir += "-straight";
  Trainer straight(straight_config, RunOptions{false, true});
  straight.TrainUntil(8);

  {
    Trainer first_half(c, RunOptions{false, true});
    first_half.TrainUntil(4);
    // Steps past the checkpoint that a crash would lose: their records must not duplicate.
  }
  Trainer resumed(c, RunOptions{false, true});
  ASSERT_EQ(resumed.step(), 4);
  resumed.TrainUntil(8);
  ExpectBitIdentical(straight.student(), resumed.student());
  EXPECT_EQ(LoggedTrainSteps(c.train.out_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));

  // Control: a fresh run of 8 steps with another seed differs, so equality above is not vacuous.
  Config other = straight_config;
  other.train.seed = 1;
  other.train.out_dir += "-seed1";
  Trainer different(other, RunOptions{false, true});
  different.TrainUntil(8);
  EXPECT_FALSE(at::equal(different.student().lm_head_weight(),
                         straight.student().lm_head_weight()));
}

TEST(ResumeTest, CheckpointsAreWrittenAndPruned) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 6;
  c.train.checkpoint_interval = 2;
  c.train.keep_checkpoints = 2;
  Trainer(c, RunOptions{false, true}).Train();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(c.train.out_dir + "/checkpoints")) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_0000004.pt", "step_0000006.pt"}));
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/summary.json"));
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/config.yaml"));
}

// metrics.jsonl: one flat JSON object per line with every documented field (docs/trainer.md).
TEST(ResumeTest, MetricsRecordsHaveEveryField) {
  Config c = testing::TinyDistillConfig(TempRunDir());
  c.train.steps = 4;
  c.train.log_interval = 2;
  c.train.eval_interval = 2;
  Trainer(c, RunOptions{false, true}).Train();
  std::ifstream in(c.train.out_dir + "/metrics.jsonl");
  int train_records = 0, eval_records = 0;
  for (std::string line; std::getline(in, line);) {
    ASSERT_TRUE(line.front() == '{' && line.back() == '}') << line;
    EXPECT_EQ(line.find("null"), std::string::npos) << "distill on synthetic data: all known";
    std::vector<std::string> fields;
    if (line.find("\"type\":\"train\"") != std::string::npos) {
      ++train_records;
      fields = {"step", "loss", "kd_loss", "ce_loss", "lr", "grad_norm", "tokens_per_s",
                "elapsed_s"};
    } else {
      ASSERT_NE(line.find("\"type\":\"eval\""), std::string::npos) << line;
      ++eval_records;
      fields = {"step", "val_loss", "val_ppl", "teacher_val_loss", "teacher_val_ppl", "val_kd",
                "entropy_floor", "elapsed_s"};
    }
    for (const auto& f : fields) {
      EXPECT_NE(line.find("\"" + f + "\":"), std::string::npos) << f << " in " << line;
    }
  }
  EXPECT_EQ(train_records, 2);
  EXPECT_EQ(eval_records, 2);
}

TEST(ResumeTest, RunDirectoryOfADifferentRunIsRefused) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  Trainer(c, RunOptions{false, true}).Train();

  Config changed = c;
  changed.optim.lr = 0.5;
  try {
    Trainer t(changed, RunOptions{false, true});
    FAIL() << "a different run was silently resumed";
  } catch (const RunDirError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(c.train.out_dir + " holds a different run (optim: here \"  lr: 0.003\", "
                                             "requested \"  lr: 0.5\")"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("--fresh"), std::string::npos);
  }
  // train.resume false refuses even the same run.
  Config no_resume = c;
  no_resume.train.resume = false;
  EXPECT_THROW(Trainer(no_resume, RunOptions{false, true}), RunDirError);
  // More steps: the same run, resumed from its last checkpoint.
  Config longer = c;
  longer.train.steps = 3;
  EXPECT_EQ(Trainer(longer, RunOptions{false, true}).step(), 2);
  // --fresh starts over.
  EXPECT_EQ(Trainer(changed, RunOptions{true, true}).step(), 0);
  // A non-empty directory that is not a run is never deleted, even with --fresh.
  Config foreign = c;
  foreign.train.out_dir = TempRunDir("-foreign");
  fs::create_directories(foreign.train.out_dir);
  std::ofstream(foreign.train.out_dir + "/notes.txt") << "mine";
  EXPECT_THROW(Trainer(foreign, RunOptions{true, true}), RunDirError);
  EXPECT_TRUE(fs::exists(foreign.train.out_dir + "/notes.txt"));
}

// The quickstart's shape in miniature: teacher pretrain, distil, hard-label baseline. Running
// it again reuses the finished stages and reports the same table.
TEST(ResumeTest, PipelineRunsAndRerunsCleanly) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = "distill";
  c.teacher.pretrain_steps = 6;
  c.train.steps = 4;
  c.train.baseline = true;
  ASSERT_TRUE(IsPipeline(c));
  std::ostringstream first, second;
  const auto rows = distill::Run(c, RunFlags{false, true}, first);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "teacher");
  EXPECT_EQ(rows[1].name, "student (distilled)");
  EXPECT_EQ(rows[2].name, "student (hard labels)");
  for (const auto& r : rows) EXPECT_GT(r.val_loss, r.entropy_floor);
  auto count_lines = [](const std::string& path) {
    std::ifstream in(path);
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  const std::string student_metrics = c.train.out_dir + "/student/metrics.jsonl";
  const int records = count_lines(student_metrics);
  const auto again = distill::Run(c, RunFlags{false, true}, second);
  EXPECT_EQ(first.str(), second.str());
  EXPECT_EQ(count_lines(student_metrics), records) << "the re-run duplicated metrics records";
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/results.txt"));
  // --fresh retrains from scratch, deterministically: the same table again.
  std::ostringstream third;
  distill::Run(c, RunFlags{true, true}, third);
  EXPECT_EQ(first.str(), third.str());
}

// A distillation with kd_weight 0 is the cross-entropy-only control: the table says so, in the
// pipeline and as a single run (from the pipeline's teacher), instead of "student (distilled)".
TEST(ResumeTest, KdWeightZeroIsLabelledCeOnly) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = "distill";
  c.teacher.pretrain_steps = 4;
  c.train.steps = 2;
  c.distill.kd_weight = 0;
  std::ostringstream table;
  const auto rows = distill::Run(c, RunFlags{false, true}, table);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].name, "student (ce only)");
  Config single = c;
  single.teacher.checkpoint = c.train.out_dir + "/teacher";
  single.teacher.pretrain_steps = 0;
  single.train.out_dir = TempRunDir("-single");
  ASSERT_FALSE(IsPipeline(single));
  const auto single_rows = distill::Run(single, RunFlags{false, true}, table);
  ASSERT_EQ(single_rows.size(), 1u);
  EXPECT_EQ(single_rows[0].name, "student (ce only)");
}

}  // namespace
}  // namespace distill

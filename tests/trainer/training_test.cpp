// Training invariants on CPU: the loss goes down, gradient accumulation is exact, self-
// distillation starts at a fixed point, padded vocabulary rows never get gradient.
#include <cmath>
#include <filesystem>
#include <limits>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "distill/checkpoint.h"
#include "distill/distributed.h"
#include "distill/model.h"
#include "distill/run.h"
#include "distill/token_shards.h"
#include "distill/trainer.h"
#include "test_files.h"
#include "test_util.h"

namespace distill {
namespace {

using testing::Grads;
using testing::ReadBytes;
using testing::TempRunDir;
using testing::TinyConfig;
using testing::TinyDistillConfig;
using testing::WriteBytes;

Batch Rows(const Batch& b, int64_t begin, int64_t end, int64_t ignore_index) {
  Batch out{b.inputs.slice(0, begin, end), b.targets.slice(0, begin, end), 0};
  out.num_targets = out.targets.ne(ignore_index).sum().item<int64_t>();
  return out;
}

// NaN in the teacher's first parameter (the token embedding): every later step's loss is NaN.
void PoisonTeacher(Trainer& trainer) {
  torch::NoGradGuard no_grad;
  trainer.teacher()->parameters()[0].fill_(NAN);
}

// The order-1 language with branching 4 has a floor near 1.3 nats against ln(24) = 3.18 for a
// uniform guess; 40 AdamW steps must get well below the uniform loss. 0.5 nats is far above
// run-to-run noise (the run is deterministic) and far below what the model learns.
TEST(TrainingTest, PretrainStepsReduceValidationLoss) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 40;
  Trainer trainer(c, RunOptions::Quiet());
  const double before = trainer.Evaluate().val_loss;
  EXPECT_NEAR(before, std::log(24.0), 0.3);  // a fresh model is close to uniform
  const double after = trainer.Train().val_loss;
  EXPECT_LT(after, before - 0.5) << "before " << before << " after " << after;
  EXPECT_GT(after, *trainer.data().EntropyFloor());  // nothing beats the floor
}

// Token shards' validation windows are fixed: an evaluation that reads more sequences than there
// are counts some twice, which the start-up says once, with the setting that avoids it.
TEST(TrainingTest, EvaluationThatRepeatsValidationWindowsWarns) {
  Config c = TinyConfig(TempRunDir());
  c.data.source = "tokens";
  c.data.path = c.train.out_dir + "-shard.bin";
  c.data.val_fraction = 0.1;  // 40 of 400 tokens: (40 - 1) / 16 = 2 windows of seq_len 16
  WriteTokenShard(c.data.path, std::vector<uint32_t>(400, 3), /*uint32_tokens=*/false);
  const auto warnings_of = [&](int64_t batch_size, int64_t eval_batches, const char* suffix) {
    Config run = c;
    run.train.out_dir += suffix;
    run.data.batch_size = batch_size;
    run.train.eval_batches = eval_batches;
    return Trainer(run, RunOptions::Quiet()).warnings();
  };
  std::vector<std::string> warnings = warnings_of(1, 3, "-a");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "warning: an evaluation reads train.eval_batches x data.batch_size = 3 x 1 = 3 "
            "sequences of data.seq_len 16 tokens, but the validation data holds 2 distinct ones: "
            "some are counted more than once; train.eval_batches 2 reads each at most once");
  EXPECT_TRUE(warnings_of(1, 2, "-b").empty());
  warnings = warnings_of(8, 1, "-c");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("the validation data is smaller than one batch of data.batch_size"),
            std::string::npos)
      << warnings[0];
  std::filesystem::remove(c.data.path);
}

// The one warning a Trainer of `c` gives at its start ("" and a failure for another count).
std::string OnlyWarning(const Config& c) {
  const std::vector<std::string> warnings = Trainer(c, RunOptions::Quiet()).warnings();
  EXPECT_EQ(warnings.size(), 1u) << c.train.out_dir;
  return warnings.size() == 1 ? warnings[0] : "";
}

// A distill config switched to pretrain mode keeps its teacher keys; the teacher is not loaded
// (pretraining trains on the hard labels), which the start-up says, naming the key.
TEST(TrainingTest, PretrainModeSaysItsTeacherIsNotLoaded) {
  Config c = TinyConfig(TempRunDir());
  c.teacher.checkpoint = c.train.out_dir + "-no-such-teacher";  // never opened
  EXPECT_EQ(OnlyWarning(c), "warning: teacher.checkpoint is set (" + c.teacher.checkpoint +
                                ") but train.mode is pretrain, which trains on the hard labels "
                                "alone: the teacher is not loaded (train.mode: distill distills "
                                "from it)");
  c.teacher.checkpoint.clear();
  c.train.out_dir += "-b";
  EXPECT_TRUE(Trainer(c, RunOptions::Quiet()).warnings().empty());
  c.teacher.hf_dir = c.train.out_dir + "-no-such-hf-dir";
  c.train.out_dir += "-c";
  EXPECT_EQ(OnlyWarning(c), "warning: teacher.hf_dir is set (" + c.teacher.hf_dir +
                                ") but train.mode is pretrain, which trains on the hard labels "
                                "alone: the teacher is not loaded (train.mode: distill distills "
                                "from it)");
  c.teacher.hf_dir.clear();
  c.teacher.pretrain_steps = 7;
  c.train.out_dir += "-d";
  EXPECT_EQ(OnlyWarning(c),
            "warning: teacher.pretrain_steps is set (7) but train.mode is pretrain, "
            "which trains on the hard labels alone: no teacher is pretrained "
            "(train.mode: distill pretrains one, then distills from it)");
}

// Likewise the distillation loss's keys, and train.max_skipped_steps where non-finite steps stop
// the run: the start-up names each one the user set away from its default, and where (a run's
// stored config.yaml, which a run may be continued with, sets every key). A pipeline's
// pretraining stages (the teacher, the baseline) say nothing of the distill keys: they are the
// student stage's.
TEST(TrainingTest, KeysThisRunDoesNotReadAreNamed) {
  Config c = TinyConfig(TempRunDir());
  const Config given =
      ParseConfig("train:\n  mode: pretrain\ndistill:\n  temperature: 2\n  kd_weight: 1.0\n",
                  "x.yaml", {"distill.ce_weight=0.5"});
  c.given_at = given.given_at;
  c.distill = given.distill;
  ASSERT_EQ(c.given_at.count("distill.kd_weight"), 1u);  // set, at its default: not named
  EXPECT_EQ(OnlyWarning(c),
            "warning: distill.temperature (x.yaml:4), distill.ce_weight (override "
            "\"distill.ce_weight=0.5\") are set but train.mode is pretrain, which trains on the "
            "hard labels alone (cross-entropy, weight 1): they are not used (train.mode: distill "
            "uses them)");
  c.given_at.erase("distill.temperature");
  c.train.out_dir += "-b";
  EXPECT_EQ(OnlyWarning(c),
            "warning: distill.ce_weight (override \"distill.ce_weight=0.5\") is set but "
            "train.mode is pretrain, which trains on the hard labels alone (cross-entropy, weight "
            "1): it is not used (train.mode: distill uses it)");
  // train.max_skipped_steps where a non-finite step stops the run: said too.
  Config limit = c;
  limit.given_at =
      ParseConfig("train:\n  mode: pretrain\n  max_skipped_steps: 3\n", "y.yaml").given_at;
  limit.train.max_skipped_steps = 3;
  limit.train.out_dir += "-limit";
  EXPECT_EQ(OnlyWarning(limit),
            "warning: train.max_skipped_steps (y.yaml:3) is set but train.nonfinite is stop, "
            "which stops the run at its first non-finite step: it is not used "
            "(train.nonfinite: skip uses it)");
  limit.train.max_skipped_steps = TrainConfig().max_skipped_steps;  // set, at its default
  limit.train.out_dir += "-default";
  EXPECT_TRUE(Trainer(limit, RunOptions::Quiet()).warnings().empty());
  limit.train.max_skipped_steps = 3;
  limit.train.nonfinite = NonFinite::kSkip;
  limit.train.out_dir += "-skip";
  EXPECT_TRUE(Trainer(limit, RunOptions::Quiet()).warnings().empty());
  Config pipeline = TinyDistillConfig(c.train.out_dir + "-c");
  pipeline.given_at = c.given_at;
  for (const Config& stage : {TeacherStageConfig(pipeline), BaselineStageConfig(pipeline)}) {
    EXPECT_EQ(stage.given_at.count("distill.ce_weight"), 0u) << stage.train.out_dir;
  }
  // teacher.dropout where the teacher is loaded (it runs in eval mode, without dropout): said.
  Config loaded = TinyDistillConfig(c.train.out_dir + "-d");
  loaded.given_at =
      ParseConfig("train:\n  mode: pretrain\nteacher:\n  dropout: 0.2\n", "z.yaml").given_at;
  loaded.teacher.dropout = 0.2;
  EXPECT_EQ(OnlyWarning(loaded),
            "warning: teacher.dropout (z.yaml:4) is 0.2 but the teacher is loaded, not trained, "
            "and runs without dropout: it is not used (teacher.pretrain_steps > 0 pretrains a "
            "teacher with it; student.dropout is the student's)");
  // The pipeline's distillation stage loads the teacher its first stage trained with it: no word.
  Config trained = loaded;
  trained.teacher.checkpoint.clear();
  trained.teacher.pretrain_steps = 5;
  const Config student_stage = StudentStageConfig(trained);
  EXPECT_EQ(student_stage.given_at.count("teacher.dropout"), 0u);
  loaded.given_at.erase("teacher.dropout");  // a default-free value nobody set: no word
  loaded.train.out_dir += "-e";
  EXPECT_TRUE(Trainer(loaded, RunOptions::Quiet()).warnings().empty());
}

// The student starts from the weights train.seed gives it whatever teacher was built before it:
// the hard-label baseline (pretrain mode, no teacher) and a distillation with kd_weight 0 are one
// run, bit for bit, from the first weights to the last step's. (The teacher's random
// initialisation, overwritten by its checkpoint, used to shift the student's.)
TEST(TrainingTest, TheBaselineStartsFromTheDistilledStudentsWeights) {
  Config c = TinyDistillConfig(TempRunDir());
  c.distill.kd_weight = 0.0;
  c.distill.ce_weight = 1.0;
  c.distill.fused_linear = FusedLinear::kOff;
  c.student.dropout = 0.1;  // the dropout stream too
  c.train.steps = 3;
  Config baseline = BaselineStageConfig(c);
  baseline.train.out_dir = c.train.out_dir + "-baseline";
  // One run after the other: the trainers draw from the one global generator.
  std::vector<std::vector<at::Tensor>> first, last;
  for (const Config* config : {&c, &baseline}) {
    Trainer t(*config, RunOptions::Quiet());
    first.emplace_back();
    for (const auto& p : t.student().parameters()) first.back().push_back(p.detach().clone());
    t.TrainUntil(3);
    last.emplace_back(t.student().parameters());
  }
  for (size_t i = 0; i < first[0].size(); ++i) {
    EXPECT_TRUE(at::equal(first[0][i], first[1][i])) << "parameter " << i << " at the start";
    EXPECT_TRUE(at::equal(last[0][i], last[1][i])) << "parameter " << i << " after 3 steps";
    EXPECT_FALSE(at::equal(first[0][i], last[0][i])) << "parameter " << i << " did not train";
  }
}

// A teacher pretrained for 60 steps is far from the fresh (near-uniform) student; 40 distillation
// steps must close a good part of that gap. 0.7 leaves margin both ways on this deterministic run.
TEST(TrainingTest, DistillStepsReduceValidationKd) {
  Config c = TinyDistillConfig(TempRunDir(), /*teacher_steps=*/60);
  c.train.steps = 40;
  Trainer trainer(c, RunOptions::Quiet());
  const EvalResult before = trainer.Evaluate();
  const EvalResult after = trainer.Train();
  EXPECT_LT(after.val_kd, 0.7 * before.val_kd) << before.val_kd << " -> " << after.val_kd;
  EXPECT_EQ(after.teacher_val_loss, before.teacher_val_loss);  // the teacher is frozen
}

// train.activation_checkpointing computes the same gradients: a few steps of two micro-batches
// each give the same weights, bit for bit on the CPU, in both families, pretraining and
// distilling (the frozen teacher's forward keeps nothing either way).
TEST(TrainingTest, ActivationCheckpointingTrainsTheSameWeights) {
  const auto trained = [](Config c, bool checkpoint, const std::string& suffix) {
    c.train.out_dir += suffix;
    c.train.steps = 3;
    c.train.grad_accum = 2;
    c.train.activation_checkpointing = checkpoint;
    Trainer trainer(c, RunOptions::Quiet());
    EXPECT_EQ(trainer.student().activation_checkpointing(), checkpoint);
    trainer.TrainUntil(3);
    std::vector<at::Tensor> weights;
    for (const auto& p : trainer.student().parameters()) weights.push_back(p.detach().clone());
    return weights;
  };
  Config llama = TinyConfig(TempRunDir("-llama"));
  llama.student.family = ModelFamily::kLlama;
  for (const Config& c : {TinyDistillConfig(TempRunDir()), llama}) {
    const std::vector<at::Tensor> plain = trained(c, false, "-plain");
    const std::vector<at::Tensor> checkpointed = trained(c, true, "-checkpointed");
    ASSERT_EQ(plain.size(), checkpointed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(at::equal(plain[i], checkpointed[i])) << c.train.out_dir << " parameter " << i;
    }
  }
}

// One batch split into micro-batches of different token counts gives the step's gradient up to
// float rounding. fp32 sums of a few hundred terms in a different order differ by ~1e-7
// relative; 1e-5 of the largest gradient entry leaves a wide margin. The naive alternative
// (average of per-micro-batch means) must be detectably different, or this test proves nothing.
TEST(TrainingTest, GradientAccumulationMatchesOneBatch) {
  Config c = TinyDistillConfig(TempRunDir());
  Trainer trainer(c, RunOptions::Quiet());
  const int64_t ignore = c.distill.ignore_index;
  const Batch batch = trainer.data().TrainBatch(0);
  const Batch first = Rows(batch, 0, 3, ignore), second = Rows(batch, 3, 8, ignore);
  ASSERT_NE(first.num_targets * 5, second.num_targets * 3) << "need unequal token densities";

  auto& opt = trainer.optimizer();
  opt.zero_grad(true);
  const StepResult whole = trainer.AccumulateGradients({batch});
  const auto g_whole = Grads(trainer.student());
  opt.zero_grad(true);
  const StepResult split = trainer.AccumulateGradients({first, second});
  const auto g_split = Grads(trainer.student());
  opt.zero_grad(true);
  trainer.AccumulateGradients({first});
  auto g_naive = Grads(trainer.student());
  opt.zero_grad(true);
  trainer.AccumulateGradients({second});
  const auto g_second = Grads(trainer.student());

  EXPECT_EQ(whole.tokens, split.tokens);
  EXPECT_NEAR(whole.loss, split.loss, 1e-6 * whole.loss);
  EXPECT_NEAR(whole.kd_loss, split.kd_loss, 1e-6 * whole.kd_loss);
  double scale = 0, max_diff = 0, naive_diff = 0;
  for (size_t i = 0; i < g_whole.size(); ++i) {
    scale = std::max(scale, g_whole[i].abs().max().item<double>());
    max_diff = std::max(max_diff, (g_whole[i] - g_split[i]).abs().max().item<double>());
    const at::Tensor naive = 0.5 * (g_naive[i] + g_second[i]);
    naive_diff = std::max(naive_diff, (g_whole[i] - naive).abs().max().item<double>());
  }
  ASSERT_GT(scale, 0);
  EXPECT_LE(max_diff, 1e-5 * scale);
  EXPECT_GT(naive_diff, 100 * 1e-5 * scale) << "the naive normalisation is indistinguishable";
}

// The student is an exact copy of the teacher: p == q exactly, TVD's gradient is exactly 0 at
// ties, so with ce_weight 0 and weight_decay 0 AdamW's update is exactly 0 as well.
TEST(TrainingTest, SelfDistillationStepZeroLeavesStudentBitIdentical) {
  Config c = TinyConfig(TempRunDir());
  SetArchitecture(c.student, c.teacher);
  c.student.init_from_teacher = true;
  c.train.mode = Mode::kDistill;
  c.teacher.checkpoint = testing::MakeTeacher(c, c.train.out_dir + "-teacher");
  c.distill.ce_weight = 0.0;
  c.distill.temperature = 2.0;
  c.optim.weight_decay = 0.0;

  Trainer trainer(c, RunOptions::Quiet());
  const StepResult r = trainer.Step();
  EXPECT_EQ(r.kd_loss, 0.0);
  EXPECT_EQ(r.grad_norm, 0.0);
  auto teacher = trainer.teacher()->named_parameters();
  for (const auto& p : trainer.student().named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), teacher[p.key()])) << p.key();
  }

  // Control: the same step with weight decay moves the weights, so the check above can fail.
  c.optim.weight_decay = 0.1;
  c.train.out_dir += "-decay";
  Trainer decayed(c, RunOptions::Quiet(/*fresh=*/true));
  decayed.Step();
  EXPECT_FALSE(at::equal(decayed.student().lm_head_weight(), teacher["token_embedding.weight"]));
}

// vocab 24 padded to 32: the 8 padded logits are -inf in both models, both distributions are
// exactly 0 there, and the padded lm_head rows get exactly zero gradient (tied and untied).
// (With tied embeddings the padded token ids never occur as inputs either.)
TEST(TrainingTest, PaddedLmHeadRowsGetExactlyZeroGradient) {
  for (bool tied : {true, false}) {
    Config c = TinyConfig(TempRunDir(tied ? "-tied" : "-untied"));
    c.student.tie_embeddings = tied;
    c.teacher.tie_embeddings = tied;
    c.train.mode = Mode::kDistill;
    c.distill.ce_weight = 0.5;
    c.distill.temperature = 2.0;
    c.optim.weight_decay = 0.0;
    c.teacher.checkpoint = testing::MakeTeacher(c, c.train.out_dir + "-teacher");
    Trainer trainer(c, RunOptions::Quiet());
    const Batch batch = trainer.data().TrainBatch(0);

    const at::Tensor logits = trainer.student().forward(batch.inputs);
    ASSERT_EQ(logits.size(-1), 32);
    EXPECT_TRUE(
        logits.slice(-1, 24).eq(-std::numeric_limits<float>::infinity()).all().item<bool>());
    EXPECT_TRUE(at::softmax(logits, -1).slice(-1, 24).eq(0).all().item<bool>());

    trainer.optimizer().zero_grad(true);
    trainer.AccumulateGradients({batch});
    const at::Tensor grad = trainer.student().lm_head_weight().grad();
    EXPECT_TRUE(grad.slice(0, 24).eq(0).all().item<bool>()) << (tied ? "tied" : "untied");
    EXPECT_GT(grad.slice(0, 0, 24).abs().sum().item<double>(), 0);  // real rows do learn
    // With weight decay off, optimizer steps leave the padded rows bit-identical.
    const at::Tensor padded_before = trainer.student().lm_head_weight().slice(0, 24).clone();
    trainer.Step();
    trainer.Step();
    EXPECT_TRUE(at::equal(trainer.student().lm_head_weight().slice(0, 24), padded_before));
  }
}

// NaN in the teacher (as a broken teacher checkpoint would give): the first step stops with the
// step and the term named, before the optimizer step -- the student's weights are untouched and
// the last checkpoint stays the newest.
TEST(TrainingTest, NonFiniteStopsBeforeTheOptimizerStep) {
  Config c = TinyDistillConfig(TempRunDir());
  c.train.steps = 6;
  {  // the run directory's lock is released when the trainer goes
    Trainer trainer(c, RunOptions::Quiet());
    trainer.TrainUntil(2);
    PoisonTeacher(trainer);
    std::vector<at::Tensor> before;
    for (const auto& p : trainer.student().parameters()) before.push_back(p.clone());
    try {
      trainer.TrainUntil(6);
      FAIL() << "a NaN step was trained on";
    } catch (const NonFiniteError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("step 3: kd_loss is nan"), std::string::npos) << message;
      EXPECT_NE(message.find("optim.lr"), std::string::npos) << message;
      EXPECT_NE(message.find("distill.temperature"), std::string::npos) << message;
      EXPECT_NE(message.find("step_0000002.pt, is intact"), std::string::npos) << message;
    }
    const auto after = trainer.student().parameters();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << i;
    EXPECT_EQ(trainer.step(), 2);
    EXPECT_EQ(*LatestCheckpoint(c.train.out_dir), CheckpointPath(c.train.out_dir, 2));
  }
  // The checkpoint named is the one the run resumed from, not a newer damaged file it skipped.
  const std::string damaged = CheckpointPath(c.train.out_dir, 4);
  WriteBytes(damaged, "not a checkpoint");
  Trainer resumed(c, RunOptions::Quiet());
  ASSERT_EQ(resumed.step(), 2);
  PoisonTeacher(resumed);
  try {
    resumed.TrainUntil(6);
    FAIL() << "a NaN step was trained on";
  } catch (const NonFiniteError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("step_0000002.pt, is intact"), std::string::npos) << message;
    EXPECT_EQ(message.find(damaged), std::string::npos) << message;
  }
}

// Step queues the clipping behind the micro-batches and reads the loss terms and the norm in one
// transfer: its grad_norm is the norm before clipping of the gradients AccumulateGradients gives
// on the same micro-batches (a twin trainer), its losses are theirs, and the gradients it leaves
// are clipped to optim.grad_clip.
TEST(TrainingTest, StepReportsTheNormBeforeClippingAndClips) {
  Config c = TinyDistillConfig(TempRunDir("-step"));
  c.optim.grad_clip = 1e-3;  // far below the gradients' norm: the step clips
  Config twin = c;
  twin.train.out_dir = TempRunDir("-twin");
  Trainer reference(twin, RunOptions::Quiet());
  std::vector<Batch> batches;
  for (int64_t index : RankMicroBatches(0, c.train.grad_accum, 0, 1)) {
    batches.push_back(reference.data().TrainBatch(index));
  }
  reference.optimizer().zero_grad(true);
  const StepResult expected = reference.AccumulateGradients(batches);
  auto norm_of = [](const std::vector<at::Tensor>& grads) {
    double squares = 0;
    for (const auto& g : grads) squares += g.to(at::kDouble).square().sum().item<double>();
    return std::sqrt(squares);
  };
  const double norm = norm_of(Grads(reference.student()));
  ASSERT_GT(norm, 100 * c.optim.grad_clip);

  Trainer trainer(c, RunOptions::Quiet());
  const StepResult r = trainer.Step();
  EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm);
  EXPECT_EQ(r.tokens, expected.tokens);
  EXPECT_NEAR(r.kd_loss, expected.kd_loss, 1e-6 * expected.kd_loss);
  EXPECT_NEAR(r.ce_loss, expected.ce_loss, 1e-6 * expected.ce_loss);
  EXPECT_FALSE(r.skipped);
  const double clipped = norm_of(Grads(trainer.student()));
  EXPECT_NEAR(clipped, c.optim.grad_clip, 1e-4 * c.optim.grad_clip);
}

// A validation loss that is not finite after finite training steps (here: weights made infinite
// after the last step) is a warning, not only a null in summary.json.
TEST(TrainingTest, ANonFiniteValidationLossWarns) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  c.schedule.warmup_steps = 0;  // no warning of an unfinished schedule
  c.train.eval_interval = 0;    // the final evaluation only
  Trainer trainer(c, RunOptions::Quiet());
  trainer.TrainUntil(2);
  EXPECT_TRUE(trainer.warnings().empty());
  {
    at::NoGradGuard no_grad;
    trainer.student().lm_head_weight().fill_(std::numeric_limits<float>::infinity());
  }
  EXPECT_FALSE(std::isfinite(trainer.Train().val_loss));
  ASSERT_EQ(trainer.warnings().size(), 1u);
  EXPECT_THAT(
      trainer.warnings()[0],
      ::testing::AllOf(
          ::testing::StartsWith("warning: step 2: the validation losses are not finite (val_loss "),
          ::testing::HasSubstr("): the logits overflow on some validation tokens")));
}

// skip: the update is skipped (weights unchanged, the step and data move on), counted, and an
// error once more than max_skipped_steps were skipped.
TEST(TrainingTest, NonFiniteSkipCountsAndContinues) {
  Config c = TinyDistillConfig(TempRunDir());
  c.train.nonfinite = NonFinite::kSkip;
  c.train.max_skipped_steps = 2;
  Trainer trainer(c, RunOptions::Quiet());
  EXPECT_FALSE(trainer.Step().skipped);
  PoisonTeacher(trainer);
  const at::Tensor before = trainer.student().lm_head_weight().clone();
  for (int i = 0; i < 2; ++i) {
    const StepResult r = trainer.Step();
    EXPECT_TRUE(r.skipped);
    EXPECT_TRUE(at::equal(trainer.student().lm_head_weight(), before));
  }
  EXPECT_EQ(trainer.step(), 3);
  EXPECT_EQ(trainer.skipped_steps(), 2);
  EXPECT_THROW(trainer.Step(), NonFiniteError);
  EXPECT_TRUE(at::isfinite(trainer.student().lm_head_weight()).all().item<bool>());
}

// The skipped steps are counted over the run: the checkpoint carries the count, so resuming
// neither resets train.max_skipped_steps nor loses the count that summary.json and
// metrics.jsonl report.
TEST(TrainingTest, SkippedStepsAreCountedOverResumes) {
  Config c = TinyDistillConfig(TempRunDir());
  c.train.nonfinite = NonFinite::kSkip;
  c.train.max_skipped_steps = 3;
  c.train.steps = 6;
  c.train.log_interval = 1;
  {
    Trainer first(c, RunOptions::Quiet());
    EXPECT_FALSE(first.Step().skipped);
    PoisonTeacher(first);
    EXPECT_TRUE(first.Step().skipped);
    EXPECT_TRUE(first.Step().skipped);
    first.SaveCheckpoint();
  }
  Trainer resumed(c, RunOptions::Quiet());  // the teacher is read again: finite
  EXPECT_EQ(resumed.step(), 3);
  EXPECT_EQ(resumed.skipped_steps(), 2);
  EXPECT_FALSE(resumed.Step().skipped);
  PoisonTeacher(resumed);
  EXPECT_TRUE(resumed.Step().skipped);  // the run's third
  try {
    resumed.Step();
    FAIL() << "a fourth skipped step of the run was accepted";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("4 steps of this run were skipped, more than "
                                         "train.max_skipped_steps (3)"),
              std::string::npos)
        << e.what();
  }
}

// summary.json and the logged train records count the skipped steps; a run whose every step
// was skipped never updated the student and is an error, not a normal finish.
TEST(TrainingTest, SkippedStepsAreReportedAndAllSkippedIsAnError) {
  Config c = TinyDistillConfig(TempRunDir());
  c.train.nonfinite = NonFinite::kSkip;
  c.train.steps = 3;
  c.train.log_interval = 1;
  {
    Trainer trainer(c, RunOptions::Quiet());
    EXPECT_FALSE(trainer.Step().skipped);
    PoisonTeacher(trainer);
    trainer.Train();  // steps 2 and 3 skipped
    EXPECT_EQ(trainer.skipped_steps(), 2);
  }
  EXPECT_NE(ReadBytes(c.train.out_dir + "/summary.json").find("\"skipped_steps\":2"),
            std::string::npos)
      << ReadBytes(c.train.out_dir + "/summary.json");
  const std::string metrics = ReadBytes(c.train.out_dir + "/metrics.jsonl");
  EXPECT_NE(metrics.find("\"skipped_steps\":1,"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"skipped_steps\":2,"), std::string::npos) << metrics;

  Config all = TinyDistillConfig(TempRunDir("_all"));
  all.train.nonfinite = NonFinite::kSkip;
  all.train.steps = 2;
  {
    Trainer trainer(all, RunOptions::Quiet());
    PoisonTeacher(trainer);
    try {
      trainer.Train();
      FAIL() << "a run whose every step was skipped finished normally";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find("all 2 steps of this run were skipped"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(all.train.out_dir + "/summary.json"));
  // The finished run opened again says the same, and how to start over.
  try {
    Trainer(all, RunOptions::Quiet()).Train();
    FAIL() << "the finished all-skipped run, opened again, finished normally";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("start over with --fresh"), std::string::npos) << e.what();
  }
  // Its checkpoint holds the student it started with: loading it (export, a teacher) says so; the
  // first run's (one step trained) does not.
  {
    Model model = MakeModel(all.student);
    std::vector<std::string> warnings;
    const std::string file = LoadWeights(all.train.out_dir, *model, at::Device(at::kCPU),
                                         "teacher.checkpoint", &warnings);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0], "warning: teacher.checkpoint: " + file +
                               ": all 2 steps before this checkpoint were skipped as non-finite "
                               "(train.nonfinite=skip): its weights were never updated (the ones "
                               "the run started from)");
    // The checkpoint file itself, named as a teacher, says the same.
    warnings.clear();
    EXPECT_EQ(LoadWeights(file, *model, at::Device(at::kCPU), "teacher.checkpoint", &warnings),
              file);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0].rfind("warning: teacher.checkpoint: " + file + ": all 2 steps", 0), 0u)
        << warnings[0];
    // A corrupt newer checkpoint is passed over for it with a warning, then the same warning.
    const std::string newer = CheckpointPath(all.train.out_dir, 3);
    std::string bytes = ReadBytes(file);
    bytes[bytes.size() / 2] ^= 0x01;
    WriteBytes(newer, bytes);
    warnings.clear();
    EXPECT_EQ(LoadWeights(all.train.out_dir, *model, at::Device(at::kCPU), "export", &warnings),
              file);
    ASSERT_EQ(warnings.size(), 2u);
    EXPECT_EQ(warnings[0].rfind("warning: export: " + newer + ": checksum mismatch", 0), 0u)
        << warnings[0];
    EXPECT_EQ(warnings[1].rfind("warning: export: " + file + ": all 2 steps", 0), 0u)
        << warnings[1];
    warnings.clear();
    LoadWeights(c.train.out_dir, *model, at::Device(at::kCPU), "export", &warnings);
    EXPECT_TRUE(warnings.empty()) << warnings[0];
  }

  // Under the results table, a line per model that skipped steps.
  const std::string table = FormatTable({{"teacher", "runs/t", 10, 2.0, NAN, 3, 0},
                                         {"student (distilled)", "runs/s", 5, 2.5, NAN, 3, 2}});
  EXPECT_NE(table.find("\nstudent (distilled): 2 of 3 steps skipped as non-finite "
                       "(train.nonfinite=skip)\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("teacher:"), std::string::npos) << table;
  // A non-finite val_loss is "nan", as the log lines and summary.json (null) have it, never
  // the C library's "-nan" of a negative NaN.
  const std::string diverged =
      FormatTable({{"student (distilled)", "runs/s", 5, -std::numeric_limits<double>::quiet_NaN(),
                    1.25, 3, 0}});
  EXPECT_EQ(diverged.substr(diverged.find('\n') + 1),
            "student (distilled)                 5       nan    1.2500       nan  runs/s\n");
}

// A checkpoint of non-finite weights is never written.
TEST(TrainingTest, NonFiniteWeightsAreNeverCheckpointed) {
  Config c = TinyConfig(TempRunDir());
  Trainer trainer(c, RunOptions::Quiet());
  trainer.Step();
  {
    torch::NoGradGuard no_grad;
    trainer.student().lm_head_weight()[3][5] = INFINITY;
  }
  try {
    trainer.SaveCheckpoint();
    FAIL() << "a checkpoint with inf weights was written";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("holds NaN or inf values"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(LatestCheckpoint(c.train.out_dir).has_value());
}

// A run whose warmup leaves its schedule unfinished says so once at the start (a shortened trial
// of a config with a long warmup): a decay ends at lr * min_lr_ratio on the last step only when
// warmup_steps <= steps - 2 (LearningRate); a constant schedule needs warmup_steps <= steps.
// (A finished run resumed with fewer steps trains nothing and is not warned: ResumeTest's
// AFinishedRunIsNotShortened expects its one warning.)
TEST(TrainingTest, ARunThatEndsInItsWarmupWarns) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 3;
  c.schedule.warmup_steps = 5;
  c.optim.lr = 0.002;
  EXPECT_THAT(Trainer(c, RunOptions::Quiet()).warnings(),
              ::testing::ElementsAre(
                  "warning: schedule.warmup_steps 5 leaves the schedule unfinished in train.steps "
                  "3: the last step's learning rate is 0.0012 (optim.lr 0.002), and the decay "
                  "never reaches lr * schedule.min_lr_ratio; a warmup of at most 1 step "
                  "finishes it"));
  c.schedule.warmup_steps = 2;  // the last step at the peak: no decay
  c.train.out_dir = TempRunDir("-peak");
  EXPECT_THAT(Trainer(c, RunOptions::Quiet()).warnings(), ::testing::SizeIs(1));
  c.train.steps = 2;  // only no warmup leaves room for the decay
  c.train.out_dir = TempRunDir("-two");
  EXPECT_THAT(Trainer(c, RunOptions::Quiet()).warnings(),
              ::testing::ElementsAre(
                  ::testing::EndsWith("; schedule.warmup_steps 0 (no warmup) finishes it")));
  c.train.steps = 1;  // one step has no decay: the peak is enough, and warmup 1 reaches it
  c.schedule.warmup_steps = 1;
  c.train.out_dir = TempRunDir("-one");
  EXPECT_THAT(Trainer(c, RunOptions::Quiet()).warnings(), ::testing::IsEmpty());
  c.train.steps = 3;
  c.schedule.warmup_steps = 1;
  c.train.out_dir = TempRunDir("-short");
  EXPECT_THAT(Trainer(c, RunOptions::Quiet()).warnings(), ::testing::IsEmpty());
  c.schedule.kind = ScheduleKind::kConstant;  // no decay to finish: the peak is enough
  c.schedule.warmup_steps = 3;
  c.train.out_dir = TempRunDir("-constant");
  EXPECT_THAT(Trainer(c, RunOptions::Quiet()).warnings(), ::testing::IsEmpty());
}

TEST(TrainingTest, LearningRateSchedule) {
  Config c = TinyConfig("unused");
  c.train.steps = 12;
  c.schedule.warmup_steps = 2;
  c.optim.lr = 1.0;
  c.schedule.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(c, 1), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(c, 2), 1.0);   // decay starts at the peak
  EXPECT_DOUBLE_EQ(LearningRate(c, 11), 0.1);  // and ends at min_lr on the last step
  EXPECT_NEAR(LearningRate(c, 6), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 4 / 9)), 1e-15);
  c.schedule.kind = ScheduleKind::kLinear;
  EXPECT_DOUBLE_EQ(LearningRate(c, 11), 0.1);
  EXPECT_NEAR(LearningRate(c, 5), 1.0 - 0.9 * 3 / 9, 1e-15);
  c.schedule.kind = ScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(LearningRate(c, 11), 1.0);
}

}  // namespace
}  // namespace distill

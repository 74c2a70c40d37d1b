// Checkpoints and run directories: resuming is bit-identical, different runs are refused, and
// re-running a finished pipeline (the second `make run`) works.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>

#include "distill/checkpoint.h"
#include "distill/file_io.h"
#include "distill/metrics.h"
#include "distill/model.h"
#include "distill/run.h"
#include "distill/run_dir.h"
#include "distill/signals.h"
#include "distill/token_shards.h"
#include "distill/trainer.h"
#include "test_files.h"
#include "test_util.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using testing::Names;
using testing::ReadBytes;
using testing::TempRunDir;
using testing::TinyConfig;
using testing::WriteBytes;

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
  Trainer straight(straight_config, RunOptions::Quiet());
  straight.TrainUntil(8);

  {
    Trainer first_half(c, RunOptions::Quiet());
    first_half.TrainUntil(4);
    // Steps past the checkpoint that a crash would lose: their records must not duplicate.
  }
  Trainer resumed(c, RunOptions::Quiet());
  ASSERT_EQ(resumed.step(), 4);
  resumed.TrainUntil(8);
  ExpectBitIdentical(straight.student(), resumed.student());
  EXPECT_EQ(LoggedTrainSteps(c.train.out_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));

  // Control: a fresh run of 8 steps with another seed differs, so equality above is not vacuous.
  Config other = straight_config;
  other.train.seed = 1;
  other.train.out_dir += "-seed1";
  Trainer different(other, RunOptions::Quiet());
  different.TrainUntil(8);
  EXPECT_FALSE(
      at::equal(different.student().lm_head_weight(), straight.student().lm_head_weight()));
}

// elapsed_s counts the run's training time over every attempt: a resumed run goes on from the
// checkpoint's time instead of starting again at 0.
TEST(ResumeTest, ElapsedTimeCarriesOverAResume) {
  Config c = testing::TinyConfig(TempRunDir());
  c.train.steps = 6;
  c.train.log_interval = 1;
  { Trainer(c, RunOptions::Quiet()).TrainUntil(3); }
  Model model = MakeModel(c.student);
  auto optimizer = MakeOptimizer(c.optim, *model);
  const TrainingPosition at3 =
      LoadCheckpoint(*LatestCheckpoint(c.train.out_dir), *model, *optimizer, at::Device(at::kCPU));
  ASSERT_EQ(at3.step, 3);
  EXPECT_GT(at3.elapsed_s, 0.0);
  Trainer resumed(c, RunOptions::Quiet());
  ASSERT_EQ(resumed.step(), 3);
  resumed.Train();
  std::ifstream in(c.train.out_dir + "/summary.json");
  std::stringstream summary;
  summary << in.rdbuf();
  const std::string text = summary.str();
  const size_t at = text.find("\"elapsed_s\":");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stod(text.substr(at + 12)), at3.elapsed_s) << text;
}

// A smaller train.steps than a run has trained does not shorten it: a warning, nothing trained,
// and its config.yaml keeps the steps it has; a larger one trains on.
TEST(ResumeTest, AFinishedRunIsNotShortened) {
  Config c = testing::TinyConfig(TempRunDir());
  c.train.steps = 4;
  c.train.log_interval = 1;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string dir = c.train.out_dir;
  c.train.steps = 2;
  {
    Trainer again(c, RunOptions::Quiet());
    ASSERT_EQ(again.step(), 4);
    ASSERT_FALSE(again.warnings().empty());
    EXPECT_THAT(again.warnings().front(),
                ::testing::HasSubstr(fmt::format(
                    "warning: {} is at step 4, past train.steps 2: a run is not shortened after "
                    "the fact; nothing is trained",
                    dir)));
    again.Train();
  }
  EXPECT_EQ(LoggedTrainSteps(dir), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_NE(ReadBytes(dir + "/config.yaml").find("\n  steps: 4\n"), std::string::npos);
  c.train.steps = 5;
  {
    Trainer more(c, RunOptions::Quiet());
    for (const auto& w : more.warnings()) EXPECT_EQ(w.find("past train.steps"), std::string::npos);
    more.Train();
  }
  EXPECT_EQ(LoggedTrainSteps(dir), (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

// The names in <run_dir>/checkpoints, sorted.
std::vector<std::string> CheckpointDirNames(const std::string& run_dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run_dir + "/checkpoints")) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ResumeTest, CheckpointsAreWrittenAndPruned) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 6;
  c.train.checkpoint_interval = 2;
  c.train.keep_checkpoints = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  EXPECT_EQ(CheckpointDirNames(c.train.out_dir),
            (std::vector<std::string>{"step_0000004.pt", "step_0000006.pt"}));
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/summary.json"));
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/config.yaml"));
  // With its checkpoints removed, the run trains again from step 0, and says so.
  RemoveTree(
      (fs::path(c.train.out_dir) / "checkpoints").string());  // not fs::remove_all (libtorch's)
  const Trainer again(c, RunOptions::Quiet());
  EXPECT_EQ(again.step(), 0);
  ASSERT_EQ(again.warnings().size(), 1u);
  EXPECT_NE(again.warnings()[0].find("has no checkpoint to resume from"), std::string::npos)
      << again.warnings()[0];
}

// metrics.jsonl: one flat JSON object per line with every documented field (docs/trainer.md).
TEST(ResumeTest, MetricsRecordsHaveEveryField) {
  Config c = testing::TinyDistillConfig(TempRunDir());
  c.train.steps = 4;
  c.train.log_interval = 2;
  c.train.eval_interval = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  std::ifstream in(c.train.out_dir + "/metrics.jsonl");
  int train_records = 0, eval_records = 0;
  for (std::string line; std::getline(in, line);) {
    ASSERT_TRUE(line.front() == '{' && line.back() == '}') << line;
    EXPECT_EQ(line.find("null"), std::string::npos) << "distill on synthetic data: all known";
    std::vector<std::string> fields;
    if (line.find("\"type\":\"train\"") != std::string::npos) {
      ++train_records;
      fields = {"step",      "loss",          "kd_loss",      "ce_loss",  "lr",
                "grad_norm", "skipped_steps", "tokens_per_s", "elapsed_s"};
    } else {
      ASSERT_NE(line.find("\"type\":\"eval\""), std::string::npos) << line;
      ++eval_records;
      fields = {"step",   "val_loss",      "val_ppl",  "teacher_val_loss", "teacher_val_ppl",
                "val_kd", "entropy_floor", "elapsed_s"};
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
  Trainer(c, RunOptions::Quiet()).Train();

  Config changed = c;
  changed.optim.lr = 0.5;
  try {
    Trainer t(changed, RunOptions::Quiet());
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
  EXPECT_THROW(Trainer(no_resume, RunOptions::Quiet()), RunDirError);
  // More steps: the same run, resumed from its last checkpoint.
  Config longer = c;
  longer.train.steps = 3;
  EXPECT_EQ(Trainer(longer, RunOptions::Quiet()).step(), 2);
  // --fresh starts over.
  EXPECT_EQ(Trainer(changed, RunOptions::Quiet(/*fresh=*/true)).step(), 0);
  // A non-empty directory that is not a run is never deleted, even with --fresh.
  Config foreign = c;
  foreign.train.out_dir = TempRunDir("-foreign");
  fs::create_directories(foreign.train.out_dir);
  std::ofstream(foreign.train.out_dir + "/notes.txt") << "mine";
  EXPECT_THROW(Trainer(foreign, RunOptions::Quiet(/*fresh=*/true)), RunDirError);
  EXPECT_TRUE(fs::exists(foreign.train.out_dir + "/notes.txt"));

  // A run directory moved since: the way to continue it names where it is now (its config.yaml
  // still names where it was), and that command resumes it.
  Config moved = changed;
  moved.train.out_dir = TempRunDir("-moved");
  fs::rename(c.train.out_dir, moved.train.out_dir);
  moved.optim.lr = 0.25;
  try {
    Trainer t(moved, RunOptions::Quiet());
    FAIL() << "a different run was silently resumed";
  } catch (const RunDirError& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("to continue that run use --config " + moved.train.out_dir +
                                     "/config.yaml train.out_dir=" + moved.train.out_dir +
                                     " (its config.yaml names " + c.train.out_dir +
                                     ": moved since? then the other "
                                     "paths it names may have moved too), to start"));
  }
  const Config stored = LoadConfigFile(moved.train.out_dir + "/config.yaml",
                                       {"train.out_dir=" + moved.train.out_dir});
  EXPECT_NO_THROW(Trainer(stored, RunOptions::Quiet()));  // the same run
}

// --fresh deletes only what the trainer created (the .distill_run marker): a directory that
// merely holds a config.yaml -- someone else's, or a run from before markers -- is refused with
// the directory named, and everything in it survives. Such a run can still be resumed.
TEST(ResumeTest, FreshDeletesOnlyMarkedRunDirectories) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string marker = ReadBytes(c.train.out_dir + "/" + kRunMarker);
  EXPECT_NE(marker.find("run_id: "), std::string::npos) << marker;
  EXPECT_NE(marker.find("config_hash: " + RunIdentityHash(c)), std::string::npos) << marker;

  // Someone else's directory that happens to hold a config.yaml (here: a copy of the run).
  Config foreign = c;
  foreign.train.out_dir = TempRunDir("-foreign");
  fs::create_directories(foreign.train.out_dir);
  fs::copy_file(c.train.out_dir + "/config.yaml", foreign.train.out_dir + "/config.yaml");
  std::ofstream(foreign.train.out_dir + "/thesis.tex") << "years of work";
  try {
    Trainer t(foreign, RunOptions::Quiet(/*fresh=*/true));
    FAIL() << "--fresh deleted a directory without the marker";
  } catch (const RunDirError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(foreign.train.out_dir), std::string::npos) << message;
    EXPECT_NE(message.find("no .distill_run marker"), std::string::npos) << message;
    EXPECT_NE(message.find("delete it by hand"), std::string::npos) << message;
  }
  EXPECT_TRUE(fs::exists(foreign.train.out_dir + "/thesis.tex"));
  EXPECT_TRUE(fs::exists(foreign.train.out_dir + "/config.yaml"));

  // A run from before markers: resumed as before, never deleted.
  fs::remove(c.train.out_dir + "/" + kRunMarker);
  Config longer = c;
  longer.train.steps = 3;
  EXPECT_EQ(Trainer(longer, RunOptions::Quiet()).step(), 2);
  EXPECT_FALSE(IsOwnRunDir(c.train.out_dir)) << "resuming must not adopt a directory";
  EXPECT_THROW(Trainer(c, RunOptions::Quiet(/*fresh=*/true)), RunDirError);
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/checkpoints"));
}

// A folder that holds a config.yaml but no marker, checkpoints or metrics is not a run: often the
// folder of the --config file itself, or another tool's. It is refused, naming it, and its
// config.yaml is left as it was (the trainer would overwrite it with the resolved config); the
// message never suggests deleting it.
TEST(ResumeTest, AFolderHoldingOnlyAConfigIsNotTakenOver) {
  Config c = TinyConfig(TempRunDir("-mine"));
  c.train.steps = 2;
  fs::create_directories(c.train.out_dir);
  const std::string mine = "# my notes: the lr sweep\n" + ConfigToYaml(c);
  WriteBytes(c.train.out_dir + "/config.yaml", mine);  // the same run's settings, and comments
  std::string message = testing::ErrorOf<RunDirError>([&] { Trainer t(c, RunOptions::Quiet()); });
  EXPECT_NE(message.find(c.train.out_dir), std::string::npos) << message;
  EXPECT_NE(message.find("is not a distill_trainer run"), std::string::npos) << message;
  EXPECT_EQ(message.find("rm -r"), std::string::npos) << message;
  EXPECT_EQ(ReadBytes(c.train.out_dir + "/config.yaml"), mine);
  EXPECT_FALSE(fs::exists(c.train.out_dir + "/checkpoints"));

  // Another tool's folder with its own config.yaml and data, which happens to hold checkpoints/
  // too: its config does not parse, and the message names it without suggesting rm.
  Config other = TinyConfig(TempRunDir("-other"));
  fs::create_directories(other.train.out_dir + "/checkpoints");
  WriteBytes(other.train.out_dir + "/config.yaml", "model: resnet50\n");
  WriteBytes(other.train.out_dir + "/checkpoints/epoch=3.ckpt", "weights");
  message = testing::ErrorOf<RunDirError>([&] { Trainer t(other, RunOptions::Quiet()); });
  EXPECT_NE(message.find(other.train.out_dir), std::string::npos) << message;
  EXPECT_NE(message.find("does not parse as this distill_trainer's config"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("rm -r"), std::string::npos) << message;
  EXPECT_EQ(ReadBytes(other.train.out_dir + "/config.yaml"), "model: resnet50\n");
  EXPECT_EQ(ReadBytes(other.train.out_dir + "/checkpoints/epoch=3.ckpt"), "weights");
}

// --fresh deletes a run whole or not at all: a run directory that holds what distill_trainer did
// not write (notes, an evaluation's output, another run put inside it, a model card in the
// export) is refused, naming them, and nothing in it is deleted. Once they are moved out it is
// deleted as before.
TEST(ResumeTest, FreshDeletesNothingOfARunHoldingWhatItDidNotWrite) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string out = c.train.out_dir;
  Config inner = c;
  inner.train.out_dir = out + "/myteacher";  // a run of its own, marked, inside this one
  Trainer(inner, RunOptions::Quiet()).Train();
  Config stage_named = c;  // named like a pipeline's stage, in a run that is not a pipeline
  stage_named.train.out_dir = out + "/teacher";
  Trainer(stage_named, RunOptions::Quiet()).Train();
  WriteBytes(out + "/notes.md", "mine");
  fs::copy_file(CheckpointPath(out, 2), out + "/checkpoints/step_best.pt");
  fs::create_directories(out + "/eval_results");
  fs::create_directories(out + "/hf");
  WriteBytes(out + "/hf/config.json", "{}");
  WriteBytes(out + "/hf/README.md", "my model card");
  const std::vector<std::string> names = Names(out);
  try {
    Trainer t(c, RunOptions::Quiet(/*fresh=*/true));
    FAIL() << "--fresh deleted a run holding files it did not write";
  } catch (const RunDirError& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("--fresh: " + out +
                                     " holds what distill_trainer did not write "
                                     "(checkpoints/step_best.pt, eval_results/, hf/README.md, "
                                     "myteacher/, notes.md, teacher/), so nothing was deleted"));
  }
  EXPECT_EQ(Names(out), names);
  EXPECT_EQ(ReadBytes(out + "/hf/README.md"), "my model card");
  EXPECT_EQ(Trainer(inner, RunOptions::Quiet()).step(), 2);  // the inner run is whole

  for (const char* mine : {"/notes.md", "/eval_results", "/myteacher", "/hf/README.md", "/teacher",
                           "/checkpoints/step_best.pt"}) {
    RemoveTree(out + mine);
  }
  // What a stopped export left (its temporary, the safetensors writer's half-written file) and a
  // profile are the trainer's own: no refusal.
  fs::create_directories(out + "/hf.tmp-2000000001");
  WriteBytes(out + "/hf.tmp-2000000001/model.safetensors.tmp.2000000001", "half");
  fs::create_directories(out + "/profile");
  WriteBytes(out + "/profile/trace.json", "{}");
  WriteBytes(out + "/profile/phases_rank1.json.tmp", "{");
  EXPECT_EQ(Trainer(c, RunOptions::Quiet(/*fresh=*/true)).step(), 0);
  EXPECT_FALSE(fs::exists(out + "/hf"));
  EXPECT_FALSE(fs::exists(out + "/hf.tmp-2000000001"));
  EXPECT_FALSE(fs::exists(out + "/profile"));
}

// A train.out_dir that cannot be created or looked up is one line naming the key and the
// path, not std::filesystem's message.
TEST(ResumeTest, AnOutDirThatCannotBeMadeNamesTheKey) {
  const std::string dir = TempRunDir();
  fs::create_directories(dir);
  WriteBytes(dir + "/afile", "");
  Config c = TinyConfig(dir + "/afile/sub");
  c.train.steps = 1;
  EXPECT_THAT([&] { Trainer t(c, RunOptions::Quiet()); },
              ::testing::ThrowsMessage<RunDirError>(
                  ::testing::StrEq("train.out_dir \"" + dir + "/afile/sub\": cannot create " + dir +
                                   "/afile/sub: " + dir + "/afile is a file, not a directory")));
  c.train.out_dir = dir + "/" + std::string(300, 'a');
  EXPECT_THAT(
      [&] { Trainer t(c, RunOptions::Quiet()); },
      ::testing::ThrowsMessage<RunDirError>(::testing::StrEq(
          "train.out_dir \"" + c.train.out_dir + "\": cannot look it up: File name too long")));
  // A name too long below directories that do not exist yet: those are not left behind.
  c.train.out_dir = dir + "/new/sub/" + std::string(300, 'a');
  EXPECT_THAT([&] { Trainer t(c, RunOptions::Quiet()); },
              ::testing::ThrowsMessage<RunDirError>(::testing::HasSubstr("File name too long")));
  EXPECT_FALSE(fs::exists(dir + "/new"));
}

// A link on train.out_dir's way whose target is missing (a disk not mounted) is named, and stays:
// the failed creation removed it as one of the directories it had made (found by a hunt:
// existence checks follow links, so the link counted as missing).
TEST(ResumeTest, ALinkToNothingOnTheOutDirsWayIsNamedAndKept) {
  const std::string dir = TempRunDir();
  fs::create_directories(dir);
  fs::create_symlink(dir + "/unmounted/runs", dir + "/runs");
  for (const std::string& out : {dir + "/runs/exp1", dir + "/runs", dir + "/runs/a/b"}) {
    Config c = TinyConfig(out);
    c.train.steps = 1;
    EXPECT_THAT([&] { Trainer t(c, RunOptions::Quiet()); },
                ::testing::ThrowsMessage<RunDirError>(::testing::StrEq(
                    "train.out_dir \"" + out + "\": cannot create " + out + ": " + dir +
                    "/runs is a symbolic link to " + dir +
                    "/unmounted/runs, which does not exist (a disk not mounted?); create its "
                    "target or choose another path")));
    EXPECT_TRUE(fs::is_symlink(dir + "/runs")) << out;
  }
  EXPECT_FALSE(fs::exists(dir + "/unmounted"));
  // A loop of links is named as one that cannot be followed.
  fs::create_symlink(dir + "/loop", dir + "/loop");
  Config looped = TinyConfig(dir + "/loop/exp1");
  EXPECT_THAT([&] { Trainer t(looped, RunOptions::Quiet()); },
              ::testing::ThrowsMessage<RunDirError>(::testing::HasSubstr(std::strerror(ELOOP))));
  EXPECT_THAT([&] { CreateDirectories(dir + "/loop/exp1"); },
              ::testing::ThrowsMessage<FileError>(::testing::StrEq(
                  "cannot create " + dir + "/loop/exp1: " + dir + "/loop is a symbolic link to " +
                  dir + "/loop, which cannot be followed: " + std::strerror(ELOOP))));
  EXPECT_TRUE(fs::is_symlink(dir + "/loop"));
  // Its target made: the run starts there, through the link.
  fs::create_directories(dir + "/unmounted/runs");
  Config c = TinyConfig(dir + "/runs/exp1");
  c.train.steps = 1;
  EXPECT_EQ(Trainer(c, RunOptions::Quiet()).step(), 0);
  EXPECT_TRUE(fs::exists(dir + "/unmounted/runs/exp1/config.yaml"));
}

// CreateDirectories returns what it made, deepest first, and only that; a failure part-way
// removes what it made and nothing that was there.
TEST(ResumeTest, CreateDirectoriesOwnsOnlyWhatItMade) {
  const std::string dir = TempRunDir();
  fs::create_directories(dir + "/had");
  EXPECT_EQ(CreateDirectories(dir + "/had/a/b"),
            (std::vector<std::string>{dir + "/had/a/b", dir + "/had/a"}));
  EXPECT_TRUE(CreateDirectories(dir + "/had/a/b").empty());
  EXPECT_EQ(CreateDirectories(dir + "/x/../y"),
            (std::vector<std::string>{dir + "/x/../y", dir + "/x"}));
  // A name too long two levels below new directories: both removed again.
  EXPECT_THAT([&] { CreateDirectories(dir + "/new/sub/" + std::string(300, 'a')); },
              ::testing::ThrowsMessage<FileError>(::testing::HasSubstr("File name too long")));
  EXPECT_FALSE(fs::exists(dir + "/new"));
  EXPECT_TRUE(fs::is_directory(dir + "/had/a/b"));
}

// The lock file is never written through a link (its target would be overwritten): a link in
// its place is refused, naming it, and the target is unchanged.
TEST(ResumeTest, ALinkInPlaceOfTheLockFileIsRefused) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string victim = c.train.out_dir + "-victim.txt";
  WriteBytes(victim, "precious");
  const std::string lock = c.train.out_dir + "/" + kRunLock;
  fs::remove(lock);
  fs::create_symlink(victim, lock);
  Config longer = c;
  longer.train.steps = 3;
  try {
    Trainer t(longer, RunOptions::Quiet());
    FAIL() << "a link in place of the lock file was followed";
  } catch (const RunDirError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(lock + " is not a plain file (a symbolic link)"));
  }
  EXPECT_EQ(ReadBytes(victim), "precious");
  fs::remove(lock);
  EXPECT_EQ(Trainer(longer, RunOptions::Quiet()).step(), 2);  // resumed
}

// A start that fails (a typo in teacher.checkpoint) writes nothing: the corrected command is
// not refused as "a different run", and an existing run is left exactly as it was.
TEST(ResumeTest, FailedStartLeavesNoRunDirectory) {
  Config c = testing::TinyDistillConfig(TempRunDir());
  c.train.steps = 2;
  Config typo = c;
  typo.teacher.checkpoint += "-typo";
  EXPECT_THROW(Trainer(typo, RunOptions::Quiet()), std::runtime_error);
  EXPECT_FALSE(fs::exists(c.train.out_dir)) << "a failed start created the run directory";
  Trainer(c, RunOptions::Quiet()).Train();  // the corrected command
  // --fresh with a typo: the existing run is not deleted before the start succeeded.
  EXPECT_THROW(Trainer(typo, RunOptions::Quiet(/*fresh=*/true)), std::runtime_error);
  EXPECT_TRUE(LatestCheckpoint(c.train.out_dir).has_value());
  // --fresh over token shards whose last token is past the vocabulary (no batch of the first
  // steps would read it): refused at start-up, the existing run kept.
  Config tokens = c;
  tokens.data.source = "tokens";
  const std::string shards = c.train.out_dir + "-shards";
  fs::create_directories(shards);
  tokens.data.path = shards + "/train.bin";
  std::vector<uint32_t> ids(200, 3);
  ids.back() = 24;
  WriteTokenShard(tokens.data.path, ids, /*uint32_tokens=*/false);
  try {
    Trainer t(tokens, RunOptions::Quiet(/*fresh=*/true));
    ADD_FAILURE() << "trained on a shard with a token past the vocabulary";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(tokens.data.path +
                                               ": the token at position 199 is 24, not below "
                                               "the vocabulary size 24"));
  }
  RemoveTree(shards);
  EXPECT_EQ(Trainer(c, RunOptions::Quiet()).step(), 2);
}

// The start-up warnings of `trainer` that hold `text`.
std::vector<std::string> WarningsWith(const Trainer& trainer, const std::string& text) {
  std::vector<std::string> found;
  for (const auto& w : trainer.warnings()) {
    if (w.find(text) != std::string::npos) found.push_back(w);
  }
  return found;
}

// A resume on other data files than its checkpoint was trained on says so (a shard added to the
// glob: the batches change, and with data.val_fraction the validation windows move); the same
// files say nothing, and the next checkpoint records the new files.
TEST(ResumeTest, ResumingOnOtherDataFilesWarns) {
  Config c = testing::TinyConfig(TempRunDir());
  c.train.steps = 2;
  c.train.checkpoint_interval = 1;
  c.data.source = "tokens";
  const std::string shards = c.train.out_dir + "-shards";
  fs::create_directories(shards);
  c.data.path = shards + "/train_*.bin";
  std::vector<uint32_t> ids(400);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i * 7 % 24);
  WriteTokenShard(shards + "/train_000000.bin", ids, /*uint32_tokens=*/false);
  WriteTokenShard(shards + "/train_000001.bin", ids, /*uint32_tokens=*/false);
  Trainer(c, RunOptions::Quiet()).Train();
  auto data_warnings = [](const Trainer& t) { return WarningsWith(t, "data files"); };
  c.train.steps = 3;
  {
    Trainer same(c, RunOptions::Quiet());
    EXPECT_TRUE(data_warnings(same).empty());
    same.Train();
  }
  WriteTokenShard(shards + "/train_000002.bin", ids, /*uint32_tokens=*/false);
  c.train.steps = 4;
  {
    Trainer more(c, RunOptions::Quiet());
    const auto found = data_warnings(more);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_THAT(found[0], ::testing::HasSubstr(
                              "warning: the data files are not those the checkpoint of step 3 "
                              "was trained on (new train " +
                              shards + "/train_000002.bin): training goes on with them"));
    EXPECT_THAT(found[0], ::testing::HasSubstr("the validation windows (the last 10% of the "
                                               "training files) moved"));
    more.Train();
  }
  // A finished run on other files only evaluates again: that is what the warning says.
  WriteTokenShard(shards + "/train_000003.bin", ids, /*uint32_tokens=*/false);
  {
    const auto finished = data_warnings(Trainer(c, RunOptions::Quiet()));
    ASSERT_EQ(finished.size(), 1u);
    EXPECT_THAT(finished[0], ::testing::HasSubstr("its evaluation reads the new validation "
                                                  "windows, so val_loss is not comparable"));
  }
  c.train.steps = 5;
  EXPECT_EQ(data_warnings(Trainer(c, RunOptions::Quiet())).size(), 1u);  // still new to step 4
  RemoveTree(shards + "/train_000003.bin");
  c.train.steps = 6;
  Trainer(c, RunOptions::Quiet()).Train();  // step 6's checkpoint: the files as they are now
  // A shard rewritten at the same size (its documents tokenized again in another order): named
  // as such; before, only a changed size was told.
  std::vector<uint32_t> reordered(ids.rbegin(), ids.rend());
  WriteTokenShard(shards + "/train_000001.bin", reordered, /*uint32_tokens=*/false);
  c.train.steps = 7;
  {
    const auto found = data_warnings(Trainer(c, RunOptions::Quiet()));
    ASSERT_EQ(found.size(), 1u);
    EXPECT_THAT(found[0], ::testing::HasSubstr("not those the checkpoint of step 6 was trained on "
                                               "(rewritten at the same size train " +
                                               shards + "/train_000001.bin)"));
  }
  RemoveTree(shards);
}

// A resume with a teacher whose weights are not those the checkpoint was trained with (here
// the teacher's run trained on, so its latest checkpoint is another teacher) says so, once: the
// next checkpoint records the new teacher.
TEST(ResumeTest, ResumingWithAnotherTeacherWarns) {
  Config c = testing::TinyDistillConfig(TempRunDir(), /*teacher_steps=*/2);
  c.train.steps = 2;
  c.train.checkpoint_interval = 1;
  Trainer(c, RunOptions::Quiet()).Train();
  auto teacher_warnings = [](const Trainer& t) { return WarningsWith(t, "the teacher ("); };
  c.train.steps = 3;
  {
    Trainer same(c, RunOptions::Quiet());
    EXPECT_TRUE(teacher_warnings(same).empty());
    same.Train();
  }
  testing::MakeTeacher(c, c.teacher.checkpoint, /*steps=*/4);
  c.train.steps = 4;
  {
    Trainer other(c, RunOptions::Quiet());
    const auto found = teacher_warnings(other);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0], "warning: the teacher (teacher.checkpoint " + c.teacher.checkpoint +
                            ") is not the one the checkpoint of step 3 was trained with: its "
                            "weights differ (files rewritten, or a teacher run that trained on "
                            "since); distillation goes on with this teacher, so the student's "
                            "targets change from here on (restore the old teacher to keep them, "
                            "or pass --fresh to start over with this one)");
    other.Train();
  }
  EXPECT_TRUE(teacher_warnings(Trainer(c, RunOptions::Quiet())).empty());  // recorded at step 4
}

// The fingerprint sees any change of a weight's bits, of their order, and nothing else.
TEST(ResumeTest, WeightsFingerprintSeesEveryChangeOfTheBits) {
  const Config c = TinyConfig(TempRunDir());
  torch::manual_seed(7);
  Model a = MakeModel(c.teacher);
  torch::manual_seed(7);
  Model b = MakeModel(c.teacher);
  const std::string fingerprint = WeightsFingerprint(*a);
  EXPECT_EQ(fingerprint.size(), 16u);
  EXPECT_EQ(WeightsFingerprint(*b), fingerprint);
  at::NoGradGuard no_grad;
  at::Tensor w = b->parameters()[1];
  ASSERT_GE(w.numel(), 2);
  at::Tensor flat = w.view(-1);
  const float first = flat[0].item<float>(), second = flat[1].item<float>();
  ASSERT_NE(first, second);
  flat[0] = std::nextafter(first, 1e9f);  // one bit
  EXPECT_NE(WeightsFingerprint(*b), fingerprint);
  flat[0] = second;  // the first two swapped
  flat[1] = first;
  EXPECT_NE(WeightsFingerprint(*b), fingerprint);
  flat[1] = second;
  flat[0] = first;
  EXPECT_EQ(WeightsFingerprint(*b), fingerprint);
  // The sums against tensor expressions of their definition, over more than one of the
  // function's 2^24-unit slices and 2^20-unit grains, for 2-, 4- and 1-byte elements.
  auto reference = [](const at::Tensor& t) {
    const bool bytes = t.element_size() == 1;
    const at::Tensor flat = t.contiguous().view(-1);
    const at::Tensor u = (bytes ? flat.view(at::kByte) : flat.view(at::kShort))
                             .to(at::kLong)
                             .bitwise_and(bytes ? 0xFF : 0xFFFF);
    const at::Tensor weight = at::arange(u.numel(), at::kLong).remainder(251).add(1);
    return std::array<int64_t, 2>{u.sum().item<int64_t>(), (u * weight).sum().item<int64_t>()};
  };
  const at::Tensor wide = at::randn({3000, 3001}).to(at::kBFloat16);  // 9M units
  const at::Tensor wider = at::randn({3000, 3001});                   // 18M units: 2 slices
  const at::Tensor narrow = at::randint(0, 256, {3000, 1001}, at::kByte);
  for (const at::Tensor& t : {wide, wider, narrow}) {
    EXPECT_EQ(WeightBitSums(t), reference(t)) << t.scalar_type();
  }
}

// Lowers RLIMIT_FSIZE for its scope, with SIGXFSZ ignored: a write past `bytes` then fails with
// EFBIG, the way a full disk fails with ENOSPC (no root or special filesystem needed).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
};

// A checkpoint, config.yaml or summary.json write that fails (here: EFBIG from a file-size
// limit; a full disk gives ENOSPC the same way) is an exception naming the file and the cause --
// not torch's abort -- the temporary is gone and the previous files are intact.
TEST(ResumeTest, FailedWritesAreClearErrorsAndKeepThePreviousState) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  {
    Trainer trainer(c, RunOptions::Quiet());
    trainer.TrainUntil(2);
    const std::string good = CheckpointPath(c.train.out_dir, 2);
    const std::string good_bytes = ReadBytes(good);
    const std::string config_before = ReadBytes(c.train.out_dir + "/config.yaml");
    ASSERT_GT(good_bytes.size(), 16384u);
    trainer.Step();
    {
      FileSizeLimit limit(8192);
      try {
        trainer.SaveCheckpoint();
        ADD_FAILURE() << "a checkpoint larger than the file-size limit was written";
      } catch (const FileError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("cannot write " + CheckpointPath(c.train.out_dir, 3) +
                               ": File too "
                               "large"),
                  std::string::npos)
            << message;
      }
      EXPECT_THROW(WriteFileAtomically(c.train.out_dir + "/config.yaml", std::string(10000, 'x')),
                   FileError);
    }
    EXPECT_EQ(Names(c.train.out_dir + "/checkpoints"), std::vector<std::string>{"step_0000002.pt"});
    EXPECT_EQ(ReadBytes(good), good_bytes);
    EXPECT_EQ(ReadBytes(c.train.out_dir + "/config.yaml"), config_before);
    EXPECT_EQ(Names(c.train.out_dir),
              (std::vector<std::string>{".distill_lock", ".distill_run", "checkpoints",
                                        "config.yaml", "metrics.jsonl"}));
    // The space is back: the same trainer checkpoints and finishes, and a resume (once this
    // trainer has let the directory go) continues.
    trainer.TrainUntil(4);
  }
  EXPECT_EQ(Trainer(c, RunOptions::Quiet()).step(), 4);
}

// One trainer per run directory. While one holds it, a second -- a resume, or --fresh -- is
// refused with the holder named, and the directory is left exactly as it was (the lock file
// holds "pid <pid> on <host> since <time>"); once the first has let it go, the same command
// resumes. A run that another trainer started in a new directory between this one's checks and
// its first write is refused too, not trained over.
TEST(ResumeTest, ASecondTrainerInTheSameDirectoryIsRefused) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  {
    Trainer first(c, RunOptions::Quiet());
    first.TrainUntil(2);
    const std::string holder = ReadBytes(c.train.out_dir + "/" + kRunLock);
    EXPECT_EQ(holder.rfind(fmt::format("pid {} on ", ::getpid()), 0), 0u) << holder;
    const std::vector<std::string> names = Names(c.train.out_dir);
    const std::string checkpoint = ReadBytes(CheckpointPath(c.train.out_dir, 2));
    for (const bool fresh : {false, true}) {
      try {
        Trainer second(c, RunOptions::Quiet(fresh));
        ADD_FAILURE() << "a second trainer started in a directory in use, fresh " << fresh;
      } catch (const RunDirError& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr(
                                  fmt::format("{} is in use by another distill_trainer (pid {} on ",
                                              c.train.out_dir, ::getpid())));
      }
      EXPECT_EQ(Names(c.train.out_dir), names);
      EXPECT_EQ(ReadBytes(CheckpointPath(c.train.out_dir, 2)), checkpoint);
    }
    first.TrainUntil(3);  // the first trainer is unaffected
  }
  EXPECT_EQ(Trainer(c, RunOptions::Quiet()).step(), 3);
  EXPECT_EQ(Trainer(c, RunOptions::Quiet(/*fresh=*/true)).step(), 0);

  // A new directory: the other trainer plans, builds and writes it while this one is building.
  Config d = TinyConfig(TempRunDir("_new"));
  d.train.steps = 2;
  RunOptions late = RunOptions::Quiet();
  late.before_commit = [&] { Trainer(d, RunOptions::Quiet()).Train(); };
  try {
    Trainer t(d, late);
    ADD_FAILURE() << "a run started over another that began meanwhile";
  } catch (const RunDirError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(d.train.out_dir +
                                               " was started by another distill_trainer while "
                                               "this one was starting; run the command again"));
  }
  EXPECT_TRUE(fs::exists(d.train.out_dir + "/summary.json"));
  EXPECT_EQ(Trainer(d, RunOptions::Quiet()).step(), 2);
}

// A restart keeps the records up to the checkpoint it resumes from, drops the later ones and a
// partial last line (a write cut short), and replaces the file by rename -- never truncates it in
// place, so a kill during the rewrite cannot leave it empty.
TEST(ResumeTest, MetricsAreRepairedAtomicallyOnResume) {
  RecordKeys kept;
  EXPECT_EQ(KeptMetrics("{\"type\":\"train\",\"step\":1}\n{\"type\":\"eval\",\"step\":2}\n"
                        "{\"type\":\"train\",\"step\":3}\n{\"type\":\"train\",\"st",
                        2, &kept),
            "{\"type\":\"train\",\"step\":1}\n{\"type\":\"eval\",\"step\":2}\n");
  EXPECT_EQ(kept, (RecordKeys{{"train", 1}, {"eval", 2}}));
  kept.clear();
  EXPECT_EQ(KeptMetrics("{\"type\":\"train\",\"step\":1}", 5, &kept), "") << "partial only line";
  // A whole line that is not the trainer's (a note someone added) is kept, not deleted.
  EXPECT_EQ(KeptMetrics("{\"type\":\"train\",\"step\":1}\n# lr sweep, run 3\n{\"type\":\"train\","
                        "\"step\":9}\n",
                        5, &kept),
            "{\"type\":\"train\",\"step\":1}\n# lr sweep, run 3\n");
  // Also one that names a step, in words or as JSON: only the trainer's own records (type, then
  // step, as it writes them) are dropped past the checkpoint (found by a hunt: any line holding
  // "step": went).
  kept.clear();
  EXPECT_EQ(KeptMetrics("NOTE: loss spiked at \"step\": 35, lowered lr\n"
                        "{\"note\": \"eval looked off\", \"step\": 30}\n"
                        "{\"step\":40,\"type\":\"train\"}\n{\"type\":\"train\",\"step\":7}\n",
                        5, &kept),
            "NOTE: loss spiked at \"step\": 35, lowered lr\n"
            "{\"note\": \"eval looked off\", \"step\": 30}\n{\"step\":40,\"type\":\"train\"}\n");
  EXPECT_TRUE(kept.empty());

  Config c = TinyConfig(TempRunDir());
  c.train.steps = 6;
  c.train.log_interval = 1;
  Trainer(c, RunOptions::Quiet()).TrainUntil(4);
  const std::string path = c.train.out_dir + "/metrics.jsonl";
  const std::string up_to_4 = ReadBytes(path);
  // A crash after step 5's record and in the middle of step 6's.
  std::ofstream(path, std::ios::app) << "{\"type\":\"train\",\"step\":5,\"loss\":1}\n"
                                     << "{\"type\":\"train\",\"step\":6,\"lo";
  struct stat before {
  }, after{};
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  Trainer resumed(c, RunOptions::Quiet());
  ASSERT_EQ(resumed.step(), 4);
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino) << "rewritten in place, not replaced by rename";
  EXPECT_EQ(ReadBytes(path), up_to_4);
  resumed.TrainUntil(6);
  EXPECT_EQ(LoggedTrainSteps(c.train.out_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    EXPECT_TRUE(!line.empty() && line.front() == '{' && line.back() == '}') << line;
  }
}

// The same run with a path spelled otherwise ("d/./a.txt" for "d/a.txt", a trailing '/'): named
// as this run, with the run's spelling to pass, not as another run that --fresh would delete.
TEST(ResumeTest, APathSpelledOtherwiseNamesTheRunsSpelling) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  c.data.source = "text";
  for (ModelConfig* m :
       {static_cast<ModelConfig*>(&c.student), static_cast<ModelConfig*>(&c.teacher)}) {
    m->vocab_size = 256;
  }
  const std::string data = c.train.out_dir + "-data";
  fs::create_directories(data);
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  WriteBytes(data + "/a.txt", text);
  WriteBytes(data + "/b.txt", text);
  c.data.path = data + "/a.txt";
  Trainer(c, RunOptions::Quiet()).Train();
  Config respelled = c;
  respelled.data.path = data + "/./a.txt";
  EXPECT_EQ(testing::ErrorOf<RunDirError>([&] { Trainer t(respelled, RunOptions::Quiet()); }),
            c.train.out_dir +
                " holds this run, started with the same path spelled otherwise; the spelling is "
                "part of the run's identity: to continue it, pass data.path=" +
                c.data.path + " (or spell it so in the config file)");
  // Another file is another run.
  respelled.data.path = data + "/b.txt";
  EXPECT_THAT(testing::ErrorOf<RunDirError>([&] { Trainer t(respelled, RunOptions::Quiet()); }),
              ::testing::HasSubstr(" holds a different run (data: "));
  RemoveTree(data);
}

// The pipeline: a first stage that fails at start-up (a missing data file) leaves no pipeline
// directory behind either.
TEST(ResumeTest, PipelineFailedStartLeavesNoRunDirectory) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = Mode::kDistill;
  c.teacher.pretrain_steps = 2;
  c.data.source = "text";
  c.data.path = c.train.out_dir + "-missing.txt";
  for (ModelConfig* m :
       {static_cast<ModelConfig*>(&c.student), static_cast<ModelConfig*>(&c.teacher)}) {
    m->vocab_size = 256;
  }
  ASSERT_TRUE(IsPipeline(c));
  std::ostringstream out;
  EXPECT_THROW(distill::Run(c, RunFlags{false, true}, out), std::runtime_error);
  EXPECT_FALSE(fs::exists(c.train.out_dir));
}

// Undoing a failed start's commit (a pipeline whose first stage failed right after the pipeline
// directory was written): a directory the commit created goes, with the parents it created; an
// empty directory a user made for the run stays (before, it was deleted with our files: found
// by filling a small filesystem so that the first stage's directory could not be made); our
// files only where nothing else is there.
TEST(ResumeTest, UndoingAFailedStartKeepsADirectoryTheTrainerDidNotCreate) {
  const std::string base = TempRunDir();
  Config c = TinyConfig(base + "/new/run");
  RunDirPlan plan = PlanRunDir(c, false);
  CommitRunDir(c, plan);
  ASSERT_EQ(plan.created, (std::vector<std::string>{base + "/new/run", base + "/new", base}));
  EXPECT_TRUE(UndoFailedStart(c.train.out_dir, plan));
  EXPECT_FALSE(fs::exists(base));
  // Created, and its marker never written (a full disk): the lock file alone is there.
  plan = PlanRunDir(c, false);
  CommitRunDir(c, plan);
  fs::remove(c.train.out_dir + "/config.yaml");
  fs::remove(c.train.out_dir + "/" + kRunMarker);
  EXPECT_TRUE(UndoFailedStart(c.train.out_dir, plan));
  EXPECT_FALSE(fs::exists(base));

  c.train.out_dir = base + "/mine";
  fs::create_directories(c.train.out_dir);
  plan = PlanRunDir(c, false);
  CommitRunDir(c, plan);
  EXPECT_TRUE(plan.created.empty());
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/config.yaml"));
  EXPECT_TRUE(UndoFailedStart(c.train.out_dir, plan));
  ASSERT_TRUE(fs::is_directory(c.train.out_dir));
  EXPECT_TRUE(fs::is_empty(c.train.out_dir));

  // Anything else there: nothing undone.
  plan = PlanRunDir(c, false);
  CommitRunDir(c, plan);
  std::ofstream(c.train.out_dir + "/notes.txt") << "mine\n";
  EXPECT_FALSE(UndoFailedStart(c.train.out_dir, plan));
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/" + kRunMarker));
  EXPECT_EQ(ReadBytes(c.train.out_dir + "/notes.txt"), "mine\n");
}

// A run's config.yaml damaged (truncated, garbage, removed) while its marker names the requested
// run: the run is continued, config.yaml written again, a warning says so. The marker's word
// counts only for the run it names, only with train.resume, and not against a config.yaml that
// parses (the marker is never updated: an edited config.yaml may be another run's).
TEST(ResumeTest, ADamagedConfigYamlOfThisRunIsWrittenAgain) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string config_yaml = c.train.out_dir + "/config.yaml";
  const std::string good = ReadBytes(config_yaml);
  Config edited = c;
  edited.optim.lr = 0.5;
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"train:\n  steps: 2\n  out_dir: " + c.train.out_dir + "\n  resum",
       " does not parse (" + config_yaml + ":4: "},
      {"::: [not yaml\n", " does not parse ("},
      {"", " is missing, but the run's marker names this run"}};
  for (const auto& [bytes, said] : damages) {
    if (bytes.empty()) {
      fs::remove(config_yaml);
    } else {
      WriteBytes(config_yaml, bytes);
    }
    Trainer t(c, RunOptions::Quiet());
    EXPECT_EQ(t.step(), 2) << said;
    ASSERT_EQ(t.warnings().size(), 1u) << said;
    EXPECT_EQ(t.warnings()[0].rfind("warning: " + config_yaml, 0), 0u) << t.warnings()[0];
    EXPECT_NE(t.warnings()[0].find(said), std::string::npos) << t.warnings()[0];
    EXPECT_EQ(ReadBytes(config_yaml), good) << said;
  }
  // A config.yaml that parses to another run is believed: refused as before, nothing rewritten.
  WriteBytes(config_yaml, ConfigToYaml(edited));
  EXPECT_THAT(testing::ErrorOf<RunDirError>([&] { Trainer t(c, RunOptions::Quiet()); }),
              ::testing::HasSubstr(" holds a different run (optim: "));
  EXPECT_EQ(ReadBytes(config_yaml), ConfigToYaml(edited));
  // train.resume false against a damaged one: what continues it and what deletes it.
  Config no_resume = c;
  no_resume.train.resume = false;
  WriteBytes(config_yaml, "::: [not yaml\n");
  EXPECT_THAT(testing::ErrorOf<RunDirError>([&] { Trainer t(no_resume, RunOptions::Quiet()); }),
              ::testing::HasSubstr("and train.resume is false; its marker names this run: "
                                   "train.resume=true continues it (config.yaml is written again), "
                                   "--fresh deletes it"));
  // Another run's config, or train.resume false, against a run without its config.yaml: refused.
  fs::remove(config_yaml);
  for (const auto& [other, said] : std::vector<std::pair<Config, std::string>>{
           {edited, "its marker names another run than this command's"},
           {no_resume,
            "train.resume is false (its marker names this run: train.resume=true continues it)"}}) {
    try {
      Trainer t(other, RunOptions::Quiet());
      ADD_FAILURE() << "started without config.yaml: " << said;
    } catch (const RunDirError& e) {
      EXPECT_NE(std::string(e.what()).find(c.train.out_dir +
                                           " is a distill_trainer run without its config.yaml "
                                           "(removed?), and " +
                                           said),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(config_yaml));
}

// --profile-steps with a file where its profile/ directory goes: an error before any step (it
// came after the traced steps, and the steps since the last checkpoint were lost).
TEST(ResumeTest, AFileInTheProfilesWayIsAnErrorAtStart) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  WriteBytes(c.train.out_dir + "/profile", "mine");
  c.train.steps = 6;
  RunOptions profiled = RunOptions::Quiet();
  profiled.profile.steps = 2;
  profiled.profile.skip = 1;
  const std::string message = testing::ErrorOf<FileError>([&] { Trainer t(c, profiled); });
  EXPECT_EQ(message.rfind("--profile-steps writes into " + c.train.out_dir +
                              "/profile, which "
                              "cannot be created (",
                          0),
            0u)
      << message;
  EXPECT_EQ(ReadBytes(c.train.out_dir + "/profile"), "mine");
  EXPECT_EQ(Trainer(c, RunOptions::Quiet()).step(), 2);
}

// A directory that holds only what an interrupted first start leaves is ours to start in; a
// config.yaml.tmp without our marker is not (the marker is written first): the start is refused
// and the file kept.
TEST(ResumeTest, AConfigTemporaryWithoutTheMarkerIsNotAnInterruptedStart) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  fs::create_directories(c.train.out_dir);
  std::ofstream(c.train.out_dir + "/config.yaml.tmp") << "mine\n";
  try {
    Trainer t(c, RunOptions::Quiet());
    FAIL() << "started in a directory holding a user's config.yaml.tmp";
  } catch (const RunDirError& e) {
    EXPECT_NE(std::string(e.what()).find("is not empty and holds no config.yaml"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ReadBytes(c.train.out_dir + "/config.yaml.tmp"), "mine\n");
  std::ofstream(c.train.out_dir + "/" + kRunMarker) << "run_id: x\n";  // as a killed start left it
  Trainer(c, RunOptions::Quiet()).Train();
  EXPECT_FALSE(fs::exists(c.train.out_dir + "/config.yaml.tmp"));
  EXPECT_TRUE(fs::exists(c.train.out_dir + "/summary.json"));
}

// A flipped byte or a truncated latest checkpoint is detected by its checksum, named, and the
// previous intact checkpoint is used instead; with none intact, the error names every file.
TEST(ResumeTest, CorruptCheckpointsFallBackToThePreviousGoodOne) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  c.train.checkpoint_interval = 2;
  Trainer(c, RunOptions::Quiet()).TrainUntil(4);
  const std::string step2 = CheckpointPath(c.train.out_dir, 2);
  const std::string step4 = CheckpointPath(c.train.out_dir, 4);
  const std::string step4_bytes = ReadBytes(step4);

  std::string flipped = step4_bytes;
  flipped[flipped.size() / 2] ^= 0x01;  // one bit, inside the weights
  std::ofstream(step4, std::ios::binary | std::ios::trunc) << flipped;
  {
    Trainer resumed(c, RunOptions::Quiet());
    EXPECT_EQ(resumed.step(), 2);
    ASSERT_EQ(resumed.warnings().size(), 1u);
    const std::string& warning = resumed.warnings()[0];
    EXPECT_NE(warning.find(step4 + ": checksum mismatch"), std::string::npos) << warning;
    EXPECT_NE(warning.find("resuming from the previous checkpoint, " + step2), std::string::npos)
        << warning;
  }
  // Export and a teacher read from the run directory fall back the same way, with a warning.
  {
    Model model = MakeModel(c.student);
    std::vector<std::string> warnings;
    EXPECT_EQ(LoadWeights(c.train.out_dir, *model, at::Device(at::kCPU), "export", &warnings),
              step2);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("warning: export: " + step4 + ": checksum mismatch"),
              std::string::npos)
        << warnings[0];
    EXPECT_NE(warnings[0].find("using the previous checkpoint, " + step2), std::string::npos)
        << warnings[0];
    Config distill = c;
    distill.train.out_dir = TempRunDir("-student");
    distill.train.mode = Mode::kDistill;
    SetArchitecture(distill.teacher, c.student);
    distill.teacher.checkpoint = c.train.out_dir;
    const Trainer student(distill, RunOptions::Quiet());
    ASSERT_EQ(student.warnings().size(), 1u);
    EXPECT_NE(student.warnings()[0].find("warning: teacher.checkpoint: " + step4),
              std::string::npos)
        << student.warnings()[0];
  }
  std::ofstream(step4, std::ios::binary | std::ios::trunc) << step4_bytes.substr(0, 1000);
  EXPECT_EQ(Trainer(c, RunOptions::Quiet()).step(), 2);
  std::ofstream(step2, std::ios::binary | std::ios::trunc) << "";
  const std::string config_yaml = ReadBytes(c.train.out_dir + "/config.yaml");
  c.train.steps = 6;  // a key the resume would write into config.yaml
  try {
    Trainer t(c, RunOptions::Quiet());
    FAIL() << "resumed without an intact checkpoint";
  } catch (const CorruptCheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(step4 + ": checksum mismatch"), std::string::npos) << message;
    EXPECT_NE(message.find(step2 + ": not a distill_trainer checkpoint"), std::string::npos)
        << message;
  }
  // The failed start left the directory as it was.
  EXPECT_EQ(ReadBytes(c.train.out_dir + "/config.yaml"), config_yaml);
  Model model = MakeModel(c.student);
  try {
    LoadWeights(c.train.out_dir, *model, at::Device(at::kCPU), "export");
    FAIL() << "exported without an intact checkpoint";
  } catch (const CorruptCheckpointError& e) {
    EXPECT_THAT(e.what(), ::testing::StartsWith("export: no intact checkpoint in "));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(step2 + ": not a distill_trainer checkpoint"));
  }
}

// A newer checkpoint that a resume skipped as corrupt is not one of the run's newest: pruning
// after the fallback keeps the checkpoints written since and leaves the skipped file alone (it
// counted, so keep_checkpoints 1 deleted each new checkpoint as soon as it was written).
TEST(ResumeTest, PruningAfterAFallbackKeepsTheCheckpointsWrittenSince) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 6;
  c.train.checkpoint_interval = 2;
  c.train.keep_checkpoints = 3;
  Trainer(c, RunOptions::Quiet()).TrainUntil(6);
  const std::string step2 = CheckpointPath(c.train.out_dir, 2);
  const std::string step4 = CheckpointPath(c.train.out_dir, 4);
  const std::string step6 = CheckpointPath(c.train.out_dir, 6);
  fs::remove(step4);
  WriteBytes(step6, "not a checkpoint");
  c.train.keep_checkpoints = 1;
  {
    Trainer resumed(c, RunOptions::Quiet());
    ASSERT_EQ(resumed.step(), 2);
    resumed.TrainUntil(4);
  }
  EXPECT_TRUE(fs::exists(step4));
  EXPECT_FALSE(fs::exists(step2));
  EXPECT_EQ(ReadBytes(step6), "not a checkpoint");
  const Trainer again(c, RunOptions::Quiet());
  EXPECT_EQ(again.step(), 4);
  ASSERT_EQ(again.warnings().size(), 1u);
  EXPECT_NE(again.warnings()[0].find(step6), std::string::npos) << again.warnings()[0];
}

// Nor is one that a resume skipped where its name is older than the checkpoints written since:
// a copy of step 2 named step 5 took a place among the newest, and pruning deleted step 4, the
// run's last good checkpoint before the ones it wrote. A file the run writes itself counts again.
TEST(ResumeTest, PruningLeavesACheckpointTheResumeSkippedOutOfTheCount) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  c.train.checkpoint_interval = 2;
  c.train.keep_checkpoints = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string step2 = CheckpointPath(c.train.out_dir, 2);
  const std::string step5 = CheckpointPath(c.train.out_dir, 5);
  const std::string step6 = CheckpointPath(c.train.out_dir, 6);
  fs::copy_file(step2, step5);  // a copy under a later step's name
  c.train.steps = 6;
  {
    Trainer resumed(c, RunOptions::Quiet());
    ASSERT_EQ(resumed.step(), 4);
    ASSERT_EQ(resumed.warnings().size(), 1u);
    EXPECT_THAT(resumed.warnings()[0], ::testing::HasSubstr(step5 + ": holds step 2"));
    resumed.Train();  // writes step 6, then prunes
  }
  EXPECT_EQ(CheckpointDirNames(c.train.out_dir),
            (std::vector<std::string>{"step_0000004.pt", "step_0000005.pt", "step_0000006.pt"}));
  // The newest damaged as well: the resume still has step 4 to fall back to, and writing step 6
  // again makes that file the run's own: counted (keep 1 deletes step 4), the copy still not.
  WriteBytes(step6, "not a checkpoint");
  c.train.keep_checkpoints = 1;
  {
    Trainer resumed(c, RunOptions::Quiet());
    ASSERT_EQ(resumed.step(), 4);
    EXPECT_EQ(resumed.warnings().size(), 2u);
    resumed.Train();
  }
  EXPECT_EQ(CheckpointDirNames(c.train.out_dir),
            (std::vector<std::string>{"step_0000005.pt", "step_0000006.pt"}));
  // What is skipped is a file, not a step: a damaged step_6.pt beside the good step_0000006.pt
  // (both step 6) is left alone, and the good one is resumed from and then pruned as usual.
  WriteBytes(fs::path(step6).replace_filename("step_6.pt").string(), "not a checkpoint");
  c.train.steps = 8;
  {
    Trainer resumed(c, RunOptions::Quiet());
    ASSERT_EQ(resumed.step(), 6);
    ASSERT_EQ(resumed.warnings().size(), 1u);
    EXPECT_THAT(resumed.warnings()[0], ::testing::HasSubstr("step_6.pt"));
    resumed.Train();
  }
  EXPECT_EQ(CheckpointDirNames(c.train.out_dir),
            (std::vector<std::string>{"step_0000008.pt", "step_6.pt"}));
}

// A checkpoint the process cannot open for want of file descriptors is not damaged: the error
// says so (run again), where a damaged one would be skipped for the one before it.
TEST(ResumeTest, ACheckpointThatCannotBeOpenedForWantOfDescriptorsIsNotDamaged) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  c.train.checkpoint_interval = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string step2 = CheckpointPath(c.train.out_dir, 2);
  Model model = MakeModel(c.student);
  const int lowest_free = ::open("/dev/null", O_RDONLY);  // what the next open would get
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  std::string what = "nothing thrown";
  {
    // Lowered for this scope only, whatever is thrown (the later tests need descriptors).
    struct DescriptorLimit {
      rlimit saved{};
      explicit DescriptorLimit(int most) {
        getrlimit(RLIMIT_NOFILE, &saved);
        rlimit limited = saved;
        limited.rlim_cur = static_cast<rlim_t>(most);
        EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &limited), 0);
      }
      ~DescriptorLimit() { setrlimit(RLIMIT_NOFILE, &saved); }
    } limit(lowest_free);  // the next open fails: EMFILE
    try {
      LoadWeights(step2, *model, at::Device(at::kCPU));
    } catch (const CorruptCheckpointError& e) {
      what = std::string("damaged: ") + e.what();
    } catch (const std::exception& e) {
      what = e.what();
    }
  }
  EXPECT_THAT(what, ::testing::HasSubstr(step2 + ": cannot be opened now: Too many open files "
                                                 "(this process's descriptor limit, not the file"));
  EXPECT_NO_THROW(LoadWeights(step2, *model, at::Device(at::kCPU)));  // intact
}

// A zip archive that torch reads but that the trainer did not write (a TorchScript module, a
// file of another program) is a damaged checkpoint: refused naming the file and what is wrong in
// it, not with torch's internal assertion, and a resume falls back to the previous checkpoint.
TEST(ResumeTest, AnArchiveTheTrainerDidNotWriteIsADamagedCheckpoint) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  c.train.checkpoint_interval = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string step4 = CheckpointPath(c.train.out_dir, 4);
  {
    torch::serialize::OutputArchive foreign;
    foreign.write("architecture", c10::IValue(int64_t{3}));
    foreign.write("step", c10::IValue(std::string("four")));
    foreign.save_to(step4);
  }
  ASSERT_EQ(ReadBytes(step4).substr(0, 2), "PK");  // read as a checkpoint from before checksums
  Model model = MakeModel(c.student);
  try {
    LoadWeights(step4, *model, at::Device(at::kCPU));
    FAIL() << "loaded a foreign archive";
  } catch (const CorruptCheckpointError& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr(step4 + ": not a distill_trainer checkpoint (its "
                                             "\"architecture\" holds a value of type Int, not "
                                             "text)"));
  }
  c.train.steps = 6;
  {
    Trainer resumed(c, RunOptions::Quiet());
    EXPECT_EQ(resumed.step(), 2);
    ASSERT_EQ(resumed.warnings().size(), 1u);
    EXPECT_THAT(resumed.warnings()[0],
                ::testing::HasSubstr(step4 + ": not a distill_trainer checkpoint"));
  }
}

// A checkpoint whose weights hold NaN or inf (the trainer never writes one: written by something
// else) is refused at load, naming the tensor, where a teacher (and a student initialised from
// it) would otherwise train on it; in a run directory the previous checkpoint is used instead.
TEST(ResumeTest, NonFiniteWeightsInACheckpointAreRefusedAtLoad) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  c.train.checkpoint_interval = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const std::string step4 = CheckpointPath(c.train.out_dir, 4);
  Model poisoned = MakeModel(c.student);
  LoadWeights(step4, *poisoned, at::Device(at::kCPU));
  std::string name;
  {
    at::NoGradGuard no_grad;
    auto named = poisoned->named_parameters();
    name = named.begin()->key();
    named.begin()->value().view({-1})[3] = std::numeric_limits<float>::infinity();
  }
  {
    // As SaveCheckpoint writes one, without its refusal (a file from before checksums).
    torch::serialize::OutputArchive archive, model_archive;
    poisoned->save(model_archive);
    archive.write("model", model_archive);
    archive.write("architecture", c10::IValue(ArchitectureString(poisoned->config())));
    archive.write("step", c10::IValue(int64_t{4}));
    archive.save_to(step4);
  }
  Model model = MakeModel(c.student);
  try {
    LoadWeights(step4, *model, at::Device(at::kCPU));
    FAIL() << "loaded non-finite weights";
  } catch (const CorruptCheckpointError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(step4 +
                                               ": not a distill_trainer checkpoint (its "
                                               "weight " +
                                               name + " holds 1 NaN or infinite value of "));
  }
  std::vector<std::string> warnings;
  EXPECT_EQ(
      LoadWeights(c.train.out_dir, *model, at::Device(at::kCPU), "teacher.checkpoint", &warnings),
      CheckpointPath(c.train.out_dir, 2));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], ::testing::HasSubstr("its weight " + name + " holds 1 NaN"));
  for (const auto& p : model->parameters()) EXPECT_TRUE(at::isfinite(p).all().item<bool>());
}

// Something else where the checkpoints belong is refused before anything is written (it was
// read as "no checkpoints": the resume trained from step 0, dropped the run's metrics, then
// failed to write its first checkpoint).
TEST(ResumeTest, ACheckpointsPathThatIsNoDirectoryIsRefusedBeforeAnythingChanges) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 2;
  c.train.log_interval = 1;
  Trainer(c, RunOptions::Quiet()).Train();
  const fs::path checkpoints = fs::path(c.train.out_dir) / "checkpoints";
  RemoveTree(checkpoints.string());
  WriteBytes(checkpoints.string(), "a file");
  const std::string metrics = ReadBytes(c.train.out_dir + "/metrics.jsonl");
  c.train.steps = 3;
  try {
    Trainer t(c, RunOptions::Quiet());
    FAIL() << "resumed without its checkpoints directory";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr(checkpoints.string() + ": not a directory; a run keeps its "
                                                            "checkpoints there: move it away"));
  }
  EXPECT_EQ(ReadBytes(c.train.out_dir + "/metrics.jsonl"), metrics);
}

// A checkpoint carries its run's identity: one copied into another run's directory is refused
// with the reason (a teacher checkpoint, from another run by design, is not checked).
TEST(ResumeTest, CheckpointOfAnotherRunIsRefused) {
  Config a = TinyConfig(TempRunDir("-a"));
  a.train.steps = 4;
  Trainer(a, RunOptions::Quiet()).TrainUntil(4);
  Config b = a;
  b.train.out_dir = TempRunDir("-b");
  b.optim.lr = 0.01;
  Trainer(b, RunOptions::Quiet()).TrainUntil(2);
  fs::copy_file(CheckpointPath(a.train.out_dir, 4), CheckpointPath(b.train.out_dir, 4));
  try {
    Trainer t(b, RunOptions::Quiet());
    FAIL() << "resumed from another run's checkpoint";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(CheckpointPath(b.train.out_dir, 4) +
                                         " is a checkpoint of another run"),
              std::string::npos)
        << e.what();
  }
  Model model = MakeModel(b.student);
  EXPECT_EQ(LoadWeights(b.train.out_dir, *model, at::Device(at::kCPU)),
            CheckpointPath(b.train.out_dir, 4));
}

// Only files named as the trainer names its checkpoints (step_<digits>.pt) are checkpoints: a
// user's copies beside them are neither resumed from nor pruned, and the steps order by number
// (past 7 digits the zero-padded names no longer sort by step). A device is no checkpoint.
TEST(ResumeTest, OnlyTheTrainersCheckpointNamesAreCheckpoints) {
  Config c = TinyConfig(TempRunDir());
  c.train.steps = 4;
  c.train.checkpoint_interval = 2;
  c.train.keep_checkpoints = 2;
  Trainer(c, RunOptions::Quiet()).Train();
  const fs::path dir = fs::path(c.train.out_dir) / "checkpoints";
  for (const char* name : {"step_best.pt", "step_0000002_keep.pt", "step_.pt", "step_2.pt.bak"}) {
    fs::copy_file(CheckpointPath(c.train.out_dir, 2), dir / name);
  }
  EXPECT_EQ(LatestCheckpoint(c.train.out_dir), CheckpointPath(c.train.out_dir, 4));
  c.train.steps = 8;
  {
    Trainer resumed(c, RunOptions::Quiet());
    EXPECT_EQ(resumed.step(), 4);  // not 2, from a copy
    resumed.Train();
  }
  EXPECT_EQ(CheckpointDirNames(c.train.out_dir),
            (std::vector<std::string>{"step_.pt", "step_0000002_keep.pt", "step_0000006.pt",
                                      "step_0000008.pt", "step_2.pt.bak", "step_best.pt"}));

  // A checkpoint's name that says another step than it holds (a copy under another name) is
  // skipped with a warning, not resumed from: it would set the run back at every start.
  fs::copy_file(CheckpointPath(c.train.out_dir, 6), CheckpointPath(c.train.out_dir, 99));
  c.train.steps = 10;
  {
    Trainer resumed(c, RunOptions::Quiet());
    EXPECT_EQ(resumed.step(), 8);
    ASSERT_EQ(resumed.warnings().size(), 1u);
    EXPECT_THAT(resumed.warnings()[0],
                ::testing::HasSubstr(CheckpointPath(c.train.out_dir, 99) +
                                     ": holds step 6, not step 99 as its name says (a copy under "
                                     "another name?)"));
  }
  // A run directory read as a teacher (or exported) skips it the same way.
  {
    Model teacher = MakeModel(c.student);
    std::vector<std::string> warnings;
    EXPECT_EQ(LoadWeights(c.train.out_dir, *teacher, at::Device(at::kCPU), "teacher.checkpoint",
                          &warnings),
              CheckpointPath(c.train.out_dir, 8));
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_THAT(warnings[0], ::testing::HasSubstr("holds step 6, not step 99"));
  }

  const std::string other = TempRunDir("-order");
  fs::create_directories(fs::path(other) / "checkpoints");
  for (const char* name : {"step_9999999.pt", "step_10000000.pt", "step_0000003.pt"}) {
    std::ofstream(fs::path(other) / "checkpoints" / name) << "x";
  }
  EXPECT_EQ(LatestCheckpoint(other),
            (fs::path(other) / "checkpoints" / "step_10000000.pt").string());

  Model model = MakeModel(c.student);
  try {
    LoadWeights("/dev/zero", *model, at::Device(at::kCPU));
    FAIL() << "read a device as a checkpoint";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "teacher.checkpoint: \"/dev/zero\" is not a regular file (a device or pipe); "
                 "expected a checkpoint file or a run directory");
  }
}

// A pipeline asked for fewer steps than its stages have trained: the stages are not shortened,
// and the pipeline's config.yaml keeps their steps as theirs do (it used to take the request's).
TEST(ResumeTest, APipelineIsNotShortenedAndItsConfigSaysSo) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = Mode::kDistill;
  c.teacher.pretrain_steps = 2;
  c.train.steps = 3;
  c.train.baseline = true;
  ASSERT_TRUE(IsPipeline(c));
  std::ostringstream out;
  distill::Run(c, RunFlags{false, true}, out);
  c.train.steps = 2;
  std::vector<ResultRow> rows = distill::Run(c, RunFlags{false, true}, out);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].steps, 3);
  EXPECT_EQ(rows[2].steps, 3);
  for (const std::string dir : {"", "/student", "/baseline"}) {
    EXPECT_NE(ReadBytes(c.train.out_dir + dir + "/config.yaml").find("\n  steps: 3\n"),
              std::string::npos)
        << dir;
  }
  c.train.steps = 4;  // a larger one trains on, and is kept
  rows = distill::Run(c, RunFlags{false, true}, out);
  EXPECT_EQ(rows[1].steps, 4);
  EXPECT_NE(ReadBytes(c.train.out_dir + "/config.yaml").find("\n  steps: 4\n"), std::string::npos);
}

// --fresh on a pipeline deletes the previous run only once the first stage has built its models
// and data: a start that fails (a typo in data.path) leaves the previous run as it was, and the
// corrected command then starts over.
TEST(ResumeTest, PipelineFreshThatFailsAtStartDeletesNothing) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = Mode::kDistill;
  c.teacher.pretrain_steps = 2;
  c.train.steps = 2;
  ASSERT_TRUE(IsPipeline(c));
  std::ostringstream out;
  distill::Run(c, RunFlags{false, true}, out);
  const std::string teacher = CheckpointPath(c.train.out_dir + "/teacher", 2);
  const std::string student = CheckpointPath(c.train.out_dir + "/student", 2);
  ASSERT_TRUE(fs::exists(teacher) && fs::exists(student));
  Config typo = c;
  typo.data.source = "text";
  typo.data.path = c.train.out_dir + "-missing.txt";
  for (ModelConfig* m :
       {static_cast<ModelConfig*>(&typo.student), static_cast<ModelConfig*>(&typo.teacher)}) {
    m->vocab_size = 256;
  }
  EXPECT_THROW(distill::Run(typo, RunFlags{true, true}, out), std::runtime_error);
  EXPECT_TRUE(fs::exists(teacher));
  EXPECT_TRUE(fs::exists(student));
  // The same command that made it resumes it; --fresh with a good config starts over.
  std::ostringstream again, fresh;
  distill::Run(c, RunFlags{false, true}, again);
  distill::Run(c, RunFlags{true, true}, fresh);
  EXPECT_EQ(again.str(), fresh.str());
  EXPECT_TRUE(fs::exists(student));
}

// The handlers set a flag (the process keeps running) and are restored afterwards.
TEST(ResumeTest, StopSignalsSetAFlagAndRestoreTheHandlers) {
  struct sigaction before {
  }, hangup_before{};
  sigaction(SIGTERM, nullptr, &before);
  sigaction(SIGHUP, nullptr, &hangup_before);
  {
    StopSignals signals;
    EXPECT_EQ(StopSignals::Pending(), 0);
    struct sigaction hangup_during {};
    sigaction(SIGHUP, nullptr, &hangup_during);
    if (hangup_before.sa_handler == SIG_IGN) {  // ignored at start (nohup): it stays ignored
      EXPECT_EQ(hangup_during.sa_handler, SIG_IGN);
    } else {
      EXPECT_NE(hangup_during.sa_handler, hangup_before.sa_handler);  // handled while alive
    }
    raise(SIGTERM);
    EXPECT_EQ(StopSignals::Pending(), SIGTERM);
  }
  struct sigaction after {
  }, hangup_after{};
  sigaction(SIGTERM, nullptr, &after);
  sigaction(SIGHUP, nullptr, &hangup_after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  EXPECT_EQ(hangup_after.sa_handler, hangup_before.sa_handler);
  EXPECT_EQ(SignalName(SIGINT), "SIGINT");
  EXPECT_EQ(SignalName(SIGHUP), "SIGHUP");
}

// A token shard truncated while it is mapped (the trainer reads it): SIGBUS, explained in one
// line, and the process ends as by the signal.
TEST(ResumeDeathTest, ATokenShardCutShortWhileMappedIsExplained) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtime handles SIGBUS itself";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = TempRunDir();
  fs::create_directories(dir);
  const std::string path = dir + "/shard.bin";
  WriteTokenShard(path, std::vector<uint32_t>(1 << 18, 3), /*wide=*/false);
  EXPECT_EXIT(
      {
        ExplainBusErrors();
        const TokenShard shard(path);
        ASSERT_EQ(::truncate(path.c_str(), 1024), 0);
        int64_t sum = 0;
        for (int64_t i = 0; i < shard.num_tokens(); ++i) sum += shard.Token(i);
        std::printf("%lld\n", static_cast<long long>(sum));
      },
      ::testing::KilledBySignal(SIGBUS),
      "distill_trainer: SIGBUS: a memory-mapped file was cut short while it was read");
}

// A death by a handled signal (a second Ctrl-C during a checkpoint's write) deletes the temporary
// being written, and only that: the file it replaces and a temporary no longer tracked stay.
TEST(ResumeDeathTest, ASignalDeathDeletesTheTemporaryBeingWritten) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = TempRunDir();
  fs::create_directories(dir);
  const std::string tmp = dir + "/step_0000002.pt.tmp", done = dir + "/metrics.jsonl.tmp";
  WriteBytes(dir + "/step_0000002.pt", "the previous file");
  EXPECT_EXIT(
      {
        { const RemoveOnSignalDeath finished(done); }
        WriteBytes(done, "kept");
        const RemoveOnSignalDeath writing(tmp);
        WriteBytes(tmp, "half-written");
        DieBySignal(SIGINT);
      },
      ::testing::KilledBySignal(SIGINT), "");
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp)));
  EXPECT_EQ(ReadBytes(dir + "/step_0000002.pt"), "the previous file");
  EXPECT_EQ(ReadBytes(done), "kept");
}

// A checkpoint's temporary left by a killed write (kill -9, or a second signal during it) is
// deleted when the run next writes a checkpoint, whatever step it was for; other files stay.
TEST(ResumeTest, PruningDeletesTheTemporariesOfKilledCheckpointWrites) {
  const std::string dir = TempRunDir();
  fs::create_directories(dir + "/checkpoints");
  for (const char* name :
       {"step_0000002.pt.tmp", "step_0000009.pt.tmp", "notes.tmp", "step_0000004.pt"}) {
    WriteBytes(dir + "/checkpoints/" + name, "x");
  }
  fs::create_symlink(dir + "/checkpoints/notes.tmp", dir + "/checkpoints/step_0000003.pt.tmp");
  PruneCheckpoints(dir, /*keep=*/3, /*step=*/4, {});
  for (const char* gone : {"step_0000002.pt.tmp", "step_0000009.pt.tmp"}) {
    EXPECT_FALSE(fs::exists(dir + "/checkpoints/" + gone)) << gone;
  }
  for (const char* kept : {"notes.tmp", "step_0000004.pt", "step_0000003.pt.tmp"}) {
    EXPECT_TRUE(fs::exists(fs::symlink_status(dir + "/checkpoints/" + kept))) << kept;
  }
}

// train.keep_checkpoints deletes only this run's checkpoints: one copied in from another run (or
// a damaged one) is neither counted nor deleted, and the run says so once. The run's own older
// checkpoints, from before this process, are pruned as before.
TEST(ResumeTest, PruningLeavesAnotherRunsCheckpointsAlone) {
  Config a = TinyConfig(TempRunDir("-a"));
  a.train.steps = 1;
  a.train.checkpoint_interval = 1;
  Config b = TinyConfig(TempRunDir("-b"));
  b.optim.lr = a.optim.lr * 2;  // another run
  b.train.steps = 2;
  b.train.checkpoint_interval = 1;
  b.train.keep_checkpoints = 1;
  ASSERT_NE(RunIdentityHash(a), RunIdentityHash(b));
  Trainer(a, RunOptions::Quiet()).Train();
  Trainer(b, RunOptions::Quiet()).Train();
  ASSERT_FALSE(fs::exists(CheckpointPath(b.train.out_dir, 1)));  // pruned: b's own
  fs::copy_file(CheckpointPath(a.train.out_dir, 1), CheckpointPath(b.train.out_dir, 1));
  const std::string damaged = b.train.out_dir + "/checkpoints/step_0000000.pt";
  WriteBytes(damaged, "not a checkpoint");
  b.train.steps = 4;
  Trainer resumed(b, RunOptions::Quiet());
  EXPECT_EQ(resumed.step(), 2);
  resumed.Train();
  EXPECT_TRUE(fs::exists(CheckpointPath(b.train.out_dir, 1)));  // a's: kept
  EXPECT_EQ(ReadBytes(damaged), "not a checkpoint");
  EXPECT_FALSE(fs::exists(CheckpointPath(b.train.out_dir, 2)));  // b's own, older: pruned
  EXPECT_FALSE(fs::exists(CheckpointPath(b.train.out_dir, 3)));
  EXPECT_TRUE(fs::exists(CheckpointPath(b.train.out_dir, 4)));
  EXPECT_EQ(CheckpointRunIdentity(CheckpointPath(b.train.out_dir, 4)), RunIdentityHash(b));
  EXPECT_EQ(CheckpointRunIdentity(CheckpointPath(b.train.out_dir, 1)), RunIdentityHash(a));
  EXPECT_THROW(CheckpointRunIdentity(damaged), CorruptCheckpointError);
  std::vector<std::string> about;
  for (const std::string& w : resumed.warnings()) {
    if (w.find("train.keep_checkpoints neither counts nor deletes it") != std::string::npos) {
      about.push_back(w);
    }
  }
  ASSERT_EQ(about.size(), 2u) << ::testing::PrintToString(resumed.warnings());
  EXPECT_THAT(about, ::testing::Contains(
                         ::testing::AllOf(::testing::HasSubstr(CheckpointPath(b.train.out_dir, 1)),
                                          ::testing::HasSubstr("a checkpoint of another run"))));
  EXPECT_THAT(about, ::testing::Contains(::testing::AllOf(::testing::HasSubstr(damaged),
                                                          ::testing::HasSubstr("not an intact"))));
}

// out_dir "<dir>/." (or "."): the baseline goes beside <dir>, as for "<dir>", not into a hidden
// ".-baseline" inside the run, which --fresh then refused as a file the trainer did not write.
TEST(ResumeTest, TheBaselineOfADotOutDirGoesBesideTheRun) {
  Config c = testing::TinyDistillConfig(TempRunDir(), /*teacher_steps=*/2);
  const std::string dir = c.train.out_dir;
  c.train.steps = 2;
  c.train.baseline = true;
  c.train.out_dir = dir + "/.";
  for (const bool fresh : {false, true}) {
    SCOPED_TRACE(fresh ? "--fresh" : "");
    std::ostringstream table;
    EXPECT_EQ(distill::Run(c, RunFlags{fresh, true}, table).size(), 2u);
    EXPECT_TRUE(fs::exists(dir + "-baseline/summary.json"));
    EXPECT_FALSE(fs::exists(dir + "/.-baseline"));
  }
}

// A single distillation with train.baseline trains the baseline into <out_dir>-baseline after
// it. A directory there that would refuse the baseline (here a user's own folder) is found
// before the distillation trains, with what to do about it; nothing is written or deleted.
TEST(ResumeTest, ABaselineDirectoryInTheWayIsFoundBeforeTheDistillationTrains) {
  Config c = testing::TinyDistillConfig(TempRunDir(), /*teacher_steps=*/2);
  c.train.steps = 2;
  c.train.baseline = true;
  const std::string baseline = c.train.out_dir + "-baseline";
  fs::create_directories(baseline);
  WriteBytes(baseline + "/notes.txt", "mine");
  for (const bool fresh : {false, true}) {
    SCOPED_TRACE(fresh ? "--fresh" : "");
    std::ostringstream table;
    try {
      distill::Run(c, RunFlags{fresh, true}, table);
      ADD_FAILURE() << "trained with a foreign directory where the baseline goes";
    } catch (const RunDirError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(baseline));
      EXPECT_THAT(e.what(),
                  ::testing::HasSubstr(fmt::format(
                      "(nothing was trained: this is the directory of the hard-label baseline "
                      "that train.baseline: true trains after the distillation, train.out_dir + "
                      "\"-baseline\"; {}train.baseline=false leaves the baseline out)",
                      fresh ? ""
                            : "--fresh would start the distillation in " + c.train.out_dir +
                                  " over as well, and ")));
    }
    EXPECT_FALSE(fs::exists(c.train.out_dir));
    EXPECT_EQ(ReadBytes(baseline + "/notes.txt"), "mine");
  }
  // Without the baseline the distillation runs, and leaves that directory alone.
  c.train.baseline = false;
  std::ostringstream table;
  EXPECT_EQ(distill::Run(c, RunFlags{false, true}, table).size(), 1u);
  EXPECT_EQ(ReadBytes(baseline + "/notes.txt"), "mine");
}

// A pipeline named by another spelling of its path, or moved, is the same run: its student
// stage's teacher.checkpoint (<pipeline>/teacher) counts in the run identity relative to the
// stage's directory. Both were refused as "a different run" (found by a hunt), and no override
// could continue them. A checkpoint written with the identity of before (the path as typed)
// still belongs to the run.
TEST(ResumeTest, APipelineMovedOrSpelledAnotherWayResumes) {
  const std::string base = TempRunDir();
  Config c = TinyConfig(base + "/p");
  c.train.mode = Mode::kDistill;
  c.teacher.pretrain_steps = 3;
  c.train.steps = 2;
  c.train.log_interval = 1;
  std::ostringstream out;
  distill::Run(c, RunFlags{false, true}, out);
  const auto student_steps = [](const std::string& pipeline) {
    return LoggedTrainSteps(pipeline + "/student");
  };
  ASSERT_EQ(student_steps(base + "/p"), (std::vector<int64_t>{1, 2}));
  // Relative where it was absolute.
  c.train.out_dir = fs::relative(base + "/p", fs::current_path()).string();
  ASSERT_NE(c.train.out_dir, base + "/p");
  c.train.steps = 3;
  distill::Run(c, RunFlags{false, true}, out);
  EXPECT_EQ(student_steps(base + "/p"), (std::vector<int64_t>{1, 2, 3}));
  // Moved.
  fs::rename(base + "/p", base + "/q");
  c.train.out_dir = base + "/q";
  c.train.steps = 4;
  distill::Run(c, RunFlags{false, true}, out);
  EXPECT_EQ(student_steps(base + "/q"), (std::vector<int64_t>{1, 2, 3, 4}));
  // A stage whose checkpoint carries the identity of before (the paths as typed, as a previous
  // version wrote it), moved: it belongs to the run that config.yaml names.
  {
    const Config at_q = StudentStageConfig(c);
    const std::vector<std::string> ids = AcceptedRunIdentityHashes(at_q);
    ASSERT_EQ(ids.size(), 2u);
    auto model = MakeModel(at_q.student);
    auto optimizer = MakeOptimizer(at_q.optim, *model);
    const std::string ck = CheckpointPath(at_q.train.out_dir, 4);
    const TrainingPosition position =
        LoadCheckpoint(ck, *model, *optimizer, at::Device(at::kCPU), ids);
    SaveCheckpoint(ck, *model, *optimizer, position, at::Device(at::kCPU), ids[1]);
  }
  fs::rename(base + "/q", base + "/r");
  c.train.out_dir = base + "/r";
  c.train.steps = 5;
  // A start there that ends before its first checkpoint (killed, out of memory) has rewritten
  // config.yaml with the new paths: the marker keeps the identity of before, and the next start
  // still resumes (found by review: it was refused as a checkpoint of another run).
  { Trainer interrupted(StudentStageConfig(c), RunOptions::Quiet()); }
  EXPECT_NE(ReadBytes(base + "/r/student/" + kRunMarker).find("previous_identities: "),
            std::string::npos);
  distill::Run(c, RunFlags{false, true}, out);
  EXPECT_EQ(student_steps(base + "/r"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  // Later starts still own the checkpoint of before: train.keep_checkpoints (2) prunes it once
  // steps 5 and 6 are written (a checkpoint of another run would be kept, with a warning).
  c.train.steps = 6;
  distill::Run(c, RunFlags{false, true}, out);
  EXPECT_EQ(student_steps(base + "/r"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(fs::exists(CheckpointPath(base + "/r/student", 4)));
  EXPECT_TRUE(fs::exists(CheckpointPath(base + "/r/student", 6)));

  const Config stage = StudentStageConfig(c);
  // The identity of a teacher beside the stage does not depend on where the pipeline lies, and
  // is pinned: a change of what RunIdentity writes for it would leave every pipeline's
  // checkpoints behind.
  EXPECT_EQ(RunIdentityHash(stage), "1986d35b904ce893");
  const std::vector<std::string> accepted = AcceptedRunIdentityHashes(stage);
  ASSERT_EQ(accepted.size(), 2u);
  EXPECT_EQ(accepted[0], RunIdentityHash(stage));
  Config elsewhere = stage;  // the teacher not beside it: its path is the identity, as before
  elsewhere.teacher.checkpoint = base + "/q/teacher/../teacher_copy";
  EXPECT_EQ(AcceptedRunIdentityHashes(elsewhere).size(), 1u);
  EXPECT_NE(RunIdentityHash(elsewhere), RunIdentityHash(stage));
  auto model = MakeModel(stage.student);
  auto optimizer = MakeOptimizer(stage.optim, *model);
  const std::string path = base + "/step_0000004.pt";
  TrainingPosition position;
  position.step = 4;
  for (const std::string& identity : {accepted[1], std::string("0123456789abcdef")}) {
    SaveCheckpoint(path, *model, *optimizer, position, at::Device(at::kCPU), identity);
    if (identity == accepted[1]) {
      EXPECT_EQ(LoadCheckpoint(path, *model, *optimizer, at::Device(at::kCPU), accepted).step, 4);
    } else {
      EXPECT_THAT([&] { LoadCheckpoint(path, *model, *optimizer, at::Device(at::kCPU), accepted); },
                  ::testing::ThrowsMessage<std::runtime_error>(
                      ::testing::HasSubstr("is a checkpoint of another run")));
    }
  }
}

// The quickstart's shape in miniature: teacher pretrain, distil, hard-label baseline. Running
// it again reuses the finished stages and reports the same table.
TEST(ResumeTest, PipelineRunsAndRerunsCleanly) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = Mode::kDistill;
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
  // The pipeline's config.yaml removed: the run continues, says so (also quiet), writes it again.
  const std::string pipeline_yaml = c.train.out_dir + "/config.yaml";
  const std::string pipeline_config = ReadBytes(pipeline_yaml);
  fs::remove(pipeline_yaml);
  std::ostringstream fourth;
  ::testing::internal::CaptureStderr();
  distill::Run(c, RunFlags{false, true}, fourth);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first.str(), fourth.str());
  EXPECT_THAT(said, ::testing::HasSubstr("warning: " + pipeline_yaml +
                                         " is missing, but the run's marker names this run"));
  EXPECT_EQ(ReadBytes(pipeline_yaml), pipeline_config);
  // The pipeline's directory given where a run's is expected (a teacher, an export) names the
  // stage runs inside it.
  Model model = MakeModel(c.student);
  try {
    LoadWeights(c.train.out_dir, *model, at::Device(at::kCPU), "teacher.checkpoint");
    ADD_FAILURE() << "loaded weights from a pipeline's directory";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(fmt::format(
                              "is a directory without checkpoints/step_*.pt (a pipeline's "
                              "directory: its runs are {0}/teacher, {0}/student or {0}/baseline)",
                              c.train.out_dir)));
  }
  // A Hugging Face model directory is named as one (for a teacher: the key that takes it).
  const std::string hf = c.train.out_dir + "-hf";
  fs::create_directories(hf);
  testing::WriteBytes(hf + "/config.json", "{}");
  for (const char* what : {"teacher.checkpoint", "export"}) {
    try {
      LoadWeights(hf, *model, at::Device(at::kCPU), what);
      ADD_FAILURE() << "loaded weights from a Hugging Face directory";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(),
                  ::testing::EndsWith(fmt::format(
                      "is a directory without checkpoints/step_*.pt (a Hugging Face "
                      "model directory, with config.json{})",
                      std::string(what) == "export" ? "" : ": give it as teacher.hf_dir")));
    }
  }
  RemoveTree(hf);
}

// A pipeline's --fresh deletes its stage runs: not while another process trains in one (here a
// child process holding the student stage's lock), and the refusal deletes nothing.
TEST(ResumeTest, PipelineFreshRefusesAStageInUseByAnotherProcess) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = Mode::kDistill;
  c.teacher.pretrain_steps = 3;
  c.train.steps = 2;
  std::ostringstream table;
  distill::Run(c, RunFlags{false, true}, table);
  const std::string student = c.train.out_dir + "/student";
  const std::vector<std::string> before = Names(student);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // async-signal-safe calls only: open, flock, write, pause
    const int fd = ::open((student + "/" + kRunLock).c_str(), O_RDWR);
    const char ok = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 'y' : 'n';
    [[maybe_unused]] const ssize_t n = ::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  try {
    std::ostringstream again;
    distill::Run(c, RunFlags{true, true}, again);
    ADD_FAILURE() << "--fresh deleted a pipeline whose student stage is in use";
  } catch (const RunDirError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(student + " is in use by another distill_trainer"));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(Names(student), before);
  EXPECT_TRUE(IsOwnRunDir(c.train.out_dir));
  std::ostringstream third;
  EXPECT_EQ(distill::Run(c, RunFlags{true, true}, third).size(), 2u);  // free again: --fresh works
}

// A distillation with kd_weight 0 is the cross-entropy-only control: the table says so, in the
// pipeline and as a single run (from the pipeline's teacher), instead of "student (distilled)".
TEST(ResumeTest, KdWeightZeroIsLabelledCeOnly) {
  Config c = TinyConfig(TempRunDir());
  c.train.mode = Mode::kDistill;
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

// A gpt model's MLP width set by intermediate_size (a GPT-2 read from Hugging Face has no other)
// is part of its checkpoint's architecture: another width is refused. A checkpoint written
// before the architecture named it (the model's intermediate_size 0) still loads.
TEST(ResumeTest, AGptCheckpointsMlpWidthIsChecked) {
  ModelConfig base;
  base.vocab_size = 24;
  base.context_length = 16;
  base.n_layer = 1;
  base.n_head = 2;
  base.d_model = 32;  // mlp_ratio 4: width 128
  const std::string dir = TempRunDir("-mlp-width");
  fs::create_directories(dir);
  const auto save = [&](const ModelConfig& config, const std::string& name) {
    Model model = MakeModel(config);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    SaveCheckpoint(dir + "/" + name, *model, optimizer, TrainingPosition{}, at::Device(at::kCPU));
    return dir + "/" + name;
  };
  const std::string before = save(base, "before.pt");  // as earlier versions wrote every gpt
  ModelConfig width_128 = base, width_96 = base;
  width_128.intermediate_size = 128;
  width_96.intermediate_size = 96;
  Model model = MakeModel(width_128);
  EXPECT_NO_THROW(LoadWeights(before, *model, at::Device(at::kCPU)));
  const std::string narrow = save(width_96, "narrow.pt");
  EXPECT_THAT([&] { LoadWeights(narrow, *model, at::Device(at::kCPU)); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  ::testing::AllOf(::testing::HasSubstr("intermediate_size=96"),
                                   ::testing::HasSubstr("differs from the configured one in "
                                                        "intermediate_size (96 in the checkpoint, "
                                                        "128 configured)"),
                                   ::testing::HasSubstr("intermediate_size=128"))));
}

}  // namespace
}  // namespace distill

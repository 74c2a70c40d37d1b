// The reliability suite (issue 17): distill_trainer as a user runs it, as a process, under
// kill -9 at random moments and inside its file writes, a full disk, a file-size limit,
// corrupt and foreign checkpoints, NaN and hostile configs. After every interruption the same
// command must finish with the final checkpoint and metrics of an uninterrupted run
// (bit-identical weights and AdamW state; metrics equal but for timings). Faults inside writes
// come from fault_shim.cpp (LD_PRELOAD), a full disk too: no root needed.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "distill/checkpoint.h"
#include "distill/trainer.h"
#include "test_files.h"

extern char** environ;

namespace distill {
namespace {

namespace fs = std::filesystem;
using testing::ExpectContains;
using testing::ReadBytes;
using testing::WriteBytes;

constexpr int64_t kSteps = 24;

struct Outcome {
  int exit_status = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string err;  // stderr
  double seconds = 0;
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "exit " << o.exit_status << ", signal " << o.signal << ", stderr:\n" << o.err;
}

// Runs `argv` (argv[0] a path) with the environment plus `env`, stdout to /dev/null and stderr
// captured; SIGKILLs it after `kill_after_s` seconds when > 0, and after `timeout_s` anyway.
Outcome Spawn(const std::vector<std::string>& argv, const std::string& work,
              const std::vector<std::string>& env = {}, double kill_after_s = 0,
              double timeout_s = 300) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.emplace_back("OMP_NUM_THREADS=1");  // bit-identical across attempts
  for (const auto& e : env) env_strings.push_back(e);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string err_path = work + "/stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = 0;
  const auto start = std::chrono::steady_clock::now();
  const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  Outcome o;
  if (spawned != 0) {
    ADD_FAILURE() << "cannot start " << argv[0];
    return o;
  }
  const double limit = kill_after_s > 0 ? kill_after_s : timeout_s;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (o.seconds > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      if (kill_after_s <= 0) ADD_FAILURE() << argv[0] << " ran past " << timeout_s << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) o.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  o.err = ReadBytes(err_path);
  return o;
}

// The tiny models of test_util.h as YAML, written once per test: a 4-step teacher and a
// distillation with dropout (RNG restored), gradient accumulation (data position restored),
// evaluation and pruned checkpoints.
class ReliabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = testing::FreshTestDir("distill_reliability_");
    const std::string teacher_arch =
        "{vocab_size: 24, pad_vocab_to_multiple_of: 32, context_length: 16, n_layer: 2, n_head: 2,"
        " d_model: 32";
    const std::string data =
        "data: {batch_size: 4, seq_len: 16, min_seq_len: 4, synthetic: {order: 1}}\n"
        "schedule: {warmup_steps: 2}\n";
    teacher_yaml_ = work_ + "/teacher.yaml";
    WriteBytes(teacher_yaml_, "student: " + teacher_arch + "}\n" + data +
                                  "train: {mode: pretrain, device: cpu, steps: 4, out_dir: " +
                                  work_ + "/teacher}\n");
    student_yaml_ = work_ + "/student.yaml";
    WriteBytes(student_yaml_,
               "student: {vocab_size: 24, pad_vocab_to_multiple_of: 32, context_length: 16,"
               " n_layer: 1, n_head: 2, d_model: 32, dropout: 0.1}\n"
               "teacher: " +
                   teacher_arch + ", checkpoint: " + work_ + "/teacher}\n" + data +
                   "distill: {ce_weight: 0.5}\n"
                   "train: {mode: distill, device: cpu, steps: " +
                   std::to_string(kSteps) +
                   ", grad_accum: 2, log_interval: 1, eval_interval: 8, eval_batches: 2,"
                   " checkpoint_interval: 4, keep_checkpoints: 2}\n");
    const Outcome teacher = Train({"--config", teacher_yaml_});
    ASSERT_EQ(teacher.exit_status, 0) << teacher;
  }

  Outcome Train(std::vector<std::string> args, const std::vector<std::string>& env = {},
                double kill_after_s = 0) {
    args.insert(args.begin(), DISTILL_TRAINER_BIN);
    return Spawn(args, work_, env, kill_after_s);
  }
  // The distillation into `dir` (the same command every attempt).
  Outcome Distill(const std::string& dir, const std::vector<std::string>& env = {},
                  double kill_after_s = 0, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--config", student_yaml_, "train.out_dir=" + dir};
    args.insert(args.end(), extra.begin(), extra.end());
    return Train(args, env, kill_after_s);
  }
  // An uninterrupted run, once per test: what every interrupted one must end with.
  const std::string& Reference() {
    if (reference_.empty()) {
      reference_ = work_ + "/reference";
      const Outcome o = Distill(reference_);
      EXPECT_EQ(o.exit_status, 0) << o;
      reference_seconds_ = o.seconds;
    }
    return reference_;
  }

  std::string work_, teacher_yaml_, student_yaml_, reference_;
  double reference_seconds_ = 0;
};

// metrics.jsonl or summary.json without the fields that measure time.
std::string WithoutTimings(const std::string& text) {
  static const std::regex timing(",\"(tokens_per_s|elapsed_s)\":[^,}]*");
  return std::regex_replace(text, timing, "");
}

// Every file of the run directory is whole: no temporary left, every metrics line complete.
void ExpectNoDebris(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }
  std::ifstream in(dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    EXPECT_TRUE(!line.empty() && line.front() == '{' && line.back() == '}') << line;
  }
}

// The finished run in `dir` ended exactly as the reference: final checkpoint (weights, AdamW
// moments, step, data position), metrics and summary (timings aside), nothing left over.
void ExpectSameFinish(const std::string& dir, const std::string& reference) {
  ExpectNoDebris(dir);
  const std::string yaml = ReadBytes(reference + "/config.yaml");
  const Config config = ParseConfig(yaml, reference + "/config.yaml");
  auto load = [&](const std::string& run, Model& model,
                  std::unique_ptr<torch::optim::AdamW>& optimizer) {
    model = MakeModel(config.student);
    optimizer = MakeOptimizer(config.optim, *model);
    return LoadCheckpoint(CheckpointPath(run, kSteps), *model, *optimizer, at::Device(at::kCPU));
  };
  Model a, b;
  std::unique_ptr<torch::optim::AdamW> oa, ob;
  const TrainingPosition pa = load(dir, a, oa), pb = load(reference, b, ob);
  EXPECT_EQ(pa.step, pb.step);
  EXPECT_EQ(pa.data_position, pb.data_position);
  auto params_b = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), params_b[p.key()])) << dir << ": " << p.key();
    const auto* sa = static_cast<torch::optim::AdamWParamState*>(
        oa->state().at(p.value().unsafeGetTensorImpl()).get());
    const auto* sb = static_cast<torch::optim::AdamWParamState*>(
        ob->state().at(params_b[p.key()].unsafeGetTensorImpl()).get());
    EXPECT_TRUE(at::equal(sa->exp_avg(), sb->exp_avg()) &&
                at::equal(sa->exp_avg_sq(), sb->exp_avg_sq()))
        << dir << ": AdamW state of " << p.key();
  }
  EXPECT_EQ(WithoutTimings(ReadBytes(dir + "/metrics.jsonl")),
            WithoutTimings(ReadBytes(reference + "/metrics.jsonl")))
      << dir;
  EXPECT_EQ(WithoutTimings(ReadBytes(dir + "/summary.json")),
            WithoutTimings(ReadBytes(reference + "/summary.json")))
      << dir;
}

// kill -9 at random moments (start-up, steps, evaluations, checkpoint and metrics writes, the
// end), each time followed by the same command, until one attempt finishes. The seed is printed;
// DISTILL_RELIABILITY_SEED repeats a sequence.
TEST_F(ReliabilityTest, KillNineAtRandomMomentsThenResumeMatchesAnUninterruptedRun) {
  const std::string reference = Reference();
  const char* seed_env = std::getenv("DISTILL_RELIABILITY_SEED");
  const unsigned seed = seed_env ? std::atoi(seed_env) : std::random_device()();
  std::mt19937 rng(seed);
  // Kill points over the whole run, start-up included; later attempts have less left to do, so
  // some finish on their own.
  std::uniform_real_distribution<double> moment(0.02, 1.0);
  int kills = 0;
  // Five trials, and more (up to 15) while fewer than 3 kills landed: on a loaded machine the
  // reference run can be slower than the trials, whose kills then come after they finished.
  for (int trial = 0; trial < 15 && (trial < 5 || kills < 3); ++trial) {
    const std::string dir = work_ + "/killed" + std::to_string(trial);
    // Up to three kills, then the same command once more without one, to the end.
    for (int attempt = 0; attempt < 4; ++attempt) {
      const double at = attempt < 3 ? moment(rng) * reference_seconds_ : 0;
      const Outcome o = Distill(dir, {}, at);
      if (o.signal == SIGKILL && at > 0) {
        ++kills;
        continue;
      }
      ASSERT_EQ(o.exit_status, 0) << "seed " << seed << ", trial " << trial << ": " << o;
      break;
    }
    ExpectSameFinish(dir, reference);
  }
  std::cout << "seed " << seed << ": " << kills << " kills at random moments of "
            << reference_seconds_ << " s runs\n";
  EXPECT_GE(kills, 3) << "seed " << seed;  // most trials' first attempt is cut
}

// kill -9 inside the file writes, at points a random moment rarely hits: a torn checkpoint, a
// checkpoint fsync'd but not renamed, a torn metrics record, a torn or unrenamed metrics
// rewrite on resume, the run marker and config.yaml of a first start, the summary at the end.
// Each faulted attempt must really die there (the fault point is reached), the next attempt
// resumes, and the run ends as the reference.
TEST_F(ReliabilityTest, KillNineInsideFileWritesThenResumeMatches) {
  const std::string reference = Reference();
  const std::vector<std::vector<std::string>> scenarios = {
      {"write:checkpoints/step_:2", "write:metrics.jsonl.tmp:1", "rename:metrics.jsonl.tmp:1"},
      {"rename:.pt.tmp:3", "write:metrics.jsonl:9", "rename:summary.json.tmp:1"},
      {"write:.distill_run.tmp:1"},
      {"rename:config.yaml.tmp:1"},
  };
  int index = 0;
  for (const auto& kills : scenarios) {
    const std::string dir = work_ + "/faults" + std::to_string(index++);
    for (const auto& kill_at : kills) {
      const Outcome o =
          Distill(dir, {"LD_PRELOAD=" DISTILL_FAULT_SHIM, "DISTILL_FAULT_KILL=" + kill_at});
      ASSERT_EQ(o.signal, SIGKILL) << kill_at << ": the fault point was not reached; " << o;
    }
    const Outcome o = Distill(dir);
    ASSERT_EQ(o.exit_status, 0) << dir << " after kills at " << kills.back() << ": " << o;
    ExpectSameFinish(dir, reference);
  }
}

// A disk that fills up (ENOSPC, from the shim) at different points -- config.yaml at the first
// start, a metrics record, a checkpoint, late in the run -- and a file-size limit (ulimit -f:
// EFBIG, and SIGXFSZ unless ignored): each is one line naming the file and the cause, exit 1,
// no crash and no temporary left; once there is space the same command finishes as the
// reference.
TEST_F(ReliabilityTest, FullDiskAndFileSizeLimitAreClearErrorsThenTheRunResumes) {
  const std::string reference = Reference();
  const std::string dir = work_ + "/full";
  // Bytes the run may write in each attempt: the marker but not config.yaml; a few metrics
  // records; the first checkpoints (~60 KB each) but not a later one.
  for (const long long budget : {200LL, 3000LL, 150000LL, 400000LL}) {
    const Outcome o = Distill(dir, {"LD_PRELOAD=" DISTILL_FAULT_SHIM,
                                    "DISTILL_FAULT_FULL=" + std::to_string(budget) + ":" + dir});
    ASSERT_EQ(o.exit_status, 1) << "budget " << budget << ": " << o;
    const std::string last = o.err.substr(o.err.rfind('\n', o.err.size() - 2) + 1);
    ExpectContains(
        last, {"distill_trainer: cannot ", dir, "No space left on device", "the disk is full"});
    for (const char* crash : {"terminate", "Aborted", "c10::Error", "Exception raised"}) {
      EXPECT_EQ(o.err.find(crash), std::string::npos) << o;
    }
    ExpectNoDebris(dir);
  }
  // ulimit -f 64 (64 KiB): checkpoints are larger.
  const Outcome limited =
      Spawn({"/bin/sh", "-c", "ulimit -f 64 && exec \"$0\" \"$@\"", DISTILL_TRAINER_BIN, "--config",
             student_yaml_, "train.out_dir=" + dir},
            work_);
  ASSERT_EQ(limited.exit_status, 1)
      << "a file-size limit must not kill the trainer (SIGXFSZ); " << limited;
  ExpectContains(limited.err, {"File too large", "ulimit -f"});
  ExpectNoDebris(dir);
  const Outcome o = Distill(dir);
  ASSERT_EQ(o.exit_status, 0) << o;
  ExpectSameFinish(dir, reference);
}

// Corrupt and foreign checkpoints through the command line: a flipped byte in the newest is
// named, the previous one is used, and the run still ends exactly as the reference; a foreign
// newest or no intact one is refused with a clear line.
TEST_F(ReliabilityTest, CorruptAndForeignCheckpointsThroughTheCommandLine) {
  const std::string reference = Reference();
  // A finished run (a copy of the reference) whose newest checkpoint got a flipped bit: the
  // same command resumes from the previous one and redoes the last steps.
  const std::string dir = work_ + "/corrupt";
  fs::copy(reference, dir, fs::copy_options::recursive);
  const std::string step20 = CheckpointPath(dir, 20), step24 = CheckpointPath(dir, kSteps);
  std::string bytes = ReadBytes(step24);
  bytes[bytes.size() / 3] ^= 0x10;
  WriteBytes(step24, bytes);
  const Outcome resumed = Distill(dir);
  ASSERT_EQ(resumed.exit_status, 0) << resumed;
  ExpectContains(resumed.err, {step24 + ": checksum mismatch", step20, "resuming at step 20"});
  ExpectSameFinish(dir, reference);
  // --quiet prints no progress, but the warning still (it was silent before).
  WriteBytes(step24, bytes);
  const Outcome quiet = Distill(dir, {}, 0, {"--quiet"});
  ASSERT_EQ(quiet.exit_status, 0) << quiet;
  ExpectContains(quiet.err, {step24 + ": checksum mismatch",
                             "resuming from the previous checkpoint, " + step20});
  EXPECT_EQ(quiet.err.find("resuming at step"), std::string::npos) << quiet;
  ExpectSameFinish(dir, reference);

  // Another run's checkpoint (another seed) as the newest one: refused, nothing trained.
  const std::string other = work_ + "/other";
  ASSERT_EQ(Distill(other, {}, 0, {"train.steps=4", "train.seed=7"}).exit_status, 0);
  fs::copy_file(CheckpointPath(other, 4), CheckpointPath(dir, 30));
  const Outcome foreign = Distill(dir);
  EXPECT_EQ(foreign.exit_status, 1) << foreign;
  ExpectContains(foreign.err, {CheckpointPath(dir, 30) + " is a checkpoint of another run",
                               "either the run's config.yaml was edited"});
  // No intact checkpoint at all: every file named.
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints")) {
    WriteBytes(e.path().string(), "not a checkpoint");
  }
  const Outcome none = Distill(dir);
  EXPECT_EQ(none.exit_status, 1) << none;
  ExpectContains(none.err, {CheckpointPath(dir, 24), CheckpointPath(dir, 30),
                            "not a distill_trainer checkpoint"});
  for (const auto* o : {&foreign, &none}) {
    EXPECT_EQ(o->err.find("terminate"), std::string::npos) << *o;
  }
}

// A checkpoint the disk cannot deliver (every read() of it fails with EIO, from the shim) is not
// damaged: one line naming it and the cause, exit status 1, no older checkpoint used instead and
// the file untouched; once it reads again the same command carries on as before.
TEST_F(ReliabilityTest, ACheckpointWithReadErrorsIsNotCalledDamaged) {
  const std::string reference = Reference();
  const std::string dir = work_ + "/read_errors";
  fs::copy(reference, dir, fs::copy_options::recursive);
  const std::string newest = CheckpointPath(dir, kSteps);
  const std::string bytes = ReadBytes(newest);
  const Outcome o = Distill(dir, {"LD_PRELOAD=" DISTILL_FAULT_SHIM,
                                  "DISTILL_FAULT_EIO=" + fs::path(newest).filename().string()});
  ASSERT_EQ(o.exit_status, 1) << o;
  ExpectContains(o.err, {newest + ": cannot be read: Input/output error",
                         "not a damaged checkpoint: it may be intact"});
  for (const char* wrong : {"checksum", "corrupt", "resuming", "previous checkpoint"}) {
    EXPECT_EQ(o.err.find(wrong), std::string::npos) << wrong << ": " << o;
  }
  EXPECT_EQ(ReadBytes(newest), bytes);
  const Outcome again = Distill(dir);
  ASSERT_EQ(again.exit_status, 0) << again;
  ExpectSameFinish(dir, reference);
}

// NaN injected through a teacher whose weights overflow (finite, so the checkpoint is
// accepted; its forward gives inf, the softmax NaN): stop ends at step 1 with the term named
// and no checkpoint written; skip gives up after train.max_skipped_steps, or at the end when it
// skipped every step.
TEST_F(ReliabilityTest, NonFiniteTeacherStopsTheRunThroughTheCommandLine) {
  const Config config = LoadConfigFile(student_yaml_);
  Model teacher = MakeModel(config.teacher);
  {
    torch::NoGradGuard no_grad;
    teacher->parameters()[0].fill_(3e38);  // the token embedding
  }
  auto optimizer = MakeOptimizer(config.optim, *teacher);
  const std::string bad_teacher = work_ + "/bad_teacher.pt";
  SaveCheckpoint(bad_teacher, *teacher, *optimizer, {}, at::Device(at::kCPU));
  const std::string dir = work_ + "/nan";
  const Outcome stop = Distill(dir, {}, 0, {"teacher.checkpoint=" + bad_teacher});
  EXPECT_EQ(stop.exit_status, 1) << stop;
  ExpectContains(stop.err, {"step 1: ", "is nan", "distill.temperature"});
  EXPECT_FALSE(LatestCheckpoint(dir).has_value()) << "a checkpoint was written after NaN";
  const Outcome skip = Distill(
      work_ + "/nan_skip", {}, 0,
      {"teacher.checkpoint=" + bad_teacher, "train.nonfinite=skip", "train.max_skipped_steps=2"});
  EXPECT_EQ(skip.exit_status, 1) << skip;
  ExpectContains(skip.err, {"step 3: ", "more than train.max_skipped_steps (2)"});
  // Under the limit, a run whose every step was skipped still ends as an error.
  const Outcome all_skipped = Distill(work_ + "/nan_all", {}, 0,
                                      {"teacher.checkpoint=" + bad_teacher, "train.nonfinite=skip",
                                       "train.max_skipped_steps=1000000"});
  EXPECT_EQ(all_skipped.exit_status, 1) << all_skipped;
  ExpectContains(all_skipped.err,
                 {"steps of this run were skipped as non-finite", "the student was never updated"});
  // Its checkpoints hold the student it started with: exporting one says so (and exports it).
  const Outcome exported = Train({"export", work_ + "/nan_all", work_ + "/nan_all_hf"});
  EXPECT_EQ(exported.exit_status, 0) << exported;
  ExpectContains(exported.err, {"warning: export: " + CheckpointPath(work_ + "/nan_all", kSteps),
                                "all 24 steps before this checkpoint were skipped as non-finite",
                                "its weights were never updated"});
  // A normal run's export says nothing of the kind.
  const Outcome normal = Train({"export", Reference(), work_ + "/reference_hf"});
  EXPECT_EQ(normal.exit_status, 0) << normal;
  EXPECT_TRUE(fs::exists(work_ + "/reference_hf/model.safetensors"));
  EXPECT_EQ(normal.err.find("never updated"), std::string::npos) << normal;
}

// Hostile configs (values, files, sizes): each is one line on stderr, exit 2 (config) or 1,
// no crash, no run directory, within seconds.
TEST_F(ReliabilityTest, HostileConfigsAreOneLineErrors) {
  const std::string dir = work_ + "/hostile";
  const std::string nested = work_ + "/nested.yaml", two_docs = work_ + "/two_docs.yaml",
                    binary = work_ + "/binary.yaml", laughs = work_ + "/laughs.yaml";
  WriteBytes(nested, "student: " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  WriteBytes(two_docs, "train: {steps: 3}\n---\ntrain: {steps: 4}\n");
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage += static_cast<char>((i * 7919) % 256);
  WriteBytes(binary, garbage);
  // Aliases that expand to 10^8 nodes if walked naively.
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    std::string prev(1, static_cast<char>(c - 1));
    bomb += std::string(1, c) + ": &" + c + " [*" + prev;
    for (int i = 0; i < 9; ++i) bomb += ", *" + prev;
    bomb += "]\n";
  }
  WriteBytes(laughs, bomb + "student: *i\n");
  const std::vector<std::vector<std::string>> cases = {
      {"student.mlp_ratio=1e300"},
      {"student.pad_vocab_to_multiple_of=9223372036854775807"},
      {"train.grad_accum=1e18"},
      {"data.batch_size=-1"},
      {"student.n_layer=1.5"},
      {"optim.lr=nan"},
      {"optim.eps=1e-300"},
      {"distill.temperature=1e-40"},
      {"student=3"},
      {"train.stpes=3"},
      {"data.source=text", "data.path=/dev/zero", "student.vocab_size=256",
       "teacher.vocab_size=256"},
      {"data.batch_size=1048576", "data.seq_len=65536", "student.context_length=65536",
       "teacher.context_length=65536"},
      {"--config", work_},
      {"--config", nested},
      {"--config", two_docs},
      {"--config", binary},
      {"--config", laughs},
  };
  for (const auto& overrides : cases) {
    std::vector<std::string> args = {"--quiet", "train.out_dir=" + dir};
    if (overrides[0] != "--config") args.insert(args.begin(), {"--config", student_yaml_});
    args.insert(args.end(), overrides.begin(), overrides.end());
    std::string name;
    for (const auto& a : overrides) name += a + " ";
    args.insert(args.begin(), DISTILL_TRAINER_BIN);
    const Outcome o = Spawn(args, work_, {}, 0, 60);
    EXPECT_TRUE(o.exit_status == 1 || o.exit_status == 2) << name << o;
    EXPECT_EQ(o.err.rfind("distill_trainer: ", 0), 0u) << name << o;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << name << o;
    EXPECT_FALSE(fs::exists(dir)) << name << "created the run directory";
    RemoveTree(dir);
  }
}

}  // namespace
}  // namespace distill

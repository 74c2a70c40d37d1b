#include "distill/run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>
#include <ostream>

#include <fmt/format.h>
#include <lossfns/version.h>
#include <torch/cuda.h>
#include <torch/headeronly/version.h>

#include "distill/memory_estimate.h"
#include "distill/run_dir.h"
#include "distill/trainer.h"

namespace distill {
namespace fs = std::filesystem;

namespace {

std::string Subdir(const Config& config, const char* name) {
  return (fs::path(config.train.out_dir) / name).string();
}

// The single-run layout's baseline directory, <out_dir>-baseline, beside the run: named after
// the directory's own name ("." and "runs/x/." name the directory they stand for, whose
// "-baseline" was a hidden ".-baseline" inside the run).
std::string BaselineDir(const std::string& out_dir) {
  fs::path p = fs::path(out_dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "runs/x/" (lexically_normal of "runs/x/.")
  if (p.empty() || p.filename() == "." || p.filename() == "..") {
    p = fs::absolute(p).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();
  }
  return p.string() + "-baseline";
}

// The row name of a distilled student: with kd_weight 0 it is the cross-entropy-only control.
std::string StudentName(const Config& config) {
  return config.distill.kd_weight == 0 ? "student (ce only)" : "student (distilled)";
}

// `command`: the config the command gave, where `config` is one of its stages (a pipeline's,
// or the baseline after a distillation).
// `stage`: which of its stages ("teacher", "student", "baseline"); empty for the command's own run.
ResultRow TrainOne(const Config& config, const std::string& name, const RunFlags& flags,
                   const Config& command, const std::string& stage,
                   std::function<void()> before_commit = {}) {
  Trainer trainer(config, RunOptions{flags.fresh,
                                     flags.quiet,
                                     flags.distributed,
                                     {flags.profile_steps, flags.profile_skip},
                                     std::move(before_commit),
                                     &command,
                                     stage});
  const EvalResult result = trainer.Train();
  return {name,
          config.train.out_dir,
          trainer.student().num_parameters(),
          result.val_loss,
          trainer.data().EntropyFloor().value_or(NAN),
          trainer.step(),
          trainer.skipped_steps()};
}

// Prints the memory estimate (rank 0, unless quiet) and refuses a config that cannot fit on
// this rank's device, before any directory or tensor exists (memory_estimate.h).
void CheckMemoryAtStart(const Config& config, const RunFlags& flags, const Distributed& dist) {
  const at::Device device = dist.active() ? dist.device() : ResolveDevice(config.train.device);
  const MemoryEstimate estimate = EstimateMemory(config, device.type(), dist.world_size());
  const AvailableMemory available = DeviceMemory(device);
  if (!flags.quiet && dist.is_main()) {
    std::fprintf(stderr, "%s\n", FormatEstimate(estimate, device, available).c_str());
  }
  if (flags.memory_check) CheckMemoryFits(estimate, device, available);
}

}  // namespace

bool IsPipeline(const Config& config) {
  return config.train.mode == Mode::kDistill && config.teacher.checkpoint.empty() &&
         config.teacher.pretrain_steps > 0;
}

// A stage that pretrains (the teacher, the baseline) trains on hard labels by design: the distill
// keys the user gave are the student stage's, not set for it (no UnusedDistillKeysWarning).
void ForgetGivenDistillKeys(Config& c) {
  for (auto it = c.given_at.begin(); it != c.given_at.end();) {
    it = it->first.rfind("distill.", 0) == 0 ? c.given_at.erase(it) : std::next(it);
  }
}

Config TeacherStageConfig(const Config& config) {
  Config c = config;
  SetArchitecture(c.student, config.teacher);
  c.student.init_from_teacher = false;
  c.teacher = TeacherConfig();
  c.train.mode = Mode::kPretrain;
  c.train.steps = config.teacher.pretrain_steps;
  c.train.baseline = false;
  c.distill.fused_linear = FusedLinear::kOff;  // a distillation loss; pretraining has none
  c.train.out_dir = Subdir(config, "teacher");
  ForgetGivenDistillKeys(c);
  return c;
}

Config StudentStageConfig(const Config& config) {
  Config c = config;
  c.teacher.checkpoint = Subdir(config, "teacher");
  c.teacher.pretrain_steps = 0;
  // teacher.dropout was the teacher stage's, which trained with it (no
  // UnusedTeacherDropoutWarning for the teacher this stage loads).
  c.given_at.erase("teacher.dropout");
  c.train.baseline = false;
  c.train.out_dir = Subdir(config, "student");
  return c;
}

Config BaselineStageConfig(const Config& config) {
  Config c = config;
  c.student.init_from_teacher = false;
  c.teacher = TeacherConfig();
  // A Hugging Face teacher's tokenizer made the baseline's tokens: its export takes config.json's
  // other keys and the tokenizer files from the teacher's directory, as the distilled student's
  // does (the stored config.yaml keeps it for a later `distill_trainer export`).
  if (c.train.export_from.empty()) c.train.export_from = config.teacher.hf_dir;
  c.train.mode = Mode::kPretrain;
  c.train.baseline = false;
  c.train.out_dir = Subdir(config, "baseline");
  c.distill.fused_linear = FusedLinear::kOff;  // a distillation loss; pretraining has none
  ForgetGivenDistillKeys(c);
  return c;
}

std::string FormatTable(const std::vector<ResultRow>& rows) {
  std::string out = fmt::format("{:<26} {:>10} {:>9} {:>9} {:>9}  {}\n", "model", "parameters",
                                "val_loss", "floor", "excess", "run");
  // "nan" whatever its sign bit (a diverged run's -nan), as the log lines print it.
  const auto number = [](double v, bool sign) {
    if (std::isnan(v)) return std::string("nan");
    return sign ? fmt::format("{:+.4f}", v) : fmt::format("{:.4f}", v);
  };
  for (const auto& r : rows) {
    const bool known = std::isfinite(r.entropy_floor);
    out += fmt::format("{:<26} {:>10} {:>9} {:>9} {:>9}  {}\n", r.name, r.parameters,
                       number(r.val_loss, false), known ? number(r.entropy_floor, false) : "n/a",
                       known ? number(r.val_loss - r.entropy_floor, true) : "n/a", r.run_dir);
  }
  for (const auto& r : rows) {
    if (r.skipped_steps > 0) {
      out += fmt::format("{}: {} of {} steps skipped as non-finite (train.nonfinite=skip)\n",
                         r.name, r.skipped_steps, r.steps);
    }
  }
  return out;
}

std::string VersionText() {
#ifdef DISTILL_WITH_CUDA
  const char* kernels = "CUDA and CPU kernels";
#else
  const char* kernels = "CPU kernels only (a build without CUDA)";
#endif
  const size_t devices = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  return fmt::format("distill_trainer {} ({}; liblossfns {} loaded; LibTorch {}); CUDA devices: {}",
                     LOSSFNS_VERSION, kernels, lossfns::version(), TORCH_VERSION, devices);
}

std::vector<ResultRow> Run(const Config& config, const RunFlags& flags, std::ostream& out) {
  Distributed single;  // the no-op group, when not data-parallel
  Distributed& dist = flags.distributed ? *flags.distributed : single;
  // Each rank's own device: refused on every rank where it does not fit on one.
  dist.EveryRankOrThrow([&] { CheckMemoryAtStart(config, flags, dist); });
  std::vector<ResultRow> rows;
  RunDirPlan plan;  // a pipeline's directory: its lock is held until results.txt is written
  if (!IsPipeline(config)) {
    const bool distill = config.train.mode == Mode::kDistill;
    std::optional<Config> baseline;
    if (distill && config.train.baseline) {
      // The single-run layout keeps the baseline beside the run: <out_dir>-baseline. Its
      // directory is checked now, before the distillation trains (and again when the baseline
      // starts): one that would refuse the baseline is reported before hours of training, not
      // after them.
      baseline = BaselineStageConfig(config);
      baseline->train.out_dir = BaselineDir(config.train.out_dir);
      dist.MainDecides([&] {
        try {
          PlanRunDir(*baseline, flags.fresh);
        } catch (const RunDirError& e) {
          // (--fresh deletes the baseline's directory only when the trainer made it, and the
          // distillation's with it: said where it was not passed.)
          throw RunDirError(fmt::format(
              "{} (nothing was trained: this is the directory of the hard-label baseline that "
              "train.baseline: true trains after the distillation, train.out_dir + \"-baseline\"; "
              "{}train.baseline=false leaves the baseline out)",
              e.what(),
              flags.fresh ? ""
                          : fmt::format("--fresh would start the distillation in {} over as "
                                        "well, and ",
                                        config.train.out_dir)));
        }
        return true;
      });
    }
    rows.push_back(
        TrainOne(config, distill ? StudentName(config) : "model (pretrained)", flags, config, ""));
    if (baseline) {
      rows.push_back(TrainOne(*baseline, "student (hard labels)", flags, config, "baseline"));
    }
  } else {
    // The pipeline's own directory holds its config; --fresh clears all stages at once. Checked
    // now, written (and with --fresh deleted) only when the first stage has built its models and
    // data, just before that stage writes its own directory: a first stage that fails at
    // start-up (a typo in data.path) leaves the previous run as it was. The first stage plans
    // with --fresh too, so that it does not refuse the old stage directory the commit deletes.
    dist.MainDecides([&] {
      plan = PlanRunDir(config, flags.fresh);
      // A damaged config.yaml of this pipeline (written again at the first stage's commit).
      if (!plan.config_note.empty()) std::fprintf(stderr, "%s\n", plan.config_note.c_str());
      return plan.same_run;
    });
    RunFlags stage_flags = flags;
    stage_flags.fresh = false;
    RunFlags first_flags = flags;
    first_flags.fresh = plan.delete_first;
    try {
      rows.push_back(TrainOne(TeacherStageConfig(config), "teacher", first_flags, config, "teacher",
                              [&] { CommitRunDir(config, plan); }));
      rows.push_back(TrainOne(StudentStageConfig(config), StudentName(config), stage_flags, config,
                              "student"));
      if (config.train.baseline) {
        rows.push_back(TrainOne(BaselineStageConfig(config), "student (hard labels)", stage_flags,
                                config, "baseline"));
      }
    } catch (...) {
      // A first stage that failed at start-up created no stage directory: undo the pipeline
      // directory's commit too when it holds only our marker and config.yaml, so the corrected
      // command is not refused as a different run (the directory itself only where this process
      // created it: an empty directory a user made stays). Only a directory this process holds:
      // a commit refused because another process holds it must not delete that process's
      // directory. A failure of that clean-up is a warning; the start's own error is the one
      // reported.
      if (dist.is_main() && plan.lock != nullptr && plan.lock->Current()) {
        try {
          UndoFailedStart(config.train.out_dir, plan);
        } catch (const std::exception& e) {
          fmt::print(stderr, "warning: {} (after the failed start below)\n", e.what());
        }
      }
      throw;
    }
  }
  if (!dist.is_main()) return rows;
  const std::string table = FormatTable(rows);
  if (IsPipeline(config)) {
    // Stages asked for fewer steps than they had trained were not shortened (Trainer): the
    // pipeline's config.yaml keeps their steps too, as a single run's does.
    int64_t steps = config.train.steps;
    for (size_t i = 1; i < rows.size(); ++i) steps = std::max(steps, rows[i].steps);
    if (steps != config.train.steps) {
      Config kept = config;
      kept.train.steps = steps;
      WriteFileAtomically((fs::path(config.train.out_dir) / "config.yaml").string(),
                          ConfigToYaml(kept));
    }
    WriteFileAtomically((fs::path(config.train.out_dir) / "results.txt").string(), table);
  }
  out << table;
  return rows;
}

}  // namespace distill

#include "distill/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <set>

#include "distill/autocast.h"
#include "distill/hf_export.h"
#include "distill/loss.h"
#include "distill/memory_estimate.h"
#include "distill/profile.h"
#include "distill/run_dir.h"
#include "distill/safetensors.h"
#include "distill/signals.h"

namespace distill {
namespace fs = std::filesystem;

namespace {

// A number for the log lines: "nan" whatever its sign bit (a diverged run's -nan), fixed-point
// with `digits` decimals below 1e6, else in exponent form (the perplexity e^700 is not printed
// as its 300 digits).
std::string LogNumber(double v, int digits) {
  if (std::isnan(v)) return "nan";
  if (std::isfinite(v) && std::fabs(v) >= 1e6) return fmt::format("{:.4g}", v);
  return fmt::format("{:.{}f}", v, digits);
}

// A resume on data files other than those its checkpoint was trained on (DataSource::Files(): a
// shard added to or gone from the glob, or rewritten: another size, or another fingerprint at
// the same size): what changed, as a warning. A checkpoint written before the files were kept
// ("") says nothing; one written before the fingerprints compares the sizes alone.
std::optional<std::string> DataFilesChanged(const std::string& before, const std::string& now,
                                            int64_t step, bool finished, const DataConfig& data) {
  if (before.empty() || before == now) return std::nullopt;
  // "<role> <path>" -> size
  auto parse = [](const std::string& text) {
    std::map<std::string, std::string> files;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const size_t last = line.rfind(' ');
      if (last != std::string::npos) files[line.substr(0, last)] = line.substr(last + 1);
    }
    return files;
  };
  const auto old_files = parse(before), new_files = parse(now);
  std::vector<std::string> added, gone, resized, rewritten;
  bool train = false, val = false;
  auto note = [&](const std::string& key) {
    (key.rfind("train ", 0) == 0 ? train : val) = true;
    return key;
  };
  for (const auto& [key, size] : new_files) {
    const auto it = old_files.find(key);
    if (it == old_files.end()) {
      added.push_back(note(key));
    } else if (it->second != size) {
      // "<size>:<fingerprint>", or "<size>" alone in a checkpoint written before fingerprints.
      const auto size_of = [](const std::string& value) {
        return value.substr(0, value.find(':'));
      };
      const std::string was = size_of(it->second), is = size_of(size);
      if (was != is) {
        resized.push_back(fmt::format("{} ({} -> {})", note(key), was, is));
      } else if (it->second.find(':') != std::string::npos) {
        rewritten.push_back(note(key));
      }
    }
  }
  for (const auto& [key, size] : old_files) {
    if (!new_files.count(key)) gone.push_back(note(key));
  }
  auto list = [](const std::vector<std::string>& items) {
    const size_t shown = std::min<size_t>(items.size(), 3);
    std::string text = fmt::format(
        "{}", fmt::join(std::vector<std::string>(items.begin(), items.begin() + shown), ", "));
    if (items.size() > shown) text += fmt::format(" and {} more", items.size() - shown);
    return text;
  };
  std::vector<std::string> parts;
  if (!added.empty()) parts.push_back("new " + list(added));
  if (!gone.empty()) parts.push_back("gone " + list(gone));
  if (!resized.empty()) parts.push_back("resized " + list(resized));
  if (!rewritten.empty()) parts.push_back("rewritten at the same size " + list(rewritten));
  if (parts.empty()) return std::nullopt;  // only fingerprints added to an older checkpoint's
  // A finished run only evaluates again: the training files do not matter there.
  const bool validation_moved = val || (train && data.val_path.empty());
  if (finished) {
    if (!validation_moved) return std::nullopt;
    return fmt::format(
        "warning: the data files are not those the run was trained on ({}): its evaluation "
        "reads the new validation windows, so val_loss is not comparable with the run's",
        fmt::join(parts, "; "));
  }
  std::string warning = fmt::format(
      "warning: the data files are not those the checkpoint of step {} was trained on ({}): "
      "training goes on with them, so the batches from here on are not those the run would "
      "have drawn",
      step, fmt::join(parts, "; "));
  if (train && data.val_path.empty()) {
    warning += fmt::format(
        ", and the validation windows (the last {:g}% of the training files) moved: val_loss is "
        "not comparable with the steps before",
        100 * data.val_fraction);
  } else if (val) {
    warning +=
        ", and the validation files changed: val_loss is not comparable with the steps "
        "before";
  }
  return warning;
}

// A resume whose teacher's weights are not those its checkpoint was trained with (a teacher
// whose files were rewritten, or a teacher run that trained on since): a warning. A checkpoint
// written before the teacher's weights were kept ("") says nothing.
std::optional<std::string> TeacherChanged(const Config& config, const TrainingPosition& position,
                                          const std::string& teacher_weights) {
  if (position.teacher_weights.empty() || teacher_weights.empty() ||
      position.teacher_weights == teacher_weights) {
    return std::nullopt;
  }
  const bool checkpoint = !config.teacher.checkpoint.empty();
  const std::string source =
      fmt::format("{} {}", checkpoint ? "teacher.checkpoint" : "teacher.hf_dir",
                  checkpoint ? config.teacher.checkpoint : config.teacher.hf_dir);
  if (position.step >= config.train.steps) {
    return fmt::format(
        "warning: the teacher ({}) is not the one the run was trained with: its weights differ "
        "(files rewritten, or a teacher run that trained on since); its evaluation's "
        "teacher_val_loss and val_kd are this teacher's, not comparable with the run's",
        source);
  }
  return fmt::format(
      "warning: the teacher ({}) is not the one the checkpoint of step {} was trained with: its "
      "weights differ (files rewritten, or a teacher run that trained on since); distillation "
      "goes on with this teacher, so the student's targets change from here on (restore the "
      "old teacher to keep them, or pass --fresh to start over with this one)",
      source, position.step);
}

// Host tensors go to CUDA through pinned memory, asynchronously: a copy from pageable memory
// waits for every kernel already queued, so the GPU would idle while the CPU queues the next.
at::Tensor ToDevice(const at::Tensor& t, const at::Device& device) {
  if (!device.is_cuda() || t.device() == device) return t.to(device);
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Data-parallel: cuda:LOCAL_RANK, whatever "auto" / "cuda" would pick; otherwise train.device.
at::Device TrainingDevice(const Config& config, const Distributed& dist) {
  if (!dist.active()) return ResolveDevice(config.train.device);
  if (config.train.device == "cpu") {
    throw std::runtime_error(fmt::format(
        "train.device: \"cpu\" cannot train data-parallel (WORLD_SIZE={}): NCCL needs CUDA; "
        "use auto or cuda, or run without torchrun",
        dist.world_size()));
  }
  return dist.device();
}

// The token columns that are real: distill.vocab_size when set, else the student's vocabulary
// (the teacher's is the same then; the columns padding added are not real).
int64_t RealVocabSize(const Config& config) {
  return config.distill.vocab_size > 0 ? config.distill.vocab_size : config.student.vocab_size;
}

// train.cuda_graph: whether this run replays its micro-batches from a CUDA graph. auto: on CUDA
// in one process, not under --profile-steps (whose phase timers need the eager launches); true:
// the same, an error data-parallel (config parsing refuses it on the CPU; train.device auto
// without a GPU resolves to the CPU and is refused here).
bool UsesCudaGraph(CudaGraph setting, bool cuda, bool data_parallel, bool profiling, bool dropout,
                   std::vector<std::string>& warnings) {
  if (setting == CudaGraph::kOff) return false;
  if (setting == CudaGraph::kOn && (!cuda || data_parallel)) {
    throw ConfigError(fmt::format(
        "train.cuda_graph: expected auto or false {}, got true (CUDA graphs are used by one "
        "CUDA process only)",
        !cuda ? "on the CPU (train.device resolved to cpu)" : "when training data-parallel"));
  }
#if !DISTILL_WITH_CUDA
  if (setting == CudaGraph::kOn && cuda) {
    throw ConfigError(
        "train.cuda_graph: expected auto or false, got true: this distill_trainer was built "
        "without CUDA kernels (configure with a CUDA toolkit, docs/trainer.md)");
  }
  (void)profiling;
  (void)dropout;
  (void)warnings;
  return false;
#else
  if (!cuda || data_parallel) return false;
  if (profiling) {
    warnings.push_back(
        "train.cuda_graph: off under --profile-steps (the phase timers time eager launches)");
    return false;
  }
  // ATen's CUDAGraph advances the default generator per replay, so a replayed at::dropout draws
  // new masks (StepGraph.DropoutMasksDifferFromReplayToReplay, passed on an H200); the attention
  // dropout inside scaled_dot_product_attention's fused kernels has its own random state and is
  // not tested under capture yet, so auto leaves stochastic students eager and true is the
  // user's call.
  if (dropout && setting == CudaGraph::kAuto) {
    warnings.push_back(
        "train.cuda_graph: auto is off with student.dropout > 0 (set train.cuda_graph: true to "
        "replay dropout from a CUDA graph)");
    return false;
  }
  return true;
#endif
}

// Zeroes the defined gradients in place, in one multi-tensor launch per dtype and device.
void ZeroGradients(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (!grads.empty()) at::_foreach_zero_(grads);
}

// An evaluation that reads more sequences than the validation data holds counts some twice:
// said once at the start, with the setting that reads each at most once.
std::optional<std::string> RepeatedValidationWarning(const Config& config, const DataSource& data) {
  const std::optional<int64_t> distinct = data.ValidationSequences();
  const int64_t batch = config.data.batch_size;
  const int64_t read = config.train.eval_batches * batch;
  if (!distinct || read <= *distinct) return std::nullopt;
  const std::string fix =
      *distinct >= batch
          ? fmt::format("train.eval_batches {} reads each at most once", *distinct / batch)
          : fmt::format(
                "the validation data is smaller than one batch of data.batch_size: "
                "more validation tokens (data.val_fraction or data.val_path) avoid it");
  return fmt::format(
      "warning: an evaluation reads train.eval_batches x data.batch_size = {} x {} = {} "
      "sequences of data.seq_len {} tokens, but the validation data holds {} distinct ones: some "
      "are counted more than once; {}",
      config.train.eval_batches, batch, read, config.data.seq_len, *distinct, fix);
}

// A warmup that leaves the schedule unfinished (a shortened trial, train.steps=10, of a config
// with warmup_steps 20): said once at the start, with the learning rate of the last step. A decay
// ends at lr * min_lr_ratio on the last step when warmup_steps <= steps - 2 (LearningRate: the
// step after the warmup is the decay's first, at the peak); a constant schedule reaches its peak
// when warmup_steps <= steps.
std::optional<std::string> UnfinishedScheduleWarning(const Config& config) {
  const ScheduleConfig& s = config.schedule;
  const int64_t steps = config.train.steps;
  // A one-step run has no decay to finish: like a constant schedule, its peak is enough.
  const bool decays = s.kind != ScheduleKind::kConstant && s.min_lr_ratio < 1.0 && steps >= 2;
  const int64_t longest = decays ? steps - 2 : steps;
  if (s.warmup_steps == 0 || s.warmup_steps <= longest) return std::nullopt;
  const std::string fix = longest <= 0 ? "schedule.warmup_steps 0 (no warmup) finishes it"
                                       : fmt::format("a warmup of at most {} step{} finishes it",
                                                     longest, longest == 1 ? "" : "s");
  return fmt::format(
      "warning: schedule.warmup_steps {} leaves the schedule unfinished in train.steps {}: the "
      "last step's learning rate is {:.4g} (optim.lr {:.4g}){}; {}",
      s.warmup_steps, steps, LearningRate(config, steps - 1), config.optim.lr,
      decays ? ", and the decay never reaches lr * schedule.min_lr_ratio" : "", fix);
}

// A teacher named in pretrain mode is not loaded: said once at the start, with the mode that
// uses it (a distill config switched to train.mode=pretrain keeps its teacher keys).
std::optional<std::string> UnusedTeacherWarning(const Config& config) {
  if (config.train.mode != Mode::kPretrain) return std::nullopt;
  const bool checkpoint = !config.teacher.checkpoint.empty();
  const std::string& value = checkpoint ? config.teacher.checkpoint : config.teacher.hf_dir;
  if (value.empty() && config.teacher.pretrain_steps > 0) {  // the third source of a teacher
    return fmt::format(
        "warning: teacher.pretrain_steps is set ({}) but train.mode is pretrain, which trains on "
        "the hard labels alone: no teacher is pretrained (train.mode: distill pretrains one, then "
        "distills from it)",
        config.teacher.pretrain_steps);
  }
  if (value.empty()) return std::nullopt;
  return fmt::format(
      "warning: {} is set ({}) but train.mode is pretrain, which trains on the hard labels alone: "
      "the teacher is not loaded (train.mode: distill distills from it)",
      checkpoint ? "teacher.checkpoint" : "teacher.hf_dir", value);
}

// train.max_skipped_steps set (away from its default) where non-finite steps stop the run: said
// once at the start, with where it was set (it is not part of the run's identity: a run may switch
// train.nonfinite).
std::optional<std::string> UnusedSkipLimitWarning(const Config& config) {
  const auto it = config.given_at.find("train.max_skipped_steps");
  if (config.train.nonfinite != NonFinite::kStop || it == config.given_at.end() ||
      config.train.max_skipped_steps ==
          TrainConfig().max_skipped_steps) {  // UnusedDistillKeysWarning says why
    return std::nullopt;
  }
  return fmt::format(
      "warning: train.max_skipped_steps ({}) is set but train.nonfinite is stop, which stops the "
      "run at its first non-finite step: it is not used (train.nonfinite: skip uses it)",
      it->second);
}

// teacher.dropout set (above 0) for a teacher loaded from a checkpoint: a loaded teacher runs in
// eval mode, without dropout, so the key changes nothing; said once at the start, with where it was
// set. (Not for a Hugging Face teacher, whose dropout comes from its config.json unless set, and is
// as unused: a GPT-2 config.json has attn_pdrop 0.1. A pipeline's distillation stage gets a config
// without the user's key: StudentStageConfig in run.cpp.)
std::optional<std::string> UnusedTeacherDropoutWarning(const Config& config) {
  const auto it = config.given_at.find("teacher.dropout");
  if (config.train.mode != Mode::kDistill || config.teacher.pretrain_steps > 0 ||
      !config.teacher.hf_dir.empty() || config.teacher.dropout <= 0 ||
      it == config.given_at.end()) {
    return std::nullopt;
  }
  return fmt::format(
      "warning: teacher.dropout ({}) is {} but the teacher is loaded, not trained, and runs "
      "without "
      "dropout: it is not used (teacher.pretrain_steps > 0 pretrains a teacher with it; "
      "student.dropout is the student's)",
      it->second, config.teacher.dropout);
}

// The distillation loss's keys set (away from their defaults) in pretrain mode weigh nothing: said
// once at the start, with where each was set. (A pipeline's pretraining stages, the teacher and the
// baseline, get configs without the user's distill keys: ForgetGivenDistillKeys in run.cpp.)
std::optional<std::string> UnusedDistillKeysWarning(const Config& config) {
  if (config.train.mode != Mode::kPretrain) return std::nullopt;
  // Set away from its default: a run's stored config.yaml lists every key (continued with
  // --config <out_dir>/config.yaml), and a default there says nothing.
  const DistillConfig d = config.distill, defaults;
  const std::pair<const char*, bool> keys[] = {
      {"distill.divergence", d.divergence != defaults.divergence},
      {"distill.jsd_beta", d.jsd_beta != defaults.jsd_beta},
      {"distill.temperature", d.temperature != defaults.temperature},
      {"distill.kd_weight", d.kd_weight != defaults.kd_weight},
      {"distill.ce_weight", d.ce_weight != defaults.ce_weight}};
  std::vector<std::string> given;
  for (const auto& [key, changed] : keys) {
    if (const auto it = config.given_at.find(key); changed && it != config.given_at.end()) {
      given.push_back(fmt::format("{} ({})", key, it->second));
    }
  }
  if (given.empty()) return std::nullopt;
  return fmt::format(
      "warning: {} {} set but train.mode is pretrain, which trains on the hard labels alone "
      "(cross-entropy, weight 1): {} not used (train.mode: distill uses {})",
      fmt::join(given, ", "), given.size() == 1 ? "is" : "are",
      given.size() == 1 ? "it is" : "they are", given.size() == 1 ? "it" : "them");
}

}  // namespace

at::Device ResolveDevice(const std::string& device) {
  if (device == "cuda") {
    if (!torch::cuda::is_available()) {
      throw std::runtime_error(
          "train.device: \"cuda\" requested but no CUDA device is available; use auto or cpu");
    }
    return at::Device(at::kCUDA, 0);
  }
  if (device == "auto" && torch::cuda::is_available()) return at::Device(at::kCUDA, 0);
  return at::Device(at::kCPU);
}

double LearningRate(const Config& config, int64_t step) {
  const double peak = config.optim.lr;
  const ScheduleConfig& s = config.schedule;
  if (step < s.warmup_steps) return peak * static_cast<double>(step + 1) / s.warmup_steps;
  const int64_t decay_steps = std::max<int64_t>(1, config.train.steps - s.warmup_steps - 1);
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / decay_steps);
  const double floor = peak * s.min_lr_ratio;
  switch (s.kind) {
    case ScheduleKind::kCosine:
      return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
    case ScheduleKind::kLinear:
      return peak - (peak - floor) * progress;
    case ScheduleKind::kConstant:
      return peak;
  }
  return peak;
}

Model BuildModel(const ModelConfig& config, const std::string& checkpoint, const at::Device& device,
                 std::vector<std::string>* warnings) {
  Model model = MakeModel(config);
  if (!config.hf_dir.empty()) {
    const std::vector<std::string> ignorable = model->hf_ignorable_tensors();
    HfNaming naming;
    naming.rename = [&model](const std::string& name) {
      const std::optional<CausalLM::HfName> hf = model->hf_name(name);
      return hf ? std::optional<std::pair<std::string, bool>>({hf->name, hf->transpose})
                : std::nullopt;
    };
    naming.base_prefix = model->hf_base_prefix();
    naming.tied_copies = model->hf_tied_copies();
    LoadModuleFromHf(config.hf_dir, *model,
                     std::set<std::string>(ignorable.begin(), ignorable.end()), naming);
  }
  model->to(device);
  if (config.hf_dir.empty() && !checkpoint.empty()) {
    LoadWeights(checkpoint, *model, device, "teacher.checkpoint", warnings);
  }
  return model;
}

Trainer::Trainer(Config config, RunOptions options)
    : config_(std::move(config)),
      options_(options),
      single_(options.distributed ? nullptr : std::make_unique<Distributed>()),
      dist_(options.distributed ? options.distributed : single_.get()),
      device_(TrainingDevice(config_, *dist_)),
      distill_(config_.train.mode == Mode::kDistill) {
  // Fails early (on every rank) when the global batch cannot be split evenly.
  RankMicroBatches(0, config_.train.grad_accum, dist_->rank(), dist_->world_size());
  if (config_.train.precision == Precision::kBf16 && !device_.is_cuda()) {
    throw std::runtime_error(
        "train.precision: bf16 autocast needs CUDA but train.device resolved to cpu; use fp32");
  }
  // train.cuda_graph: decided (and true refused where it cannot be) before anything is written.
  std::vector<std::string> graph_warnings;
  const bool use_graph =
      UsesCudaGraph(config_.train.cuda_graph, device_.is_cuda(), dist_->active(),
                    options_.profile.steps > 0, config_.student.dropout > 0, graph_warnings);
  // Only rank 0 touches the run directory; the others learn whether it holds this run (and
  // wait until it is prepared, so that they can read its checkpoint). Nothing is written
  // before the data and models are built: a start that fails leaves the directory as it was.
  RunDirPlan plan;
  const bool same_run = dist_->MainDecides([&] {
    plan = PlanRunDir(config_, options_.fresh);
    return plan.same_run;
  });
  std::vector<std::string> warnings;  // printed once the run's log is open
  // What each rank builds and reads, before rank 0 writes anything: a failure on any rank (its
  // data, its teacher, its device's memory, its checkpoint) stops every rank here, so that the
  // commit below (a deletion with --fresh) never runs for a start that failed elsewhere.
  dist_->EveryRankOrThrow([&] {
    // Tokens must be real for every model: below distill.vocab_size when it is set.
    data_ = MakeDataSource(config_.data, RealVocabSize(config_), config_.distill.ignore_index);

    torch::manual_seed(static_cast<uint64_t>(config_.train.seed));
    if (auto warning = RepeatedValidationWarning(config_, *data_)) warnings.push_back(*warning);
    if (auto warning = UnusedTeacherWarning(config_)) warnings.push_back(*warning);
    if (auto warning = UnusedDistillKeysWarning(config_)) warnings.push_back(*warning);
    if (auto warning = UnusedSkipLimitWarning(config_)) warnings.push_back(*warning);
    if (auto warning = UnusedTeacherDropoutWarning(config_)) warnings.push_back(*warning);
    if (distill_) {
      teacher_ = BuildModel(config_.teacher, config_.teacher.checkpoint, device_, &warnings);
      teacher_weights_ = WeightsFingerprint(*teacher_);  // as loaded: before any cast below
      teacher_->eval();
      for (auto& p : teacher_->parameters()) p.set_requires_grad(false);
    }
    // The student's initialisation and dropout stream come from train.seed alone, not from whether
    // (or which) teacher was built before it: the hard-label baseline, a kd_weight 0 control and
    // students of different teachers start from the same weights.
    torch::manual_seed(static_cast<uint64_t>(config_.train.seed));
    student_ = BuildModel(config_.student, /*checkpoint=*/"", device_);
    student_->set_activation_checkpointing(config_.train.activation_checkpointing);
    if (config_.student.init_from_teacher && config_.student.hf_dir.empty()) {
      CopyWeights(*teacher_, *student_);
    }
    if (distill_ && config_.train.precision == Precision::kBf16 && device_.is_cuda()) {
      // The frozen teacher's matmul weights in bf16 once, instead of autocast re-casting each at
      // every micro-batch (it caches casts only of tensors that require grad): the same bits, half
      // their memory (docs/trainer.md, "CUDA").
      StoreMatmulWeightsAs(*teacher_, at::kBFloat16);
    }
    student_->train();

    optimizer_ = MakeOptimizer(config_.optim, *student_);
    // The run's checkpoint (read only) before the directory is written: a resume whose every
    // checkpoint is corrupt fails with the directory as it was.
    run_identities_ = AcceptedRunIdentityHashes(config_);
    if (same_run) {
      for (const std::string& stored : StoredRunIdentityHashes(config_.train.out_dir)) {
        if (std::find(run_identities_.begin(), run_identities_.end(), stored) ==
            run_identities_.end()) {
          run_identities_.push_back(stored);
        }
      }
      std::set<std::string> skipped;  // damaged or misnamed: never pruned by this process
      auto position = LoadLatestGoodCheckpoint(config_.train.out_dir, *student_, *optimizer_,
                                               device_, run_identities_, &warnings, &skipped);
      for (const std::string& name : skipped) checkpoint_is_ours_[name] = false;
      if (position) {
        position_ = *position;
        elapsed_ = position_.elapsed_s;
        checkpointed_step_ = position_.step;
        // Its run identity was checked as it loaded (and its name matches its step).
        checkpoint_is_ours_
            [fs::path(CheckpointPath(config_.train.out_dir, position_.step)).filename().string()] =
                true;
        if (position_.step > config_.train.steps) {
          // A run is not shortened after the fact: it stays at its step, and its config.yaml,
          // progress and summary say so (not the smaller train.steps asked for).
          warnings.push_back(fmt::format(
              "warning: {} is at step {}, past train.steps {}: a run is not shortened after the "
              "fact; nothing is trained, the run ends again at step {} and keeps train.steps {}. "
              "Raise train.steps to train on, or pass --fresh to train {} steps from the start",
              config_.train.out_dir, position_.step, config_.train.steps, position_.step,
              position_.step, config_.train.steps));
          config_.train.steps = position_.step;
        }
        if (auto warning = DataFilesChanged(position_.data_files, data_->Files(), position_.step,
                                            position_.step >= config_.train.steps, config_.data)) {
          warnings.push_back(*warning);
        }
        if (auto warning = TeacherChanged(config_, position_, teacher_weights_)) {
          warnings.push_back(*warning);
        }
      }
    }
    if (position_.step < config_.train.steps) {  // steps left to train
      if (auto warning = UnfinishedScheduleWarning(config_)) warnings.push_back(*warning);
    }
  });
  // Every rank resumes from the same place: a train.out_dir that is not one directory for all
  // (not on a shared filesystem) or a checkpoint one rank could not read would let the replicas
  // train on from different steps, silently.
  dist_->CheckSameOnEveryRank(
      {position_.step, position_.data_position, position_.skipped_steps, config_.train.steps},
      [&](const std::vector<int64_t>& own, const std::vector<int64_t>& main) {
        return fmt::format(
            "resumed at step {} (data position {}, {} steps skipped, train.steps {}) where rank 0 "
            "resumed at step {} (data position {}, {} skipped, train.steps {}): every rank must "
            "see the same train.out_dir, {} (one directory on a filesystem all ranks share), and "
            "read the same checkpoint",
            own[0], own[1], own[2], own[3], main[0], main[1], main[2], main[3],
            config_.train.out_dir);
      });
  dist_->MainDecides([&] {
    if (options_.before_commit) options_.before_commit();
    CommitRunDir(config_, plan);
    return true;
  });
  run_lock_ = plan.lock;  // held until this trainer is destroyed (rank 0; the others hold none)
  if (run_lock_ && !run_lock_->warning().empty()) warnings.push_back(run_lock_->warning());
  if (!plan.config_note.empty()) warnings.push_back(plan.config_note);
  // Every rank built the same weights from the same seed (or checkpoint); broadcasting rank 0's
  // makes that a guarantee rather than an assumption.
  dist_->BroadcastParameters(*student_);
  if (dist_->world_size() > 1) {  // one rank has nothing to sum
    reducer_ = std::make_unique<GradReducer>(student_->parameters(), config_.train.bucket_mb << 20,
                                             *dist_);
  }
  if (dist_->is_main()) {
    const fs::path metrics = fs::path(config_.train.out_dir) / "metrics.jsonl";
    std::error_code error;
    if (same_run && position_.step == 0 && fs::file_size(metrics, error) > 0 && !error) {
      // Steps were logged but no checkpoint is left (none written yet, or checkpoints/ removed).
      warnings.push_back(fmt::format(
          "warning: {} has no checkpoint to resume from (none was written yet, or checkpoints/ "
          "was removed): training again from step 0; metrics.jsonl's earlier records are "
          "dropped",
          config_.train.out_dir));
    }
    metrics_ = std::make_unique<MetricsLog>(metrics.string(), position_.step);
  }
  progress_ = std::make_unique<Progress>(config_.train.steps, position_.step, options_.quiet,
                                         !dist_->is_main());
  if (options_.profile.steps > 0) {
    profiler_ = std::make_unique<StepProfiler>(
        options_.profile, device_, (fs::path(config_.train.out_dir) / "profile").string(),
        dist_->rank(), dist_->active());
  }
  if (use_graph) graph_ = std::make_unique<StepGraph>(device_, student_->parameters());
  warnings.insert(warnings.end(), graph_warnings.begin(), graph_warnings.end());
  for (const auto& line : warnings) Warn(line);
  progress_->Log(fmt::format(
      "{} {}: {} {} parameters{}; {}; {} on {}{}; {}",
      same_run && position_.step > 0 ? "resuming at step " + std::to_string(position_.step)
                                     : "starting",
      config_.train.out_dir, distill_ ? "student" : "model", student_->num_parameters(),
      distill_ ? fmt::format(", teacher {}", teacher_->num_parameters()) : "", data_->Describe(),
      EnumName(config_.train.mode), device_.str(),
      dist_->active() ? fmt::format(" (+{} more ranks, global batch split {} ways)",
                                    dist_->world_size() - 1, dist_->world_size())
                      : "",
      EnumName(config_.train.precision)));
}

Trainer::~Trainer() = default;

double Trainer::CombinedLoss(double kd_loss, double ce_loss) const {
  return distill_ ? config_.distill.kd_weight * kd_loss + config_.distill.ce_weight * ce_loss
                  : ce_loss;
}

void Trainer::MicroBatchPass(const at::Tensor& inputs, const at::Tensor& targets,
                             const at::Tensor& scale_tensor, double scale, at::Tensor& kd_sum,
                             at::Tensor& ce_sum) {
  StepProfiler* profiler = profiler_.get();  // nullptr unless --profile-steps
  const bool fused = distill_ && UsesFusedLinear(config_.distill.fused_linear, device_.is_cuda());
  at::Tensor teacher_logits, student_logits;
  LogitsOperands teacher_head, student_head;  // distill.fused_linear: in place of the logits
  {
    PhaseScope phase(profiler, Phase::kForward);
    // Autocast covers the forward passes only; the losses are computed in fp32 and the backward
    // pass runs outside it (autograd replays the forward's dtypes).
    AutocastGuard autocast(config_.train.precision == Precision::kBf16);
    if (fused) {
      {
        torch::NoGradGuard no_grad;
        teacher_head = MakeLogitsOperands(*teacher_, teacher_->forward_hidden(inputs));
      }
      student_head = MakeLogitsOperands(*student_, student_->forward_hidden(inputs));
    } else {
      if (distill_) {
        torch::NoGradGuard no_grad;
        teacher_logits = teacher_->forward(inputs);
      }
      student_logits = student_->forward(inputs);
    }
  }
  LossSums sums;
  {
    PhaseScope phase(profiler, Phase::kLoss);
    sums = fused ? ComputeFusedLossSums(student_head.hidden, student_head.lm_head,
                                        teacher_head.hidden, teacher_head.lm_head, targets,
                                        config_.distill, RealVocabSize(config_))
                 : ComputeLossSums(student_logits, teacher_logits, targets, config_.distill);
  }
  PhaseScope phase(profiler, Phase::kBackward);
  // A float scale on the device (CUDA graphs) multiplies exactly as the double does: in float.
  (scale_tensor.defined() ? sums.total * scale_tensor : sums.total * scale).backward();
  kd_sum += sums.kd;
  ce_sum += sums.ce;
}

std::vector<Batch> Trainer::StepBatches(int64_t data_position) {
  if (prefetched_.first == data_position && !prefetched_.second.empty()) {
    return std::exchange(prefetched_, {-1, {}}).second;
  }
  std::vector<Batch> batches;
  for (int64_t index : RankMicroBatches(data_position, config_.train.grad_accum, dist_->rank(),
                                        dist_->world_size())) {
    batches.push_back(data_->TrainBatch(index));
  }
  return batches;
}

StepResult Trainer::AccumulateGradients(const std::vector<Batch>& micro_batches,
                                        int64_t normalizer_tokens) {
  return ReadLosses(QueueMicroBatches(micro_batches, normalizer_tokens, nullptr), at::Tensor());
}

Trainer::QueuedLosses Trainer::QueueMicroBatches(const std::vector<Batch>& micro_batches,
                                                 int64_t normalizer_tokens,
                                                 const std::function<void()>& while_device_works) {
  QueuedLosses q;
  q.tokens = normalizer_tokens;
  if (q.tokens == 0) {
    for (const auto& b : micro_batches) q.tokens += b.num_targets;
  }
  q.scale = 1.0 / std::max<int64_t>(q.tokens, 1);
  StepProfiler* profiler = profiler_.get();  // nullptr unless --profile-steps
  if (graph_) {
    std::tie(q.kd_sum, q.ce_sum) =
        graph_->Accumulate(micro_batches, q.scale,
                           [this](const at::Tensor& inputs, const at::Tensor& targets,
                                  const at::Tensor& scale_tensor, at::Tensor& kd, at::Tensor& ce) {
                             MicroBatchPass(inputs, targets, scale_tensor, 0.0, kd, ce);
                           });
    if (auto warning = graph_->TakeWarning()) Warn(*warning);
  } else {
    q.kd_sum = at::zeros({}, at::TensorOptions(device_).dtype(at::kFloat));
    q.ce_sum = q.kd_sum.clone();
    for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
      const Batch& batch = micro_batches[mb];
      at::Tensor inputs, targets;
      {
        PhaseScope phase(profiler, Phase::kData);
        inputs = ToDevice(batch.inputs, device_);
        targets = ToDevice(batch.targets, device_);
      }
      // Data-parallel: the last micro-batch's backward starts each gradient bucket's all-reduce
      // as soon as the bucket is complete (Step waits for them).
      if (reducer_) reducer_->BeginBackward(/*last=*/mb + 1 == micro_batches.size());
      MicroBatchPass(inputs, targets, at::Tensor(), q.scale, q.kd_sum, q.ce_sum);
    }
  }
  if (while_device_works) while_device_works();  // the work is queued, not finished
  return q;
}

StepResult Trainer::ReadLosses(const QueuedLosses& q, const at::Tensor& grad_norm) const {
  // Waits for the step's forward and backward (and what Step queued after them: the clipping,
  // data-parallel the gradient all-reduces).
  PhaseScope phase(profiler_.get(), Phase::kLoss);
  std::vector<at::Tensor> terms = {q.kd_sum.to(at::kDouble), q.ce_sum.to(at::kDouble)};
  if (grad_norm.defined()) terms.push_back(grad_norm.to(at::kDouble));
  // One transfer (one wait) for all of them: each .item() would wait on its own.
  const at::Tensor host = at::stack(terms).to(at::kCPU);
  const double* v = host.const_data_ptr<double>();
  StepResult r;
  r.tokens = q.tokens;
  r.kd_loss = v[0] * q.scale;
  r.ce_loss = v[1] * q.scale;
  r.loss = CombinedLoss(r.kd_loss, r.ce_loss);
  if (grad_norm.defined()) r.grad_norm = v[2];
  return r;
}

StepResult Trainer::Step() {
  StepProfiler* profiler = profiler_.get();  // nullptr unless --profile-steps
  const double lr = LearningRate(config_, position_.step);
  {
    PhaseScope phase(profiler, Phase::kOptimizer);
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    if (graph_) {
      ZeroGradients(student_->parameters());  // in place: a replayed graph adds into them
    } else {
      optimizer_->zero_grad(/*set_to_none=*/true);
    }
  }

  std::vector<Batch> micro_batches;
  int64_t local_tokens = 0;
  {
    PhaseScope phase(profiler, Phase::kData);
    micro_batches = StepBatches(position_.data_position);
    for (const Batch& b : micro_batches) local_tokens += b.num_targets;
  }
  // The global token count before the backward: each rank's gradients are then its share of
  // the global batchmean, and their sum (the all-reduce) is the one-process gradient.
  int64_t global_tokens = 0;
  {
    PhaseScope phase(profiler, Phase::kCommunication);
    global_tokens = dist_->AllReduceSum(local_tokens);
  }
  // The next step's batches are made on the host while the device runs this step's work (not
  // under --profile-steps, whose data phase times them; not after the last step), and on CUDA
  // put in pinned memory there too: pinned at the next step's start, the device would wait.
  const int64_t next = position_.data_position + config_.train.grad_accum;
  const bool prefetch = profiler == nullptr && position_.step + 1 < config_.train.steps;
  const QueuedLosses queued = QueueMicroBatches(micro_batches, global_tokens, [&] {
    if (!prefetch) return;
    std::vector<Batch> batches = StepBatches(next);
    if (device_.is_cuda()) {
      for (Batch& b : batches) {
        b.inputs = b.inputs.pin_memory();
        b.targets = b.targets.pin_memory();
      }
    }
    prefetched_ = {next, std::move(batches)};
  });
  if (dist_->active() && reducer_) {
    // The gradient buckets' all-reduces, started during the last backward: wait for them (and
    // start those of parameters that got no gradient) before the norm reads the gradients.
    PhaseScope phase(profiler, Phase::kCommunication);
    reducer_->Finish();
  }
  // The clipping is queued behind the micro-batches before anything is read, so that the device
  // does not wait for the host between them: the loss terms and the norm come back in one
  // transfer. max_norm = inf measures the norm without clipping (the coefficient clamps to 1).
  const double max_norm = config_.optim.grad_clip > 0 ? config_.optim.grad_clip : INFINITY;
  at::Tensor grad_norm;
  {
    PhaseScope phase(profiler, Phase::kClip);
    grad_norm = QueueClipGradNorm(student_->parameters(), max_norm);
  }
  StepResult r = ReadLosses(queued, grad_norm);
  const int signal = StopSignals::Pending();
  stop_signal_ = signal;
  if (dist_->active()) {
    PhaseScope phase(profiler, Phase::kCommunication);
    // The step's loss terms. A SIGTERM / SIGINT / SIGHUP rides along in that same all-reduce
    // (free: no extra communication), so every rank sees it at the same step and all stop
    // together.
    const std::vector<double> terms =
        dist_->AllReduceSum({r.kd_loss, r.ce_loss, signal == SIGTERM ? 1.0 : 0.0,
                             signal == SIGINT ? 1.0 : 0.0, signal == SIGHUP ? 1.0 : 0.0});
    r.kd_loss = terms[0];
    r.ce_loss = terms[1];
    r.loss = CombinedLoss(r.kd_loss, r.ce_loss);
    stop_signal_ = terms[2] > 0 ? SIGTERM : terms[3] > 0 ? SIGINT : terms[4] > 0 ? SIGHUP : 0;
  }
  r.lr = lr;
  // The loss terms are on the host already and clipping computed the norm: no extra sync.
  r.skipped = SkipNonFinite(r);
  if (!r.skipped) {
    PhaseScope phase(profiler, Phase::kOptimizer);
    optimizer_->step();
  }

  position_.step += 1;
  position_.data_position += config_.train.grad_accum;
  last_eval_.reset();
  return r;
}

std::string Trainer::NonFiniteCauses(const std::string& lr_detail) const {
  const std::string lr =
      fmt::format("a learning rate too high (optim.lr {}{})", config_.optim.lr, lr_detail);
  if (!distill_) {
    // Initial weights come from a file only with hf_dir (a pipeline's teacher stage: the
    // command's teacher.hf_dir).
    if (config_.student.hf_dir.empty()) return lr;
    return fmt::format("{}, or non-finite initial weights ({}.hf_dir)", lr,
                       options_.stage == "teacher" ? "teacher" : "student");
  }
  return fmt::format(
      "{}, an extreme distill.temperature ({}), or a teacher with non-finite weights", lr,
      config_.distill.temperature);
}

std::string Trainer::StageName() const {
  if (options_.stage.empty()) return "";
  return fmt::format("the {} stage ({})", options_.stage, config_.train.out_dir);
}

std::string Trainer::StepName(int64_t step) const {
  const std::string stage = StageName();
  return stage.empty() ? fmt::format("step {}", step) : fmt::format("{}, step {}", stage, step);
}

bool Trainer::SkipNonFinite(const StepResult& r) {
  const char* term = !std::isfinite(r.kd_loss)     ? "kd_loss"
                     : !std::isfinite(r.ce_loss)   ? "ce_loss"
                     : !std::isfinite(r.grad_norm) ? "grad_norm"
                                                   : nullptr;
  if (term == nullptr) return false;
  const double raw = term[0] == 'k' ? r.kd_loss : term[0] == 'c' ? r.ce_loss : r.grad_norm;
  // "nan" whatever its sign bit (kernels may produce -nan; the sign of a NaN means nothing), and
  // "inf" / "-inf" as they are.
  const std::string value = std::isnan(raw) ? "nan" : fmt::format("{}", raw);
  const int64_t step = position_.step + 1;
  const std::string hint = NonFiniteCauses(fmt::format(", this step {:.3g}", r.lr));
  if (config_.train.nonfinite == NonFinite::kStop) {
    // The checkpoint this run resumed from or last wrote (not the newest file by name: a damaged
    // one the resume skipped).
    const bool checkpointed = checkpointed_step_ >= 0;
    const std::string last =
        checkpointed ? fmt::format(
                           "the last checkpoint, {}, is intact; the same command resumes "
                           "from it and, on the same data, likely stops here again",
                           CheckpointPath(config_.train.out_dir, checkpointed_step_))
                     : std::string("no checkpoint yet");
    throw NonFiniteError(fmt::format(
        "{}: {} is {} (non-finite); stopped before the optimizer step, so no non-finite "
        "weights were written ({}). Likely causes: {}; train.nonfinite=skip skips such steps",
        StepName(step), term, value, last, hint));
  }
  if (graph_) {
    ZeroGradients(student_->parameters());  // in place: the graph (or its capture) adds into them
  } else {
    optimizer_->zero_grad(/*set_to_none=*/true);
  }
  // Counted over the run (the checkpoint carries the count): resuming does not reset the limit.
  const int64_t skipped = ++position_.skipped_steps;
  if (skipped > config_.train.max_skipped_steps) {
    throw NonFiniteError(
        fmt::format("{}: {} is {} (non-finite) and {} steps of this run were skipped, more "
                    "than train.max_skipped_steps ({}); the weights are finite. Likely causes: {}; "
                    "to skip more, raise train.max_skipped_steps and run again{}",
                    StepName(step), term, value, skipped, config_.train.max_skipped_steps, hint,
                    checkpointed_step_ >= 0 ? " (it resumes from the last checkpoint)" : ""));
  }
  progress_->Warn(fmt::format("{}: {} is {} (non-finite); skipped the update ({} of at most {})",
                              StepName(step), term, value, skipped,
                              config_.train.max_skipped_steps));
  return true;
}

EvalResult Trainer::Evaluate() {
  torch::NoGradGuard no_grad;
  AutocastGuard autocast(config_.train.precision == Precision::kBf16);
  student_->eval();
  at::Tensor ce = at::zeros({}, at::TensorOptions(device_).dtype(at::kDouble));
  at::Tensor teacher_ce = ce.clone(), kd = ce.clone();
  int64_t tokens = 0;
  // Data-parallel: each rank evaluates a share of the validation batches; the sums are reduced.
  for (int64_t j :
       RankEvalBatches(config_.train.eval_batches, dist_->rank(), dist_->world_size())) {
    const Batch batch = data_->ValBatch(j, config_.train.eval_batches);
    const at::Tensor inputs = batch.inputs.to(device_);
    const at::Tensor targets = batch.targets.to(device_);
    tokens += batch.num_targets;
    if (distill_ && UsesFusedLinear(config_.distill.fused_linear, device_.is_cuda())) {
      // No (BT, V) logits here either; the teacher's cross-entropy is the fused op's with the
      // teacher in both places (its divergence, 0, is computed and discarded).
      const LogitsOperands s = MakeLogitsOperands(*student_, student_->forward_hidden(inputs));
      const LogitsOperands t = MakeLogitsOperands(*teacher_, teacher_->forward_hidden(inputs));
      const int64_t vocab = RealVocabSize(config_);
      const LossSums both = ComputeFusedLossSums(s.hidden, s.lm_head, t.hidden, t.lm_head, targets,
                                                 config_.distill, vocab);
      ce += both.ce;
      kd += both.kd;
      teacher_ce += ComputeFusedLossSums(t.hidden, t.lm_head, t.hidden, t.lm_head, targets,
                                         config_.distill, vocab)
                        .ce;
      continue;
    }
    const at::Tensor student_logits = student_->forward(inputs);
    if (distill_) {
      const at::Tensor teacher_logits = teacher_->forward(inputs);
      const LossSums both =
          ComputeLossSums(student_logits, teacher_logits, targets, config_.distill);
      ce += both.ce;
      kd += both.kd;
      teacher_ce += ComputeLossSums(teacher_logits, {}, targets, config_.distill).ce;
    } else {
      ce += ComputeLossSums(student_logits, {}, targets, config_.distill).ce;
    }
  }
  student_->train();
  const std::vector<double> sums =
      dist_->AllReduceSum({ce.item<double>(), teacher_ce.item<double>(), kd.item<double>(),
                           static_cast<double>(tokens)});
  EvalResult r;
  r.tokens = static_cast<int64_t>(sums[3]);
  r.val_loss = sums[0] / sums[3];
  r.val_ppl = std::exp(r.val_loss);
  if (distill_) {
    r.teacher_val_loss = sums[1] / sums[3];
    r.teacher_val_ppl = std::exp(r.teacher_val_loss);
    r.val_kd = sums[2] / sums[3];
  }
  last_eval_ = r;
  return r;
}

void Trainer::SaveCheckpoint() {
  if (dist_->is_main()) {  // the replicas are identical; rank 0 writes the one copy
    position_.elapsed_s = elapsed_;
    position_.data_files = data_->Files();
    position_.teacher_weights = teacher_weights_;
    const std::string path = CheckpointPath(config_.train.out_dir, position_.step);
    distill::SaveCheckpoint(path, *student_, *optimizer_, position_, device_,
                            RunIdentityHash(config_));
    checkpoint_is_ours_[fs::path(path).filename().string()] = true;  // this run's own now
    PruneCheckpoints(config_.train.out_dir, config_.train.keep_checkpoints, position_.step,
                     [this](const std::string& file) { return CheckpointOwned(file); });
  }
  checkpointed_step_ = position_.step;  // only once written: a failed write is retried
}

bool Trainer::CheckpointOwned(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (const auto known = checkpoint_is_ours_.find(name); known != checkpoint_is_ours_.end()) {
    return known->second;
  }
  // A file from before this process: read once (a checkpoint written before checkpoints
  // carried the run identity counts as this run's, as its resume does).
  const std::vector<std::string>& identities = run_identities_;
  std::string why;
  try {
    const std::string saved = CheckpointRunIdentity(path);
    if (!saved.empty() &&
        std::find(identities.begin(), identities.end(), saved) == identities.end()) {
      why = fmt::format("a checkpoint of another run (run identity {}; this run's is {})", saved,
                        identities.front());
    }
  } catch (const CorruptCheckpointError& e) {
    why = fmt::format("not an intact checkpoint ({})", e.what());
  } catch (const std::exception& e) {
    // Not known either way (memory, I/O): not deleted now, and asked again at the next pruning.
    progress_->Warn(
        fmt::format("warning: {}: cannot read whose checkpoint it is ({}); not pruned this time",
                    path, e.what()));
    return false;
  }
  checkpoint_is_ours_[name] = why.empty();
  if (!why.empty()) {
    const std::string warning = fmt::format(
        "warning: {} is {}: train.keep_checkpoints neither counts nor deletes it; move it away",
        path, why);
    Warn(warning);
  }
  return why.empty();
}

void Trainer::Warn(const std::string& warning) {
  progress_->Warn(warning);
  warnings_.push_back(warning);
}

void Trainer::LogStep(const StepResult& r) {
  const double tokens_per_second = tokens_since_log_ / std::max(seconds_since_log_, 1e-9);
  tokens_since_log_ = 0;
  seconds_since_log_ = 0;
  if (!metrics_) return;  // not rank 0
  metrics_->Write(JsonRecord()
                      .Add("type", std::string("train"))
                      .Add("step", position_.step)
                      .Add("loss", r.loss)
                      .Add("kd_loss", distill_ ? r.kd_loss : NAN)
                      .Add("ce_loss", r.ce_loss)
                      .Add("lr", r.lr)
                      .Add("grad_norm", r.grad_norm)
                      .Add("skipped_steps", position_.skipped_steps)
                      .Add("tokens_per_s", tokens_per_second)
                      .Add("elapsed_s", elapsed_));
  progress_->Log(fmt::format(
      "step {:>6}/{}  loss {}{}  lr {:.2e}  |g| {}  {:.0f} tok/s  {}", position_.step,
      config_.train.steps, LogNumber(r.loss, 4),
      distill_ ? fmt::format("  kd {}  ce {}", LogNumber(r.kd_loss, 4), LogNumber(r.ce_loss, 4))
               : "",
      r.lr, LogNumber(r.grad_norm, 3), tokens_per_second, progress_->Eta(position_.step)));
}

void Trainer::LogEval(const EvalResult& r) {
  if (!metrics_) return;  // not rank 0
  const double floor = data_->EntropyFloor().value_or(NAN);
  metrics_->Write(JsonRecord()
                      .Add("type", std::string("eval"))
                      .Add("step", position_.step)
                      .Add("val_loss", r.val_loss)
                      .Add("val_ppl", r.val_ppl)
                      .Add("teacher_val_loss", r.teacher_val_loss)
                      .Add("teacher_val_ppl", r.teacher_val_ppl)
                      .Add("val_kd", r.val_kd)
                      .Add("entropy_floor", floor)
                      .Add("elapsed_s", elapsed_));
  std::string line = fmt::format("eval {:>6}  val_loss {} (ppl {})", position_.step,
                                 LogNumber(r.val_loss, 4), LogNumber(r.val_ppl, 2));
  if (distill_) {
    line += fmt::format("  teacher {}  val_kd {}", LogNumber(r.teacher_val_loss, 4),
                        LogNumber(r.val_kd, 4));
  }
  if (std::isfinite(floor)) line += fmt::format("  floor {:.4f}", floor);
  progress_->Log(line);
  // The training losses are checked at every step (train.nonfinite); a validation loss that is
  // not finite is said too, never only written as null.
  const bool finite = std::isfinite(r.val_loss) &&
                      (!distill_ || (std::isfinite(r.teacher_val_loss) && std::isfinite(r.val_kd)));
  if (!finite) {
    const std::string warning = fmt::format(
        "warning: {}: the validation losses are not finite (val_loss {}{}): the logits "
        "overflow on some validation tokens. Likely causes: huge weights (1e38 or so) in rows of "
        "the embedding or lm_head that the training data never reaches, or validation data from "
        "another tokenizer; check them before using the model",
        StepName(position_.step), LogNumber(r.val_loss, 4),
        distill_ ? fmt::format(", teacher {}, val_kd {}", LogNumber(r.teacher_val_loss, 4),
                               LogNumber(r.val_kd, 4))
                 : "");
    Warn(warning);
  }
}

void Trainer::TrainUntil(int64_t stop_step) {
  stop_step = std::min(stop_step, config_.train.steps);
  const TrainConfig& t = config_.train;
  StopSignals signals;  // SIGTERM / SIGINT / SIGHUP: finish the step, checkpoint, throw Interrupted
  stop_signal_ = 0;
  while (position_.step < stop_step) {
    if (profiler_) profiler_->BeforeStep();
    const auto start = std::chrono::steady_clock::now();
    StepResult result;
    try {
      result = Step();
    } catch (const c10::Error& e) {
      // Out of memory in a step: what needs less memory for this run (its stage's config, and
      // the command's, which the overrides go to).
      if (!IsOutOfMemory(e)) throw;
      throw MemoryError(fmt::format(
          "{}: {}", StepName(position_.step + 1),
          OutOfMemoryMessage(e.what_without_backtrace(), config_, device_.is_cuda(),
                             options_.command != nullptr ? *options_.command : config_)));
    }
    const double seconds = Seconds(start);
    if (profiler_) {
      for (const auto& line : profiler_->AfterStep(result.tokens)) progress_->Log(line);
    }
    elapsed_ += seconds;
    seconds_since_log_ += seconds;
    tokens_since_log_ += result.tokens;
    progress_->Update(position_.step, result.loss, result.tokens / std::max(seconds, 1e-9));

    if (position_.step % t.log_interval == 0 || position_.step == stop_step) LogStep(result);
    if (t.eval_interval > 0 && position_.step % t.eval_interval == 0) LogEval(Evaluate());
    if (t.checkpoint_interval > 0 && position_.step % t.checkpoint_interval == 0) SaveCheckpoint();
    // A signal that came during this step's evaluation or checkpoint stops here, not after
    // another step (one process; on several, every rank learns of it in the next step's
    // all-reduce, so that all stop at the same step).
    if (stop_signal_ == 0 && !dist_->active()) stop_signal_ = StopSignals::Pending();
    if (stop_signal_ != 0) break;
  }
  if (profiler_) {
    for (const auto& line : profiler_->Finish()) progress_->Log(line);
  }
  if (checkpointed_step_ != position_.step) SaveCheckpoint();
  progress_->Finish();
  // A signal during the last step (or one that came after the loop on one process) still stops.
  const int signal =
      stop_signal_ != 0 ? stop_signal_ : (dist_->active() ? 0 : StopSignals::Pending());
  if (signal != 0) {
    // Every rank agreed on the stop (the step's all-reduce): the others wait for rank 0's
    // checkpoint before they exit, since a launcher that sees one rank exit stops the rest
    // (torchrun: SIGTERM at once), rank 0 mid-write included.
    if (dist_->active()) dist_->Barrier();
    throw Interrupted(signal, fmt::format("{}: checkpoint at step {} written to {}; resume with "
                                          "the same command",
                                          SignalName(signal), position_.step,
                                          CheckpointPath(config_.train.out_dir, position_.step)));
  }
}

EvalResult Trainer::Train() {
  TrainUntil(config_.train.steps);
  if (position_.step > 0 && position_.skipped_steps == position_.step) {
    throw NonFiniteError(fmt::format(
        "{}all {} steps of this run were skipped as non-finite (train.nonfinite=skip): the {} was "
        "never updated, and running this command again repeats this error. Likely causes: {}; "
        "fix the cause and start over with --fresh (or another train.out_dir)",
        options_.stage.empty() ? "" : StageName() + ": ", position_.step,
        distill_ ? "student" : "model", NonFiniteCauses("")));
  }
  EvalResult final_eval;
  if (last_eval_) {
    final_eval = *last_eval_;  // evaluated (and logged) at the last step already
  } else {
    final_eval = Evaluate();
    // A finished run opened again already has its final record.
    if (metrics_ && !metrics_->Has("eval", position_.step)) LogEval(final_eval);
  }
  if (!dist_->is_main()) return final_eval;
  const double floor = data_->EntropyFloor().value_or(NAN);
  WriteFileAtomically((fs::path(config_.train.out_dir) / "summary.json").string(),
                      JsonRecord()
                              .Add("mode", std::string(EnumName(config_.train.mode)))
                              .Add("steps", position_.step)
                              .Add("skipped_steps", position_.skipped_steps)
                              .Add("parameters", student_->num_parameters())
                              .Add("val_loss", final_eval.val_loss)
                              .Add("val_ppl", final_eval.val_ppl)
                              .Add("teacher_val_loss", final_eval.teacher_val_loss)
                              .Add("val_kd", final_eval.val_kd)
                              .Add("entropy_floor", floor)
                              .Add("elapsed_s", elapsed_)
                              .str() +
                          "\n");
  // gpt-family runs export at the end only when they come from a Hugging Face model (the
  // quickstart's runs would each get an hf/ they did not ask for; `distill_trainer export`):
  // the student's, the teacher's, or train.export_from (a hard-label baseline's HF teacher).
  const bool from_hf = !config_.student.hf_dir.empty() ||
                       (distill_ && !config_.teacher.hf_dir.empty()) ||
                       !config_.train.export_from.empty();
  if (config_.train.export_hf && (config_.student.family == ModelFamily::kLlama || from_hf)) {
    const std::string hf_dir = (fs::path(config_.train.out_dir) / "hf").string();
    // The run's own previous export stands in for an hf_dir removed while the run trained.
    const HfExportSources sources = ExportSources(config_, config_.train.out_dir);
    auto warn = [&](const std::string& warning) {
      if (!warning.empty()) Warn(warning);
    };
    warn(sources.note);
    try {
      warn(ExportHf(*student_, hf_dir, sources, /*replace=*/true));
    } catch (const c10::Error&) {
      throw;  // out of memory: main says so
    } catch (const std::exception& e) {
      // The training is not lost with the export: say where it is and how to export it.
      const std::string message = fmt::format(
          "{}; the training itself is done, its final checkpoint in {}: once that is fixed, "
          "`distill_trainer export {} <new directory>` exports it",
          e.what(), (fs::path(config_.train.out_dir) / "checkpoints").string(),
          config_.train.out_dir);
      if (dynamic_cast<const ConfigError*>(&e) != nullptr) throw ConfigError(message);
      throw std::runtime_error(message);
    }
    progress_->Log(fmt::format("exported the student to {} (Hugging Face format)", hf_dir));
  }
  return final_eval;
}

}  // namespace distill

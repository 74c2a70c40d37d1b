// One training run: a student trained with cross-entropy (pretrain) or distilled from a frozen
// teacher (distill), on one device, logging to and checkpointing in train.out_dir.
// Data-parallel (RunOptions::distributed active, see distributed.h): every rank runs a Trainer
// on cuda:LOCAL_RANK over its share of each global batch; only rank 0 writes to train.out_dir.
//
// The loop reads:  Step() -> log -> Evaluate() every eval_interval -> checkpoint every
// checkpoint_interval; a checkpoint is always written when TrainUntil() returns, so any stop
// point can be resumed exactly (bit-identical on CPU).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

#include <torch/optim/adamw.h>

#include "distill/checkpoint.h"
#include "distill/config.h"
#include "distill/data.h"
#include "distill/distributed.h"
#include "distill/grad_reducer.h"
#include "distill/metrics.h"
#include "distill/model.h"
#include "distill/optimizer.h"
#include "distill/profile.h"
#include "distill/step_graph.h"

namespace distill {

// A step whose loss terms or gradient norm are not finite (train.nonfinite: stop, or skip past
// train.max_skipped_steps). Thrown before the optimizer step: the weights are still finite.
class RunLock;  // distill/run_dir.h

class NonFiniteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  bool fresh = false;  // delete an existing run directory first (see run_dir.h)
  bool quiet = false;  // no console output but warnings (tests, --quiet)
  // The process group (not owned); nullptr: one plain process. Ranks other than 0 never print.
  Distributed* distributed = nullptr;
  // --profile-steps: a trace, then phase timers, of a few steps into <out_dir>/profile/
  // (profile.h); steps 0: off, nothing added to a step.
  ProfileOptions profile;
  // Called once on rank 0 just before the run directory is first written, after the models and
  // data were built: a pipeline commits its own directory there (with --fresh, the deletion of
  // its previous run), so that a stage that fails at start-up deletes nothing.
  std::function<void()> before_commit;
  // The config of the command this run is a stage of (a pipeline's, or the distillation that
  // train.baseline follows with this baseline), not owned; nullptr: this run's own. The overrides
  // that the out-of-memory advice names go to that command, so they must be ones its config
  // accepts.
  const Config* command = nullptr;
  // Which stage of that command this run is ("teacher", "student", "baseline"); empty: a run of
  // its own. The errors of its steps (out of memory, non-finite) name it with its directory.
  std::string stage;

  // A run without console output (tests, examples): RunOptions::Quiet(/*fresh=*/true).
  static RunOptions Quiet(bool fresh = false, Distributed* distributed = nullptr) {
    RunOptions o;
    o.fresh = fresh;
    o.quiet = true;
    o.distributed = distributed;
    return o;
  }
};

struct StepResult {
  double loss = 0, kd_loss = 0, ce_loss = 0;  // batchmeans over the step's non-ignored tokens
  double lr = 0, grad_norm = 0;               // grad_norm: before clipping
  int64_t tokens = 0;                         // non-ignored target tokens in the step
  bool skipped = false;  // non-finite and train.nonfinite is skip: no optimizer update
};

struct EvalResult {
  double val_loss = 0, val_ppl = 0;  // student cross-entropy (nats/token) and its exp
  double teacher_val_loss = NAN, teacher_val_ppl = NAN;
  double val_kd = NAN;  // the divergence (at distill.temperature) on the validation tokens
  int64_t tokens = 0;
};

// "cpu" or "cuda" for train.device ("auto": CUDA when available).
at::Device ResolveDevice(const std::string& device);

// Learning rate of (0-based) optimizer step `step`: linear warmup to optim.lr over
// schedule.warmup_steps, then cosine / linear / constant decay to lr * min_lr_ratio at the end.
double LearningRate(const Config& config, int64_t step);

// A model of `config` on `device` with its weights: from config.hf_dir (Hugging Face
// safetensors), else from `checkpoint` (a checkpoint file or run directory) when not empty, else
// freshly initialised from torch's default generator. Throws naming the file on any problem.
// `warnings`: a corrupt newest checkpoint of a run directory skipped (LoadWeights); on stderr
// when null.
Model BuildModel(const ModelConfig& config, const std::string& checkpoint, const at::Device& device,
                 std::vector<std::string>* warnings = nullptr);

class Trainer {
 public:
  // Prepares the run directory (resume or refuse, run_dir.h), builds data, teacher, student and
  // optimizer, and restores the latest checkpoint when the directory holds this run.
  // Throws ConfigError / RunDirError / std::runtime_error with an actionable message.
  explicit Trainer(Config config, RunOptions options = {});
  ~Trainer();

  // Trains until `stop_step` optimizer steps are done (at most train.steps), then checkpoints.
  void TrainUntil(int64_t stop_step);
  // The whole run: TrainUntil(train.steps), a final evaluation, summary.json. Returns the
  // final evaluation.
  EvalResult Train();

  // One optimizer step on the global batch: train.grad_accum micro-batches from the data
  // position, this rank's share of them (RankMicroBatches) when data-parallel. The gradients
  // are summed over ranks and the losses are those of the whole global batch.
  StepResult Step();
  // Forward and backward of `micro_batches` as one optimizer step's worth of data: gradients
  // are accumulated into the student's .grad, normalised by `normalizer_tokens` (0: the total
  // count of non-ignored targets over `micro_batches`; data-parallel: the global count over all
  // ranks). Returns the loss terms of these micro-batches under that normalisation (no
  // optimizer update, no zeroing). With several ranks the last micro-batch's backward starts the
  // gradient all-reduces, which only Step collects: there, call it through Step.
  StepResult AccumulateGradients(const std::vector<Batch>& micro_batches,
                                 int64_t normalizer_tokens = 0);
  EvalResult Evaluate();
  void SaveCheckpoint();
  // Whether the checkpoint file at `path` is this run's (PruneCheckpoints' is_ours): a file
  // another run wrote, or one that cannot be read, is left where it is, with a warning once.
  bool CheckpointOwned(const std::string& path);

  int64_t step() const { return position_.step; }
  int64_t skipped_steps() const { return position_.skipped_steps; }  // over the run
  const Config& config() const { return config_; }
  const DataSource& data() const { return *data_; }
  CausalLM& student() { return *student_; }
  CausalLM* teacher() { return teacher_.get(); }
  torch::optim::AdamW& optimizer() { return *optimizer_; }
  const at::Device& device() const { return device_; }
  Distributed& distributed() { return *dist_; }
  // train.cuda_graph: whether micro-batches are replayed from a captured CUDA graph now.
  bool cuda_graph_captured() const { return graph_ != nullptr && graph_->captured(); }
  // The run's warnings (a corrupt checkpoint skipped on resume, a CUDA graph given up, a file in
  // checkpoints/ not counted, an export's note, ...), each printed when it happened, also when
  // quiet. (Printed, not kept here: a step skipped as non-finite, counted in skipped_steps(); a
  // checkpoint whose owner could not be read this time.)
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  void LogStep(const StepResult& result);
  // Prints a warning (also with --quiet) and keeps it in warnings().
  void Warn(const std::string& warning);
  void LogEval(const EvalResult& result);
  double CombinedLoss(double kd_loss, double ce_loss) const;
  // After the backward of step `r`: throws NonFiniteError, or (skip) zeroes the gradients and
  // returns true when a loss term or the gradient norm is not finite.
  bool SkipNonFinite(const StepResult& r);
  // The likely causes of a non-finite step, for the errors (`lr_detail` follows optim.lr).
  std::string NonFiniteCauses(const std::string& lr_detail) const;
  // "the teacher stage (<out_dir>)" for a stage of a command, else "".
  std::string StageName() const;
  // "step N", or for a stage "<StageName()>, step N": how the errors and warnings of a step begin.
  std::string StepName(int64_t step) const;
  // The step's micro-batches at `data_position` (this rank's share), prefetched or made now.
  std::vector<Batch> StepBatches(int64_t data_position);
  // AccumulateGradients' work queued on the device, its loss sums not read yet.
  struct QueuedLosses {
    at::Tensor kd_sum, ce_sum;  // 0-d float sums on the device (times scale: the batchmeans)
    int64_t tokens = 0;
    double scale = 0;  // 1 / the normalising token count
  };
  // Queues the micro-batches (as AccumulateGradients), then calls `while_device_works` (when
  // set) while the device runs them.
  QueuedLosses QueueMicroBatches(const std::vector<Batch>& micro_batches, int64_t normalizer_tokens,
                                 const std::function<void()>& while_device_works);
  // Waits for `q` and reads its loss terms, and `grad_norm` (when defined), in one transfer.
  StepResult ReadLosses(const QueuedLosses& q, const at::Tensor& grad_norm) const;
  // One micro-batch on the device: forward, loss, and the backward of its loss times the scale
  // (`scale_tensor` when defined, else `scale`); adds the loss sums into kd_sum and ce_sum.
  void MicroBatchPass(const at::Tensor& inputs, const at::Tensor& targets,
                      const at::Tensor& scale_tensor, double scale, at::Tensor& kd_sum,
                      at::Tensor& ce_sum);

  Config config_;
  RunOptions options_;
  std::unique_ptr<Distributed> single_;  // the no-op group when options_.distributed is null
  Distributed* dist_;
  std::unique_ptr<GradReducer> reducer_;  // data-parallel only: sums gradients over the ranks
  at::Device device_;
  bool distill_;
  std::unique_ptr<DataSource> data_;
  Model student_;
  Model teacher_;
  std::string teacher_weights_;  // WeightsFingerprint of the teacher as loaded ("": pretraining)
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  TrainingPosition position_;
  int64_t checkpointed_step_ = -1;
  // Whether each checkpoint file (its name in checkpoints/) is this run's, for the pruning: true
  // for those this process wrote or resumed from; false for those the resume skipped as damaged
  // or misnamed (never pruned nor counted, unless this process writes that file itself); either,
  // once read, for the others (CheckpointOwned).
  std::map<std::string, bool> checkpoint_is_ours_;
  // The run identities this run's checkpoints may carry (AcceptedRunIdentityHashes, and those of
  // the directory's config.yaml as it was found: a moved pipeline's stage).
  std::vector<std::string> run_identities_;
  std::optional<EvalResult> last_eval_;  // evaluation at the current step, if any
  std::shared_ptr<RunLock> run_lock_;    // rank 0 only: train.out_dir is this process's
  std::unique_ptr<MetricsLog> metrics_;  // rank 0 only
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<StepProfiler> profiler_;  // --profile-steps only
  std::unique_ptr<StepGraph> graph_;        // train.cuda_graph in effect only
  // The next step's batches, made while the device ran the last step: {data position, batches}.
  std::pair<int64_t, std::vector<Batch>> prefetched_{-1, {}};
  // Throughput since the last log record.
  int64_t tokens_since_log_ = 0;
  double seconds_since_log_ = 0;
  double elapsed_ = 0;   // training seconds of the run, carried over a resume by the checkpoint
  int stop_signal_ = 0;  // SIGTERM / SIGINT / SIGHUP seen (on any rank) at the last step, or 0
  std::vector<std::string> warnings_;
};

}  // namespace distill

// The shared machinery of the convergence examples: options, configs, a minimal distillation
// loop with a swappable divergence, tie statistics, CSV output and PASS/FAIL checks.
//
// The loop (Loop) is distill::Trainer::Step for one micro-batch per step, built from the
// trainer's own pieces: distill::MakeOptimizer (fused AdamW, decay on matrices only), the
// schedule (distill::LearningRate), the clipping (distill::ClipGradNorm), and for a divergence on
// the logits the trainer's call itself, distill::DivergenceSum. What the experiments vary is a
// parameter: the divergence (on probabilities: the lossfns op, a composite LibTorch reference, or
// the legacy two-way sign; on logits: DivergenceSum or its float64 reference) and the loss dtype
// (fp32 or bf16) that the probabilities or logits are cast to before the divergence sees them. Same
// per-token normalisation as the trainer; train.mode pretrain trains on hard labels only.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "distill/config.h"
#include "distill/data.h"
#include "distill/model.h"

namespace convergence {

struct Options {
  bool small = false;          // the seconds-long CPU version that ctest runs
  std::string device = "cpu";  // cpu | cuda
  std::string dtype = "fp32";  // fp32 | bf16: the dtype of p and q as the divergence sees them
  std::string out = "out/convergence";
  at::ScalarType loss_dtype() const { return dtype == "bf16" ? at::kBFloat16 : at::kFloat; }
  // <out>/<name>_<dtype>.csv
  std::string CsvPath(const std::string& name) const;
};

// The models and data of every experiment: a 1-layer d=32 pair on vocab 24 (padded to 32) with
// --small, a 2/3-layer d=64/128 pair otherwise. `run_dir` is where Trainer-based stages write.
distill::Config BaseConfig(const Options& options, const std::string& run_dir);

// Pretrains config.teacher's architecture for `steps` steps with distill::Trainer (the pipeline's
// teacher stage, distill::TeacherStageConfig, in fp32; quietly, from scratch, into `run_dir`) and
// returns the model (frozen: eval mode, no grad) on the device.
distill::Model PretrainTeacher(const distill::Config& config, const std::string& run_dir,
                               int64_t steps);

// A fresh model of `config` initialised from torch's generator seeded with `seed`.
distill::Model MakeModel(const distill::ModelConfig& config, int64_t seed,
                         const at::Device& device);

// A deep copy of `from` on its device, trainable or frozen.
distill::Model Clone(distill::Model& from, bool trainable);

// Sum over the non-ignored rows of a divergence: p, q (N, V) in the loss dtype, targets (N,).
// Returns a 0-dim fp32 tensor differentiable w.r.t. p.
using Divergence = std::function<at::Tensor(const at::Tensor& p, const at::Tensor& q,
                                            const at::Tensor& targets, int64_t ignore_index)>;
at::Tensor OpDivergence(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                        int64_t ignore_index);  // lossfns::tvd_loss, reduction sum
at::Tensor ReferenceDivergence(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                               int64_t ignore_index);  // ATen ops
at::Tensor LegacySignDivergence(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                                int64_t ignore_index);  // sign(0)=-1

// Sum over the non-ignored rows of a divergence computed from the logits: s, t (N, V) in the loss
// dtype, targets (N,); config: the divergence, jsd_beta, temperature, ignore_index and
// vocab_size (columns at or past it are padding). Returns a 0-dim tensor (fp32 or fp64)
// differentiable w.r.t. s. The op is the trainer's distill::DivergenceSum (lossfns::distill_loss).
using LogitDivergence =
    std::function<at::Tensor(const at::Tensor& s, const at::Tensor& t, const at::Tensor& targets,
                             const distill::DistillConfig& config)>;
// The same divergence in float64 from ATen ops: the logits' first vocab_size columns widened to
// double, log_softmax, the definitions of docs/distill.md, autograd for the gradient (cast back
// to the logits' dtype by the widening's backward). The loss is returned in float64.
at::Tensor ReferenceDivergenceSum(const at::Tensor& s, const at::Tensor& t,
                                  const at::Tensor& targets, const distill::DistillConfig& config);

struct StepMetrics {
  double loss = 0, kd = 0, ce = 0, grad_norm = 0, lr = 0;
  double tie_fraction = 0;  // real-vocabulary elements of non-ignored rows with p == q exactly
};

struct ValMetrics {
  double ce = 0;   // student cross-entropy, nats per token
  double tvd = 0;  // mean TVD(student, teacher) per token (fp32 probabilities)
};

class Loop {
 public:
  // Takes `student` as is (it is trained in place) and `teacher` frozen.
  Loop(const distill::Config& config, distill::Model teacher, distill::Model student,
       at::ScalarType loss_dtype, Divergence divergence);
  Loop(const distill::Config& config, distill::Model teacher, distill::Model student,
       at::ScalarType loss_dtype, LogitDivergence divergence);
  StepMetrics Step();
  ValMetrics Validate(int64_t batches);
  distill::Model& student() { return student_; }
  int64_t step() const { return step_; }
  double last_lr() const { return last_lr_; }

 private:
  distill::Config config_;
  at::Device device_;
  at::ScalarType loss_dtype_;
  Divergence divergence_;             // on probabilities, or
  LogitDivergence logit_divergence_;  // on logits (none in train.mode pretrain)
  std::unique_ptr<distill::DataSource> data_;
  distill::Model teacher_, student_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t step_ = 0;
  double last_lr_ = 0;
};

// Fraction of exact ties p == q over the first `real_vocab` columns of the rows whose target is
// not ignore_index.
double TieFraction(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                   int64_t ignore_index, int64_t real_vocab);

// max |a - b| over all parameters (same architecture), and max |a| for scale.
struct WeightDiff {
  double max_abs = 0, max_weight = 0;
};
WeightDiff CompareWeights(distill::Model& a, distill::Model& b);

// A CSV file: a header, then one row of numbers per call.
class Csv {
 public:
  Csv(const std::string& path, const std::vector<std::string>& columns);
  void Row(const std::vector<double>& values);

 private:
  std::ofstream out_;
  size_t columns_;
};

// Collects named assertions; prints each as "  [ok] ..." / "  [FAIL] ...".
class Checks {
 public:
  bool Expect(bool condition, const std::string& what);
  // Prints "PASS <name>" or "FAIL <name>" and returns the exit code (0 / 1).
  int Finish(const std::string& name) const;

 private:
  bool failed_ = false;
};

}  // namespace convergence

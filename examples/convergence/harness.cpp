#include "harness.h"

#include <fmt/format.h>
#include <lossfns/distill.h>
#include <lossfns/tvd.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "distill/autocast.h"
#include "distill/optimizer.h"
#include "distill/run.h"
#include "distill/trainer.h"

namespace convergence {

std::string Options::CsvPath(const std::string& name) const {
  std::filesystem::create_directories(out);
  return (std::filesystem::path(out) / (name + "_" + dtype + ".csv")).string();
}

distill::Config BaseConfig(const Options& o, const std::string& run_dir) {
  distill::Config c;
  for (distill::ModelConfig* m : {static_cast<distill::ModelConfig*>(&c.student),
                                  static_cast<distill::ModelConfig*>(&c.teacher)}) {
    m->vocab_size = 24;
    m->pad_vocab_to_multiple_of = 32;
    m->context_length = o.small ? 16 : 64;
    m->n_layer = o.small ? 1 : 2;
    m->n_head = 2;
    m->d_model = o.small ? 32 : 64;
  }
  c.teacher.n_layer = o.small ? 2 : 3;
  c.teacher.d_model = o.small ? 32 : 128;
  c.teacher.n_head = o.small ? 2 : 4;
  c.data.batch_size = o.small ? 8 : 16;
  c.data.seq_len = o.small ? 16 : 64;
  c.data.min_seq_len = o.small ? 8 : 48;
  c.data.synthetic.order = o.small ? 1 : 2;
  c.distill.ce_weight = 0.1;
  c.schedule.warmup_steps = o.small ? 5 : 20;
  c.train.mode = distill::Mode::kDistill;
  c.train.device = o.device;
  c.train.log_interval = 1000000;  // the experiments print their own tables
  c.train.eval_interval = 0;
  c.train.eval_batches = o.small ? 4 : 8;
  c.train.checkpoint_interval = 0;
  c.train.out_dir = run_dir;
  return c;
}

distill::Model PretrainTeacher(const distill::Config& config, const std::string& run_dir,
                               int64_t steps) {
  distill::Config c = distill::TeacherStageConfig(config);
  c.train.precision = distill::Precision::kFp32;
  c.train.steps = steps;
  c.train.out_dir = run_dir;
  distill::Trainer trainer(c, distill::RunOptions::Quiet(/*fresh=*/true));
  for (int64_t i = 0; i < steps; ++i) trainer.Step();
  distill::Model teacher = distill::MakeModel(config.teacher);
  teacher->to(trainer.device());
  distill::CopyWeights(trainer.student(), *teacher);
  teacher->eval();
  for (auto& p : teacher->parameters()) p.set_requires_grad(false);
  return teacher;
}

distill::Model MakeModel(const distill::ModelConfig& config, int64_t seed,
                         const at::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  distill::Model model = distill::MakeModel(config);
  model->to(device);
  return model;
}

distill::Model Clone(distill::Model& from, bool trainable) {
  distill::Model to = distill::MakeModel(from->config());
  to->to(from->lm_head_weight().device());
  distill::CopyWeights(*from, *to);
  for (auto& p : to->parameters()) p.set_requires_grad(trainable);
  return to;
}

at::Tensor OpDivergence(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                        int64_t ignore_index) {
  return lossfns::tvd_loss(
      p, q, lossfns::TVDLossOptions().reduction(torch::kSum).ignore_index(ignore_index), targets);
}

// The composite LibTorch reference: 0.5 * sum_j |p_j - q_j| per row, masked, summed. In fp32
// (bf16 inputs are widened exactly). abs' autograd gradient is sign(x) with sign(0) = 0, the
// same tie rule as the op, so the two runs differ only by float rounding.
at::Tensor ReferenceDivergence(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                               int64_t ignore_index) {
  const at::Tensor mask = targets.ne(ignore_index).to(at::kFloat);
  return (0.5 * (p.to(at::kFloat) - q.to(at::kFloat)).abs().sum(-1) * mask).sum();
}

at::Tensor ReferenceDivergenceSum(const at::Tensor& s, const at::Tensor& t,
                                  const at::Tensor& targets, const distill::DistillConfig& config) {
  const lossfns::Divergence divergence = config.divergence;
  const double beta = config.jsd_beta, T = config.temperature;
  const int64_t vocab_size = config.vocab_size > 0 ? config.vocab_size : s.size(-1);
  // The padded columns are left out: the same as -inf in both (probability 0, no gradient),
  // without the 0 * (-inf) of the KL terms there.
  const at::Tensor lp = at::log_softmax(s.narrow(-1, 0, vocab_size).to(at::kDouble) / T, -1);
  const at::Tensor lq =
      at::log_softmax(t.detach().narrow(-1, 0, vocab_size).to(at::kDouble) / T, -1);
  const at::Tensor p = lp.exp(), q = lq.exp();
  auto kl = [](const at::Tensor& a, const at::Tensor& la, const at::Tensor& lb) {
    return (a * (la - lb)).sum(-1);  // KL(a || b) per row
  };
  at::Tensor rows;
  const bool forward = divergence == lossfns::Divergence::kForwardKl ||
                       (divergence == lossfns::Divergence::kJsd && beta == 0.0);
  const bool reverse = divergence == lossfns::Divergence::kReverseKl ||
                       (divergence == lossfns::Divergence::kJsd && beta == 1.0);
  if (divergence == lossfns::Divergence::kTvd) {
    rows = 0.5 * (p - q).abs().sum(-1);  // abs' gradient: sign(x), sign(0) = 0, as the op's
  } else if (forward) {
    rows = kl(q, lq, lp);
  } else if (reverse) {
    rows = kl(p, lp, lq);
  } else {  // JSD(beta): log m = logaddexp(log beta + log q, log(1 - beta) + log p)
    const at::Tensor lm = at::logaddexp(lq + std::log(beta), lp + std::log1p(-beta));
    rows = beta * kl(q, lq, lm) + (1 - beta) * kl(p, lp, lm);
  }
  return at::where(targets.ne(config.ignore_index), rows, at::zeros_like(rows)).sum();
}

namespace {

// The legacy two-way sign: d/dp = 0.5 * (p > q ? 1 : -1) * grad, so a tie gets -0.5 * grad
// instead of 0. The forward is the true TVD. For this example only: it shows the failure mode.
struct LegacySignTvd : public torch::autograd::Function<LegacySignTvd> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& p,
                            const at::Tensor& q, const at::Tensor& mask) {
    ctx->save_for_backward({p, q, mask});
    return (0.5 * (p.to(at::kFloat) - q.to(at::kFloat)).abs().sum(-1) * mask).sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& p = saved[0];
    const at::Tensor& q = saved[1];
    const at::Tensor& mask = saved[2];
    const at::Tensor sign = at::where(p > q, 1.0, -1.0).to(at::kFloat);
    const at::Tensor grad_p = (sign * (0.5 * grad_out[0]) * mask.unsqueeze(-1)).to(p.scalar_type());
    return {grad_p, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LegacySignDivergence(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                                int64_t ignore_index) {
  return LegacySignTvd::apply(p, q, targets.ne(ignore_index).to(at::kFloat));
}

Loop::Loop(const distill::Config& config, distill::Model teacher, distill::Model student,
           at::ScalarType loss_dtype, Divergence divergence)
    : config_(config),
      device_(distill::ResolveDevice(config.train.device)),
      loss_dtype_(loss_dtype),
      divergence_(std::move(divergence)),
      data_(distill::MakeDataSource(config.data, config.student.vocab_size,
                                    config.distill.ignore_index)),
      teacher_(std::move(teacher)),
      student_(std::move(student)) {
  student_->train();
  optimizer_ = distill::MakeOptimizer(config_.optim, *student_);  // the Trainer's own AdamW set-up
}

Loop::Loop(const distill::Config& config, distill::Model teacher, distill::Model student,
           at::ScalarType loss_dtype, LogitDivergence divergence)
    : Loop(config, std::move(teacher), std::move(student), loss_dtype, Divergence()) {
  logit_divergence_ = std::move(divergence);
}

StepMetrics Loop::Step() {
  StepMetrics m;
  m.lr = last_lr_ = distill::LearningRate(config_, step_);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(m.lr);
  optimizer_->zero_grad(/*set_to_none=*/true);

  const distill::Batch batch = data_->TrainBatch(step_);
  const at::Tensor inputs = batch.inputs.to(device_);
  const at::Tensor y = batch.targets.to(device_).reshape({-1});
  at::Tensor s, t;
  {
    distill::AutocastGuard autocast(loss_dtype_ == at::kBFloat16 && device_.is_cuda());
    {
      torch::NoGradGuard no_grad;
      t = teacher_->forward(inputs);
    }
    s = student_->forward(inputs);
  }
  const int64_t V = s.size(-1);
  const double T = config_.distill.temperature;
  s = s.reshape({-1, V}).to(at::kFloat);
  t = t.reshape({-1, V}).to(at::kFloat);
  const int64_t ignore = config_.distill.ignore_index;
  const double scale = 1.0 / std::max<int64_t>(batch.num_targets, 1);
  const bool hard_labels = config_.train.mode == distill::Mode::kPretrain;
  at::Tensor p, q, kd;
  {
    // Without a divergence on probabilities, p and q only feed the tie statistics: no graph.
    at::AutoGradMode grad_mode(!logit_divergence_ && !hard_labels);
    p = at::softmax(s / T, -1).to(loss_dtype_);
    q = at::softmax(t / T, -1).to(loss_dtype_);
  }
  if (hard_labels) {
    kd = at::zeros({}, s.options());
  } else if (logit_divergence_) {
    kd = logit_divergence_(s.to(loss_dtype_), t.to(loss_dtype_), y, config_.distill);
  } else {
    kd = divergence_(p, q, y, ignore);
  }
  const at::Tensor ce = at::cross_entropy_loss(s, y, {}, at::Reduction::Sum, ignore);
  at::Tensor total;
  if (hard_labels) {  // the trainer's pretrain objective (the hard-label baseline): CE alone
    total = ce;
  } else {
    total = config_.distill.kd_weight * kd;
    if (config_.distill.ce_weight != 0.0) total = total + config_.distill.ce_weight * ce;
  }
  (total * scale).backward();
  const double max_norm = config_.optim.grad_clip > 0 ? config_.optim.grad_clip : INFINITY;
  m.grad_norm = distill::ClipGradNorm(student_->parameters(), max_norm);  // as Trainer::Step
  optimizer_->step();
  ++step_;

  m.kd = kd.item<double>() * scale;
  m.ce = ce.item<double>() * scale;
  m.loss = hard_labels ? m.ce : config_.distill.kd_weight * m.kd + config_.distill.ce_weight * m.ce;
  m.tie_fraction = TieFraction(p, q, y, ignore, config_.student.vocab_size);
  return m;
}

ValMetrics Loop::Validate(int64_t batches) {
  torch::NoGradGuard no_grad;
  distill::AutocastGuard autocast(loss_dtype_ == at::kBFloat16 && device_.is_cuda());
  student_->eval();
  double ce = 0, tvd = 0;
  int64_t tokens = 0;
  for (int64_t j = 0; j < batches; ++j) {
    const distill::Batch batch = data_->ValBatch(j, batches);
    const at::Tensor inputs = batch.inputs.to(device_);
    const at::Tensor y = batch.targets.to(device_).reshape({-1});
    const int64_t V = student_->config().padded_vocab_size();
    const at::Tensor s = student_->forward(inputs).reshape({-1, V}).to(at::kFloat);
    const at::Tensor t = teacher_->forward(inputs).reshape({-1, V}).to(at::kFloat);
    const int64_t ignore = config_.distill.ignore_index;
    ce += at::cross_entropy_loss(s, y, {}, at::Reduction::Sum, ignore).item<double>();
    tvd += OpDivergence(at::softmax(s, -1), at::softmax(t, -1), y, ignore).item<double>();
    tokens += batch.num_targets;
  }
  student_->train();
  return {ce / tokens, tvd / tokens};
}

double TieFraction(const at::Tensor& p, const at::Tensor& q, const at::Tensor& targets,
                   int64_t ignore_index, int64_t real_vocab) {
  torch::NoGradGuard no_grad;
  const at::Tensor rows = targets.ne(ignore_index);
  const at::Tensor pr = p.index({rows}).narrow(-1, 0, real_vocab);
  const at::Tensor qr = q.index({rows}).narrow(-1, 0, real_vocab);
  if (pr.numel() == 0) return 0.0;
  return pr.eq(qr).sum().item<double>() / static_cast<double>(pr.numel());
}

WeightDiff CompareWeights(distill::Model& a, distill::Model& b) {
  torch::NoGradGuard no_grad;
  WeightDiff d;
  auto other = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    const at::Tensor x = item.value().to(at::kDouble), y = other[item.key()].to(at::kDouble);
    d.max_abs = std::max(d.max_abs, (x - y).abs().max().item<double>());
    d.max_weight = std::max(d.max_weight, x.abs().max().item<double>());
  }
  return d;
}

Csv::Csv(const std::string& path, const std::vector<std::string>& columns)
    : out_(path), columns_(columns.size()) {
  if (!out_) throw std::runtime_error("cannot write " + path);
  for (size_t i = 0; i < columns.size(); ++i) out_ << (i ? "," : "") << columns[i];
  out_ << "\n";
}

void Csv::Row(const std::vector<double>& values) {
  if (values.size() != columns_) throw std::logic_error("Csv::Row: wrong number of values");
  for (size_t i = 0; i < values.size(); ++i)
    out_ << (i ? "," : "") << fmt::format("{:.9g}", values[i]);
  out_ << "\n";
  out_.flush();
}

bool Checks::Expect(bool condition, const std::string& what) {
  std::printf("  [%s] %s\n", condition ? "ok" : "FAIL", what.c_str());
  failed_ = failed_ || !condition;
  return condition;
}

int Checks::Finish(const std::string& name) const {
  std::printf("%s %s\n", failed_ ? "FAIL" : "PASS", name.c_str());
  std::fflush(stdout);
  return failed_ ? 1 : 0;
}

}  // namespace convergence

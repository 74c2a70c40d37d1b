// train.cuda_graph (distill::StepGraph): a step replayed from a CUDA graph gives the eager step's
// losses, gradient norms and weights, for both model families, pretraining and distillation
// (the logits path and the fused one), fp32 and bf16; the graph's .grad bookkeeping survives a
// caller that resets or replaces gradients; a micro-batch that cannot be captured (a host sync)
// falls back to eager launches with a warning and the same result. Where it cannot be used, the
// setting is refused with the reason. The CUDA tests skip (GTEST_SKIP) without a GPU.
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "distill/step_graph.h"
#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

using ::testing::HasSubstr;
using testing::MakeTeacher;
using testing::TempRunDir;
using testing::TinyConfig;

struct Case {
  std::string name;
  ModelFamily family;
  Mode mode;
  Precision precision;
  FusedLinear fused_linear;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class StepGraphTrainer : public ::testing::TestWithParam<Case> {};

// The same run with and without the graph: the warm-up steps (eager), the capture step and
// replayed steps give the same loss terms and gradient norms, and the same weights after them.
// Not bit for bit by contract (the side stream's cuBLAS workspace may pick another algorithm),
// so within 1e-5 relative (fp32) / 1e-3 (bf16); a graph that missed the micro-batch's input,
// the scale or a gradient would be off by orders of magnitude more.
TEST_P(StepGraphTrainer, ReplayedStepsMatchEagerSteps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Case& k = GetParam();
  const std::string dir = TempRunDir();
  Config c = TinyConfig(dir);
  c.student.family = c.teacher.family = k.family;
  c.train.device = "cuda";
  c.train.precision = k.precision;
  c.train.grad_accum = 2;
  c.train.steps = 8;
  c.optim.grad_clip = 0.5;  // clipping active: its scale multiplies the graph's gradients
  if (k.mode == Mode::kDistill) {
    c.teacher.checkpoint = MakeTeacher(c, dir + "-teacher", 3);
    c.train.mode = Mode::kDistill;
    c.distill.ce_weight = 0.5;
    c.distill.fused_linear = k.fused_linear;
  }
  Config eager_config = c;
  eager_config.train.cuda_graph = CudaGraph::kOff;
  eager_config.train.out_dir = dir + "-eager";
  c.train.cuda_graph = CudaGraph::kOn;
  Trainer graphed(c, RunOptions::Quiet());
  Trainer eager(eager_config, RunOptions::Quiet());
  const double rtol = k.precision == Precision::kFp32 ? 1e-5 : 1e-3;
  auto near = [&](double a, double b) { return std::abs(a - b) <= 1e-7 + rtol * std::abs(b); };
  for (int step = 1; step <= 6; ++step) {
    const StepResult g = graphed.Step();
    const StepResult e = eager.Step();
    EXPECT_TRUE(near(g.loss, e.loss)) << "step " << step << ": " << g.loss << " vs " << e.loss;
    EXPECT_TRUE(near(g.kd_loss, e.kd_loss)) << "step " << step;
    EXPECT_TRUE(near(g.ce_loss, e.ce_loss)) << "step " << step;
    EXPECT_TRUE(near(g.grad_norm, e.grad_norm))
        << "step " << step << ": " << g.grad_norm << " vs " << e.grad_norm;
    EXPECT_EQ(g.tokens, e.tokens);
  }
  EXPECT_TRUE(graphed.cuda_graph_captured());
  EXPECT_FALSE(eager.cuda_graph_captured());
  EXPECT_TRUE(graphed.warnings().empty()) << graphed.warnings().front();
  const auto gp = graphed.student().parameters(), ep = eager.student().parameters();
  ASSERT_EQ(gp.size(), ep.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    EXPECT_TRUE(at::allclose(gp[i], ep[i], rtol, 1e-6)) << "parameter " << i;
  }
  // Evaluation (eager, on the caller's stream) sees the trained weights.
  EXPECT_NEAR(graphed.Evaluate().val_loss, eager.Evaluate().val_loss,
              1e-6 + rtol * eager.Evaluate().val_loss);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, StepGraphTrainer,
    ::testing::Values(Case{"GptPretrainFp32", ModelFamily::kGpt, Mode::kPretrain, Precision::kFp32,
                           FusedLinear::kAuto},
                      Case{"GptDistillBf16Fused", ModelFamily::kGpt, Mode::kDistill,
                           Precision::kBf16, FusedLinear::kOn},
                      Case{"LlamaDistillBf16Logits", ModelFamily::kLlama, Mode::kDistill,
                           Precision::kBf16, FusedLinear::kOff},
                      Case{"LlamaDistillFp32Fused", ModelFamily::kLlama, Mode::kDistill,
                           Precision::kFp32, FusedLinear::kOn}),
    CaseName);

// StepGraph on its own: a one-weight "model", loss sum(w * x) per micro-batch.
struct Toy {
  at::Tensor w =
      at::full({4}, 0.5, at::TensorOptions(at::kCUDA).dtype(at::kFloat)).requires_grad_(true);
  bool sync = false;  // read a device value on the host in the micro-batch (cannot be captured)

  StepGraph::MicroBatch Body() {
    return [this](const at::Tensor& inputs, const at::Tensor& /*targets*/, const at::Tensor& scale,
                  at::Tensor& kd, at::Tensor& ce) {
      const at::Tensor loss = (w * inputs.to(at::kFloat)).sum();
      if (sync && loss.item<double>() < -1e30) return;
      (loss * scale).backward();
      kd += loss.detach();
      ce += 2 * loss.detach();
    };
  }
};

// `rows` rows of [v, v + 1, v + 2, v + 3] + 4 * row: one row's sum(w * x) is 0.5 * (4v + 6).
Batch ToyBatch(int64_t v, int64_t rows = 1) {
  Batch b;
  b.inputs = (at::arange(4 * rows, at::kLong) + v).view({rows, 4});
  b.targets = b.inputs.clone();
  b.num_targets = 4 * rows;
  return b;
}

TEST(StepGraph, ReplaysEachMicroBatchWithItsOwnInputsAndScale) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Toy toy;
  StepGraph graph(at::kCUDA, {toy.w}, /*warmup_calls=*/1);
  for (int call = 0; call < 4; ++call) {
    if (toy.w.grad().defined()) toy.w.mutable_grad().zero_();  // as Step zeroes: in place
    const double scale = 0.25 * (call + 1);
    const auto [kd, ce] = graph.Accumulate({ToyBatch(1), ToyBatch(3)}, scale, toy.Body());
    // sum(w * x) over both micro-batches: 0.5 * (10 + 18); d/dw = scale * (x1 + x2).
    EXPECT_DOUBLE_EQ(kd.item<double>(), 14.0) << "call " << call;
    EXPECT_DOUBLE_EQ(ce.item<double>(), 28.0) << "call " << call;
    const at::Tensor want =
        (at::arange(4, at::kFloat) * 2 + 4).mul(scale).to(at::kCUDA);  // x1 + x2 = 2j + 4
    EXPECT_TRUE(at::allclose(toy.w.grad(), want)) << "call " << call << ": " << toy.w.grad();
    EXPECT_EQ(graph.captured(), call >= 1) << "call " << call;
  }
  EXPECT_FALSE(graph.TakeWarning());
}

// The graph adds into the .grad tensors it captured: a caller that resets them (set_to_none) or
// assigns another tensor still gets the sum of what it had and this call's gradient.
TEST(StepGraph, GradientsReplacedByTheCallerAreCarriedOver) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Toy toy;
  StepGraph graph(at::kCUDA, {toy.w}, /*warmup_calls=*/1);
  graph.Accumulate({ToyBatch(0)}, 1.0, toy.Body());  // eager
  graph.Accumulate({ToyBatch(0)}, 1.0, toy.Body());  // captured, replayed
  ASSERT_TRUE(graph.captured());
  const at::Tensor x0 = at::arange(4, at::kFloat).to(at::kCUDA);
  EXPECT_TRUE(at::allclose(toy.w.grad(), 2 * x0));

  toy.w.mutable_grad() = at::Tensor();
  graph.Accumulate({ToyBatch(0)}, 1.0, toy.Body());
  EXPECT_TRUE(at::allclose(toy.w.grad(), x0)) << toy.w.grad();

  toy.w.mutable_grad() = at::full({4}, 10.0, x0.options());
  graph.Accumulate({ToyBatch(0)}, 1.0, toy.Body());
  EXPECT_TRUE(at::allclose(toy.w.grad(), x0 + 10)) << toy.w.grad();

  // Another shape runs eagerly beside the graph, into the same gradient.
  graph.Accumulate({ToyBatch(0, /*rows=*/2)}, 0.0, toy.Body());
  EXPECT_TRUE(at::allclose(toy.w.grad(), x0 + 10)) << toy.w.grad();
  EXPECT_TRUE(graph.captured());
  EXPECT_FALSE(graph.TakeWarning());
}

TEST(StepGraph, AMicroBatchThatSyncsFallsBackToEagerWithAWarning) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Toy toy;
  toy.sync = true;
  StepGraph graph(at::kCUDA, {toy.w}, /*warmup_calls=*/1);
  for (int call = 0; call < 3; ++call) {
    if (toy.w.grad().defined()) toy.w.mutable_grad().zero_();
    const auto [kd, ce] = graph.Accumulate({ToyBatch(1)}, 1.0, toy.Body());
    EXPECT_DOUBLE_EQ(kd.item<double>(), 5.0) << "call " << call;
    EXPECT_TRUE(at::allclose(toy.w.grad(), at::arange(4, at::kFloat).to(at::kCUDA) + 1))
        << "call " << call;
    EXPECT_FALSE(graph.captured());
    const auto warning = graph.TakeWarning();
    if (call == 1) {
      ASSERT_TRUE(warning);
      EXPECT_THAT(*warning, HasSubstr("train.cuda_graph: capturing a micro-batch failed"));
      EXPECT_THAT(*warning, HasSubstr("the run goes on without the CUDA graph"));
    } else {
      EXPECT_FALSE(warning) << *warning;
    }
  }
  // The stream, the allocator and the random generator are usable afterwards (a generator left
  // in capture mode would throw on the first random op).
  EXPECT_TRUE(at::allclose((toy.w * 2).sum().cpu(), at::scalar_tensor(4.0)));
  const at::Tensor kept = at::dropout(at::ones({1000}, toy.w.options()), 0.5, /*train=*/true);
  EXPECT_GT(kept.ne(0).sum().item<int64_t>(), 300);
  // A second StepGraph captures (and replays) normally after the failed one.
  Toy fine;
  StepGraph next(at::kCUDA, {fine.w}, /*warmup_calls=*/1);
  for (int call = 0; call < 3; ++call) {
    if (fine.w.grad().defined()) fine.w.mutable_grad().zero_();
    EXPECT_DOUBLE_EQ(next.Accumulate({ToyBatch(1)}, 1.0, fine.Body()).first.item<double>(), 5.0);
  }
  EXPECT_TRUE(next.captured());
  EXPECT_FALSE(next.TakeWarning());
}

// Dropout in a replayed graph draws new masks every replay (ATen's CUDAGraph registers the
// default generator and advances its offset per replay), as eager launches do.
TEST(StepGraph, DropoutMasksDifferFromReplayToReplay) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Toy toy;
  StepGraph graph(at::kCUDA, {toy.w}, /*warmup_calls=*/1);
  // The first 20 entries of a 64-element dropout mask as a number, per call.
  StepGraph::MicroBatch masks = [&](const at::Tensor& inputs, const at::Tensor&,
                                    const at::Tensor& scale, at::Tensor& kd, at::Tensor&) {
    const at::Tensor kept =
        at::dropout(at::ones({64}, inputs.options().dtype(at::kFloat)), 0.5, /*train=*/true).ne(0);
    const at::Tensor bits = at::pow(2.0, at::arange(20, kept.options().dtype(at::kFloat)));
    const at::Tensor loss = (toy.w * inputs.to(at::kFloat)).sum();
    (loss * scale).backward();
    kd.add_((kept.narrow(0, 0, 20).to(at::kFloat) * bits).sum());
  };
  std::vector<double> seen;
  for (int call = 0; call < 5; ++call) {
    if (toy.w.grad().defined()) toy.w.mutable_grad().zero_();
    seen.push_back(graph.Accumulate({ToyBatch(1)}, 1.0, masks).first.item<double>());
  }
  EXPECT_TRUE(graph.captured());
  // Calls 1-4 are replays: 2^20 possible masks, four draws all equal only if the offset is stuck.
  EXPECT_FALSE(seen[1] == seen[2] && seen[2] == seen[3] && seen[3] == seen[4])
      << seen[1] << " " << seen[2] << " " << seen[3] << " " << seen[4];
}

TEST(StepGraph, AParameterWhoseStorageChangedEndsTheGraph) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Toy toy;
  StepGraph graph(at::kCUDA, {toy.w}, /*warmup_calls=*/1);
  graph.Accumulate({ToyBatch(1)}, 1.0, toy.Body());
  graph.Accumulate({ToyBatch(1)}, 1.0, toy.Body());
  ASSERT_TRUE(graph.captured());
  {
    at::NoGradGuard no_grad;
    toy.w.set_data(at::full({4}, 1.0, toy.w.options()));  // new storage: the graph reads the old
  }
  toy.w.mutable_grad() = at::Tensor();
  const auto [kd, ce] = graph.Accumulate({ToyBatch(1)}, 1.0, toy.Body());
  EXPECT_DOUBLE_EQ(kd.item<double>(), 10.0);  // sum(1 * [1, 2, 3, 4])
  EXPECT_FALSE(graph.captured());
  const auto warning = graph.TakeWarning();
  ASSERT_TRUE(warning);
  EXPECT_THAT(*warning, HasSubstr("a parameter's storage changed"));
}

// Where a graph cannot be used, true is refused with the reason (auto quietly means off).
TEST(StepGraphConfig, TrueIsRefusedOnTheCpu) {
  Config c = TinyConfig(TempRunDir());
  try {
    ParseConfig(ConfigToYaml(c), "run.yaml", {"train.device=cpu", "train.cuda_graph=true"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.cuda_graph: expected auto or false with train.device "
                                    "cpu (CUDA graphs need CUDA), got true"));
  }
  if (torch::cuda::is_available()) return;
  c.train.device = "auto";  // resolves to the CPU here
  c.train.cuda_graph = CudaGraph::kOn;
  try {
    Trainer trainer(c, RunOptions::Quiet());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.cuda_graph: expected auto or false on the CPU"));
  }
  c.train.cuda_graph = CudaGraph::kAuto;
  Trainer trainer(c, RunOptions::Quiet());
  EXPECT_FALSE(trainer.cuda_graph_captured());
  EXPECT_TRUE(std::isfinite(trainer.Step().loss));
}

}  // namespace
}  // namespace distill

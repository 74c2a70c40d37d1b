// World size 1 through the real machinery -- TCPStore rendezvous, ProcessGroupNCCL, bucketed
// all-reduce -- in this process, as `torchrun --nproc-per-node 1` would set it up. Skipped
// (GTEST_SKIP) without CUDA. The multi-GPU comparison is scripts/ddp_device.sh.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "distill/distributed.h"
#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

// A TCP port that was free a moment ago (the kernel's pick for port 0).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 29500;
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// One process group for the whole test program (NCCL communicators are per process), made by
// the first test that needs it and shut down by the environment below when the tests are done:
// still inside main, while CUDA is alive. Left to exit(), NCCL's watchdog thread outlives CUDA's
// teardown, and the process crashed after all tests had passed (seen on an H200, 1 run in 3).
Distributed* g_world_of_one = nullptr;

Distributed& WorldOfOne() {
  if (g_world_of_one == nullptr) {
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
    ::setenv("LOCAL_RANK", "0", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(FreePort()).c_str(), 1);
    ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");  // rank 0 hosts the store
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    g_world_of_one = Distributed::FromEnvironment().release();
  }
  return *g_world_of_one;
}

class ShutDownWorldOfOne : public ::testing::Environment {
 public:
  void TearDown() override {
    delete g_world_of_one;  // ~Distributed shuts the NCCL process group down
    g_world_of_one = nullptr;
  }
};
[[maybe_unused]] ::testing::Environment* const kShutDown =
    ::testing::AddGlobalTestEnvironment(new ShutDownWorldOfOne);

TEST(DistributedCudaTest, WorldOfOneCollectives) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Distributed& dist = WorldOfOne();
  ASSERT_TRUE(dist.active());
  EXPECT_EQ(dist.world_size(), 1);
  EXPECT_TRUE(dist.device().is_cuda());
  EXPECT_EQ(dist.AllReduceSum(int64_t{1} << 40), int64_t{1} << 40);
  EXPECT_EQ(dist.AllReduceSum(std::vector<double>{0.25, -3}), (std::vector<double>{0.25, -3}));
  dist.Barrier();

  // Many small buckets (a 1 KB cap) through NCCL round-trip every gradient exactly (a sum of
  // one), those started during the backward and the one Finish starts (the first parameter,
  // which the loss does not use: its bucket is the last).
  std::vector<at::Tensor> params;
  for (int64_t n : {7, 300, 1, 1000, 64}) {
    params.push_back(at::randn({n}, at::TensorOptions(dist.device())).set_requires_grad(true));
  }
  GradReducer reducer(params, 1024, dist);
  EXPECT_GE(reducer.buckets().size(), 3u);
  for (bool last : {false, true}) {
    reducer.BeginBackward(last);
    at::Tensor loss = at::zeros({}, at::TensorOptions(dist.device()));
    for (size_t i = 1; i < params.size(); ++i) loss = loss + (params[i] * params[i]).sum();
    loss.backward();
  }
  std::vector<at::Tensor> before;
  for (const auto& p : params)
    before.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  reducer.Finish();
  EXPECT_EQ(reducer.started_during_backward(), int64_t(reducer.buckets().size()) - 1);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i].grad(), before[i]));
}

// The same 20-step distillation (fp32, grad_accum 2) without and with the process group.
// World 1 gets the same micro-batches and an all-reduce that sums one term, so only
// nondeterministic CUDA kernels (atomics) can make them differ: ~1e-7 relative per step in
// fp32. Tolerance, written down: every step's loss and gradient norm within 1e-4 relative, the
// final weights within 1e-4 of the largest weight.
TEST(DistributedCudaTest, WorldOfOneMatchesThePlainRun) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Distributed& dist = WorldOfOne();
  ASSERT_TRUE(dist.active());
  Config c = testing::TinyDistillConfig(testing::TempRunDir());
  c.train.device = "cuda";
  c.train.grad_accum = 2;
  c.train.steps = 20;

  Trainer plain(c, RunOptions::Quiet());
  Config dc = c;
  dc.train.out_dir += "-ddp";
  // (A pointer: the resume below needs the run directory, which this trainer holds until gone.)
  auto ddp_owner = std::make_unique<Trainer>(dc, RunOptions::Quiet(/*fresh=*/true, &dist));
  Trainer& ddp = *ddp_owner;
  ASSERT_EQ(ddp.device(), dist.device());
  for (int64_t step = 0; step < c.train.steps; ++step) {
    const StepResult a = plain.Step(), b = ddp.Step();
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_NEAR(b.loss, a.loss, 1e-4 * std::abs(a.loss)) << "step " << step;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-4 * a.grad_norm) << "step " << step;
  }
  const at::Tensor wa = plain.student().lm_head_weight(), wb = ddp.student().lm_head_weight();
  EXPECT_LE((wa - wb).abs().max().item<double>(), 1e-4 * wa.abs().max().item<double>());
  const EvalResult ea = plain.Evaluate(), eb = ddp.Evaluate();
  EXPECT_NEAR(eb.val_loss, ea.val_loss, 1e-4 * ea.val_loss);
  EXPECT_NEAR(eb.val_kd, ea.val_kd, 1e-4 * ea.val_kd);
  EXPECT_EQ(eb.tokens, ea.tokens);

  // Rank 0 writes the run: a checkpoint, and resuming it continues on the same weights.
  ddp.SaveCheckpoint();
  ASSERT_TRUE(LatestCheckpoint(dc.train.out_dir).has_value());
  ddp_owner.reset();
  Config longer = dc;
  longer.train.steps = 22;
  Trainer resumed(longer, RunOptions::Quiet(/*fresh=*/false, &dist));
  EXPECT_EQ(resumed.step(), 20);
  EXPECT_TRUE(at::equal(resumed.student().lm_head_weight(), wb));
  resumed.Train();
  EXPECT_EQ(resumed.step(), 22);
  EXPECT_TRUE(std::filesystem::exists(dc.train.out_dir + "/metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(dc.train.out_dir + "/summary.json"));
}

}  // namespace
}  // namespace distill

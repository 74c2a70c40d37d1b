// Data-parallel pieces that run on a CPU: torchrun's environment (parsing and every error),
// the launch checks, the sharding of the global batch (world N sees exactly world 1's batch),
// the gradient buckets, the no-op single process, and -- simulated in one process -- that
// per-rank gradients normalised by the global token count sum to the one-process gradient.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "distill/distributed.h"
#include "distill/trainer.h"
#include "test_util.h"

namespace distill {
namespace {

using Env = std::map<std::string, std::string>;

LaunchEnv Parse(const Env& env) {
  return ParseLaunchEnv([&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// The message of the DistributedError `f` throws ("" when it does not throw).
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const DistributedError& e) {
    return e.what();
  }
  return "";
}

Env Torchrun(int rank, int world) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RESTART_COUNT", "0"}};
}

TEST(DistributedEnvTest, WithoutWorldSizeItIsNotLaunched) {
  const LaunchEnv env = Parse({{"RANK", "3"}, {"MASTER_PORT", "x"}});  // ignored without WORLD_SIZE
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
}

TEST(DistributedEnvTest, ReadsWhatTorchrunSets) {
  Env vars = Torchrun(1, 2);
  vars["TORCHELASTIC_RESTART_COUNT"] = "3";
  const LaunchEnv env = Parse(vars);
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 3);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(Parse(vars).agent_store);  // rank 0 hosts the store
  vars.erase("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_FALSE(Parse(vars).agent_store);
}

TEST(DistributedEnvTest, ErrorsNameTheVariable) {
  Env vars = Torchrun(0, 2);
  vars.erase("RANK");
  EXPECT_NE(ErrorOf([&] { Parse(vars); }).find("WORLD_SIZE=2 is set but RANK is not"),
            std::string::npos);
  vars = Torchrun(0, 2);
  vars["RANK"] = "2";
  EXPECT_NE(ErrorOf([&] { Parse(vars); }).find("RANK=\"2\": expected an integer in [0, 1]"),
            std::string::npos);
  vars = Torchrun(0, 2);
  vars["WORLD_SIZE"] = "0";
  EXPECT_NE(ErrorOf([&] { Parse(vars); }).find("WORLD_SIZE=\"0\": expected an integer"),
            std::string::npos);
  vars = Torchrun(0, 2);
  vars["MASTER_PORT"] = "29500x";
  EXPECT_NE(ErrorOf([&] { Parse(vars); }).find("MASTER_PORT=\"29500x\""), std::string::npos);
  vars = Torchrun(0, 2);
  vars.erase("MASTER_ADDR");
  EXPECT_NE(ErrorOf([&] { Parse(vars); }).find("MASTER_ADDR is not"), std::string::npos);
  vars = Torchrun(0, 2);
  vars.erase("LOCAL_RANK");  // required when there are several ranks
  EXPECT_NE(ErrorOf([&] { Parse(vars); }).find("LOCAL_RANK is not"), std::string::npos);
  vars = Torchrun(0, 1);
  vars.erase("LOCAL_RANK");  // optional for one rank
  EXPECT_EQ(Parse(vars).local_rank, 0);
}

TEST(DistributedEnvTest, LaunchChecks) {
  EXPECT_FALSE(NeedsProcessGroup(Parse({}), false, 0));  // no torchrun: plain process
  EXPECT_FALSE(NeedsProcessGroup(Parse({}), true, 8));
  EXPECT_FALSE(NeedsProcessGroup(Parse(Torchrun(0, 1)), false, 0));  // world 1 on a CPU
  EXPECT_TRUE(NeedsProcessGroup(Parse(Torchrun(0, 1)), true, 1));    // world 1 through NCCL
  EXPECT_TRUE(NeedsProcessGroup(Parse(Torchrun(1, 2)), true, 2));
  const std::string no_cuda = ErrorOf([&] { NeedsProcessGroup(Parse(Torchrun(0, 2)), false, 0); });
  EXPECT_EQ(no_cuda.rfind("data-parallel needs CUDA and NCCL; WORLD_SIZE=2 but no CUDA device", 0),
            0u)
      << no_cuda;
  const std::string few = ErrorOf([&] { NeedsProcessGroup(Parse(Torchrun(1, 2)), true, 1); });
  EXPECT_NE(few.find("LOCAL_RANK=1 but only 1 CUDA device(s) are visible"), std::string::npos)
      << few;
}

// Every world size that divides grad_accum gives each index of world 1's global batch to
// exactly one rank, in contiguous blocks, for any data position.
TEST(DistributedShardTest, RanksTogetherSeeTheOneProcessBatch) {
  for (int64_t position : {0, 8, 1000}) {
    for (int64_t accum : {1, 2, 4, 8, 12}) {
      const std::vector<int64_t> one = RankMicroBatches(position, accum, 0, 1);
      std::vector<int64_t> expected(accum);
      std::iota(expected.begin(), expected.end(), position);
      ASSERT_EQ(one, expected);
      for (int world : {2, 3, 4, 8}) {
        if (accum % world != 0) continue;
        std::vector<int64_t> all;
        for (int r = 0; r < world; ++r) {
          const auto mine = RankMicroBatches(position, accum, r, world);
          EXPECT_EQ(static_cast<int64_t>(mine.size()), accum / world);
          all.insert(all.end(), mine.begin(), mine.end());
        }
        EXPECT_EQ(all, one) << "position " << position << " accum " << accum << " world " << world;
      }
    }
  }
  const std::string message = ErrorOf([] { RankMicroBatches(0, 3, 0, 2); });
  EXPECT_NE(message.find("train.grad_accum=3 is not a multiple of WORLD_SIZE=2"), std::string::npos)
      << message;
}

// configs/ddp.yaml (scripts/ddp_device.sh) parses, and its global batch splits over 1 and 2 GPUs.
TEST(DistributedShardTest, ShippedDdpConfigSplitsOverOneAndTwoGpus) {
  const Config c = LoadConfigFile(std::string(DISTILL_CONFIGS_DIR) + "/ddp.yaml");
  for (int world : {1, 2, 4}) {
    EXPECT_NO_THROW(RankMicroBatches(0, c.train.grad_accum, world - 1, world)) << world;
  }
  EXPECT_EQ(c.train.precision, Precision::kBf16);
}

TEST(DistributedShardTest, EvalBatchesArePartitioned) {
  for (int world : {1, 2, 3, 16}) {
    std::vector<int64_t> all;
    for (int r = 0; r < world; ++r) {
      const auto mine = RankEvalBatches(8, r, world);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    EXPECT_EQ(all, RankEvalBatches(8, 0, 1)) << world;
  }
  EXPECT_EQ(RankEvalBatches(8, 0, 1).size(), 8u);
}

TEST(DistributedBucketTest, ConsecutiveSameDtypeUnderTheCap) {
  const auto f = at::TensorOptions().dtype(at::kFloat);
  // 4-byte floats: 10 + 10 + 30 + 5 elements, then a double, then 100 floats (over the cap).
  const std::vector<at::Tensor> t = {at::zeros({10}, f),
                                     at::zeros({2, 5}, f),
                                     at::zeros({30}, f),
                                     at::zeros({5}, f),
                                     at::zeros({3}, f.dtype(at::kDouble)),
                                     at::zeros({100}, f),
                                     at::zeros({1}, f)};
  const auto buckets = Buckets(t, 160);  // 40 floats
  const std::vector<std::vector<size_t>> expected = {{0, 1}, {2, 3}, {4}, {5}, {6}};
  EXPECT_EQ(buckets, expected);
  EXPECT_EQ(Buckets(t, int64_t{1} << 30).size(), 3u);  // split only by dtype
  EXPECT_TRUE(Buckets({}, 100).empty());
}

TEST(DistributedNoOpTest, SingleProcessChangesNothing) {
  Distributed single;
  EXPECT_FALSE(single.active());
  EXPECT_TRUE(single.is_main());
  EXPECT_EQ(single.world_size(), 1);
  EXPECT_EQ(single.AllReduceSum(int64_t{42}), 42);
  EXPECT_EQ(single.AllReduceSum(std::vector<double>{1.5, -2}), (std::vector<double>{1.5, -2}));
  EXPECT_TRUE(single.MainDecides([] { return true; }));
  EXPECT_FALSE(single.MainDecides([] { return false; }));
  EXPECT_THROW(single.MainDecides([]() -> bool { throw std::runtime_error("x"); }),
               std::runtime_error);
  at::Tensor t = at::full({3}, 2.0);
  single.AllReduceSumAsync(t)();  // nothing to sum with: the tensor as it is
  EXPECT_TRUE(at::equal(t, at::full({3}, 2.0)));
  single.Barrier();

  ::unsetenv("WORLD_SIZE");
  EXPECT_FALSE(Distributed::FromEnvironment()->active());  // no torchrun: today's behaviour
}

// torchrun --nproc-per-node 1 on a machine without CUDA: one plain process, not an error.
TEST(DistributedNoOpTest, WorldOneWithoutCudaRunsAsOneProcess) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA present: this would join NCCL";
  for (const auto& [name, value] : Torchrun(0, 1)) ::setenv(name.c_str(), value.c_str(), 1);
  const auto dist = Distributed::FromEnvironment();
  for (const auto& entry : Torchrun(0, 1)) ::unsetenv(entry.first.c_str());
  EXPECT_FALSE(dist->active());
}

// Two "ranks" simulated in one process: each accumulates its share of a 4-micro-batch global
// batch, normalised by the global token count; the sum of their gradients is the one-process
// gradient up to float rounding (1e-5 of the largest entry, as the gradient accumulation test),
// and so are the summed losses. Normalising by each rank's own count instead (the naive DDP
// average) must be detectably different, or this test proves nothing.
TEST(DistributedShardTest, RankGradientsSumToTheOneProcessGradient) {
  Config c = testing::TinyDistillConfig(testing::TempRunDir());
  c.train.grad_accum = 4;
  Trainer trainer(c, RunOptions::Quiet());
  auto batches_of = [&](int rank, int world) {
    std::vector<Batch> batches;
    for (int64_t i : RankMicroBatches(0, 4, rank, world))
      batches.push_back(trainer.data().TrainBatch(i));
    return batches;
  };
  auto& opt = trainer.optimizer();
  opt.zero_grad(true);
  const StepResult whole = trainer.AccumulateGradients(batches_of(0, 1));
  const auto g_whole = testing::Grads(trainer.student());

  StepResult summed;
  std::vector<at::Tensor> g_sum, g_naive;
  for (int r = 0; r < 2; ++r) {
    opt.zero_grad(true);
    const StepResult part = trainer.AccumulateGradients(batches_of(r, 2), whole.tokens);
    summed.kd_loss += part.kd_loss;
    summed.ce_loss += part.ce_loss;
    const auto g = testing::Grads(trainer.student());
    opt.zero_grad(true);
    trainer.AccumulateGradients(batches_of(r, 2));  // normalised by its own tokens
    const auto own = testing::Grads(trainer.student());
    for (size_t i = 0; i < g.size(); ++i) {
      if (r == 0) {
        g_sum.push_back(g[i]);
        g_naive.push_back(0.5 * own[i]);
      } else {
        g_sum[i] = g_sum[i] + g[i];
        g_naive[i] = g_naive[i] + 0.5 * own[i];
      }
    }
  }
  EXPECT_NEAR(summed.kd_loss, whole.kd_loss, 1e-6 * whole.kd_loss);
  EXPECT_NEAR(summed.ce_loss, whole.ce_loss, 1e-6 * whole.ce_loss);
  double scale = 0, diff = 0, naive_diff = 0;
  for (size_t i = 0; i < g_whole.size(); ++i) {
    scale = std::max(scale, g_whole[i].abs().max().item<double>());
    diff = std::max(diff, (g_whole[i] - g_sum[i]).abs().max().item<double>());
    naive_diff = std::max(naive_diff, (g_whole[i] - g_naive[i]).abs().max().item<double>());
  }
  ASSERT_GT(scale, 0);
  EXPECT_LE(diff, 1e-5 * scale);
  EXPECT_GT(naive_diff, 100 * 1e-5 * scale) << "per-rank normalisation is indistinguishable";
}

// Passing the no-op group explicitly is the same run as passing none (bit-identical on CPU).
// A sum over ranks between threads: the k-th call of every rank meets the k-th of the others
// (NCCL's all-reduce, as the trainer calls it). A rank that never joins is an error after 20 s,
// not a hang of the test.
class ThreadSums {
 public:
  explicit ThreadSums(int size) : size_(size) {}
  SumOverRanks For(int rank) {
    return [this, rank, next = std::make_shared<int64_t>(0)](const std::vector<int64_t>& v) {
      const int64_t seq = (*next)++;
      std::unique_lock<std::mutex> lock(mutex_);
      Op& op = ops_[seq];
      if (op.sum.empty()) op.sum.assign(v.size(), 0);
      for (size_t i = 0; i < v.size(); ++i) op.sum[i] += v[i];
      if (++op.arrived == size_) cv_.notify_all();
      if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return op.arrived == size_; }))
        throw std::runtime_error("rank " + std::to_string(rank) + ": a rank never joined");
      return op.sum;
    };
  }

 private:
  struct Op {
    std::vector<int64_t> sum;
    int arrived = 0;
  };
  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Op> ops_;
};

// Runs `body(rank, sum)` on `world` threads; returns each rank's error message ("" for none).
std::vector<std::string> OnRanks(int world,
                                 const std::function<void(int, const SumOverRanks&)>& body) {
  ThreadSums sums(world);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, sums.For(r));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// A start that fails on one rank stops every rank at the agreement, each with a message: the
// failed rank its own, the others naming it. Before, only rank 0's failures reached the others,
// and rank 0 went on to commit the run directory (a deletion with --fresh) while another rank
// had failed (found by a review).
TEST(DistributedAgreementTest, AFailureOnAnyRankStopsEveryRank) {
  for (const int failing : {-1, 0, 2}) {
    std::vector<int> after(4, 0);
    const auto errors = OnRanks(4, [&](int rank, const SumOverRanks& sum) {
      EveryRankOrThrow(rank, 4, sum, [&] {
        if (rank == failing) throw std::runtime_error("data.path: no such file");
      });
      after[static_cast<size_t>(rank)] = 1;  // what would go on to the commit
    });
    for (int r = 0; r < 4; ++r) {
      if (failing < 0) {
        EXPECT_EQ(errors[r], "");
        EXPECT_EQ(after[r], 1);
      } else if (r == failing) {
        EXPECT_EQ(errors[r], "data.path: no such file");
      } else {
        EXPECT_EQ(errors[r], fmt::format("rank {}: rank {} failed to start (the error is printed "
                                         "by the rank that failed); nothing was written",
                                         r, failing));
        EXPECT_EQ(after[r], 0) << "rank " << r << " went on";
      }
    }
  }
  const auto two = OnRanks(3, [&](int rank, const SumOverRanks& sum) {
    EveryRankOrThrow(rank, 3, sum, [&] {
      if (rank > 0) throw std::runtime_error("out of memory");
    });
  });
  EXPECT_EQ(two[0],
            "rank 0: ranks 1 and 2 failed to start (the error is printed by the rank that "
            "failed); nothing was written");
}

// Ranks that would resume from different places (a train.out_dir that is not shared, a
// checkpoint one rank could not read) all stop, the differing rank naming both positions.
TEST(DistributedAgreementTest, RanksThatWouldResumeFromDifferentStepsAllStop) {
  const auto describe = [](const std::vector<int64_t>& own, const std::vector<int64_t>& main) {
    return fmt::format("step {} where rank 0 has {}", own[0], main[0]);
  };
  const auto same = OnRanks(3, [&](int rank, const SumOverRanks& sum) {
    CheckSameOnEveryRank(rank, 3, sum, {40, 123456789012345, 0, 100}, describe);
  });
  EXPECT_EQ(same, std::vector<std::string>(3, ""));
  const auto differ = OnRanks(3, [&](int rank, const SumOverRanks& sum) {
    CheckSameOnEveryRank(rank, 3, sum, {rank == 2 ? 0 : 40, 7, 0, 100}, describe);
  });
  EXPECT_EQ(differ[2], "rank 2: step 0 where rank 0 has 40");
  EXPECT_EQ(differ[0],
            "rank 0: rank 2 differs from rank 0 (its error says how); nothing was written");
  EXPECT_EQ(differ[1],
            "rank 1: rank 2 differs from rank 0 (its error says how); nothing was written");
  const auto two = OnRanks(3, [&](int rank, const SumOverRanks& sum) {
    CheckSameOnEveryRank(rank, 3, sum, {rank, 7}, describe);
  });
  EXPECT_EQ(two[0],
            "rank 0: ranks 1 and 2 differ from rank 0 (their errors say how); nothing was written");
  // One process agrees with itself, and its work runs as it is.
  Distributed single;
  bool ran = false;
  single.EveryRankOrThrow([&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_NO_THROW(single.CheckSameOnEveryRank({1, 2}, describe));
}

TEST(DistributedNoOpTest, TrainerWithTheNoOpGroupIsUnchanged) {
  Config c = testing::TinyConfig(testing::TempRunDir());
  c.train.steps = 5;
  c.train.grad_accum = 2;
  Trainer plain(c, RunOptions::Quiet());
  plain.Train();
  Distributed single;
  c.train.out_dir += "-noop";
  Trainer with_group(c, RunOptions::Quiet(/*fresh=*/true, &single));
  with_group.Train();
  EXPECT_TRUE(at::equal(plain.student().lm_head_weight(), with_group.student().lm_head_weight()));
}

}  // namespace
}  // namespace distill

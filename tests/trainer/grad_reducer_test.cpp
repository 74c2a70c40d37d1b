// The data-parallel gradient reducer on the CPU: two ranks simulated by two threads, each with
// its own replica of a small network and its own data, sharing an in-process all-reduce that
// checks that every rank starts the same sums in the same order. NCCL is the same interface
// (distill::Distributed), run by distill_distributed_cuda_test and scripts/ddp_device.sh.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/variable.h>

#include "distill/grad_reducer.h"

namespace distill {
namespace {

// An all-reduce (sum) between threads. The k-th sum a rank starts meets the k-th of every other
// rank; they must be the same size (a rank-dependent bucket order would break that, and with
// NCCL hang or corrupt the gradients).
class LocalWorld {
 public:
  explicit LocalWorld(int size) : size_(size) {}

  class Rank : public GradientCommunicator {
   public:
    Rank(LocalWorld& world, int rank) : world_(world), rank_(rank) {}
    std::function<void()> AllReduceSumAsync(at::Tensor flat) override {
      const int64_t seq = next_++;
      sizes.push_back(flat.numel());
      world_.Contribute(seq, rank_, flat);
      return [this, seq] { world_.Wait(seq); };
    }
    std::vector<int64_t> sizes;  // of every sum this rank started, in order

   private:
    LocalWorld& world_;
    int rank_;
    int64_t next_ = 0;
  };

  bool mismatch() const { return mismatch_; }

 private:
  struct Op {
    std::vector<at::Tensor> parts;
    int arrived = 0;
    bool done = false;
  };
  void Contribute(int64_t seq, int rank, const at::Tensor& flat) {
    std::lock_guard<std::mutex> lock(mutex_);
    Op& op = ops_[seq];
    op.parts.resize(size_);
    op.parts[rank] = flat;
    if (++op.arrived < size_) return;
    at::Tensor sum = op.parts[0].clone();  // in rank order: deterministic
    for (int r = 1; r < size_; ++r) {
      if (op.parts[r].numel() != sum.numel()) {
        mismatch_ = true;
      } else {
        sum += op.parts[r];
      }
    }
    if (!mismatch_)
      for (auto& p : op.parts) p.copy_(sum);
    op.done = true;
    cv_.notify_all();
  }
  void Wait(int64_t seq) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return ops_[seq].done; }))
      throw std::runtime_error("all-reduce " + std::to_string(seq) + ": a rank never joined");
  }

  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Op> ops_;
  bool mismatch_ = false;
};

// A small network as plain parameters: an unused one first (its bucket is the last), a frozen
// one, then three layers.
struct Net {
  std::vector<at::Tensor> params;  // unused, frozen, w1, b1, w2, b2, w3
  explicit Net(const std::vector<at::Tensor>& init) {
    for (size_t i = 0; i < init.size(); ++i)
      params.push_back(init[i].clone().set_requires_grad(i != 1));
  }
  at::Tensor Loss(const at::Tensor& x) const {
    const auto& p = params;
    at::Tensor h = at::tanh(at::matmul(x, p[2]) + p[3]);
    h = at::tanh(at::matmul(h, p[4]) + p[5]);
    return at::matmul(h, p[6]).pow(2).sum();
  }
};

std::vector<at::Tensor> InitialWeights() {
  at::manual_seed(7);
  return {at::randn({5}),      at::randn({3}),  at::randn({16, 32}), at::randn({32}),
          at::randn({32, 32}), at::randn({32}), at::randn({32, 8})};
}

constexpr int kRanks = 2, kMicroBatches = 2;

// inputs[r][m]: rank r's micro-batch m.
std::vector<std::vector<at::Tensor>> Inputs() {
  at::manual_seed(11);
  std::vector<std::vector<at::Tensor>> x(kRanks);
  for (auto& rank : x)
    for (int m = 0; m < kMicroBatches; ++m) rank.push_back(at::randn({4, 16}));
  return x;
}

TEST(GradReducerTest, TwoRanksSumTheirGradientsStartedDuringTheLastBackward) {
  const auto init = InitialWeights();
  const auto inputs = Inputs();
  // The reference: each rank's accumulated gradient on its own, summed in rank order.
  std::vector<at::Tensor> want;
  for (int r = 0; r < kRanks; ++r) {
    Net net(init);
    for (const auto& x : inputs[r]) net.Loss(x).backward();
    for (size_t i = 0; i < net.params.size(); ++i) {
      const at::Tensor g =
          net.params[i].grad().defined() ? net.params[i].grad() : at::zeros_like(init[i]);
      if (r == 0) {
        want.push_back(g.clone());
      } else {
        want[i] += g;
      }
    }
  }

  LocalWorld world(kRanks);
  std::vector<std::unique_ptr<LocalWorld::Rank>> comms;
  std::vector<Net> nets;
  for (int r = 0; r < kRanks; ++r) {
    comms.push_back(std::make_unique<LocalWorld::Rank>(world, r));
    nets.emplace_back(init);
  }
  const int64_t cap = 32 * 32 * 4;  // 4 KiB: w2 alone, the rest in a few buckets
  std::vector<int64_t> started_after_first(kRanks), started_in_backward(kRanks);
  std::vector<std::vector<std::vector<size_t>>> buckets(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        GradReducer reducer(nets[r].params, cap, *comms[r]);
        buckets[r] = reducer.buckets();
        for (int m = 0; m < kMicroBatches; ++m) {
          reducer.BeginBackward(/*last=*/m + 1 == kMicroBatches);
          nets[r].Loss(inputs[r][m]).backward();
          if (m == 0) started_after_first[r] = static_cast<int64_t>(comms[r]->sizes.size());
        }
        started_in_backward[r] = static_cast<int64_t>(comms[r]->sizes.size());
        reducer.Finish();
        EXPECT_EQ(reducer.started_during_backward(), started_in_backward[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  EXPECT_FALSE(world.mismatch()) << "the ranks started different sums";

  // Buckets: reverse parameter order (w3 first), the unused parameter's last; the frozen one
  // in none; at most `cap` bytes unless a parameter alone is larger.
  const auto& b = buckets[0];
  EXPECT_EQ(buckets[1], b);
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b.front().front(), 5u);  // indices into the hooked parameters: w3 is the 6th
  EXPECT_EQ(b.back().back(), 0u);    // the unused one
  std::vector<int64_t> bucket_numels;
  for (const auto& bucket : b) {
    int64_t numel = 0;
    for (size_t i : bucket) numel += init[i == 0 ? 0 : i + 1].numel();  // skip the frozen one
    EXPECT_TRUE(numel * 4 <= cap || bucket.size() == 1) << numel;
    bucket_numels.push_back(numel);
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(comms[r]->sizes, bucket_numels) << "rank " << r << ": one sum per bucket, in order";
    EXPECT_EQ(started_after_first[r], 0) << "the first micro-batch's backward only accumulates";
    EXPECT_EQ(started_in_backward[r], int64_t(b.size()) - 1)
        << "every bucket but the unused parameter's starts during the last backward";
  }

  // Every rank holds the sum; the unused parameter a zero gradient; the frozen one none.
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < init.size(); ++i) {
      const at::Tensor& g = nets[r].params[i].grad();
      if (i == 1) {
        EXPECT_FALSE(g.defined());
        continue;
      }
      ASSERT_TRUE(g.defined()) << "rank " << r << " parameter " << i;
      EXPECT_TRUE(at::allclose(g, want[i], 1e-6, 1e-7)) << "rank " << r << " parameter " << i;
    }
    EXPECT_TRUE(nets[r].params[0].grad().eq(0).all().item<bool>());
  }
}

TEST(GradReducerTest, StepsRepeatAndFinishAloneSumsWhatIsThere) {
  LocalWorld world(1);
  LocalWorld::Rank comm(world, 0);
  Net net(InitialWeights());
  GradReducer reducer(net.params, 1 << 20, comm);
  const auto x = Inputs()[0];
  for (int step = 0; step < 3; ++step) {  // a sum of one: the gradient of the step itself
    for (auto& p : net.params) p.mutable_grad() = at::Tensor();
    reducer.BeginBackward(true);
    net.Loss(x[step % kMicroBatches]).backward();
    const at::Tensor before = net.params[6].grad().clone();
    reducer.Finish();
    EXPECT_TRUE(at::equal(net.params[6].grad(), before)) << "step " << step;
  }
  // A last backward whose sums are never collected: the next step refuses to begin.
  reducer.BeginBackward(true);
  net.Loss(x[0]).backward();
  EXPECT_THROW(reducer.BeginBackward(false), std::logic_error);
  reducer.Finish();
  // No backward marked last (say, a step without micro-batches): Finish sums the gradients as
  // they are.
  net.params[2].mutable_grad() = at::ones_like(net.params[2]);
  reducer.Finish();
  EXPECT_TRUE(net.params[2].grad().eq(1).all().item<bool>());
}

TEST(GradReducerTest, HooksAreRemovedWithTheReducerAndNeverDoubled) {
  LocalWorld world(1);
  LocalWorld::Rank comm(world, 0);
  Net net(InitialWeights());
  {
    GradReducer reducer(net.params, 1 << 20, comm);
    EXPECT_NE(torch::autograd::impl::post_acc_grad_hooks(net.params[2]), nullptr);
    EXPECT_THROW(GradReducer(net.params, 1 << 20, comm), std::invalid_argument);
    // The failed second reducer left the first one's hooks in place.
    EXPECT_NE(torch::autograd::impl::post_acc_grad_hooks(net.params[2]), nullptr);
  }
  for (size_t i = 0; i < net.params.size(); ++i) {
    if (i != 1) {
      EXPECT_EQ(torch::autograd::impl::post_acc_grad_hooks(net.params[i]), nullptr);
    }
  }
  net.Loss(Inputs()[0][0]).backward();  // no hook into a destroyed reducer
  EXPECT_TRUE(comm.sizes.empty());
  EXPECT_THROW(GradReducer(net.params, 0, comm), std::invalid_argument);
}

}  // namespace
}  // namespace distill

#include "distill/distributed.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include "distributed_nccl.h"

namespace distill {

namespace {

// "NAME": an integer in [lo, hi], or the error that says so.
int IntVariable(const std::string& name, const std::string& value, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || parsed < lo || parsed > hi) {
    throw DistributedError(fmt::format(
        "{}=\"{}\": expected an integer in [{}, {}] (torchrun sets it; launch with torchrun "
        "--no-python --nproc-per-node N distill_trainer ..., or unset WORLD_SIZE for one "
        "process)",
        name, value, lo, hi));
  }
  return static_cast<int>(parsed);
}

std::string Required(const EnvLookup& lookup, const std::string& name, int world_size) {
  auto value = lookup(name);
  if (!value) {
    throw DistributedError(fmt::format(
        "WORLD_SIZE={} is set but {} is not; launch with torchrun --no-python --nproc-per-node N "
        "distill_trainer ..., or unset WORLD_SIZE to run one plain process",
        world_size, name));
  }
  return *value;
}

// Flattens tensors[i] for i in `bucket` into one 1-D tensor.
at::Tensor Flatten(const std::vector<at::Tensor>& tensors, const std::vector<size_t>& bucket) {
  std::vector<at::Tensor> flat;
  flat.reserve(bucket.size());
  for (size_t i : bucket) flat.push_back(tensors[i].reshape({-1}));
  return flat.size() == 1 ? flat[0].clone() : at::cat(flat);
}

void Unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors,
               const std::vector<size_t>& bucket) {
  int64_t offset = 0;
  for (size_t i : bucket) {
    const int64_t n = tensors[i].numel();
    tensors[i].copy_(flat.narrow(0, offset, n).view_as(tensors[i]));
    offset += n;
  }
}

}  // namespace

LaunchEnv ParseLaunchEnv(const EnvLookup& lookup) {
  LaunchEnv env;
  const auto world = lookup("WORLD_SIZE");
  if (!world) return env;
  env.launched = true;
  env.world_size = IntVariable("WORLD_SIZE", *world, 1, 1 << 20);
  env.rank = IntVariable("RANK", Required(lookup, "RANK", env.world_size), 0, env.world_size - 1);
  const auto local = lookup("LOCAL_RANK");
  if (local || env.world_size > 1) {
    env.local_rank = IntVariable("LOCAL_RANK", Required(lookup, "LOCAL_RANK", env.world_size), 0,
                                 env.world_size - 1);
  }
  env.master_addr = Required(lookup, "MASTER_ADDR", env.world_size);
  if (env.master_addr.empty()) {
    throw DistributedError(
        "MASTER_ADDR is empty; it must name the host of rank 0 (torchrun sets "
        "it, 127.0.0.1 on one machine)");
  }
  env.master_port =
      IntVariable("MASTER_PORT", Required(lookup, "MASTER_PORT", env.world_size), 1, 65535);
  env.agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (auto restarts = lookup("TORCHELASTIC_RESTART_COUNT")) {
    env.restart_count = IntVariable("TORCHELASTIC_RESTART_COUNT", *restarts, 0, 1 << 20);
  }
  return env;
}

LaunchEnv ParseLaunchEnv() {
  return ParseLaunchEnv([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

bool NeedsProcessGroup(const LaunchEnv& env, bool cuda_available, int cuda_device_count) {
  if (!env.launched) return false;
  if (!cuda_available) {
    if (env.world_size == 1) return false;
    throw DistributedError(fmt::format(
        "data-parallel needs CUDA and NCCL; WORLD_SIZE={} but no CUDA device is available (this "
        "LibTorch has no Gloo, so CPU processes cannot communicate); run distill_trainer "
        "without torchrun to train on the CPU",
        env.world_size));
  }
  if (env.local_rank >= cuda_device_count) {
    throw DistributedError(fmt::format(
        "LOCAL_RANK={} but only {} CUDA device(s) are visible; use --nproc-per-node <= {} or "
        "check CUDA_VISIBLE_DEVICES",
        env.local_rank, cuda_device_count, cuda_device_count));
  }
  return true;
}

std::vector<int64_t> RankMicroBatches(int64_t data_position, int64_t grad_accum, int rank,
                                      int world_size) {
  if (grad_accum % world_size != 0) {
    throw DistributedError(fmt::format(
        "train.grad_accum={} is not a multiple of WORLD_SIZE={}: the global batch "
        "(grad_accum micro-batches of data.batch_size) is split into equal shares per rank; set "
        "train.grad_accum to a multiple of {} (the same global batch as one GPU with that "
        "grad_accum)",
        grad_accum, world_size, world_size));
  }
  const int64_t share = grad_accum / world_size;
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < share; ++i) indices.push_back(data_position + rank * share + i);
  return indices;
}

std::vector<int64_t> RankEvalBatches(int64_t eval_batches, int rank, int world_size) {
  std::vector<int64_t> indices;
  for (int64_t j = rank; j < eval_batches; j += world_size) indices.push_back(j);
  return indices;
}

std::vector<std::vector<size_t>> Buckets(const std::vector<at::Tensor>& tensors,
                                         int64_t cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    const bool fits = !buckets.empty() && bytes + size <= cap_bytes &&
                      tensors[buckets.back().front()].scalar_type() == t.scalar_type() &&
                      tensors[buckets.back().front()].device() == t.device();
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += size;
  }
  return buckets;
}

struct Distributed::Group {
  internal::NcclGroup nccl;
};

Distributed::Distributed() = default;

Distributed::Distributed(const LaunchEnv& env, std::chrono::seconds collective_timeout)
    : env_(env) {
  group_ = std::make_unique<Group>();
  group_->nccl = internal::ConnectNccl(env_, collective_timeout);
}

Distributed::~Distributed() {
  if (!group_) return;
  try {
    group_->nccl.backend->shutdown();  // destroys the communicators cleanly (no abort warning)
  } catch (...) {
    // Shutting down is best effort; the process is ending.
  }
}

std::unique_ptr<Distributed> Distributed::FromEnvironment(std::chrono::seconds collective_timeout) {
  const LaunchEnv env = ParseLaunchEnv();
  if (!env.launched) return std::make_unique<Distributed>();
  const bool cuda = torch::cuda::is_available();
  if (!NeedsProcessGroup(env, cuda, cuda ? static_cast<int>(torch::cuda::device_count()) : 0)) {
    std::fprintf(stderr,
                 "distill_trainer: WORLD_SIZE=1 without CUDA: running as one plain process (no "
                 "NCCL)\n");
    return std::make_unique<Distributed>();
  }
  return std::make_unique<Distributed>(env, collective_timeout);
}

c10::Device Distributed::device() const {
  if (!active()) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env_.local_rank));
}

void Distributed::BroadcastParameters(torch::nn::Module& module) {
  if (!active()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors = module.parameters();
  for (const auto& b : module.buffers()) tensors.push_back(b);
  for (const auto& bucket : Buckets(tensors, bucket_bytes_)) {
    std::vector<at::Tensor> flat{Flatten(tensors, bucket)};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    group_->nccl.backend->broadcast(flat, options)->wait();
    Unflatten(flat[0], tensors, bucket);
  }
}

std::function<void()> Distributed::AllReduceSumAsync(at::Tensor flat) {
  if (!active()) return [] {};
  std::vector<at::Tensor> tensors{std::move(flat)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  c10::intrusive_ptr<c10d::Work> work = group_->nccl.backend->allreduce(tensors, options);
  return [work] { work->wait(); };  // the current stream waits for NCCL's; the host does not
}

int64_t Distributed::AllReduceSum(int64_t value) {
  if (!active()) return value;
  std::vector<at::Tensor> t{at::full({1}, value, at::TensorOptions(device()).dtype(at::kLong))};
  group_->nccl.backend->allreduce(t)->wait();
  return t[0].item<int64_t>();
}

std::vector<double> Distributed::AllReduceSum(const std::vector<double>& values) {
  if (!active() || values.empty()) return values;
  std::vector<at::Tensor> t{
      at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(device())};
  group_->nccl.backend->allreduce(t)->wait();
  const at::Tensor host = t[0].cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

void Distributed::Barrier() { AllReduceSum(int64_t{0}); }

namespace {

// "rank 1", "ranks 1 and 3", "ranks 1, 2 and 5" for the ranks whose entry is non-zero.
std::string RanksNamed(const std::vector<int64_t>& flags) {
  std::vector<std::string> ranks;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] != 0) ranks.push_back(std::to_string(r));
  }
  if (ranks.size() == 1) return "rank " + ranks.front();
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += ranks[i] + (i + 2 < ranks.size() ? ", " : i + 2 == ranks.size() ? " and " : "");
  }
  return out;
}

}  // namespace

void EveryRankOrThrow(int rank, int world_size, const SumOverRanks& sum,
                      const std::function<void()>& work) {
  std::exception_ptr failure;
  try {
    work();
  } catch (...) {
    failure = std::current_exception();
  }
  std::vector<int64_t> failed(static_cast<size_t>(world_size), 0);
  failed[static_cast<size_t>(rank)] = failure ? 1 : 0;
  failed = sum(failed);
  if (failure) std::rethrow_exception(failure);
  if (std::any_of(failed.begin(), failed.end(), [](int64_t f) { return f != 0; })) {
    throw DistributedError(fmt::format(
        "rank {}: {} failed to start (the error is printed by the rank that failed); nothing was "
        "written",
        rank, RanksNamed(failed)));
  }
}

void CheckSameOnEveryRank(
    int rank, int world_size, const SumOverRanks& sum, const std::vector<int64_t>& values,
    const std::function<std::string(const std::vector<int64_t>& own,
                                    const std::vector<int64_t>& main)>& describe) {
  // Rank 0's values to every rank (the others add zeros), then which ranks differ.
  const std::vector<int64_t> main =
      sum(rank == 0 ? values : std::vector<int64_t>(values.size(), 0));
  std::vector<int64_t> differs(static_cast<size_t>(world_size), 0);
  differs[static_cast<size_t>(rank)] = values != main ? 1 : 0;
  differs = sum(differs);
  if (values != main)
    throw DistributedError(fmt::format("rank {}: {}", rank, describe(values, main)));
  if (std::any_of(differs.begin(), differs.end(), [](int64_t d) { return d != 0; })) {
    const bool one =
        std::count_if(differs.begin(), differs.end(), [](int64_t d) { return d != 0; }) == 1;
    throw DistributedError(fmt::format("rank {}: {} {} from rank 0 ({} how); nothing was written",
                                       rank, RanksNamed(differs), one ? "differs" : "differ",
                                       one ? "its error says" : "their errors say"));
  }
}

void Distributed::EveryRankOrThrow(const std::function<void()>& work) {
  if (!active()) return work();
  distill::EveryRankOrThrow(
      rank(), world_size(), [this](const std::vector<int64_t>& v) { return AllReduceSumInts(v); },
      work);
}

void Distributed::CheckSameOnEveryRank(
    const std::vector<int64_t>& values,
    const std::function<std::string(const std::vector<int64_t>& own,
                                    const std::vector<int64_t>& main)>& describe) {
  if (!active()) return;
  distill::CheckSameOnEveryRank(
      rank(), world_size(), [this](const std::vector<int64_t>& v) { return AllReduceSumInts(v); },
      values, describe);
}

std::vector<int64_t> Distributed::AllReduceSumInts(const std::vector<int64_t>& values) {
  std::vector<at::Tensor> t{at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device())};
  group_->nccl.backend->allreduce(t)->wait();
  const at::Tensor host = t[0].cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

bool Distributed::MainDecides(const std::function<bool()>& decide) {
  if (!active()) return decide();
  // 0 / 1: the decision; 2: rank 0 failed.
  int64_t outcome = 0;
  std::exception_ptr failure;
  if (is_main()) {
    try {
      outcome = decide() ? 1 : 0;
    } catch (...) {
      failure = std::current_exception();
      outcome = 2;
    }
  }
  outcome = AllReduceSum(outcome);  // only rank 0 contributes
  if (failure) std::rethrow_exception(failure);
  if (outcome == 2) {
    throw DistributedError(fmt::format(
        "rank {}: rank 0 failed to prepare the run (its error is printed by rank 0)", rank()));
  }
  return outcome == 1;
}

}  // namespace distill

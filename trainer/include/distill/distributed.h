// Data-parallel training over c10d + NCCL, for processes launched by torchrun:
//
//   torchrun --no-python --nproc-per-node N distill_trainer --config ...
//
// torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (and, with its elastic
// agent, TORCHELASTIC_USE_AGENT_STORE=True: the agent already hosts the TCPStore, so every rank
// connects as a client). Rank r drives cuda:LOCAL_RANK. Without WORLD_SIZE in the environment
// the process is a plain single process and every method below is a no-op (today's behaviour).
//
// The contract the trainer relies on: each rank computes gradients of its own micro-batches,
// scaled by 1 / (global count of non-ignored target tokens); a GradReducer (grad_reducer.h)
// sums them during the last backward through AllReduceSumAsync, so
// every rank holds the gradient the one-process run computes for the whole global batch, and
// identical optimizer steps keep the replicas identical.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "distill/grad_reducer.h"

namespace torch::nn {
class Module;
}

namespace distill {

// A launch or communication problem, phrased as what to change.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Sums `values` elementwise over every rank: each rank calls it with as many values, in the
// same order of calls (an NCCL all-reduce; threads in the tests).
using SumOverRanks = std::function<std::vector<int64_t>(const std::vector<int64_t>&)>;

// Runs `work` on this rank, then learns whether it succeeded on every rank. A rank whose work
// threw rethrows its error; the others throw a DistributedError naming the ranks that failed
// (each prints its own error), instead of going on to a collective that would wait for them
// forever, or to rank 0's commit of the run directory (a deletion with --fresh) when the start
// failed elsewhere.
void EveryRankOrThrow(int rank, int world_size, const SumOverRanks& sum,
                      const std::function<void()>& work);

// Checks that every rank holds rank 0's `values`. Where any rank differs, every rank throws a
// DistributedError: a differing rank's says `describe(its values, rank 0's)`, the others' name
// the ranks that differ.
void CheckSameOnEveryRank(
    int rank, int world_size, const SumOverRanks& sum, const std::vector<int64_t>& values,
    const std::function<std::string(const std::vector<int64_t>& own,
                                    const std::vector<int64_t>& main)>& describe);

// What torchrun put in the environment.
struct LaunchEnv {
  bool launched = false;  // WORLD_SIZE is set: started by torchrun (or by hand, the same way)
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // the CUDA device index on this host
  std::string master_addr;  // the rendezvous TCPStore's host
  int master_port = 0;
  bool agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True: all ranks are clients
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT: namespaces the store's keys
};

// Looks a variable up; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Parses and validates the launch variables. Not launched (WORLD_SIZE unset): the defaults.
// Throws DistributedError naming the variable, its value and what was expected (e.g. RANK
// missing, RANK >= WORLD_SIZE, a non-numeric MASTER_PORT). LOCAL_RANK may be omitted only when
// WORLD_SIZE is 1.
LaunchEnv ParseLaunchEnv(const EnvLookup& lookup);
LaunchEnv ParseLaunchEnv();  // the process environment

// Whether this launch gets a process group. false: run as one plain process (not launched, or
// WORLD_SIZE=1 on a machine without CUDA). Throws DistributedError when it cannot work:
// WORLD_SIZE > 1 without CUDA (this LibTorch has no Gloo, so CPU ranks cannot communicate), or
// LOCAL_RANK beyond the visible CUDA devices.
bool NeedsProcessGroup(const LaunchEnv& env, bool cuda_available, int cuda_device_count);

// The training micro-batch indices rank `rank` of `world_size` processes for the optimizer step
// that starts at `data_position` with `grad_accum` micro-batches in the global batch: a
// contiguous block of grad_accum / world_size indices. Over all ranks these are exactly the
// one-process run's indices [data_position, data_position + grad_accum), each once, so the
// global batch is the same whatever the world size. Throws DistributedError (naming
// train.grad_accum) unless world_size divides grad_accum.
std::vector<int64_t> RankMicroBatches(int64_t data_position, int64_t grad_accum, int rank,
                                      int world_size);
// The validation batch indices of rank `rank`: j in [0, eval_batches) with j % world_size ==
// rank (some ranks may get none; the sums are all-reduced).
std::vector<int64_t> RankEvalBatches(int64_t eval_batches, int rank, int world_size);

// Groups `tensors` (in order) into buckets of consecutive indices of one dtype and device with at
// most `cap_bytes` bytes each; a tensor larger than the cap gets a bucket of its own.
std::vector<std::vector<size_t>> Buckets(const std::vector<at::Tensor>& tensors, int64_t cap_bytes);

class Distributed : public GradientCommunicator {
 public:
  // The no-op single process: rank 0 of 1.
  Distributed();
  // Joins the process group described by `env` (NeedsProcessGroup must be true): sets the CUDA
  // device to LOCAL_RANK, connects to the TCPStore (rank 0 hosts it unless the agent does), and
  // creates the NCCL process group, whose collectives wait at most `collective_timeout` for the
  // other ranks (then NCCL's watchdog ends the process). Throws DistributedError / c10::Error.
  explicit Distributed(const LaunchEnv& env,
                       std::chrono::seconds collective_timeout = std::chrono::minutes(10));
  ~Distributed() override;
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  // From the process environment: the no-op without torchrun, else a process group (with a note
  // on stderr when WORLD_SIZE=1 has no CUDA and runs as a plain process).
  static std::unique_ptr<Distributed> FromEnvironment(
      std::chrono::seconds collective_timeout = std::chrono::minutes(10));

  bool active() const { return group_ != nullptr; }  // a process group exists
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  bool is_main() const { return env_.rank == 0; }  // writes logs, checkpoints, the run dir
  // cuda:LOCAL_RANK when active. Undefined (CPU) otherwise: the trainer resolves train.device.
  c10::Device device() const;

  // Copies rank 0's parameters and buffers into every rank's `module` (bucketed broadcasts).
  void BroadcastParameters(torch::nn::Module& module);
  // GradientCommunicator: one asynchronous NCCL all-reduce (sum) of `flat`; the returned
  // function makes the current CUDA stream wait for it. The trainer's GradReducer calls it from
  // the backward pass. Not active: nothing to sum (returns a no-op).
  std::function<void()> AllReduceSumAsync(at::Tensor flat) override;
  int64_t AllReduceSum(int64_t value);
  std::vector<double> AllReduceSum(const std::vector<double>& values);
  void Barrier();

  // Runs `decide` on rank 0 and gives its result to every rank (others do not run it). When it
  // throws on rank 0, rank 0 rethrows and the other ranks throw a DistributedError that points
  // at rank 0's message, instead of waiting forever.
  bool MainDecides(const std::function<bool()>& decide);
  // EveryRankOrThrow and CheckSameOnEveryRank over this process group (not active: `work` runs
  // as it is, and one process always agrees with itself).
  void EveryRankOrThrow(const std::function<void()>& work);
  void CheckSameOnEveryRank(
      const std::vector<int64_t>& values,
      const std::function<std::string(const std::vector<int64_t>& own,
                                      const std::vector<int64_t>& main)>& describe);

  // Bucket size of BroadcastParameters.
  int64_t bucket_bytes() const { return bucket_bytes_; }
  void set_bucket_bytes(int64_t bytes) { bucket_bytes_ = bytes; }

 private:
  std::vector<int64_t> AllReduceSumInts(const std::vector<int64_t>& values);  // active only
  struct Group;  // the store and the NCCL backend (c10d types stay out of this header)
  LaunchEnv env_;
  std::unique_ptr<Group> group_;
  int64_t bucket_bytes_ = 25 << 20;  // 25 MiB, as torch DDP
};

}  // namespace distill

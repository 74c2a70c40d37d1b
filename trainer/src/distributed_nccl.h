// The one place that includes ProcessGroupNCCL.hpp (it needs nccl.h and the CUDA runtime
// headers, which the CPU-only parts of the trainer do not). Internal to the distill library.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "distill/distributed.h"

namespace distill::internal {

struct NcclGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

// Sets the current CUDA device to env.local_rank, connects to the TCPStore at
// MASTER_ADDR:MASTER_PORT (rank 0 hosts it unless env.agent_store), and creates the NCCL
// process group under the prefix "distill/attempt_<restart_count>/", its collectives' timeout
// `collective_timeout`. Throws DistributedError when this build has no NCCL headers or the store
// cannot be reached.
NcclGroup ConnectNccl(const LaunchEnv& env, std::chrono::seconds collective_timeout);

}  // namespace distill::internal

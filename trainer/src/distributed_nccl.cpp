#include "distributed_nccl.h"

#include <fmt/format.h>

#if DISTILL_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace distill::internal {

#if DISTILL_WITH_NCCL

NcclGroup ConnectNccl(const LaunchEnv& env, std::chrono::seconds collective_timeout) {
  // NCCL binds a communicator to the current device when its first collective runs.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));

  // As torch.distributed's env:// rendezvous: under torchrun's agent every rank is a client of
  // the agent's store; otherwise rank 0 hosts it (multi-tenant, waiting for all workers).
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = !env.agent_store && env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.multiTenant = true;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format(
        "rank {}: cannot {} the rendezvous store at MASTER_ADDR={} MASTER_PORT={} ({}); check "
        "that every rank got the same address and port and that the port is free",
        env.rank, options.isServer ? "host" : "reach", env.master_addr, env.master_port, e.what()));
  }
  // Keys of an elastic restart must not meet the previous attempt's.
  NcclGroup group;
  group.store = c10::make_intrusive<c10d::PrefixStore>(
      fmt::format("distill/attempt_{}/", env.restart_count), tcp);
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = collective_timeout;  // train.collective_timeout_s
  group.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(group.store, env.rank, env.world_size,
                                                              nccl_options);
  return group;
}

#else

NcclGroup ConnectNccl(const LaunchEnv&, std::chrono::seconds) {
  throw DistributedError(
      "data-parallel needs CUDA and NCCL, but distill_trainer was built without the NCCL / CUDA "
      "runtime headers (nccl.h, cuda_runtime_api.h); install them (e.g. the nvidia-nccl and CUDA "
      "runtime wheels beside torch) and rebuild, or run without torchrun");
}

#endif

}  // namespace distill::internal

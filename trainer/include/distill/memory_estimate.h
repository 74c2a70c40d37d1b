// The memory a resolved config needs, estimated before anything is allocated, and the check at
// start-up that refuses a config that cannot fit on its device (issue 17). Not a profiler: the
// terms are what the trainer certainly holds (exact for parameters, gradients and AdamW state;
// rough, on the low side, for activations and the loss's copies of the logits), so that a
// refused config is one that cannot run, not one that might.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "distill/config.h"

namespace distill {

// A config that needs more memory than its device has (distill_trainer exits 1; the message
// names the keys that drive the estimate and --no-memory-check).
class MemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MemoryTerm {
  std::string what;  // "student parameters, gradients and AdamW state (1.2M parameters)"
  double bytes = 0;
  std::string keys;  // the config keys that drive it: "student.n_layer, student.d_model, ..."
};

struct MemoryEstimate {
  std::string stage;  // the pipeline stage that needs most ("teacher pretraining"), or ""
  std::vector<MemoryTerm> terms;
  double total() const;
};

// What the device has: free memory on a CUDA device, physical memory (or a cgroup's limit,
// whichever is smaller) for the CPU. `bytes` < 0: unknown (the check is skipped).
struct AvailableMemory {
  double bytes = -1;
  std::string source;  // "physical memory of cpu (/proc/meminfo MemTotal)", ...
};

// The parameters MakeModel(config) builds (every family in models/), computed from the config
// alone: exact (tests/trainer/memory_estimate_test.cpp checks it against built models) while
// below 2^53.
double ParameterCount(const ModelConfig& config);

// Of those, the matmul operands StoreMatmulWeightsAs converts (models/factory.cpp): every linear
// layer's weight and bias and an untied lm_head; not the embeddings and norms. The estimate
// counts them at 2 B for a frozen teacher under bf16 on CUDA, where the trainer stores them so.
double MatmulParameterCount(const ModelConfig& config);

// The estimate of one training run of `config` on a device of kind `device_type` (bf16 autocast
// only happens on CUDA), per rank of `world_size` data-parallel ranks (each holds a whole
// replica, its micro-batches of the same size, and the gradient buckets). A pipeline (run.h
// IsPipeline) is estimated stage by stage and the stage that needs most is returned.
MemoryEstimate EstimateMemory(const Config& config, c10::DeviceType device_type,
                              int world_size = 1);

// Free memory of `device` (CUDA: cudaMemGetInfo through c10's device allocator) or physical
// memory (CPU: /proc/meminfo MemTotal, else sysconf; capped by CgroupMemoryLimit).
AvailableMemory DeviceMemory(const c10::Device& device);

// The smallest memory limit that applies to this process (cgroup v2's memory.max, v1's
// memory.limit_in_bytes): of the hierarchy's root as mounted (a container's own group), and of
// the process's group in /proc/self/cgroup and every group above it. `bytes` < 0: none.
// `root`: a prefix for every path read (tests build a tree there).
AvailableMemory CgroupMemoryLimit(const std::string& root = "");

// "memory estimate: 12.3 MiB on cpu (...terms...); 23.5 GiB physical memory of cpu (...)".
std::string FormatEstimate(const MemoryEstimate& estimate, const c10::Device& device,
                           const AvailableMemory& available);

// Throws MemoryError when the estimate exceeds `available` (unknown availability passes). The
// message gives the total, each term with its keys (largest first), what is available and where
// that number came from, and the override.
void CheckMemoryFits(const MemoryEstimate& estimate, const c10::Device& device,
                     const AvailableMemory& available);

// An allocation that failed: c10's OutOfMemoryError (CUDA's caching allocator); the CPU
// allocator's refusal, which c10 raises as a plain enforce failure; or a device allocation outside
// the caching allocator (CUDA's runtime, cuBLAS, cuSOLVER or cuDNN reporting its own failure).
bool IsOutOfMemory(const c10::Error& e);

// The message for an allocation that failed in a training step of `config` (IsOutOfMemory):
// `what`, the allocator's own words (how much it asked for, what was free), then what needs less
// memory for this config: the switches a run resumes with (train.activation_checkpointing where
// the trained models have no dropout, and distill.fused_linear in distill mode), each named only
// where this run has it off (`cuda`: whether the run's device is CUDA, where distill.fused_linear
// auto is on), and a smaller data.batch_size with a larger train.grad_accum (the same batch; a
// new run). `command`: the config of the command this run is a stage of (a pipeline's), which
// the overrides go to; activation checkpointing is named only where it accepts that too.
std::string OutOfMemoryMessage(const std::string& what, const Config& config, bool cuda,
                               const Config& command);

}  // namespace distill

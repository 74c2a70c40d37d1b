// Checkpoints: one file per save, <run>/checkpoints/step_NNNNNNN.pt, holding the model, the
// optimizer (AdamW moments and step counts), the step, the data position (micro-batches
// consumed), the RNG states and the model's architecture. Written to a temporary file and then
// renamed, so a crash never leaves a truncated checkpoint under the final name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/optim/optimizer.h>

#include "distill/model.h"

namespace distill {

struct TrainingPosition {
  int64_t step = 0;           // optimizer steps done
  int64_t data_position = 0;  // training micro-batches consumed
};

// Saves atomically to `path`; the RNG states saved are the default generators of the CPU and,
// when `device` is CUDA, of that device.
void SaveCheckpoint(const std::string& path, const CausalLM& model,
                    const torch::optim::Optimizer& optimizer, const TrainingPosition& position,
                    const at::Device& device);

// Restores everything SaveCheckpoint wrote (also the RNG states). Throws std::runtime_error
// when the checkpoint's architecture differs from `model`'s.
TrainingPosition LoadCheckpoint(const std::string& path, CausalLM& model,
                                torch::optim::Optimizer& optimizer, const at::Device& device);

// Loads only the weights (the teacher). `path`: a checkpoint file, or a run directory whose
// latest checkpoint is used. Returns the file loaded.
std::string LoadWeights(const std::string& path, CausalLM& model, const at::Device& device);

// The newest checkpoint in <run_dir>/checkpoints, if any.
std::optional<std::string> LatestCheckpoint(const std::string& run_dir);
// <run_dir>/checkpoints/step_NNNNNNN.pt
std::string CheckpointPath(const std::string& run_dir, int64_t step);
// Deletes all but the newest `keep` checkpoints of `run_dir`.
void PruneCheckpoints(const std::string& run_dir, int64_t keep);

}  // namespace distill

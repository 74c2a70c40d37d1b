// Checkpoints: one file per save, <run>/checkpoints/step_NNNNNNN.pt, holding the model, the
// optimizer (AdamW moments and step counts), the step, the data position (micro-batches
// consumed), the RNG states, the model's architecture and the run's identity hash. Written to a
// temporary file and then renamed, so a crash never leaves a truncated checkpoint under the
// final name.
//
// File format: "DISTILL-CKPT-1\n", 16 hex digits of the 64-bit FNV-1a of the rest, "\n", then
// torch's archive (a zip). The checksum is verified before anything is loaded: a flipped byte or
// a truncated file is a CorruptCheckpointError naming the file. Checkpoints written before the
// header (a bare zip) still load, unverified.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "distill/model.h"

namespace distill {

// The checkpoint file is damaged or unreadable (checksum mismatch, truncated, not a checkpoint).
class CorruptCheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainingPosition {
  int64_t step = 0;           // optimizer steps done
  int64_t data_position = 0;  // training micro-batches consumed
  double elapsed_s = 0;       // training seconds up to this step, over every attempt of the run
  int64_t skipped_steps = 0;  // steps whose update train.nonfinite=skip skipped, over the run
  std::string data_files;     // DataSource::Files() of the data trained on ("" before it was kept)
  // WeightsFingerprint of the teacher distilled from ("": pretraining, or a checkpoint written
  // before it was kept).
  std::string teacher_weights;
};

// The bits of `module`'s parameters and buffers as 16 hex digits: FNV-1a over each one's name,
// dtype and shape and its WeightBitSums (the same on every device and thread count). A change of
// names, shapes or values changes it, except the rare edits that leave both sums as they were:
// a check that warns, not a cryptographic hash. For telling whether a teacher is the one a
// checkpoint was trained with. One pass over the weights, on the host (a device's tensors are
// copied a slice at a time).
std::string WeightsFingerprint(const torch::nn::Module& module);
// A tensor's bytes as unsigned 16-bit units (bytes for a tensor of 1-byte elements), summed
// plainly and weighted by the unit's position (i mod 251, plus 1, so that most permutations show
// too), in 64-bit integers: exact below 2^39 units.
std::array<int64_t, 2> WeightBitSums(const at::Tensor& tensor);

// Saves atomically to `path` (throws FileError); the RNG states saved are the default
// generators of the CPU and, when `device` is CUDA, of that device. `run_identity`:
// RunIdentityHash of the run's config (run_dir.h), checked on resume.
void SaveCheckpoint(const std::string& path, const CausalLM& model,
                    const torch::optim::Optimizer& optimizer, const TrainingPosition& position,
                    const at::Device& device, const std::string& run_identity = "");

// Restores everything SaveCheckpoint wrote (also the RNG states). Throws CorruptCheckpointError
// for a damaged file (before changing anything; an archive the trainer did not write possibly
// after loading some weights), std::runtime_error when the checkpoint's
// architecture differs from `model`'s or, `run_identities` given (AcceptedRunIdentityHashes),
// it belongs to another run (its identity is none of them).
TrainingPosition LoadCheckpoint(const std::string& path, CausalLM& model,
                                torch::optim::Optimizer& optimizer, const at::Device& device,
                                const std::vector<std::string>& run_identities = {});

// Restores the newest checkpoint of `run_dir` that is intact, newest first: a corrupt one is
// skipped with a line in `warnings` naming it and the one used instead, and its file name goes
// into `skipped` (when given). nullopt: no checkpoints. Throws CorruptCheckpointError naming
// every file when none is intact.
std::optional<TrainingPosition> LoadLatestGoodCheckpoint(
    const std::string& run_dir, CausalLM& model, torch::optim::Optimizer& optimizer,
    const at::Device& device, const std::vector<std::string>& run_identities,
    std::vector<std::string>* warnings, std::set<std::string>* skipped = nullptr);

// Loads only the weights (the teacher; export). `path`: a checkpoint file, or a run directory
// whose newest intact checkpoint is used: a corrupt newer one is skipped with a line in
// `warnings` (on stderr when null) naming it and the one used instead, as a resume does; a
// checkpoint of a run that skipped every step before it as non-finite (train.nonfinite=skip)
// adds a line saying that its weights were never updated. Returns the file loaded. `what` starts
// the errors and warnings (the config key, or the command). Throws CorruptCheckpointError when no
// checkpoint of the directory is intact.
std::string LoadWeights(const std::string& path, CausalLM& model, const at::Device& device,
                        const std::string& what = "teacher.checkpoint",
                        std::vector<std::string>* warnings = nullptr);

// The newest checkpoint in <run_dir>/checkpoints, if any.
std::optional<std::string> LatestCheckpoint(const std::string& run_dir);
// <run_dir>/checkpoints/step_NNNNNNN.pt
std::string CheckpointPath(const std::string& run_dir, int64_t step);
// Deletes all but the newest `keep` checkpoints of `run_dir` up to `step` (the one just written).
// Later ones, and those `is_ours` (when given, asked about each file up to `step`) says are not
// this run's -- a file this process's resume skipped as damaged or misnamed, a checkpoint copied
// in from another run -- are neither counted nor deleted: counting them had the run delete the
// checkpoints it had just written, or its last good one (a copy of step 5 named step 12 pushed
// out step 10). Also deletes the temporaries (step_NNNNNNN.pt.tmp) that killed writes left.
void PruneCheckpoints(const std::string& run_dir, int64_t keep, int64_t step,
                      const std::function<bool(const std::string& path)>& is_ours = {});

// The run identity (RunIdentityHash) a checkpoint was written for; "" for one written before
// checkpoints carried it. Throws CorruptCheckpointError for a file that is not an intact
// checkpoint.
std::string CheckpointRunIdentity(const std::string& path);

}  // namespace distill

// What `distill_trainer` runs for a config: one training run, or -- in distill mode with
// teacher.pretrain_steps > 0 and no teacher.checkpoint -- the pipeline
//   <out_dir>/teacher   pretrain the teacher (cross-entropy, teacher architecture)
//   <out_dir>/student   distil the student from it
//   <out_dir>/baseline  (train.baseline) the same student on hard labels only
// ending with a table of validation losses against the data's entropy floor.
// No torch headers: main.cpp stays cheap to compile.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "distill/config.h"

namespace distill {

class Distributed;

struct RunFlags {
  bool fresh = false;  // delete an existing run in train.out_dir first
  bool quiet = false;  // no progress output (warnings and the final table are still printed)
  // Data-parallel process group (distributed.h), not owned; nullptr: one plain process. Every
  // rank calls Run; only rank 0 writes run directories and prints the table.
  Distributed* distributed = nullptr;
  // --profile-steps / --profile-skip: after profile_skip steps of each run, profile_steps
  // steps under the Kineto profiler, then profile_steps steps under phase timers, written to
  // <out_dir>/profile/ (distill/profile.h). 0: off.
  int64_t profile_steps = 0;
  int64_t profile_skip = 3;
  // Refuse a config whose memory estimate exceeds the device's memory (memory_estimate.h);
  // --no-memory-check turns this off (the estimate is still printed).
  bool memory_check = true;
};

struct ResultRow {
  std::string name;  // teacher, student (distilled / ce only), student (hard labels)
  std::string run_dir;
  int64_t parameters = 0;
  double val_loss = 0;
  double entropy_floor = 0;  // NaN when unknown (text data)
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // train.nonfinite=skip: updates skipped over the run
};

// Runs `config` and returns one row per trained model; prints the table to `out`.
std::vector<ResultRow> Run(const Config& config, const RunFlags& flags, std::ostream& out);

// `distill_trainer export RUN_DIR OUT_DIR`: the student of the run in run_dir (its config.yaml
// and newest intact checkpoint, a corrupt newer one skipped with a warning on stderr) written as a
// Hugging Face directory to out_dir, which must not exist yet (hf_export.h). Returns the checkpoint
// exported.
std::string ExportRun(const std::string& run_dir, const std::string& out_dir);

// `distill_trainer --version`: this build's version, the liblossfns it loaded, the LibTorch it
// was built against, whether it has CUDA kernels, and the CUDA devices it sees.
std::string VersionText();

// The stage configs of the pipeline (each a plain single run). Exposed for tests and docs.
Config TeacherStageConfig(const Config& config);
Config StudentStageConfig(const Config& config);
Config BaselineStageConfig(const Config& config);
bool IsPipeline(const Config& config);

std::string FormatTable(const std::vector<ResultRow>& rows);

}  // namespace distill

// The run directory: identity, resume-or-refuse, atomic small files.
//
// A run directory holds config.yaml (the resolved config of the run that owns it). Starting a
// run in a directory that holds a *different* run (any key other than the ones below differs)
// is refused with a message saying how to proceed; the same run is resumed from its latest
// checkpoint when train.resume is true. Keys that may change between attempts of the same run:
// train.steps (extends the run; the schedule's horizon moves with it), train.log_interval,
// train.eval_interval, train.checkpoint_interval, train.keep_checkpoints, train.resume,
// train.out_dir, train.export_hf, train.nonfinite, train.max_skipped_steps.
//
// Ownership: a directory the trainer creates gets a marker file, .distill_run (a random run
// id, the creation time and a hash of the run identity). Deletion (--fresh) only ever touches a
// directory with that marker; a directory with config.yaml but no marker (a run from before
// markers, or a copy) can still be resumed, but --fresh refuses it. Nothing is created before
// the models and data of a run were built (PlanRunDir checks, CommitRunDir writes), so a run
// that fails at start-up leaves no config.yaml behind to refuse the corrected command.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "distill/config.h"
#include "distill/file_io.h"  // WriteFileAtomically

namespace distill {

class RunDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The marker file of a directory created by the trainer.
inline constexpr const char* kRunMarker = ".distill_run";

// What CommitRunDir will do with config.train.out_dir.
struct RunDirPlan {
  bool same_run = false;      // it holds this run: resume from its checkpoints, if any
  bool delete_first = false;  // --fresh on a run directory of ours
};

// Checks config.train.out_dir without changing anything: resume, start, or refuse (throws
// RunDirError saying why and what to do). `fresh` plans the deletion of an existing run
// directory, which must carry kRunMarker.
RunDirPlan PlanRunDir(const Config& config, bool fresh);
// Carries out `plan`: deletes (delete_first), creates the directory with its marker when new,
// and writes config.yaml. Call it once the run's models and data were built.
void CommitRunDir(const Config& config, const RunDirPlan& plan);
// Whether `dir` carries kRunMarker (was created by the trainer).
bool IsOwnRunDir(const std::string& dir);
// Deletes `dir` if it holds nothing but a marker and config.yaml (what a start that failed
// before training left); returns whether it did.
bool RemoveIfOnlyMarker(const std::string& dir);
// 64-bit FNV-1a of `data` (stable across platforms and runs, unlike std::hash).
uint64_t Fnv1a64(const void* data, size_t size, uint64_t hash = 0xcbf29ce484222325ULL);
// Fnv1a64 of RunIdentity(config), as 16 hex digits.
std::string RunIdentityHash(const Config& config);

// `path` without trailing '/' ("runs/x/" -> "runs/x"; "/" stays "/"): a directory the trainer
// creates or names siblings of (`<out_dir>-baseline`, `<dir>.tmp-<pid>`) is one path however it
// was typed.
std::string WithoutTrailingSeparators(std::string path);

// Deletes `path` and everything under it (no-op when absent). POSIX nftw, not
// std::filesystem::remove_all: the torch wheel's libtorch.so exports a broken copy of the
// latter that the dynamic linker may bind instead of libstdc++'s (it crashes).
void RemoveTree(const std::string& path);

// The config with the keys that may differ between attempts of one run reset, as YAML.
std::string RunIdentity(const Config& config);

}  // namespace distill

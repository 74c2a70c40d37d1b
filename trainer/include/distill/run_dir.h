// The run directory: identity, resume-or-refuse, atomic small files.
//
// A run directory holds config.yaml (the resolved config of the run that owns it). Starting a
// run in a directory that holds a *different* run (any key other than the ones below differs)
// is refused with a message saying how to proceed; the same run is resumed from its latest
// checkpoint when train.resume is true. Keys that may change between attempts of the same run:
// train.steps (extends the run; the schedule's horizon moves with it), train.log_interval,
// train.eval_interval, train.checkpoint_interval, train.keep_checkpoints, train.resume,
// train.out_dir, train.export_hf, train.export_from, train.nonfinite, train.max_skipped_steps.
//
// Ownership: a directory the trainer creates gets a marker file, .distill_run (a random run
// id, the creation time and a hash of the run identity). Deletion (--fresh) only ever touches a
// directory with that marker; a directory with config.yaml but no marker (a run from before
// markers, or a copy) can still be resumed, but --fresh refuses it. Nothing is created before
// the models and data of a run were built (PlanRunDir checks, CommitRunDir writes), so a run
// that fails at start-up leaves no config.yaml behind to refuse the corrected command.
//
// One process per run directory: the process that trains in it holds an exclusive lock
// (flock(2)) on its .distill_lock file from PlanRunDir until it ends, and a second trainer --
// the same command in another terminal, a job queued again while the first still runs --
// is refused, naming the holder, before it changes anything (--fresh included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distill/config.h"
#include "distill/file_io.h"  // WriteFileAtomically

namespace distill {

class RunDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The marker file of a directory created by the trainer.
inline constexpr const char* kRunMarker = ".distill_run";

// The lock file of a run directory (kept by --fresh, which deletes the rest of a run directory
// that holds only what the trainer wrote, and nothing of one that holds more).
inline constexpr const char* kRunLock = ".distill_lock";

// An exclusive flock(2) on <dir>/kRunLock (created when missing), released when destroyed. Holds
// "pid <pid> on <host> since <UTC time>" for the message of the process it refuses. Throws
// RunDirError when another process holds it (naming it) or the file cannot be created. On a
// filesystem without locks (ENOLCK, EOPNOTSUPP, ...) it holds nothing and says so in warning().
class RunLock {
 public:
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  // Whether <dir>/kRunLock is still the file this holds (not deleted or replaced since).
  bool Current() const;
  const std::string& warning() const { return warning_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string warning_;
};

// Locks the run directories inside `dir` (those with a lock file; a pipeline's stages), except
// those this process holds already: throws RunDirError naming one another process holds. The
// locks are released when the vector is destroyed.
std::vector<std::unique_ptr<RunLock>> LockRunsInside(const std::string& dir);

// What CommitRunDir will do with config.train.out_dir.
struct RunDirPlan {
  bool same_run = false;      // it holds this run: resume from its checkpoints, if any
  bool delete_first = false;  // --fresh on a run directory of ours
  // The directory's lock, when it exists already (else CommitRunDir takes it once it is
  // created). Keep the plan (or this pointer) for as long as the run writes the directory.
  std::shared_ptr<RunLock> lock;
  // The directories CommitRunDir created (the run directory and the parents it lacked, deepest
  // first): empty where the directory existed (an empty directory a user made for the run).
  std::vector<std::string> created;
  // A warning to print (the caller's: the trainer's log, a pipeline's stderr): its config.yaml
  // was missing or did not parse while the marker names this run (CommitRunDir writes it again).
  std::string config_note;
};

// Checks config.train.out_dir and locks it when it exists (the lock file is the one thing it may
// create): resume, start, or refuse (throws RunDirError saying why and what to do; also when
// another process holds the directory). `fresh` plans the deletion of an existing run
// directory, which must carry kRunMarker.
RunDirPlan PlanRunDir(const Config& config, bool fresh);
// Carries out `plan`: deletes the directory's contents but its lock (delete_first), creates the
// directory with its marker when new, takes the lock if the plan has none (a directory created
// now, or deleted since the plan) and writes config.yaml. Call it once the run's models and data
// were built. A run that another process started in the directory since the plan is refused.
void CommitRunDir(const Config& config, RunDirPlan& plan);
// Whether `dir` carries kRunMarker (was created by the trainer).
bool IsOwnRunDir(const std::string& dir);
// Undoes what CommitRunDir did for a start that failed before anything else was written, where
// `dir` holds nothing but a marker, config.yaml and the lock file: where `plan.created` holds the
// directory, it is deleted with the parents created for it (each only if empty); where the
// directory existed before (and carries the marker), only those files are, and the directory
// stays. Nothing otherwise. Returns whether it undid anything; throws RunDirError where a
// deletion fails.
bool UndoFailedStart(const std::string& dir, const RunDirPlan& plan);
// 64-bit FNV-1a of `data` (stable across platforms and runs, unlike std::hash).
uint64_t Fnv1a64(const void* data, size_t size, uint64_t hash = 0xcbf29ce484222325ULL);
// The step of a checkpoint's file name, "step_<digits>.pt" (CheckpointPath's; at most 18 digits),
// else nullopt: a user's "step_best.pt" or "step_0000002_keep.pt" is no checkpoint of the run,
// never resumed from, never pruned, and not deleted by --fresh.
std::optional<int64_t> CheckpointStep(const std::string& name);

// Fnv1a64 of RunIdentity(config), as 16 hex digits.
std::string RunIdentityHash(const Config& config);
// The identities a run's checkpoints and marker may carry: RunIdentityHash first, then, where
// it differs, the one written before a teacher beside train.out_dir (a pipeline's student
// stage) was named relative to it in the identity (RunIdentity): its path as typed.
std::vector<std::string> AcceptedRunIdentityHashes(const Config& config);
// The same for the config.yaml stored in run directory `dir` (the paths it was written with: a
// pipeline's stage moved since, and resumed, still owns the checkpoints written before the
// move); empty where it is missing or does not parse. Only for a directory PlanRunDir found to
// hold the requested run (their identities agree).
std::vector<std::string> StoredRunIdentityHashes(const std::string& dir);

// `path` without trailing '/' ("runs/x/" -> "runs/x"; "/" stays "/"): a directory the trainer
// creates or names siblings of (`<out_dir>-baseline`, `<dir>.tmp-<pid>`) is one path however it
// was typed.
std::string WithoutTrailingSeparators(std::string path);

// Deletes `path` and everything under it (no-op when absent). POSIX nftw, not
// std::filesystem::remove_all: the torch wheel's libtorch.so exports a broken copy of the
// latter that the dynamic linker may bind instead of libstdc++'s (it crashes).
void RemoveTree(const std::string& path);

// The config with the keys that may differ between attempts of one run reset, as YAML. A
// teacher.checkpoint beside train.out_dir (<dir>/teacher for train.out_dir <dir>/student: a
// pipeline's student stage) is written relative to it, so that a pipeline moved, or named by
// another spelling of its path ("runs/p", "/home/me/runs/p"), is the same run.
std::string RunIdentity(const Config& config);

}  // namespace distill

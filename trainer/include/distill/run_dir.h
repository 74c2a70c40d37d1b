// The run directory: identity, resume-or-refuse, atomic small files.
//
// A run directory holds config.yaml (the resolved config of the run that owns it). Starting a
// run in a directory that holds a *different* run (any key other than the ones below differs)
// is refused with a message saying how to proceed; the same run is resumed from its latest
// checkpoint when train.resume is true. Keys that may change between attempts of the same run:
// train.steps (extends the run; the schedule's horizon moves with it), train.log_interval,
// train.eval_interval, train.checkpoint_interval, train.keep_checkpoints, train.resume,
// train.out_dir, train.export_hf.
#pragma once

#include <optional>
#include <string>

#include "distill/config.h"

namespace distill {

class RunDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Creates, resumes or refuses config.train.out_dir, then writes its config.yaml. `fresh`
// deletes an existing run directory first (never a directory without config.yaml). Returns
// true when the directory already held this run (resume from its checkpoints, if any).
bool PrepareRunDir(const Config& config, bool fresh);

// Writes `content` to `<path>.tmp`, then renames it to `path`.
void WriteFileAtomically(const std::string& path, const std::string& content);

// Deletes `path` and everything under it (no-op when absent). POSIX nftw, not
// std::filesystem::remove_all: the torch wheel's libtorch.so exports a broken copy of the
// latter that the dynamic linker may bind instead of libstdc++'s (it crashes).
void RemoveTree(const std::string& path);

// The config with the keys that may differ between attempts of one run reset, as YAML.
std::string RunIdentity(const Config& config);

}  // namespace distill

#include "distill/run_dir.h"

#include <ftw.h>
#include <stdio.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace distill {
namespace fs = std::filesystem;

namespace {

// "key: a  vs  key: b" for the first line where two YAML dumps differ.
std::string FirstDifference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb, section;
  while (true) {
    const bool ha = static_cast<bool>(std::getline(sa, la));
    const bool hb = static_cast<bool>(std::getline(sb, lb));
    if (!ha && !hb) return "";
    if (la != lb) return fmt::format("{}here \"{}\", requested \"{}\"", section, la, lb);
    if (!la.empty() && la[0] != ' ') section = la.substr(0, la.find(':')) + ": ";
  }
}

}  // namespace

void WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) throw RunDirError(fmt::format("cannot write {}", tmp));
  }
  fs::rename(tmp, path);
}

void RemoveTree(const std::string& path) {
  if (!fs::exists(path)) return;
  auto remove_entry = [](const char* entry, const struct stat*, int, struct FTW*) {
    return ::remove(entry);
  };
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    throw RunDirError(fmt::format("cannot delete {}", path));
  }
}

std::string RunIdentity(const Config& config) {
  Config c = config;
  const TrainConfig defaults;
  c.train.steps = defaults.steps;
  c.train.log_interval = defaults.log_interval;
  c.train.eval_interval = defaults.eval_interval;
  c.train.checkpoint_interval = defaults.checkpoint_interval;
  c.train.keep_checkpoints = defaults.keep_checkpoints;
  c.train.resume = defaults.resume;
  c.train.out_dir = defaults.out_dir;
  c.train.export_hf = defaults.export_hf;
  return ConfigToYaml(c);
}

bool PrepareRunDir(const Config& config, bool fresh) {
  const fs::path dir = config.train.out_dir;
  const fs::path config_file = dir / "config.yaml";
  const bool exists = fs::exists(dir);
  const bool empty = !exists || (fs::is_directory(dir) && fs::is_empty(dir));
  bool same_run = false;
  if (exists && !fs::is_directory(dir)) {
    throw RunDirError(fmt::format("train.out_dir \"{}\" is a file; choose a directory",
                                  dir.string()));
  }
  if (!empty && !fs::exists(config_file)) {
    throw RunDirError(fmt::format(
        "train.out_dir \"{}\" is not empty and holds no config.yaml (not a distill_trainer run); "
        "choose another train.out_dir",
        dir.string()));
  }
  if (!empty && fresh) {
    RemoveTree(dir.string());
  } else if (!empty) {
    std::string stored_identity;
    try {
      stored_identity = RunIdentity(LoadConfigFile(config_file.string()));
    } catch (const ConfigError& e) {
      throw RunDirError(fmt::format(
          "{} holds a run whose config no longer parses ({}); pass --fresh to delete it, or "
          "choose another train.out_dir",
          dir.string(), e.what()));
    }
    const std::string wanted = RunIdentity(config);
    if (stored_identity != wanted) {
      throw RunDirError(fmt::format(
          "{} holds a different run ({}); to continue that run use --config {}, to start this "
          "one pass --fresh (deletes it) or set train.out_dir to another directory",
          dir.string(), FirstDifference(stored_identity, wanted), config_file.string()));
    }
    if (!config.train.resume) {
      throw RunDirError(fmt::format(
          "{} already holds this run and train.resume is false; set train.resume=true to "
          "continue it, or pass --fresh to start over",
          dir.string()));
    }
    same_run = true;
  }
  fs::create_directories(dir);
  WriteFileAtomically(config_file.string(), ConfigToYaml(config));
  return same_run;
}

}  // namespace distill

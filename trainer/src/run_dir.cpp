#include "distill/run_dir.h"

#include <ftw.h>
#include <stdio.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>

namespace distill {
namespace fs = std::filesystem;

namespace {

// A first start killed (or stopped by a full disk) while it wrote the run marker or
// config.yaml leaves only these: the same command starts the run again instead of refusing a
// directory that holds nothing but our own files. Anything else in it keeps it refused, and so
// does a config.yaml.tmp without the marker (written first): that one is not ours.
bool IsInterruptedStart(const fs::path& dir) {
  const std::string marker = kRunMarker;
  bool any = false, has_marker = false, has_config_tmp = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != marker && name != marker + ".tmp" && name != "config.yaml.tmp") return false;
    any = true;
    has_marker = has_marker || name == marker;
    has_config_tmp = has_config_tmp || name == "config.yaml.tmp";
  }
  return any && (has_marker || !has_config_tmp);
}

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

// "<32 hex digits>": 128 random bits.
std::string RandomRunId() {
  std::random_device device;
  std::string id;
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", device());
  return id;
}

std::string UtcNow() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

uint64_t Fnv1a64(const void* data, size_t size, uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string RunIdentityHash(const Config& config) {
  const std::string identity = RunIdentity(config);
  return fmt::format("{:016x}", Fnv1a64(identity.data(), identity.size()));
}

bool IsOwnRunDir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / kRunMarker); }

bool RemoveIfOnlyMarker(const std::string& dir) {
  if (!IsOwnRunDir(dir)) return false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != kRunMarker && name != "config.yaml") return false;
  }
  RemoveTree(dir);
  return true;
}

std::string WithoutTrailingSeparators(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
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
  c.train.nonfinite = defaults.nonfinite;
  c.train.max_skipped_steps = defaults.max_skipped_steps;
  c.train.bucket_mb = defaults.bucket_mb;    // how the gradients travel, not what they are
  c.train.cuda_graph = defaults.cuda_graph;  // how the kernels are launched, not what they do
  // How the loss is computed, not what: a run that ran out of memory resumes with it switched on.
  c.distill.fused_linear = DistillConfig().fused_linear;
  return ConfigToYaml(c);
}

RunDirPlan PlanRunDir(const Config& config, bool fresh) {
  const fs::path dir = config.train.out_dir;
  const fs::path config_file = dir / "config.yaml";
  const bool exists = fs::exists(dir);
  if (exists && !fs::is_directory(dir)) {
    throw RunDirError(
        fmt::format("train.out_dir \"{}\" is a file; choose a directory", dir.string()));
  }
  RunDirPlan plan;
  if (!exists || fs::is_empty(dir) || IsInterruptedStart(dir)) return plan;
  if (fresh && IsOwnRunDir(dir.string())) {
    plan.delete_first = true;
    return plan;
  }
  if (!fs::exists(config_file)) {
    throw RunDirError(fmt::format(
        "train.out_dir \"{}\" is not empty and holds no config.yaml (not a distill_trainer run); "
        "choose another train.out_dir",
        dir.string()));
  }
  if (fresh) {
    throw RunDirError(fmt::format(
        "--fresh: {} holds a config.yaml but no {} marker, so distill_trainer did not create it "
        "(or it is a run from before run markers, or a copy) and will not delete it; delete it "
        "by hand (rm -r {}) if it is yours to discard, or choose another train.out_dir",
        dir.string(), kRunMarker, dir.string()));
  }
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
    throw RunDirError(
        fmt::format("{} already holds this run and train.resume is false; set train.resume=true to "
                    "continue it, or pass --fresh to start over",
                    dir.string()));
  }
  plan.same_run = true;
  return plan;
}

void CommitRunDir(const Config& config, const RunDirPlan& plan) {
  const fs::path dir = config.train.out_dir;
  // (Already gone when it lay inside a pipeline directory that --fresh has just deleted.)
  if (plan.delete_first && fs::exists(dir)) {
    if (!IsOwnRunDir(dir.string())) {  // PlanRunDir checked; never delete what is not ours
      throw RunDirError(fmt::format("{}: no {} marker; not deleting it", dir.string(), kRunMarker));
    }
    RemoveTree(dir.string());
  }
  const bool created = !fs::exists(dir) || fs::is_empty(dir) || IsInterruptedStart(dir);
  fs::create_directories(dir);
  if (created) {
    WriteFileAtomically((dir / kRunMarker).string(),
                        fmt::format("run_id: {}\ncreated: {}\nconfig_hash: {}\n", RandomRunId(),
                                    UtcNow(), RunIdentityHash(config)));
  }
  WriteFileAtomically((dir / "config.yaml").string(), ConfigToYaml(config));
}

}  // namespace distill

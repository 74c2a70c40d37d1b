#include "distill/run_dir.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distill/file_io.h"   // CreateDirectories
#include "distill/hf_files.h"  // IsExportFileOrTemporary, IsExportSibling
#include "distill/run.h"       // IsPipeline

namespace distill {
namespace fs = std::filesystem;

namespace {

// A first start killed (or stopped by a full disk) while it wrote the run marker or
// config.yaml leaves only these: the same command starts the run again instead of refusing a
// directory that holds nothing but our own files. Anything else in it keeps it refused, and so
// does a config.yaml.tmp without the marker (written first): that one is not ours.
// (The lock file, taken before anything else is written, counts as ours too.)
bool IsInterruptedStart(const fs::path& dir) {
  const std::string marker = kRunMarker;
  bool any = false, has_marker = false, has_config_tmp = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == kRunLock) continue;
    if (name != marker && name != marker + ".tmp" && name != "config.yaml.tmp") return false;
    any = true;
    has_marker = has_marker || name == marker;
    has_config_tmp = has_config_tmp || name == "config.yaml.tmp";
  }
  return !any || has_marker || !has_config_tmp;
}

// What a directory holding only our start-up files (or nothing) is: a new run's.
// A directory that cannot be listed (no read permission) is an error naming it, not
// std::filesystem's message.
bool IsUnstarted(const fs::path& dir) {
  try {
    return fs::is_empty(dir) || IsInterruptedStart(dir);
  } catch (const fs::filesystem_error& e) {
    throw RunDirError(fmt::format("{}: cannot list it: {}", dir.string(), e.code().message()));
  }
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string WithoutTmp(const std::string& name) {
  return EndsWith(name, ".tmp") ? name.substr(0, name.size() - 4) : name;
}

// A checkpoint's name as the trainer writes it: step_<digits>.pt (or its .tmp).
bool IsCheckpointName(const std::string& name) {
  return CheckpointStep(WithoutTmp(name)).has_value();
}

// What --profile-steps writes into profile/: trace.json and phases.json, or per rank
// trace_rank<N>.json and phases_rank<N>.json (each also as .tmp).
bool IsProfileName(const std::string& name) {
  const std::string n = WithoutTmp(name);
  for (const char* kind : {"trace", "phases"}) {
    const std::string k = kind;
    if (n == k + ".json") return true;
    if (n.rfind(k + "_rank", 0) == 0 && EndsWith(n, ".json") && n.size() > k.size() + 10) {
      const std::string rank = n.substr(k.size() + 5, n.size() - k.size() - 10);
      if (!rank.empty() && rank.find_first_not_of("0123456789") == std::string::npos) return true;
    }
  }
  return false;
}

// The entries of run directory `dir` that distill_trainer does not write, as paths under it
// (directories with a trailing '/'), sorted: what --fresh must not delete. Ours: the marker, the
// lock, config.yaml, metrics.jsonl, summary.json, a pipeline's results.txt (each also as the
// ".tmp" of a write cut short); in checkpoints/ the step_<digits>.pt files, in profile/ the
// traces and phase timings; the export hf/ and its temporaries hf.tmp-<pid> and hf.old-<pid>,
// with the files an export writes (not a model card); and a pipeline's stage runs teacher/,
// student/ and baseline/ (run directories of ours, started or not, looked into the same way).
// Anything else is a user's: notes, a copy such as checkpoints/step_best.pt, an evaluation's
// output, another run put inside, an export's hf.previous (kept because it held a user's files).
void ForeignEntriesOfRun(const fs::path& dir, const std::string& prefix, bool stages,
                         std::vector<std::string>& foreign) {
  // The entries of a subdirectory of ours that `ours` does not claim.
  const auto look_into = [&](const fs::path& sub, const std::string& at,
                             bool (*ours)(const std::string&)) {
    for (const auto& entry : fs::directory_iterator(sub)) {
      const std::string f = entry.path().filename().string();
      const bool is_file = entry.is_regular_file() && !entry.is_symlink();
      if (!is_file || !ours(f)) {
        foreign.push_back(at + f + (entry.is_directory() && !entry.is_symlink() ? "/" : ""));
      }
    }
  };
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string base = WithoutTmp(name);
    const bool is_dir = entry.is_directory() && !entry.is_symlink();
    const bool is_file = entry.is_regular_file() && !entry.is_symlink();
    bool ours = false;
    if (name == kRunLock || base == kRunMarker || base == "config.yaml" ||
        base == "metrics.jsonl" || base == "summary.json" || base == "results.txt") {
      ours = is_file;
    } else if (name == "checkpoints" && is_dir) {
      ours = true;
      look_into(entry.path(), prefix + name + "/", IsCheckpointName);
    } else if (name == "profile" && is_dir) {
      ours = true;
      look_into(entry.path(), prefix + name + "/", IsProfileName);
    } else if ((name == "hf" || IsExportSibling(name, "hf", ".tmp-") ||
                IsExportSibling(name, "hf", ".old-")) &&
               is_dir) {
      ours = true;
      look_into(entry.path(), prefix + name + "/", IsExportFileOrTemporary);
    } else if (stages && (name == "teacher" || name == "student" || name == "baseline") && is_dir &&
               (IsOwnRunDir(entry.path().string()) || IsUnstarted(entry.path()))) {
      ours = true;
      ForeignEntriesOfRun(entry.path(), prefix + name + "/", /*stages=*/false, foreign);
    }
    if (!ours) foreign.push_back(prefix + name + (is_dir ? "/" : ""));
  }
  std::sort(foreign.begin(), foreign.end());
}

// --fresh deletes a run whole or not at all: refused while it holds what it did not write.
void CheckOnlyOursToDelete(const fs::path& dir) {
  // Stage directories are ours in a pipeline's directory only (in another run's, a teacher/ is a
  // run someone put there): as its config.yaml says.
  bool pipeline = false;
  try {
    pipeline =
        IsPipeline(LoadConfigFile((dir / "config.yaml").string(), {}, ConfigOrigin::kStored));
  } catch (const std::exception&) {  // unreadable: no stages claimed, so they are named
  }
  std::vector<std::string> foreign;
  try {
    ForeignEntriesOfRun(dir, "", pipeline, foreign);
  } catch (const fs::filesystem_error& e) {
    throw RunDirError(fmt::format("--fresh: cannot list what {} holds ({}), so nothing was deleted",
                                  dir.string(), e.code().message()));
  }
  if (foreign.empty()) return;
  const size_t shown = std::min<size_t>(foreign.size(), 6);
  const std::string list = fmt::format(
      "{}{}", fmt::join(foreign.begin(), foreign.begin() + shown, ", "),
      foreign.size() > shown ? fmt::format(" and {} more", foreign.size() - shown) : "");
  throw RunDirError(fmt::format(
      "--fresh: {} holds what distill_trainer did not write ({}), so nothing was deleted; move "
      "that out of it (or delete it by hand), then run again with --fresh, or choose another "
      "train.out_dir",
      dir.string(), list));
}

std::string HostName() {
  char host[256] = {};
  return gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0' ? host : "an unknown host";
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

namespace {

std::string HashOf(const std::string& identity) {
  return fmt::format("{:016x}", Fnv1a64(identity.data(), identity.size()));
}

// What RunIdentity writes for a teacher.checkpoint beside train.out_dir.
constexpr const char* kTeacherBesideOutDir = "../teacher (beside train.out_dir)";

bool TeacherBesideOutDir(const Config& c) {
  if (c.teacher.checkpoint.empty()) return false;
  const fs::path out = fs::path(c.train.out_dir).lexically_normal();
  return out.filename() == "student" && fs::path(c.teacher.checkpoint).lexically_normal() ==
                                            (out.parent_path() / "teacher").lexically_normal();
}

std::string RunIdentityAsTyped(const Config& config);

}  // namespace

std::string RunIdentityHash(const Config& config) { return HashOf(RunIdentity(config)); }

std::vector<std::string> AcceptedRunIdentityHashes(const Config& config) {
  std::vector<std::string> hashes{RunIdentityHash(config)};
  const std::string as_typed = HashOf(RunIdentityAsTyped(config));
  if (as_typed != hashes.front()) hashes.push_back(as_typed);
  return hashes;
}

namespace {

constexpr const char* kPreviousIdentitiesKey = "previous_identities: ";

// The marker's previous_identities line, split at spaces.
std::vector<std::string> MarkerPreviousIdentities(const fs::path& dir) {
  std::ifstream in(dir / kRunMarker);
  const std::string key = kPreviousIdentitiesKey;
  std::vector<std::string> hashes;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream words(line.substr(key.size()));
    for (std::string hash; words >> hash;) hashes.push_back(hash);
  }
  return hashes;
}

}  // namespace

std::vector<std::string> StoredRunIdentityHashes(const std::string& dir) {
  std::vector<std::string> hashes = MarkerPreviousIdentities(dir);
  const fs::path file = fs::path(dir) / "config.yaml";
  std::error_code error;
  if (!fs::is_regular_file(file, error)) return hashes;
  try {
    for (const std::string& hash :
         AcceptedRunIdentityHashes(LoadConfigFile(file.string(), {}, ConfigOrigin::kStored))) {
      if (std::find(hashes.begin(), hashes.end(), hash) == hashes.end()) hashes.push_back(hash);
    }
  } catch (const std::exception&) {  // damaged: the marker vouched for the run (PlanRunDir)
  }
  return hashes;
}

std::optional<int64_t> CheckpointStep(const std::string& name) {
  constexpr size_t kPrefix = 5, kSuffix = 3;  // "step_", ".pt"
  if (name.size() <= kPrefix + kSuffix || name.size() > kPrefix + 18 + kSuffix ||
      name.compare(0, kPrefix, "step_") != 0 ||
      name.compare(name.size() - kSuffix, kSuffix, ".pt") != 0) {
    return std::nullopt;
  }
  int64_t step = 0;
  for (size_t i = kPrefix; i < name.size() - kSuffix; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool IsOwnRunDir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / kRunMarker); }

namespace {

// The run identity hash the marker of `dir` recorded when the run was created ("" when it has
// none or cannot be read).
std::string MarkerConfigHash(const fs::path& dir) {
  std::ifstream in(dir / kRunMarker);
  std::string line;
  const std::string key = "config_hash: ";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  }
  return "";
}

// The lock files this process holds, by (device, inode): a pipeline's --fresh deletes the stage
// runs inside its directory, whose locks its own stages may hold already (LockRunsInside).
std::mutex held_mutex;
std::set<std::pair<dev_t, ino_t>> held_files;

bool HeldHere(const fs::path& lock_file) {
  struct stat st {};
  if (::stat(lock_file.c_str(), &st) != 0) return false;
  const std::lock_guard<std::mutex> guard(held_mutex);
  return held_files.count({st.st_dev, st.st_ino}) > 0;
}

}  // namespace

RunLock::RunLock(const std::string& dir) : path_((fs::path(dir) / kRunLock).string()) {
  // 0666 less the umask: a teammate's process (a group-writable directory) can lock it too. A
  // lock file that exists but is not writable still locks, read-only.
  // Never through a link (the lock's text is written into the file: a link's target would be
  // overwritten), and only a plain file.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  int first_error = fd_ < 0 ? errno : 0;
  if (fd_ < 0 && first_error == EACCES) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd_ < 0 && errno != ENOENT) first_error = errno;  // ENOENT: nothing to open read-only
  }
  struct stat opened {};
  if (fd_ < 0 || ::fstat(fd_, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    const int error = fd_ < 0 ? first_error : errno;
    const bool link = fd_ < 0 && error == ELOOP;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (link || (::lstat(path_.c_str(), &opened) == 0 && !S_ISREG(opened.st_mode))) {
      throw RunDirError(fmt::format(
          "{} is not a plain file ({}); distill_trainer's lock file is one it creates: remove "
          "what is there (nothing in the run depends on it) and run again",
          path_,
          S_ISLNK(opened.st_mode) || link ? "a symbolic link" : "a directory, FIFO or device"));
    }
    throw RunDirError(
        fmt::format("cannot create the lock file {}: {}", path_, std::strerror(error)));
  }
  int rc = 0;
  do {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      char holder[256] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      ::close(fd_);
      fd_ = -1;
      throw RunDirError(fmt::format(
          "{} is in use by another distill_trainer ({}); wait for it to finish or stop it (it "
          "checkpoints on SIGTERM or Ctrl-C), or choose another train.out_dir",
          dir, who.empty() ? "it holds " + path_ : who));
    }
    // A filesystem without locks (EBADF: NFS takes an exclusive lock only on a writable file).
    if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EBADF) {
      warning_ = fmt::format(
          "warning: cannot lock {} ({}): a second distill_trainer in this directory would not be "
          "refused",
          path_, std::strerror(error));
      return;  // the file stays open: Current() still answers
    }
    ::close(fd_);
    fd_ = -1;
    throw RunDirError(fmt::format("cannot lock {}: {}", path_, std::strerror(error)));
  }
  struct stat st {};
  if (::fstat(fd_, &st) == 0) {
    const std::lock_guard<std::mutex> guard(held_mutex);
    held_files.insert({st.st_dev, st.st_ino});
  }
  // Who holds it, for the message of the process it refuses (best effort: the lock is what counts).
  const std::string who = fmt::format("pid {} on {} since {}\n", ::getpid(), HostName(), UtcNow());
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, who.data(), who.size(), 0);
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  struct stat st {};
  if (::fstat(fd_, &st) == 0) {
    const std::lock_guard<std::mutex> guard(held_mutex);
    held_files.erase({st.st_dev, st.st_ino});
  }
  ::close(fd_);  // releases the lock; the file stays (deleting it would race)
}

bool RunLock::Current() const {
  struct stat held {
  }, now{};
  return fd_ >= 0 && ::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 &&
         held.st_dev == now.st_dev && held.st_ino == now.st_ino;
}

namespace {
thread_local std::vector<std::string>* lock_files = nullptr;  // LockRunsInside's nftw callback
}  // namespace

std::vector<std::unique_ptr<RunLock>> LockRunsInside(const std::string& dir) {
  // POSIX nftw, not std::filesystem's directory walk (see RemoveTree); links not followed.
  std::vector<std::string> found;
  lock_files = &found;
  auto collect = [](const char* path, const struct stat*, int type, struct FTW* ftw) {
    // Level 1 is the directory's own lock file; the runs inside are deeper.
    if (type == FTW_F && ftw->level > 1 && std::strcmp(path + ftw->base, kRunLock) == 0) {
      lock_files->push_back(path);
    }
    return 0;
  };
  nftw(dir.c_str(), collect, 16, FTW_PHYS);
  lock_files = nullptr;
  std::vector<std::unique_ptr<RunLock>> locks;
  for (const std::string& file : found) {
    if (HeldHere(file)) continue;
    locks.push_back(std::make_unique<RunLock>(fs::path(file).parent_path().string()));
  }
  return locks;
}

bool UndoFailedStart(const std::string& dir, const RunDirPlan& plan) {
  const auto only_ours = [&dir] {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name != kRunMarker && name != "config.yaml" && name != kRunLock) return false;
    }
    return true;
  };
  const bool created = !plan.created.empty() && plan.created.front() == dir;
  if (created) {
    // Created by this process: also where its marker was never written (a full disk), which
    // leaves only the lock file.
    if (!only_ours()) return false;
    RemoveTree(dir);
    std::error_code ignored;
    for (size_t i = 1; i < plan.created.size(); ++i) fs::remove(plan.created[i], ignored);
    return true;
  }
  if (!IsOwnRunDir(dir) || !only_ours()) return false;
  // config.yaml first and the marker last (a deletion that fails part-way leaves a directory
  // that a start or --fresh still takes as ours).
  for (const char* name : {"config.yaml", kRunLock, kRunMarker}) {
    std::error_code error;
    fs::remove(fs::path(dir) / name, error);
    if (error) {
      throw RunDirError(
          fmt::format("cannot delete {}: {}", (fs::path(dir) / name).string(), error.message()));
    }
  }
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

namespace {

// Whether two spellings of a path name the same file or directory ("m", "m/", "./m", an
// absolute path, a link), or, where nothing is there (a glob), the same text once normalised.
bool SamePath(const std::string& a, const std::string& b) {
  std::error_code error;
  if (fs::equivalent(a, b, error) && !error) return true;
  const auto normal = [](const std::string& p) {
    std::string n = fs::path(p).lexically_normal().string();
    while (n.size() > 1 && n.back() == '/') n.pop_back();
    return n;
  };
  return normal(a) == normal(b);
}

}  // namespace

std::string RunIdentity(const Config& config) {
  if (!TeacherBesideOutDir(config)) return RunIdentityAsTyped(config);
  Config c = config;
  c.teacher.checkpoint = kTeacherBesideOutDir;
  return RunIdentityAsTyped(c);
}

namespace {

// RunIdentity with every path as typed (the identity of runs started before a teacher beside
// train.out_dir was written relative to it).
std::string RunIdentityAsTyped(const Config& config) {
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
  c.train.export_from = defaults.export_from;  // what the export copies, not what is trained
  c.train.nonfinite = defaults.nonfinite;
  c.train.max_skipped_steps = defaults.max_skipped_steps;
  c.train.bucket_mb = defaults.bucket_mb;  // how the gradients travel, not what they are
  c.train.collective_timeout_s = defaults.collective_timeout_s;  // how long the ranks wait
  c.train.cuda_graph = defaults.cuda_graph;  // how the kernels are launched, not what they do
  // The same gradients with less memory: a run that ran out of memory resumes with it on.
  c.train.activation_checkpointing = defaults.activation_checkpointing;
  // How the loss is computed, not what: a run that ran out of memory resumes with it switched on.
  c.distill.fused_linear = DistillConfig().fused_linear;
  std::string identity = ConfigToYaml(c);
  // Keys added since runs existed are left out of the text where they hold the value every
  // earlier run had (activation_checkpointing, export_from and collective_timeout_s are not part
  // of the identity at all; a model's activation is, but gelu is what the gpt family always ran):
  // the checkpoints of runs started before them carry a hash of the identity without these lines.
  for (const std::string line : {"\n  activation_checkpointing: false", "\n  activation: gelu",
                                 "\n  export_from: \"\"", "\n  collective_timeout_s: 600"}) {
    for (size_t at = identity.find(line); at != std::string::npos; at = identity.find(line, at)) {
      const size_t end = at + line.size();
      if (end == identity.size() || identity[end] == '\n') {
        identity.erase(at, line.size());
      } else {
        at = end;  // another value ("gelu_tanh"): part of the identity
      }
    }
  }
  return identity;
}

}  // namespace

RunDirPlan PlanRunDir(const Config& config, bool fresh) {
  const fs::path dir = config.train.out_dir;
  const fs::path config_file = dir / "config.yaml";
  std::error_code looked;
  const bool exists = fs::exists(dir, looked);
  if (looked) {  // a name too long, a directory on the path that cannot be searched, ...
    throw RunDirError(
        fmt::format("train.out_dir \"{}\": cannot look it up: {}", dir.string(), looked.message()));
  }
  if (exists && !fs::is_directory(dir)) {
    throw RunDirError(
        fmt::format("train.out_dir \"{}\" is a file; choose a directory", dir.string()));
  }
  if (exists) {  // what is in it decides what it is: a directory that cannot be read says so
    std::error_code listed;
    fs::directory_iterator probe(dir, listed);
    if (listed) {
      throw RunDirError(
          fmt::format("train.out_dir \"{}\": cannot list it: {}", dir.string(), listed.message()));
    }
  }
  RunDirPlan plan;
  if (!exists) return plan;  // locked once CommitRunDir has created it
  // Ours: locked before anything in it is read (another process's --fresh may be deleting it).
  if (IsUnstarted(dir) || IsOwnRunDir(dir.string())) {
    plan.lock = std::make_shared<RunLock>(dir.string());
  }
  if (IsUnstarted(dir)) return plan;
  if (fresh && IsOwnRunDir(dir.string())) {
    // Never delete a run in progress, this one or one inside it (a pipeline's stages): checked
    // now, and again (held) while CommitRunDir deletes.
    LockRunsInside(dir.string());
    CheckOnlyOursToDelete(dir);
    plan.delete_first = true;
    return plan;
  }
  // The marker records the identity the run was created with: where it is the requested one and
  // config.yaml is missing or does not parse (damaged: truncated, emptied), the directory holds
  // this run and the commit writes config.yaml again. A config.yaml that parses is believed over
  // the marker, which is never updated (a run continued with an edited config.yaml, before its
  // first checkpoint, is another run than its marker names); the checkpoints' own identities
  // are checked on resume either way.
  const bool own = IsOwnRunDir(dir.string());
  const std::vector<std::string> accepted = AcceptedRunIdentityHashes(config);
  const bool marker_says_same =
      own && std::find(accepted.begin(), accepted.end(), MarkerConfigHash(dir)) != accepted.end();
  const auto resume_with_repair = [&](const std::string& what) {
    if (!config.train.resume) return false;  // the errors below say what to do
    plan.config_note = fmt::format(
        "warning: {} {}, but the run's marker names this run: continuing it, and config.yaml is "
        "written again from this command's config",
        config_file.string(), what);
    if (plan.lock == nullptr) plan.lock = std::make_shared<RunLock>(dir.string());
    plan.same_run = true;
    return true;
  };
  if (!fs::exists(config_file) && marker_says_same && resume_with_repair("is missing")) {
    return plan;
  }
  if (!fs::exists(config_file) && own) {
    throw RunDirError(fmt::format(
        "{} is a distill_trainer run without its config.yaml (removed?), and {}; to start this "
        "one pass --fresh (deletes it), or choose another train.out_dir",
        dir.string(),
        marker_says_same
            ? "train.resume is false (its marker names this run: train.resume=true continues it)"
            : "its marker names another run than this command's"));
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
  // Without the marker a directory is a run only as one from before markers was: with what a
  // run writes (its checkpoints, metrics, summary; a pipeline's stage runs). A folder that
  // merely holds a config.yaml (often the one --config names) is the user's: its config.yaml
  // must not be overwritten by the resolved one.
  const auto older_run = [&] {
    std::error_code ignored;
    if (fs::is_directory(dir / "checkpoints", ignored)) return true;
    for (const char* name : {"metrics.jsonl", "summary.json", "results.txt", "teacher/config.yaml",
                             "student/config.yaml", "baseline/config.yaml"}) {
      if (fs::exists(dir / name, ignored)) return true;
    }
    return false;
  };
  if (!own && !older_run()) {
    throw RunDirError(fmt::format(
        "train.out_dir \"{}\" holds a config.yaml but is not a distill_trainer run (no {} "
        "marker, and nothing a run writes: checkpoints/, metrics.jsonl, summary.json), and the "
        "trainer writes its own config.yaml there; choose another train.out_dir (e.g. {})",
        dir.string(), kRunMarker, (dir / "run").string()));
  }
  // What deletes it: --fresh for a directory of ours; by hand for one without the marker (--fresh
  // would refuse it).
  const std::string discard =
      own ? "pass --fresh (deletes it)"
          : fmt::format("delete it by hand (rm -r {}; it has no {} marker, so --fresh will not)",
                        dir.string(), kRunMarker);
  std::string stored_identity, stored_out_dir;
  Config stored;
  try {
    stored = LoadConfigFile(config_file.string(), {}, ConfigOrigin::kStored);
    stored_identity = RunIdentity(stored);
    stored_out_dir = stored.train.out_dir;
  } catch (const ConfigError& e) {
    if (marker_says_same && resume_with_repair(fmt::format("does not parse ({})", e.what()))) {
      return plan;
    }
    if (marker_says_same) {  // train.resume false
      throw RunDirError(fmt::format(
          "{}'s config.yaml does not parse ({}), and train.resume is false; its marker names this "
          "run: train.resume=true continues it (config.yaml is written again), --fresh deletes it",
          dir.string(), e.what()));
    }
    if (!own) {  // not known to be a run: nothing suggests deleting what may be someone's data
      throw RunDirError(fmt::format(
          "train.out_dir \"{}\" has no {} marker and its config.yaml does not parse as this "
          "distill_trainer's config ({}): not a run it can continue; choose another "
          "train.out_dir",
          dir.string(), kRunMarker, e.what()));
    }
    throw RunDirError(fmt::format(
        "{} holds a run whose config no longer parses ({}); to start over {}, or choose another "
        "train.out_dir",
        dir.string(), e.what(), discard));
  }
  const std::string wanted = RunIdentity(config);
  if (stored_identity != wanted) {
    // This run with a path spelled otherwise ("m/" for "m", "./m", an absolute path): the run's
    // spelling is part of its identity (its checkpoints carry it), so it is the one to pass.
    Config respelled = config;
    std::vector<std::string> spellings;
    const auto respell = [&](const char* key, std::string& mine, const std::string& run) {
      if (mine != run && !mine.empty() && !run.empty() && SamePath(mine, run)) {
        spellings.push_back(fmt::format("{}={}", key, run));
        mine = run;
      }
    };
    respell("student.hf_dir", respelled.student.hf_dir, stored.student.hf_dir);
    respell("teacher.hf_dir", respelled.teacher.hf_dir, stored.teacher.hf_dir);
    respell("teacher.checkpoint", respelled.teacher.checkpoint, stored.teacher.checkpoint);
    respell("data.path", respelled.data.path, stored.data.path);
    respell("data.val_path", respelled.data.val_path, stored.data.val_path);
    if (!spellings.empty() && RunIdentity(respelled) == stored_identity) {
      throw RunDirError(fmt::format(
          "{} holds this run, started with the same path{} spelled otherwise; the spelling is "
          "part of the run's identity: to continue it, pass {} (or spell {} so in the config file)",
          dir.string(), spellings.size() == 1 ? "" : "s", fmt::join(spellings, " "),
          spellings.size() == 1 ? "it" : "them"));
    }
    // A run directory moved since: its config.yaml names where it was.
    const std::string moved =
        stored_out_dir == config.train.out_dir
            ? ""
            : fmt::format(
                  " train.out_dir={} (its config.yaml names {}: moved since? then the "
                  "other paths it names may have moved too)",
                  config.train.out_dir, stored_out_dir);
    throw RunDirError(fmt::format(
        "{} holds a different run ({}); to continue that run use --config {}{}, to start this "
        "one {} or set train.out_dir to another directory",
        dir.string(), FirstDifference(stored_identity, wanted), config_file.string(), moved,
        discard));
  }
  if (!config.train.resume) {
    throw RunDirError(
        fmt::format("{} already holds this run and train.resume is false; set train.resume=true to "
                    "continue it, or pass --fresh to start over",
                    dir.string()));
  }
  if (plan.lock == nullptr) plan.lock = std::make_shared<RunLock>(dir.string());  // no marker
  plan.same_run = true;
  return plan;
}

void CommitRunDir(const Config& config, RunDirPlan& plan) {
  const fs::path dir = config.train.out_dir;
  // (Already gone when it lay inside a pipeline directory that --fresh has just deleted.)
  if (plan.delete_first && fs::exists(dir)) {
    if (!IsOwnRunDir(dir.string())) {  // PlanRunDir checked; never delete what is not ours
      throw RunDirError(fmt::format("{}: no {} marker; not deleting it", dir.string(), kRunMarker));
    }
    // The runs inside it (a pipeline's stages) locked for the deletion: refused if another
    // process trains in one.
    const auto inside = LockRunsInside(dir.string());
    CheckOnlyOursToDelete(dir);  // again: a file put there since PlanRunDir
    // Everything but the lock file, which this process holds (no other process can take the
    // directory between the deletion and the new run's files), and the marker last: a deletion
    // that fails part-way leaves a directory that --fresh still deletes.
    std::vector<std::string> doomed;  // listed first: no deletion while the listing runs
    for (const auto& entry : fs::directory_iterator(dir)) {
      const fs::path name = entry.path().filename();
      if (name != kRunLock && name != kRunMarker) doomed.push_back(entry.path().string());
    }
    for (const std::string& path : doomed) RemoveTree(path);
    RemoveTree((dir / kRunMarker).string());
  }
  // Only the directories this process creates are its own (a failed creation removes them
  // again; so does a failed start, UndoFailedStart): a link whose target is missing is named,
  // never taken for a missing directory and removed.
  try {
    plan.created = CreateDirectories(dir.string());
  } catch (const FileError& e) {  // a file on the path, a read-only filesystem, a name too long
    throw RunDirError(fmt::format("train.out_dir \"{}\": {}", dir.string(), e.what()));
  }
  if (plan.lock == nullptr || !plan.lock->Current()) {
    plan.lock = std::make_shared<RunLock>(dir.string());
    // Planned as a new run: a process that started one here meanwhile (and may have finished
    // it) owns the directory now.
    if (!plan.same_run && !IsUnstarted(dir)) {
      throw RunDirError(fmt::format(
          "{} was started by another distill_trainer while this one was starting; run the "
          "command again to resume that run",
          dir.string()));
    }
  }
  const bool created = IsUnstarted(dir);
  if (created) {
    WriteFileAtomically((dir / kRunMarker).string(),
                        fmt::format("run_id: {}\ncreated: {}\nconfig_hash: {}\n", RandomRunId(),
                                    UtcNow(), RunIdentityHash(config)));
  } else if (IsOwnRunDir(dir.string())) {
    // The identities the checkpoints here may carry beside this config's (those of the
    // config.yaml about to be rewritten: a moved stage's paths as they were typed) go into the
    // marker first, so that a start interrupted before its first checkpoint, or a fallback to an
    // older checkpoint later, still finds them this run's.
    const std::vector<std::string> ours = AcceptedRunIdentityHashes(config);
    std::vector<std::string> keep;
    for (const std::string& hash : StoredRunIdentityHashes(dir.string())) {
      if (std::find(ours.begin(), ours.end(), hash) == ours.end()) keep.push_back(hash);
    }
    if (!keep.empty() && keep != MarkerPreviousIdentities(dir)) {
      std::ifstream in(dir / kRunMarker);
      std::string marker;
      for (std::string line; std::getline(in, line);) {
        if (line.rfind(kPreviousIdentitiesKey, 0) != 0) marker += line + "\n";
      }
      marker += kPreviousIdentitiesKey + fmt::format("{}\n", fmt::join(keep, " "));
      WriteFileAtomically((dir / kRunMarker).string(), marker);
    }
  }
  WriteFileAtomically((dir / "config.yaml").string(), ConfigToYaml(config));
}

}  // namespace distill

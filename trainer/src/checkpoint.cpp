#include "distill/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "distill/file_io.h"
#include "distill/memory_estimate.h"  // IsOutOfMemory
#include "distill/run_dir.h"          // Fnv1a64

namespace distill {
namespace fs = std::filesystem;

namespace {

at::Generator DefaultGenerator(const at::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

// A zip archive that torch reads but that SaveCheckpoint did not write (a TorchScript module, a
// file of another program) is refused as a damaged checkpoint, naming the file and what is wrong
// in it, not with torch's internal assertion; a resume then falls back to the previous one.
[[noreturn]] void NotACheckpoint(const std::string& path, const std::string& what) {
  throw CorruptCheckpointError(
      fmt::format("{}: not a distill_trainer checkpoint ({})", path, what));
}

std::string FirstLine(const c10::Error& e) {
  const std::string text = e.what_without_backtrace();
  return text.substr(0, text.find('\n'));
}

// The field `key` as SaveCheckpoint wrote it; nullopt where the archive lacks it (an older
// checkpoint).
std::optional<c10::IValue> TryField(torch::serialize::InputArchive& archive,
                                    const std::string& path, const char* key) {
  c10::IValue value;
  try {
    if (!archive.try_read(key, value)) return std::nullopt;
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;  // the device's state, not the file's
    NotACheckpoint(path, fmt::format("its \"{}\" cannot be read: {}", key, FirstLine(e)));
  }
  return value;
}

c10::IValue Field(torch::serialize::InputArchive& archive, const std::string& path,
                  const char* key) {
  auto value = TryField(archive, path, key);
  if (!value) NotACheckpoint(path, fmt::format("it has no \"{}\"", key));
  return *value;
}

int64_t IntField(const c10::IValue& value, const std::string& path, const char* key) {
  if (!value.isInt()) {
    NotACheckpoint(path, fmt::format("its \"{}\" holds a value of type {}, not an integer", key,
                                     value.tagKind()));
  }
  return value.toInt();
}

double DoubleField(const c10::IValue& value, const std::string& path, const char* key) {
  if (!value.isDouble()) {
    NotACheckpoint(path, fmt::format("its \"{}\" holds a value of type {}, not a number", key,
                                     value.tagKind()));
  }
  return value.toDouble();
}

std::string StringField(const c10::IValue& value, const std::string& path, const char* key) {
  if (!value.isString()) {
    NotACheckpoint(
        path, fmt::format("its \"{}\" holds a value of type {}, not text", key, value.tagKind()));
  }
  return value.toStringRef();
}

// The sub-archive `key` (the model's or the optimizer's state) loaded into `load`.
template <typename Load>
void LoadPart(torch::serialize::InputArchive& archive, const std::string& path, const char* key,
              Load&& load) {
  torch::serialize::InputArchive part;
  try {
    archive.read(key, part);
    load(part);
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;
    NotACheckpoint(path, fmt::format("its \"{}\" cannot be loaded: {}", key, FirstLine(e)));
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // torch's optimizer loader parses keys with std::stoull
    NotACheckpoint(path, fmt::format("its \"{}\" cannot be loaded: {}", key, e.what()));
  }
}

// The first parameter of `model` holding NaN or inf, with how many such values; nullopt when
// every one is finite. One sync for all parameters on the common (finite) path.
struct NonFiniteParameter {
  std::string name;
  int64_t count;
  int64_t numel;
};
std::optional<NonFiniteParameter> FirstNonFiniteParameter(const CausalLM& model) {
  std::vector<at::Tensor> finite;
  for (const auto& p : model.parameters()) finite.push_back(at::isfinite(p).all());
  if (finite.empty() || at::stack(finite).all().item<bool>()) return std::nullopt;
  for (const auto& p : model.named_parameters()) {
    const int64_t bad = at::logical_not(at::isfinite(p.value())).sum().item<int64_t>();
    if (bad > 0) return NonFiniteParameter{p.key(), bad, p.value().numel()};
  }
  return std::nullopt;
}

// The weights just loaded from `path` are finite: the trainer never writes a checkpoint that is
// not (SaveCheckpoint), so one whose weights hold NaN or inf was written by something else and is
// refused as not ours, naming the first such tensor -- a run directory's older checkpoint is then
// used instead -- where it would otherwise train on them (a student initialised from such a
// teacher) or fail hours in.
void CheckFiniteWeights(const CausalLM& model, const std::string& path) {
  if (const auto bad = FirstNonFiniteParameter(model)) {
    NotACheckpoint(path,
                   fmt::format("its weight {} holds {} NaN or infinite value{} of {}; the "
                               "trainer never writes non-finite weights",
                               bad->name, bad->count, bad->count == 1 ? "" : "s", bad->numel));
  }
}

// The run's checkpoints with their steps, oldest step first (by the parsed number: past 7
// digits the zero-padded names no longer sort by step).
std::vector<std::pair<int64_t, fs::path>> CheckpointEntries(const std::string& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  // Something else in its place, or a directory that cannot be looked at, is not "no
  // checkpoints": a resume would train again from step 0 and drop the run's metrics.
  std::error_code error, ignored;
  const fs::file_status status = fs::status(dir, error);
  if (!fs::is_directory(status)) {
    if (status.type() == fs::file_type::not_found &&
        !fs::exists(fs::symlink_status(dir, ignored))) {
      return {};
    }
    throw std::runtime_error(
        status.type() == fs::file_type::none
            ? fmt::format("{}: cannot look it up: {}", dir.string(), error.message())
            : fmt::format("{}: not a directory; a run keeps its checkpoints there: move it away",
                          dir.string()));
  }
  std::error_code listed;
  fs::directory_iterator entries(dir, listed);
  if (listed) {  // no read permission: named, not std::filesystem's message
    throw std::runtime_error(fmt::format("{}: cannot list it: {}", dir.string(), listed.message()));
  }
  for (const auto& entry : entries) {
    if (auto step = CheckpointStep(entry.path().filename().string())) {
      found.emplace_back(*step, entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// CheckpointEntries' files alone.
std::vector<fs::path> CheckpointFiles(const std::string& run_dir) {
  auto found = CheckpointEntries(run_dir);
  std::vector<fs::path> files;
  for (auto& f : found) files.push_back(std::move(f.second));
  return files;
}

// The keys in which two architecture strings ("key=value" words) differ, as " in n_layer (3 in
// the checkpoint, 4 configured), ..."; "" when they differ otherwise (a key only one names).
std::string ArchitectureDifference(const std::string& saved, const std::string& expected) {
  const auto words = [](const std::string& text) {
    std::map<std::string, std::string> out;
    std::istringstream in(text);
    for (std::string word; in >> word;) {
      const size_t eq = word.find('=');
      if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return out;
  };
  const auto a = words(saved), b = words(expected);
  std::string out;
  for (const auto& [key, value] : b) {
    auto it = a.find(key);
    if (it == a.end() || it->second == value) continue;
    out += fmt::format("{}{} ({} in the checkpoint, {} configured)", out.empty() ? " in " : ", ",
                       key, it->second, value);
  }
  return out;
}

void CheckArchitecture(torch::serialize::InputArchive& archive, const CausalLM& model,
                       const std::string& path) {
  const std::string saved = StringField(Field(archive, path, "architecture"), path, "architecture");
  const std::string expected = ArchitectureString(model.config());
  // Checkpoints of gpt models written before the string named intermediate_size: the rest must
  // match (their MLP width is then not checked here).
  std::string legacy = expected;
  if (model.config().family == ModelFamily::kGpt && model.config().intermediate_size > 0) {
    const std::string part = fmt::format(" intermediate_size={}", model.config().intermediate_size);
    legacy.erase(legacy.find(part), part.size());
  }
  if (saved != expected && saved != legacy) {
    throw std::runtime_error(fmt::format(
        "{}: the checkpoint's model differs from the configured one{} (the checkpoint's: {}; the "
        "configured one: {})",
        path, ArchitectureDifference(saved, expected), saved, expected));
  }
}

constexpr char kMagic[] = "DISTILL-CKPT-1\n";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
constexpr size_t kHeaderSize = kMagicSize + 17;  // + 16 hex digits + '\n'

// The file's bytes, checksum verified; returns the torch archive part.
std::string ReadVerified(const std::string& path, std::string* bytes) {
  std::error_code error;
  if (fs::exists(path, error) && !fs::is_regular_file(path, error)) {  // /dev/zero would never end
    throw CorruptCheckpointError(
        fmt::format("{}: not a regular file (a directory, device or pipe); expected a checkpoint "
                    "file",
                    path));
  }
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    // Unreadable is not damaged: no fallback to an older checkpoint, and no advice to delete it.
    if (error == EACCES || error == EPERM) {
      throw FileError(fmt::format(
          "{}: cannot be read: {} (the checkpoint may be intact: make it readable, e.g. chmod "
          "u+r, and run the same command again)",
          path, std::strerror(error)));
    }
    // Nor is a process or system out of file descriptors or memory: the same command may open
    // it later.
    const char* want = error == EMFILE   ? "this process's descriptor limit, not the file: raise "
                                           "it (ulimit -n)"
                       : error == ENFILE ? "the system's open-file table, not the file: close "
                                           "files or raise fs.file-max"
                       : error == ENOMEM ? "the system's memory, not the file: free memory"
                       : error == EIO || error == ESTALE || error == ETIMEDOUT
                           ? "the disk or (network) filesystem, not the file: check it, e.g. dmesg"
                           : nullptr;
    if (want != nullptr) {
      throw FileError(fmt::format(
          "{}: cannot be opened now: {} ({}; the checkpoint may be intact: run the same command "
          "again)",
          path, std::strerror(error), want));
    }
    throw CorruptCheckpointError(
        fmt::format("{}: cannot be opened: {}", path, std::strerror(error)));
  }
  // A read that fails (EIO: a disk or network filesystem error) is not damage either: what the
  // file holds is judged by its checksum, once all of it could be read.
  const ScopedFd closer(fd);
  bytes->clear();
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes->reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got > 0) {
      bytes->append(buffer, static_cast<size_t>(got));
    } else if (got == 0) {
      break;
    } else if (errno != EINTR) {
      const int error = errno;
      throw FileError(fmt::format(
          "{}: cannot be read: {} after {} bytes (a read error of the disk or filesystem, not a "
          "damaged checkpoint: it may be intact; check the disk, e.g. dmesg, and run the same "
          "command again)",
          path, std::strerror(error), bytes->size()));
    }
  }
  if (bytes->compare(0, 2, "PK") == 0) return "";  // written before checksums: unverified
  if (bytes->size() < kHeaderSize || bytes->compare(0, kMagicSize, kMagic) != 0 ||
      (*bytes)[kHeaderSize - 1] != '\n') {
    throw CorruptCheckpointError(
        fmt::format("{}: not a distill_trainer checkpoint (no DISTILL-CKPT-1 header; {} bytes)",
                    path, bytes->size()));
  }
  const std::string stored = bytes->substr(kMagicSize, 16);
  const std::string computed =
      fmt::format("{:016x}", Fnv1a64(bytes->data() + kHeaderSize, bytes->size() - kHeaderSize));
  if (stored != computed) {
    throw CorruptCheckpointError(fmt::format(
        "{}: checksum mismatch (stored {}, computed {}): the file is corrupt or truncated", path,
        stored, computed));
  }
  return "verified";
}

// Opens the archive of `path` after verifying its checksum.
void OpenArchive(const std::string& path, const at::Device& device,
                 torch::serialize::InputArchive& archive) {
  std::string bytes;
  const bool verified = !ReadVerified(path, &bytes).empty();
  const size_t offset = verified ? kHeaderSize : 0;
  try {
    archive.load_from(bytes.data() + offset, bytes.size() - offset, device);
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;
    throw CorruptCheckpointError(
        fmt::format("{}: unreadable checkpoint ({})", path, e.what_without_backtrace()));
  }
}

}  // namespace

std::string CheckpointPath(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / fmt::format("step_{:07d}.pt", step)).string();
}

std::optional<std::string> LatestCheckpoint(const std::string& run_dir) {
  auto files = CheckpointFiles(run_dir);
  if (files.empty()) return std::nullopt;
  return files.back().string();
}

void PruneCheckpoints(const std::string& run_dir, int64_t keep, int64_t step,
                      const std::function<bool(const std::string& path)>& is_ours) {
  std::vector<fs::path> files;  // the checkpoints up to `step`, oldest first
  for (auto& [s, path] : CheckpointEntries(run_dir)) {
    if (s <= step && (!is_ours || is_ours(path.string()))) {
      files.push_back(std::move(path));
    }
  }
  for (size_t i = 0; i + keep < files.size(); ++i) fs::remove(files[i]);
  // A checkpoint's temporary that a killed write left (kill -9, or a second signal during it):
  // never renamed into place, never read, and as large as a checkpoint. This process's own write
  // is done and the run's lock keeps other processes out, so any there now is a stale one.
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "checkpoints", error)) {
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        CheckpointStep(name.substr(0, name.size() - 4)) && entry.is_regular_file(ignored) &&
        !entry.is_symlink(ignored)) {
      fs::remove(entry.path(), ignored);
    }
  }
}

void SaveCheckpoint(const std::string& path, const CausalLM& model,
                    const torch::optim::Optimizer& optimizer, const TrainingPosition& position,
                    const at::Device& device, const std::string& run_identity) {
  // A non-finite checkpoint would poison every resume.
  if (const auto bad = FirstNonFiniteParameter(model)) {
    throw std::runtime_error(fmt::format(
        "not writing {}: the model's parameter {} holds NaN or inf values", path, bad->name));
  }
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("architecture", c10::IValue(ArchitectureString(model.config())));
  archive.write("run_identity", c10::IValue(run_identity));
  archive.write("step", c10::IValue(position.step));
  archive.write("data_position", c10::IValue(position.data_position));
  archive.write("elapsed_s", c10::IValue(position.elapsed_s));
  archive.write("skipped_steps", c10::IValue(position.skipped_steps));
  archive.write("data_files", c10::IValue(position.data_files));
  archive.write("teacher_weights", c10::IValue(position.teacher_weights));
  archive.write("rng_cpu", DefaultGenerator(at::Device(at::kCPU)).get_state(), /*is_buffer=*/true);
  if (device.is_cuda()) {
    archive.write("rng_cuda", DefaultGenerator(device).get_state(), /*is_buffer=*/true);
  }
  // Serialized in memory, then written by us: torch's file writer aborts the process when a
  // write fails (its destructor throws), ours reports the file and the cause.
  std::string bytes(kHeaderSize, ' ');  // the header, filled in once the checksum is known
  try {
    archive.save_to([&bytes](const void* data, size_t size) -> size_t {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;
    throw FileError(fmt::format("cannot write {}: serializing the checkpoint failed: {}", path,
                                e.what_without_backtrace()));
  }
  const std::string header = fmt::format(
      "{}{:016x}\n", kMagic, Fnv1a64(bytes.data() + kHeaderSize, bytes.size() - kHeaderSize));
  bytes.replace(0, kHeaderSize, header);
  std::error_code error;
  fs::create_directories(fs::path(path).parent_path(), error);
  if (error) {
    throw FileError(
        fmt::format("cannot write {}: cannot create its directory: {}", path, error.message()));
  }
  WriteFileAtomically(path, bytes);
}

namespace {

// The newest checkpoint is found by its name's step: a file holding another step (a copy under
// another checkpoint's name) would set a resume back to that step at every start, and give a run
// directory's reader older weights. Refused as damaged, so that the one before it is taken.
void CheckStepMatchesName(torch::serialize::InputArchive& archive, const std::string& path) {
  const auto named = CheckpointStep(fs::path(path).filename().string());
  const auto stored = TryField(archive, path, "step");
  if (!named || !stored) return;
  const int64_t step = IntField(*stored, path, "step");
  if (step == *named) return;
  throw CorruptCheckpointError(fmt::format(
      "{}: holds step {}, not step {} as its name says (a copy under another name?); move it "
      "away or name it after its step",
      path, step, *named));
}

}  // namespace

namespace {

// The zip archive inside a checkpoint file, from `offset` on, for PyTorchStreamReader: read in
// place (pread), so that one record is read without the rest of a file of gigabytes.
class FileTailAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  FileTailAdapter(const std::string& path, uint64_t offset) : offset_(offset) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < offset) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error(fmt::format("{}: cannot be read", path));
    }
    size_ = static_cast<uint64_t>(st.st_size) - offset;
  }
  ~FileTailAdapter() override { ::close(fd_); }
  FileTailAdapter(const FileTailAdapter&) = delete;
  FileTailAdapter& operator=(const FileTailAdapter&) = delete;
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, static_cast<char*>(buf) + done, n - done,
                                  static_cast<off_t>(offset_ + pos + done));
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  int fd_ = -1;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

// The run identity read from the archive's pickled attributes alone ("data.pkl": the key
// "run_identity" followed by its value, a BINUNICODE string of 16 hex digits); "" where the
// key is absent; nullopt where the record does not read as expected.
std::optional<std::string> RunIdentityFromPickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[kMagicSize] = {};
  in.read(head, kMagicSize);
  const uint64_t offset = in.gcount() == static_cast<std::streamsize>(kMagicSize) &&
                                  std::string(head, kMagicSize) == kMagic
                              ? kHeaderSize
                              : 0;  // written before checksums: the zip from the start
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<FileTailAdapter>(path, offset));
  if (!reader.hasRecord("data.pkl")) return std::nullopt;
  auto [data, size] = reader.getRecord("data.pkl");
  const std::string pickle(static_cast<const char*>(data.get()), size);
  const std::string key = "run_identity";
  const size_t at = pickle.find(key);
  if (at == std::string::npos) return std::string();
  // After the key: at most a memo opcode (BINPUT 'q' + 1 byte, LONG_BINPUT 'r' + 4), then
  // BINUNICODE 'X' with a 4-byte little-endian length of 16.
  const std::string value_op("X\x10\x00\x00\x00", 5);
  const size_t op = pickle.find(value_op, at + key.size());
  if (op == std::string::npos || op > at + key.size() + 5 || op + 5 + 16 > pickle.size()) {
    return std::nullopt;
  }
  std::string value = pickle.substr(op + 5, 16);
  for (const char c : value) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return value;
}

}  // namespace

std::string CheckpointRunIdentity(const std::string& path) {
  try {
    if (const auto identity = RunIdentityFromPickle(path)) return *identity;
  } catch (const std::exception&) {  // c10::Error from a damaged zip: the full read says why
  }
  torch::serialize::InputArchive archive;
  OpenArchive(path, at::kCPU, archive);
  const auto saved = TryField(archive, path, "run_identity");
  return saved ? StringField(*saved, path, "run_identity") : std::string();
}

TrainingPosition LoadCheckpoint(const std::string& path, CausalLM& model,
                                torch::optim::Optimizer& optimizer, const at::Device& device,
                                const std::vector<std::string>& run_identities) {
  torch::serialize::InputArchive archive;
  OpenArchive(path, device, archive);
  CheckArchitecture(archive, model, path);
  if (const auto saved = TryField(archive, path, "run_identity");
      saved && !run_identities.empty()) {
    const std::string identity = StringField(*saved, path, "run_identity");
    if (!identity.empty() &&
        std::find(run_identities.begin(), run_identities.end(), identity) == run_identities.end()) {
      throw std::runtime_error(fmt::format(
          "{} is a checkpoint of another run (run identity {}; this run's config.yaml gives {}): "
          "either the run's config.yaml was edited after the checkpoint was written (undo the "
          "edit; moving the checkpoint away would restart the run), or the checkpoint was copied "
          "here from another run (move it away, or use that run's config)",
          path, identity, run_identities.front()));
    }
  }
  CheckStepMatchesName(archive, path);
  // The position's fields first: a file that is not ours is refused before any weight changes.
  TrainingPosition position;
  position.step = IntField(Field(archive, path, "step"), path, "step");
  position.data_position = IntField(Field(archive, path, "data_position"), path, "data_position");
  // Checkpoints written before elapsed_s was saved resume at 0 s.
  if (auto v = TryField(archive, path, "elapsed_s")) {
    position.elapsed_s = DoubleField(*v, path, "elapsed_s");
  }
  // ... and before skipped_steps was, with none counted.
  if (auto v = TryField(archive, path, "skipped_steps")) {
    position.skipped_steps = IntField(*v, path, "skipped_steps");
  }
  // ... and before the data's files were.
  if (auto v = TryField(archive, path, "data_files")) {
    position.data_files = StringField(*v, path, "data_files");
  }
  // ... and before the teacher's weights were.
  if (auto v = TryField(archive, path, "teacher_weights")) {
    position.teacher_weights = StringField(*v, path, "teacher_weights");
  }
  at::Tensor rng_cpu, rng_cuda;
  try {
    archive.read("rng_cpu", rng_cpu, /*is_buffer=*/true);
    if (device.is_cuda()) archive.try_read("rng_cuda", rng_cuda, /*is_buffer=*/true);
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;
    NotACheckpoint(path,
                   fmt::format("its random generators' states cannot be read: {}", FirstLine(e)));
  }
  // A file torch reads but that is not ours can still fail midway through the weights; a resume
  // then loads the previous checkpoint, which replaces every weight and the optimizer's state.
  LoadPart(archive, path, "model", [&](auto& part) { model.load(part); });
  CheckFiniteWeights(model, path);
  LoadPart(archive, path, "optimizer", [&](auto& part) { optimizer.load(part); });
  try {
    DefaultGenerator(at::Device(at::kCPU)).set_state(rng_cpu.cpu());
    if (rng_cuda.defined()) DefaultGenerator(device).set_state(rng_cuda.cpu());
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) throw;
    NotACheckpoint(path, fmt::format("its random generators' states do not fit: {}", FirstLine(e)));
  }
  return position;
}

namespace {

// The weights of one checkpoint file into `model` (its architecture checked first). Returns a
// warning when the run that wrote it skipped every one of its steps as non-finite (the weights
// are the ones the run started from, never updated), else "".
// check_name: a file found in a run directory's checkpoints/ (not one named by the user).
std::string ReadWeights(const std::string& file, CausalLM& model, const at::Device& device,
                        const std::string& what, bool check_name = false) {
  torch::serialize::InputArchive archive;
  OpenArchive(file, device, archive);
  CheckArchitecture(archive, model, file);
  if (check_name) CheckStepMatchesName(archive, file);
  const auto step_field = TryField(archive, file, "step");
  const auto skipped_field = TryField(archive, file, "skipped_steps");
  const int64_t step = step_field ? IntField(*step_field, file, "step") : 0;
  const int64_t skipped = skipped_field ? IntField(*skipped_field, file, "skipped_steps") : -1;
  LoadPart(archive, file, "model", [&](auto& part) { model.load(part); });
  CheckFiniteWeights(model, file);
  if (step > 0 && skipped == step) {
    return fmt::format(
        "warning: {}: {}: all {} steps before this checkpoint were skipped as non-finite "
        "(train.nonfinite=skip): its weights were never updated (the ones the run started from)",
        what, file, step);
  }
  return "";
}

struct IntactCheckpoint {
  std::string file;
  std::vector<std::string> skipped;     // the errors of the corrupt newer checkpoints
  std::set<std::string> skipped_names;  // their file names in checkpoints/
};

// Calls `load` on the checkpoints of `run_dir`, newest first, until one does not throw
// CorruptCheckpointError (a damaged file, before anything is changed; an archive the trainer did
// not write, possibly after some weights were loaded, which the next file replaces). nullopt: no
// checkpoints. None intact: throws CorruptCheckpointError "<prefix>no intact checkpoint in
// <run_dir>/checkpoints: <every file's error>; <fix>".
std::optional<IntactCheckpoint> LoadNewestIntact(
    const std::string& run_dir, const std::function<void(const std::string&)>& load,
    const std::string& prefix, const std::string& fix) {
  const std::vector<fs::path> files = CheckpointFiles(run_dir);
  if (files.empty()) return std::nullopt;
  IntactCheckpoint result;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      load(it->string());
    } catch (const CorruptCheckpointError& e) {
      result.skipped.push_back(e.what());
      result.skipped_names.insert(it->filename().string());
      continue;
    }
    result.file = it->string();
    return result;
  }
  throw CorruptCheckpointError(fmt::format("{}no intact checkpoint in {}: {}; {}", prefix,
                                           (fs::path(run_dir) / "checkpoints").string(),
                                           fmt::join(result.skipped, "; "), fix));
}

}  // namespace

std::string LoadWeights(const std::string& path, CausalLM& model, const at::Device& device,
                        const std::string& what, std::vector<std::string>* warnings) {
  std::string never_updated;
  const auto warn = [&](const std::string& line) {
    if (warnings != nullptr) {
      warnings->push_back(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  };
  if (fs::is_directory(path)) {
    // A run directory: its newest intact checkpoint, as a resume would take.
    const auto intact = LoadNewestIntact(
        path,
        [&](const std::string& file) {
          never_updated = ReadWeights(file, model, device, what, /*check_name=*/true);
        },
        what + ": ",
        what == "export" ? "this run has no intact weights to export"
                         : fmt::format("set {} to an intact checkpoint file or another run", what));
    if (!intact) {
      // A pipeline's directory holds its stages' runs: name them.
      std::vector<std::string> runs;
      for (const char* stage : {"teacher", "student", "baseline"}) {
        if (fs::is_directory(fs::path(path) / stage / "checkpoints")) {
          runs.push_back((fs::path(path) / stage).string());
        }
      }
      std::string stages;
      for (size_t i = 0; i < runs.size(); ++i) {
        stages += (i == 0 ? "" : i + 1 == runs.size() ? " or " : ", ") + runs[i];
      }
      // A Hugging Face model directory is the other key's (teacher.hf_dir).
      const bool hf = fs::is_regular_file(fs::path(path) / "config.json");
      throw std::runtime_error(fmt::format(
          "{}: \"{}\" is a directory without checkpoints/step_*.pt{}", what, path,
          !stages.empty() ? fmt::format(" (a pipeline's directory: its runs are {})", stages)
          : hf            ? fmt::format(" (a Hugging Face model directory, with config.json{})",
                             what == "teacher.checkpoint" ? ": give it as teacher.hf_dir" : "")
                          : ""));
    }
    for (const auto& failure : intact->skipped) {
      warn(fmt::format("warning: {}: {}; using the previous checkpoint, {}", what, failure,
                       intact->file));
    }
    if (!never_updated.empty()) warn(never_updated);
    return intact->file;
  }
  if (!fs::exists(path)) {
    throw std::runtime_error(
        fmt::format("{}: \"{}\" does not exist{}", what, path, RelativeTo(path)));
  }
  if (!fs::is_regular_file(path)) {
    throw std::runtime_error(fmt::format(
        "{}: \"{}\" is not a regular file (a device or pipe); expected a checkpoint file or a "
        "run directory",
        what, path));
  }
  // A teacher comes from another run by design: only the architecture must match.
  never_updated = ReadWeights(path, model, device, what);
  if (!never_updated.empty()) warn(never_updated);
  return path;
}

std::optional<TrainingPosition> LoadLatestGoodCheckpoint(
    const std::string& run_dir, CausalLM& model, torch::optim::Optimizer& optimizer,
    const at::Device& device, const std::vector<std::string>& run_identities,
    std::vector<std::string>* warnings, std::set<std::string>* skipped) {
  TrainingPosition position;
  const auto intact = LoadNewestIntact(
      run_dir,
      [&](const std::string& file) {
        position = LoadCheckpoint(file, model, optimizer, device, run_identities);
      },
      "", "move the damaged files away to resume from scratch in this directory, or pass --fresh");
  if (!intact) return std::nullopt;
  for (const auto& failure : intact->skipped) {
    warnings->push_back(fmt::format("warning: {}; resuming from the previous checkpoint, {}",
                                    failure, intact->file));
  }
  if (skipped != nullptr) *skipped = intact->skipped_names;
  return position;
}

std::array<int64_t, 2> WeightBitSums(const at::Tensor& tensor) {
  at::NoGradGuard no_grad;
  const at::Tensor flat = tensor.detach().contiguous().view(-1);
  const bool bytes = flat.element_size() == 1;
  const at::Tensor units = bytes ? flat.view(at::kByte) : flat.view(at::kShort);
  const int64_t n = units.numel();
  // On the host a slice at a time (a device's tensor is copied one slice at a time; a host
  // tensor's slice is a view), each slice's grains in parallel: integer sums, so any order gives
  // the same bits. Unsigned arithmetic wraps alike everywhere past 2^39 units (a 1 TiB tensor).
  constexpr int64_t kSlice = int64_t(1) << 24, kGrain = int64_t(1) << 20;
  uint64_t plain = 0, weighted = 0;
  for (int64_t start = 0; start < n; start += kSlice) {
    const at::Tensor slice = units.narrow(0, start, std::min(kSlice, n - start)).cpu();
    const int64_t len = slice.numel();
    const auto* u8 = bytes ? slice.data_ptr<uint8_t>() : nullptr;
    const auto* u16 =
        bytes ? nullptr : reinterpret_cast<const uint16_t*>(slice.data_ptr<int16_t>());
    std::vector<std::array<uint64_t, 2>> part(static_cast<size_t>((len + kGrain - 1) / kGrain));
    at::parallel_for(0, static_cast<int64_t>(part.size()), 1, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const int64_t begin = c * kGrain, end = std::min(len, begin + kGrain);
        uint64_t p = 0, w = 0, weight = static_cast<uint64_t>((start + begin) % 251) + 1;
        for (int64_t i = begin; i < end; ++i) {
          const uint64_t u = bytes ? u8[i] : u16[i];
          p += u;
          w += u * weight;
          if (++weight == 252) weight = 1;
        }
        part[static_cast<size_t>(c)] = {p, w};
      }
    });
    for (const auto& sums : part) {
      plain += sums[0];
      weighted += sums[1];
    }
  }
  return {static_cast<int64_t>(plain), static_cast<int64_t>(weighted)};
}

std::string WeightsFingerprint(const torch::nn::Module& module) {
  uint64_t hash = Fnv1a64("", 0);
  auto add = [&](const std::string& name, const at::Tensor& tensor) {
    const std::string what = fmt::format("{} {} [{}]", name, c10::toString(tensor.scalar_type()),
                                         fmt::join(tensor.sizes(), ", "));
    const std::array<int64_t, 2> sums = WeightBitSums(tensor);
    hash = Fnv1a64(what.data(), what.size(), hash);
    hash = Fnv1a64(sums.data(), sizeof(sums), hash);
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) add(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) add(item.key(), item.value());
  return fmt::format("{:016x}", hash);
}

}  // namespace distill

#include "distill/hf_export.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "distill/checkpoint.h"
#include "distill/file_io.h"
#include "distill/hf_config.h"
#include "distill/run.h"
#include "distill/run_dir.h"
#include "distill/safetensors.h"
#include "weights/json_limits.h"

namespace distill {
namespace fs = std::filesystem;

namespace {

// The files transformers' tokenizers and generation read beside the weights.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "vocab.json",
                                           "merges.txt",
                                           "tokenizer.model",
                                           "added_tokens.json",
                                           "chat_template.jinja",
                                           "generation_config.json"};

// For a file named *.json: the parser's message where `bytes` is not JSON, else "".
std::string JsonError(const fs::path& name, const std::string& bytes) {
  if (name.extension() != ".json") return "";
  try {
    [[maybe_unused]] const nlohmann::json parsed = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& e) {
    return JsonReason(e);  // without the library's "[json.exception.parse_error.101]"
  }
  return "";
}

// Byte copy: read with plain streams (see RemoveTree in run_dir.h for why not std::filesystem),
// written and synced as every export file is; a JSON file is parsed first and refused where it
// does not parse.
void CopyFile(const fs::path& from, const fs::path& to) {
  std::error_code error;  // a FIFO would block the copy, /dev/zero fill the disk
  if (!fs::is_regular_file(from, error)) {
    throw std::runtime_error(fmt::format(
        "export: {}: not a regular file (a directory, device or pipe); expected a tokenizer file "
        "to copy",
        from.string()));
  }
  std::ifstream in(from, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("export: cannot read {}", from.string()));
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (const std::string error = JsonError(from, bytes.str()); !error.empty()) {
    throw std::runtime_error(fmt::format(
        "export: {} is not valid JSON ({}); a model exported with it would not load; restore "
        "it (e.g. download the model again) and export again with `distill_trainer export`",
        from.string(), error));
  }
  WriteFileAtomically(to.string(), bytes.str());  // synced, as the weights and config.json are
}

// The model's tensors under their (transformers) names, float32 on the CPU (CausalLM::hf_name:
// the llama family's parameters and buffers are named as transformers names them; the gpt
// family's are renamed to GPT2LMHeadModel's, Conv1D weights transposed, and its
// padded-vocabulary mask buffer is not a weight). Rows that pad_vocab_to_multiple_of added to the
// embedding and lm_head are dropped: config.json's vocab_size is the real one, and transformers
// checks the shapes against it.
std::vector<std::pair<std::string, at::Tensor>> HfTensors(const CausalLM& model) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const auto add = [&](const std::string& key, const at::Tensor& value, bool parameter) {
    const std::optional<CausalLM::HfName> hf = model.hf_name(key);
    if (!hf) return;
    at::Tensor t = value.detach().to(at::kCPU);
    if (parameter) t = t.to(at::kFloat);
    if (hf->transpose) t = t.t();
    const bool vocab_rows = hf->name == "model.embed_tokens.weight" ||
                            hf->name == "transformer.wte.weight" || hf->name == "lm_head.weight";
    if (vocab_rows && t.size(0) > vocab) t = t.narrow(0, 0, vocab);
    tensors.emplace_back(hf->name, t.contiguous());
  };
  for (const auto& item : model.named_parameters()) add(item.key(), item.value(), true);
  for (const auto& item : model.named_buffers()) add(item.key(), item.value(), false);
  return tensors;
}

// Whether `dir` holds a tokenizer an export copies: tokenizer.json, or a SentencePiece
// tokenizer.model alone (older Llama and Mistral repositories), or GPT-2's vocab.json (with
// merges.txt); not generation_config.json alone, which save_pretrained writes beside any model.
bool HasTokenizer(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.json"}) {
    std::error_code error;  // a link that loops: not a tokenizer
    if (fs::exists(fs::path(dir) / name, error)) return true;
  }
  return false;
}

// The first of `dirs` with a tokenizer (HasTokenizer), or "" if none.
std::string TokenizerDir(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    if (HasTokenizer(dir)) return dir;
  }
  return "";
}

// How a run's HF directory that has no config.json now is reported: moved or deleted, or (a
// relative path) read from another working directory than the run's.
std::string Gone(const std::string& dir) {
  if (fs::path(dir).is_relative()) {
    std::error_code error;
    const fs::path cwd = fs::current_path(error);
    return fmt::format(
        "{}/config.json is not found from the working directory {} (a relative path: moved or "
        "deleted since the run, or the run was started in another directory)",
        dir, error ? std::string("?") : cwd.string());
  }
  return fmt::format("{}/config.json is gone (moved or deleted since the run)", dir);
}

}  // namespace

HfExportSources ExportSources(const Config& config, const std::string& run_dir) {
  HfExportSources sources;
  std::vector<std::string> dirs, gone;
  for (const std::string& dir :
       {config.student.hf_dir, config.teacher.hf_dir, config.train.export_from}) {
    if (dir.empty()) continue;
    std::error_code error;  // a config.json that cannot be reached counts as gone
    (fs::exists(fs::path(dir) / "config.json", error) ? dirs : gone).push_back(dir);
  }
  if (!gone.empty() && !run_dir.empty()) {
    const fs::path own = fs::path(run_dir) / "hf";
    std::error_code error;
    if (fs::exists(own / "config.json", error)) {
      sources.config_template = (own / "config.json").string();
      sources.tokenizer_dir = TokenizerDir({own.string()});
      sources.note = fmt::format(
          "warning: {}; config.json's other keys and the tokenizer files are taken from the "
          "run's own export {}",
          Gone(gone.front()), own.string());
      return sources;
    }
  }
  if (!dirs.empty()) sources.config_template = (fs::path(dirs.front()) / "config.json").string();
  sources.tokenizer_dir = TokenizerDir(dirs);
  std::vector<std::string> dangling;
  for (auto& d : DanglingExportTokenizerFiles(
           {config.student.hf_dir, config.teacher.hf_dir, config.train.export_from})) {
    dangling.push_back(std::move(d.file));
  }
  const std::string dangling_note =
      dangling.empty()
          ? ""
          : fmt::format(
                "warning: the export has no copy of {}: links that lead to no file (a "
                "Hugging Face cache whose files were deleted?); restore them, e.g. by downloading "
                "the model again, and export again with `distill_trainer export`",
                fmt::join(dangling, ", "));
  if (!gone.empty() && !run_dir.empty()) {
    // What stands in for the missing directory: the other model's files, or nothing.
    const std::string keys =
        dirs.empty()
            ? "config.json is written from the run's config alone"
            : fmt::format("config.json's other keys are taken from {}", sources.config_template);
    const std::string tokenizer =
        sources.tokenizer_dir.empty()
            ? std::string("no tokenizer files are copied")
            : fmt::format("the tokenizer files from {}", sources.tokenizer_dir);
    sources.note =
        fmt::format("warning: {}, and the run has no export of its own ({}): {}, and {}",
                    Gone(gone.front()), (fs::path(run_dir) / "hf").string(), keys, tokenizer);
  }
  if (!dangling_note.empty())
    sources.note = sources.note.empty() ? dangling_note : sources.note + "\n" + dangling_note;
  return sources;
}

std::vector<UncopyableTokenizerFile> DanglingExportTokenizerFiles(
    const std::vector<std::string>& dirs) {
  std::vector<UncopyableTokenizerFile> dangling;
  for (size_t d = 0; d < dirs.size(); ++d) {
    std::error_code error;
    if (dirs[d].empty() || !fs::exists(fs::path(dirs[d]) / "config.json", error)) continue;
    for (const char* name : kTokenizerFiles) {
      const fs::path file = fs::path(dirs[d]) / name;
      if (!fs::is_symlink(fs::symlink_status(file, error))) continue;
      const fs::file_status status = fs::status(file, error);
      if (status.type() == fs::file_type::not_found) {
        const fs::path target = fs::read_symlink(file, error);
        dangling.push_back({d,
                            fmt::format("\"{}\" (a link to \"{}\")", file.string(),
                                        error ? std::string("?") : target.string()),
                            "a link that leads to no file"});
      } else if (error) {  // a loop of links (tokenizer.json -> tokenizer.json)
        dangling.push_back({d,
                            error.value() == ELOOP
                                ? fmt::format("\"{}\" (a link that loops)", file.string())
                                : fmt::format("\"{}\" (a link that cannot be followed: {})",
                                              file.string(), error.message()),
                            "a link that leads to no file"});
      }
    }
    if (HasTokenizer(dirs[d])) break;
  }
  return dangling;
}

std::optional<size_t> ExportTokenizerDir(const std::vector<std::string>& dirs) {
  for (size_t d = 0; d < dirs.size(); ++d) {
    std::error_code error;
    if (!dirs[d].empty() && fs::exists(fs::path(dirs[d]) / "config.json", error) &&
        HasTokenizer(dirs[d])) {
      return d;
    }
  }
  return std::nullopt;
}

std::vector<UncopyableTokenizerFile> UncopyableExportTokenizerFiles(
    const std::vector<std::string>& dirs) {
  std::vector<UncopyableTokenizerFile> uncopyable;
  // Only the directory the export copies from (TokenizerDir's): the first with a tokenizer.
  if (const std::optional<size_t> found = ExportTokenizerDir(dirs)) {
    const size_t d = *found;
    for (const char* name : kTokenizerFiles) {
      const fs::path file = fs::path(dirs[d]) / name;
      const std::string quoted = fmt::format("\"{}\"", file.string());
      std::error_code error;
      const fs::file_status status = fs::status(file, error);
      // Absent, or a link to nothing (DanglingExportTokenizerFiles'): not copied, not refused.
      if (status.type() == fs::file_type::not_found) continue;
      if (error) {  // a link that loops, a directory that cannot be searched
        uncopyable.push_back(
            {d, quoted, fmt::format("it cannot be reached ({})", error.message())});
        continue;
      }
      if (!fs::is_regular_file(status)) {
        uncopyable.push_back({d, quoted,
                              fs::is_directory(status)
                                  ? "a directory, not a file"
                                  : "not a regular file (a device, pipe or socket)"});
        continue;
      }
      std::ifstream in(file, std::ios::binary);
      if (!in) {  // no read permission
        uncopyable.push_back({d, quoted, "it cannot be read"});
        continue;
      }
      if (file.extension() != ".json") continue;
      std::stringstream bytes;
      bytes << in.rdbuf();
      if (const std::string message = JsonError(file, bytes.str()); !message.empty()) {
        uncopyable.push_back({d, fmt::format("{} ({})", quoted, message), "not valid JSON"});
      }
    }
  }
  return uncopyable;
}

bool IsExportFileName(const std::string& name) {
  bool ours = name == "config.json" || name == "model.safetensors";
  for (const char* file : kTokenizerFiles) ours = ours || name == file;
  return ours;
}

namespace {
bool AllDigits(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}
}  // namespace

bool IsExportFileOrTemporary(const std::string& name) {
  if (IsExportFileName(name) || name == kExportMarker) return true;
  const size_t at = name.rfind(".tmp");
  if (at == std::string::npos || !IsExportFileName(name.substr(0, at))) return false;
  return at + 4 == name.size() || (name[at + 4] == '.' && AllDigits(name, at + 5));
}

bool IsExportSibling(const std::string& name, const std::string& target, const std::string& kind) {
  const std::string prefix = target + kind;
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         AllDigits(name, prefix.size());
}

namespace {

// The entries of `dir` that an export does not write (a user's notes or model card), by name;
// the export's marker is its own, and with `temporaries` so are the temporaries of its files.
std::vector<std::string> ForeignEntries(const fs::path& dir, bool temporaries = false) {
  std::vector<std::string> foreign;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = temporaries ? IsExportFileOrTemporary(name)
                                  : IsExportFileName(name) || name == kExportMarker;
    if (!ours) foreign.push_back(name);
  }
  std::sort(foreign.begin(), foreign.end());
  return foreign;
}

// The marker an export puts in the directories it creates or moves aside (its temporary, the
// previous export): what it may delete when a stopped export left one. A directory merely named
// like one is a user's.
bool Marked(const fs::path& dir) {
  std::error_code ignored;
  return fs::is_regular_file(fs::symlink_status(dir / kExportMarker, ignored));
}
// One create, no temporary: a process killed meanwhile leaves the marker whole or absent.
void Mark(const fs::path& dir) {
  const std::string marker = (dir / kExportMarker).string();
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    throw FileError(fmt::format("cannot create {}: {}", marker, DescribeWriteError(error)));
  }
  ::close(fd);
}
void Unmark(const fs::path& dir) {
  std::error_code ignored;
  if (Marked(dir)) fs::remove(dir / kExportMarker, ignored);
}
// Deletes a marked directory: the marker last, so that one a kill stopped part-way is still
// marked, and deleted, at the next export.
void RemoveMarked(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename() != kExportMarker) RemoveTree(entry.path().string());
  }
  fs::remove(dir / kExportMarker);
  fs::remove(dir);
}

// Whether anything is at `path`, a link to nothing included (fs::exists follows links).
bool Present(const fs::path& path) {
  std::error_code ignored;
  return fs::exists(fs::symlink_status(path, ignored));
}

// A name for keeping a previous export that holds a user's files: <target>.previous(-N).
fs::path PreviousName(const fs::path& target) {
  fs::path kept = target.string() + ".previous";
  for (int n = 2; Present(kept); ++n) kept = target.string() + ".previous-" + std::to_string(n);
  return kept;
}

// Renames the directory `tmp` to `target` unless anything is at `target` (renameat2's
// RENAME_NOREPLACE: nothing between a check and the rename; where the filesystem lacks it, a
// check just before). Something there: the export's "already exists" error.
void MoveIntoPlaceUnlessPresent(const fs::path& tmp, const fs::path& target,
                                const std::string& out_dir) {
  int error = 0;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
    error = errno;
  }
  if (error == EINVAL || error == ENOSYS) {  // a filesystem without RENAME_NOREPLACE
    error = Present(target) ? EEXIST : ::rename(tmp.c_str(), target.c_str()) != 0 ? errno : 0;
  }
  if (error == EEXIST || error == ENOTEMPTY) {
    throw std::runtime_error(fmt::format(
        "export: {} already exists; choose a new directory (nothing is overwritten)", out_dir));
  }
  if (error != 0) {
    throw fs::filesystem_error("rename", tmp, target,
                               std::error_code(error, std::generic_category()));
  }
}

// Whether another process of this id is alive (a temporary it is still writing is not left
// over). This process's own id is not: what carries it was left by an earlier process that had
// the same id (a container's trainer is often pid 1 at every start).
bool OtherProcessAlive(const std::string& pid_text) {
  const long pid = std::strtol(pid_text.c_str(), nullptr, 10);
  return pid > 0 && pid <= std::numeric_limits<pid_t>::max() && pid != ::getpid() &&
         (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// Before an export: what an export killed before left beside `target`, named after its process
// id. Its temporary <target>.tmp-<pid>, holding the export's marker (kExportMarker: written by
// an export, never by hand) and only export files (or their temporaries), is deleted, unless that
// process still runs (`distill_trainer export` takes no run lock); a directory named so without
// the marker, or holding a user's files, is not the export's to delete and is left as it is.
// With `replace` (the run's own export), also its <target>.old-<pid>, the export before it, moved
// aside: put back where no export took its place; else deleted when it holds the marker and only
// export files, or kept as <target>.previous. Only tidying: a failure is a warning, not the
// export's. Returns warnings, one a line.
std::string RecoverInterruptedExports(const fs::path& target, bool replace) {
  std::string warnings;
  try {
    const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
    if (!fs::is_directory(parent)) return "";
    const std::string name = target.filename().string();
    std::vector<fs::path> temporaries, olds;
    for (const auto& entry : fs::directory_iterator(parent)) {
      const std::string n = entry.path().filename().string();
      // An old one may be a file or a link: what stood at the target (kept, never deleted).
      if (replace && IsExportSibling(n, name, ".old-")) olds.push_back(entry.path());
      if (!entry.is_directory() || entry.is_symlink()) continue;
      if (IsExportSibling(n, name, ".tmp-")) temporaries.push_back(entry.path());
    }
    std::sort(temporaries.begin(), temporaries.end());
    for (const fs::path& tmp : temporaries) {
      const std::string pid = tmp.filename().string().substr(name.size() + 5);
      if (OtherProcessAlive(pid)) continue;
      // Unmarked, or holding a user's files: not the export's to delete, left as it is; empty:
      // one stopped before its marker (rmdir, which loses nothing).
      std::error_code error;
      if (Marked(tmp) && ForeignEntries(tmp, /*temporaries=*/true).empty()) {
        RemoveMarked(tmp);
      } else if (fs::is_empty(tmp, error) && !error) {
        fs::remove(tmp, error);
      }
    }
    std::sort(olds.begin(), olds.end());
    for (const fs::path& old : olds) {
      if (OtherProcessAlive(old.filename().string().substr(name.size() + 5))) continue;
      const fs::file_status was = fs::symlink_status(old);
      // Renamed first, the marker removed after: a kill between leaves a marked export, which
      // is harmless, never an unmarked previous copy.
      if (!Present(target) && fs::is_directory(was) && Marked(old)) {
        fs::rename(old, target);
        Unmark(target);
        warnings +=
            fmt::format("warning: {} was left by an export that was stopped; it is {} again\n",
                        old.string(), target.string());
      } else if (!fs::is_directory(was)) {
        const fs::path kept = PreviousName(target);
        fs::rename(old, kept);
        warnings +=
            fmt::format("warning: {} ({}, left by an export that was stopped) was kept as {}\n",
                        old.string(), fs::is_symlink(was) ? "a link" : "a file", kept.string());
      } else if (Marked(old) && ForeignEntries(old).empty()) {
        RemoveMarked(old);
      } else if (std::error_code error; fs::is_empty(old, error) && !error) {
        fs::remove(old, error);  // one whose deletion a kill stopped after its marker: rmdir
      } else {
        const bool marked = Marked(old);
        const fs::path kept = PreviousName(target);
        fs::rename(old, kept);
        Unmark(kept);
        warnings += fmt::format(
            "warning: {} ({}) {}: it was kept as {}\n", old.string(),
            marked ? "left by an export that was stopped" : "named like an export's previous copy",
            marked ? "holds files the export does not write" : "was not moved there by an export",
            kept.string());
      }
    }
  } catch (const std::exception& e) {
    warnings +=
        fmt::format("warning: what an earlier, stopped export left beside {} was not tidied: {}\n",
                    target.string(), e.what());
  }
  return warnings;
}

// ExportHf's work once the family is checked; std::filesystem's errors come out as they are.
std::string ExportHfInto(const CausalLM& model, const std::string& out_dir,
                         const HfExportSources& sources, bool replace) {
  // "exported/" is the directory "exported": its temporary and old copies are its siblings
  // (with the separator they were inside it, and the final rename moved it into itself); so is
  // "exported/." (whose rename failed with "Device or resource busy").
  fs::path target = fs::path(WithoutTrailingSeparators(out_dir));
  while (target.filename() == "." && target.has_parent_path()) {
    target = fs::path(WithoutTrailingSeparators(target.parent_path().string()));
  }
  if (out_dir.empty()) {
    throw std::runtime_error("export: expected a directory path to create, got \"\"");
  }
  // The new directory's parent (created if missing) must be a directory, or be creatable.
  for (fs::path up = target.parent_path(); !up.empty(); up = up.parent_path()) {
    std::error_code looked;  // a loop of links, a directory that cannot be searched: named below
    if (fs::exists(up, looked)) {
      if (!fs::is_directory(up)) {
        throw std::runtime_error(fmt::format(
            "export: cannot create {}: {} is a file, not a directory", out_dir, up.string()));
      }
      break;
    }
    if (up == up.parent_path()) break;
  }
  if (Present(target) && !replace) {
    throw std::runtime_error(fmt::format(
        "export: {} already exists; choose a new directory (nothing is overwritten)", out_dir));
  }
  std::string recovered = RecoverInterruptedExports(target, replace);
  if (!recovered.empty()) recovered.pop_back();  // the last newline
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = target.string() + ".tmp-" + pid;
  const fs::path old = target.string() + ".old-" + pid;
  // Before anything is created: a student that the format cannot hold leaves no trace.
  const std::string config_json = HfConfigJson(model.config(), sources.config_template) + "\n";
  // The directories above the target that the export creates (those that existed, "a/.."
  // included, are not ours): removed again, if still empty, when it fails. A link on the way
  // whose target is missing, or a file there, is named (CreateDirectories).
  std::vector<std::string> created;
  if (target.has_parent_path()) {
    try {
      created = CreateDirectories(target.parent_path().string());
    } catch (const FileError& e) {  // named as the export's other errors are
      throw std::runtime_error(fmt::format("export: {}: {}", out_dir, e.what()));
    }
  }
  // Ours only once created here: one of this very process id that a killed export left was
  // tidied above; one still there is not marked as an export's, so not the export's to delete.
  bool tmp_created = false, target_marked = false, moved_aside = false;
  try {
    if (Present(tmp) || !fs::create_directory(tmp)) {
      throw std::runtime_error(fmt::format(
          "export: {} is in the way of the export's temporary directory and has no export marker "
          "(not one an export left, or left by an older distill_trainer); move it away and export "
          "again",
          tmp.string()));
    }
    tmp_created = true;
    Mark(tmp);
    WriteFileAtomically((tmp / "config.json").string(), config_json);
    WriteSafetensors((tmp / "model.safetensors").string(), HfTensors(model), {{"format", "pt"}});
    if (!sources.tokenizer_dir.empty()) {
      for (const char* name : kTokenizerFiles) {
        const fs::path from = fs::path(sources.tokenizer_dir) / name;
        // A link to nothing, or that loops, is left out: ExportSources' note names it.
        std::error_code error;
        if (fs::exists(from, error)) CopyFile(from, tmp / name);
      }
    }
    if (!replace) {
      // `distill_trainer export` never replaces: what another export or a user put at the target
      // meanwhile stays, and this export fails as it would have at the start.
      MoveIntoPlaceUnlessPresent(tmp, target, out_dir);
    } else {
      if (Present(target)) {
        // The previous export, marked before it is moved aside: if this export is stopped now,
        // the next one puts it back or deletes it (a file or a link is never marked, only kept).
        std::error_code ignored;
        if (fs::is_directory(fs::symlink_status(target, ignored))) {
          Mark(target);
          target_marked = true;
        }
        fs::rename(target, old);
        moved_aside = true;
      }
      fs::rename(tmp, target);  // the marker goes with it, and is removed below
    }
  } catch (...) {
    std::error_code ignored;
    if (tmp_created && Present(tmp)) {
      try {
        RemoveMarked(tmp);
      } catch (const std::exception&) {  // the export's own error is the one to report
      }
    }
    // The previous export moved aside and the new one not in place: the previous one goes back.
    if (moved_aside && !Present(target)) {
      fs::rename(old, target, ignored);
      if (!ignored) Unmark(target);
    } else if (target_marked && !moved_aside) {
      Unmark(target);
    }
    for (const std::string& dir : created) fs::remove(dir, ignored);  // deepest first; rmdir
    throw;
  }
  // The new export is in place: what follows only tidies the previous one, and its failure is a
  // warning, not the export's. (Stopped before the marker is removed: an export that carries
  // it, which the run's next export replaces; harmless otherwise.)
  const std::string before = recovered.empty() ? "" : recovered + "\n";
  try {
    Unmark(target);
    if (!moved_aside) return recovered;
    // What stood at the target was no directory (a user's file, or a link, even to a directory,
    // whose target is not the export's to replace): kept beside it, as it was.
    const fs::file_status was = fs::symlink_status(old);
    if (!fs::is_directory(was)) {
      const fs::path kept = PreviousName(target);
      fs::rename(old, kept);
      return before +
             fmt::format("warning: {} was {}, not an export's directory: it was kept as {}",
                         target.string(), fs::is_symlink(was) ? "a link" : "a file", kept.string());
    }
    // The previous export holds files the export does not write: not deleted, kept beside it.
    const std::vector<std::string> foreign = ForeignEntries(old);
    if (foreign.empty()) {
      RemoveMarked(old);
      return recovered;
    }
    const fs::path kept = PreviousName(target);
    fs::rename(old, kept);
    Unmark(kept);
    return before + fmt::format(
                        "warning: the previous {} held files the export does not write ({}): it "
                        "was kept as {}",
                        target.string(), fmt::join(foreign, ", "), kept.string());
  } catch (const std::exception& e) {
    return before + fmt::format("warning: exported to {}, but its previous copy is left at {}: {}",
                                target.string(), old.string(), e.what());
  }
}

}  // namespace

std::string ExportHf(const CausalLM& model, const std::string& out_dir,
                     const HfExportSources& sources, bool replace) {
  try {
    return ExportHfInto(model, out_dir, sources, replace);
  } catch (const fs::filesystem_error& e) {  // the path and the reason, without the library's
    throw std::runtime_error(                // "filesystem error: ... [a] [b]" form
        fmt::format("export: cannot write {}: {}", out_dir, e.code().message()));
  }
}

std::string ExportRun(const std::string& run_dir, const std::string& out_dir) {
  const fs::path config_file = fs::path(run_dir) / "config.yaml";
  if (!fs::exists(config_file)) {
    throw std::runtime_error(fmt::format(
        "export: \"{}\" is not a run directory (no config.yaml); give the train.out_dir of a run",
        run_dir));
  }
  const Config config = LoadConfigFile(config_file.string(), {}, ConfigOrigin::kStored);
  Model model = MakeModel(config.student);
  const std::string checkpoint = LoadWeights(run_dir, *model, at::Device(at::kCPU), "export");
  const HfExportSources sources = ExportSources(config, run_dir);
  if (!sources.note.empty()) std::cerr << sources.note << '\n';
  std::string warnings;
  try {
    warnings = ExportHf(*model, out_dir, sources, /*replace=*/false);
  } catch (const ConfigError& e) {  // the student the run's config describes: say which run
    throw ConfigError(
        fmt::format("{}: its student cannot be exported: {}", config_file.string(), e.what()));
  }
  if (!warnings.empty()) std::cerr << warnings << '\n';
  return checkpoint;
}

}  // namespace distill

// Durable writes of run files (checkpoints, config.yaml, summary.json, metrics.jsonl, ...): a
// file is replaced whole or not at all, and a failed write (a full disk, a read-only or broken
// filesystem, a file-size limit) is an error naming the file and the cause, never an abort.
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace distill {

class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes `size` bytes to `<path>.tmp` in the same directory (`tmp`, when given: a name of its
// own for a writer that may run beside another, e.g. with its process id), fsyncs it, renames it
// to `path` and fsyncs the directory. On any failure the temporary is removed, `path` is
// untouched (its previous content, or absent) and FileError says "cannot write <path>: <cause>".
void WriteFileAtomically(const std::string& path, const char* data, size_t size,
                         const std::string& tmp = "");
void WriteFileAtomically(const std::string& path, const std::string& content);

// The same for a writer that only takes a path (a library's save(path)): `write` writes the
// whole file at the temporary it is given (`<path>.tmp.<pid>`, created empty for it) and returns
// "" on success or what went wrong; a throw counts as failure too. Then as above: synced, renamed
// to `path`, the directory synced; on any failure the temporary is removed and `path` untouched.
void WriteFileAtomicallyBy(const std::string& path,
                           const std::function<std::string(const std::string& tmp)>& write);

// Opens a new file at `path` for writing (the temporary of an atomic write): whatever is there is
// unlinked first (a stale temporary, or a link: never written through to its target) and the
// file is created exclusively. Returns the descriptor, or -1 with errno set.
int CreateFileForWriting(const std::string& path);

// Creates directory `dir` and those above it that are missing, outermost first, one level at a
// time, and returns the ones this call created, deepest first: the caller's own, to remove again
// (rmdir: only while empty) when what it does next fails. A directory that was there, or that
// another process made meanwhile, is not in the list. A symbolic link on the way whose target is
// missing (a disk not mounted) or a file where a directory belongs is named in the FileError
// ("cannot create <dir>: <which> is ..."); whatever fails, what this call created is removed
// again before it throws, and nothing else (a link above all) is ever removed.
std::vector<std::string> CreateDirectories(const std::string& dir);

// A file opened for appending whole lines: each Append is one write() of `line` + '\n'
// (O_APPEND), so a reader never sees half a record that a later write completes.
class LineAppender {
 public:
  explicit LineAppender(const std::string& path);  // throws FileError
  ~LineAppender();
  LineAppender(const LineAppender&) = delete;
  LineAppender& operator=(const LineAppender&) = delete;
  void Append(const std::string& line);  // throws FileError (nothing is written then)

 private:
  std::string path_;
  int fd_ = -1;
};

// Owns a file descriptor: closes it when it goes out of scope, whatever is thrown meanwhile.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

 private:
  int fd_;
};

// For messages about a path a user gave: "" when `path` is absolute, a note that nothing
// expands it when it starts with '~', else
// " (relative paths are resolved against the working directory, <cwd>)". Paths in configs
// (train.out_dir, teacher.checkpoint, *.hf_dir, data.path) are relative to the working
// directory, not to the config file: a config run from elsewhere says so where it fails.
std::string RelativeTo(const std::string& path);

// A glob's directories before its first wildcard, where every match lies ("runs/x*/a.bin":
// "runs/"; "*.bin": "./"), or the pattern itself when it has no wildcard.
std::string GlobDirectories(const std::string& pattern);

// "No space left on device (the disk is full: free space, then run the same command again)"
// for errno `error`: strerror plus what to do for the common causes.
std::string DescribeWriteError(int error);

}  // namespace distill

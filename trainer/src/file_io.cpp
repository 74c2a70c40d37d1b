// Durable writes: temporary + fsync + rename + directory fsync; errors name the file.
#include "distill/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "distill/signals.h"  // RemoveOnSignalDeath

namespace distill {
namespace {

// write() until done; returns 0 or the errno of the failure (a short write of 0 bytes: ENOSPC).
int WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ENOSPC;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

// The last steps of an atomic write, once the temporary `tmp` holds the whole content and is
// synced: renamed over `path`, the directory synced. `fail` removes the temporary and throws.
template <typename Fail>
void RenameIntoPlace(const std::string& tmp, const std::string& path, const Fail& fail) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(errno, "rename: ");
  // The rename is durable once the directory is synced. Some filesystems cannot fsync a
  // directory (EINVAL); the data itself is then as durable as that filesystem allows.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int synced = ::fsync(dir_fd);
    const int sync_error = errno;
    ::close(dir_fd);
    if (synced != 0 && sync_error != EINVAL) {
      throw FileError(fmt::format("cannot write {}: syncing its directory: {}", path,
                                  DescribeWriteError(sync_error)));
    }
  }
}

}  // namespace

std::string DescribeWriteError(int error) {
  std::string text = std::strerror(error);
  switch (error) {
    case ENOSPC:
    case EDQUOT:
      return text + " (the disk is full: free space, then run the same command again)";
    case EFBIG:
      return text + " (a file-size limit, ulimit -f, was reached)";
    case EROFS:
      return text + " (the filesystem is read-only)";
    case EACCES:
    case EPERM:
      return text + " (no permission to write there)";
    default:
      return text;
  }
}

std::vector<std::string> CreateDirectories(const std::string& dir) {
  namespace fs = std::filesystem;
  const auto fail = [&dir](const std::string& why) {
    return FileError(fmt::format("cannot create {}: {}", dir, why));
  };
  // The missing levels, deepest first. symlink_status: a link is there even when its target is
  // not, and is never taken for a missing directory.
  std::vector<fs::path> missing;
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    std::error_code error;
    const fs::file_status link = fs::symlink_status(p, error);
    // Not there (or a link above it that goes nowhere, named when the walk reaches it): up.
    // Anything else is a directory above it that cannot be searched.
    if (error && error != std::errc::no_such_file_or_directory &&
        error != std::errc::not_a_directory && error != std::errc::too_many_symbolic_link_levels) {
      throw fail(fmt::format("cannot look up {}: {}", p.string(), error.message()));
    }
    if (fs::is_symlink(link)) {
      std::error_code followed, ignored;
      static_cast<void>(fs::status(p, followed));
      const std::string target = fs::read_symlink(p, ignored).string();
      if (followed == std::errc::no_such_file_or_directory) {
        throw fail(
            fmt::format("{} is a symbolic link to {}, which does not exist (a disk not "
                        "mounted?); create its target or choose another path",
                        p.string(), target));
      }
      if (followed) {  // a loop of links, a target that cannot be searched
        throw fail(fmt::format("{} is a symbolic link to {}, which cannot be followed: {}",
                               p.string(), target, followed.message()));
      }
    }
    if (fs::exists(link)) {
      if (!fs::is_directory(p, error)) {
        throw fail(fmt::format("{} is a file, not a directory", p.string()));
      }
      break;
    }
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::vector<std::string> created;  // deepest first
  for (auto p = missing.rbegin(); p != missing.rend(); ++p) {
    std::error_code error;
    if (fs::create_directory(*p, error)) {
      created.insert(created.begin(), p->string());
      continue;
    }
    if (!error) continue;  // made by another process meanwhile ("a/.." after "a": there)
    for (const std::string& made : created) {
      std::error_code ignored;
      fs::remove(made, ignored);  // rmdir: ours, and still empty
    }
    const std::string why = DescribeWriteError(error.value());
    throw fail(*p == fs::path(dir) ? why : fmt::format("{}: {}", p->string(), why));
  }
  return created;
}

int CreateFileForWriting(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return -1;
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

void WriteFileAtomically(const std::string& path, const char* data, size_t size,
                         const std::string& tmp_name) {
  const std::string tmp = tmp_name.empty() ? path + ".tmp" : tmp_name;
  auto fail = [&](int error, const char* what) {
    ::unlink(tmp.c_str());
    throw FileError(fmt::format("cannot write {}: {}{}; the previous file, if any, is unchanged",
                                path, what, DescribeWriteError(error)));
  };
  const int fd = CreateFileForWriting(tmp);
  if (fd < 0) {
    const int error = errno;
    throw FileError(
        fmt::format("cannot write {}: cannot create {}: {}", path, tmp, DescribeWriteError(error)));
  }
  const RemoveOnSignalDeath remove_on_death(tmp);  // ours now: a second Ctrl-C while it is written
  int error = WriteAll(fd, data, size);
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) fail(error, "");
  RenameIntoPlace(tmp, path, fail);
}

void WriteFileAtomicallyBy(const std::string& path,
                           const std::function<std::string(const std::string& tmp)>& write) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  auto fail = [&](int error, const char* what) {
    ::unlink(tmp.c_str());
    throw FileError(fmt::format("cannot write {}: {}{}; the previous file, if any, is unchanged",
                                path, what, DescribeWriteError(error)));
  };
  const int created = CreateFileForWriting(tmp);
  if (created < 0) {
    const int error = errno;
    throw FileError(
        fmt::format("cannot write {}: cannot create {}: {}", path, tmp, DescribeWriteError(error)));
  }
  ::close(created);
  const RemoveOnSignalDeath remove_on_death(tmp);
  std::string problem;
  try {
    problem = write(tmp);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) {
    ::unlink(tmp.c_str());
    throw FileError(
        fmt::format("cannot write {}: {}; the previous file, if any, is unchanged", path, problem));
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) fail(errno, "reopening its temporary: ");
  int error = ::fsync(fd) != 0 ? errno : 0;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) fail(error, "");
  RenameIntoPlace(tmp, path, fail);
}

void WriteFileAtomically(const std::string& path, const std::string& content) {
  WriteFileAtomically(path, content.data(), content.size());
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

LineAppender::LineAppender(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int error = errno;
    throw FileError(
        fmt::format("cannot open {} for appending: {}", path, DescribeWriteError(error)));
  }
}

LineAppender::~LineAppender() {
  if (fd_ >= 0) ::close(fd_);
}

void LineAppender::Append(const std::string& line) {
  const std::string record = line + '\n';
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  const int error = WriteAll(fd_, record.data(), record.size());
  if (error != 0) {
    // A partial record would be a broken last line: cut it off again.
    if (before >= 0 && ::ftruncate(fd_, before) != 0) {
      // Nothing more to do: the reader drops a partial last line (MetricsLog).
    }
    throw FileError(fmt::format("cannot append to {}: {}", path_, DescribeWriteError(error)));
  }
}

std::string GlobDirectories(const std::string& pattern) {
  const size_t wild = pattern.find_first_of("*?[");
  if (wild == std::string::npos) return pattern;
  const size_t cut = pattern.rfind('/', wild);
  return cut == std::string::npos ? "./" : pattern.substr(0, cut + 1);
}

std::string RelativeTo(const std::string& path) {
  if (path.empty() || path[0] == '/') return "";
  if (path[0] == '~') {  // a shell expands it only unquoted, at a word's start; YAML never
    return " (nothing expands a leading '~' here: write the home directory out, e.g. with $HOME "
           "unquoted in a shell override)";
  }
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  return fmt::format(" (relative paths are resolved against the working directory, {})",
                     ec ? "unknown" : cwd);
}

}  // namespace distill

// An LD_PRELOAD library for the reliability tests (reliability_test.cpp): faults at chosen
// points of distill_trainer's file writes, unprivileged and deterministic.
//
// DISTILL_FAULT_KILL="write:<substring>:<n>": the n-th write() (1-based) to a file whose path
//   contains <substring> writes half of its bytes, then the process gets SIGKILL (a torn write).
// DISTILL_FAULT_KILL="rename:<substring>:<n>": the n-th rename() whose source path contains
//   <substring> is not done; the process gets SIGKILL (killed between fsync and rename).
// DISTILL_FAULT_FULL="<bytes>:<dir>": a small full filesystem: writes to files under <dir>
//   succeed until <bytes> bytes were written in all, then come up short and fail with ENOSPC.
// DISTILL_FAULT_EIO="<substring>": every read() of a file whose path contains <substring>
//   fails with EIO (a disk or network filesystem that cannot deliver the bytes).
// Only write(), rename() and read() are intercepted: what file_io.cpp uses for every run file,
// and what a checkpoint is read with.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct KillPlan {
  bool active = false;
  char op[16] = {};
  char pattern[4096] = {};
  long nth = 0;
  long seen = 0;
};
struct FullPlan {
  bool active = false;
  char dir[4096] = {};
  long long left = 0;
};

KillPlan kill_plan;
FullPlan full_plan;
char eio_pattern[4096] = {};  // empty: no read faults
// The plans, read from the environment once, before any thread uses them (Parse()'s static).
void ParseOnce() {
  if (const char* spec = std::getenv("DISTILL_FAULT_KILL")) {
    // op:pattern:n, the pattern may hold ':' (split at the first and the last).
    const char* first = std::strchr(spec, ':');
    const char* last = std::strrchr(spec, ':');
    if (first && last && first != last && first - spec < 15) {
      std::memcpy(kill_plan.op, spec, first - spec);
      const size_t length = static_cast<size_t>(last - first - 1);
      if (length < sizeof(kill_plan.pattern)) {
        std::memcpy(kill_plan.pattern, first + 1, length);
        kill_plan.nth = std::atol(last + 1);
        kill_plan.active = kill_plan.nth > 0;
      }
    }
  }
  if (const char* spec = std::getenv("DISTILL_FAULT_FULL")) {
    const char* colon = std::strchr(spec, ':');
    if (colon && std::strlen(colon + 1) < sizeof(full_plan.dir)) {
      full_plan.left = std::atoll(spec);
      std::strcpy(full_plan.dir, colon + 1);
      full_plan.active = true;
    }
  }
  if (const char* spec = std::getenv("DISTILL_FAULT_EIO")) {
    if (std::strlen(spec) < sizeof(eio_pattern)) std::strcpy(eio_pattern, spec);
  }
}

void Parse() {
  static const bool parsed = (ParseOnce(), true);  // thread-safe initialisation
  (void)parsed;
}

// The path of an open file descriptor ("" when unknown).
bool FdPath(int fd, char* path, size_t size) {
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, path, size - 1);
  if (n <= 0) return false;
  path[n] = '\0';
  return true;
}

[[noreturn]] void Die() {
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" ssize_t write(int fd, const void* data, size_t size) {
  using WriteFn = ssize_t (*)(int, const void*, size_t);
  static const WriteFn real = Next<WriteFn>("write");
  Parse();
  char path[4096];
  if (fd > 2 && (kill_plan.active || full_plan.active) && FdPath(fd, path, sizeof(path))) {
    if (kill_plan.active && std::strcmp(kill_plan.op, "write") == 0 &&
        std::strstr(path, kill_plan.pattern) != nullptr && ++kill_plan.seen == kill_plan.nth) {
      real(fd, data, size / 2);
      Die();
    }
    if (full_plan.active && std::strncmp(path, full_plan.dir, std::strlen(full_plan.dir)) == 0) {
      if (full_plan.left <= 0) {
        errno = ENOSPC;
        return -1;
      }
      if (static_cast<long long>(size) > full_plan.left) size = static_cast<size_t>(full_plan.left);
      const ssize_t n = real(fd, data, size);
      if (n > 0) full_plan.left -= n;
      return n;
    }
  }
  return real(fd, data, size);
}

extern "C" int rename(const char* from, const char* to) {
  using RenameFn = int (*)(const char*, const char*);
  static const RenameFn real = Next<RenameFn>("rename");
  Parse();
  if (kill_plan.active && std::strcmp(kill_plan.op, "rename") == 0 &&
      std::strstr(from, kill_plan.pattern) != nullptr && ++kill_plan.seen == kill_plan.nth) {
    Die();
  }
  return real(from, to);
}

extern "C" ssize_t read(int fd, void* data, size_t size) {
  using ReadFn = ssize_t (*)(int, void*, size_t);
  static const ReadFn real = Next<ReadFn>("read");
  Parse();
  char path[4096];
  if (fd > 2 && eio_pattern[0] != '\0' && FdPath(fd, path, sizeof(path)) &&
      std::strstr(path, eio_pattern) != nullptr) {
    errno = EIO;
    return -1;
  }
  return real(fd, data, size);
}

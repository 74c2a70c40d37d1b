// The SIGTERM / SIGINT / SIGHUP flag: set by an async-signal-safe handler, read by the training
// loop.
#include "distill/signals.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace distill {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};  // when the first signal came (CLOCK_MONOTONIC)
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler needs a lock-free time");

// A repeat of the first signal within this time is the same request delivered twice (GNU
// timeout signals the process and then its whole process group), not the user insisting.
constexpr int64_t kRepeatNs = 1'000'000'000;

int64_t NowNs() {  // clock_gettime is async-signal-safe
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// One line on stderr from a handler (write(2) is async-signal-safe; no formatting).
void WriteLine(const char* prefix, int signal, const char* rest) {
  const char* name = signal == SIGTERM  ? "SIGTERM"
                     : signal == SIGINT ? "SIGINT"
                     : signal == SIGHUP ? "SIGHUP"
                                        : "a signal";
  for (const char* part : {prefix, name, rest}) {
    ssize_t ignored = write(STDERR_FILENO, part, strlen(part));
    (void)ignored;
  }
}

// A stop signal soon after the first, the same or another: one request delivered twice (GNU
// timeout signals the process, then its group) or by two senders at once (systemd ends a login
// session's processes with SIGTERM, then at once SIGHUP); or the first's handler, on another
// thread, has not stored its time yet (0).
bool Repeat(int64_t now) {
  const int64_t first = g_first_ns.load();
  return g_signal.load() != 0 && (first == 0 || now - first < kRepeatNs);
}

// A SIGHUP: the terminal is gone, and with it, often, the rest of the pipeline (`| tee log`
// dies of the same SIGHUP). Writing the remaining lines into a pipe nobody reads must not end the
// process before its checkpoint: SIGPIPE is ignored from then on (the lines are lost; the write
// fails with EPIPE, which the trainer's streams take as a failed write).
void IgnoreBrokenPipesAfterHangup(int signal) {
  if (signal != SIGHUP) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

void Handle(int signal) {
  IgnoreBrokenPipesAfterHangup(signal);
  int none = 0;
  const int64_t now = NowNs();
  if (g_signal.compare_exchange_strong(none, signal)) {
    g_first_ns = now;
    WriteLine("distill_trainer: stopping on ", signal,
              ": finishing this step, then a checkpoint (a stop signal again, a second or more "
              "later, exits at once)\n");
    return;
  }
  if (Repeat(now)) return;
  // A second signal: the user insists; leave now, as a death by that signal.
  WriteLine("distill_trainer: second ", signal,
            ": exiting at once, without finishing the step; the checkpoints written so far are "
            "kept\n");
  DieBySignal(signal);
}

// Outside a training loop (start-up, the final evaluation, writing the summary or the export,
// between a pipeline's stages) there is no step to finish: one line, and exit at once.
void HandleOutside(int signal) {
  IgnoreBrokenPipesAfterHangup(signal);  // its line must not end the process before DieBySignal
  // The repeat of a signal a training loop took (it writes the checkpoint and exits already).
  if (Repeat(NowNs())) return;
  WriteLine("distill_trainer: ", signal,
            ": stopped outside a training step (start-up, evaluation, export or between stages): "
            "no checkpoint written now; those written so far are kept\n");
  DieBySignal(signal);
}

// A SIGBUS: the one likely cause in the trainer is a memory-mapped input cut short under it.
void HandleBusError(int signal) {
  const char* line =
      "distill_trainer: SIGBUS: a memory-mapped file was cut short while it was read (a token "
      "shard or a safetensors file truncated or rewritten in place while the trainer ran? or, "
      "on several GPUs, /dev/shm full: NCCL's shared memory, docker --shm-size); the "
      "checkpoints written so far are kept: fix the cause, then run the same command to "
      "resume\n";
  ssize_t ignored = write(STDERR_FILENO, line, strlen(line));
  (void)ignored;
  DieBySignal(signal);
}

// The temporaries RemoveOnSignalDeath tracks: a slot is free (0), being filled (1), holds a path
// (2), or is being deleted by a dying handler (3); DieBySignal unlinks the paths (unlink is
// async-signal-safe).
constexpr int kTemporarySlots = 8;
constexpr size_t kTemporaryPathMax = 4096;
struct TemporarySlot {
  std::atomic<int> state{0};
  char path[kTemporaryPathMax];
};
TemporarySlot g_temporaries[kTemporarySlots];

}  // namespace

RemoveOnSignalDeath::RemoveOnSignalDeath(const std::string& path) : slot_(-1) {
  if (path.size() >= kTemporaryPathMax) return;
  for (int i = 0; i < kTemporarySlots; ++i) {
    int free = 0;
    if (g_temporaries[i].state.compare_exchange_strong(free, 1)) {
      std::memcpy(g_temporaries[i].path, path.c_str(), path.size() + 1);
      g_temporaries[i].state.store(2);
      slot_ = i;
      return;
    }
  }
}

RemoveOnSignalDeath::~RemoveOnSignalDeath() {
  if (slot_ < 0) return;
  // 3: a handler, on another thread, is deleting this path and the process dies: the slot must
  // not be refilled under it meanwhile.
  int expected = 2;
  while (!g_temporaries[slot_].state.compare_exchange_weak(expected, 0)) expected = 2;
}

void ExplainBusErrors() {
  struct sigaction action {};
  action.sa_handler = HandleBusError;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, nullptr);
}

// The signal's default action (terminate) taken now: a parent sees a death by the signal (a shell
// script stops on a child's SIGINT; Python's returncode is -2), not exit status 130. Only
// async-signal-safe calls: a handler uses it too.
void DieBySignal(int signal) {
  for (TemporarySlot& slot : g_temporaries) {
    int ready = 2;  // claimed (3) first: the writer can no longer free and refill it
    if (slot.state.compare_exchange_strong(ready, 3)) ::unlink(slot.path);
  }
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(signal);
  _exit(128 + signal);  // not reached
}

namespace {

// Whether SIGHUP was ignored when the process started (`nohup`, or a parent that ignores it):
// then it stays ignored, as the user asked. Read once, before any handler of ours is installed.
bool HangupIgnoredAtStart() {
  static const bool ignored = [] {
    struct sigaction current {};
    sigaction(SIGHUP, nullptr, &current);
    return current.sa_handler == SIG_IGN;
  }();
  return ignored;
}

// Installs `handler` for SIGTERM, SIGINT and (unless ignored at start) SIGHUP; the previous
// actions go to `saved` (three of them) when it is not null.
void InstallStopHandler(void (*handler)(int), struct sigaction* saved) {
  const bool hangup = !HangupIgnoredAtStart();
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in progress are not interrupted
  sigaction(SIGTERM, &action, saved ? &saved[0] : nullptr);
  sigaction(SIGINT, &action, saved ? &saved[1] : nullptr);
  if (hangup) sigaction(SIGHUP, &action, saved ? &saved[2] : nullptr);
}

}  // namespace

void ExitOnStopSignals() {
  g_signal = 0;
  g_first_ns = 0;
  InstallStopHandler(HandleOutside, nullptr);  // a repeat returns: calls in progress go on
}

struct StopSignals::Saved {
  struct sigaction actions[3];  // SIGTERM, SIGINT, SIGHUP
};

StopSignals::StopSignals() : saved_(new Saved) {
  g_signal = 0;
  g_first_ns = 0;
  InstallStopHandler(Handle, saved_->actions);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &saved_->actions[0], nullptr);
  sigaction(SIGINT, &saved_->actions[1], nullptr);
  if (!HangupIgnoredAtStart()) sigaction(SIGHUP, &saved_->actions[2], nullptr);
  delete saved_;
}

int StopSignals::Pending() { return g_signal.load(); }

std::string SignalName(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGHUP) return "SIGHUP";
  return "signal " + std::to_string(signal);
}

}  // namespace distill

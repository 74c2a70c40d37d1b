// The SIGTERM / SIGINT flag: set by an async-signal-safe handler, read by the training loop.
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
  const char* name = signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "a signal";
  for (const char* part : {prefix, name, rest}) {
    ssize_t ignored = write(STDERR_FILENO, part, strlen(part));
    (void)ignored;
  }
}

void Handle(int signal) {
  int none = 0;
  const int64_t now = NowNs();
  if (g_signal.compare_exchange_strong(none, signal)) {
    g_first_ns = now;
    return;
  }
  if (signal == g_signal.load() && now - g_first_ns.load() < kRepeatNs) return;
  // A second signal: the user insists; leave now, with the status of a death by that signal.
  WriteLine("distill_trainer: second ", signal,
            ": exiting at once, without finishing the step; the checkpoints written so far are "
            "kept\n");
  _exit(128 + signal);
}

// Outside a training loop (start-up, the final evaluation, writing the summary or the export,
// between a pipeline's stages) there is no step to finish: one line, and exit at once.
void HandleOutside(int signal) {
  // The repeat of a signal a training loop took (it writes the checkpoint and exits already).
  if (signal == g_signal.load() && NowNs() - g_first_ns.load() < kRepeatNs) return;
  WriteLine("distill_trainer: ", signal,
            ": stopped outside a training step (start-up, evaluation, export or between stages): "
            "no checkpoint written now; those written so far are kept\n");
  _exit(128 + signal);
}

}  // namespace

void ExitOnStopSignals() {
  struct sigaction action {};
  action.sa_handler = HandleOutside;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

struct StopSignals::Saved {
  struct sigaction term, interrupt;
};

StopSignals::StopSignals() : saved_(new Saved) {
  g_signal = 0;
  struct sigaction action {};
  action.sa_handler = Handle;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in progress are not interrupted
  sigaction(SIGTERM, &action, &saved_->term);
  sigaction(SIGINT, &action, &saved_->interrupt);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &saved_->term, nullptr);
  sigaction(SIGINT, &saved_->interrupt, nullptr);
  delete saved_;
}

int StopSignals::Pending() { return g_signal.load(); }

std::string SignalName(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal);
}

}  // namespace distill

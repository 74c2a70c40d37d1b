// The SIGTERM / SIGINT flag: set by an async-signal-safe handler, read by the training loop.
#include "distill/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace distill {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

void Handle(int signal) {
  int none = 0;
  // A second signal: the user insists; leave now, with the status of a death by that signal.
  if (!g_signal.compare_exchange_strong(none, signal)) _exit(128 + signal);
}

}  // namespace

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

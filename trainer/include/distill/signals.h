// Graceful stop on SIGTERM / SIGINT / SIGHUP (SIGHUP left alone where it was ignored at start, as
// under nohup): while a StopSignals is alive, the first signal only sets a
// flag -- the trainer finishes the current step, writes a checkpoint and throws Interrupted --
// and a second one ends the process at once (DieBySignal), unless it comes within a second of the
// first (one request delivered twice: to the process and to its process group; or SIGTERM and
// SIGHUP at once from systemd). No torch headers: main.cpp includes it.
#pragma once

#include <stdexcept>
#include <string>

namespace distill {

class StopSignals {
 public:
  StopSignals();   // installs the handlers (and clears the flag); the previous ones are saved
  ~StopSignals();  // restores the previous handlers
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal received since installation (SIGTERM, SIGINT or SIGHUP), or 0.
  static int Pending();

 private:
  struct Saved;
  Saved* saved_;
};

// For the process's life outside StopSignals' scopes: a SIGTERM / SIGINT / SIGHUP prints one line
// (no step to finish, no checkpoint written then; the earlier ones are kept) and exits with 128 +
// signal, where the default action would end the process without a word. main() installs it.
void ExitOnStopSignals();

// A SIGBUS (a memory-mapped token shard or safetensors file truncated while it is read) prints
// one line saying so, then ends the process as by the signal, where the default action would end
// it with only "Bus error". main() installs it.
void ExplainBusErrors();

// Ends the process as the signal's default action would (after restoring it): a parent sees a
// death by the signal, not an exit status. Async-signal-safe.
[[noreturn]] void DieBySignal(int signal);

// While alive, the file at `path` (a temporary being written) is deleted if the process dies by a
// signal it handles (DieBySignal: a second SIGTERM / SIGINT / SIGHUP, one outside a training step,
// a SIGBUS), so that such a death leaves no half-written temporary behind. Up to 8 at once (one per
// writing thread); past that, or for a path of 4096 bytes or more, nothing is tracked.
class RemoveOnSignalDeath {
 public:
  explicit RemoveOnSignalDeath(const std::string& path);
  ~RemoveOnSignalDeath();
  RemoveOnSignalDeath(const RemoveOnSignalDeath&) = delete;
  RemoveOnSignalDeath& operator=(const RemoveOnSignalDeath&) = delete;

 private:
  int slot_;
};

// "SIGTERM", "SIGINT", "SIGHUP", or "signal N".
std::string SignalName(int signal);

// Training stopped by a signal after writing a checkpoint. what(): the one line to print.
class Interrupted : public std::runtime_error {
 public:
  Interrupted(int signal, const std::string& message)
      : std::runtime_error(message), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

}  // namespace distill

// distill_trainer --profile-steps N: where a step's time goes (issue 18). After `skip` warm-up
// steps of this process, N steps run under LibTorch's Kineto profiler (a chrome trace, no
// extra synchronisation), then N steps under phase timers that synchronise the device at every
// phase boundary (data, forward, loss, backward, communication, clip, optimizer). Outputs go to
// <out_dir>/profile/. Without the option the trainer holds no StepProfiler and every PhaseScope
// gets nullptr: nothing is synchronised, timed or recorded.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

namespace distill {

enum class Phase { kData, kForward, kLoss, kBackward, kCommunication, kClip, kOptimizer, kCount };

struct ProfileOptions {
  int64_t steps = 0;  // N: steps traced, then N steps timed; 0: off
  int64_t skip = 3;   // warm-up steps of this process before the trace
};

// "" when the file at `path` can be a whole chrome trace (non-empty, its last non-blank byte
// among the final 64 a JSON object's or array's close), else what is wrong: Kineto reports no
// write failure, so a full disk shows only as a cut file.
std::string TraceFileProblem(const std::string& path);

// The state of one step: a chrome-trace step (phases are annotated as "distill::<phase>"
// ranges) or a timed step (device synchronised around every phase), or neither.
class StepProfiler {
 public:
  // `dir`: where trace.json (trace_rank<r>.json when data-parallel) and phases.json go.
  StepProfiler(ProfileOptions options, const at::Device& device, std::string dir, int rank,
               bool distributed);
  ~StepProfiler();

  // Around each optimizer step of this process. AfterStep returns lines for the log (the
  // files written, the phase table) when a window has just ended.
  void BeforeStep();
  std::vector<std::string> AfterStep(int64_t tokens);
  // Ends an open window early (train.steps reached first) and writes what it has.
  std::vector<std::string> Finish();

  bool tracing() const { return state_ == State::kTracing; }
  bool timing() const { return state_ == State::kTiming; }
  void Synchronize() const;
  void Add(Phase phase, double seconds) { seconds_[static_cast<size_t>(phase)] += seconds; }

 private:
  enum class State { kWaiting, kTracing, kTiming, kDone };
  std::vector<std::string> EndTrace();
  std::vector<std::string> EndTiming();

  ProfileOptions options_;
  at::Device device_;
  std::string dir_;
  int rank_;
  bool distributed_;
  State state_ = State::kWaiting;
  int64_t steps_seen_ = 0;  // steps of this process so far
  int64_t steps_in_state_ = 0;
  double step_start_ = 0;    // steady clock, seconds (timed steps)
  double step_seconds_ = 0;  // sum over the timed steps
  int64_t timed_tokens_ = 0;
  std::array<double, static_cast<size_t>(Phase::kCount)> seconds_{};
};

// RAII: one phase of a step. `profiler` nullptr (profiling off, or a step outside the windows
// of --profile-steps): does nothing. Tracing: a "distill::<phase>" range in the trace. Timing:
// synchronises the device on entry and exit and charges the time to `phase`.
class PhaseScope {
 public:
  PhaseScope(StepProfiler* profiler, Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  StepProfiler* profiler_;
  Phase phase_;
  double start_ = 0;
  std::optional<at::RecordFunction> range_;
};

const char* PhaseName(Phase phase);

}  // namespace distill

// --profile-steps: a Kineto chrome trace of a few steps, then phase timers (see profile.h).
#include "distill/profile.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include "distill/file_io.h"
#include "distill/metrics.h"

namespace distill {
namespace fs = std::filesystem;
namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

namespace {

constexpr std::array<const char*, static_cast<size_t>(Phase::kCount)> kPhaseNames = {
    "data", "forward", "loss", "backward", "communication", "clip", "optimizer"};
// The trace's ranges, one per phase ("distill::forward", ...): static, RecordFunction keeps
// the pointer.
constexpr std::array<const char*, static_cast<size_t>(Phase::kCount)> kRangeNames = {
    "distill::data",          "distill::forward", "distill::loss",     "distill::backward",
    "distill::communication", "distill::clip",    "distill::optimizer"};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProfilerConfig TraceConfig() {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true,
                        /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/false,
                        /*with_modules=*/false);
}

std::set<ActivityType> TraceActivities(const at::Device& device) {
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  return activities;
}

}  // namespace

const char* PhaseName(Phase phase) { return kPhaseNames[static_cast<size_t>(phase)]; }

StepProfiler::StepProfiler(ProfileOptions options, const at::Device& device, std::string dir,
                           int rank, bool distributed)
    : options_(options),
      device_(device),
      dir_(std::move(dir)),
      rank_(rank),
      distributed_(distributed) {
  // Made now, so that a file in its way is an error before any step, not after the traced ones.
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error) {
    throw FileError(
        fmt::format("--profile-steps writes into {}, which cannot be created ({}); "
                    "move what is in its way",
                    dir_, error.message()));
  }
}

StepProfiler::~StepProfiler() {
  if (state_ != State::kTracing) return;
  try {
    kineto::disableProfiler();  // an exception left it on
  } catch (const std::exception&) {
    // Not running after all: nothing to stop (a destructor must not throw).
  }
}

void StepProfiler::Synchronize() const {
  if (device_.is_cuda()) at::accelerator::synchronizeDevice(device_.index());
}

void StepProfiler::BeforeStep() {
  if (state_ == State::kWaiting && steps_seen_ == options_.skip) {
    kineto::prepareProfiler(TraceConfig(), TraceActivities(device_));
    kineto::enableProfiler(TraceConfig(), TraceActivities(device_));
    state_ = State::kTracing;
    steps_in_state_ = 0;
  }
  if (state_ == State::kTiming) {
    Synchronize();
    step_start_ = Now();
  }
}

std::vector<std::string> StepProfiler::AfterStep(int64_t tokens) {
  ++steps_seen_;
  std::vector<std::string> lines;
  if (state_ == State::kTracing) {
    if (++steps_in_state_ < options_.steps) return lines;
    lines = EndTrace();
    state_ = State::kTiming;
    steps_in_state_ = 0;
    return lines;  // the timed window starts with the next step
  }
  if (state_ == State::kTiming) {
    Synchronize();
    step_seconds_ += Now() - step_start_;
    timed_tokens_ += tokens;
    if (++steps_in_state_ == options_.steps) lines = EndTiming();
  }
  return lines;
}

// The run ended inside a window: what it has is written, and the log says what is missing.
std::vector<std::string> StepProfiler::Finish() {
  std::vector<std::string> lines;
  if (state_ == State::kTracing) {
    lines = EndTrace();
  } else if (state_ == State::kTiming && steps_in_state_ > 0) {
    lines = EndTiming();
  }
  if (state_ != State::kDone || steps_in_state_ < options_.steps) {
    lines.push_back(fmt::format(
        "profile: the run ended {} steps after this process started, before its --profile-skip {} "
        "+ {} traced + {} timed steps ({} in all; --profile-steps {})",
        steps_seen_, options_.skip, options_.steps, options_.steps,
        options_.skip + 2 * options_.steps, options_.steps));
  }
  state_ = State::kDone;
  return lines;
}

std::string TraceFileProblem(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const std::streamoff size = in ? static_cast<std::streamoff>(in.tellg()) : -1;
  char last = 0;
  for (std::streamoff back = 1; in && back <= std::min<std::streamoff>(size, 64); ++back) {
    in.seekg(size - back);
    in.get(last);
    if (!std::isspace(static_cast<unsigned char>(last))) break;
  }
  if (size > 0 && (last == '}' || last == ']')) return "";
  return fmt::format("the profiler wrote {} bytes, not a whole JSON trace (is the disk full?)",
                     std::max<std::streamoff>(size, 0));
}

std::vector<std::string> StepProfiler::EndTrace() {
  state_ = State::kDone;  // the caller moves on to timing; never disabled twice
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  fs::create_directories(dir_);
  const std::string name = distributed_ ? fmt::format("trace_rank{}.json", rank_) : "trace.json";
  const std::string path = (fs::path(dir_) / name).string();
  // Kineto writes where it is told and reports no failure (a full disk leaves a cut trace), so
  // it writes a temporary that is checked for the JSON's closing bracket before it becomes
  // `path`: a trace.json is whole or absent.
  WriteFileAtomicallyBy(path, [&](const std::string& tmp) {
    result->save(tmp);
    return TraceFileProblem(tmp);
  });
  return {fmt::format("profile: {} traced steps written to {} (chrome://tracing, Perfetto)",
                      steps_in_state_, path)};
}

std::vector<std::string> StepProfiler::EndTiming() {
  state_ = State::kDone;
  const double steps = static_cast<double>(steps_in_state_);
  double phases_total = 0;
  for (double s : seconds_) phases_total += s;
  std::vector<std::string> lines = {fmt::format(
      "profile: {} timed steps (device synchronised at every phase boundary), {:.2f} ms/step, "
      "{:.0f} tok/s",
      steps_in_state_, 1e3 * step_seconds_ / steps, timed_tokens_ / step_seconds_)};
  JsonRecord record;
  record.Add("timed_steps", steps_in_state_).Add("step_ms", 1e3 * step_seconds_ / steps);
  for (size_t i = 0; i < seconds_.size(); ++i) {
    const double ms = 1e3 * seconds_[i] / steps;
    record.Add(std::string(kPhaseNames[i]) + "_ms", ms);
    if (seconds_[i] > 0) {
      lines.push_back(fmt::format("profile:   {:<16} {:9.3f} ms/step {:6.1f}%", kPhaseNames[i], ms,
                                  100.0 * seconds_[i] / step_seconds_));
    }
  }
  const double other = step_seconds_ - phases_total;
  lines.push_back(fmt::format("profile:   {:<16} {:9.3f} ms/step {:6.1f}%", "(between phases)",
                              1e3 * other / steps, 100.0 * other / step_seconds_));
  record.Add("other_ms", 1e3 * other / steps).Add("tokens_per_s", timed_tokens_ / step_seconds_);
  if (device_.is_cuda()) {
    // The caching allocator's peaks over the whole process so far (no synchronisation).
    const auto stats = at::accelerator::getDeviceStats(device_.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    record.Add("peak_allocated_bytes", stats.allocated_bytes[all].peak)
        .Add("peak_reserved_bytes", stats.reserved_bytes[all].peak);
    lines.push_back(fmt::format("profile: peak memory {:.2f} GiB allocated, {:.2f} GiB reserved",
                                stats.allocated_bytes[all].peak / 1073741824.0,
                                stats.reserved_bytes[all].peak / 1073741824.0));
  }
  fs::create_directories(dir_);
  const std::string name = distributed_ ? fmt::format("phases_rank{}.json", rank_) : "phases.json";
  const std::string path = (fs::path(dir_) / name).string();
  WriteFileAtomically(path, record.str() + "\n");
  lines.push_back(fmt::format("profile: phase times written to {}", path));
  return lines;
}

PhaseScope::PhaseScope(StepProfiler* profiler, Phase phase) : profiler_(profiler), phase_(phase) {
  if (profiler_ == nullptr) return;
  if (profiler_->tracing()) {
    range_.emplace(at::RecordScope::USER_SCOPE);
    if (range_->isActive()) range_->before(kRangeNames[static_cast<size_t>(phase_)]);
  } else if (profiler_->timing()) {
    profiler_->Synchronize();
    start_ = Now();
  }
}

PhaseScope::~PhaseScope() {
  if (profiler_ == nullptr || !profiler_->timing()) return;  // range_ ends itself
  profiler_->Synchronize();
  profiler_->Add(phase_, Now() - start_);
}

}  // namespace distill

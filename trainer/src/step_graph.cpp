#include "distill/step_graph.h"

#include <stdexcept>

#if DISTILL_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#endif

namespace distill {

#if DISTILL_WITH_CUDA

namespace {

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// The host tensor in pinned memory, so that its copy to the device is asynchronous.
at::Tensor Pinned(const at::Tensor& t) { return t.is_pinned() ? t : t.pin_memory(); }

}  // namespace

struct StepGraph::Impl {
  // `d` with its index (cuda -> cuda:<current>): the allocator's pool calls need one.
  Impl(const at::Device& d, std::vector<at::Tensor> p, int warmup)
      : device(d.has_index() ? d : at::Device(at::kCUDA, c10::cuda::current_device())),
        params(std::move(p)),
        warmup_calls(warmup),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  at::Device device;
  std::vector<at::Tensor> params;
  int warmup_calls;
  int calls = 0;
  c10::cuda::CUDAStream stream;  // all of the work: graphs cannot capture the default stream
  bool given_up = false;
  std::optional<std::string> warning;

  // The step's scalars (the graph reads and adds into them: fixed memory).
  at::Tensor scale, kd_sum, ce_sum;
  // The captured micro-batch: its inputs, the .grad tensors it adds into (undefined where a
  // parameter had none), the parameters' storage it reads.
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  at::Tensor inputs, targets;
  std::vector<at::Tensor> grads;
  std::vector<const void*> param_data;

  void GiveUp(const std::string& why) {
    given_up = true;
    graph.reset();
    inputs = targets = at::Tensor();
    grads.clear();
    warning = fmt::format(
        "train.cuda_graph: {}; the run goes on without the CUDA graph (the same results, each "
        "kernel launched on its own)",
        why);
  }

  bool SameParameters() const {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].data_ptr() != param_data[i]) return false;
    }
    return true;
  }

  // The graph adds into grads[i]: where the caller replaced a parameter's .grad (zero_grad with
  // set_to_none, an assignment), its value moves into grads[i] and grads[i] is the .grad again.
  void RestoreGrads() {
    std::vector<at::Tensor> zero;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor g = params[i].grad();
      if (g.defined() && g.is_same(grads[i])) continue;
      if (g.defined()) {
        grads[i].copy_(g);
      } else {
        zero.push_back(grads[i]);
      }
      params[i].mutable_grad() = grads[i];
    }
    if (!zero.empty()) at::_foreach_zero_(zero);
  }

  void Eager(const Batch& b, const MicroBatch& body) {
    const at::Tensor in = Pinned(b.inputs).to(device, /*non_blocking=*/true);
    const at::Tensor tg = Pinned(b.targets).to(device, /*non_blocking=*/true);
    body(in, tg, scale, kd_sum, ce_sum);
  }

  void Replay(const Batch& b) {
    inputs.copy_(Pinned(b.inputs), /*non_blocking=*/true);
    targets.copy_(Pinned(b.targets), /*non_blocking=*/true);
    graph->replay();
  }

  // Undoes what an interrupted CUDAGraph::capture_begin set up and capture_end would have undone:
  // the stream's capture, the device and pinned-host allocators' routing into the graph's pool
  // (and the pools), and the default random generator's capture mode (restored from `rng`, its
  // copy from before the capture: left capturing, every later eager random op would throw). Each
  // step tolerates not having happened. `ended`: capture_end got as far as owning the pools (the
  // graph's destructor releases them).
  void AbandonCapture(at::cuda::MempoolId_t pool, const at::Generator& rng, bool ended) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream.stream(), &partial) == cudaSuccess && partial != nullptr) {
        cudaGraphDestroy(partial);
      }
    }
    (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
    auto quietly = [](auto&& f) {
      try {
        f();
      } catch (const c10::Error&) {  // that step had not happened (or was already undone)
      }
    };
    quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
    if (!ended) {
      quietly([&] { c10::cuda::CUDACachingAllocator::releasePool(device.index(), pool); });
      quietly([&] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
    }
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    const std::lock_guard<std::mutex> lock(gen.mutex());
    gen.graphsafe_set_state(rng);
  }

  // Captures `body` on a micro-batch of b's shape; false (and given up) where that failed.
  bool Capture(const Batch& b, const MicroBatch& body) {
    grads.clear();
    param_data.clear();
    for (const auto& p : params) {
      grads.push_back(p.grad());
      param_data.push_back(p.data_ptr());
    }
    inputs = at::empty(b.inputs.sizes(), b.inputs.options().device(device));
    targets = at::empty(b.targets.sizes(), b.targets.options().device(device));
    const at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
    graph = std::make_unique<at::cuda::CUDAGraph>();
    // The default generator as it was: a failed capture restores it (AbandonCapture).
    at::Generator rng;
    {
      at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
      const std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.clone();
    }
    std::string failure;
    try {
      graph->capture_begin(pool);
      body(inputs, targets, scale, kd_sum, ce_sum);
      graph->capture_end();
    } catch (const c10::Error& e) {
      failure = FirstLine(e.what_without_backtrace());
    } catch (const std::exception& e) {
      failure = FirstLine(e.what());
    }
    if (!failure.empty()) {  // AbandonCapture tolerates a capture_begin that did not get far
      bool ended = false;    // pool() answers only after capture_end took the pools over
      try {
        (void)graph->pool();
        ended = true;
      } catch (const c10::Error&) {
      }
      AbandonCapture(pool, rng, ended);
    }
    // Nothing ran: the .grad tensors hold what they held. One a capture created or replaced
    // would be graph memory the next step does not add into: put the old one back.
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor g = params[i].grad();
      if (g.defined() == grads[i].defined() && (!g.defined() || g.is_same(grads[i]))) continue;
      params[i].mutable_grad() = grads[i];
      if (failure.empty()) {
        failure = fmt::format(
            "parameter {} of {} had {} before the capture and a new one inside it (a parameter "
            "without a gradient in the warm-up steps)",
            i, params.size(), grads[i].defined() ? "a gradient" : "no gradient");
      }
    }
    if (!failure.empty()) {
      GiveUp("capturing a micro-batch failed: " + failure);
      return false;
    }
    // The warm-up steps' cached blocks are not needed beside the graph's own pool.
    c10::cuda::CUDACachingAllocator::emptyCache();
    return true;
  }
};

StepGraph::StepGraph(const at::Device& device, std::vector<at::Tensor> parameters, int warmup_calls)
    : impl_(std::make_unique<Impl>(device, std::move(parameters), warmup_calls)) {
  if (!device.is_cuda()) throw std::invalid_argument("StepGraph: the device must be CUDA");
}

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const { return impl_->graph != nullptr; }

std::optional<std::string> StepGraph::TakeWarning() {
  return std::exchange(impl_->warning, std::nullopt);
}

std::pair<at::Tensor, at::Tensor> StepGraph::Accumulate(const std::vector<Batch>& batches,
                                                        double scale, const MicroBatch& body) {
  Impl& g = *impl_;
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(g.device.index());
  at::cuda::CUDAEvent ready;
  ready.record(caller);
  ready.block(g.stream);
  // The caller's stream waits for the side stream's work however this call ends (an exception
  // from an eager micro-batch included).
  struct Join {
    const c10::cuda::CUDAStream& side;
    const c10::cuda::CUDAStream& caller;
    ~Join() {
      try {
        at::cuda::CUDAEvent done;
        done.record(side);
        done.block(caller);
      } catch (const c10::Error&) {  // a broken device: the next CUDA call reports it
      }
    }
  } join{g.stream, caller};
  {
    const c10::cuda::CUDAStreamGuard guard(g.stream);
    if (!g.kd_sum.defined()) {
      const auto options = at::TensorOptions(g.device).dtype(at::kFloat);
      g.scale = at::empty({}, options);
      g.kd_sum = at::empty({}, options);
      g.ce_sum = at::empty({}, options);
    }
    g.scale.fill_(scale);
    g.kd_sum.zero_();
    g.ce_sum.zero_();
    if (g.graph && !g.SameParameters()) {
      g.GiveUp("a parameter's storage changed after the capture (the graph reads the old one)");
    }
    if (g.graph) g.RestoreGrads();
    for (const Batch& b : batches) {
      if (g.graph && b.inputs.sizes() == g.inputs.sizes() &&
          b.targets.sizes() == g.targets.sizes()) {
        g.Replay(b);
      } else if (!g.graph && !g.given_up && g.calls >= g.warmup_calls && g.Capture(b, body)) {
        g.Replay(b);
      } else {
        g.Eager(b, body);
      }
    }
    ++g.calls;
  }
  return {g.kd_sum, g.ce_sum};
}

#else  // a build without CUDA kernels: no CUDA device to capture on

struct StepGraph::Impl {};

StepGraph::StepGraph(const at::Device&, std::vector<at::Tensor>, int) {
  throw std::invalid_argument("StepGraph: this build has no CUDA support");
}
StepGraph::~StepGraph() = default;
bool StepGraph::captured() const { return false; }
std::optional<std::string> StepGraph::TakeWarning() { return std::nullopt; }
std::pair<at::Tensor, at::Tensor> StepGraph::Accumulate(const std::vector<Batch>&, double,
                                                        const MicroBatch&) {
  throw std::logic_error("StepGraph: this build has no CUDA support");
}

#endif

}  // namespace distill

// TVD loss benchmark: our op against the LibTorch composite reference, forward / backward / full
// pass, and the full pass as a fraction of the three-stream limit (read p and q, write grad) at the
// device-to-device copy bandwidth measured in the same run. Prints a table; writes JSON only
// when asked (--json FILE, the input of scripts/plot_bench.py).
//
//   tvd_bench [--json FILE] [--cpu-only] [--quick] [--threads 1,4,16]
//     --threads L  run the CPU cases at each of these thread counts (default: the process's
//                  intra-op threads, OMP_NUM_THREADS); the table's `thr` column says which
//     --json FILE  also write the results as JSON to FILE (nothing is written without it)
//     --cpu-only   skip the CUDA cases even when a GPU is present
//     --quick      3 timed repetitions per case instead of 15 (CUDA) / 7 (CPU): a smoke run
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#ifdef LOSSFNS_BENCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "lossfns/tvd.h"

namespace {

struct Case {
  std::string device;
  int threads;  // CPU: intra-op threads for this case (at::set_num_threads); CUDA: unused
  int64_t BT, V;
  at::ScalarType dtype;
  double grad_output;
  bool labels;  // every 7th row ignored
};

struct Result {
  Case c;
  double ours_fwd, ours_bwd, ours_full, ref_fwd, ref_bwd, ref_full;  // median ms
  double kernels_full;  // the op's internal forward + backward ops, no autograd (median ms)
  double limit_ms;      // three streams at the copy bandwidth (CUDA only)
};

// Median milliseconds of one call of fn, over `reps` samples after `warmup` calls. On CUDA a
// sample is a batch of back-to-back calls between two events, divided by the batch size: the
// steady state of a training loop, where the host runs ahead and launch latency is hidden.
double time_ms(const std::string& device, const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
#ifdef LOSSFNS_BENCH_CUDA
  if (device == "cuda") {
    constexpr int kBatch = 10;
    for (int i = 0; i < reps; ++i) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      start.record();
      for (int b = 0; b < kBatch; ++b) fn();
      stop.record();
      stop.synchronize();
      ms.push_back(start.elapsed_time(stop) / kBatch);
    }
  }
#endif
  if (device == "cpu") {
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The composite reference the issue names: (p - q).abs().sum() / (2*BT), autograd through ATen.
at::Tensor composite(const at::Tensor& p, const at::Tensor& q,
                     const std::optional<at::Tensor>& labels) {
  if (!labels) return (p - q).abs().sum() / (2.0 * p.size(0));
  const at::Tensor keep = labels->ne(-100);
  return ((p - q).abs() * keep.unsqueeze(1).to(p.scalar_type())).sum() /
         (2.0 * keep.sum().clamp_min(1));
}

Result run_case(const Case& c, int warmup, int reps) {
  at::manual_seed(0);
  const auto opts = at::TensorOptions().device(c.device == "cuda" ? at::kCUDA : at::kCPU);
  const at::Tensor p =
      at::softmax(at::randn({c.BT, c.V}, opts), -1).to(c.dtype).requires_grad_(true);
  const at::Tensor q = at::softmax(at::randn({c.BT, c.V}, opts), -1).to(c.dtype);
  std::optional<at::Tensor> labels;
  if (c.labels) labels = at::where(at::arange(c.BT, opts.dtype(at::kLong)) % 7 == 0, -100, 1);
  const at::Tensor go = at::full({}, c.grad_output, opts.dtype(at::kFloat));

  Result r{c, 0, 0, 0, 0, 0, 0, 0, 0};
  using LossFn = std::function<at::Tensor()>;
  auto measure = [&](const LossFn& loss_fn, double& fwd, double& bwd, double& full) {
    {
      c10::AutoGradMode no_grad(false);
      fwd = time_ms(
          c.device, [&] { loss_fn(); }, warmup, reps);
    }
    const at::Tensor loss = loss_fn();
    const at::Tensor g = go.to(loss.scalar_type());
    bwd = time_ms(
        c.device, [&] { torch::autograd::grad({loss}, {p}, {g}, /*retain_graph=*/true); }, warmup,
        reps);
    full = time_ms(
        c.device, [&] { torch::autograd::grad({loss_fn()}, {p}, {g}); }, warmup, reps);
  };
  // Forward alone is timed with grad mode off for both (no signs saved, no graph built).
  measure([&] { return lossfns::tvd_loss(p, q, {}, labels); }, r.ours_fwd, r.ours_bwd, r.ours_full);
  measure([&] { return composite(p, q, labels); }, r.ref_fwd, r.ref_bwd, r.ref_full);

  // The same work without autograd: lossfns::_tvd_forward (saving what backward needs) and
  // lossfns::_tvd_backward through the dispatcher. The gap to ours_full is autograd's host cost.
  using Opt = const std::optional<at::Tensor>&;
  static const auto fwd_op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_tvd_forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, Opt, int64_t, int64_t, bool)>();
  static const auto bwd_op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::_tvd_backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Opt, Opt, Opt,
                            int64_t, int64_t, at::ScalarType, int64_t)>();
  const at::Tensor pd = p.detach();
  r.kernels_full = time_ms(
      c.device,
      [&] {
        auto [loss, signs, scale] = fwd_op.call(pd, q, labels, -100, /*batchmean*/ 3, true);
        bwd_op.call(go, signs, scale, pd, q, labels, -100, c.V, c.dtype, 3);
      },
      2, c.device == "cuda" ? 15 : 5);
  return r;
}

#ifdef LOSSFNS_BENCH_CUDA
struct Bandwidth {
  double copy, read, write;  // GB/s: copy counts bytes read + written
};
// Device bandwidths on a 4 GiB buffer: a device-to-device copy (the limit's reference), a sum
// (read-only) and a fill (write-only), to tell which side a kernel is bound by.
Bandwidth measure_bandwidth() {
  const int64_t n = int64_t{1} << 30;  // floats
  const at::Tensor src = at::rand({n}, at::TensorOptions().device(at::kCUDA));
  at::Tensor dst = at::empty_like(src);
  const double bytes = 4.0 * n;
  Bandwidth bw{};
  bw.copy = 2 * bytes /
            (time_ms(
                 "cuda", [&] { dst.copy_(src); }, 3, 10) *
             1e-3) /
            1e9;
  bw.read = bytes /
            (time_ms(
                 "cuda", [&] { src.sum(); }, 3, 10) *
             1e-3) /
            1e9;
  bw.write = bytes /
             (time_ms(
                  "cuda", [&] { dst.fill_(1.0); }, 3, 10) *
              1e-3) /
             1e9;
  return bw;
}
#endif

std::string dtype_name(at::ScalarType t) {
  return t == at::kBFloat16 ? "bf16" : (t == at::kHalf ? "fp16" : "fp32");
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;  // empty: no JSON file
  bool cpu_only = false, quick = false;
  std::vector<int> thread_counts = {at::get_num_threads()};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--cpu-only")
      cpu_only = true;
    else if (a == "--quick")
      quick = true;
    else if (a == "--threads" && i + 1 < argc) {
      thread_counts.clear();
      const std::string text = argv[++i];
      std::stringstream list(text);
      for (std::string t; std::getline(list, t, ',');) {
        int n = 0;
        const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
        if (ec != std::errc() || end != t.data() + t.size() || n < 1) {
          std::fprintf(stderr,
                       "tvd_bench: --threads: expected a list of positive integers (e.g. 1,4,16), "
                       "got \"%s\"\n",
                       text.c_str());
          return 2;
        }
        thread_counts.push_back(n);
      }
      if (thread_counts.empty()) {
        std::fprintf(stderr, "tvd_bench: --threads: expected a list of positive integers\n");
        return 2;
      }
    } else {
      const bool help = a == "--help" || a == "-h";
      if (!help) {
        std::fprintf(stderr, "tvd_bench: %s\n",
                     (a == "--json" || a == "--threads")
                         ? (a + " needs a value").c_str()
                         : ("unknown option \"" + a + "\"").c_str());
      }
      std::fprintf(help ? stdout : stderr,
                   "usage: tvd_bench [--json FILE] [--cpu-only] [--quick] [--threads 1,4,16]\n"
                   "  --json FILE  also write the results as JSON to FILE (default: no file)\n"
                   "  --cpu-only   skip the CUDA cases even when a GPU is present\n"
                   "  --quick      3 timed repetitions per case (default 15 on CUDA, 7 on CPU)\n"
                   "  --threads L  the CPU cases at each thread count of the list L\n");
      return help ? 0 : 2;
    }
  }
  // The JSON is written to JSON_FILE.tmp and renamed over JSON_FILE at the end: an earlier file
  // there stays whole until the new results are. Checked now, not after the benchmark: the
  // folder is made and the temporary file opened.
  const std::string json_tmp = json_path + ".tmp";
  if (!json_path.empty()) {
    const std::filesystem::path parent = std::filesystem::path(json_path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (std::filesystem::is_directory(json_path, ec) || !std::ofstream(json_tmp)) {
      std::fprintf(stderr, "tvd_bench: cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  std::vector<Case> cases;
  double bw = 0, read_bw = 0, write_bw = 0;
  std::string device_name = "cpu (" + std::to_string(at::get_num_threads()) + " threads)";
#ifdef LOSSFNS_BENCH_CUDA
  if (!cpu_only && torch::cuda::is_available()) {
    const Bandwidth b = measure_bandwidth();
    bw = b.copy;
    read_bw = b.read;
    write_bw = b.write;
    device_name = at::cuda::getCurrentDeviceProperties()->name;
    const std::vector<std::tuple<int64_t, int64_t, at::ScalarType>> shapes = {
        {4096, 32000, at::kBFloat16},
        {4096, 32000, at::kFloat},
        {8192, 128256, at::kBFloat16},
        {16384, 131072, at::kFloat},
        {512, 32000, at::kBFloat16}};
    for (const auto& [BT, V, dt] : shapes)
      for (double g : {1.0, 0.5})
        for (bool l : {false, true}) cases.push_back({"cuda", 0, BT, V, dt, g, l});
  }
#endif
  for (int threads : thread_counts)
    for (int64_t BT : {256, 1024})
      for (bool l : {false, true}) cases.push_back({"cpu", threads, BT, 32000, at::kFloat, 1.0, l});

  std::vector<Result> results;
  if (bw > 0)
    std::printf(
        "device: %s; copy bandwidth %.0f GB/s (read+write); read-only %.0f GB/s; write-only %.0f "
        "GB/s\n\n",
        device_name.c_str(), bw, read_bw, write_bw);
  else  // no CUDA case: nothing measured a bandwidth, and no row has a limit to compare with
    std::printf("device: %s\n\n", device_name.c_str());
  std::printf("%-5s %3s %6s %7s %4s %4s %3s | %9s %9s %9s %9s | %9s %9s %9s | %7s %8s\n", "dev",
              "thr", "BT", "V", "dt", "g", "ign", "fwd ms", "bwd ms", "full ms", "kernels",
              "ref fwd", "ref bwd", "ref full", "speedup", "of limit");
  for (const Case& c : cases) {
    const bool cuda = c.device == "cuda";
    const int reps = quick ? 3 : (cuda ? 15 : 7);
    if (!cuda) at::set_num_threads(c.threads);
    Result r = run_case(c, cuda ? 5 : 2, reps);
    const double bytes = 3.0 * c.BT * c.V * at::elementSize(c.dtype);
    r.limit_ms = cuda && bw > 0 ? bytes / (bw * 1e9) * 1e3 : 0;
    std::printf(
        "%-5s %3s %6lld %7lld %4s %4.1f %3s | %9.3f %9.3f %9.3f %9.3f | %9.3f %9.3f %9.3f | %6.1fx "
        "%7s\n",
        c.device.c_str(), cuda ? "-" : std::to_string(c.threads).c_str(), (long long)c.BT,
        (long long)c.V, dtype_name(c.dtype).c_str(), c.grad_output, c.labels ? "yes" : "no",
        r.ours_fwd, r.ours_bwd, r.ours_full, r.kernels_full, r.ref_fwd, r.ref_bwd, r.ref_full,
        r.ref_full / r.ours_full,
        r.limit_ms > 0 ? (std::to_string(int(100 * r.limit_ms / r.ours_full + 0.5)) + "%").c_str()
                       : "-");
    std::fflush(stdout);
    results.push_back(r);
    if (cuda) c10::cuda::CUDACachingAllocator::emptyCache();
  }

  if (json_path.empty()) return 0;
  std::ofstream js(json_tmp);
  js << "{\n  \"device\": \"" << device_name << "\",\n  \"copy_bandwidth_gbs\": " << bw
     << ",\n  \"read_bandwidth_gbs\": " << read_bw << ",\n  \"write_bandwidth_gbs\": " << write_bw
     << ",\n  \"cases\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    js << "    {\"device\": \"" << r.c.device << "\", \"threads\": " << r.c.threads
       << ", \"BT\": " << r.c.BT << ", \"V\": " << r.c.V << ", \"dtype\": \""
       << dtype_name(r.c.dtype) << "\", \"grad_output\": " << r.c.grad_output
       << ", \"ignored_rows\": " << (r.c.labels ? "true" : "false")
       << ", \"ours_fwd_ms\": " << r.ours_fwd << ", \"ours_bwd_ms\": " << r.ours_bwd
       << ", \"ours_full_ms\": " << r.ours_full << ", \"kernels_full_ms\": " << r.kernels_full
       << ", \"ref_fwd_ms\": " << r.ref_fwd << ", \"ref_bwd_ms\": " << r.ref_bwd
       << ", \"ref_full_ms\": " << r.ref_full << ", \"limit_ms\": " << r.limit_ms << "}"
       << (i + 1 < results.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  js.close();
  std::error_code renamed;
  if (js) std::filesystem::rename(json_tmp, json_path, renamed);
  if (!js || renamed) {
    std::fprintf(stderr, "tvd_bench: could not write %s\n", json_path.c_str());
    std::filesystem::remove(json_tmp, renamed);
    return 1;
  }
  std::printf("\nwrote %s\n", json_path.c_str());
  return 0;
}

// Workshop: what a fresh (BT, V) CPU output costs. The CPU TVD backward reads p and q and writes a
// freshly allocated gradient; this times that pass with the library's row kernel
// (tvd_cpu_kernel.h) under different ways of getting the output memory, at several thread
// counts, and counts the page faults per call:
//   hint      at::empty + madvise(MADV_HUGEPAGE) on the 2 MiB-aligned interior
//   none      at::empty, no hint (the kernel's THP policy decides)
//   nohuge    at::empty + madvise(MADV_NOHUGEPAGE)
//   populate  at::empty + madvise(MADV_POPULATE_WRITE) (Linux 5.14+: the pages faulted in by one
//             system call instead of one trap per page)
//   hint+pop  MADV_HUGEPAGE, then MADV_POPULATE_WRITE
//   reused    one pre-faulted buffer for every call (the kernel's own speed, no faults)
//   torch     at::empty + fill_(0) by ATen (a fresh tensor filled by torch, for scale)
//
//   cpu_fresh_output [--rows N] [--V N] [--threads 1,4,16] [--reps N]
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "tvd_cpu_kernel.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return in ? line : "(unreadable)";
}

bool Advise(const at::Tensor& t, int advice) {
  if (advice == MADV_POPULATE_WRITE) {  // the whole buffer, page-aligned
    const uintptr_t page = 4096, data = reinterpret_cast<uintptr_t>(t.const_data_ptr());
    const uintptr_t begin = data & ~(page - 1), end = (data + t.nbytes() + page - 1) & ~(page - 1);
    return madvise(reinterpret_cast<void*>(begin), end - begin, advice) == 0;
  }
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const auto data = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const uintptr_t begin = (data + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (data + t.nbytes()) & ~(kHuge - 1);
  return end > begin && madvise(reinterpret_cast<void*>(begin), end - begin, advice) == 0;
}

void BackwardRows(const at::Tensor& p, const at::Tensor& q, at::Tensor& g) {
  const int64_t rows = p.size(0), V = p.size(1);
  const float* pp = p.const_data_ptr<float>();
  const float* qp = q.const_data_ptr<float>();
  float* gp = g.mutable_data_ptr<float>();
  at::parallel_for(
      0, rows, std::max<int64_t>(1, (int64_t{1} << 16) / V), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          lossfns::kernels::tvd_row_backward_cpu<false>(
              pp + r * V, qp + r * V, V, 0.5f, static_cast<const float*>(nullptr), gp + r * V);
        }
      });
}

struct Sample {
  double ms;
  double faults;
};

Sample Time(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  std::vector<double> ms;
  long faults = 0;
  for (int i = 0; i < reps; ++i) {
    const long f0 = MinorFaults();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    faults += MinorFaults() - f0;
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], static_cast<double>(faults) / reps};
}

}  // namespace

// A positive integer no larger than `most`, or nullopt.
std::optional<int64_t> PositiveInt(const std::string& text, int64_t most) {
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > most) {
    return std::nullopt;
  }
  return n;
}

constexpr const char* kUsage =
    "usage: cpu_fresh_output [--rows N] [--V N] [--threads 1,4,16] [--reps N]\n"
    "  (defaults: 1024 rows, V 32000, threads 1,4,16, 15 reps; every number a positive integer;\n"
    "  SOFTMAX=1 in the environment: softmax inputs instead of uniform ones)\n";

int main(int argc, char** argv) {
  int64_t rows = 1024, V = 32000;
  int reps = 15;
  std::vector<int> threads = {1, 4, 16};
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    const bool known = a == "--rows" || a == "--V" || a == "--reps" || a == "--threads";
    if (!known || i + 1 >= argc) {
      std::fprintf(stderr, "cpu_fresh_output: %s\n%s",
                   (known ? a + " needs a value" : "unknown option \"" + a + "\"").c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[i + 1];
    std::vector<int64_t> values;
    std::stringstream list(v);
    for (std::string t; std::getline(list, t, a == "--threads" ? ',' : '\0');) {
      const auto n = PositiveInt(t, a == "--threads" || a == "--reps" ? 1 << 20 : int64_t{1} << 31);
      if (!n) {
        std::fprintf(
            stderr, "cpu_fresh_output: %s: expected %s, got \"%s\"\n", a.c_str(),
            a == "--threads" ? "a list of positive integers (e.g. 1,4,16)" : "a positive integer",
            v.c_str());
        return 2;
      }
      values.push_back(*n);
    }
    if (values.empty()) {
      std::fprintf(stderr, "cpu_fresh_output: %s: expected a value\n", a.c_str());
      return 2;
    }
    if (a == "--rows") {
      rows = values[0];
    } else if (a == "--V") {
      V = values[0];
    } else if (a == "--reps") {
      reps = static_cast<int>(values[0]);
    } else {
      threads.assign(values.begin(), values.end());
    }
  }
  std::printf("THP enabled: %s\nTHP defrag:  %s\n",
              ReadFirstLine("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              ReadFirstLine("/sys/kernel/mm/transparent_hugepage/defrag").c_str());
  std::printf(
      "(%lld, %lld) fp32, %.0f MB out; median ms of %d calls (minor page faults per call)\n",
      static_cast<long long>(rows), static_cast<long long>(V), rows * V * 4 / 1e6, reps);
  at::manual_seed(0);
  const bool softmax = std::getenv("SOFTMAX") != nullptr;
  const at::Tensor p = softmax ? at::softmax(at::randn({rows, V}), -1) : at::rand({rows, V});
  const at::Tensor q = softmax ? at::softmax(at::randn({rows, V}), -1) : at::rand({rows, V});
  std::printf("inputs: %s\n", softmax ? "softmax(randn)" : "rand");
  at::Tensor reused = at::empty({rows, V});
  BackwardRows(p, q, reused);
  {
    at::Tensor probe = at::empty({rows, V});
    std::printf("MADV_POPULATE_WRITE: %s\n",
                Advise(probe, MADV_POPULATE_WRITE) ? "works" : "refused");
  }
  std::printf("%8s %16s %16s %16s %16s %16s %16s %16s %16s\n", "threads", "hint", "none", "nohuge",
              "populate", "hint+pop", "reused", "torch fill_", "op backward");
  const bool fragment = std::getenv("FRAGMENT") != nullptr;
  for (size_t row = 0; row < threads.size(); ++row) {
    const int t = threads[row];
    at::set_num_threads(t);
    auto fresh = [&](int advice, int then = -1) {
      return [&, advice, then] {
        at::Tensor g = at::empty({rows, V});
        if (advice >= 0) Advise(g, advice);
        if (then >= 0) Advise(g, then);
        BackwardRows(p, q, g);
      };
    };
    const Sample hint = Time(fresh(MADV_HUGEPAGE), reps);
    const Sample none = Time(fresh(-1), reps);
    const Sample nohuge = Time(fresh(MADV_NOHUGEPAGE), reps);
    const Sample populate = Time(fresh(MADV_POPULATE_WRITE), reps);
    const Sample hint_pop = Time(fresh(MADV_HUGEPAGE, MADV_POPULATE_WRITE), reps);
    const Sample kept = Time([&] { BackwardRows(p, q, reused); }, reps);
    const Sample fill = Time([&] { at::empty({rows, V}).fill_(0); }, reps);
    using Opt = const std::optional<at::Tensor>&;
    static const auto bwd_op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("lossfns::_tvd_backward", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Opt, Opt,
                              Opt, int64_t, int64_t, at::ScalarType, int64_t)>();
    const at::Tensor go = at::ones({}), scale = at::full({1}, 1.0 / rows), no_signs;
    const Sample op =
        Time([&] { bwd_op.call(go, no_signs, scale, p, q, {}, -100, V, at::kFloat, 3); }, reps);

    auto cell = [](const Sample& s) {
      static char buf[64];
      std::snprintf(buf, sizeof buf, "%7.1f (%6.0f)", s.ms, s.faults);
      return std::string(buf);
    };
    std::printf("%8d %16s", at::get_num_threads(), cell(hint).c_str());
    std::printf(" %16s", cell(none).c_str());
    std::printf(" %16s", cell(nohuge).c_str());
    std::printf(" %16s", cell(populate).c_str());
    std::printf(" %16s", cell(hint_pop).c_str());
    std::printf(" %16s", cell(kept).c_str());
    std::printf(" %16s", cell(fill).c_str());
    std::printf(" %16s\n", cell(op).c_str());
    if (fragment && row + 1 == threads.size() && (row == 0 || threads[row - 1] != t)) {
      // Fragment the free memory as a long-running process does: many mid-sized buffers of 4 KiB
      // pages, every other one kept alive; then the same row again.
      static std::vector<at::Tensor> kept_alive;
      for (int i = 0; i < 200; ++i) {
        at::Tensor b = at::empty({(int64_t{1} << 18) * (1 + i % 13)});
        b.fill_(1.0f);
        if (i % 2 == 0) kept_alive.push_back(b);
      }
      std::printf("after fragmenting the free memory (%zu buffers kept):\n", kept_alive.size());
      threads.push_back(t);  // the same row once more
    }
  }
  return 0;
}

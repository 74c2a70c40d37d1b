// Host side of the TVD kernel workshop (tvd_kernel_variants.cu): CUDA error checks, timing, and
// the float64 CPU reference of a full pass that every variant's loss and gradient are checked
// against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace tvd_workshop {

inline bool g_profile = false;  // --profile: every row runs once, untimed (for ncu's counters)
inline bool g_failed = false;   // a check failed: the workshop exits 1

template <typename F>
float time_ms_on(cudaStream_t stream, F&& f) {
  if (g_profile) {
    f();
    CHECK(cudaDeviceSynchronize());
    return 1.f;
  }
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < 10; ++i) f();
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / 10);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];  // median of 15 samples of 10 calls
}
template <typename F>
float time_ms(F&& f) {
  return time_ms_on(0, f);
}

// Host conversions, rounding as the kernels' from_float does.
inline float host_to_float(float x) { return x; }
inline float host_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
T host_from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

// The float64 CPU reference of a full pass (grad_output 1, reduction batchmean, no labels) on
// p and q as the device holds them: the loss over every row, and sign(p - q) for a sample of rows
// (64 spread over the batch, and the last one), whose gradient must then be exactly
// 0.5 * sign * scale in T, with scale = float(1 / BT) (a tie: +0), as the kernels round it.
struct Reference {
  int64_t BT = 0, V = 0;
  double loss = 0;
  std::vector<int64_t> rows;
  std::vector<int8_t> signs;  // rows.size() x V
};

template <typename T>
Reference MakeReference(const T* p, const T* q, int64_t BT, int64_t V) {
  Reference ref{BT, V};
  std::vector<int64_t> slot(BT, -1);
  const int64_t step = std::max<int64_t>(1, BT / 64);
  for (int64_t r = 0; r < BT; r += step) slot[r] = int64_t(ref.rows.size()), ref.rows.push_back(r);
  if (slot[BT - 1] < 0) slot[BT - 1] = int64_t(ref.rows.size()), ref.rows.push_back(BT - 1);
  ref.signs.resize(ref.rows.size() * V);
  const int workers = int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<double> sums(workers, 0.0);
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {  // rows in blocks of 64, copied from the device block by block
      const int64_t block = 64;
      std::vector<T> hp(block * V), hq(block * V);
      for (int64_t r0 = w * block; r0 < BT; r0 += int64_t(workers) * block) {
        const int64_t nr = std::min(block, BT - r0);
        CHECK(cudaMemcpy(hp.data(), p + r0 * V, nr * V * sizeof(T), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hq.data(), q + r0 * V, nr * V * sizeof(T), cudaMemcpyDeviceToHost));
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t s = slot[r0 + r];
          double row = 0.0;
          for (int64_t j = 0; j < V; ++j) {
            const double d =
                double(host_to_float(hp[r * V + j])) - double(host_to_float(hq[r * V + j]));
            row += std::fabs(d);
            if (s >= 0) ref.signs[s * V + j] = int8_t((d > 0) - (d < 0));
          }
          sums[w] += row;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  double sum = 0.0;
  for (double s : sums) sum += s;
  ref.loss = 0.5 * sum / double(BT);
  return ref;
}

// Compares the device's loss (`loss`, or nullptr to skip it) and gradient after a full pass with
// the reference; prints one line. The loss: float partial sums against float64, rtol 1e-4 (each
// thread sums a few thousand terms in float: worst case ~1e-4, typically 1e-6). The gradient: the
// reference rows, every element, bit for bit.
template <typename T>
void CheckPass(const char* what, const Reference& ref, const T* grad, const float* loss) {
  const float h = 0.5f * static_cast<float>(1.0 / double(ref.BT));
  const T value[3] = {host_from_float<T>(-h), host_from_float<T>(0.f * h), host_from_float<T>(h)};
  std::vector<T> row(ref.V);
  int64_t wrong = 0;
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    CHECK(cudaMemcpy(row.data(), grad + ref.rows[i] * ref.V, ref.V * sizeof(T),
                     cudaMemcpyDeviceToHost));
    for (int64_t j = 0; j < ref.V; ++j)
      wrong += std::memcmp(&row[j], &value[ref.signs[i * ref.V + j] + 1], sizeof(T)) != 0;
  }
  bool ok = wrong == 0;
  std::string loss_text;
  if (loss != nullptr) {
    float got = 0.f;
    CHECK(cudaMemcpy(&got, loss, sizeof(float), cudaMemcpyDeviceToHost));
    const double rel = std::fabs(double(got) - ref.loss) / std::max(std::fabs(ref.loss), 1e-30);
    ok = ok && rel <= 1e-4;
    char text[96];
    std::snprintf(text, sizeof text, "loss %.7g against %.7g (rel %.1e), ", double(got), ref.loss,
                  rel);
    loss_text = text;
  }
  std::printf(
      "  check %s: %sgradient of %zu rows: %s\n", what, loss_text.c_str(), ref.rows.size(),
      ok ? "ok" : (wrong ? (std::to_string(wrong) + " elements differ: FAIL").c_str() : "FAIL"));
  g_failed = g_failed || !ok;
}

}  // namespace tvd_workshop

// Framework-free CPU kernels of lossfns::distill_loss: one row of student and teacher logits in,
// the row's statistics out (forward), or the row's gradient out (backward). Raw pointers only;
// the Torch adapter (distill_cpu.cpp) checks inputs, picks dtype and divergence, and runs rows in
// parallel.
//
// Forward reads a row twice (logsumexp of both, then the divergence with its row constant); the
// backward reads it once more and writes the gradient: no (rows, V) intermediate. Inner loops are
// `omp simd` loops over inlined, branch-free float math (exp and log below are polynomial, so the
// compiler vectorises them; libm's are calls it cannot), accumulating in Acc (float; double for
// double inputs, where libm is used and the kernels double as a float64 check) over blocks of
// columns whose sums are added in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "distill_common.h"

namespace lossfns::kernels {

// exp and log for float, vectorisable (Cephes' polynomials, max relative error ~2e-7 over the
// range the kernels use). exp: 0 below -87.3 (no subnormal results), +inf above 88.72, NaN in,
// NaN out. log: for x > 0 (subnormals included); log(1) is exactly 0; +inf and NaN in, the same
// out (the exponent-bit arithmetic alone gives ~88.7 for both: a NaN logsumexp must stay NaN).
struct CpuMathF {
  static inline __attribute__((always_inline)) float exp(float x) {
    const float xc = x < -87.33654f ? -87.33654f : (x > 88.72283f ? 88.72283f : x);
    // n = round(x log2 e), from a NaN-free copy (a NaN would make the int conversion below
    // undefined); a NaN x still gives NaN through r.
    const float fn = ((x == x ? xc : 0.0f) * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    // 2^n from its exponent bits; n in [-126, 128], shifted as unsigned (no signed-shift UB).
    const int32_t bits =
        static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(fn) + 127) << 23);
    float two_n;
    std::memcpy(&two_n, &bits, sizeof(float));
    const float out = y * two_n;
    return x < -87.33654f ? 0.0f : (x > 88.72283f ? std::numeric_limits<float>::infinity() : out);
  }
  static inline __attribute__((always_inline)) float log(float x) {
    const bool sub = x < 1.17549435e-38f;
    const float xs = sub ? x * 8388608.0f : x;  // 2^23: subnormals to normals
    int32_t bits;
    std::memcpy(&bits, &xs, sizeof(float));
    float e = static_cast<float>(((bits >> 23) & 0xff) - 127) - (sub ? 23.0f : 0.0f);
    const int32_t mbits = (bits & 0x007fffff) | 0x3f800000;
    float m;
    std::memcpy(&m, &mbits, sizeof(float));  // [1, 2)
    const bool big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1.0f : e;
    const float f = m - 1.0f;
    const float z = f * f;
    float y = 7.0376836292e-2f;
    y = y * f - 1.1514610310e-1f;
    y = y * f + 1.1676998740e-1f;
    y = y * f - 1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f;
    y = y * f - 1.6668057665e-1f;
    y = y * f + 2.0000714765e-1f;
    y = y * f - 2.4999993993e-1f;
    y = y * f + 3.3333331174e-1f;
    y = y * f * z;
    y += e * -2.12194440e-4f;
    y += -0.5f * z;
    const float out = (f + y) + e * 0.693359375f;
    return x < std::numeric_limits<float>::infinity() ? out : x;
  }
  static inline float log_m(float /*m*/) { return 0.0f; }  // log_ratio divides instead
  static inline __attribute__((always_inline)) float log_ratio(float x, float /*log_x*/, float m,
                                                               float /*log_m*/, float bound,
                                                               float /*log_bound*/) {
    const float r = m > 0.0f ? x / m : bound;
    return log(r < bound ? r : bound);
  }
};
struct CpuMathD {
  static inline double exp(double x) { return std::exp(x); }
  static inline double log(double x) { return std::log(x); }
  static inline double log_m(double /*m*/) { return 0.0; }
  static inline double log_ratio(double x, double /*log_x*/, double m, double /*log_m*/,
                                 double bound, double /*log_bound*/) {
    const double r = m > 0.0 ? x / m : bound;
    return std::log(r < bound ? r : bound);
  }
};
template <typename Acc>
using CpuMath = std::conditional_t<std::is_same_v<Acc, double>, CpuMathD, CpuMathF>;

// One row: the student's ws logits and the teacher's wt logits (unit stride); columns at or past
// their width, and all columns at or past V (the vocabulary: padding), are -inf in that
// distribution. inv_t = 1 / temperature.
template <typename T>
struct CpuRow {
  const T* s;
  const T* t;
  int64_t ws, wt, V;
};

namespace cpu_detail {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row sums run in Acc (float) over kFold columns at a time (the vector lanes' chains), then
// each block's sum is added to a double: the rounding error is that of kFold-long float sums, not
// of a whole row's (a baseline SSE2 build's four chains of V / 4 float additions erred by 4e-5
// relative at V = 151936 and 2e-3 at 2^21). One double addition per 512 columns costs nothing
// measurable. For double rows it changes nothing.
constexpr int64_t kFold = 512;

// The max and the log of the sum of exp(x_j * inv_t - max) over the first n values of a row
// (columns n..V are -inf). A row without mass: max -inf, log_sum 0.
template <typename Acc>
struct LogSumExp {
  Acc max, log_sum;
};
template <typename T, typename Acc>
LOSSFNS_HOST_DEVICE LogSumExp<Acc> row_logsumexp(const T* x, int64_t n, Acc inv_t) {
  using M = CpuMath<Acc>;
  Acc mx = -std::numeric_limits<Acc>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) {
    const Acc a = static_cast<Acc>(x[j]) * inv_t;
    mx = a > mx ? a : mx;
  }
  if (!(mx > -std::numeric_limits<Acc>::infinity())) {
    // All -inf (no mass), or NaN somewhere (NaN compares false): NaN logits give a NaN loss.
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) nan = nan || std::isnan(static_cast<Acc>(x[j]));
    return {mx, nan ? std::numeric_limits<Acc>::quiet_NaN() : Acc(0)};
  }
  double total = 0.0;
  for (int64_t begin = 0; begin < n; begin += kFold) {
    const int64_t end = begin + kFold < n ? begin + kFold : n;
    Acc sum = Acc(0);
#pragma omp simd reduction(+ : sum)
    for (int64_t j = begin; j < end; ++j) sum += M::exp(static_cast<Acc>(x[j]) * inv_t - mx);
    total += static_cast<double>(sum);
  }
  // NaN if any x is NaN (exp(NaN) is NaN); +inf logits give NaN too
  return {mx, M::log(static_cast<Acc>(total))};
}

// lp and p of one scaled logit a from its row's LogSumExp; p = 0, lp = -inf where a = -inf.
template <typename Acc>
LOSSFNS_HOST_DEVICE void log_prob(Acc a, const LogSumExp<Acc>& lse, Acc& lp, Acc& p) {
  using M = CpuMath<Acc>;
  const bool none = a == -std::numeric_limits<Acc>::infinity();
  lp = none ? a : (a - lse.max) - lse.log_sum;
  p = none ? Acc(0) : M::exp(lp);
}
}  // namespace cpu_detail

// Forward of one row: stats[0..kStatsPerRow) as distill_common.h lays them out (natural logs).
template <int64_t kDiv, typename T, typename Acc>
void distill_row_forward_cpu(const CpuRow<T>& row, Acc inv_t, const JsdConstants<Acc>& jsd,
                             Acc* stats) {
  using M = CpuMath<Acc>;
  const int64_t ns = row.ws < row.V ? row.ws : row.V, nt = row.wt < row.V ? row.wt : row.V;
  const auto lse_s = cpu_detail::row_logsumexp<T, Acc>(row.s, ns, inv_t);
  const auto lse_t = cpu_detail::row_logsumexp<T, Acc>(row.t, nt, inv_t);
  const int64_t n = ns < nt ? ns : nt;  // columns where both are read
  double loss_sum = 0.0, c_sum = 0.0;   // blocks of kFold columns, as row_logsumexp
  for (int64_t begin = 0; begin < n; begin += cpu_detail::kFold) {
    const int64_t end = begin + cpu_detail::kFold < n ? begin + cpu_detail::kFold : n;
    Acc block_loss = Acc(0), block_c = Acc(0);
#pragma omp simd reduction(+ : block_loss, block_c)
    for (int64_t j = begin; j < end; ++j) {
      Acc lp, p, lq, q, term, g;
      cpu_detail::log_prob(static_cast<Acc>(row.s[j]) * inv_t, lse_s, lp, p);
      cpu_detail::log_prob(static_cast<Acc>(row.t[j]) * inv_t, lse_t, lq, q);
      divergence_element<Acc, M>(kDiv, jsd, p, q, lp, lq, term, g);
      block_loss += term;
      block_c += p * g;
    }
    loss_sum += static_cast<double>(block_loss);
    c_sum += static_cast<double>(block_c);
  }
  // Columns only one distribution has (student and teacher of different widths): the other's
  // probability there is 0.
  const Acc ninf = -std::numeric_limits<Acc>::infinity();
  for (int64_t j = n; j < (ns > nt ? ns : nt); ++j) {
    Acc lp, p, lq, q, term, g;
    cpu_detail::log_prob(j < ns ? static_cast<Acc>(row.s[j]) * inv_t : ninf, lse_s, lp, p);
    cpu_detail::log_prob(j < nt ? static_cast<Acc>(row.t[j]) * inv_t : ninf, lse_t, lq, q);
    divergence_element<Acc, M>(kDiv, jsd, p, q, lp, lq, term, g);
    loss_sum += static_cast<double>(term);
    c_sum += static_cast<double>(p * g);
  }
  Acc loss = static_cast<Acc>(loss_sum);
  const Acc c = static_cast<Acc>(c_sum);
  stats[0] = lse_s.max;
  stats[1] = lse_s.log_sum;
  stats[2] = lse_t.max;
  stats[3] = lse_t.log_sum;
  // Mass on one side only (the other -inf everywhere: no distribution): a NaN loss, and a NaN row
  // constant that makes the gradient NaN at every column, as the composite's softmax of an all
  // -inf row gives. (Per element the terms whose weight is 0 drop it: forward KL would give 0.)
  // The normalisers stay as they are: the fused cross-entropy reads the student's.
  if ((lse_s.max == -std::numeric_limits<Acc>::infinity()) !=
      (lse_t.max == -std::numeric_limits<Acc>::infinity()))
    loss = std::numeric_limits<Acc>::quiet_NaN();
  stats[4] = saved_row_constant(kDiv, loss, c);
  stats[kStatLoss] = stored_row_loss(loss);
}

// Backward of one row: grad[j] = scale * d loss_row / d s_j for the student's ws columns, where
// scale = grad_output * reduction scale (the caller's) / T. Columns at or past V get 0.
template <int64_t kDiv, typename T, typename Acc>
void distill_row_backward_cpu(const CpuRow<T>& row, Acc inv_t, const JsdConstants<Acc>& jsd,
                              const Acc* stats, Acc scale, T* grad) {
  using M = CpuMath<Acc>;
  const int64_t ns = row.ws < row.V ? row.ws : row.V, nt = row.wt < row.V ? row.wt : row.V;
  const int64_t n = ns < nt ? ns : nt;
  const cpu_detail::LogSumExp<Acc> lse_s{stats[0], stats[1]}, lse_t{stats[2], stats[3]};
  const Acc c = stats[4];
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    Acc lp, p, lq, q, term, g;
    cpu_detail::log_prob(static_cast<Acc>(row.s[j]) * inv_t, lse_s, lp, p);
    cpu_detail::log_prob(static_cast<Acc>(row.t[j]) * inv_t, lse_t, lq, q);
    divergence_element<Acc, M>(kDiv, jsd, p, q, lp, lq, term, g);
    store_as(grad + j, scale * divergence_grad(kDiv, p, q, g, c));
  }
  const Acc ninf = -std::numeric_limits<Acc>::infinity();
  for (int64_t j = n; j < ns; ++j) {  // the student's columns the teacher does not have
    Acc lp, p, lq, q, term, g;
    cpu_detail::log_prob(static_cast<Acc>(row.s[j]) * inv_t, lse_s, lp, p);
    cpu_detail::log_prob(ninf, lse_t, lq, q);
    divergence_element<Acc, M>(kDiv, jsd, p, q, lp, lq, term, g);
    store_as(grad + j, scale * divergence_grad(kDiv, p, q, g, c));
  }
  for (int64_t j = ns; j < row.ws; ++j) grad[j] = static_cast<T>(0);  // padding: past V
}

// Rows of a (rows, ws) student and (rows, wt) teacher with row strides, and the labels that
// ignore rows (nullptr: none ignored): what one parallel chunk of rows needs.
template <typename T>
struct CpuRows {
  const T* s;
  const T* t;
  int64_t s_stride, t_stride, ws, wt, V;
  const int64_t* labels;
  int64_t ignore_index;
  CpuRow<T> row(int64_t r) const { return {s + r * s_stride, t + r * t_stride, ws, wt, V}; }
  bool ignored(int64_t r) const { return labels != nullptr && labels[r] == ignore_index; }
};

// The row loops below are flattened: every call in them (the row kernels, log_prob, the exp/log
// polynomials) is inlined, so each loop vectorises whatever gcc's inlining budget for the file
// (with plain inlining the JSD loop ran 2x and the TVD loop 3x slower in some builds, depending on
// what else the file held), and each per-ISA build (distill_cpu_isa.cpp) compiles all of it for
// its ISA.
#define LOSSFNS_CPU_FLATTEN __attribute__((flatten))

// Forward of rows [begin, end): kStatsPerRow stats per row; an ignored row's are all 0.
template <typename T, typename Acc>
LOSSFNS_CPU_FLATTEN void distill_rows_forward_cpu(int64_t divergence, const CpuRows<T>& rows,
                                                  int64_t begin, int64_t end, Acc inv_t,
                                                  const JsdConstants<Acc>& jsd, Acc* stats) {
  with_divergence(divergence, [&](auto div) {
    for (int64_t r = begin; r < end; ++r) {
      Acc* row_stats = stats + r * kStatsPerRow;
      if (rows.ignored(r)) {
        std::fill(row_stats, row_stats + kStatsPerRow, Acc(0));
        continue;
      }
      distill_row_forward_cpu<decltype(div)::value>(rows.row(r), inv_t, jsd, row_stats);
    }
  });
}

// Backward of rows [begin, end) into grad (rows, ws), contiguous; an ignored row gets 0. The
// row's scale is grad_output[r] ('none') or grad_output[0] * reduce_scale, over T.
template <typename T, typename Acc>
LOSSFNS_CPU_FLATTEN void distill_rows_backward_cpu(int64_t divergence, const CpuRows<T>& rows,
                                                   int64_t begin, int64_t end, Acc inv_t,
                                                   const JsdConstants<Acc>& jsd, const Acc* stats,
                                                   const Acc* grad_output, bool none,
                                                   Acc reduce_scale, T* grad) {
  with_divergence(divergence, [&](auto div) {
    for (int64_t r = begin; r < end; ++r) {
      T* grow = grad + r * rows.ws;
      if (rows.ignored(r)) {
        std::fill(grow, grow + rows.ws, T(0));
        continue;
      }
      const Acc row_scale = (none ? grad_output[r] : grad_output[0] * reduce_scale) * inv_t;
      distill_row_backward_cpu<decltype(div)::value>(rows.row(r), inv_t, jsd,
                                                     stats + r * kStatsPerRow, row_scale, grow);
    }
  });
}

}  // namespace lossfns::kernels

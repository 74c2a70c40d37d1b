// The CUDA distillation kernels' row math (lib/src/distill_cuda_math.h) on the host, against a
// float64 reference, on any machine: the functions the kernels run per vector and per element
// (add_scaled, add_scaled_kl, combine, combine_kl, kl_row_loss, prob, and distill_common.h's
// divergence_element and divergence_grad), combined in the order distill_forward_kernel combines
// them: a row's vectors dealt to the block's threads in turn (pass 2 last group first, as
// for_each_vec<true>), each thread's sums through the warps' butterfly and then across the warps
// (row_reduce.cuh's block_allreduce), whose every lane must end with the same bits. Not emulated:
// the SFU instructions' approximation (ex2.approx.ftz, lg2.approx.ftz run as exact host functions
// with the same flushes of subnormals) and nvcc's FMA contraction (the host adds and multiplies
// apart: the lanes' agreement here does not prove that mul_rn / add_rn keep products out of
// FMAs on the device; the SASS does). The kernels' loops, loads and shuffles run only on a GPU
// (distill_test's CUDA cases). Session 41's reviews emulated this math by hand and found a KL
// dot that overflowed for masks at the dtype's lowest value on one side.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "distill_common.h"
#include "distill_cuda_math.h"

namespace {

namespace kd = lossfns::kernels::distill_detail;
using lossfns::kernels::kForwardKl;
using lossfns::kernels::kJsd;
using lossfns::kernels::kReverseKl;
using lossfns::kernels::kTvd;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kBeta = 0.3;

// Bit for bit, a NaN equal to any NaN (a NaN's sign and payload are not the kernels' contract).
bool same_bits(const kd::MaxSum2& a, const kd::MaxSum2& b) {
  const float x[6] = {a.w.max, a.w.sum, a.w.dot, a.w.imax, a.o.max, a.o.sum};
  const float y[6] = {b.w.max, b.w.sum, b.w.dot, b.w.imax, b.o.max, b.o.sum};
  for (int i = 0; i < 6; ++i)
    if (!(std::isnan(x[i]) && std::isnan(y[i])) && std::memcmp(&x[i], &y[i], sizeof(float)) != 0)
      return false;
  return true;
}

// row_reduce.cuh's block_allreduce over `threads` values: each warp's butterfly (lane i takes
// op(v_i, v_{i ^ o}) for o = 16, ..., 1), the warps' results through shared memory, and the
// butterfly again over them (lanes past the warps hold the identity). Returns every thread's
// result.
template <typename T, typename Op>
std::vector<T> block_allreduce(std::vector<T> v, Op op, T identity) {
  const int threads = static_cast<int>(v.size()), warps = (threads + 31) / 32;
  auto warp_allreduce = [&](std::vector<T>& x, int base) {
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<T> next(x);
      for (int lane = 0; lane < 32; ++lane)
        next[base + lane] = op(x[base + lane], x[base + (lane ^ o)]);
      x = next;
    }
  };
  v.resize(static_cast<size_t>(warps) * 32, identity);  // a partial warp's missing lanes
  for (int w = 0; w < warps; ++w) warp_allreduce(v, 32 * w);
  std::vector<T> r(static_cast<size_t>(warps) * 32);
  for (int w = 0; w < warps; ++w) {
    std::vector<T> second(32, identity);
    for (int lane = 0; lane < warps; ++lane) second[lane] = v[32 * lane];
    warp_allreduce(second, 0);
    for (int lane = 0; lane < 32; ++lane) r[32 * w + lane] = second[lane];
  }
  r.resize(threads);
  return r;
}

// distill_forward_threads: about 4 vectors per thread, 64 to 128 threads.
int forward_threads(int64_t V, int N) {
  const int64_t vecs = (V + N - 1) / N;
  const int threads = static_cast<int>((vecs + 3) / 4 + 31) / 32 * 32;
  return std::clamp(threads, 64, 128);
}

struct KernelRow {
  float loss;               // the row loss as the forward stores it (stored_row_loss)
  std::vector<float> grad;  // d loss / d s for grad_output 1, as the backward writes it
  bool lanes_agree = true;  // every thread's normalisers and dot, bit for bit
};

// One row through the forward's pass 1, its loss (pass 2 for TVD and JSD, kl_row_loss for the
// KLs) and the backward's per-element gradient, N columns per vector.
KernelRow kernel_row(int64_t div, const std::vector<float>& s, const std::vector<float>& t,
                     double T, int N) {
  const int64_t V = static_cast<int64_t>(s.size());
  const int threads = forward_threads(V, N);
  const float inv_t = static_cast<float>(1.0 / T), k2 = inv_t * kd::kLog2e;
  const bool rev = div == kReverseKl, kl = rev || div == kForwardKl;
  const kd::MaxSum2 identity{{-kInf, 0.f, 0.f, -kInf}, {-kInf, 0.f}};
  auto vec = [&](const std::vector<float>& x, int64_t v, float(&out)[8]) {
    for (int k = 0; k < N; ++k) out[k] = v * N + k < V ? x[v * N + k] : -kInf;
  };
  std::vector<kd::MaxSum2> part(threads, identity);
  const int64_t vecs = (V + N - 1) / N;
  for (int th = 0; th < threads; ++th)
    for (int64_t v = th; v < vecs; v += threads) {
      float xs[8], ys[8];
      vec(s, v, xs);
      vec(t, v, ys);
      kd::MaxSum2& ms = part[th];
      // The kernels' N is 8 (16-bit types) or 4 (float); the functions take it as a template
      // argument.
      auto step = [&](auto n) {
        constexpr int M = decltype(n)::value;
        float x[M], y[M];
        std::copy(xs, xs + M, x);
        std::copy(ys, ys + M, y);
        if (rev) {
          ms = kd::add_scaled_kl<M>(ms, x, y, k2);
        } else if (kl) {
          ms = kd::add_scaled_kl<M>(ms, y, x, k2);
        } else {
          const kd::MaxSum wt = kd::add_scaled<M>(kd::MaxSum{ms.w.max, ms.w.sum}, y, k2);
          ms.w = kd::MaxSumDot{wt.max, wt.sum, 0.f, -kInf};
          ms.o = kd::add_scaled<M>(ms.o, x, k2);
        }
      };
      if (N == 8)
        step(std::integral_constant<int, 8>{});
      else
        step(std::integral_constant<int, 4>{});
    }
  const auto op = [kl](kd::MaxSum2 u, kd::MaxSum2 v) {
    if (kl) return kd::combine_kl(u, v);
    const kd::MaxSum w = kd::combine(kd::MaxSum{u.w.max, u.w.sum}, kd::MaxSum{v.w.max, v.w.sum});
    return kd::MaxSum2{{w.max, w.sum, 0.f, -kInf}, kd::combine(u.o, v.o)};
  };
  const std::vector<kd::MaxSum2> all = block_allreduce(part, op, identity);
  KernelRow out;
  for (const kd::MaxSum2& m : all) out.lanes_agree = out.lanes_agree && same_bits(m, all[0]);
  const kd::MaxSum2 ms = all[0];
  const float mx_s = rev ? ms.w.max : ms.o.max, mx_t = rev ? ms.o.max : ms.w.max;
  const float sum_s = rev ? ms.w.sum : ms.o.sum, sum_t = rev ? ms.o.sum : ms.w.sum;
  const float ls_s = mx_s == -kInf ? 0.f : std::log2(sum_s),
              ls_t = mx_t == -kInf ? 0.f : std::log2(sum_t);
  const kd::ProbNorm ns_s = kd::prob_norm(mx_s, ls_s), ns_t = kd::prob_norm(mx_t, ls_t);
  const lossfns::kernels::JsdConstants<float> jsd(div == kJsd ? kBeta : 0.5);
  float loss = 0.f, c = 0.f;
  if (kl) {
    loss = kd::kl_row_loss(ms, k2, rev ? mx_s : mx_t, rev ? ls_s : ls_t, rev ? ls_t : ls_s);
    c = loss;
  } else {
    // Pass 2 per thread over the same vectors, in for_each_vec<true>'s order (groups of kU = 2
    // vectors, j0 and j0 + step, the last group first), then the block's sum (block_sum2).
    std::vector<std::pair<float, float>> lc(threads, {0.f, 0.f});
    const int64_t step = int64_t(threads) * N;
    for (int th = 0; th < threads; ++th) {
      std::vector<int64_t> groups;
      for (int64_t j0 = int64_t(th) * N; j0 < V; j0 += 2 * step) groups.push_back(j0);
      for (auto g0 = groups.rbegin(); g0 != groups.rend(); ++g0)
        for (int64_t v0 : {*g0, *g0 + step}) {
          if (v0 >= V) continue;
          // The vector's terms, then into the thread's sums (as the kernel adds them).
          std::pair<float, float> vec_sum{0.f, 0.f};
          for (int64_t j = v0; j < std::min(v0 + N, V); ++j) {
            float p, lp, q, lq, term, g;
            kd::prob(s[j], k2, ns_s, p, lp);
            kd::prob(t[j], k2, ns_t, q, lq);
            lossfns::kernels::divergence_element<float, kd::CudaMath>(div, jsd, p, q, lp, lq, term,
                                                                      g);
            vec_sum.first += term;
            vec_sum.second += p * g;
          }
          lc[th].first += vec_sum.first;
          lc[th].second += vec_sum.second;
        }
    }
    const auto sum2 = [](std::pair<float, float> a, std::pair<float, float> b) {
      return std::pair<float, float>{a.first + b.first, a.second + b.second};
    };
    const auto r = block_allreduce(lc, sum2, std::pair<float, float>{0.f, 0.f});
    loss = r[0].first;
    c = r[0].second;
  }
  if ((mx_s == -kInf) != (mx_t == -kInf)) loss = NAN;  // mass on one side only
  c = lossfns::kernels::saved_row_constant<float>(div, loss, c);
  out.loss = lossfns::kernels::stored_row_loss(loss);
  // The backward's element: grad = row_scale * divergence_grad, row_scale = 1 / T here.
  out.grad.resize(V);
  for (int64_t j = 0; j < V; ++j) {
    float p, lp, q, lq, term, g;
    kd::prob(s[j], k2, ns_s, p, lp);
    kd::prob(t[j], k2, ns_t, q, lq);
    lossfns::kernels::divergence_element<float, kd::CudaMath>(div, jsd, p, q, lp, lq, term, g);
    out.grad[j] = inv_t * lossfns::kernels::divergence_grad(div, p, q, g, c);
  }
  return out;
}

struct RefRow {
  double loss;
  std::vector<double> grad;
  // TVD's near ties, |p - q| <= 1e-5 (p + q): the sign of p - q in float may differ there, and
  // the gradient with it, by up to p_j / T at the tie and p_j (the ties' p) / T everywhere
  // through the row constant (the sign is ill-conditioned, not the kernel wrong).
  std::vector<double> sign_slack;
};

// float64: p = softmax(s / T), q = softmax(t / T) (columns -inf on a side have probability 0
// there; a side -inf everywhere has no distribution: NaN); the divergence and d loss / d s.
RefRow reference_row(int64_t div, const std::vector<float>& s, const std::vector<float>& t,
                     double T) {
  const size_t V = s.size();
  auto log_softmax = [&](const std::vector<float>& x) {
    std::vector<double> a(V);
    double m = -INFINITY;
    for (size_t j = 0; j < V; ++j) m = std::max(m, a[j] = x[j] / T);
    if (m == -INFINITY) return std::vector<double>(V, NAN);
    double z = 0;
    for (size_t j = 0; j < V; ++j) z += std::exp(a[j] - m);
    for (size_t j = 0; j < V; ++j) a[j] = a[j] - m - std::log(z);
    return a;
  };
  const std::vector<double> lp = log_softmax(s), lq = log_softmax(t);
  RefRow r{0.0, std::vector<double>(V, 0.0), std::vector<double>(V, 0.0)};
  const bool no_p = std::isnan(lp[0]), no_q = std::isnan(lq[0]);
  if (no_p || no_q) {
    r.loss = no_p && no_q ? 0.0 : NAN;
    if (no_p != no_q) std::fill(r.grad.begin(), r.grad.end(), NAN);
    return r;
  }
  std::vector<double> g(V, 0.0);
  double pg = 0, tie_mass = 0;
  for (size_t j = 0; j < V; ++j) {
    const double p = std::exp(lp[j]), q = std::exp(lq[j]);
    switch (div) {
      case kTvd:
        r.loss += 0.5 * std::abs(p - q);
        g[j] = 0.5 * ((p > q) - (p < q));
        if (std::abs(p - q) <= 1e-5 * (p + q)) {
          r.sign_slack[j] = p / T;
          tie_mass += p;
        }
        break;
      case kForwardKl:
        if (q > 0) r.loss += q * (lq[j] - lp[j]);
        break;
      case kReverseKl:
        if (p > 0) r.loss += p * (g[j] = lp[j] - lq[j]);
        break;
      default: {
        // The logs of the ratios at their bounds (p / m <= 1 / (1 - beta), q / m <= 1 / beta), as
        // the kernels clamp them: a subnormal q whose beta q rounds to 0 would make m 0.
        const double m = p + kBeta * (q - p);
        const double lpm = p > 0 ? std::min(std::log(p / m), -std::log1p(-kBeta)) : 0.0;
        const double lqm = q > 0 ? std::min(std::log(q / m), -std::log(kBeta)) : 0.0;
        r.loss += kBeta * q * lqm + (1 - kBeta) * p * lpm;
        g[j] = (1 - kBeta) * lpm;
      }
    }
    pg += p * g[j];
  }
  for (size_t j = 0; j < V; ++j) {
    const double p = std::exp(lp[j]);
    r.grad[j] = (div == kForwardKl ? p - std::exp(lq[j]) : p * (g[j] - pg)) / T;
    r.sign_slack[j] += p * tie_mass / T;
    // g's float rounding (a log ratio, or lp - lq): a few ulps of the logs, times p / T.
    const double logs = (std::isfinite(lp[j]) ? std::abs(lp[j]) : 0.0) +
                        (std::isfinite(lq[j]) ? std::abs(lq[j]) : 0.0);
    r.sign_slack[j] += 5e-7 * p * (1.0 + logs) / T;
  }
  return r;
}

const char* name(int64_t div) {
  return div == kTvd         ? "tvd"
         : div == kForwardKl ? "forward_kl"
         : div == kReverseKl ? "reverse_kl"
                             : "jsd";
}

// The dot's rescale where the other side had no mass yet: every column so far was out of the dot,
// and max_o' - max_o is +inf (a finite row reaches this only where the weighting side's
// underflowing weights meet the other side's -inf, whose float64 answer the flush changes).
TEST(DistillCudaMath, TheDotRestartsWhereTheOtherSideHadNoMass) {
  const kd::MaxSumDot w{1.f, 2.f, 0.f, -kInf};
  EXPECT_EQ(kd::rescaled_dot(w, -kInf, 2.f, 5.f, std::exp2(1.f - 2.f)), 0.f);
  EXPECT_EQ(kd::rescaled_dot(w, -kInf, 1.f, -kInf, 1.f), 0.f);
  // r flushed to 0: the old terms weigh nothing, whatever the shift (here -inf * sum).
  EXPECT_EQ(kd::rescaled_dot(kd::MaxSumDot{-kInf, 0.f, 0.f, -kInf}, 3.f, 2.f, 3.f, 0.f), 0.f);
  // Both maxima unmoved: the dot as it was; moved: shifted by the two differences times the sum.
  EXPECT_EQ(kd::rescaled_dot(kd::MaxSumDot{1.f, 2.f, 0.75f, -kInf}, 4.f, 1.f, 4.f, 1.f), 0.75f);
  EXPECT_EQ(kd::rescaled_dot(kd::MaxSumDot{1.f, 2.f, 0.75f, -kInf}, 4.f, 2.f, 6.f, 0.5f),
            0.5f * (0.75f + ((1.f - 2.f) + (6.f - 4.f)) * 2.f));
}

// Rows of the trainer's vocabularies whose probabilities are many and equal (a uniform student
// against a teacher flat on half the row): a thread of the forward adds ~1200 (V = 151936) to
// ~2000 (262144) columns. Added one by one to its running float sums, such rows lost 1.9e-5
// (TVD), 3-6e-5 (JSD) and 3e-5 to 1.4e-4 (the KLs) of the loss (measured on an H100, session
// 51); a vector's terms summed first, then added, keep TVD within 4e-6 and JSD within 1e-5 here.
// The KLs stay near 1e-5: their loss is ln 2 (dot / sum_w + ls_o - ls_w), and each log2 sum
// (~17 at these V) is a float whose rounding (2^-19) is 1e-5 of a loss of 0.13.
TEST(DistillCudaMath, LongRowsOfEqualProbabilitiesSumAccurately) {
  for (int64_t div : {kTvd, kForwardKl, kReverseKl, kJsd})
    for (int N : {8, 4})
      for (int64_t V : {151936, 262144}) {
        std::vector<float> s(V, 0.f), t(V, 0.f);
        for (int64_t j = 0; j < V / 2; ++j) t[j] = 1.09375f;
        const KernelRow k = kernel_row(div, s, t, 1.0, N);
        const RefRow r = reference_row(div, s, t, 1.0);
        const double bound = div == kTvd ? 8e-6 : div == kJsd ? 1.5e-5 : 2.5e-5;
        EXPECT_LE(std::abs(k.loss - r.loss) / r.loss, bound)
            << "divergence " << div << " N " << N << " V " << V << ": " << k.loss << " reference "
            << r.loss;
      }
}

TEST(DistillCudaMath, RowsMatchTheFloat64ReferenceAndTiesAreExactlyZero) {
  const float lowest = std::numeric_limits<float>::lowest();
  std::mt19937 gen(41);
  int rows = 0;
  double worst_loss = 0, worst_grad = 0;
  for (int64_t div : {kTvd, kForwardKl, kReverseKl, kJsd})
    for (int N : {8, 4})
      for (int64_t V : {1, 7, 255, 1000, 4099})
        for (double T : {1e-3, 0.5, 1.0, 2.0, 100.0})
          for (int kind = 0; kind < 17; ++kind) {
            std::normal_distribution<float> nd(0.f, kind == 2 ? 30.f : 2.f);
            std::vector<float> s(V), t(V);
            for (int64_t j = 0; j < V; ++j) {
              s[j] = nd(gen) + (kind == 3 ? 500.f : 0.f);
              t[j] = nd(gen) - (kind == 3 ? 300.f : 0.f);
            }
            // The side whose masks weigh 0 in every divergence: the teacher, but the student for
            // reverse KL (the other side masked under mass is ~1e38 in float64, +inf on CUDA).
            std::vector<float>& weighting = div == kReverseKl ? s : t;
            const bool identical = kind == 1 || kind == 9;
            if (identical) t = s;
            if (kind == 4)  // a run of masks over the first vectors, another inside vectors
              for (int64_t j = 0; j < V; ++j)
                if (j <= V / 2 || (j >= 700 && j < 737)) weighting[j] = lowest;
            if (kind == 5) std::fill(weighting.begin(), weighting.end(), lowest);  // whole row
            if (kind == 6)  // the same columns masked on both sides
              for (int64_t j = 0; j <= V / 2; ++j) s[j] = t[j] = lowest;
            if (kind == 7)  // -inf on both sides (padding), not the whole row
              for (int64_t j = 1; j < V; j += 3) s[j] = t[j] = -kInf;
            if (kind == 8 && div != kForwardKl)  // student masked (not forward KL's other side)
              for (int64_t j = 0; j <= V / 2; ++j) s[j] = lowest;
            std::vector<float>& other = div == kReverseKl ? t : s;
            const int64_t top =
                std::max_element(weighting.begin(), weighting.end()) - weighting.begin();
            if (kind == 10) {  // the other side -inf under the weighting side's mass: KLs +inf
              for (int64_t j = 0; j <= V / 4; ++j) other[j] = -kInf;
              other[top] = -kInf;
            }
            if (kind == 11)  // the other side -inf under weights that underflow: finite
              for (int64_t j = 0; j <= V / 4; ++j) {
                if (j == top) continue;
                other[j] = -kInf;
                weighting[j] = static_cast<float>(-2e4 * T);
              }
            if (kind == 12) s[V / 2] = NAN;  // NaN in, NaN out: the row's loss and gradient
            if (kind == 13) t[V / 2] = NAN;
            if (kind == 14) t[V / 3] = kInf;  // +inf: NaN, as log_softmax gives
            if (kind == 15) {  // NaN and -inf alone on both sides: both maxima -inf, still NaN
              std::fill(s.begin(), s.end(), -kInf);
              s[V / 2] = NAN;
              t = s;
            }
            if (kind == 16) {  // the weighting side without mass, NaN on the other: NaN
              std::fill(weighting.begin(), weighting.end(), -kInf);
              std::fill(other.begin(), other.end(), -kInf);
              other[V - 1] = NAN;
            }
            if (kind == 9) {          // identical rows spanning the range: the largest value, masks
              if (T < 1.5) continue;  // where the largest value stays finite once scaled
              s[0] = std::numeric_limits<float>::max();
              for (int64_t j = 1; j < std::min<int64_t>(V, 20); ++j) s[j] = lowest;
              t = s;
            }
            SCOPED_TRACE(std::string(name(div)) + " N=" + std::to_string(N) +
                         " V=" + std::to_string(V) + " T=" + std::to_string(T) +
                         " kind=" + std::to_string(kind));
            ++rows;
            const KernelRow k = kernel_row(div, s, t, T, N);
            ASSERT_TRUE(k.lanes_agree);
            if (kind >= 12) {
              ASSERT_TRUE(std::isnan(k.loss)) << k.loss;
              for (float g : k.grad) ASSERT_TRUE(std::isnan(g)) << g;
              continue;
            }
            if (identical) {
              ASSERT_EQ(k.loss, 0.f);
              for (float g : k.grad) ASSERT_EQ(g, 0.f);
              continue;
            }
            // The scaled logits overflow where |x| log2(e) / T > FLT_MAX: a row masked whole is
            // then a side without mass (NaN), where float64 sees a uniform row.
            const bool whole_overflows =
                (kind == 5 ||
                 (V == 1 && (kind == 4 || kind == 6 || (kind == 8 && div != kForwardKl)))) &&
                std::abs(double(lowest) * 1.4426950408889634 / T) >
                    std::numeric_limits<float>::max();
            const RefRow r = reference_row(div, s, t, T);
            if (whole_overflows) {
              if (kind == 6) {  // both sides without mass: a row of 0, loss and gradient
                ASSERT_EQ(k.loss, 0.f);
                for (float g : k.grad) ASSERT_EQ(g, 0.f);
              } else {  // one side without mass: NaN, loss and gradient
                ASSERT_TRUE(std::isnan(k.loss)) << k.loss;
                for (float g : k.grad) ASSERT_TRUE(std::isnan(g)) << g;
              }
              continue;
            }
            if (std::isnan(r.loss)) {  // a side -inf everywhere (kinds 10 and 11 at V = 1)
              ASSERT_TRUE(std::isnan(k.loss)) << k.loss;
              for (float g : k.grad) ASSERT_TRUE(std::isnan(g)) << g;
              continue;
            }
            if (std::isinf(r.loss)) {  // kind 10's KLs; their gradients are not compared
              ASSERT_EQ(k.loss, r.loss);
              continue;
            }
            ASSERT_TRUE(std::isfinite(k.loss)) << k.loss << " reference " << r.loss;
            // Logits near +-500 lose |x2| 2^-24 when scaled (kind 3).
            const double tol = 4e-6 + (kind == 3 ? 1e-4 : 2e-5) * std::abs(r.loss);
            ASSERT_LE(std::abs(k.loss - r.loss), tol) << k.loss << " reference " << r.loss;
            worst_loss = std::max(worst_loss, std::abs(k.loss - r.loss) / tol);
            double gmax = 0;
            for (double g : r.grad) gmax = std::max(gmax, std::abs(g));
            for (int64_t j = 0; j < V; ++j) {
              // Reverse KL's g - c, both ~ the loss, cancels: float's ulp of the loss, over T.
              // (Probabilities below 2^-126 flush to 0: gradients below ~1e-38 / T are 0.)
              const double gtol = 1e-5 * gmax + 2e-4 * std::abs(r.grad[j]) +
                                  (1e-37 + 1e-6 * std::abs(r.loss)) / T + r.sign_slack[j];
              ASSERT_TRUE(std::isfinite(k.grad[j])) << "column " << j;
              ASSERT_LE(std::abs(k.grad[j] - r.grad[j]), gtol)
                  << "column " << j << ": " << k.grad[j] << " reference " << r.grad[j];
              worst_grad = std::max(worst_grad, std::abs(k.grad[j] - r.grad[j]) / gtol);
            }
          }
  RecordProperty("rows", rows);
  std::printf("%d rows; worst error / tolerance: loss %.3f, gradient %.3f\n", rows, worst_loss,
              worst_grad);
}

}  // namespace

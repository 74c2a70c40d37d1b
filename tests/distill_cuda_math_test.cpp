// The CUDA distillation kernels' row math (lib/src/distill_cuda_math.h) on the host, against a
// float64 reference, on any machine: the functions the kernels run per vector and per element
// (add_scaled, add_scaled_kl, combine, combine_kl, kl_row_loss, prob, and distill_common.h's
// divergence_element and divergence_grad), combined as distill_forward_kernel combines them: a
// row's vectors dealt to the block's threads in turn, each thread's sums through the warps'
// butterfly and then across the warps (row_reduce.cuh's block_allreduce), whose every lane must
// end with the same bits. The SFU instructions (ex2.approx.ftz, lg2.approx.ftz) run as host
// emulations with the same flushes; the loops, loads and shuffles of the kernels themselves run
// only on a GPU (distill_test's CUDA cases). Found by reviews that emulated this math by hand
// (session 41): a KL dot that overflowed for masks at the dtype's lowest value on one side.
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

bool same_bits(const kd::MaxSum2& a, const kd::MaxSum2& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
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
    // Pass 2 per thread over the same vectors, then the block's sum (block_sum2).
    std::vector<std::pair<float, float>> lc(threads, {0.f, 0.f});
    for (int th = 0; th < threads; ++th)
      for (int64_t j0 = int64_t(th) * N; j0 < V; j0 += int64_t(threads) * N)
        for (int64_t j = j0; j < std::min(j0 + N, V); ++j) {
          float p, lp, q, lq, term, g;
          kd::prob(s[j], k2, ns_s, p, lp);
          kd::prob(t[j], k2, ns_t, q, lq);
          lossfns::kernels::divergence_element<float, kd::CudaMath>(div, jsd, p, q, lp, lq, term,
                                                                    g);
          lc[th].first += term;
          lc[th].second += p * g;
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
  // the gradient with it by up to p / T (the sign is ill-conditioned, not the kernel wrong).
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
  double pg = 0;
  for (size_t j = 0; j < V; ++j) {
    const double p = std::exp(lp[j]), q = std::exp(lq[j]);
    switch (div) {
      case kTvd:
        r.loss += 0.5 * std::abs(p - q);
        g[j] = 0.5 * ((p > q) - (p < q));
        if (std::abs(p - q) <= 1e-5 * (p + q)) r.sign_slack[j] = p / T;
        break;
      case kForwardKl:
        if (q > 0) r.loss += q * (lq[j] - lp[j]);
        break;
      case kReverseKl:
        if (p > 0) r.loss += p * (g[j] = lp[j] - lq[j]);
        break;
      default: {
        const double m = p + kBeta * (q - p);
        const double lpm = p > 0 ? std::log(p / m) : 0.0, lqm = q > 0 ? std::log(q / m) : 0.0;
        r.loss += kBeta * q * lqm + (1 - kBeta) * p * lpm;
        g[j] = (1 - kBeta) * lpm;
      }
    }
    pg += p * g[j];
  }
  for (size_t j = 0; j < V; ++j) {
    const double p = std::exp(lp[j]);
    r.grad[j] = (div == kForwardKl ? p - std::exp(lq[j]) : p * (g[j] - pg)) / T;
  }
  return r;
}

const char* name(int64_t div) {
  return div == kTvd         ? "tvd"
         : div == kForwardKl ? "forward_kl"
         : div == kReverseKl ? "reverse_kl"
                             : "jsd";
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
          for (int kind = 0; kind < 10; ++kind) {
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
              if (kind != 6) {
                ASSERT_TRUE(std::isnan(k.loss)) << k.loss;
              }
              continue;
            }
            if (std::isnan(r.loss)) {
              ASSERT_TRUE(std::isnan(k.loss)) << k.loss;
              continue;
            }
            ASSERT_TRUE(std::isfinite(k.loss)) << k.loss << " reference " << r.loss;
            const double tol = 2e-5 + 2e-4 * std::abs(r.loss);
            ASSERT_LE(std::abs(k.loss - r.loss), tol) << k.loss << " reference " << r.loss;
            worst_loss = std::max(worst_loss, std::abs(k.loss - r.loss) / tol);
            double gmax = 0;
            for (double g : r.grad) gmax = std::max(gmax, std::abs(g));
            for (int64_t j = 0; j < V; ++j) {
              // Reverse KL's g - c, both ~ the loss, cancels: float's ulp of the loss, over T.
              const double gtol =
                  (1e-6 + 1e-6 * std::abs(r.loss)) / T + 1e-3 * gmax + r.sign_slack[j];
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

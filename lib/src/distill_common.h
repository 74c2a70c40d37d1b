// Framework-free math of the logits-level divergences (lossfns::distill_loss), shared by the CPU
// and CUDA kernels: one place that says what each divergence adds per element and what its
// gradient is. Includes nothing from Torch or CUDA.
//
// Notation (docs/distill.md has the derivations). Per row, with temperature T:
//   a = s / T, b = t / T                      the scaled student and teacher logits
//   lp = a - logsumexp(a), lq = b - logsumexp(b)  log-probabilities (-inf on padding columns)
//   p = exp(lp), q = exp(lq)
//   loss_row = sum_j term_j
//   d loss_row / d a_j = p_j * (g_j - sum_k p_k g_k)  where g_j = d loss_row / d p_j (up to a
//                                                     constant, which the softmax removes)
//   forward KL is the exception: d loss_row / d a_j = p_j - q_j (no row constant needed).
// and d loss / d s_j = (d loss_row / d a_j) / T.
//
// Exactness: every formula below gives exactly 0 for the term and for g when the student's and
// the teacher's element are bit-identical (same p, same lp), so identical rows give loss 0 and
// gradient 0; probabilities that are 0 (padding, underflow) contribute exactly 0 and never NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels_common.h"
#include "lossfns/divergence.h"

namespace lossfns::kernels {

// The divergence in the integer form the internal ops and the kernels take: the codes of the
// public lossfns::Divergence (lossfns/divergence.h, which also holds their names).
enum Divergence : int64_t {
  kTvd = static_cast<int64_t>(lossfns::Divergence::kTvd),
  kForwardKl = static_cast<int64_t>(lossfns::Divergence::kForwardKl),
  kReverseKl = static_cast<int64_t>(lossfns::Divergence::kReverseKl),
  kJsd = static_cast<int64_t>(lossfns::Divergence::kJsd),
};

// Calls f(std::integral_constant<int64_t, d>{}) for the divergence code d and returns what f
// returns: the CPU row kernels and the CUDA kernels are specialised on the divergence (on CUDA a
// runtime test per element cost ~15 instructions, docs/benchmarks.md). The ops check the code
// before any kernel runs; anything else is taken as JSD.
template <typename F>
decltype(auto) with_divergence(int64_t divergence, F&& f) {
  switch (divergence) {
    case kTvd:
      return f(std::integral_constant<int64_t, kTvd>{});
    case kForwardKl:
      return f(std::integral_constant<int64_t, kForwardKl>{});
    case kReverseKl:
      return f(std::integral_constant<int64_t, kReverseKl>{});
    default:
      return f(std::integral_constant<int64_t, kJsd>{});
  }
}

// Whether the gradient needs the row constant sum_k p_k g_k (saved by the forward).
LOSSFNS_HOST_DEVICE bool needs_row_constant(int64_t divergence) { return divergence != kForwardKl; }

// The row constant as the forward saves it: sum_k p_k g_k, but NaN where the row's loss is NaN (a
// NaN or +inf logit in either row). Alone it could stay finite there: TVD's g is sign(p - q),
// which is 0 where q is NaN, and JSD's logs of ratios are clamped to their bounds, so a NaN
// teacher row gave TVD a zero gradient and JSD a finite one under a NaN loss. A NaN constant
// makes the row's every gradient NaN, as its loss ("NaN in, NaN out", docs/distill.md); per row,
// nothing per element. Where the divergence needs no constant (forward KL): 0, or NaN where the
// loss is NaN (its gradient p - q adds it, so that it is NaN at every column too, also at a -inf
// column, where p - q alone is 0).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc saved_row_constant(int64_t divergence, Acc loss, Acc c) {
  if (loss != loss) return loss;
  return needs_row_constant(divergence) ? c : Acc(0);
}

// The row's loss as the forward stores it: a divergence is never negative, but its float sum can
// round below 0 near a tie (the KLs by ~1e-6 at logits 1e-4 apart, JSD by ~1e-8 at beta within
// 1e-8 of 1), and a training log should not show a negative divergence. Such a row gets 0, which
// is nearer the exact value than the rounded sum; NaN and +inf stay. The row constant and the
// gradient keep the unclamped sums (reverse KL's row constant is its loss).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc stored_row_loss(Acc loss) {
  return loss < Acc(0) ? Acc(0) : loss;
}

// Per-row state between forward and backward: kStatsPerRow floats per row.
//   [0] max_j a_j, [1] log sum_j exp(a_j - max): logsumexp(a) kept in two parts, so that
//       lp = (a - max) - log_sum is exact near the max whatever the logits' magnitude (one
//       rounded max + log_sum would shift every lp by its rounding error, |logit| * eps: at
//       logits of +-300 that costs the KL gradients ~50x the composite's error)
//   [2] max_j b_j, [3] log sum_j exp(b_j - max)
//   (natural log on the CPU; on CUDA, of log2(e)-scaled logits, in log2)
//   [4] the row constant sum_k p_k g_k (0 where not needed; NaN where the loss is NaN, as in
//       a row with mass on one side only: saved_row_constant)
//   [5] the row's loss, stored_row_loss (0 for ignored rows)
//   The normalisers [0..3] are the rows' own also where the loss is NaN (the fused cross-entropy
//   takes [0..1] as the student's: fused_linear_driver.cpp).
constexpr int64_t kStatsPerRow = 6;
constexpr int64_t kStatLoss = 5;

// JSD's constants, computed once per call (beta in (0, 1); 0 and 1 are the KLs, dispatched
// before any kernel runs). The bounds are capped at Acc's largest value: 1 / beta overflows
// float below beta ~ 3e-39 (where a float beta may even round to 0), and an infinite bound
// turned 0 * log(bound) into NaN; Acc's own ratios cannot exceed the cap anyway.
template <typename Acc>
struct JsdConstants {
  Acc beta, one_minus_beta;
  Acc max_p_over_m, log_max_p_over_m;  // 1 / (1 - beta) and its log: p/m never exceeds it
  Acc max_q_over_m, log_max_q_over_m;  // 1 / beta and its log (m >= beta q)
  LOSSFNS_HOST_DEVICE explicit JsdConstants(double b = 0.5)
      : beta(Acc(b)),
        one_minus_beta(Acc(1.0 - b)),
        max_p_over_m(Capped(1.0 / (1.0 - b))),
        log_max_p_over_m(Capped(-log1p(-b), log(double(std::numeric_limits<Acc>::max())))),
        max_q_over_m(Capped(1.0 / b)),
        log_max_q_over_m(Capped(-log(b), log(double(std::numeric_limits<Acc>::max())))) {}

 private:
  static LOSSFNS_HOST_DEVICE Acc Capped(double x,
                                        double cap = double(std::numeric_limits<Acc>::max())) {
    return Acc(x < cap ? x : cap);
  }
};

// One element's contribution to the row loss (term) and g (d loss_row / d p_j, up to a row
// constant). Math supplies log_m(m), what its log_ratio takes of m (log m on CUDA, computed once
// for both of JSD's ratios; unused on the CPU), and log_ratio(x, log_x, m, log_m, bound,
// log_bound) = log(x / m) for x > 0, m >= 0 (log_x: log x, and log_m, which it may use), at most
// log_bound, and exactly 0 when x == m; p, q >= 0; lp, lq may be -inf where p, q are 0.
//   tvd:        term = 0.5 |p - q|,            g = 0.5 sign(p - q), sign(0) = 0
//   forward_kl: term = q (lq - lp)  (0 if q = 0; NaN if q is NaN), g unused
//   reverse_kl: term = p (lp - lq)  (0 if p = 0), g = lp - lq (0 if p = 0)
//   jsd:        m = p + beta (q - p)  (exactly p when q == p),
//               term = beta q log(q/m) + (1 - beta) p log(p/m)  (each 0 where its weight is 0),
//               g = (1 - beta) log(p/m)
// The logs of the ratios are clamped to their mathematical bounds (p/m <= 1/(1 - beta), q/m <=
// 1/beta), so that rounding in m never turns a tiny probability into an infinite log.
template <typename Acc, typename Math>
LOSSFNS_HOST_DEVICE void divergence_element(int64_t divergence, const JsdConstants<Acc>& jsd, Acc p,
                                            Acc q, Acc lp, Acc lq, Acc& term, Acc& g) {
  if (divergence == kTvd) {
    const Acc d = p - q;
    term = Acc(0.5) * (d < Acc(0) ? -d : d);
    g = Acc(0.5) * (static_cast<Acc>(d > Acc(0)) - static_cast<Acc>(d < Acc(0)));
  } else if (divergence == kForwardKl) {
    term = q != Acc(0) ? q * (lq - lp) : Acc(0);  // a NaN q gives NaN (q > 0 would drop it)
    g = Acc(0);
  } else if (divergence == kReverseKl) {
    const Acc r = p > Acc(0) ? lp - lq : Acc(0);
    term = p * r;
    g = r;
  } else {
    const Acc m = p + jsd.beta * (q - p);
    const Acc lm = Math::log_m(m);
    const Acc lpm =
        p > Acc(0) ? Math::log_ratio(p, lp, m, lm, jsd.max_p_over_m, jsd.log_max_p_over_m) : Acc(0);
    const Acc lqm =
        q > Acc(0) ? Math::log_ratio(q, lq, m, lm, jsd.max_q_over_m, jsd.log_max_q_over_m) : Acc(0);
    term = jsd.beta * q * lqm + jsd.one_minus_beta * p * lpm;
    g = jsd.one_minus_beta * lpm;
  }
}

// d loss_row / d a_j for one element, from p, q, g and the row constant c = sum_k p_k g_k (forward
// KL's c is 0, or NaN in a NaN row: adding it changes no bit of p - q, which is never -0).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc divergence_grad(int64_t divergence, Acc p, Acc q, Acc g, Acc c) {
  return divergence == kForwardKl ? (p - q) + c : p * (g - c);
}

// Scale that turns the summed row losses into the reduced loss; 0 when no row counts (an
// all-ignored batch gives loss 0 and gradient 0). 'mean' divides by rows * V as torch's kl_div
// does (V: the vocabulary's columns, padding excluded); 'none' keeps per-row losses (scale 1).
template <typename Acc>
LOSSFNS_HOST_DEVICE Acc distill_reduction_scale(Reduction reduction, int64_t n_valid_rows,
                                                int64_t V) {
  if (reduction == kNone) return Acc(1);
  return reduction_scale<Acc>(reduction, n_valid_rows, V);
}

}  // namespace lossfns::kernels

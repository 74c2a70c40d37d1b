// The row math of lossfns::distill_loss's CUDA kernels (distill_cuda_kernel.cuh): the online
// normalisers (MaxSum, add_scaled, combine), the KLs' one-pass loss (add_scaled_kl, combine_kl,
// kl_row_loss), the per-element probabilities (prob) and the SFU instructions they run on
// (exp2_ftz, lg2_ftz). Host-compilable: under nvcc's device pass the hardware instructions,
// elsewhere their host emulations (the same flush of subnormal inputs and results to 0; exp2 and
// log2 correctly rounded where the hardware's are within 2 ulp), so that
// tests/distill_cuda_math_test.cpp runs these functions against a float64 reference on any
// machine, the way the kernels combine them (thread slices, the warps' butterfly). The kernels
// themselves run only on a GPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "distill_common.h"
#include "kernels_common.h"

// The device pass unrolls the per-vector loops; the host passes (nvcc's and a plain compiler's)
// get no pragma they would warn about.
#if defined(__CUDA_ARCH__)
#define LOSSFNS_UNROLL _Pragma("unroll")
#else
#define LOSSFNS_UNROLL
#endif

namespace lossfns::kernels::distill_detail {

// A product and a sum rounded on their own, never fused into an FMA with the operation after
// them (__fmul_rn, __fadd_rn on the device; the host's through a volatile).
LOSSFNS_HOST_DEVICE float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}
LOSSFNS_HOST_DEVICE float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// log2 x in one SFU instruction (lg2.approx.ftz): __log2f's value for normal x, -inf for 0 and
// for subnormal x (flushed), where __log2f scales a subnormal first (four instructions more per
// call). JSD's log of m: an m below 2^-126 belongs to probabilities that weigh nothing, and its
// log ratio is clamped to its bound (CudaMath).
LOSSFNS_HOST_DEVICE float lg2_ftz(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::log2(std::fpclassify(x) == FP_SUBNORMAL ? 0.f : x);
#endif
}

// log(x / m) = log x - log m from the log of x the caller has (prob()'s lp: exact where
// log2(x) of the probability would be the SFU's approximation of its own exp2) and one hardware
// log2 of m (log_m, once per element for both of JSD's ratios); exactly 0 where m is x bit for
// bit (a tie: q == p makes m == p == q), clamped to its bound (also where m flushed to 0 made
// log m -inf). One SFU instruction where log2(x) - log2(m) took two: JSD's per-element logs
// were a third of the SFU work of its forward and backward (session 16).
struct CudaMath {
  static LOSSFNS_HOST_DEVICE float log_m(float m) { return mul_rn(lg2_ftz(m), kLn2); }
  static LOSSFNS_HOST_DEVICE float log_ratio(float x, float log_x, float m, float log_m,
                                             float /*bound*/, float log_bound) {
    return x == m ? 0.f : fminf(log_x - log_m, log_bound);
  }
};

// A logit scaled to log2 units, rounded once and never fused into a later subtraction: every
// pass must see the same x2 as the max was taken over (an FMA of x * k2 - max keeps the
// product's rounding error, |x2| * 2^-24, and at |x2| ~ 1e4 that error shifts p by 5e-4).
LOSSFNS_HOST_DEVICE float scaled(float x, float k2) { return mul_rn(x, k2); }

// The exponent of a logit x (unscaled) against a max m of scaled logits: scaled(x) - m, so that
// the max's own exponent is exactly 0 and its weight exactly 1 whatever its magnitude. (One FMA,
// x * k2 - m, saves an instruction per element but leaves the max the product's rounding error
// as its exponent, up to half an ulp of m: at |m| ~ 1e38, a bfloat16 or float32 mask value such
// as finfo.min at T = 2, that is ~1e30, whose exp2 is +inf or 0, and the row's loss NaN. Tried in
// session 40 and withdrawn, docs/benchmarks.md.)
LOSSFNS_HOST_DEVICE float exponent(float x, float k2, float m) { return scaled(x, k2) - m; }

// 2^x in one SFU instruction (ex2.approx.ftz): the value exp2f gives wherever the result is at
// least 2^-126 (exp2f runs the same instruction there), 0 below it where exp2f returns a
// subnormal (and costs four instructions more to do so), 0 for -inf, NaN for NaN. For the
// per-element exponentials: a sum of them that includes the row's maximum (1) is unchanged by
// the flush, and a probability below 2^-126 weighs nothing in a loss or a gradient.
LOSSFNS_HOST_DEVICE float exp2_ftz(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  const float y = std::exp2(std::fpclassify(x) == FP_SUBNORMAL ? 0.f : x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
#endif
}

// A running softmax normaliser of log2-scaled logits: max and sum_j exp2(x_j - max) (an online
// softmax: one pass over a row where a max pass and a sum pass took two). The cross-entropy
// kernels use it too.
struct MaxSum {
  float max, sum;
};

// Two normalisers as one. A side whose max is the result's keeps its sum as is, so that -inf
// maxima (no mass yet) never meet -inf - -inf; a NaN sum stays NaN. Commutative bit for bit, so
// every lane of a butterfly gets the same result; {-inf, 0} is its identity.
LOSSFNS_HOST_DEVICE MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  return {m, (a.max == m ? a.sum : mul_rn(a.sum, exp2f(a.max - m))) +
                 (b.max == m ? b.sum : mul_rn(b.sum, exp2f(b.max - m)))};
}

// N logits x (before the scaling) added to a normaliser of log2-scaled logits (k2: log2(e) / T):
// one rescale per vector, one exp2 per element of its exponent() (exp2_ftz: the sum includes the
// max's 1, so the flush leaves it the same bits). -inf elements add exactly 0 (also while the max
// is -inf); a NaN element makes the sum NaN (fmaxf drops NaN from the max, exp2 of NaN keeps it
// in the sum); +inf makes it NaN too.
template <int N>
LOSSFNS_HOST_DEVICE MaxSum add_scaled(MaxSum ms, const float (&x)[N], float k2) {
  float vmax = -INFINITY;
  LOSSFNS_UNROLL
  for (int k = 0; k < N; ++k) vmax = fmaxf(vmax, x[k]);
  const float m = fmaxf(ms.max, scaled(vmax, k2));
  float s = ms.max == m ? ms.sum : mul_rn(ms.sum, exp2f(ms.max - m));
  // While the max is -inf every element is -inf or NaN: subtracting 0 keeps -inf at -inf (adds
  // 0) where -inf - -inf would be NaN.
  const float mm = m == -INFINITY ? 0.f : m;
  // The vector's terms first, then their sum into the running one: a thread's running sum takes
  // one add per vector, not one per element (at V = 151936 a thread adds ~1200 columns; summed
  // one by one, rows of many equal probabilities lost ~3e-5 of the loss in float32).
  float v = 0.f;
  LOSSFNS_UNROLL
  for (int k = 0; k < N; ++k) v += exp2_ftz(exponent(x[k], k2, mm));
  return {m, s + v};
}

// The forward's first pass: the weighting side's normaliser (the teacher for forward KL and for
// TVD and JSD, the student for reverse KL) and the other side's; for the KLs also their loss,
// online (add_scaled_kl). TVD and JSD leave dot 0 and imax -inf (computing the dot cost TVD
// ~12% of its forward).
struct MaxSumDot {
  float max, sum, dot, imax;
};
struct MaxSum2 {
  MaxSumDot w;
  MaxSum o;
};

// The KLs' loss in the first pass. With x the weighting side's logits and o the other's (both
// unscaled; x2 = scaled(x, k2)), e_j = x2_j - max_w and f_j = o2_j - max_o their exponents
// against the two running maxima and w_j = exp2(e_j), dot = sum_j w_j (e_j - f_j), so that
// KL(w || o) = sum_j (w_j / sum_w) (lw_j - lo_j) = ln 2 (dot / sum_w + ls_o - ls_w). Each term
// is relative to its own side's maximum: e_j >= -126 wherever w_j > 0, so a weighted term is as
// large as the other side's spread, never the size of a mask value on the weighting side. (Up to
// session 40 the dot summed w_j (x2_j - o2_j) on the absolute scaled logits: a mask at the
// dtype's lowest value on the weighting side alone, -2.4e38 once scaled at T = 2, added -2.4e38
// per column while it led a thread's maximum, -inf after two, then NaN (-inf * 0) when a real
// column rescaled it; a row masked whole gave -inf. Found by review in session 41.)
// When the maxima move, the dot moves with them (rescaled_dot):
//   dot' = r (dot + ((max_w - max_w') + (max_o' - max_o)) sum_w),  r = exp2(max_w - max_w').
// Identical rows have identical maxima at every step, so the two differences cancel exactly and
// the dot stays exactly 0 (ties: loss exactly 0). Columns where either side is -inf once scaled
// stay out of the dot (their term is 0 or +inf, never a finite part of the sum); `imax` is the
// largest x_j (unscaled) where o2_j is -inf, from which the caller decides +inf exactly as the
// two-pass definition does (w_j > 0 where o_j = 0: the largest such weight after normalisation,
// not underflowed). Those columns' weights are in sum_w but not in the dot, so a shift moves the
// dot by their weight times the shift too. The loss is finite only where each such weight
// normalises below 2^-126, and the shifts of max_w are at most ~150 before r flushes to 0, so
// that error is negligible, except after a shift of max_o that is itself huge: a lowest-value
// mask that led the other side's running maximum, on a row that also has a -inf column under
// the weighting side's underflowing mass (there the float64 reference is +inf; review, session
// 41). The sums are add_scaled's, bit for bit (each rescale's product
// rounded on its own, never fused into the add after it), so that identical rows still give
// identical normalisers, and the saved statistics are the other divergences' too.
// r: exp2(w.max - mw), the sums' rescale factor.
LOSSFNS_HOST_DEVICE float rescaled_dot(const MaxSumDot& w, float o_max, float mw, float mo,
                                       float r) {
  // Each product and sum rounded on its own: combine_kl adds two of these, and a product fused
  // into that add would round differently on the lanes of a butterfly that see a and b swapped.
  const float shift = add_rn(w.max == mw ? 0.f : w.max - mw, o_max == mo ? 0.f : mo - o_max);
  // r 0: the old terms weigh nothing against the new maximum (also where w had no mass yet);
  // o_max -inf: o had no mass yet, every column so far is out of the dot (and mo - o_max inf).
  return r == 0.f || o_max == -INFINITY ? 0.f : mul_rn(r, add_rn(w.dot, mul_rn(shift, w.sum)));
}

// Commutative bit for bit as MaxSum's combine (every lane of a butterfly gets the same result).
LOSSFNS_HOST_DEVICE MaxSum2 combine_kl(const MaxSum2& a, const MaxSum2& b) {
  const float mw = fmaxf(a.w.max, b.w.max);
  const float ra = a.w.max == mw ? 1.f : exp2f(a.w.max - mw),
              rb = b.w.max == mw ? 1.f : exp2f(b.w.max - mw);
  const MaxSum o = combine(a.o, b.o);
  return {{mw,
           (a.w.max == mw ? a.w.sum : mul_rn(a.w.sum, ra)) +
               (b.w.max == mw ? b.w.sum : mul_rn(b.w.sum, rb)),
           rescaled_dot(a.w, a.o.max, mw, o.max, ra) + rescaled_dot(b.w, b.o.max, mw, o.max, rb),
           fmaxf(a.w.imax, b.w.imax)},
          o};
}

// N columns of the weighting side x and of the other side o added to both normalisers and the
// dot.
template <int N>
LOSSFNS_HOST_DEVICE MaxSum2 add_scaled_kl(const MaxSum2& ms, const float (&x)[N],
                                          const float (&o)[N], float k2) {
  float xmax = -INFINITY, omax = -INFINITY;
  LOSSFNS_UNROLL
  for (int k = 0; k < N; ++k) {
    xmax = fmaxf(xmax, x[k]);
    omax = fmaxf(omax, o[k]);
  }
  const float mw = fmaxf(ms.w.max, scaled(xmax, k2)), mo = fmaxf(ms.o.max, scaled(omax, k2));
  const float r = ms.w.max == mw ? 1.f : exp2f(ms.w.max - mw);
  float sw = ms.w.max == mw ? ms.w.sum : mul_rn(ms.w.sum, r);
  float so = ms.o.max == mo ? ms.o.sum : mul_rn(ms.o.sum, exp2f(ms.o.max - mo));
  // The maxima move rarely after a row's first vectors: the dot's rescale only where one did
  // (with both unmoved it would give the dot as it is, bar a sum already NaN or inf).
  float d = ms.w.max == mw && ms.o.max == mo ? ms.w.dot : rescaled_dot(ms.w, ms.o.max, mw, mo, r);
  float im = ms.w.imax;
  // As add_scaled's: while a side's max is -inf, its elements are -inf or NaN.
  const float mmw = mw == -INFINITY ? 0.f : mw, mmo = mo == -INFINITY ? 0.f : mo;
  // Each sum of the vector's terms first, then into the running ones (as add_scaled's, bit for
  // bit).
  float vw = 0.f, vo = 0.f, vd = 0.f;
  LOSSFNS_UNROLL
  for (int k = 0; k < N; ++k) {
    // -inf after the scaling: a finite logit below -FLT_MAX / k2 (T < log2(e)) overflows to it
    // and is a column without mass, as a -inf logit.
    const float x2 = scaled(x[k], k2), o2 = scaled(o[k], k2);
    const bool other_none = o2 == -INFINITY;
    const float e = x2 - mmw, f = o2 - mmo;  // exponent()'s values
    const float w = exp2_ftz(e);
    vw += w;
    vo += exp2_ftz(f);
    // w 0 (x2 -inf, or e below -126, or e -inf: a finite x2 far below a maximum near +FLT_MAX):
    // no term, where 0 * (e - f) could be NaN.
    vd += w == 0.f || other_none ? 0.f : w * (e - f);
    im = fmaxf(im, other_none ? x[k] : -INFINITY);
  }
  return {{mw, sw + vw, d + vd, im}, {mo, so + vo}};
}

// A row's normaliser as prob() takes it: its max and log2 of the sum of exp2(x2 - max), except
// for a row without mass (max -inf: every logit -inf, or NaN), which becomes {0, 0} so that its
// -inf logits give p 0 and lp -inf with no test per element (-inf - -inf would be NaN).
struct ProbNorm {
  float mx, ls;
};
LOSSFNS_HOST_DEVICE ProbNorm prob_norm(float mx, float ls) {
  return mx == -INFINITY ? ProbNorm{0.f, 0.f} : ProbNorm{mx, ls};
}

// p and its natural log from a logit x (before the scaling by k2) and its row's normaliser: 0 and
// -inf for x = -inf; p 0 (lp finite) where it is below 2^-126 (exp2_ftz); NaN for NaN. The
// exponent as pass 1's sums took it (exponent()). lp is rounded on
// its own (__fmul_rn): a product fused into a later lp - lq would leave bit-identical logits a
// nonzero difference (reverse KL's gradient at a tie, caught by distill_test once the divergence
// became a template parameter and the compiler could see through the call).
LOSSFNS_HOST_DEVICE void prob(float x, float k2, ProbNorm n, float& p, float& lp) {
  const float l2 = exponent(x, k2, n.mx) - n.ls;
  p = exp2_ftz(l2);
  lp = mul_rn(l2, kLn2);
}

// The KLs' row loss from pass 1's sums (add_scaled_kl), w the weighting side (mx_w, ls_w: its max
// and log2 of its sum; ls_o the other side's): NaN where either row holds NaN (a NaN logit makes
// its sum NaN, also in a row of NaN alone, whose max is -inf), as the two-pass definition gives;
// else 0 where w has no mass; +inf where w has mass where o has none (prob()'s w_j > 0 for the
// largest such column); else ln 2 (dot / sum_w + ls_o - ls_w). (The caller makes a row NaN
// where one side alone has no mass.)
LOSSFNS_HOST_DEVICE float kl_row_loss(const MaxSum2& ms, float k2, float mx_w, float ls_w,
                                      float ls_o) {
  const auto is_nan = [](float v) { return v != v; };
  const bool nan = is_nan(ms.w.sum) || is_nan(ms.o.sum) || is_nan(ms.w.dot);
  const bool inf = ms.w.imax != -INFINITY && exp2_ftz(exponent(ms.w.imax, k2, mx_w) - ls_w) > 0.f;
  return nan                 ? NAN
         : mx_w == -INFINITY ? 0.f
         : inf               ? INFINITY
                             : kLn2 * (ms.w.dot / ms.w.sum + (ls_o - ls_w));
}

}  // namespace lossfns::kernels::distill_detail

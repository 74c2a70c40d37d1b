// Framework-free CUDA kernels of lossfns::distill_loss. Raw pointers, sizes and a cudaStream_t;
// every launcher returns the cudaError_t of its launches. Includes nothing from Torch; the adapter
// (distill_cuda.cu) checks inputs, maps dtypes and takes the current stream.
//
// Data movement (the op is memory-bound at real vocabularies):
//  - forward: one block per row; the passes a row needs (the maxima and the sums of exp together,
//    online, with the KLs' loss; TVD's and JSD's divergence and row constant, which need the
//    normalised p and q; the KLs' gradient when it is computed in forward: TVD and JSD run the
//    backward's kernel after the forward instead, forward_kernel_writes_grad)
//    each read the row from global memory, the L2 cache serving part of the re-reads (TVD's and
//    JSD's second pass runs backwards, from the columns read last: for_each_vec). (Cluster
//    variants measured on the H200 and not kept: rows staged in the shared memory of a
//    thread-block cluster, and rows split over a cluster's blocks to keep fewer rows in flight,
//    both slower, sessions 11 and 21; for the forward that writes the gradient, rows held in a
//    cluster's shared memory by pipelined bulk copies, at best 1.01-1.10x as fast as this one,
//    session 32, bench/distill_row_on_chip.cu; row slices taken from one global work queue in an
//    order that keeps a slice's second read in the L2, 0.76-0.94x, session 47,
//    bench/distill_row_queue.cu. docs/benchmarks.md has the numbers.)
//  - backward: reads the logits once more and writes the gradient once, unless the forward
//    computed the gradient (the caller gave the grad_output in advance as grad_scale).
// Per element the math is distill_common.h's, in float, with exp2 of log2-scaled logits.
//
// Instruction issue, not memory, bounded these kernels on the H200 (Nsight Compute, session 15:
// 85-91% of the issue slots busy, DRAM at 35-56% of its peak), so the per-element code is kept
// short: the divergence is a template parameter (one kernel per divergence; a runtime switch
// cost ~15 instructions per element), the per-element exponentials are one SFU instruction
// (exp2_ftz), -inf logits need no per-element test (prob_norm), bfloat16 is unpacked from
// 32-bit words (unpack), and JSD takes one log of m per element without a branch (lg2_ftz,
// CudaMath::log_m). The row math (normalisers, the KLs' one-pass loss, prob, the SFU
// instructions) is in distill_cuda_math.h, which the host tests run too. Session 40 counted the
// SASS (cuobjdump, per element pair, bf16) and timed a variant with an FMA exponent besides
// (withdrawn: exponent()) on an H100: JSD's forward + backward 10% faster, TVD and the KLs within
// 1% (their passes already move bytes at the copy bandwidth: the forward's 2 or 4 streams, the
// backward's 3); this code was not timed; docs/benchmarks.md.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "distill_common.h"
#include "distill_cuda_math.h"
#include "row_reduce.cuh"

namespace lossfns::kernels {

template <typename T>
struct DistillArgs {
  const T* s;                  // (rows, ws), unit stride inside a row
  const T* t;                  // (rows, wt), unit stride inside a row
  int64_t s_stride, t_stride;  // row strides, elements
  int64_t ws, wt;              // widths (columns past a width are -inf in that distribution)
  int64_t V;                   // columns that count (past V: padding, -inf in both, gradient 0)
  int64_t rows;
  const int64_t* labels;  // (rows,) or nullptr
  int64_t ignore_index;
  int64_t divergence;  // Divergence code; JSD's beta in (0, 1)
  float beta;
  float inv_t;  // 1 / temperature
  Reduction reduction;
  float* stats;  // (rows, kStatsPerRow), distill_common.h's layout (log2 units)
  float* scale;  // 1 value: the reduction's scale (written by the finalize, or by the
                 // count before a KL's forward kernel that computes the gradient)
  float* loss;   // 1 value (reduced) or (rows,) ('none'): written by the finalize
  // The gradient (rows, ws) contiguous, written by a forward that computes it (else nullptr), for
  // a grad_output of *grad_scale, or of 1 where *grad_scale is 0 (hinted_scale); only for a
  // reduced loss ('none' is refused).
  T* grad;
  const float* grad_scale;
  // The backward's grad_output, 1 value (reduced) or (rows,) ('none'); distill_forward sets it to
  // grad_scale for the backward's kernel it runs (TVD, JSD), with from_grad_scale set.
  const float* grad_output;
  bool from_grad_scale;  // grad_output is a forward's grad_scale: 0 is read as 1 (hinted_scale)
  // Backward only, optional: a hard-label cross-entropy's gradient added in the same pass,
  // ce_weight[r] * (softmax(s)_j - [j == labels[r]]) over the student's columns [0, min(ws, V)),
  // from the statistics of s at temperature 1 (max and log2 of the sum, log2 units) at
  // ce_stats[r * ce_stats_stride + {0, 1}]. ce_weight nullptr: no cross-entropy. A row whose
  // weight is 0 gets no cross-entropy term (its label may be anything).
  const float* ce_weight;
  const float* ce_stats;
  int64_t ce_stats_stride;
  int num_sms;
};

namespace distill_detail {

template <typename T>
__device__ __forceinline__ T neg_inf() {
  return from_float<T>(-INFINITY);
}

// 16 bytes of T.
template <typename T>
struct Vec {
  static constexpr int N = 16 / int(sizeof(T));
  union {
    uint4 raw;
    T v[N];
  };
};

// A vector's N elements as floats. bfloat16 from the 32-bit words, a shift or a mask per element
// (exact, as __bfloat162float): element by element the compiler took two shifts for every other
// one.
template <typename T>
__device__ __forceinline__ void unpack(const Vec<T>& v, float (&out)[Vec<T>::N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w[4] = {v.raw.x, v.raw.y, v.raw.z, v.raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < Vec<T>::N; ++k) out[k] = to_float(v.v[k]);
  }
}

// Loads elements [j, j + N) of a row of width w (-inf past it, and past V): one 16-byte load when
// `vec` (the row is 16-byte aligned) and the vector lies inside, element by element otherwise.
template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* row, int64_t j, int64_t n, bool vec) {
  constexpr int N = Vec<T>::N;
  Vec<T> out;
  if (vec && j + N <= n) {
    out.raw = __ldg(reinterpret_cast<const uint4*>(row + j));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = j + k < n ? row[j + k] : neg_inf<T>();
  }
  return out;
}

// kU vectors of a row at j0, j0 + step, ...: all in flight at once. 16-byte loads when the row is
// aligned (vx) and every vector lies inside [0, n); else element by element, -inf past n. kLast:
// the kernel's last read of these bytes, loaded evict-first (ld.global.cs) so that they leave the
// L2 before the lines other rows will read again.
template <bool kLast = false, typename T, int kU>
__device__ __forceinline__ void load_vecs(const T* x, int64_t j0, int64_t step, int64_t n, bool vx,
                                          Vec<T> (&v)[kU]) {
  if (vx && j0 + (kU - 1) * step + Vec<T>::N <= n) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint4* p = reinterpret_cast<const uint4*>(x + j0 + u * step);
      v[u].raw = kLast ? __ldcs(p) : __ldg(p);
    }
  } else {
#pragma unroll
    for (int u = 0; u < kU; ++u) v[u] = load_vec(x, j0 + u * step, n, vx);
  }
}

// Block-wide sum of two floats, broadcast to every thread. `shared`: 2 * 32 floats. Safe to call
// back to back.
__device__ __forceinline__ float2 block_sum2(float2 v, float* shared) {
  auto op = [](float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); };
  return block_allreduce(v, op, make_float2(0.f, 0.f), shared);
}

// Gradient 0 for the columns of the vector at j that lie at or past n_any (padding, -inf on both
// sides), whatever the formula gave there: 0 in a finite row, but NaN in a row that holds a NaN
// or +inf logit (its normaliser is NaN). The forward that writes the gradient and the backward
// both pass their vectors through it, so they agree on the padding bit for bit. One test per
// vector.
template <typename T>
__device__ __forceinline__ void zero_padding(Vec<T>& out, int64_t j, int64_t n_any) {
  if (j + Vec<T>::N > n_any) {
#pragma unroll
    for (int k = 0; k < Vec<T>::N; ++k)
      if (j + k >= n_any) out.v[k] = from_float<T>(0.f);
  }
}

// The element loop every pass shares: f(j, s_j, t_j) over the row's columns [0, n), N at a time
// (s, t: the row; columns at or past ns / nt are -inf). A thread takes the vectors at j, j + step,
// ... in that order (kReverse: the same groups, last first), kU of each row in flight
// (load_vecs; kLast: the kernel's last read of the row).
//
// TVD's and JSD's second forward pass runs backwards: it starts where the first ended, on the
// columns read most recently, which are the ones still in the L2 (with ~1000 rows in flight at
// V = 151936 almost nothing else of a row is); without the gradient it loads them evict-first
// (the forward's last read; a backward reads the row again later, as a separate kernel). Measured
// on the H200 (bf16, session 23, bench/distill_ab.py, two interleaved rounds): forward + backward
// of tvd and jsd 1-2% faster at 8192 x 151936, 1-6% at 8192 x 49152, 5-9% at 4096 x 32000
// (docs/benchmarks.md).
template <bool kReverse, bool kLast, typename T, typename F>
__device__ __forceinline__ void for_each_vec(const T* s, const T* t, int64_t ns, int64_t nt,
                                             bool vs, bool vt, int64_t n, F&& f) {
  constexpr int N = Vec<T>::N, kU = 2;
  const int64_t step = int64_t(blockDim.x) * N, first = int64_t(threadIdx.x) * N;
  const auto group = [&](int64_t j0) {
    Vec<T> xs[kU], ys[kU];
    load_vecs<kLast>(s, j0, step, ns, vs, xs);
    load_vecs<kLast>(t, j0, step, nt, vt, ys);
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (j0 + u * step < n) f(j0 + u * step, xs[u], ys[u]);
  };
  if constexpr (kReverse) {
    // int: a row has fewer than 2^31 groups of kU * step (>= 16) columns.
    const int groups = first < n ? int((n - first + kU * step - 1) / (kU * step)) : 0;
    int64_t j0 = first + int64_t(groups - 1) * (kU * step);
    for (int g = groups; g > 0; --g, j0 -= kU * step) group(j0);
  } else {
    for (int64_t j0 = first; j0 < n; j0 += kU * step) group(j0);
  }
}

// The scale a forward computes the gradient for from its grad_scale: the promised grad_output,
// or 1 for a promise of 0. A gradient computed for 0 would be all zeros, from which no other
// grad_output could be made; the autograd layer keeps the scale the gradient is for and makes it
// right for the grad_output backward brings (distill_op.cpp). Read on the device, so that no
// host-side op runs between the caller and the forward's kernel.
__device__ __forceinline__ float hinted_scale(float grad_scale) {
  return grad_scale == 0.f ? 1.f : grad_scale;
}

// Whether a forward that computes the gradient (grad_scale) writes it from the forward kernel.
// The KLs do (their first pass has the loss; a second pass writes the gradient). TVD and JSD
// would read the row three times in that kernel (normalisers; loss and row constant; gradient),
// which was 4-7% slower than the forward without the gradient followed by the backward's kernel
// (H200, bf16, session 31: 8192 x 151936 tvd 4.66 against 4.43 ms, jsd 6.27 against 5.87;
// 8192 x 128256 3.96 against 3.81, 5.33 against 5.00): for them the forward runs those two
// kernels, the backward's with grad_scale as its grad_output. That is the gradient of the
// kernel it replaces bit for bit (both scale a row by (grad_scale * scale) / T), and the one a
// backward without the hint computes.
constexpr bool forward_kernel_writes_grad(int64_t divergence) {
  return divergence == kForwardKl || divergence == kReverseKl;
}

// Forward of one row per block, over its columns [0, max(ns, nt)); with kGrad, the gradient too.
// kDiv: the divergence (a.divergence, dispatched by the launcher). (Launched with up to 128
// threads, distill_forward_threads; the bound of 1024 keeps it within 64 registers, so that 8
// blocks of 128 threads fit an SM.)
template <typename T, bool kGrad, int64_t kDiv>
__global__ void __launch_bounds__(1024) distill_forward_kernel(DistillArgs<T> a) {
  constexpr int N = Vec<T>::N;
  __shared__ float red[block_reduce_words<MaxSum2>()];
  const int64_t row = blockIdx.x;
  const int64_t ns = a.ws < a.V ? a.ws : a.V, nt = a.wt < a.V ? a.wt : a.V;
  const int64_t n_any = ns > nt ? ns : nt;
  const T* s = a.s + row * a.s_stride;
  const T* t = a.t + row * a.t_stride;
  T* grad = kGrad ? a.grad + row * a.ws : nullptr;
  if (a.labels != nullptr && a.labels[row] == a.ignore_index) {
    if (threadIdx.x < kStatsPerRow) a.stats[row * kStatsPerRow + threadIdx.x] = 0.f;
    if constexpr (kGrad)
      for (int64_t j = threadIdx.x; j < a.ws; j += blockDim.x) grad[j] = from_float<T>(0.f);
    return;
  }
  const float k2 = a.inv_t * kLog2e;  // logits to log2-scaled
  const bool vs = reinterpret_cast<uintptr_t>(s) % 16 == 0,
             vt = reinterpret_cast<uintptr_t>(t) % 16 == 0;

  // Pass 1: the maxima and the sums of exp2 of both rows, online (one read of the row where a
  // max pass and a sum pass took two; docs/benchmarks.md); for the KLs also their loss, online.
  constexpr int64_t div = kDiv;
  constexpr bool rev = div == kReverseKl, kl = rev || div == kForwardKl;
  static_assert(!kGrad || forward_kernel_writes_grad(kDiv),
                "TVD and JSD write the gradient with the backward's kernel (distill_forward)");
  MaxSum2 ms{{-INFINITY, 0.f, 0.f, -INFINITY}, {-INFINITY, 0.f}};
  // The weighting side (the teacher for forward KL and for TVD and JSD, the student for reverse
  // KL) with its dot for the KLs (MaxSum2).
  const auto pass1 = [&](int64_t, const Vec<T>& x, const Vec<T>& y) {
    float xs[N], ys[N];
    unpack(x, xs);
    unpack(y, ys);
    if constexpr (rev) {
      ms = add_scaled_kl<N>(ms, xs, ys, k2);
    } else if constexpr (kl) {
      ms = add_scaled_kl<N>(ms, ys, xs, k2);
    } else {
      const MaxSum wt = add_scaled<N>(MaxSum{ms.w.max, ms.w.sum}, ys, k2);
      ms.w = MaxSumDot{wt.max, wt.sum, 0.f, -INFINITY};
      ms.o = add_scaled<N>(ms.o, xs, k2);
    }
  };
  for_each_vec<false, false>(s, t, ns, nt, vs, vt, n_any, pass1);
  ms = block_allreduce(
      ms,
      [](MaxSum2 u, MaxSum2 v) {
        if constexpr (kl) return combine_kl(u, v);
        const MaxSum w = combine(MaxSum{u.w.max, u.w.sum}, MaxSum{v.w.max, v.w.sum});
        return MaxSum2{{w.max, w.sum, 0.f, -INFINITY}, combine(u.o, v.o)};
      },
      MaxSum2{{-INFINITY, 0.f, 0.f, -INFINITY}, {-INFINITY, 0.f}}, red);
  const MaxSum w{ms.w.max, ms.w.sum};
  const float mx_s = rev ? w.max : ms.o.max, mx_t = rev ? ms.o.max : w.max;
  const float sum_s = rev ? w.sum : ms.o.sum, sum_t = rev ? ms.o.sum : w.sum;
  // log2 of the sums (a row without mass: max -inf, every p 0, log_sum 0).
  const float ls_s = mx_s == -INFINITY ? 0.f : log2f(sum_s),
              ls_t = mx_t == -INFINITY ? 0.f : log2f(sum_t);
  const ProbNorm ns_s = prob_norm(mx_s, ls_s), ns_t = prob_norm(mx_t, ls_t);

  // Pass 2: the row's loss and its row constant sum_j p_j g_j. The KLs have both from pass 1:
  // with w the weighting distribution (q for forward KL, p for reverse) and o the other,
  // KL(w || o) = sum_j w_j (lw_j - lo_j) = ln 2 (dot / sum_w + (ls_o - ls_w)) (add_scaled_kl):
  // exactly 0 for identical rows (dot 0, equal sums), 0 when w has no mass, +inf when w has mass
  // where o has none; reverse KL's row constant is its loss.
  const JsdConstants<float> jsd(div == kJsd ? a.beta : 0.5f);
  float2 lc{0.f, 0.f};
  if constexpr (kl) {
    const float mx_w = rev ? mx_s : mx_t;
    const float ls_w = rev ? ls_s : ls_t, ls_o = rev ? ls_t : ls_s;
    const float loss = kl_row_loss(ms, k2, mx_w, ls_w, ls_o);
    lc = make_float2(loss, loss);
  } else {
    const auto pass2 = [&](int64_t, const Vec<T>& x, const Vec<T>& y) {
      float xs[N], ys[N];
      unpack(x, xs);
      unpack(y, ys);
      float2 v{0.f, 0.f};  // the vector's terms, then into the running sums (add_scaled's why)
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp, q, lq, term, g;
        prob(xs[k], k2, ns_s, p, lp);
        prob(ys[k], k2, ns_t, q, lq);
        divergence_element<float, CudaMath>(div, jsd, p, q, lp, lq, term, g);
        v.x += term;
        v.y += p * g;
      }
      lc.x += v.x;
      lc.y += v.y;
    };
    // Backwards: the row's end, read last by pass 1, is still in the L2. The kernel's last read
    // of the row (TVD and JSD never write the gradient here: a forward that computes it runs the
    // backward's kernel next, forward_kernel_writes_grad).
    for_each_vec<true, true>(s, t, ns, nt, vs, vt, n_any, pass2);
    lc = block_sum2(lc, red);
  }
  // Mass on one side only (the other -inf everywhere: no distribution): a NaN loss, and a NaN row
  // constant that makes the gradient NaN at every column (saved_row_constant), as the
  // composite's softmax of an all -inf row gives. The normalisers stay as they are: the fused
  // cross-entropy reads the student's.
  if ((mx_s == -INFINITY) != (mx_t == -INFINITY)) lc.x = NAN;
  const float c = saved_row_constant<float>(div, lc.x, lc.y);
  if (threadIdx.x == 0) {
    float* st = a.stats + row * kStatsPerRow;
    st[0] = mx_s;
    st[1] = ls_s;
    st[2] = mx_t;
    st[3] = ls_t;
    st[4] = c;
    st[kStatLoss] = stored_row_loss(lc.x);
  }

  // Pass 3 (a forward that computes the gradient): grad = grad_scale * scale / T * dL/da.
  if constexpr (kGrad) {
    const float row_scale = hinted_scale(*a.grad_scale) * *a.scale * a.inv_t;
    const bool vg = reinterpret_cast<uintptr_t>(grad) % 16 == 0;
    const int64_t gend = a.ws;
    const auto pass3 = [&](int64_t j, const Vec<T>& x, const Vec<T>& y) {
      Vec<T> out;
      float xs[N], ys[N];
      unpack(x, xs);
      unpack(y, ys);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp, q, lq, term, g;
        prob(xs[k], k2, ns_s, p, lp);
        prob(ys[k], k2, ns_t, q, lq);
        divergence_element<float, CudaMath>(div, jsd, p, q, lp, lq, term, g);
        out.v[k] = from_float<T>(row_scale * divergence_grad(div, p, q, g, c));
      }
      zero_padding(out, j, n_any);
      if (vg && j + N <= gend) {
        *reinterpret_cast<uint4*>(grad + j) = out.raw;
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
          if (j + k < gend) grad[j + k] = out.v[k];
      }
    };
    // (Taken backwards after the KLs' one forward pass: measured no faster.)
    for_each_vec<false, false>(s, t, ns, nt, vs, vt, n_any, pass3);
    // The student's columns past the loop (past n_any: padding past V): gradient 0.
    for (int64_t j = n_any + threadIdx.x; j < gend; j += blockDim.x) grad[j] = from_float<T>(0.f);
  }
}

// The reduction's scale from the labels (before a forward that computes the gradient needs it),
// computed as the finalize computes it (an integer count, the scale in double, rounded once to
// float): the gradient written in the forward is the one the backward would write, bit for bit
// ('mean' at V = 151936: a float product n * V rounded differently from n = 14135 rows on).
// static (as the finalize): this header is included by more than one translation unit (the
// cross-entropy kernels use its row helpers).
static __global__ void distill_count_kernel(DistillArgs<float> a) {
  __shared__ unsigned red[block_reduce_words<long long>()];
  long long valid = 0;
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x)
    valid += (a.labels == nullptr || a.labels[r] != a.ignore_index) ? 1 : 0;
  const long long n = block_allreduce(
      valid, [](long long x, long long y) { return x + y; }, 0LL, red);
  if (threadIdx.x == 0)
    *a.scale = static_cast<float>(distill_reduction_scale<double>(a.reduction, n, a.V));
}

// The loss from the rows' losses (summed in double) and the reduction's scale. One block.
static __global__ void distill_finalize_kernel(DistillArgs<float> a) {
  __shared__ double sh[32];
  __shared__ long long shn[32];
  double sum = 0.0;
  long long valid = 0;
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x) {
    const float l = a.stats[r * kStatsPerRow + kStatLoss];
    if (a.reduction == kNone) a.loss[r] = l;
    sum += l;
    valid += (a.labels == nullptr || a.labels[r] != a.ignore_index) ? 1 : 0;
  }
  for (int o = 16; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    valid += __shfl_xor_sync(0xffffffffu, valid, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) {
    sh[warp] = sum;
    shn[warp] = valid;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    long long n = 0;
    for (int w = 0; w < warps; ++w) {
      s += sh[w];
      n += shn[w];
    }
    const double sc = distill_reduction_scale<double>(a.reduction, n, a.V);
    *a.scale = static_cast<float>(sc);
    if (a.reduction != kNone) *a.loss = static_cast<float>(s * sc);
  }
}

// Backward: grid (rows, chunks); one pass over the logits, the gradient written once. With kCe,
// the cross-entropy's gradient is added in the same pass (DistillArgs::ce_weight). The gradient
// may be the student's logits themselves (a.grad == a.s, in place): every element is read by the
// thread that writes it, before it writes it; the only other reads are the vectors past a block's
// last column that its final iteration loads and discards (the next block's, maybe already
// overwritten: never used).
template <typename T, bool kCe, int64_t kDiv>
__global__ void __launch_bounds__(256)
    distill_backward_kernel(DistillArgs<T> a, int64_t chunk_cols) {
  constexpr int N = Vec<T>::N;
  const int64_t row = blockIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * chunk_cols;
  const int64_t end = begin + chunk_cols < a.ws ? begin + chunk_cols : a.ws;
  T* grad = a.grad + row * a.ws;
  const bool vg = reinterpret_cast<uintptr_t>(grad) % 16 == 0;
  if (a.labels != nullptr && a.labels[row] == a.ignore_index) {
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) grad[j] = from_float<T>(0.f);
    return;
  }
  const int64_t ns = a.ws < a.V ? a.ws : a.V, nt = a.wt < a.V ? a.wt : a.V;
  const int64_t n_any = ns > nt ? ns : nt;  // past it: padding, gradient 0 (zero_padding)
  const T* s = a.s + row * a.s_stride;
  const T* t = a.t + row * a.t_stride;
  const bool vs = reinterpret_cast<uintptr_t>(s) % 16 == 0,
             vt = reinterpret_cast<uintptr_t>(t) % 16 == 0;
  const float* st = a.stats + row * kStatsPerRow;
  const ProbNorm ns_s = prob_norm(st[0], st[1]), ns_t = prob_norm(st[2], st[3]);
  const float c = st[4];
  const float go = a.reduction == kNone ? a.grad_output[row]
                   : a.from_grad_scale  ? hinted_scale(a.grad_output[0]) * *a.scale
                                        : a.grad_output[0] * *a.scale;
  const float row_scale = go * a.inv_t, k2 = a.inv_t * kLog2e;
  constexpr int64_t div = kDiv;
  const JsdConstants<float> jsd(div == kJsd ? a.beta : 0.5f);
  // The cross-entropy's weight, statistics and label (kCe; cw 0: no term).
  float cw = 0.f;
  ProbNorm ce{0.f, 0.f};
  int64_t y = -1;
  if constexpr (kCe) {
    cw = a.ce_weight[row];
    // A row without mass (max -inf): no softmax, a NaN gradient, as cross_entropy's own backward.
    if (cw != 0.f && a.ce_stats[row * a.ce_stats_stride] == -INFINITY) cw = NAN;
    ce = prob_norm(a.ce_stats[row * a.ce_stats_stride], a.ce_stats[row * a.ce_stats_stride + 1]);
    y = a.labels != nullptr ? a.labels[row] : -1;
  }
  constexpr int kU = 2;  // vectors of each row per thread in flight
  const int64_t step = int64_t(blockDim.x) * N;
  for (int64_t j0 = begin + int64_t(threadIdx.x) * N; j0 < end; j0 += kU * step) {
    Vec<T> xs[kU], ys[kU];
    load_vecs(s, j0, step, ns, vs, xs);
    load_vecs(t, j0, step, nt, vt, ys);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = j0 + u * step;
      if (j >= end) break;
      Vec<T> out;
      float xf[N], yf[N];
      unpack(xs[u], xf);
      unpack(ys[u], yf);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp, q, lq, term, g;
        prob(xf[k], k2, ns_s, p, lp);
        prob(yf[k], k2, ns_t, q, lq);
        divergence_element<float, CudaMath>(div, jsd, p, q, lp, lq, term, g);
        float d = row_scale * divergence_grad(div, p, q, g, c);
        if constexpr (kCe) {
          if (cw != 0.f && j + k < ns) {  // past ns: no column of the cross-entropy
            float p1, lp1;
            prob(xf[k], kLog2e, ce, p1, lp1);
            d += cw * (j + k == y ? p1 - 1.f : p1);
          }
        }
        out.v[k] = from_float<T>(d);
      }
      zero_padding(out, j, n_any);
      if (vg && j + N <= end) {
        *reinterpret_cast<uint4*>(grad + j) = out.raw;
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
          if (j + k < end) grad[j + k] = out.v[k];
      }
    }
  }
}

// A forward-computed gradient made right for the grad_output backward brings: nothing when it is
// the scale the forward computed it for (hinted_scale of its grad_scale; every block reads both
// and returns), else grad *= go / gs.
template <typename T>
__global__ void distill_rescale_kernel(T* grad, int64_t n, const float* grad_output,
                                       const float* grad_scale) {
  const float go = *grad_output, gs = hinted_scale(*grad_scale);
  if (go == gs) return;
  const float f = go / gs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    grad[i] = from_float<T>(to_float(grad[i]) * f);
}

}  // namespace distill_detail

// Threads per block of the forward for rows of n_any columns of T: about 4 vectors per thread
// and pass, 64 to 128. Small blocks put several rows on an SM (up to 8 of 128 threads at the
// kernel's 64 registers), so one row's block reductions and load latencies overlap another's
// loads: measured on an H200 (bf16, session 14, `bench/distill_ab.py`), 128 threads against up to
// 1024 made the forward 12-39% faster (tvd 8192 x 151936 4.39 -> 3.94 ms, forward_kl 2.75 ->
// 2.36; 8192 x 49152 1.61 -> 1.38 and 1.16 -> 0.80; 4096 x 32000 0.63 -> 0.51 and 0.48 -> 0.31).
// A KL's forward that also writes the gradient (grad_scale) runs the same blocks although it was
// ~5% faster at 512 threads: the block size sets the order of the row sums, and the loss and
// gradient must not change in the last bit with the hint
// (DistillLoss.GradScaleHintGivesTheSameGradientForAnyGradOutput).
template <typename T>
int distill_forward_threads(int64_t n_any) {
  constexpr int64_t N = distill_detail::Vec<T>::N;
  const int64_t vecs = (n_any + N - 1) / N;
  const int threads = int((vecs + 3) / 4 + 31) / 32 * 32;
  return threads < 64 ? 64 : (threads > 128 ? 128 : threads);
}

namespace distill_detail {
template <typename T>
DistillArgs<float> as_float_args(const DistillArgs<T>& a) {  // for the dtype-free kernels
  DistillArgs<float> f{};
  f.V = a.V;
  f.rows = a.rows;
  f.labels = a.labels;
  f.ignore_index = a.ignore_index;
  f.reduction = a.reduction;
  f.stats = a.stats;
  f.scale = a.scale;
  f.loss = a.loss;
  return f;
}
}  // namespace distill_detail

template <typename T>
cudaError_t distill_backward(const DistillArgs<T>& a, cudaStream_t stream);

// Forward: stats, loss and scale; the gradient too when a.grad is set (then a.grad_scale too).
template <typename T>
cudaError_t distill_forward(const DistillArgs<T>& a, cudaStream_t stream) {
  using namespace distill_detail;
  cudaError_t err = cudaSuccess;
  const bool grad = a.grad != nullptr, in_kernel = grad && forward_kernel_writes_grad(a.divergence);
  if (grad && a.reduction == kNone) return cudaErrorInvalidValue;  // one grad_scale, not per row
  if (in_kernel) {  // the scale, before the finalize computes it
    distill_count_kernel<<<1, 1024, 0, stream>>>(as_float_args(a));
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int64_t ns = a.ws < a.V ? a.ws : a.V, nt = a.wt < a.V ? a.wt : a.V;
  const dim3 grid(unsigned(a.rows)), block(unsigned(distill_forward_threads<T>(ns > nt ? ns : nt)));
  err = with_divergence(a.divergence, [&](auto div) {
    constexpr int64_t kDiv = decltype(div)::value;
    if constexpr (forward_kernel_writes_grad(kDiv)) {
      if (in_kernel) {
        distill_forward_kernel<T, true, kDiv><<<grid, block, 0, stream>>>(a);
        return cudaGetLastError();
      }
    }
    distill_forward_kernel<T, false, kDiv><<<grid, block, 0, stream>>>(a);
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  distill_finalize_kernel<<<1, 1024, 0, stream>>>(as_float_args(a));
  if ((err = cudaGetLastError()) != cudaSuccess || !grad || in_kernel) return err;
  DistillArgs<T> b = a;  // TVD, JSD: the backward's kernel, after the finalize's scale
  b.grad_output = a.grad_scale;
  b.from_grad_scale = true;
  b.ce_weight = nullptr;
  return distill_backward(b, stream);
}

// Backward: a.grad (rows, ws) from a.grad_output and the forward's stats and scale, plus the
// cross-entropy's gradient when a.ce_weight is set; a.grad may be a.s (in place).
template <typename T>
cudaError_t distill_backward(const DistillArgs<T>& a, cudaStream_t stream) {
  using namespace distill_detail;
  constexpr int64_t N = Vec<T>::N;
  // Columns per block: 8 vectors per thread, fewer when there are too few rows to fill the device.
  int64_t chunk = 256 * N * 8;
  while (chunk > 256 * N && a.rows * ((a.ws + chunk - 1) / chunk) < int64_t(a.num_sms) * 8)
    chunk /= 2;
  while ((a.ws + chunk - 1) / chunk > 65535) chunk *= 2;  // gridDim.y's limit: wider blocks
  const int64_t chunks = (a.ws + chunk - 1) / chunk;
  const dim3 grid(unsigned(a.rows), unsigned(chunks));
  return with_divergence(a.divergence, [&](auto div) {
    constexpr int64_t kDiv = decltype(div)::value;
    if (a.ce_weight != nullptr)
      distill_backward_kernel<T, true, kDiv><<<grid, 256, 0, stream>>>(a, chunk);
    else
      distill_backward_kernel<T, false, kDiv><<<grid, 256, 0, stream>>>(a, chunk);
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t distill_rescale(T* grad, int64_t n, const float* grad_output, const float* grad_scale,
                            int num_sms, cudaStream_t stream) {
  const int64_t blocks =
      (n + 255) / 256 < int64_t(num_sms) * 8 ? (n + 255) / 256 : int64_t(num_sms) * 8;
  distill_detail::distill_rescale_kernel<T>
      <<<unsigned(blocks > 0 ? blocks : 1), 256, 0, stream>>>(grad, n, grad_output, grad_scale);
  return cudaGetLastError();
}

}  // namespace lossfns::kernels

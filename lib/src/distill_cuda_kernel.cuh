// Framework-free CUDA kernels of lossfns::distill_loss. Raw pointers, sizes and a cudaStream_t;
// every launcher returns the cudaError_t of its launches. Includes nothing from Torch; the adapter
// (distill_cuda.cu) checks inputs, maps dtypes and takes the current stream.
//
// Data movement (the op is memory-bound at real vocabularies):
//  - forward, streamed (the default): one block per row; the passes a row needs (the maxima,
//    the sums of exp, the divergence and its row constant, and the gradient when it is computed
//    in forward) each read the row from global memory, the L2 cache serving part of the re-reads.
//  - forward, staged (selected by the adapter's stage_bytes; measured slower on the H200, see
//    docs/benchmarks.md): each row is read once into the shared memory of a thread-block cluster
//    (sm_90+; or of one block), spread over `cluster` blocks, the passes run over shared memory,
//    and the blocks of a row combine their partial results through distributed shared memory.
//  - backward: reads the logits once more and writes the gradient once, unless the forward
//    computed the gradient (the caller gave the grad_output in advance as grad_scale).
// Per element the math is distill_common.h's, in float, with exp2 of log2-scaled logits.
#pragma once

#include <cstdint>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "distill_common.h"
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
  const int64_t* labels;       // (rows,) or nullptr
  int64_t ignore_index;
  int64_t divergence;          // Divergence code; JSD's beta in (0, 1)
  float beta;
  float inv_t;                 // 1 / temperature
  Reduction reduction;
  float* stats;                // (rows, kStatsPerRow), distill_common.h's layout (log2 units)
  float* scale;                // 1 value: the reduction's scale (written by the finalize, or by the
                               // count before a forward that computes the gradient)
  float* loss;                 // 1 value (reduced) or (rows,) ('none'): written by the finalize
  // The gradient (rows, ws) contiguous, written by a forward that computes it (else nullptr), for
  // a grad_output of *grad_scale.
  T* grad;
  const float* grad_scale;
  // Backward only: grad_output, 1 value (reduced) or (rows,) ('none').
  const float* grad_output;
  int num_sms;
};

namespace distill_detail {

namespace cg = cooperative_groups;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// log(x / m) as a difference of two hardware log2s (no division; bit-identical x and m give
// exactly 0), clamped to its bound.
struct CudaMath {
  static __device__ __forceinline__ float log_ratio(float x, float m, float /*bound*/, float log_bound) {
    return fminf((__log2f(x) - __log2f(m)) * kLn2, log_bound);
  }
};

// A logit scaled to log2 units, rounded once and never fused into a later subtraction: every
// pass must see the same x2 as the max was taken over (an FMA of x * k2 - max keeps the
// product's rounding error, |x2| * 2^-24, and at |x2| ~ 1e4 that error shifts p by 5e-4).
__device__ __forceinline__ float scaled(float x, float k2) { return __fmul_rn(x, k2); }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <typename T> __device__ __forceinline__ T neg_inf() { return from_float<T>(-INFINITY); }

// 16 bytes of T.
template <typename T>
struct Vec {
  static constexpr int N = 16 / int(sizeof(T));
  union {
    uint4 raw;
    T v[N];
  };
};

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

// Block-wide reduction of two floats (sum or max), broadcast to every thread. `shared`: 2 * 32
// floats. Safe to call back to back.
template <bool kMax>
__device__ __forceinline__ float2 block_reduce2(float2 v, float* shared) {
  auto op = [](float2 a, float2 b) {
    return kMax ? make_float2(fmaxf(a.x, b.x), fmaxf(a.y, b.y)) : make_float2(a.x + b.x, a.y + b.y);
  };
  const float id = kMax ? -INFINITY : 0.f;
  return block_allreduce(v, op, make_float2(id, id), shared);
}

// A row's partial results combined over the blocks of its cluster (kCluster), in rank order, so
// that every block of the row gets bit-identical values. `slot`: this phase's own shared float2.
template <bool kCluster, bool kMax>
__device__ __forceinline__ float2 cluster_reduce2(float2 v, float2* slot) {
  if constexpr (!kCluster) {
    return v;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) *slot = v;
    cluster.sync();
    float2 r{kMax ? -INFINITY : 0.f, kMax ? -INFINITY : 0.f};
    for (unsigned b = 0; b < cluster.num_blocks(); ++b) {
      const float2 o = *cluster.map_shared_rank(slot, b);
      r.x = kMax ? fmaxf(r.x, o.x) : r.x + o.x;
      r.y = kMax ? fmaxf(r.y, o.y) : r.y + o.y;
    }
    return r;
#else
    __trap();  // clusters are launched only on sm_90+
    return v;
#endif
  }
}

// p and its natural log from a log2-scaled logit x2 and its row's max and log2 of the sum of
// exp2(x2 - max) (0 and -inf for x2 = -inf).
__device__ __forceinline__ void prob(float x2, float mx, float ls, float& p, float& lp) {
  const bool none = x2 == -INFINITY;
  const float l2 = (x2 - mx) - ls;
  p = none ? 0.f : exp2f(l2);
  lp = none ? -INFINITY : l2 * kLn2;
}

// The element loop every pass shares: f(j, s_j, t_j) over this block's columns [begin, end) of the
// row, N at a time, from shared memory (kStaged: sh_s / sh_t hold the block's columns from
// `begin`) or from global memory (s, t: the row; columns at or past ns / nt are -inf).
template <typename T, bool kStaged, typename F>
__device__ __forceinline__ void for_each_vec(const T* sh_s, const T* sh_t, const T* s, const T* t, int64_t ns,
                                             int64_t nt, bool vs, bool vt, int64_t begin, int64_t end, F&& f) {
  constexpr int N = Vec<T>::N;
  for (int64_t j = begin + int64_t(threadIdx.x) * N; j < end; j += int64_t(blockDim.x) * N) {
    Vec<T> a, b;
    if constexpr (kStaged) {
      a.raw = *reinterpret_cast<const uint4*>(sh_s + (j - begin));
      b.raw = *reinterpret_cast<const uint4*>(sh_t + (j - begin));
    } else {
      a = load_vec(s, j, ns, vs);
      b = load_vec(t, j, nt, vt);
    }
    f(j, a, b);
  }
}

// Forward of one row per cluster (kCluster: `gridDim.x / rows` blocks per row, a cluster each) or
// per block. Block b of a row takes columns [b * width, (b + 1) * width) of [0, max(ns, nt)).
template <typename T, bool kStaged, bool kCluster, bool kGrad>
__global__ void distill_forward_kernel(DistillArgs<T> a, int64_t width) {
  constexpr int N = Vec<T>::N;
  extern __shared__ __align__(16) unsigned char dyn_shared[];
  __shared__ float red[64];
  __shared__ float2 slots[4];
  const int64_t blocks_per_row = kCluster ? gridDim.x / a.rows : 1;
  const int64_t row = blockIdx.x / blocks_per_row, rank = blockIdx.x % blocks_per_row;
  const int64_t ns = a.ws < a.V ? a.ws : a.V, nt = a.wt < a.V ? a.wt : a.V;
  const int64_t n_any = ns > nt ? ns : nt;
  const int64_t begin = rank * width, end = begin + width < n_any ? begin + width : n_any;
  const T* s = a.s + row * a.s_stride;
  const T* t = a.t + row * a.t_stride;
  T* grad = kGrad ? a.grad + row * a.ws : nullptr;
  // The gradient columns this block writes: its own, and for the last block of a row the rest of
  // the student's row (padding past V).
  const int64_t gend = rank + 1 == blocks_per_row ? a.ws : (begin + width < a.ws ? begin + width : a.ws);
  const bool ignored = a.labels != nullptr && a.labels[row] == a.ignore_index;
  // Every block of a cluster takes the same branches (the row decides them), so the cluster
  // barriers below are reached by all or none.
  if (ignored) {
    if (rank == 0 && threadIdx.x < kStatsPerRow) a.stats[row * kStatsPerRow + threadIdx.x] = 0.f;
    if constexpr (kGrad)
      for (int64_t j = begin + threadIdx.x; j < gend; j += blockDim.x) grad[j] = from_float<T>(0.f);
    return;
  }
  const float k2 = a.inv_t * kLog2e;  // logits to log2-scaled
  const bool vs = reinterpret_cast<uintptr_t>(s) % 16 == 0, vt = reinterpret_cast<uintptr_t>(t) % 16 == 0;
  T* sh_s = reinterpret_cast<T*>(dyn_shared);
  T* sh_t = sh_s + width;
  if constexpr (kStaged) {  // the block's columns, once, into shared memory (-inf past ns / nt)
    // kU vectors of each row per thread in flight: all loads first, then the stores.
    constexpr int kU = 4;
    const int64_t step = int64_t(blockDim.x) * N;
    for (int64_t j0 = begin + int64_t(threadIdx.x) * N; j0 < begin + width; j0 += kU * step) {
      Vec<T> va[kU], vb[kU];
      if (vs && vt && j0 + (kU - 1) * step + N <= (ns < nt ? ns : nt)) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          va[u].raw = __ldg(reinterpret_cast<const uint4*>(s + j0 + u * step));
          vb[u].raw = __ldg(reinterpret_cast<const uint4*>(t + j0 + u * step));
        }
      } else {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          va[u] = load_vec(s, j0 + u * step, ns, vs);
          vb[u] = load_vec(t, j0 + u * step, nt, vt);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t j = j0 + u * step;
        if (j < begin + width) {
          *reinterpret_cast<uint4*>(sh_s + (j - begin)) = va[u].raw;
          *reinterpret_cast<uint4*>(sh_t + (j - begin)) = vb[u].raw;
        }
      }
    }
    __syncthreads();
  }
  const int64_t loop_end = kStaged ? begin + width : end;

  // Pass 1: the maxima, then the sums of exp2, of both rows.
  float2 mx{-INFINITY, -INFINITY};
  for_each_vec<T, kStaged>(sh_s, sh_t, s, t, ns, nt, vs, vt, begin, loop_end, [&](int64_t, const Vec<T>& x, const Vec<T>& y) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      mx.x = fmaxf(mx.x, scaled(to_float(x.v[k]), k2));
      mx.y = fmaxf(mx.y, scaled(to_float(y.v[k]), k2));
    }
  });
  mx = cluster_reduce2<kCluster, true>(block_reduce2<true>(mx, red), &slots[0]);
  float2 sum{0.f, 0.f};
  for_each_vec<T, kStaged>(sh_s, sh_t, s, t, ns, nt, vs, vt, begin, loop_end, [&](int64_t, const Vec<T>& x, const Vec<T>& y) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      sum.x += mx.x == -INFINITY ? 0.f : exp2f(scaled(to_float(x.v[k]), k2) - mx.x);
      sum.y += mx.y == -INFINITY ? 0.f : exp2f(scaled(to_float(y.v[k]), k2) - mx.y);
    }
  });
  sum = cluster_reduce2<kCluster, false>(block_reduce2<false>(sum, red), &slots[1]);
  const float mx_s = mx.x, mx_t = mx.y;
  // log2 of the sums (a row without mass: max -inf, every p 0, log_sum 0).
  const float ls_s = mx.x == -INFINITY ? 0.f : log2f(sum.x), ls_t = mx.y == -INFINITY ? 0.f : log2f(sum.y);

  // Pass 2: the row's loss and its row constant sum_j p_j g_j.
  const JsdConstants<float> jsd(a.divergence == kJsd ? a.beta : 0.5f);
  const int64_t div = a.divergence;
  float2 lc{0.f, 0.f};
  for_each_vec<T, kStaged>(sh_s, sh_t, s, t, ns, nt, vs, vt, begin, loop_end, [&](int64_t, const Vec<T>& x, const Vec<T>& y) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float p, lp, q, lq, term, g;
      prob(scaled(to_float(x.v[k]), k2), mx_s, ls_s, p, lp);
      prob(scaled(to_float(y.v[k]), k2), mx_t, ls_t, q, lq);
      divergence_element<float, CudaMath>(div, jsd, p, q, lp, lq, term, g);
      lc.x += term;
      lc.y += p * g;
    }
  });
  lc = cluster_reduce2<kCluster, false>(block_reduce2<false>(lc, red), &slots[2]);
  const float c = needs_row_constant(div) ? lc.y : 0.f;
  if (rank == 0 && threadIdx.x == 0) {
    float* st = a.stats + row * kStatsPerRow;
    st[0] = mx_s;
    st[1] = ls_s;
    st[2] = mx_t;
    st[3] = ls_t;
    st[4] = c;
    st[kStatLoss] = lc.x;
  }

  // Pass 3 (a forward that computes the gradient): grad = grad_scale * scale / T * dL/da.
  if constexpr (kGrad) {
    const float row_scale = *a.grad_scale * *a.scale * a.inv_t;
    const bool vg = reinterpret_cast<uintptr_t>(grad) % 16 == 0;
    for_each_vec<T, kStaged>(sh_s, sh_t, s, t, ns, nt, vs, vt, begin, loop_end, [&](int64_t j, const Vec<T>& x, const Vec<T>& y) {
      Vec<T> out;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp, q, lq, term, g;
        prob(scaled(to_float(x.v[k]), k2), mx_s, ls_s, p, lp);
        prob(scaled(to_float(y.v[k]), k2), mx_t, ls_t, q, lq);
        divergence_element<float, CudaMath>(div, jsd, p, q, lp, lq, term, g);
        out.v[k] = from_float<T>(row_scale * divergence_grad(div, p, q, g, c));  // 0 past ns: p = 0, q = 0
      }
      if (vg && j + N <= gend) {
        *reinterpret_cast<uint4*>(grad + j) = out.raw;
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
          if (j + k < gend) grad[j + k] = out.v[k];
      }
    });
    // The student's columns past the loop (past n_any: padding past V): gradient 0.
    for (int64_t j = loop_end + threadIdx.x; j < gend; j += blockDim.x) grad[j] = from_float<T>(0.f);
  }
  if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();  // no block leaves while another may still read its slots
#endif
  }
}

// The reduction's scale from the labels (before a forward that computes the gradient needs it).
// static (as the finalize): this header is included by more than one translation unit (the
// cross-entropy kernels use its row helpers).
static __global__ void distill_count_kernel(DistillArgs<float> a) {
  __shared__ float red[64];
  int64_t valid = 0;
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x)
    valid += (a.labels == nullptr || a.labels[r] != a.ignore_index) ? 1 : 0;
  const float2 v = block_reduce2<false>(make_float2(float(valid), 0.f), red);  // exact below 2^24 rows
  if (threadIdx.x == 0)
    *a.scale = distill_reduction_scale<float>(a.reduction, static_cast<int64_t>(v.x), a.V);
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

// Backward: grid (rows, chunks); one pass over the logits, the gradient written once.
template <typename T>
__global__ void __launch_bounds__(256) distill_backward_kernel(DistillArgs<T> a, int64_t chunk_cols) {
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
  const T* s = a.s + row * a.s_stride;
  const T* t = a.t + row * a.t_stride;
  const bool vs = reinterpret_cast<uintptr_t>(s) % 16 == 0, vt = reinterpret_cast<uintptr_t>(t) % 16 == 0;
  const float* st = a.stats + row * kStatsPerRow;
  const float mx_s = st[0], ls_s = st[1], mx_t = st[2], ls_t = st[3], c = st[4];
  const float go = a.reduction == kNone ? a.grad_output[row] : a.grad_output[0] * *a.scale;
  const float row_scale = go * a.inv_t, k2 = a.inv_t * kLog2e;
  const JsdConstants<float> jsd(a.divergence == kJsd ? a.beta : 0.5f);
  const int64_t div = a.divergence;
  constexpr int kU = 2;  // vectors of each row per thread in flight
  const int64_t step = int64_t(blockDim.x) * N;
  for (int64_t j0 = begin + int64_t(threadIdx.x) * N; j0 < end; j0 += kU * step) {
    Vec<T> xs[kU], ys[kU];
    if (vs && vt && j0 + (kU - 1) * step + N <= (ns < nt ? ns : nt)) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        xs[u].raw = __ldg(reinterpret_cast<const uint4*>(s + j0 + u * step));
        ys[u].raw = __ldg(reinterpret_cast<const uint4*>(t + j0 + u * step));
      }
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        xs[u] = load_vec(s, j0 + u * step, ns, vs);
        ys[u] = load_vec(t, j0 + u * step, nt, vt);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = j0 + u * step;
      if (j >= end) break;
      Vec<T> out;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp, q, lq, term, g;
        prob(scaled(to_float(xs[u].v[k]), k2), mx_s, ls_s, p, lp);
        prob(scaled(to_float(ys[u].v[k]), k2), mx_t, ls_t, q, lq);
        divergence_element<float, CudaMath>(div, jsd, p, q, lp, lq, term, g);
        out.v[k] = from_float<T>(row_scale * divergence_grad(div, p, q, g, c));
      }
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
// the grad_scale the forward used (every block reads both and returns), else grad *= go / gs.
template <typename T>
__global__ void distill_rescale_kernel(T* grad, int64_t n, const float* grad_output, const float* grad_scale) {
  const float go = *grad_output, gs = *grad_scale;
  if (go == gs) return;
  const float f = go / gs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    grad[i] = from_float<T>(to_float(grad[i]) * f);
}

}  // namespace distill_detail

// How the forward runs a row: staged in shared memory across `cluster` blocks of `width` columns
// each (cluster 1: one block), or streamed from global memory.
struct DistillPlan {
  bool staged = false;
  int cluster = 1;
  int64_t width = 0;  // columns per block (a multiple of 16 bytes of T)
  int threads = 256;
  size_t smem = 0;    // dynamic shared memory per block
};

// The plan for rows of `n_any` columns of T: the smallest power-of-two cluster whose blocks hold
// their columns of both rows in at most `max_smem` bytes (16 blocks at most, and only with
// clusters: sm_90+), else streaming.
template <typename T>
DistillPlan distill_plan(int64_t n_any, bool clusters, size_t max_smem, int64_t target = 96 * 1024) {
  constexpr int64_t N = distill_detail::Vec<T>::N;
  DistillPlan plan;
  // target: shared bytes per block (96 KiB leaves room for two blocks per SM); 0: streamed
  for (int c = 1; target > 0 && c <= (clusters ? 16 : 1); c *= 2) {
    const int64_t width = ((n_any + c - 1) / c + N - 1) / N * N;
    const size_t bytes = size_t(2 * width) * sizeof(T);
    if (bytes <= size_t(target) || (c == (clusters ? 16 : 1) && bytes <= max_smem)) {
      plan.staged = true;
      plan.cluster = c;
      plan.width = width;
      plan.smem = bytes;
      break;
    }
  }
  if (!plan.staged) plan.width = n_any;
  const int64_t vecs = (plan.width + N - 1) / N;
  int threads = int((vecs + 3) / 4 + 31) / 32 * 32;  // ~4 vectors per thread and pass
  plan.threads = threads < 64 ? 64 : (threads > 1024 ? 1024 : threads);
  return plan;
}

namespace distill_detail {
template <auto Kernel, typename... Args>
cudaError_t launch_cluster(int cluster, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  cudaError_t err = cudaSuccess;
  if (smem > 48 * 1024) err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err == cudaSuccess && cluster > 8)
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  err = cudaLaunchKernelEx(&cfg, Kernel, args...);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

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

// Forward: stats, loss and scale; the gradient too when a.grad is set (then a.grad_scale too).
template <typename T>
cudaError_t distill_forward(const DistillArgs<T>& a, const DistillPlan& plan, cudaStream_t stream) {
  using namespace distill_detail;
  cudaError_t err = cudaSuccess;
  const bool grad = a.grad != nullptr;
  if (grad) {
    distill_count_kernel<<<1, 1024, 0, stream>>>(as_float_args(a));
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const dim3 grid(unsigned(a.rows * plan.cluster)), block(unsigned(plan.threads));
  if (plan.staged && plan.cluster > 1) {
    err = grad ? launch_cluster<distill_forward_kernel<T, true, true, true>>(plan.cluster, grid, block, plan.smem, stream, a, plan.width)
               : launch_cluster<distill_forward_kernel<T, true, true, false>>(plan.cluster, grid, block, plan.smem, stream, a, plan.width);
  } else if (plan.staged) {
    err = grad ? launch_cluster<distill_forward_kernel<T, true, false, true>>(1, grid, block, plan.smem, stream, a, plan.width)
               : launch_cluster<distill_forward_kernel<T, true, false, false>>(1, grid, block, plan.smem, stream, a, plan.width);
  } else {
    err = grad ? launch_cluster<distill_forward_kernel<T, false, false, true>>(1, grid, block, 0, stream, a, plan.width)
               : launch_cluster<distill_forward_kernel<T, false, false, false>>(1, grid, block, 0, stream, a, plan.width);
  }
  if (err != cudaSuccess) return err;
  distill_finalize_kernel<<<1, 1024, 0, stream>>>(as_float_args(a));
  return cudaGetLastError();
}

// Backward: a.grad (rows, ws) from a.grad_output and the forward's stats and scale.
template <typename T>
cudaError_t distill_backward(const DistillArgs<T>& a, cudaStream_t stream) {
  using namespace distill_detail;
  constexpr int64_t N = Vec<T>::N;
  // Columns per block: 8 vectors per thread, fewer when there are too few rows to fill the device.
  int64_t chunk = 256 * N * 8;
  while (chunk > 256 * N && a.rows * ((a.ws + chunk - 1) / chunk) < int64_t(a.num_sms) * 8) chunk /= 2;
  const int64_t chunks = (a.ws + chunk - 1) / chunk;
  if (chunks > 65535) return cudaErrorInvalidConfiguration;
  distill_backward_kernel<T><<<dim3(unsigned(a.rows), unsigned(chunks)), 256, 0, stream>>>(a, chunk);
  return cudaGetLastError();
}

template <typename T>
cudaError_t distill_rescale(T* grad, int64_t n, const float* grad_output, const float* grad_scale, int num_sms,
                            cudaStream_t stream) {
  const int64_t blocks = (n + 255) / 256 < int64_t(num_sms) * 8 ? (n + 255) / 256 : int64_t(num_sms) * 8;
  distill_detail::distill_rescale_kernel<T><<<unsigned(blocks > 0 ? blocks : 1), 256, 0, stream>>>(
      grad, n, grad_output, grad_scale);
  return cudaGetLastError();
}

}  // namespace lossfns::kernels

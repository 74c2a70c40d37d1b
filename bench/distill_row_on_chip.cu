// Workshop: issue 16's three-stream mode with each row held on chip (sm_90: thread-block clusters,
// the Tensor Memory Accelerator's bulk copies, st.async).
//
// The library's forward that also writes the gradient (grad_scale) reads a row of s and t twice
// from global memory (the normalisers, then the gradient) and writes the gradient once: five
// streams where the issue's target counts three. This program measures the design the earlier
// sessions named and had not tried: a row split over a cluster of C blocks, each block loading
// its slice of s and t once into shared memory with bulk copies (cp.async.bulk, completion on an
// mbarrier), S stages deep so that the next row's slice streams in while this one is computed;
// the blocks' normalisers are exchanged either through a cluster barrier and reads of each
// other's shared memory, or by st.async into every block's shared memory with an mbarrier per
// row (no cluster barrier); the gradient is written from shared memory. Forward KL (the trainer's
// default divergence), bf16, batchmean, no ignored rows, V a multiple of 8. Raw CUDA, no Torch.
//
// Every variant's loss and gradient are checked against the library's forward with grad_scale
// (the same math in another summation order), against float64 on a few rows, and at ties (t = s:
// loss 0 and gradient 0 exactly); the program exits 1 if one differs. Then ms per call (count +
// forward + finalize, as the library's) against the library's and the three-stream limit at the
// measured copy bandwidth, and block 0's clock cycles per row in each phase. docs/benchmarks.md
// ("Session 32") has the results: correct, but at best 1.01x and 1.10x the library's forward at
// V = 151936 and 128256, far from the 3-stream target. With two stages a block never waits for
// its slices; what is left exposed is compute: the per-row block reductions and exchange, which
// the library hides behind 8 rows per SM where shared memory holds the slices of 1-3 rows here.
//
// Command (device machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90
//   --expt-relaxed-constexpr -Ilib/src -Ilib/include bench/distill_row_on_chip.cu -o /tmp/oc &&
//   /tmp/oc [--no-check] [--v V]. Also built as build-device/bench/distill_row_on_chip.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "distill_cuda_kernel.cuh"
#include "distill_workshop.cuh"   // fill_logits, bf2f
#include "tvd_workshop_host.cuh"  // CHECK, time_ms (median of 15 samples of 10 calls), g_failed

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;
using namespace lossfns::kernels;
using namespace lossfns::kernels::distill_detail;
using distill_workshop::bf2f;
using distill_workshop::fill_logits;
using tvd_workshop::g_failed;
using tvd_workshop::time_ms;

namespace {

struct OnChipArgs {
  const bf16* s;
  const bf16* t;
  int64_t stride;  // row stride of s and t, elements
  int64_t rows, V;
  int64_t W;  // columns per block of a cluster (a multiple of 8)
  float inv_t;
  float* stats;             // (rows, kStatsPerRow)
  const float* scale;       // the reduction's scale (distill_count_kernel)
  const float* grad_scale;  // the grad_output the caller will bring
  bf16* grad;               // (rows, V)
  long long* trace;         // 8 values (kTrace)
};

// sm_90 instructions: compiled only for sm_90 and later (the build also targets sm_80).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define ON_CHIP_SM90 1
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global memory into this block's
// shared memory, completing on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Waits for the phase of parity `parity` of an mbarrier that blocks of the cluster complete
// (st.async from other blocks): acquire at cluster scope.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ uint32_t map_rank(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}
// 16 bytes into block `rank`'s shared memory at the same offset as `local`, completing 16 bytes of
// transaction on that block's mbarrier at the offset of `local_bar`.
__device__ __forceinline__ void send16(const float* local, const uint64_t* local_bar, int rank,
                                       float4 v) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(map_rank(local, rank)),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(map_rank(local_bar, rank))
      : "memory");
}

__device__ __forceinline__ MaxSum2 combine2(MaxSum2 u, MaxSum2 v) { return combine_kl(u, v); }
__device__ __forceinline__ MaxSum2 identity2() {
  return MaxSum2{{-INFINITY, 0.f, 0.f, -INFINITY}, {-INFINITY, 0.f}};
}
// A normaliser pair as six floats in shared memory (this block's or another's).
__device__ __forceinline__ void store6(float* p, const MaxSum2& m) {
  p[0] = m.w.max;
  p[1] = m.w.sum;
  p[2] = m.w.dot;
  p[3] = m.w.imax;
  p[4] = m.o.max;
  p[5] = m.o.sum;
}
__device__ __forceinline__ MaxSum2 load6(const float* p) {
  return MaxSum2{{p[0], p[1], p[2], p[3]}, {p[4], p[5]}};
}
#endif  // sm_90

// Forward KL with its gradient, a row per cluster of C blocks of NT threads, S stages of slices.
// kAsync: the partials go to every block of the cluster by st.async, each block waiting on its own
// mbarrier for the C partials of the row (no cluster barrier per row); else a cluster barrier and
// reads of the other blocks' shared memory. kTrace: block 0's thread 0 sums clock cycles per
// phase into a.trace.
template <int C, int NT, int S, bool kAsync, bool kTrace, int kU>
__global__ void __launch_bounds__(NT, 1) kl_on_chip_kernel(OnChipArgs a) {
  // Warp 0 combines the C partials (one lane each), and threads [0, C) send them.
  static_assert(C >= 1 && C <= 32 && NT >= 32 && NT % 32 == 0, "C <= 32 blocks of whole warps");
#ifndef ON_CHIP_SM90
  __trap();  // launched only on sm_90 and later (main checks)
#else
  constexpr int N = 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* buf = reinterpret_cast<bf16*>(smem);  // [S][2][W]
  __shared__ __align__(8) uint64_t bars[S];
  __shared__ float part[2][6];
  __shared__ __align__(16) float inbox[2][C][8];
  __shared__ __align__(8) uint64_t inbars[2];
  long long tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  long long t_prev = clock64();
  const auto mark = [&](int i) {
    if constexpr (kTrace) {
      const long long now = clock64();
      tr[i] += now - t_prev;
      t_prev = now;
    }
  };
  __shared__ float comb[6];
  __shared__ float red[block_reduce_words<MaxSum2>()];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), tid = int(threadIdx.x);
  const int64_t cid = blockIdx.x / C, ncl = gridDim.x / C;
  const int64_t c0 = int64_t(rank) * a.W;
  const int64_t len = a.V - c0 < 0 ? 0 : (a.V - c0 < a.W ? a.V - c0 : a.W);
  const unsigned bytes = unsigned(len * int64_t(sizeof(bf16)));
  if (tid == 0) {
    for (int st = 0; st < S; ++st) mbar_init(&bars[st], 1);
    if constexpr (kAsync) {
      for (int i = 0; i < 2; ++i) {
        mbar_init(&inbars[i], 1);
        mbar_arrive_expect_tx(&inbars[i], unsigned(C) * 32u);  // rows 0 and 1
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  cluster.sync();  // every block of the cluster runs before any reads another's shared memory
  const auto issue = [&](int64_t it) {
    const int64_t row = cid + it * ncl;
    if (row >= a.rows) return;
    const int st = int(it % S);
    mbar_arrive_expect_tx(&bars[st], 2 * bytes);
    if (bytes != 0) {
      bulk_load(buf + (int64_t(st) * 2) * a.W, a.s + row * a.stride + c0, bytes, &bars[st]);
      bulk_load(buf + (int64_t(st) * 2 + 1) * a.W, a.t + row * a.stride + c0, bytes, &bars[st]);
    }
  };
  if (tid == 0)
    for (int it = 0; it < S; ++it) issue(it);
  const float k2 = a.inv_t * kLog2e;
  const float row_scale = *a.grad_scale * *a.scale * a.inv_t;
  for (int64_t it = 0; cid + it * ncl < a.rows; ++it) {
    const int64_t row = cid + it * ncl;
    const int st = int(it % S);
    mark(0);
    mbar_wait(&bars[st], unsigned(it / S) & 1u);
    mark(1);
    const bf16* xs = buf + (int64_t(st) * 2) * a.W;
    const bf16* ys = xs + a.W;
    // Pass 1, over shared memory: both normalisers and the teacher's dot, online.
    // kU independent accumulators (each a dependent chain of rescales and sums), kU vectors of
    // each row in flight.
    const auto op = [](MaxSum2 u, MaxSum2 v) { return combine2(u, v); };
    constexpr int64_t step = int64_t(NT) * N;
    // f(u, j, x, y) for the vectors at j of this block's slices, kU of each row loaded at once.
    const auto for_each_vec = [&](auto&& f) {
      for (int64_t j0 = int64_t(tid) * N; j0 < len; j0 += kU * step) {
        Vec<bf16> x[kU], y[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (j0 + u * step < len) {
            x[u].raw = *reinterpret_cast<const uint4*>(xs + j0 + u * step);
            y[u].raw = *reinterpret_cast<const uint4*>(ys + j0 + u * step);
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u)
          if (j0 + u * step < len) f(u, j0 + u * step, x[u], y[u]);
      }
    };
    MaxSum2 acc[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) acc[u] = identity2();
    for_each_vec([&](int u, int64_t, const Vec<bf16>& x, const Vec<bf16>& y) {
      float xf[N], yf[N];
      unpack(x, xf);
      unpack(y, yf);
      acc[u] = add_scaled_kl<N>(acc[u], yf, xf, k2);
    });
    MaxSum2 ms = acc[0];
#pragma unroll
    for (int u = 1; u < kU; ++u) ms = combine2(ms, acc[u]);
    mark(2);
    ms = block_allreduce(ms, op, identity2(), red);
    mark(3);
    float* mine = part[it & 1];
    if constexpr (kAsync) {
      if (tid < C) {  // thread r sends this block's partial to block r
        float* slot = inbox[it & 1][rank];
        send16(slot, &inbars[it & 1], tid, make_float4(ms.w.max, ms.w.sum, ms.w.dot, ms.w.imax));
        send16(slot + 4, &inbars[it & 1], tid, make_float4(ms.o.max, ms.o.sum, 0.f, 0.f));
      }
      mbar_wait_cluster(&inbars[it & 1], unsigned(it / 2) & 1u);
    } else {
      if (tid == 0) store6(mine, ms);
      cluster.sync();
    }
    mark(4);
    // The cluster's blocks' partials, combined in rank order by the lanes of warp 0 (the same
    // butterfly in every block, so every block gets the same bits).
    if (tid < 32) {
      MaxSum2 m = identity2();
      if (tid < C) m = load6(kAsync ? inbox[it & 1][tid] : cluster.map_shared_rank(mine, tid));
      m = warp_allreduce(m, op);
      if (tid == 0) store6(comb, m);
    }
    __syncthreads();
    // This row's inbox is read: armed for the row after next (before this block sends the next
    // row's partial, so before any block can send the row after next's).
    if (kAsync && tid == 0) mbar_arrive_expect_tx(&inbars[it & 1], unsigned(C) * 32u);
    mark(5);
    const MaxSum2 all = load6(comb);
    const MaxSumDot w = all.w;
    const MaxSum o = all.o;
    const float mx_s = o.max, mx_t = w.max, sum_s = o.sum, sum_t = w.sum;
    const float ls_s = mx_s == -INFINITY ? 0.f : log2f(sum_s),
                ls_t = mx_t == -INFINITY ? 0.f : log2f(sum_t);
    const ProbNorm ns_s = prob_norm(mx_s, ls_s), ns_t = prob_norm(mx_t, ls_t);
    // The row's loss from the normalisers: a copy of distill_forward_kernel's KL branch
    // (lib/src/distill_cuda_kernel.cuh, inline there), which the check compares against. The
    // library stores it clamped at 0 (stored_row_loss); a relative tolerance covers the
    // difference, and exact ties give 0 either way.
    if (rank == 0 && tid == 0) {
      const bool nan = isnan(w.sum) || isnan(o.sum) || isnan(w.dot);
      const bool inf = w.imax != -INFINITY && exp2_ftz(exponent(w.imax, k2, mx_t) - ls_t) > 0.f;
      const float loss = nan                 ? NAN
                         : mx_t == -INFINITY ? 0.f
                         : inf               ? INFINITY
                                             : kLn2 * (w.dot / w.sum + (ls_s - ls_t));
      float* stt = a.stats + row * kStatsPerRow;
      stt[0] = mx_s;
      stt[1] = ls_s;
      stt[2] = mx_t;
      stt[3] = ls_t;
      stt[4] = 0.f;
      stt[kStatLoss] = loss;
    }
    // Pass 2, over shared memory: the gradient, written once.
    bf16* g = a.grad + row * a.V + c0;
    for_each_vec([&](int, int64_t j, const Vec<bf16>& x, const Vec<bf16>& y) {
      Vec<bf16> out;
      float xf[N], yf[N];
      unpack(x, xf);
      unpack(y, yf);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp, q, lq;
        prob(xf[k], k2, ns_s, p, lp);
        prob(yf[k], k2, ns_t, q, lq);
        out.v[k] = from_float<bf16>(row_scale * (p - q));
      }
      __stcs(reinterpret_cast<uint4*>(g + j), out.raw);
    });
    mark(6);
    __syncthreads();  // every thread is done with this stage's slices
    if (tid == 0) issue(it + S);
    mark(7);
  }
  if (kTrace && blockIdx.x == 0 && tid == 0)
    for (int i = 0; i < 8; ++i) a.trace[i] = tr[i];
  cluster.sync();  // no block leaves while another may still read its partials
#endif
}

struct Buffers {
  int64_t rows, V;
  bf16 *s, *t, *grad_lib, *grad_oc;
  float *stats, *scale, *loss, *grad_scale;
};

DistillArgs<bf16> library_args(const Buffers& b, float inv_t, bf16* grad, int num_sms) {
  DistillArgs<bf16> a{};
  a.s = b.s;
  a.t = b.t;
  a.s_stride = a.t_stride = b.V;
  a.ws = a.wt = a.V = b.V;
  a.rows = b.rows;
  a.labels = nullptr;
  a.ignore_index = -100;
  a.divergence = kForwardKl;
  a.beta = 0.5f;
  a.inv_t = inv_t;
  a.reduction = kBatchMean;
  a.stats = b.stats;
  a.scale = b.scale;
  a.loss = b.loss;
  a.grad = grad;
  a.grad_scale = b.grad_scale;
  a.num_sms = num_sms;
  return a;
}

template <int C, int NT, int S, bool kAsync, int kU = 1>
struct OnChip {
  using Kernel = void (*)(OnChipArgs);
  static constexpr Kernel kernel = kl_on_chip_kernel<C, NT, S, kAsync, false, kU>;
  static constexpr Kernel traced = kl_on_chip_kernel<C, NT, S, kAsync, true, kU>;
  int64_t W = 0;
  size_t smem = 0;
  int clusters = 0;
  std::string name() const {
    return "cluster " + std::to_string(C) + " x " + std::to_string(NT) + " threads, " +
           std::to_string(S) + " stages, " + (kAsync ? "st.async" : "cluster barrier") + ", " +
           std::to_string(kU) + " accumulators";
  }
  // false if it does not fit
  bool setup(int64_t V) {
    W = ((V + C - 1) / C + 7) / 8 * 8;
    smem = size_t(S) * 2 * size_t(W) * sizeof(bf16);
    int optin = 0;
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    cudaFuncAttributes fa{};
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    if (smem + fa.sharedSizeBytes > size_t(optin)) return false;  // with the static arrays
    for (Kernel k : {kernel, traced}) {
      CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      if (C > 8) CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    config(cfg, attr, C * 64);
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters == 0) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
  }
  void config(cudaLaunchConfig_t& cfg, cudaLaunchAttribute (&attr)[1], int blocks) const {
    cfg.gridDim = dim3(unsigned(blocks));
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = 0;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  void run(const Buffers& b, float inv_t, bf16* grad, long long* trace = nullptr) const {
    DistillArgs<bf16> la = library_args(b, inv_t, grad, 0);
    distill_count_kernel<<<1, 1024>>>(as_float_args(la));
    OnChipArgs a{b.s, b.t, b.V, b.rows, b.V, W, inv_t, b.stats, b.scale, b.grad_scale, grad, trace};
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    const int used = int(std::min<int64_t>(clusters, b.rows));
    config(cfg, attr, used * C);
    CHECK(cudaLaunchKernelEx(&cfg, trace != nullptr ? traced : kernel, a));
    distill_finalize_kernel<<<1, 1024>>>(as_float_args(la));
    CHECK(cudaGetLastError());
  }
};

// Compares the on-chip kernel with the library (loss and gradient), with float64 on a few rows,
// and at ties.
template <typename K>
void check(const K& k, Buffers& b, float inv_t, int num_sms) {
  const int64_t n = b.rows * b.V;
  CHECK(distill_forward<bf16>(library_args(b, inv_t, b.grad_lib, num_sms), 0));
  float loss_lib;
  CHECK(cudaMemcpy(&loss_lib, b.loss, 4, cudaMemcpyDeviceToHost));
  // Outputs the variant must write: NaN before it runs (stale values could pass the checks).
  const auto poison = [&] {
    CHECK(cudaMemset(b.grad_oc, 0xff, n * 2));
    CHECK(cudaMemset(b.stats, 0xff, b.rows * kStatsPerRow * 4));
    CHECK(cudaMemset(b.loss, 0xff, 4));
  };
  poison();
  k.run(b, inv_t, b.grad_oc);
  float loss_oc;
  CHECK(cudaMemcpy(&loss_oc, b.loss, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> gl(n), go(n);
  CHECK(cudaMemcpy(gl.data(), b.grad_lib, n * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(go.data(), b.grad_oc, n * 2, cudaMemcpyDeviceToHost));
  double max_diff = 0, max_abs = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = bf2f(gl[i]), y = bf2f(go[i]);
    max_abs = std::max(max_abs, std::fabs(x));
    if (gl[i] != go[i]) {
      ++differ;
      max_diff = std::max(max_diff, std::fabs(x - y));
    }
  }
  // float64 on rows spread over the batch.
  std::vector<uint16_t> sh(b.V), th(b.V);
  float gs, sc;
  CHECK(cudaMemcpy(&gs, b.grad_scale, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&sc, b.scale, 4, cudaMemcpyDeviceToHost));
  double ref_err = 0;
  for (int64_t r = 0; r < b.rows; r += b.rows / 7 + 1) {
    CHECK(cudaMemcpy(sh.data(), b.s + r * b.V, b.V * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(th.data(), b.t + r * b.V, b.V * 2, cudaMemcpyDeviceToHost));
    double ms = -INFINITY, mt = -INFINITY, zs = 0, zt = 0;
    for (int64_t j = 0; j < b.V; ++j) {
      ms = std::max(ms, double(bf2f(sh[j])) * inv_t);
      mt = std::max(mt, double(bf2f(th[j])) * inv_t);
    }
    for (int64_t j = 0; j < b.V; ++j) {
      zs += std::exp(double(bf2f(sh[j])) * inv_t - ms);
      zt += std::exp(double(bf2f(th[j])) * inv_t - mt);
    }
    for (int64_t j = 0; j < b.V; ++j) {
      const double p = std::exp(double(bf2f(sh[j])) * inv_t - ms) / zs;
      const double q = std::exp(double(bf2f(th[j])) * inv_t - mt) / zt;
      const double ref = double(gs) * sc * inv_t * (p - q);
      ref_err = std::max(ref_err, std::fabs(ref - bf2f(go[r * b.V + j])));
    }
  }
  const double rel_loss = std::fabs(double(loss_oc) - loss_lib) / std::fabs(double(loss_lib));
  // bf16 gradient: one rounding of a float value whose own error is a few float ulps, so an element
  // differs from the library's by at most one bf16 ulp, and only where the float value lies near
  // a rounding boundary (~1e-4 of the elements in every run).
  const bool ok = rel_loss < 1e-5 && max_diff <= max_abs * 1e-2 && differ <= n / 1000 &&
                  ref_err <= max_abs * 8e-3;
  std::printf(
      "  check %-40s loss %.9g (library %.9g, rel %.2e); gradient: %lld of %lld elements differ "
      "from the library's, by at most %.3g (max |g| %.3g); float64 rows: max error %.3g: %s\n",
      k.name().c_str(), loss_oc, loss_lib, rel_loss, static_cast<long long>(differ),
      static_cast<long long>(n), max_diff, max_abs, ref_err, ok ? "ok" : "FAILED");
  if (!ok) g_failed = true;
  // Ties: the teacher is the student.
  CHECK(cudaMemcpy(b.t, b.s, n * 2, cudaMemcpyDeviceToDevice));
  poison();
  k.run(b, inv_t, b.grad_oc);
  CHECK(cudaMemcpy(&loss_oc, b.loss, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(go.data(), b.grad_oc, n * 2, cudaMemcpyDeviceToHost));
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += (go[i] & 0x7fff) != 0;
  const bool tie_ok = loss_oc == 0.f && nonzero == 0;
  std::printf("  ties  %-40s loss %g, %lld nonzero gradient elements: %s\n", k.name().c_str(),
              loss_oc, static_cast<long long>(nonzero), tie_ok ? "ok" : "FAILED");
  if (!tie_ok) g_failed = true;
}

void fill(Buffers& b) {
  const int64_t n = b.rows * b.V;
  fill_logits<<<1024, 256>>>(b.s, n, 1u, 16.f);
  fill_logits<<<1024, 256>>>(b.t, n, 2u, 16.f);
  CHECK(cudaGetLastError());
}

template <typename K>
void measure(K k, Buffers& b, float inv_t, int num_sms, double limit_ms, float lib_ms,
             bool do_check) {
  if (!k.setup(b.V)) {
    std::printf("| %lld x %lld | %s | does not fit | | |\n", static_cast<long long>(b.rows),
                static_cast<long long>(b.V), k.name().c_str());
    return;
  }
  if (do_check) {  // on the first rows (the host's comparison of every element is slow)
    Buffers part = b;
    part.rows = std::min<int64_t>(b.rows, 1024);
    check(k, part, inv_t, num_sms);
    fill(b);
  }
  const float ms = time_ms([&] { k.run(b, inv_t, b.grad_oc); });
  // Block 0's thread 0: cycles per row in each phase.
  long long* tr;
  CHECK(cudaMalloc(&tr, 8 * sizeof(long long)));
  k.run(b, inv_t, b.grad_oc, tr);
  long long h[8];
  CHECK(cudaMemcpy(h, tr, sizeof h, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(tr));
  const int used = int(std::min<int64_t>(k.clusters, b.rows));
  const double per = double((b.rows + used - 1) / used);
  std::printf("| %lld x %lld | %s (%d clusters, %zu KiB) | %.3f | %.0f%% | %.2fx |\n",
              static_cast<long long>(b.rows), static_cast<long long>(b.V), k.name().c_str(),
              k.clusters, k.smem / 1024, ms, 100.0 * limit_ms / ms, lib_ms / ms);
  std::printf(
      "  cycles per row: issue-to-wait %.0f, wait %.0f, pass 1 %.0f, block reduce %.0f, "
      "exchange %.0f, combine %.0f, pass 2 %.0f, sync + issue %.0f\n",
      h[0] / per, h[1] / per, h[2] / per, h[3] / per, h[4] / per, h[5] / per, h[6] / per,
      h[7] / per);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> vocab = {151936, 128256, 49152, 32000};
  int64_t rows = 8192;
  bool do_check = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-check") == 0) do_check = false;
    if (std::strcmp(argv[i], "--v") == 0 && i + 1 < argc) vocab = {std::atoll(argv[++i])};
  }
  for (const int64_t V : vocab) {
    if (V <= 0 || V % 8 != 0) {  // 16-byte rows and slices: the bulk copies' alignment
      std::fprintf(stderr, "distill_row_on_chip: --v must be a positive multiple of 8; got %lld\n",
                   static_cast<long long>(V));
      return 2;
    }
  }
  int dev = 0, num_sms = 0;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  int major = 0;
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) {
    std::printf(
        "distill_row_on_chip needs sm_90 or later (thread-block clusters, bulk copies); "
        "this device is sm_%d.x\n",
        major);
    return 0;
  }
  const float inv_t = 1.f / 2.f;
  std::printf(
      "forward KL, bf16, T = 2, batchmean, grad_scale 0.5: the forward that writes the "
      "gradient (count + forward + finalize), ms, median of 15 x 10 calls\n\n");
  std::printf(
      "| rows x V | kernel | ms | %% of the 3-stream limit | vs library "
      "|\n|---|---|---:|---:|---:|\n");
  for (const int64_t V : vocab) {
    Buffers b{};
    b.rows = rows;
    b.V = V;
    const int64_t n = rows * V;
    CHECK(cudaMalloc(&b.s, n * 2));
    CHECK(cudaMalloc(&b.t, n * 2));
    CHECK(cudaMalloc(&b.grad_lib, n * 2));
    CHECK(cudaMalloc(&b.grad_oc, n * 2));
    CHECK(cudaMalloc(&b.stats, rows * kStatsPerRow * 4));
    CHECK(cudaMalloc(&b.scale, 4));
    CHECK(cudaMalloc(&b.loss, 4));
    CHECK(cudaMalloc(&b.grad_scale, 4));
    const float half = 0.5f;
    CHECK(cudaMemcpy(b.grad_scale, &half, 4, cudaMemcpyHostToDevice));
    fill(b);
    const float copy_ms =
        time_ms([&] { CHECK(cudaMemcpyAsync(b.grad_oc, b.s, n * 2, cudaMemcpyDeviceToDevice)); });
    const double bw = 2.0 * n * 2 / (copy_ms * 1e-3);  // bytes read + written per second
    const double limit_ms = 3.0 * n * 2 / bw * 1e3;
    const auto lib = [&] {
      CHECK(distill_forward<bf16>(library_args(b, inv_t, b.grad_lib, num_sms), 0));
    };
    const auto lib5 = [&] {
      DistillArgs<bf16> a = library_args(b, inv_t, nullptr, num_sms);
      CHECK(distill_forward<bf16>(a, 0));
      a.grad = b.grad_lib;
      a.grad_output = b.grad_scale;
      CHECK(distill_backward<bf16>(a, 0));
    };
    const float lib_ms = time_ms(lib);
    const float lib5_ms = time_ms(lib5);
    std::printf("| %lld x %lld | copy: %.0f GB/s; 3-stream limit %.3f ms | | | |\n",
                static_cast<long long>(rows), static_cast<long long>(V), bw / 1e9, limit_ms);
    std::printf("| %lld x %lld | library, forward + backward (5 streams) | %.3f | %.0f%% | |\n",
                static_cast<long long>(rows), static_cast<long long>(V), lib5_ms,
                100.0 * limit_ms / lib5_ms);
    std::printf("| %lld x %lld | library, forward with grad_scale | %.3f | %.0f%% | 1.00x |\n",
                static_cast<long long>(rows), static_cast<long long>(V), lib_ms,
                100.0 * limit_ms / lib_ms);
    // The variants of docs/benchmarks.md's session-32 table (four calls measured more).
    measure(OnChip<8, 512, 2, false>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<8, 512, 2, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<8, 256, 2, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<8, 256, 2, true, 2>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<16, 512, 4, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<8, 256, 1, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<8, 128, 1, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<16, 128, 1, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    measure(OnChip<2, 512, 2, true>{}, b, inv_t, num_sms, limit_ms, lib_ms, do_check);
    CHECK(cudaFree(b.s));
    CHECK(cudaFree(b.t));
    CHECK(cudaFree(b.grad_lib));
    CHECK(cudaFree(b.grad_oc));
    CHECK(cudaFree(b.stats));
    CHECK(cudaFree(b.scale));
    CHECK(cudaFree(b.loss));
    CHECK(cudaFree(b.grad_scale));
  }
  if (g_failed) std::printf("\nA check FAILED\n");
  return g_failed ? 1 : 0;
}

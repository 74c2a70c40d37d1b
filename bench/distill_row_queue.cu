// Workshop: issue 16's second reads served by the L2, with row slices taken from one work queue.
//
// TVD's and JSD's forward read a row twice (the normalisers, then the loss and the row constant,
// which need the normalised p and q), and the KLs' forward that writes the gradient (grad_scale)
// reads it twice too (the normalisers and loss, then the gradient). With one block per row and
// ~1000 rows in flight the second read comes from HBM (docs/benchmarks.md, "What bounds the
// targets not met"): forward + backward move 7 streams where the 5-stream limit counts 5, and the
// KLs' 3-stream mode moves 5 where it counts 3. Keeping fewer rows in flight by splitting a row
// over a thread-block cluster was slower (sessions 11 and 21: every block of a row waits at the
// cluster barrier for the others), and holding a row in a cluster's shared memory left compute
// exposed (session 32).
//
// The design measured here, which no session had tried: every block of a persistent grid takes
// work items from one global counter, in an order that keeps few rows between a row's two reads.
// A row is cut into S slices; the rows into chunks of R rows. Phase 1 of a (row, slice) item
// reduces the slice's normalisers and publishes them (a release: a fence, then a per-chunk
// counter); phase 2 of the item combines the row's S partial normalisers in slice order (the same
// bits in every block) and makes its second pass over the slice: TVD's and JSD's loss and row
// constant (the last of the row's slices to finish combines them, in order, into the row's
// stats), or the KLs' gradient. The queue runs phase 1 of chunk c + 1 and then phase 2 of chunk
// c, so a slice's second read comes about one chunk of new reads after its first (R follows
// from the chunk size given: MB of s and t per chunk, --variants). No block ever waits for an item
// the queue has not handed out before its own (phase 1 never waits; phase 2 of chunk c waits for
// phase 1 of chunk c, handed out earlier to running blocks), so any grid size is deadlock-free,
// without a cooperative launch. The stats have the library's layout, so the library's backward (and
// finalize) run on them unchanged.
//
// Checked against the library (loss, row stats, and the gradient of the library's backward run
// on either forward's stats; for the KLs the gradient the queue writes) and at ties (t = s: loss
// 0, gradient 0 exactly); the program exits 1 if a check fails. bf16, T = 2, batchmean, no
// ignored rows, V a multiple of 8. Raw CUDA, no Torch.
//
// Result (session 47, one H100; docs/benchmarks.md, "Session 47"): correct, and slower than the
// library everywhere, at best 0.94x (TVD's forward + backward, 4 slices) and 0.90x (forward KL's
// forward with the gradient). Waiting is not the cost (a few hundred of ~130,000 phase-2 items
// wait at 16 slices and 16 MB chunks); each slice pass's fixed work is (a block reduction, a
// fence, two atomics). Fewer slices need chunks too large for the L2 before phase 2 stops
// waiting.
//
// Command (device machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90
//   --expt-relaxed-constexpr -Ilib/src -Ilib/include bench/distill_row_queue.cu -o /tmp/rq &&
//   /tmp/rq [--no-check] [--v V]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "distill_cuda_kernel.cuh"
#include "distill_workshop.cuh"   // fill_logits, bf2f
#include "tvd_workshop_host.cuh"  // CHECK, time_ms (median of 15 samples of 10 calls), g_failed

using bf16 = __nv_bfloat16;
using namespace lossfns::kernels;
using namespace lossfns::kernels::distill_detail;
using distill_workshop::bf2f;
using distill_workshop::fill_logits;
using tvd_workshop::g_failed;
using tvd_workshop::time_ms;

namespace {

struct QueueArgs {
  const bf16* s;
  const bf16* t;
  int64_t V, rows;  // rows of V contiguous columns
  int S;            // slices per row
  int64_t W;        // columns per slice (a multiple of 8)
  int64_t R;        // rows per chunk
  int64_t chunks;
  float inv_t, beta;
  MaxSum2* part1;      // (rows, S): each slice's normalisers (and the KLs' dot)
  float2* part2;       // (rows, S): each slice's loss and row-constant sums (TVD, JSD)
  unsigned* queue;     // the next item
  unsigned* done1;     // (chunks,): phase-1 items finished
  unsigned* row_done;  // (rows,): phase-2 slices finished (TVD, JSD)
  float* stats;        // (rows, kStatsPerRow), the library's layout
  const float* scale;  // the reduction's scale (KLs with the gradient: distill_count_kernel)
  const float* grad_scale;
  bf16* grad;                 // (rows, V): the KLs' gradient, or nullptr
  unsigned long long* spins;  // phase-2 items that waited, and their polls (diagnostics)
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ MaxSum2 load_cg(const MaxSum2* p) {
  const float* f = reinterpret_cast<const float*>(p);
  MaxSum2 m;
  m.w.max = __ldcg(f + 0);
  m.w.sum = __ldcg(f + 1);
  m.w.dot = __ldcg(f + 2);
  m.w.imax = __ldcg(f + 3);
  m.o.max = __ldcg(f + 4);
  m.o.sum = __ldcg(f + 5);
  return m;
}

template <int64_t kDiv>
__device__ __forceinline__ MaxSum2 combine_div(const MaxSum2& u, const MaxSum2& v) {
  constexpr bool kl = kDiv == kForwardKl || kDiv == kReverseKl;
  if constexpr (kl) return combine_kl(u, v);
  const MaxSum w = combine(MaxSum{u.w.max, u.w.sum}, MaxSum{v.w.max, v.w.sum});
  return MaxSum2{{w.max, w.sum, 0.f, -INFINITY}, combine(u.o, v.o)};
}

template <int64_t kDiv, bool kGrad>
__global__ void __launch_bounds__(256, 4) queue_forward_kernel(QueueArgs a) {
  using T = bf16;
  constexpr int N = Vec<T>::N;
  constexpr bool rev = kDiv == kReverseKl, kl = rev || kDiv == kForwardKl;
  static_assert(!kGrad || kl, "the queue writes the gradient for the KLs only");
  __shared__ float red[block_reduce_words<MaxSum2>()];
  __shared__ unsigned sh_item[2];
  const int64_t K = a.R * a.S;  // items per chunk and phase
  const int64_t total = 2 * K * a.chunks;
  const float k2 = a.inv_t * kLog2e;
  const MaxSum2 identity{{-INFINITY, 0.f, 0.f, -INFINITY}, {-INFINITY, 0.f}};
  if (threadIdx.x == 0) sh_item[0] = atomicAdd(a.queue, 1u);
  __syncthreads();
  int slot = 0;
  for (;;) {
    const int64_t item = sh_item[slot];
    if (item >= total) break;
    // The next item, taken now: its latency hides behind this one.
    if (threadIdx.x == 0) sh_item[slot ^ 1] = atomicAdd(a.queue, 1u);
    // Order: phase 1 of chunk 0; then phase 1 of chunk b and phase 2 of chunk b - 1; then phase
    // 2 of the last chunk.
    bool phase2;
    int64_t chunk, within;
    if (item < K) {
      phase2 = false;
      chunk = 0;
      within = item;
    } else {
      const int64_t i = item - K, b = 1 + i / (2 * K), w = i % (2 * K);
      if (b < a.chunks) {
        phase2 = w >= K;
        chunk = phase2 ? b - 1 : b;
        within = phase2 ? w - K : w;
      } else {
        phase2 = true;
        chunk = b - 1;
        within = w;
      }
    }
    const int64_t row = chunk * a.R + within / a.S;
    const int slice = int(within % a.S);
    const int64_t j0 = int64_t(slice) * a.W;
    const bool live = row < a.rows;
    const int64_t n = live ? (a.V - j0 < a.W ? (a.V - j0 > 0 ? a.V - j0 : 0) : a.W) : 0;
    const T* s = a.s + (live ? row : 0) * a.V + j0;
    const T* t = a.t + (live ? row : 0) * a.V + j0;
    if (!phase2) {
      MaxSum2 ms = identity;
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
      for_each_vec<false, false>(s, t, n, n, true, true, n, pass1);
      ms = block_allreduce(
          ms, [](MaxSum2 u, MaxSum2 v) { return combine_div<kDiv>(u, v); }, identity, red);
      if (threadIdx.x == 0) {
        if (live) a.part1[row * a.S + slice] = ms;
        __threadfence();
        atomicAdd(a.done1 + chunk, 1u);
      }
    } else {
      if (threadIdx.x == 0) {
        unsigned long long polls = 0;
        while (ld_acquire(a.done1 + chunk) < unsigned(K)) {
          __nanosleep(100);
          ++polls;
        }
        if (polls != 0) {
          atomicAdd(a.spins, 1ull);
          atomicAdd(a.spins + 1, polls);
        }
      }
      __syncthreads();
      if (live) {
        // The row's normalisers: its slices' in slice order (the same bits in every block).
        MaxSum2 ms = load_cg(a.part1 + row * a.S);
        for (int k = 1; k < a.S; ++k) ms = combine_div<kDiv>(ms, load_cg(a.part1 + row * a.S + k));
        const MaxSum w{ms.w.max, ms.w.sum};
        const float mx_s = rev ? w.max : ms.o.max, mx_t = rev ? ms.o.max : w.max;
        const float sum_s = rev ? w.sum : ms.o.sum, sum_t = rev ? ms.o.sum : w.sum;
        const float ls_s = mx_s == -INFINITY ? 0.f : log2f(sum_s),
                    ls_t = mx_t == -INFINITY ? 0.f : log2f(sum_t);
        const ProbNorm ns_s = prob_norm(mx_s, ls_s), ns_t = prob_norm(mx_t, ls_t);
        const JsdConstants<float> jsd(kDiv == kJsd ? a.beta : 0.5f);
        float* st = a.stats + row * kStatsPerRow;
        if constexpr (kl) {
          const float mx_w = rev ? mx_s : mx_t;
          const float ls_w = rev ? ls_s : ls_t, ls_o = rev ? ls_t : ls_s;
          float loss = kl_row_loss(ms, k2, mx_w, ls_w, ls_o);
          if ((mx_s == -INFINITY) != (mx_t == -INFINITY)) loss = NAN;
          const float c = saved_row_constant<float>(kDiv, loss, loss);
          if (slice == 0 && threadIdx.x == 0) {
            st[0] = mx_s;
            st[1] = ls_s;
            st[2] = mx_t;
            st[3] = ls_t;
            st[4] = c;
            st[kStatLoss] = stored_row_loss(loss);
          }
          if constexpr (kGrad) {
            const float row_scale = hinted_scale(*a.grad_scale) * *a.scale * a.inv_t;
            T* grad = a.grad + row * a.V + j0;
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
                divergence_element<float, CudaMath>(kDiv, jsd, p, q, lp, lq, term, g);
                out.v[k] = from_float<T>(row_scale * divergence_grad(kDiv, p, q, g, c));
              }
              *reinterpret_cast<uint4*>(grad + j) = out.raw;
            };
            for_each_vec<true, true>(s, t, n, n, true, true, n, pass3);
          }
        } else {
          float2 lc{0.f, 0.f};
          const auto pass2 = [&](int64_t, const Vec<T>& x, const Vec<T>& y) {
            float xs[N], ys[N];
            unpack(x, xs);
            unpack(y, ys);
#pragma unroll
            for (int k = 0; k < N; ++k) {
              float p, lp, q, lq, term, g;
              prob(xs[k], k2, ns_s, p, lp);
              prob(ys[k], k2, ns_t, q, lq);
              divergence_element<float, CudaMath>(kDiv, jsd, p, q, lp, lq, term, g);
              lc.x += term;
              lc.y += p * g;
            }
          };
          for_each_vec<true, true>(s, t, n, n, true, true, n, pass2);
          lc = block_sum2(lc, red);
          if (threadIdx.x == 0) {
            a.part2[row * a.S + slice] = lc;
            __threadfence();
            if (atomicAdd(a.row_done + row, 1u) == unsigned(a.S - 1)) {
              // The row's last slice: its sums in slice order.
              __threadfence();
              float2 tot{0.f, 0.f};
              const float* p2 = reinterpret_cast<const float*>(a.part2 + row * a.S);
              for (int k = 0; k < a.S; ++k) {
                tot.x += __ldcg(p2 + 2 * k);
                tot.y += __ldcg(p2 + 2 * k + 1);
              }
              if ((mx_s == -INFINITY) != (mx_t == -INFINITY)) tot.x = NAN;
              st[0] = mx_s;
              st[1] = ls_s;
              st[2] = mx_t;
              st[3] = ls_t;
              st[4] = saved_row_constant<float>(kDiv, tot.x, tot.y);
              st[kStatLoss] = stored_row_loss(tot.x);
            }
          }
        }
      }
    }
    __syncthreads();
    slot ^= 1;
  }
}

const char* div_name(int64_t d) {
  return d == kTvd         ? "tvd"
         : d == kForwardKl ? "forward_kl"
         : d == kReverseKl ? "reverse_kl"
                           : "jsd";
}

struct Buffers {
  int64_t rows, V;
  bf16 *s, *t, *grad_lib, *grad_q;
  float *stats, *stats_lib, *scale, *loss, *grad_scale;
  MaxSum2* part1;
  float2* part2;
  unsigned* counters;  // queue, done1 (rows), row_done (rows): room for chunks of one row
  unsigned long long* spins;
};

DistillArgs<bf16> library_args(const Buffers& b, int64_t div, float inv_t, bf16* grad, float* stats,
                               int num_sms) {
  DistillArgs<bf16> a{};
  a.s = b.s;
  a.t = b.t;
  a.s_stride = a.t_stride = b.V;
  a.ws = a.wt = a.V = b.V;
  a.rows = b.rows;
  a.labels = nullptr;
  a.ignore_index = -100;
  a.divergence = div;
  a.beta = 0.5f;
  a.inv_t = inv_t;
  a.reduction = kBatchMean;
  a.stats = stats;
  a.scale = b.scale;
  a.loss = b.loss;
  a.grad = grad;
  a.grad_scale = b.grad_scale;
  a.grad_output = b.grad_scale;
  a.num_sms = num_sms;
  return a;
}

struct Variant {
  int64_t div;
  bool grad;  // the KLs' forward that writes the gradient
  int threads, S;
  double chunk_mb;  // bytes of s and t per chunk
  int blocks = 0;
  int64_t R = 0, W = 0, chunks = 0;
  std::string name() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "queue %d thr, %d slices, %.0f MB chunks (R %lld), %d blocks",
                  threads, S, chunk_mb, static_cast<long long>(R), blocks);
    return buf;
  }
  // false where the kernel cannot run it (its launch bounds: at most 256 threads)
  bool setup(int64_t rows, int64_t V) {
    if (threads < 32 || threads > 256 || threads % 32 != 0 || S < 1 || S > 64) return false;
    W = ((V + S - 1) / S + 7) / 8 * 8;
    R = std::max<int64_t>(1, int64_t(chunk_mb * 1e6 / (4.0 * V)));
    chunks = (rows + R - 1) / R;
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel(), threads, 0));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    blocks = per_sm * sms;
    return true;
  }
  void (*kernel() const)(QueueArgs) {
    if (grad)
      return div == kForwardKl ? queue_forward_kernel<kForwardKl, true>
                               : queue_forward_kernel<kReverseKl, true>;
    switch (div) {
      case kTvd:
        return queue_forward_kernel<kTvd, false>;
      case kJsd:
        return queue_forward_kernel<kJsd, false>;
      case kForwardKl:
        return queue_forward_kernel<kForwardKl, false>;
      default:
        return queue_forward_kernel<kReverseKl, false>;
    }
  }
  // count (KLs with the gradient) + queue + finalize: the library's forward's launches.
  void run(const Buffers& b, float inv_t, float* stats) const {
    DistillArgs<bf16> la = library_args(b, div, inv_t, grad ? b.grad_q : nullptr, stats, 0);
    CHECK(cudaMemsetAsync(b.counters, 0, (1 + chunks + b.rows) * sizeof(unsigned)));
    if (grad) distill_count_kernel<<<1, 1024>>>(as_float_args(la));
    QueueArgs q{b.s,
                b.t,
                b.V,
                b.rows,
                S,
                W,
                R,
                chunks,
                inv_t,
                0.5f,
                b.part1,
                b.part2,
                b.counters,
                b.counters + 1,
                b.counters + 1 + chunks,
                stats,
                b.scale,
                b.grad_scale,
                grad ? b.grad_q : nullptr,
                b.spins};
    kernel()<<<blocks, threads>>>(q);
    distill_finalize_kernel<<<1, 1024>>>(as_float_args(la));
    CHECK(cudaGetLastError());
  }
};

// The queue's forward against the library's: loss, row stats, the gradient (the library's
// backward on the queue's stats, or the one the queue wrote), and ties.
void check(const Variant& v, Buffers& b, float inv_t, int num_sms) {
  const int64_t n = b.rows * b.V;
  DistillArgs<bf16> la =
      library_args(b, v.div, inv_t, v.grad ? b.grad_lib : nullptr, b.stats_lib, num_sms);
  CHECK(distill_forward<bf16>(la, 0));
  if (!v.grad) {
    la.grad = b.grad_lib;
    CHECK(distill_backward<bf16>(la, 0));
  }
  float loss_lib, loss_q;
  CHECK(cudaMemcpy(&loss_lib, b.loss, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemset(b.stats, 0xff, b.rows * kStatsPerRow * 4));
  CHECK(cudaMemset(b.grad_q, 0xff, n * 2));
  CHECK(cudaMemset(b.loss, 0xff, 4));
  v.run(b, inv_t, b.stats);
  CHECK(cudaMemcpy(&loss_q, b.loss, 4, cudaMemcpyDeviceToHost));
  if (!v.grad) {
    DistillArgs<bf16> lb = library_args(b, v.div, inv_t, b.grad_q, b.stats, num_sms);
    CHECK(distill_backward<bf16>(lb, 0));
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<float> sl(b.rows * kStatsPerRow), sq(b.rows * kStatsPerRow);
  CHECK(cudaMemcpy(sl.data(), b.stats_lib, sl.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(sq.data(), b.stats, sq.size() * 4, cudaMemcpyDeviceToHost));
  double stat_err = 0;
  for (size_t i = 0; i < sl.size(); ++i)
    stat_err = std::max(
        stat_err, std::fabs(double(sl[i]) - sq[i]) / std::max(1e-3, std::fabs(double(sl[i]))));
  std::vector<uint16_t> gl(n), gq(n);
  CHECK(cudaMemcpy(gl.data(), b.grad_lib, n * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(gq.data(), b.grad_q, n * 2, cudaMemcpyDeviceToHost));
  double max_diff = 0, max_abs = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = bf2f(gl[i]), y = bf2f(gq[i]);
    max_abs = std::max(max_abs, std::fabs(x));
    if (gl[i] != gq[i]) {
      ++differ;
      max_diff = std::max(max_diff, std::isnan(y) ? INFINITY : std::fabs(x - y));
    }
  }
  const double rel_loss = std::fabs(double(loss_q) - loss_lib) / std::fabs(double(loss_lib));
  // TVD's sign(p - q) flips at the near-ties where the two forwards' normalisers (summed in
  // another order) round p or q the other way: a few elements differ by up to p * scale.
  const double tol = v.div == kTvd ? 1.0 : 1e-2;
  const bool ok =
      rel_loss < 1e-5 && stat_err < 1e-4 && max_diff <= max_abs * tol && differ <= n / 200;
  std::printf(
      "  check %s %-55s loss %.9g (library %.9g, rel %.1e), stats rel %.1e; gradient: %lld of "
      "%lld differ, by <= %.3g (max |g| %.3g): %s\n",
      div_name(v.div), v.name().c_str(), loss_q, loss_lib, rel_loss, stat_err,
      static_cast<long long>(differ), static_cast<long long>(n), max_diff, max_abs,
      ok ? "ok" : "FAILED");
  if (!ok) g_failed = true;
  // Ties: the teacher is the student.
  CHECK(cudaMemcpy(b.t, b.s, n * 2, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemset(b.grad_q, 0xff, n * 2));
  v.run(b, inv_t, b.stats);
  if (!v.grad) {
    DistillArgs<bf16> lb = library_args(b, v.div, inv_t, b.grad_q, b.stats, num_sms);
    CHECK(distill_backward<bf16>(lb, 0));
  }
  CHECK(cudaMemcpy(&loss_q, b.loss, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(gq.data(), b.grad_q, n * 2, cudaMemcpyDeviceToHost));
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += (gq[i] & 0x7fff) != 0;
  const bool tie_ok = loss_q == 0.f && nonzero == 0;
  std::printf("  ties  %s: loss %g, %lld nonzero gradient elements: %s\n", div_name(v.div), loss_q,
              static_cast<long long>(nonzero), tie_ok ? "ok" : "FAILED");
  if (!tie_ok) g_failed = true;
}

void fill(Buffers& b) {
  const int64_t n = b.rows * b.V;
  fill_logits<<<1024, 256>>>(b.s, n, 1u, 16.f);
  fill_logits<<<1024, 256>>>(b.t, n, 2u, 16.f);
  CHECK(cudaGetLastError());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> vocab = {151936, 128256};
  int64_t rows = 8192;
  bool do_check = true;
  // --variants T:S:MB,...: threads, slices per row, MB of s and t per chunk (else the list below)
  std::vector<std::tuple<int, int, double>> chosen;
  std::vector<int64_t> divs = {kTvd, kJsd, kForwardKl};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-check") == 0) do_check = false;
    if (std::strcmp(argv[i], "--v") == 0 && i + 1 < argc) vocab = {std::atoll(argv[++i])};
    if (std::strcmp(argv[i], "--variants") == 0 && i + 1 < argc) {
      for (const char* p = argv[++i]; *p != 0;) {
        int t = 0, sl = 0;
        double mb = 0;
        int used = 0;
        if (std::sscanf(p, "%d:%d:%lf%n", &t, &sl, &mb, &used) != 3) break;
        chosen.emplace_back(t, sl, mb);
        p += used;
        if (*p == ',') ++p;
      }
    }
    if (std::strcmp(argv[i], "--divergences") == 0 && i + 1 < argc) {
      divs.clear();
      const std::string list = argv[++i];
      if (list.find("tvd") != std::string::npos) divs.push_back(kTvd);
      if (list.find("jsd") != std::string::npos) divs.push_back(kJsd);
      if (list.find("forward_kl") != std::string::npos) divs.push_back(kForwardKl);
    }
  }
  for (const int64_t V : vocab) {
    if (V <= 0 || V % 8 != 0) {  // 16-byte rows and slices
      std::fprintf(stderr, "distill_row_queue: --v must be a positive multiple of 8; got %lld\n",
                   static_cast<long long>(V));
      return 2;
    }
  }
  int num_sms = 0;
  CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const float inv_t = 1.f / 2.f;
  std::printf(
      "bf16, T = 2, batchmean; ms, median of 15 x 10 calls; %%5 / %%3: of the 5- / 3-stream "
      "limit at the measured copy bandwidth\n\n");
  std::printf("| rows x V | divergence | what | ms | %% of limit | vs library |\n");
  std::printf("|---|---|---|---:|---:|---:|\n");
  for (const int64_t V : vocab) {
    Buffers b{};
    b.rows = rows;
    b.V = V;
    const int64_t n = rows * V;
    CHECK(cudaMalloc(&b.s, n * 2));
    CHECK(cudaMalloc(&b.t, n * 2));
    CHECK(cudaMalloc(&b.grad_lib, n * 2));
    CHECK(cudaMalloc(&b.grad_q, n * 2));
    CHECK(cudaMalloc(&b.stats, rows * kStatsPerRow * 4));
    CHECK(cudaMalloc(&b.stats_lib, rows * kStatsPerRow * 4));
    CHECK(cudaMalloc(&b.scale, 4));
    CHECK(cudaMalloc(&b.loss, 4));
    CHECK(cudaMalloc(&b.grad_scale, 4));
    CHECK(cudaMalloc(&b.part1, rows * 64 * sizeof(MaxSum2)));
    CHECK(cudaMalloc(&b.part2, rows * 64 * sizeof(float2)));
    CHECK(cudaMalloc(&b.counters, (1 + 2 * rows) * sizeof(unsigned)));
    CHECK(cudaMalloc(&b.spins, 2 * sizeof(unsigned long long)));
    const float half = 0.5f;
    CHECK(cudaMemcpy(b.grad_scale, &half, 4, cudaMemcpyHostToDevice));
    fill(b);
    const float copy_ms =
        time_ms([&] { CHECK(cudaMemcpyAsync(b.grad_q, b.s, n * 2, cudaMemcpyDeviceToDevice)); });
    const double bw = 2.0 * n * 2 / (copy_ms * 1e-3);
    const double lim5 = 5.0 * n * 2 / bw * 1e3, lim3 = 3.0 * n * 2 / bw * 1e3;
    std::printf(
        "| %lld x %lld | | copy %.0f GB/s; limits: 5-stream %.3f, 3-stream %.3f ms | | | |\n",
        static_cast<long long>(rows), static_cast<long long>(V), bw / 1e9, lim5, lim3);
    for (const int64_t div : divs) {
      const bool kl = div == kForwardKl;
      // The library: forward; forward + backward; the KLs' forward with the gradient.
      const auto lib_f = [&] {
        CHECK(distill_forward<bf16>(library_args(b, div, inv_t, nullptr, b.stats_lib, num_sms), 0));
      };
      const auto lib_fb = [&] {
        DistillArgs<bf16> a = library_args(b, div, inv_t, nullptr, b.stats_lib, num_sms);
        CHECK(distill_forward<bf16>(a, 0));
        a.grad = b.grad_lib;
        CHECK(distill_backward<bf16>(a, 0));
      };
      const auto lib_g = [&] {
        CHECK(distill_forward<bf16>(library_args(b, div, inv_t, b.grad_lib, b.stats_lib, num_sms),
                                    0));
      };
      const float f_ms = time_ms(lib_f), fb_ms = time_ms(lib_fb);
      const float g_ms = kl ? time_ms(lib_g) : 0.f;
      const auto row = [&](const std::string& what, float ms, double lim, float base) {
        std::printf("| %lld x %lld | %s | %s | %.3f | %.0f%% | %s |\n",
                    static_cast<long long>(rows), static_cast<long long>(V), div_name(div),
                    what.c_str(), ms, 100.0 * lim / ms,
                    base > 0 ? (std::to_string(base / ms).substr(0, 4) + "x").c_str() : "");
      };
      row("library forward (% of 2 streams)", f_ms, lim5 * 2 / 5, 0);
      row("library forward + backward (%5)", fb_ms, lim5, 0);
      if (kl) row("library forward with grad_scale (%3)", g_ms, lim3, 0);
      std::vector<Variant> vs;
      // The variants of docs/benchmarks.md's session-47 runs.
      const std::vector<std::tuple<int, int, double>> list =
          !chosen.empty() ? chosen
          : kl            ? std::vector<std::tuple<int, int, double>>{{256, 8, 20},
                                                                      {256, 16, 8},
                                                                      {256, 16, 12},
                                                                      {256, 32, 8},
                                                                      {128, 16, 8}}
                          : std::vector<std::tuple<int, int, double>>{
                                {256, 8, 20}, {256, 16, 8},  {256, 16, 12}, {256, 16, 16},
                                {256, 32, 8}, {256, 32, 12}, {128, 16, 8}};
      for (const auto& [thr, S, mb] : list) vs.push_back(Variant{div, kl, thr, S, mb});
      bool first = true;
      for (Variant& v : vs) {
        if (!v.setup(rows, V)) {
          std::printf(
              "  %d threads, %d slices: not a block size of this kernel (32 to 256, a "
              "multiple of 32) or a slice count of its buffers (1 to 64); skipped\n",
              v.threads, v.S);
          continue;
        }
        if (do_check && (first || V == vocab.front())) {
          Buffers part = b;
          part.rows = std::min<int64_t>(rows, 1024);
          Variant pv = v;
          (void)pv.setup(part.rows, V);
          check(pv, part, inv_t, num_sms);
          fill(b);
          first = false;
        }
        const float q_ms = time_ms([&] { v.run(b, inv_t, b.stats); });
        CHECK(cudaMemset(b.spins, 0, 16));
        v.run(b, inv_t, b.stats);
        unsigned long long sp[2];
        CHECK(cudaMemcpy(sp, b.spins, 16, cudaMemcpyDeviceToHost));
        std::printf("  %s %s: %llu of %lld phase-2 items waited, %llu polls of 100 ns\n",
                    div_name(div), v.name().c_str(), sp[0],
                    static_cast<long long>(v.R * v.S * v.chunks), sp[1]);
        if (v.grad) {
          row(v.name() + ", with the gradient (%3)", q_ms, lim3, g_ms);
        } else {
          row(v.name() + ", forward (% of 2 streams)", q_ms, lim5 * 2 / 5, f_ms);
          const float qfb_ms = time_ms([&] {
            v.run(b, inv_t, b.stats);
            CHECK(
                distill_backward<bf16>(library_args(b, div, inv_t, b.grad_q, b.stats, num_sms), 0));
          });
          row(v.name() + ", + library backward (%5)", qfb_ms, lim5, fb_ms);
        }
      }
    }
    std::fflush(stdout);
    for (void* p : {(void*)b.s, (void*)b.t, (void*)b.grad_lib, (void*)b.grad_q, (void*)b.stats,
                    (void*)b.stats_lib, (void*)b.scale, (void*)b.loss, (void*)b.grad_scale,
                    (void*)b.part1, (void*)b.part2, (void*)b.counters, (void*)b.spins})
      CHECK(cudaFree(p));
  }
  if (g_failed) std::printf("\nA check FAILED\n");
  return g_failed ? 1 : 0;
}

// Framework-free CUDA kernels of lossfns::cross_entropy_loss. Raw pointers, sizes and a
// cudaStream_t; every launcher returns the cudaError_t of its launches. Includes nothing from
// Torch; the adapter (cross_entropy_cuda.cu) checks inputs, maps dtypes and takes the stream.
//
// Data movement (memory-bound at real vocabularies): the forward reads each row once, one block
// per row, with an online softmax (a running max and a sum of exp rescaled when the max grows:
// one exp2 per element and one per 16-byte vector), then one scalar read of the target logit; a
// one-block finalize sums the rows' losses in double and counts the labels on the device. The
// backward reads the logits once more and writes the gradient once. Per element the math is
// float, with exp2 of log2(e)-scaled logits, as distill's kernels (whose vector loads and
// dtype conversions this file uses).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cross_entropy_common.h"
#include "distill_cuda_kernel.cuh"
#include "row_reduce.cuh"

namespace lossfns::kernels {

template <typename T>
struct CrossEntropyArgs {
  const T* x;      // (rows, width) logits, unit stride inside a row
  int64_t stride;  // row stride, elements
  int64_t width;   // columns of a row (the gradient's width)
  int64_t V;       // columns that count (past V: padding, never read, gradient 0)
  int64_t rows;
  const int64_t* labels;  // (rows,)
  int64_t ignore_index;
  Reduction reduction;
  float* stats;     // (rows, kCeStatsPerRow): max and log2 of the sum, of log2-scaled logits
  float* row_loss;  // (rows,): the rows' losses (the output for 'none'; ignored rows 0)
  float* scale;     // 1 value: the reduction's scale (written by the finalize)
  float* loss;      // 1 value: the reduced loss (written by the finalize; unused for 'none')
  // Backward only: the gradient (rows, width) contiguous, and grad_output: 1 value (reduced) or
  // (rows,) ('none').
  T* grad;
  const float* grad_output;
  int num_sms;
};

namespace ce_detail {

// Vec, unpack, load_vec, load_vecs, scaled, prob, prob_norm, kLog2e, kLn2, MaxSum: distill's,
// shared (to_float, from_float: cuda_common.cuh).
using namespace distill_detail;

// One vector of a row added to a normaliser (MaxSum, combine, add_scaled: distill's).
template <typename T>
__device__ __forceinline__ MaxSum add_vec(MaxSum ms, const Vec<T>& v) {
  constexpr int N = Vec<T>::N;
  float x[N];
  unpack(v, x);
  return add_scaled<N>(ms, x, kLog2e);
}

// Forward: one block per row; kU vectors per thread in flight.
template <typename T>
__global__ void ce_forward_kernel(CrossEntropyArgs<T> a) {
  constexpr int N = Vec<T>::N, kU = 2;
  __shared__ unsigned red[block_reduce_words<MaxSum>()];
  const int64_t row = blockIdx.x, y = a.labels[row];
  float* st = a.stats + row * kCeStatsPerRow;
  if (y == a.ignore_index) {
    if (threadIdx.x == 0) st[0] = st[1] = a.row_loss[row] = 0.f;
    return;
  }
  const T* x = a.x + row * a.stride;
  const bool vx = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t step = int64_t(blockDim.x) * N;
  MaxSum ms{-INFINITY, 0.f};
  for (int64_t j0 = int64_t(threadIdx.x) * N; j0 < a.V; j0 += kU * step) {
    Vec<T> v[kU];
    load_vecs(x, j0, step, a.V, vx, v);
#pragma unroll
    for (int u = 0; u < kU; ++u) ms = add_vec(ms, v[u]);
  }
  ms = block_allreduce(
      ms, [](MaxSum p, MaxSum q) { return combine(p, q); }, MaxSum{-INFINITY, 0.f}, red);
  if (threadIdx.x == 0) {
    // A label out of range: the row's loss is NaN (no read out of bounds; see
    // cross_entropy_common.h).
    const float xy = ce_label_in_range(y, a.V) ? scaled(to_float(x[y]), kLog2e) : NAN;
    const float ls = log2f(ms.sum);
    st[0] = ms.max;
    st[1] = ls;
    a.row_loss[row] = ((ms.max - xy) + ls) * kLn2;  // max - x_y is exact near the max
  }
}

// Sums of the finalize: the rows' losses and the rows not ignored.
struct LossCount {
  double sum;
  long long valid;
};

// The reduced loss and the reduction's scale from the rows' losses (reads no logits). One block.
template <typename T>
__global__ void ce_finalize_kernel(CrossEntropyArgs<T> a) {
  __shared__ unsigned red[block_reduce_words<LossCount>()];
  LossCount lc{0.0, 0};
  for (int64_t r = threadIdx.x; r < a.rows; r += blockDim.x) {
    lc.sum += a.row_loss[r];
    lc.valid += a.labels[r] != a.ignore_index ? 1 : 0;
  }
  lc = block_allreduce(
      lc,
      [](LossCount p, LossCount q) {
        return LossCount{p.sum + q.sum, p.valid + q.valid};
      },
      LossCount{0.0, 0}, red);
  if (threadIdx.x == 0) {
    const double sc = ce_reduction_scale<double>(a.reduction, lc.valid);
    *a.scale = static_cast<float>(sc);
    if (a.reduction != kNone) *a.loss = static_cast<float>(lc.sum * sc);
  }
}

// Backward: grid (rows, chunks); one pass over the logits, the gradient written once.
template <typename T>
__global__ void __launch_bounds__(256)
    ce_backward_kernel(CrossEntropyArgs<T> a, int64_t chunk_cols) {
  constexpr int N = Vec<T>::N, kU = 2;
  const int64_t row = blockIdx.x, y = a.labels[row];
  const int64_t begin = int64_t(blockIdx.y) * chunk_cols;
  const int64_t end = begin + chunk_cols < a.width ? begin + chunk_cols : a.width;
  T* grad = a.grad + row * a.width;
  if (y == a.ignore_index) {
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) grad[j] = from_float<T>(0.f);
    return;
  }
  const T* x = a.x + row * a.stride;
  const bool vx = reinterpret_cast<uintptr_t>(x) % 16 == 0,
             vg = reinterpret_cast<uintptr_t>(grad) % 16 == 0;
  const float* st = a.stats + row * kCeStatsPerRow;
  const ProbNorm norm = prob_norm(st[0], st[1]);
  // A label out of range, or a row without mass (every column -inf, max -inf: no softmax): the
  // row's gradient is NaN (as its loss), no column is the target.
  const float go = ce_label_in_range(y, a.V) && st[0] != -INFINITY
                       ? (a.reduction == kNone ? a.grad_output[row] : a.grad_output[0] * *a.scale)
                       : NAN;
  const int64_t step = int64_t(blockDim.x) * N;
  for (int64_t j0 = begin + int64_t(threadIdx.x) * N; j0 < end; j0 += kU * step) {
    Vec<T> v[kU];
    load_vecs(x, j0, step, a.V, vx, v);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t j = j0 + u * step;
      if (j >= end) break;
      Vec<T> out;
      float x[N];
      unpack(v[u], x);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float p, lp;
        prob(x[k], kLog2e, norm, p, lp);
        const float g = go * (p - (j + k == y ? 1.f : 0.f));
        out.v[k] = from_float<T>(j + k < a.V ? g : 0.f);  // padding: 0 whatever grad_output is
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

}  // namespace ce_detail

// Forward: stats, row_loss, scale and (reduced) loss. a.rows >= 1.
template <typename T>
cudaError_t cross_entropy_forward(const CrossEntropyArgs<T>& a, cudaStream_t stream) {
  using namespace ce_detail;
  constexpr int64_t N = Vec<T>::N;
  // ~4 vectors per thread (two loops of kU = 2), 64 to 256 threads: small blocks put several rows
  // on an SM, so one row's block reduction and load latencies overlap another's loads (H200, bf16,
  // session 14, `bench/cross_entropy_bench.py`: the forward at 16384 x 32000 0.50 -> 0.39 ms,
  // 16384 x 49152 0.69 -> 0.56, 8192 x 151936 0.85 -> 0.80 against up to 1024 threads).
  const int64_t vecs = (a.V + N - 1) / N;
  const int64_t threads =
      std::min<int64_t>(256, std::max<int64_t>(64, ((vecs + 3) / 4 + 31) / 32 * 32));
  ce_forward_kernel<T><<<unsigned(a.rows), unsigned(threads), 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ce_finalize_kernel<T><<<1, 1024, 0, stream>>>(a);
  return cudaGetLastError();
}

// Backward: a.grad (rows, width) from a.grad_output and the forward's stats and scale.
template <typename T>
cudaError_t cross_entropy_backward(const CrossEntropyArgs<T>& a, cudaStream_t stream) {
  using namespace ce_detail;
  constexpr int64_t N = Vec<T>::N;
  // Columns per block: 8 vectors per thread, fewer when there are too few rows to fill the device.
  int64_t chunk = 256 * N * 8;
  while (chunk > 256 * N && a.rows * ((a.width + chunk - 1) / chunk) < int64_t(a.num_sms) * 8)
    chunk /= 2;
  while ((a.width + chunk - 1) / chunk > 65535) chunk *= 2;  // gridDim.y's limit: wider blocks
  const int64_t chunks = (a.width + chunk - 1) / chunk;
  ce_backward_kernel<T><<<dim3(unsigned(a.rows), unsigned(chunks)), 256, 0, stream>>>(a, chunk);
  return cudaGetLastError();
}

}  // namespace lossfns::kernels

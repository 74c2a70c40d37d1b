// Framework-free CUDA kernels of distill::cuda::ColumnSum (col_sum_cuda.h): the sums over the
// rows of a contiguous (rows, n) matrix, in fp32, for the bias gradient of a linear layer (the
// sum over tokens of its output's gradient) and the norms' per-block weight and bias partials.
// ATen's sum over dim 0 of a bf16 (16384, n) gradient ran at ~44% of the H200's copy bandwidth
// (docs/benchmarks.md, session 17); these read the matrix once in 16-byte vectors.
//
// Two launches, deterministic (the order of every sum depends on the shape and the launch only):
//  1. blocks of 32 lanes x 8 warps over a tile of 32 vectors of columns and a range of rows: each
//     lane sums its vector's columns over the warp's rows (row0 + warp, + 8, ...), the 8 warps'
//     sums are added in warp order through shared memory, and the tile's result goes to row
//     blockIdx.y of the fp32 partials (splits, n);
//  2. one thread per column adds the splits' partials in order.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "convert.cuh"

namespace distill::kernels {

constexpr int kColSumWarps = 8;

// The end of a column-sum tile: each lane's kV sums (acc) through shared memory, each of the
// tile's 32 * kV columns summed over the warps in order by one thread, into row blockIdx.y of the
// partials (splits, n). Every block of the tile's kernels calls it once, after its rows.
template <int kV>
__device__ __forceinline__ void ColumnSumTileToPartial(const float (&acc)[kV],
                                                       float* __restrict__ partial, int64_t n) {
  __shared__ float tile[kColSumWarps][32 * kV];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < kV; ++k) tile[warp][lane * kV + k] = acc[k];
  __syncthreads();
  for (int c = threadIdx.x; c < 32 * kV; c += 32 * kColSumWarps) {
    const int64_t col = int64_t(blockIdx.x) * 32 * kV + c;
    if (col >= n) continue;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kColSumWarps; ++w) s += tile[w][c];
    partial[int64_t(blockIdx.y) * n + col] = s;
  }
}

// kV: columns per lane (16 bytes of T when the rows are 16-byte aligned, else 1).
template <typename T, int kV>
__global__ void __launch_bounds__(32 * kColSumWarps)
    ColumnSumPartialKernel(const T* __restrict__ x, float* __restrict__ partial, int64_t rows,
                           int64_t n, int64_t rows_per_split) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t col0 = (int64_t(blockIdx.x) * 32 + lane) * kV;
  const int64_t r_begin = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r_end = r_begin + rows_per_split < rows ? r_begin + rows_per_split : rows;
  float acc[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = 0.f;
  if (col0 < n) {
#pragma unroll 4
    for (int64_t r = r_begin + warp; r < r_end; r += kColSumWarps) {
      const T* row = x + r * n + col0;
      if constexpr (kV > 1) {
        Pack16<T> v;
        v.raw = __ldg(reinterpret_cast<const uint4*>(row));
#pragma unroll
        for (int k = 0; k < kV; ++k) acc[k] += ToFloat(v.v[k]);
      } else {
        acc[0] += ToFloat(row[0]);
      }
    }
  }
  ColumnSumTileToPartial<kV>(acc, partial, n);
}

// (A template, float only, so that every .cu including this header may instantiate it.)
template <typename Acc>
__global__ void ColumnSumFinalKernel(const Acc* __restrict__ partial, Acc* __restrict__ out,
                                     int64_t n, int64_t splits) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  Acc s = 0.f;
#pragma unroll 8
  for (int64_t i = 0; i < splits; ++i) s += partial[i * n + col];  // loads ahead of the adds
  out[col] = s;
}

// Row splits for a (rows, n) matrix of T on a device of `sms` SMs, n > 0, for the vector path
// (`vec`) or the one-column-per-lane path: enough tiles for ~4 blocks per SM, at least 64 rows
// (8 per warp) per split.
template <typename T>
int64_t ColumnSumSplits(int64_t rows, int64_t n, int sms, bool vec) {
  const int64_t kV = vec ? 16 / int64_t(sizeof(T)) : 1;
  const int64_t tiles = (n + 32 * kV - 1) / (32 * kV);
  int64_t splits = (int64_t(sms) * 4 + tiles - 1) / tiles;
  const int64_t most = (rows + 63) / 64;
  if (splits > most) splits = most;
  return splits < 1 ? 1 : splits;
}

// out (n,) = the column sums of x (rows, n), contiguous; partial: ColumnSumSplits(...) * n floats.
// `vec`: x 16-byte aligned and n a multiple of 16 / sizeof(T).
template <typename T>
cudaError_t LaunchColumnSum(const T* x, float* partial, float* out, int64_t rows, int64_t n,
                            int64_t splits, bool vec, cudaStream_t stream) {
  constexpr int kV = 16 / int(sizeof(T));
  if (n == 0) return cudaSuccess;
  const int64_t rows_per_split = (rows + splits - 1) / splits;
  if (vec) {
    const dim3 grid(unsigned((n + 32 * kV - 1) / (32 * kV)), unsigned(splits));
    ColumnSumPartialKernel<T, kV>
        <<<grid, 32 * kColSumWarps, 0, stream>>>(x, partial, rows, n, rows_per_split);
  } else {
    const dim3 grid(unsigned((n + 31) / 32), unsigned(splits));
    ColumnSumPartialKernel<T, 1>
        <<<grid, 32 * kColSumWarps, 0, stream>>>(x, partial, rows, n, rows_per_split);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ColumnSumFinalKernel<float>
      <<<unsigned((n + 255) / 256), 256, 0, stream>>>(partial, out, n, splits);
  return cudaGetLastError();
}

}  // namespace distill::kernels

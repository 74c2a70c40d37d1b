// Framework-free CUDA kernels of the TVD loss. Raw pointers, sizes and a cudaStream_t; every
// launcher returns the cudaError_t of its launches. Includes nothing from Torch; the adapter
// (tvd_cuda.cu) checks inputs, maps dtypes and takes the current stream.
//
// Data movement (the loss is memory-bound): forward reads p and q once and writes 2-bit signs
// (BT*V/4 bytes) and one float per row; backward reads the signs and writes grad once. Loads and
// stores are 16 bytes wide when rows are 16-byte aligned, with several loads in flight per thread.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "tvd_common.h"

namespace lossfns::kernels {

template <typename T>
struct TvdForwardArgs {
  const T* p;                 // (rows, V), unit stride inside a row
  const T* q;                 // (rows, V), unit stride inside a row
  int64_t p_row_stride;       // elements
  int64_t q_row_stride;       // elements
  const int64_t* labels;      // (rows,) contiguous, or nullptr: every row counts
  int64_t ignore_index;
  int64_t rows;
  int64_t V;
  int64_t chunks;             // blocks per row (set by tvd_forward from num_sms; >= 1)
  int num_sms;                // multiprocessors of the device (sizes the grid)
  float* row_loss;            // (rows, chunks) partial sums of |p - q| (0 for ignored rows), or
                              // nullptr ('none'); rows * max_chunks(V) floats suffice
  float* elem_loss;           // (rows, V) contiguous 0.5*|p - q| ('none'), or nullptr
  uint8_t* signs;             // (rows, sign_row_pitch(V)) packed 2-bit codes, or nullptr
};

template <typename T>
struct TvdBackwardArgs {
  const uint8_t* signs;       // (rows, sign_row_pitch(V))
  int64_t rows;
  int64_t V;
  const float* grad_output;   // 1 value (reduced loss), or (rows, V) contiguous ('none')
  const float* scale;         // 1 value from the forward's finalize (unused for 'none')
  T* grad;                    // (rows, V) contiguous
  int num_sms;                // multiprocessors of the device (sizes the grid)
};

namespace detail {

constexpr int kThreads = 256;  // per block; a block handles one chunk of one row
constexpr int kUnroll = 4;     // independent 16-byte accesses in flight per thread and tensor
constexpr int kBlocksPerSm = 2048 / kThreads;

// Rows are split into `chunks` blocks when there are too few rows to fill the device (e.g.
// BT = 512), but never into chunks of fewer than kThreads * kUnroll groups.
inline int64_t chunks_per_row(int64_t rows, int64_t groups, int num_sms) {
  const int64_t want = 2 * int64_t{num_sms} * kBlocksPerSm;  // two waves of resident blocks
  const int64_t by_rows = (want + rows - 1) / (rows > 0 ? rows : 1);
  const int64_t by_size = groups / (kThreads * kUnroll);
  const int64_t c = by_rows < by_size ? by_rows : by_size;
  return c < 1 ? 1 : (c > 65535 ? 65535 : c);
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Groups [begin, end) of a row that chunk `chunk` of `chunks` handles. Chunks start at multiples
// of 32 groups, so every warp's sign stores start on a 32-byte sector boundary.
struct ChunkRange {
  int64_t begin, end;
};
__device__ __forceinline__ ChunkRange chunk_range(int64_t groups, int64_t chunk, int64_t chunks) {
  const int64_t per_chunk = ((groups + chunks - 1) / chunks + 31) / 32 * 32;
  const int64_t begin = chunk * per_chunk < groups ? chunk * per_chunk : groups;
  return {begin, begin + per_chunk < groups ? begin + per_chunk : groups};
}

template <typename Acc>
__device__ __forceinline__ Acc block_sum(Acc v, Acc* shared) {  // shared: kThreads/32 entries
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? shared[lane] : Acc(0);
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // valid in thread 0
}

// N consecutive elements: accumulate |p - q|, return their packed 2-bit codes.
template <int N, bool kElemLoss, typename T>
__device__ __forceinline__ uint32_t tvd_elems(const T* pe, const T* qe, float& acc, float* el) {
  uint32_t bits = 0;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float d = to_float(pe[k]) - to_float(qe[k]);
    acc += fabsf(d);
    bits |= sign_code(d) << (2 * k);
    if constexpr (kElemLoss) el[k] = 0.5f * fabsf(d);
  }
  return bits;
}

template <typename T, bool kVec, bool kSaveSigns, bool kElemLoss>
__global__ void __launch_bounds__(kThreads) tvd_forward_kernel(TvdForwardArgs<T> a) {
  constexpr int N = kVec ? 16 / sizeof(T) : kSignsPerByte;  // elements per group (one thread step)
  __shared__ float shared[kThreads / 32];
  const int64_t row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t V = a.V;
  const int64_t groups = V / N;  // full groups; the last chunk also takes the < N tail elements
  const ChunkRange range = chunk_range(groups, chunk, chunks);
  const int64_t g_begin = range.begin, g_end = range.end;
  const bool last = chunk == chunks - 1;
  uint8_t* srow = kSaveSigns ? a.signs + row * sign_row_pitch(V) : nullptr;
  float* erow = kElemLoss ? a.elem_loss + row * V : nullptr;

  if (a.labels != nullptr && a.labels[row] == a.ignore_index) {  // no loss, no gradient
    if constexpr (kSaveSigns) {  // zero this chunk's sign bytes (all of them in the last chunk)
      const int64_t b_begin = g_begin * N / kSignsPerByte;
      const int64_t b_end = last ? sign_row_pitch(V) : g_end * N / kSignsPerByte;
      for (int64_t b = b_begin + threadIdx.x; b < b_end; b += kThreads) srow[b] = 0;
    }
    if constexpr (kElemLoss) {
      const int64_t e_end = last ? V : g_end * N;
      for (int64_t j = g_begin * N + threadIdx.x; j < e_end; j += kThreads) erow[j] = 0.f;
    }
    if (a.row_loss != nullptr && threadIdx.x == 0) a.row_loss[row * chunks + chunk] = 0.f;
    return;
  }

  const T* prow = a.p + row * a.p_row_stride;
  const T* qrow = a.q + row * a.q_row_stride;
  float acc = 0.f;
  float el[N];
  auto emit = [&](int64_t i, uint32_t bits) {  // i: index of an N-element group
    if constexpr (kSaveSigns) {
      if constexpr (N == 8) reinterpret_cast<uint16_t*>(srow)[i] = static_cast<uint16_t>(bits);
      else srow[i] = static_cast<uint8_t>(bits);
    }
    if constexpr (kElemLoss)
#pragma unroll
      for (int k = 0; k < N; ++k) erow[i * N + k] = el[k];
  };

  if constexpr (kVec) {
    const uint4* p4 = reinterpret_cast<const uint4*>(prow);
    const uint4* q4 = reinterpret_cast<const uint4*>(qrow);
    int64_t i = g_begin + threadIdx.x;
    for (; i + (kUnroll - 1) * kThreads < g_end; i += kUnroll * kThreads) {
      uint4 pv[kUnroll], qv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        pv[u] = __ldcs(p4 + i + u * kThreads);
        qv[u] = __ldcs(q4 + i + u * kThreads);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        emit(i + u * kThreads, tvd_elems<N, kElemLoss>(reinterpret_cast<const T*>(&pv[u]),
                                                       reinterpret_cast<const T*>(&qv[u]), acc, el));
    }
    for (; i < g_end; i += kThreads) {
      const uint4 pv = __ldcs(p4 + i), qv = __ldcs(q4 + i);
      emit(i, tvd_elems<N, kElemLoss>(reinterpret_cast<const T*>(&pv), reinterpret_cast<const T*>(&qv),
                                      acc, el));
    }
  } else {
    // Rows not 16-byte aligned: groups of 4 elements (one sign byte) per thread step.
    for (int64_t i = g_begin + threadIdx.x; i < g_end; i += kThreads)
      emit(i, tvd_elems<N, kElemLoss>(prow + i * N, qrow + i * N, acc, el));
  }
  // Fewer than N trailing elements share sign bytes: one thread of the last chunk writes them all.
  const int64_t tail_start = groups * N;
  if (last && threadIdx.x == 0 && tail_start < V) {
    uint32_t bits = 0;
    for (int64_t j = tail_start; j < V; ++j) {
      const float d = to_float(prow[j]) - to_float(qrow[j]);
      acc += fabsf(d);
      bits |= sign_code(d) << (2 * (j - tail_start));
      if constexpr (kElemLoss) erow[j] = 0.5f * fabsf(d);
    }
    if constexpr (kSaveSigns)
      for (int64_t b = tail_start / kSignsPerByte; b * kSignsPerByte < V; ++b)
        srow[b] = static_cast<uint8_t>(bits >> (8 * (b - tail_start / kSignsPerByte)));
  }
  if (a.row_loss != nullptr) {
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) a.row_loss[row * chunks + chunk] = acc;
  }
}

// One block: total loss over rows (in double), the non-ignored row count, the reduction's scale.
__global__ void __launch_bounds__(kThreads)
tvd_finalize_kernel(const float* row_loss, int64_t chunks, const int64_t* labels, int64_t ignore_index,
                    int64_t rows, int64_t V, int64_t reduction, float* loss, float* scale) {
  __shared__ double shared_sum[kThreads / 32];
  __shared__ double shared_cnt[kThreads / 32];
  double sum = 0.0, cnt = 0.0;
  for (int64_t i = threadIdx.x; i < rows * chunks; i += kThreads) sum += row_loss[i];
  for (int64_t r = threadIdx.x; r < rows; r += kThreads)
    cnt += (labels == nullptr || labels[r] != ignore_index) ? 1.0 : 0.0;
  sum = block_sum(sum, shared_sum);
  cnt = block_sum(cnt, shared_cnt);
  if (threadIdx.x == 0) {
    const double s = reduction_scale<double>(reduction, static_cast<int64_t>(cnt), V);
    *loss = static_cast<float>(0.5 * sum * s);
    *scale = static_cast<float>(s);
  }
}

// The gradient value of a 2-bit code, by selects: a table indexed at run time would live in local
// memory (a load per element).
template <typename T>
struct Decoder {
  T pos, neg, zero;  // 0.5*scale*g, -0.5*scale*g, 0*(0.5*scale*g) (NaN if that is not finite)
  __device__ __forceinline__ T operator()(uint32_t bits) const {
    const uint32_t code = bits & 3u;
    return code == kPos ? pos : (code == kNeg ? neg : zero);
  }
};

// kTh threads, kU independent stores in flight per thread: measured on an H200 with
// bench/tvd_kernel_variants: 512 x 2 for 16-bit types (1024 x 1 is ~1% faster at V = 128256,
// 8% slower at V = 32000), 1024 x 1 for fp32.
template <typename T, bool kVec, int kTh, int kU>
__global__ void __launch_bounds__(kTh) tvd_backward_kernel(TvdBackwardArgs<T> a) {
  constexpr int N = kVec ? 16 / sizeof(T) : 1;
  const int64_t row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t V = a.V;
  const uint8_t* srow = a.signs + row * sign_row_pitch(V);
  T* grow = a.grad + row * V;
  const float h = 0.5f * a.grad_output[0] * a.scale[0];  // device values: no host sync
  const Decoder<T> dec{from_float<T>(h), from_float<T>(-h), from_float<T>(0.f * h)};
  const int64_t groups = V / N;
  const ChunkRange range = chunk_range(groups, chunk, chunks);
  const int64_t g_begin = range.begin, g_end = range.end;
  auto decode = [&](uint32_t bits) {
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = dec(bits >> (2 * k));
    return out;
  };
  if constexpr (kVec) {
    auto load_bits = [&](int64_t i) -> uint32_t {
      return N == 8 ? reinterpret_cast<const uint16_t*>(srow)[i] : srow[i];
    };
    uint4* g4 = reinterpret_cast<uint4*>(grow);
    int64_t i = g_begin + threadIdx.x;
    for (; i + (kU - 1) * kTh < g_end; i += kU * kTh) {
      uint32_t bits[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) bits[u] = load_bits(i + u * kTh);
#pragma unroll
      for (int u = 0; u < kU; ++u) g4[i + u * kTh] = decode(bits[u]);
    }
    for (; i < g_end; i += kTh) g4[i] = decode(load_bits(i));
    if (chunk == chunks - 1)
      for (int64_t j = groups * N + threadIdx.x; j < V; j += kTh)
        grow[j] = dec(srow[j / kSignsPerByte] >> (2 * (j % kSignsPerByte)));
  } else {
    for (int64_t j = g_begin + threadIdx.x; j < g_end; j += kTh)
      grow[j] = dec(srow[j / kSignsPerByte] >> (2 * (j % kSignsPerByte)));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tvd_backward_none_kernel(TvdBackwardArgs<T> a) {
  const int64_t row = blockIdx.x;
  const uint8_t* srow = a.signs + row * sign_row_pitch(a.V);
  for (int64_t j = threadIdx.x; j < a.V; j += kThreads) {
    const uint32_t code = (srow[j / kSignsPerByte] >> (2 * (j % kSignsPerByte))) & 3u;
    a.grad[row * a.V + j] = from_float<T>(sign_value<float>(code) * (0.5f * a.grad_output[row * a.V + j]));
  }
}

inline bool aligned16(const void* ptr, int64_t row_stride_bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && row_stride_bytes % 16 == 0;
}

template <typename T, bool kVec, bool kSaveSigns, bool kElemLoss>
cudaError_t launch_forward(const TvdForwardArgs<T>& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.chunks));
  tvd_forward_kernel<T, kVec, kSaveSigns, kElemLoss><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, bool kVec>
cudaError_t launch_forward_sel(const TvdForwardArgs<T>& a, cudaStream_t stream) {
  const bool save = a.signs != nullptr, elem = a.elem_loss != nullptr;
  if (save && elem) return launch_forward<T, kVec, true, true>(a, stream);
  if (save) return launch_forward<T, kVec, true, false>(a, stream);
  if (elem) return launch_forward<T, kVec, false, true>(a, stream);
  return launch_forward<T, kVec, false, false>(a, stream);
}

}  // namespace detail

// Scratch floats that tvd_forward needs in a.row_loss for a reduced loss: rows * chunks.
template <typename T>
int64_t tvd_forward_scratch(int64_t rows, int64_t V, int num_sms) {
  return rows * detail::chunks_per_row(rows, V / (16 / int64_t(sizeof(T))), num_sms);
}

// Forward. Reduced losses (reduction != kNone) need a.row_loss (tvd_forward_scratch floats) and
// write the loss and the reduction's scale to *loss and *scale (device pointers). 'none' needs
// a.elem_loss. Two launches for reduced losses (rows pass + finalize), one for 'none'.
template <typename T>
cudaError_t tvd_forward(TvdForwardArgs<T> a, int64_t reduction, float* loss, float* scale, cudaStream_t stream) {
  const bool vec = detail::aligned16(a.p, a.p_row_stride * int64_t(sizeof(T))) &&
                   detail::aligned16(a.q, a.q_row_stride * int64_t(sizeof(T)));
  // The scratch is sized for vector groups; the scalar path's groups (4 elements) may ask for more
  // chunks, so it is capped at the same count.
  const int64_t vec_chunks = detail::chunks_per_row(a.rows, a.V / (16 / int64_t(sizeof(T))), a.num_sms);
  a.chunks = vec ? vec_chunks : std::min(vec_chunks, detail::chunks_per_row(a.rows, a.V / kSignsPerByte, a.num_sms));
  if (a.rows > 0) {
    const cudaError_t err = vec ? detail::launch_forward_sel<T, true>(a, stream)
                                : detail::launch_forward_sel<T, false>(a, stream);
    if (err != cudaSuccess) return err;
  }
  if (reduction == kNone) return cudaSuccess;
  detail::tvd_finalize_kernel<<<1, detail::kThreads, 0, stream>>>(a.row_loss, a.chunks, a.labels, a.ignore_index,
                                                                   a.rows, a.V, reduction, loss, scale);
  return cudaGetLastError();
}

// Backward: one launch, grad = sign * 0.5 * scale * grad_output (or * grad_output_ij for 'none').
template <typename T>
cudaError_t tvd_backward(const TvdBackwardArgs<T>& a, int64_t reduction, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  const unsigned rows = static_cast<unsigned>(a.rows);
  if (reduction == kNone) {
    detail::tvd_backward_none_kernel<T><<<rows, detail::kThreads, 0, stream>>>(a);
  } else if (detail::aligned16(a.grad, a.V * int64_t(sizeof(T)))) {
    constexpr int kTh = sizeof(T) == 4 ? 1024 : 512, kU = sizeof(T) == 4 ? 1 : 2;
    const dim3 grid(rows, static_cast<unsigned>(detail::chunks_per_row(a.rows, a.V / (16 / sizeof(T)), a.num_sms)));
    detail::tvd_backward_kernel<T, true, kTh, kU><<<grid, kTh, 0, stream>>>(a);
  } else {
    const dim3 grid(rows, static_cast<unsigned>(detail::chunks_per_row(a.rows, a.V, a.num_sms)));
    detail::tvd_backward_kernel<T, false, detail::kThreads, 1><<<grid, detail::kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace lossfns::kernels

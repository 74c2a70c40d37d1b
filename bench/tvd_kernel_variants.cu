// Workshop, not the library: times the TVD CUDA kernels (from lib/src/tvd_cuda_kernel.cuh),
// candidate forward and backward variants and probes against the device's own write and copy
// speed, on raw CUDA buffers.
// Prints a table. Build: part of bench/ when the CUDA kernels are built.
// Usage: tvd_kernel_variants [--legacy] [--pipelines] [--profile] [--l2] [--pdl] [--layout]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "tvd_cuda_kernel.cuh"

using namespace lossfns::kernels;

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// The workshop's own variants below are the 2-bit design the library used before its tiled
// 1-bit + tie-flag layout (docs/benchmarks.md quotes their timings); they keep that layout here.
namespace legacy {
constexpr int kSignsPerByte = 4;
inline __host__ __device__ int64_t pitch(int64_t V) { return ((V + kSignsPerByte - 1) / kSignsPerByte + 127) / 128 * 128; }
template <typename T>
struct Decoder {
  T pos, neg, zero;
  __device__ __forceinline__ T operator()(uint32_t bits) const {
    const uint32_t code = bits & 3u;
    return code == kPos ? pos : (code == kNeg ? neg : zero);
  }
};
// sign(d) as a 2-bit code (kPos, kNeg, or 0 for a tie or NaN), branch-free.
__device__ __forceinline__ uint32_t sign_code(float d) {
  return static_cast<uint32_t>(d > 0.f) | (static_cast<uint32_t>(d < 0.f) << 1);
}
// N consecutive elements: accumulate |p - q|, return their packed 2-bit codes.
template <int N, typename T>
__device__ __forceinline__ uint32_t tvd_elems(const T* pe, const T* qe, float& acc) {
  uint32_t bits = 0;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float d = detail::to_float(pe[k]) - detail::to_float(qe[k]);
    acc += fabsf(d);
    bits |= sign_code(d) << (2 * k);
  }
  return bits;
}
}  // namespace legacy

// The backward variants' common pieces: the decoder for 0.5 * grad_output * scale, and one
// 16-byte group of gradient from its packed signs.
template <typename T>
__device__ __forceinline__ legacy::Decoder<T> make_decoder(const float* go, const float* scale) {
  const float h = 0.5f * go[0] * scale[0];
  return {detail::from_float<T>(h), detail::from_float<T>(-h), detail::from_float<T>(0.f * h)};
}
template <typename T>
__device__ __forceinline__ uint4 decode_group(const legacy::Decoder<T>& dec, uint32_t bits) {
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int k = 0; k < int(16 / sizeof(T)); ++k) o[k] = dec(bits >> (2 * k));
  return out;
}

// Backward variant: kStream (st.global.cs or plain), kU (independent 16-byte stores in flight),
// kThreadsV (threads per block). One block per (row, chunk) as in the library.
template <typename T, bool kStream, int kU, int kThreadsV>
__global__ void __launch_bounds__(kThreadsV) backward_variant(const uint8_t* signs, int64_t V, const float* go,
                                                              const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const uint8_t* srow = signs + row * legacy::pitch(V);
  uint4* g4 = reinterpret_cast<uint4*>(grad + row * V);
  const legacy::Decoder<T> dec = make_decoder<T>(go, scale);
  const int64_t groups = V / N;
  auto decode = [&](uint32_t bits) { return decode_group(dec, bits); };
  auto load_bits = [&](int64_t i) -> uint32_t { return N == 8 ? reinterpret_cast<const uint16_t*>(srow)[i] : srow[i]; };
  int64_t i = threadIdx.x;
  for (; i + (kU - 1) * kThreadsV < groups; i += kU * kThreadsV) {
    uint32_t bits[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) bits[u] = load_bits(i + u * kThreadsV);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if constexpr (kStream) __stcs(g4 + i + u * kThreadsV, decode(bits[u]));
      else g4[i + u * kThreadsV] = decode(bits[u]);
    }
  }
  for (; i < groups; i += kThreadsV) g4[i] = decode(load_bits(i));
}

// Backward, flat and tail-free: a grid of resident blocks; block b takes the contiguous range
// [b*G/nb, (b+1)*G/nb) of the rows x groups space (G = rows * V/N; needs V % N == 0), so every
// block does the same work and no wave is partial. (row, col) advance incrementally, no division
// per group.
template <typename T, int kTh, int kU>
__global__ void __launch_bounds__(kTh) backward_flat(const uint8_t* signs, int64_t rows, int64_t V, const float* go,
                                                     const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T);
  const int64_t gpr = V / N, pitch = legacy::pitch(V), G = rows * gpr;
  const int64_t begin = G * blockIdx.x / gridDim.x, end = G * (blockIdx.x + 1) / gridDim.x;
  const legacy::Decoder<T> dec = make_decoder<T>(go, scale);
  auto decode = [&](uint32_t bits) { return decode_group(dec, bits); };
  auto load_bits = [&](int64_t row, int64_t col) -> uint32_t {
    const uint8_t* srow = signs + row * pitch;
    return N == 8 ? reinterpret_cast<const uint16_t*>(srow)[col] : srow[col];
  };
  uint4* g4 = reinterpret_cast<uint4*>(grad);
  int64_t i = begin + threadIdx.x;
  int64_t row[kU], col[kU];
  row[0] = i / gpr;
  col[0] = i - row[0] * gpr;
#pragma unroll
  for (int u = 1; u < kU; ++u) {
    row[u] = row[u - 1];
    col[u] = col[u - 1] + kTh;
    while (col[u] >= gpr) { col[u] -= gpr; ++row[u]; }
  }
  for (; i + (kU - 1) * kTh < end; i += kU * kTh) {
    uint32_t bits[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) bits[u] = load_bits(row[u], col[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u) g4[i + u * kTh] = decode(bits[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      col[u] += kU * kTh;
      while (col[u] >= gpr) { col[u] -= gpr; ++row[u]; }
    }
  }
  for (; i < end; i += kTh) {
    g4[i] = decode(load_bits(row[0], col[0]));
    col[0] += kTh;
    while (col[0] >= gpr) { col[0] -= gpr; ++row[0]; }
  }
}

// Backward with 2 groups (two 16-byte stores) per sign load: 32-bit sign loads for 16-bit types,
// 16-bit for fp32. One block per row, as in the library.
template <typename T, int kTh>
__global__ void __launch_bounds__(kTh) backward_wide(const uint8_t* signs, int64_t V, const float* go,
                                                     const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const uint8_t* srow = signs + row * legacy::pitch(V);
  uint4* g4 = reinterpret_cast<uint4*>(grad + row * V);
  const legacy::Decoder<T> dec = make_decoder<T>(go, scale);
  auto decode = [&](uint32_t bits) { return decode_group(dec, bits); };
  const int64_t pairs = V / (2 * N);
  for (int64_t i = threadIdx.x; i < pairs; i += kTh) {
    const uint32_t bits = N == 8 ? reinterpret_cast<const uint32_t*>(srow)[i] : reinterpret_cast<const uint16_t*>(srow)[i];
    g4[2 * i] = decode(bits);
    g4[2 * i + 1] = decode(bits >> (2 * N));
  }
}

// Fill over a contiguous range per resident block (the flat backward's pattern, without signs).
__global__ void fill_flat(uint4* dst, int64_t n16) {
  const int64_t begin = n16 * blockIdx.x / gridDim.x, end = n16 * (blockIdx.x + 1) / gridDim.x;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = make_uint4(1, 2, 3, 4);
}

// Interleaved sign tiles: a warp handles a tile of 32*K groups (K = 16/N: 2 for 16-bit types, 4
// for fp32), lane l takes groups l, l+32, ..., so every 16-byte load and store of the warp is
// coalesced, and the lane's K*N signs are one 32-bit word: a warp stores 128 aligned bytes of
// signs with one instruction. (Workshop version: full tiles only, rows of V % (32*K*N) elements
// are left short by their last partial tile.)
template <typename T, int kTh, int kT>
__global__ void __launch_bounds__(kTh) forward_tile(const T* p, const T* q, int64_t V, uint8_t* signs, float* partial) {
  constexpr int N = 16 / sizeof(T), K = 16 / N, TILE = 32 * K;
  __shared__ float shared[detail::kThreads / 32];
  static_assert(kTh == detail::kThreads, "block_sum assumes kThreads");
  const int64_t row = blockIdx.x;
  const uint4* p4 = reinterpret_cast<const uint4*>(p + row * V);
  const uint4* q4 = reinterpret_cast<const uint4*>(q + row * V);
  uint32_t* sw = reinterpret_cast<uint32_t*>(signs + row * legacy::pitch(V));
  const int64_t tiles = (V / N) / TILE;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int W = kTh / 32;
  float acc = 0.f;
  int64_t t = warp;
  for (; t + (kT - 1) * W < tiles; t += kT * W) {
    uint4 pv[kT][K], qv[kT][K];
#pragma unroll
    for (int u = 0; u < kT; ++u)
#pragma unroll
      for (int k = 0; k < K; ++k) {
        pv[u][k] = __ldcs(p4 + (t + u * W) * TILE + k * 32 + lane);
        qv[u][k] = __ldcs(q4 + (t + u * W) * TILE + k * 32 + lane);
      }
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      uint32_t w = 0;
#pragma unroll
      for (int k = 0; k < K; ++k)
        w |= legacy::tvd_elems<N>(reinterpret_cast<const T*>(&pv[u][k]), reinterpret_cast<const T*>(&qv[u][k]),
                                         acc) << (2 * N * k);
      sw[(t + u * W) * 32 + lane] = w;
    }
  }
  for (; t < tiles; t += W) {
    uint32_t w = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const uint4 pv = __ldcs(p4 + t * TILE + k * 32 + lane), qv = __ldcs(q4 + t * TILE + k * 32 + lane);
      w |= legacy::tvd_elems<N>(reinterpret_cast<const T*>(&pv), reinterpret_cast<const T*>(&qv), acc)
           << (2 * N * k);
    }
    sw[t * 32 + lane] = w;
  }
  acc = detail::block_sum(acc, shared);
  if (threadIdx.x == 0) partial[row] = acc;
}

template <typename T, int kTh>
__global__ void __launch_bounds__(kTh) backward_tile(const uint8_t* signs, int64_t V, const float* go,
                                                     const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T), K = 16 / N, TILE = 32 * K;
  const int64_t row = blockIdx.x;
  const uint32_t* sw = reinterpret_cast<const uint32_t*>(signs + row * legacy::pitch(V));
  uint4* g4 = reinterpret_cast<uint4*>(grad + row * V);
  const legacy::Decoder<T> dec = make_decoder<T>(go, scale);
  const int64_t tiles = (V / N) / TILE;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t t = warp; t < tiles; t += kTh / 32) {
    const uint32_t w = sw[t * 32 + lane];
#pragma unroll
    for (int k = 0; k < K; ++k) g4[t * TILE + k * 32 + lane] = decode_group(dec, w >> (2 * N * k));
  }
}

// Backward that stages its row's signs in shared memory with 16-byte loads first (one burst of
// reads per block), then writes the gradient with coalesced 16-byte stores. One block per row.
template <typename T, int kTh>
__global__ void __launch_bounds__(kTh) backward_smem(const uint8_t* signs, int64_t V, const float* go,
                                                     const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T);
  extern __shared__ uint4 s4[];
  const int64_t row = blockIdx.x;
  const int64_t groups = V / N, sign_bytes = groups * N / 4, n16 = (sign_bytes + 15) / 16;
  const uint4* src = reinterpret_cast<const uint4*>(signs + row * legacy::pitch(V));
  for (int64_t j = threadIdx.x; j < n16; j += kTh) s4[j] = __ldcs(src + j);
  __syncthreads();
  uint4* g4 = reinterpret_cast<uint4*>(grad + row * V);
  const legacy::Decoder<T> dec = make_decoder<T>(go, scale);
  const uint8_t* sb = reinterpret_cast<const uint8_t*>(s4);
  for (int64_t i = threadIdx.x; i < groups; i += kTh) {
    g4[i] = decode_group(dec, N == 8 ? reinterpret_cast<const uint16_t*>(sb)[i] : sb[i]);
  }
}

// The library's forward loop (one block per row, 256 threads, kUnroll loads in flight per
// tensor) with the sign stores swapped out, to tell what storing the signs costs:
//   kStore     plain stores to the row's signs, as the library does;
//   kAliased   every row's signs into one of 8 row slots (64 KB that stay in L2: no DRAM writes,
//              no L2 capacity taken);
//   kStreaming evict-first (st.global.cs) stores to the row's signs;
//   kFold      no stores: the signs are folded into one word per thread, written once at the end
//              (computing the signs without storing them);
//   kSmem      the row's signs collected in shared memory, written at the end with coalesced
//              16-byte stores (one burst per block; dynamic shared memory of the row's sign bytes).
// --layout: where the signs of concurrently running rows land. The 2-bit probe forward
// (forward_probe; G > 0 with kStore) and its backward (backward_layout), one block per row, a
// 16-bit (bf16) or 8-bit (fp32) code word per 16-byte group. G = 0: the row-major layout (row r's
// words contiguous, rows legacy::pitch(V) bytes apart). G > 0: group i of row r at word
// ((i / G) * rows + r) * G + i % G, so the same G-word column block of neighbouring rows lies side
// by side and rows in flight together write and read nearby addresses (fewer DRAM pages at a time).
template <int G>
__device__ __forceinline__ int64_t tm_index(int64_t row, int64_t i, int64_t rows, int64_t /*groups*/) {
  if constexpr (G == 0) return i;  // row-major: the caller's row pointer already includes the row
  else return ((i / G) * rows + row) * G + i % G;
}
enum class SignSink { kStore, kAliased, kStreaming, kFold, kSmem };

template <typename T, SignSink kSink, int G = 0>  // G > 0 (with kStore): the column-blocked layout of --layout
__global__ void __launch_bounds__(256) forward_probe(const T* p, const T* q, int64_t V, uint8_t* signs, float* partial) {
  constexpr int N = 16 / sizeof(T), kTh = 256, kU = 4;
  extern __shared__ uint4 s4[];
  __shared__ float shared[kTh / 32];
  const int64_t row = blockIdx.x, groups = V / N;
  const uint4* p4 = reinterpret_cast<const uint4*>(p + row * V);
  const uint4* q4 = reinterpret_cast<const uint4*>(q + row * V);
  uint8_t* srow = signs + (kSink == SignSink::kAliased ? (row & 7) : row) * legacy::pitch(V);
  uint8_t* sb = kSink == SignSink::kSmem ? reinterpret_cast<uint8_t*>(s4) : srow;
  float acc = 0.f;
  uint32_t fold = 0;
  auto put = [&](int64_t i, uint32_t bits) {
    if constexpr (kSink == SignSink::kFold) {
      fold = (fold << 1 | fold >> 31) ^ bits;
    } else if constexpr (kSink == SignSink::kStreaming) {
      if constexpr (N == 8) __stcs(reinterpret_cast<unsigned short*>(sb) + i, static_cast<unsigned short>(bits));
      else __stcs(reinterpret_cast<signed char*>(sb) + i, static_cast<signed char>(bits));
    } else {
      const int64_t at = tm_index<G>(row, i, gridDim.x, groups);
      if constexpr (N == 8) reinterpret_cast<uint16_t*>(G > 0 ? signs : sb)[at] = static_cast<uint16_t>(bits);
      else (G > 0 ? signs : sb)[at] = static_cast<uint8_t>(bits);
    }
  };
  int64_t i = threadIdx.x;
  for (; i + (kU - 1) * kTh < groups; i += kU * kTh) {
    uint4 pv[kU], qv[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      pv[u] = __ldcs(p4 + i + u * kTh);
      qv[u] = __ldcs(q4 + i + u * kTh);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      put(i + u * kTh, legacy::tvd_elems<N>(reinterpret_cast<const T*>(&pv[u]), reinterpret_cast<const T*>(&qv[u]), acc));
  }
  for (; i < groups; i += kTh) {
    const uint4 pv = __ldcs(p4 + i), qv = __ldcs(q4 + i);
    put(i, legacy::tvd_elems<N>(reinterpret_cast<const T*>(&pv), reinterpret_cast<const T*>(&qv), acc));
  }
  if constexpr (kSink == SignSink::kFold) {
    reinterpret_cast<uint32_t*>(signs)[row * kTh + threadIdx.x] = fold;  // needs rows*1 KB <= the sign buffer
  } else if constexpr (kSink == SignSink::kSmem) {
    __syncthreads();
    const int64_t n16 = (groups * N / 4 + 15) / 16;
    uint4* dst = reinterpret_cast<uint4*>(srow);
    for (int64_t j = threadIdx.x; j < n16; j += kTh) dst[j] = s4[j];
  }
  acc = detail::block_sum(acc, shared);
  if (threadIdx.x == 0) partial[row] = acc;
}

template <typename T, int G, int kTh, int kU>
__global__ void __launch_bounds__(kTh) backward_layout(const uint8_t* signs, int64_t rows, int64_t V, const float* go,
                                                       const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T);
  using W = std::conditional_t<N == 8, uint16_t, uint8_t>;
  const int64_t row = rows - 1 - blockIdx.x, groups = V / N;
  // G = 0: forward_probe's row-major layout (rows legacy::pitch(V) bytes apart)
  const W* sw = reinterpret_cast<const W*>(G > 0 ? signs : signs + row * legacy::pitch(V));
  auto at = [&](int64_t i) { return tm_index<G>(row, i, rows, groups); };
  uint4* g4 = reinterpret_cast<uint4*>(grad + row * V);
  const legacy::Decoder<T> dec = make_decoder<T>(go, scale);
  int64_t i = threadIdx.x;
  for (; i + (kU - 1) * kTh < groups; i += kU * kTh) {
    uint32_t bits[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) bits[u] = sw[at(i + u * kTh)];
#pragma unroll
    for (int u = 0; u < kU; ++u) __stcs(g4 + i + u * kTh, decode_group(dec, bits[u]));
  }
  for (; i < groups; i += kTh) __stcs(g4 + i, decode_group(dec, sw[at(i)]));
}

// p for a tie pattern: p_i = q_i (a tie) where a hash of i falls below `tie_per_65536`, else a
// value that differs from q.
template <typename T>
__global__ void tie_pattern(T* p, const T* q, int64_t n, uint32_t tie_per_65536) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = uint32_t(i) * 2654435761u;
    p[i] = (h >> 16) < tie_per_65536 ? q[i] : detail::from_float<T>(detail::to_float(q[i]) * 1.5f + 1e-3f);
  }
}

// The library backward's gradient values, 0.5 * grad_output * scale, for the variants of it below.
template <typename T>
__device__ __forceinline__ detail::Decoder<T> library_decoder(const TvdBackwardArgs<T>& a) {
  const float h = 0.5f * a.grad_output[0] * a.scale[0];
  return {detail::from_float<T>(h), detail::from_float<T>(-h), detail::from_float<T>(0.f * h)};
}

// Probes of the backward's grid: a fill with the library backward's grid (one block per row,
// kTh threads, kU 16-byte stores in flight), and the library backward itself with its sign loads
// replaced by constants (kNoLoads), to split the backward's time between its grid and its loads.
template <typename T, int kTh, int kU>
__global__ void __launch_bounds__(kTh) fill_rows(T* grad, int64_t V) {
  uint4* g4 = reinterpret_cast<uint4*>(grad + blockIdx.x * V);
  const int64_t n = V * int64_t(sizeof(T)) / 16;
  int64_t i = threadIdx.x;
  for (; i + (kU - 1) * kTh < n; i += kU * kTh)
#pragma unroll
    for (int u = 0; u < kU; ++u) g4[i + u * kTh] = make_uint4(1, 2, 3, 4);
  for (; i < n; i += kTh) g4[i] = make_uint4(1, 2, 3, 4);
}
template <typename T, int kTh, int kU>
__global__ void __launch_bounds__(kTh) backward_no_loads(TvdBackwardArgs<T> a) {
  constexpr int W = kTh / 32;
  const int64_t row = blockIdx.x, V = a.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T* grow = a.grad + row * V;
  const detail::Decoder<T> dec = library_decoder(a);
  const int64_t tiles = sign_tiles(V);
  for (int64_t t = warp; t < tiles; t += W)
    detail::write_tile<T, true>(grow, V, t, uint32_t(0x5Au ^ lane ^ uint32_t(t)), 0u, dec, lane);
}

// The library backward reading every row's signs from one of 8 rows (which stay in L2): what the
// backward costs when its sign loads hit L2.
template <typename T, int kTh, int kU>
__global__ void __launch_bounds__(kTh) backward_l2_signs(TvdBackwardArgs<T> a, int64_t row_mask = 7) {
  constexpr int W = kTh / 32;
  const int64_t row = blockIdx.x, V = a.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* srow = a.signs + (row & row_mask) * sign_row_pitch(V);
  const uint8_t* flags = srow + sign_flag_offset(V);
  T* grow = a.grad + row * V;
  const detail::Decoder<T> dec = library_decoder(a);
  const int64_t tiles = sign_tiles(V);
  int64_t t = warp;
  for (; t + (kU - 1) * W < tiles; t += kU * W) {
    uint32_t flag[kU], pos[kU], tie[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      flag[u] = flags[t + u * W];
      pos[u] = srow[(t + u * W) * kTileBytes + lane];
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) tie[u] = detail::tie_byte(srow, V, t + u * W, flag[u], lane);
#pragma unroll
    for (int u = 0; u < kU; ++u) detail::write_tile<T, true>(grow, V, t + u * W, pos[u], tie[u], dec, lane);
  }
  for (; t < tiles; t += W)
    detail::write_tile<T, true>(grow, V, t, srow[t * kTileBytes + lane], detail::tie_byte(srow, V, t, flags[t], lane), dec, lane);
}

// Backward with its sign loads one step ahead of its stores (software pipelining in registers):
// a warp holds the flag and pos bytes of its next kU tiles while it writes the current ones, so
// a load's latency overlaps the previous step's stores. kMinBlocks caps registers for occupancy.
template <typename T, int kTh, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kTh, kMinBlocks) backward_ahead(TvdBackwardArgs<T> a) {
  constexpr int W = kTh / 32;
  const int64_t row = a.rows - 1 - blockIdx.x, V = a.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* srow = a.signs + row * sign_row_pitch(V);
  const uint8_t* flags = srow + sign_flag_offset(V);
  T* grow = a.grad + row * V;
  const detail::Decoder<T> dec = library_decoder(a);
  const int64_t tiles = sign_tiles(V);
  uint32_t flag[kU], pos[kU];
  int64_t t = warp;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t tt = t + u * W;
    flag[u] = tt < tiles ? flags[tt] : 0u;
    pos[u] = tt < tiles ? srow[tt * kTileBytes + lane] : 0u;
  }
  for (; t < tiles; t += kU * W) {
    uint32_t tie[kU], nflag[kU], npos[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) tie[u] = t + u * W < tiles ? detail::tie_byte(srow, V, t + u * W, flag[u], lane) : 0u;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t tt = t + (kU + u) * W;
      nflag[u] = tt < tiles ? flags[tt] : 0u;
      npos[u] = tt < tiles ? srow[tt * kTileBytes + lane] : 0u;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (t + u * W < tiles) detail::write_tile<T, true>(grow, V, t + u * W, pos[u], tie[u], dec, lane, true);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      flag[u] = nflag[u];
      pos[u] = npos[u];
    }
  }
}

// Persistent backward with a row's pos bits and flags staged in shared memory, double-buffered:
// block b takes rows b, b + G, ... (G blocks), and copies the next row's bits (cp.async, 16 B
// per thread) while it writes the current row, so the sign reads are one burst per row, issued a
// whole row ahead. Tie bytes of kSomeTies tiles are read from global memory when needed.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

template <typename T, int kTh>
__global__ void __launch_bounds__(kTh) backward_staged(TvdBackwardArgs<T> a, int stage_bytes) {
  constexpr int W = kTh / 32;
  extern __shared__ uint4 smem4[];
  const int64_t V = a.V, tiles = sign_tiles(V), pitch = sign_row_pitch(V);
  const int64_t pos_bytes = sign_tie_offset(V), flag_bytes = round_up_128(tiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const detail::Decoder<T> dec = library_decoder(a);
  uint8_t* buf[2] = {reinterpret_cast<uint8_t*>(smem4), reinterpret_cast<uint8_t*>(smem4) + stage_bytes};
  auto stage = [&](int64_t row, uint8_t* dst) {  // pos plane then flags, 16 B per thread per copy
    const uint8_t* srow = a.signs + row * pitch;
    for (int64_t j = threadIdx.x * 16; j < pos_bytes + flag_bytes; j += kTh * 16)
      cp_async16(dst + j, j < pos_bytes ? srow + j : srow + sign_flag_offset(V) + (j - pos_bytes));
    cp_async_commit();
  };
  const int64_t G = gridDim.x;
  int64_t row = blockIdx.x;
  if (row < a.rows) stage(a.rows - 1 - row, buf[0]);
  for (int i = 0; row < a.rows; ++i, row += G) {
    const int64_t r = a.rows - 1 - row;
    if (row + G < a.rows) {
      stage(a.rows - 1 - (row + G), buf[(i + 1) & 1]);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint8_t* sp = buf[i & 1];
    const uint8_t* sf = sp + pos_bytes;
    const uint8_t* srow = a.signs + r * pitch;
    T* grow = a.grad + r * V;
    for (int64_t t = warp; t < tiles; t += W) {
      const uint32_t flag = sf[t];
      detail::write_tile<T, true>(grow, V, t, sp[t * kTileBytes + lane], detail::tie_byte(srow, V, t, flag, lane), dec,
                                  lane, true);
    }
    __syncthreads();  // the buffer is refilled next step
  }
}

// Phased kernels: a persistent grid (G blocks), each block taking k whole rows per phase (rows
// base + b*k .. +k-1 of phase base). The forward keeps the phase's pos bits and flags in shared
// memory and writes them out at the phase's end; the backward reads a phase's pos bits and flags
// into shared memory first and then writes the phase's gradient. With every block in step, the
// sign traffic comes in few large bursts instead of a trickle among the opposite-direction stream.
// (When all the signs fit in the blocks' shared memory, e.g. (4096, 32000), there is one phase:
// the forward writes its signs at its very end, the backward reads them at its very start.)
// Workshop: V % 256 == 0, 16-byte aligned rows; tie bits go to/come from global memory directly.
template <typename T, int kTh, int kMinB>
__global__ void __launch_bounds__(kTh, kMinB) forward_phased(TvdForwardArgs<T> a, int k, float* partial) {
  constexpr int N = detail::TileShape<T>::N, R = detail::TileShape<T>::R, U = detail::TileShape<T>::kForwardTiles, W = kTh / 32;
  extern __shared__ uint4 smem4[];
  __shared__ float red[32];
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem4);
  const int64_t V = a.V, tiles = sign_tiles(V), pos_bytes = sign_tie_offset(V), flag_bytes = round_up_128(tiles);
  const int64_t stage = pos_bytes + flag_bytes, pitch = sign_row_pitch(V), G = gridDim.x, P = G * k;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int64_t base = 0; base < a.rows; base += P) {
    const int64_t r0 = base + int64_t(blockIdx.x) * k;
    const int64_t nr = a.rows - r0 < k ? (a.rows - r0 > 0 ? a.rows - r0 : 0) : k;
    for (int64_t j = 0; j < nr; ++j) {
      const uint4* p4 = reinterpret_cast<const uint4*>(a.p + (r0 + j) * a.p_row_stride);
      const uint4* q4 = reinterpret_cast<const uint4*>(a.q + (r0 + j) * a.q_row_stride);
      uint8_t* s = sm + j * stage;
      uint8_t* gtie = a.signs + (r0 + j) * pitch + pos_bytes;
      int64_t t = warp;
      for (; t < tiles; t += U * W) {
        uint4 pv[U][R], qv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int64_t tt = t + u * W < tiles ? t + u * W : t;
            const int64_t v = detail::lane_elem(tt, lane, r, N) / N;
            pv[u][r] = __ldcs(p4 + v);
            qv[u][r] = __ldcs(q4 + v);
          }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (t + u * W >= tiles) break;
          uint32_t pos = 0, tie = 0;
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < N; ++e) {
              const float d = detail::to_float(reinterpret_cast<const T*>(&pv[u][r])[e]) -
                              detail::to_float(reinterpret_cast<const T*>(&qv[u][r])[e]);
              acc += fabsf(d);
              pos |= uint32_t(d > 0.f) << (r * N + e);
              tie |= uint32_t(!(d > 0.f) && !(d < 0.f)) << (r * N + e);
            }
          const int64_t tile = t + u * W, b = tile * kTileBytes + detail::lane_byte<R>(lane);
          s[b] = uint8_t(detail::pack_lane_bits<R>(pos, lane));
          const uint32_t tb = detail::pack_lane_bits<R>(tie, lane);
          bool store_ties;
          const uint32_t flag = detail::tile_flag<R>(tb, lane, store_ties);
          if (store_ties) gtie[b] = uint8_t(tb);
          if (lane == 0) s[pos_bytes + tile] = uint8_t(flag);
        }
      }
    }
    __syncthreads();
    for (int64_t j = 0; j < nr; ++j) {  // the phase's signs out, 16 B per thread
      const uint4* s4 = reinterpret_cast<const uint4*>(sm + j * stage);
      uint8_t* srow = a.signs + (r0 + j) * pitch;
      for (int64_t i = threadIdx.x; i < stage / 16; i += kTh) {
        const int64_t off = i * 16;
        *reinterpret_cast<uint4*>(off < pos_bytes ? srow + off : srow + sign_flag_offset(V) + (off - pos_bytes)) = s4[i];
      }
    }
    __syncthreads();
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < W; ++w) s += red[w];
    partial[blockIdx.x] = s;
  }
}

template <typename T, int kTh, int kMinB>
__global__ void __launch_bounds__(kTh, kMinB) backward_phased(TvdBackwardArgs<T> a, int k) {
  constexpr int W = kTh / 32;
  extern __shared__ uint4 smem4[];
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem4);
  const int64_t V = a.V, tiles = sign_tiles(V), pos_bytes = sign_tie_offset(V), flag_bytes = round_up_128(tiles);
  const int64_t stage = pos_bytes + flag_bytes, pitch = sign_row_pitch(V), G = gridDim.x, P = G * k;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const detail::Decoder<T> dec = library_decoder(a);
  for (int64_t base = 0; base < a.rows; base += P) {
    const int64_t r0 = base + int64_t(blockIdx.x) * k;
    const int64_t nr = a.rows - r0 < k ? (a.rows - r0 > 0 ? a.rows - r0 : 0) : k;
    for (int64_t j = 0; j < nr; ++j) {
      const uint8_t* srow = a.signs + (r0 + j) * pitch;
      for (int64_t i = threadIdx.x; i < stage / 16; i += kTh) {
        const int64_t off = i * 16;
        cp_async16(sm + j * stage + off, off < pos_bytes ? srow + off : srow + sign_flag_offset(V) + (off - pos_bytes));
      }
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    for (int64_t j = 0; j < nr; ++j) {
      const uint8_t* s = sm + j * stage;
      const uint8_t* srow = a.signs + (r0 + j) * pitch;
      T* grow = a.grad + (r0 + j) * V;
      for (int64_t t = warp; t < tiles; t += W)
        detail::write_tile<T, true>(grow, V, t, s[t * kTileBytes + lane], detail::tie_byte(srow, V, t, s[pos_bytes + t], lane),
                                    dec, lane, true);
    }
    __syncthreads();
  }
}

__global__ void fill_kernel(uint4* dst, int64_t n16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = make_uint4(1, 2, 3, 4);
}

// --profile: every variant runs once, untimed, on two shapes (for ncu's hardware counters:
// ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum ./tvd_kernel_variants --profile).
bool g_profile = false;

template <typename F>
float time_ms_on(cudaStream_t stream, F&& f) {
  if (g_profile) {
    f();
    CHECK(cudaDeviceSynchronize());
    return 1.f;
  }
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < 10; ++i) f();
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / 10);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
template <typename F>
float time_ms(F&& f) {
  return time_ms_on(0, f);
}

// Launches a kernel with programmatic dependent launch allowed (the library's launcher).
template <auto Kernel, typename... Args>
void launch_pdl(cudaStream_t stream, dim3 grid, dim3 block, Args... args) {
  CHECK(detail::launch<Kernel>(true, grid, block, stream, args...));
}

bool g_legacy = false;     // --legacy: also the 2-bit design's variants
bool g_pipelines = false;  // --pipelines: also the backward's latency-hiding and phased variants
bool g_l2 = false;         // --l2: an L2 set-aside for persisting lines with the keep-signs hint
bool g_pdl = false;        // --pdl: programmatic dependent launch of the finalize and the backward
bool g_layout = false;     // --layout: row-major against column-blocked sign layouts (2-bit probes)

// The 2-bit design's variants (--legacy): what docs/benchmarks.md's workshop findings quote.
template <typename T>
void run_legacy(int64_t BT, int64_t V, int sms, const T* p, const T* q, T* grad, uint8_t* signs, float* row_loss,
                const float* go, const float* scale, size_t bytes) {
  const double limit = 3.0 * bytes, sign_bytes = double(BT) * V / 4;
  std::printf("  -- the 2-bit design's variants\n");
  auto row = [&](const char* what, float ms, double moved) {
    std::printf("  %-52s %8.4f ms  %6.0f GB/s\n", what, ms, moved / (ms * 1e-3) / 1e9);
  };
  const unsigned grid = unsigned(BT);
  row("backward plain stores, U4, 256", time_ms([&] { backward_variant<T, false, 4, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward .cs stores, U4, 256", time_ms([&] { backward_variant<T, true, 4, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward plain stores, U8, 256", time_ms([&] { backward_variant<T, false, 8, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward plain stores, U2, 512", time_ms([&] { backward_variant<T, false, 2, 512><<<grid, 512>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward plain stores, U1, 1024", time_ms([&] { backward_variant<T, false, 1, 1024><<<grid, 1024>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward wide (2 stores per sign load), 512", time_ms([&] { backward_wide<T, 512><<<grid, 512>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward wide (2 stores per sign load), 256", time_ms([&] { backward_wide<T, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  for (int per_sm : {1, 2, 4}) {
    const unsigned g512 = unsigned(sms * per_sm);
    char what[64];
    std::snprintf(what, sizeof what, "backward flat, 512 x U2, %d blocks/SM", per_sm);
    row(what, time_ms([&] { backward_flat<T, 512, 2><<<g512, 512>>>(signs, BT, V, go, scale, grad); }), bytes + sign_bytes);
    std::snprintf(what, sizeof what, "backward flat, 1024 x U1, %d blocks/SM", per_sm);
    row(what, time_ms([&] { backward_flat<T, 1024, 1><<<unsigned(sms * std::min(per_sm, 2)), 1024>>>(signs, BT, V, go, scale, grad); }), bytes + sign_bytes);
  }
  {
    constexpr int N = 16 / sizeof(T), TILE = 32 * (16 / N);
    const double frac = double((V / N) / TILE * TILE) / double(V / N);  // full tiles only
    row("forward tile (128 B sign stores), 256 x 1", time_ms([&] { forward_tile<T, 256, 1><<<grid, 256>>>(p, q, V, signs, row_loss); }), frac * (2.0 * bytes + sign_bytes));
    row("forward tile (128 B sign stores), 256 x 2", time_ms([&] { forward_tile<T, 256, 2><<<grid, 256>>>(p, q, V, signs, row_loss); }), frac * (2.0 * bytes + sign_bytes));
    row("backward tile (128 B sign loads), 256", time_ms([&] { backward_tile<T, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), frac * (bytes + sign_bytes));
    row("backward tile (128 B sign loads), 512", time_ms([&] { backward_tile<T, 512><<<grid, 512>>>(signs, V, go, scale, grad); }), frac * (bytes + sign_bytes));
    row("full: forward tile 256 x 2 + backward tile 512", time_ms([&] {
      forward_tile<T, 256, 2><<<grid, 256>>>(p, q, V, signs, row_loss);
      backward_tile<T, 512><<<grid, 512>>>(signs, V, go, scale, grad);
    }), frac * limit);
  }
  {
    const size_t smem = size_t((V / (16 / sizeof(T))) * (16 / sizeof(T)) / 4 + 15) / 16 * 16;
    if (smem <= 48 * 1024) {
      row("forward smem-staged signs (16 B stores), 256", time_ms([&] { forward_probe<T, SignSink::kSmem><<<grid, 256, smem>>>(p, q, V, signs, row_loss); }), 2.0 * bytes + sign_bytes);
      row("backward smem-staged signs (16 B loads), 512", time_ms([&] { backward_smem<T, 512><<<grid, 512, smem>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
      row("backward smem-staged signs (16 B loads), 1024", time_ms([&] { backward_smem<T, 1024><<<grid, 1024, smem>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
      row("full: forward smem + backward smem 512 (no finalize)", time_ms([&] {
        forward_probe<T, SignSink::kSmem><<<grid, 256, smem>>>(p, q, V, signs, row_loss);
        backward_smem<T, 512><<<grid, 512, smem>>>(signs, V, go, scale, grad);
      }), limit);
    }
  }
  row("forward, signs computed and folded, not stored", time_ms([&] { forward_probe<T, SignSink::kFold><<<grid, 256>>>(p, q, V, signs, row_loss); }), 2.0 * bytes);
  row("forward, real sign stores (probe kernel)", time_ms([&] { forward_probe<T, SignSink::kStore><<<grid, 256>>>(p, q, V, signs, row_loss); }), 2.0 * bytes + sign_bytes);
  row("forward, sign stores into 8 L2-resident rows", time_ms([&] { forward_probe<T, SignSink::kAliased><<<grid, 256>>>(p, q, V, signs, row_loss); }), 2.0 * bytes);
  row("forward, sign stores evict-first (.cs)", time_ms([&] { forward_probe<T, SignSink::kStreaming><<<grid, 256>>>(p, q, V, signs, row_loss); }), 2.0 * bytes + sign_bytes);
}

template <typename T>
void run_shape(int64_t BT, int64_t V, const char* name, int sms) {
  const size_t n = size_t(BT) * V, bytes = n * sizeof(T);
  T *p, *q, *grad;
  uint8_t* signs;
  float *row_loss, *loss, *scale, *go;
  const size_t sign_buf = size_t(BT) * std::max<int64_t>({sign_row_pitch(V), legacy::pitch(V), 1024});
  CHECK(cudaMalloc(&p, bytes));
  CHECK(cudaMalloc(&q, bytes));
  CHECK(cudaMalloc(&grad, bytes));
  CHECK(cudaMalloc(&signs, sign_buf));
  CHECK(cudaMalloc(&row_loss, tvd_forward_scratch<T>(BT, V, sms) * sizeof(float)));
  CHECK(cudaMalloc(&loss, 4));
  CHECK(cudaMalloc(&scale, 4));
  CHECK(cudaMalloc(&go, 4));
  CHECK(cudaMemset(p, 0x3c, bytes));  // arbitrary finite values, p != q everywhere
  CHECK(cudaMemset(q, 0x3b, bytes));
  const float one = 1.f;
  CHECK(cudaMemcpy(go, &one, 4, cudaMemcpyHostToDevice));
  TvdForwardArgs<T> fa{};
  fa.p = p; fa.q = q; fa.p_row_stride = V; fa.q_row_stride = V; fa.labels = nullptr; fa.ignore_index = -100;
  fa.rows = BT; fa.V = V; fa.num_sms = sms; fa.row_loss = row_loss; fa.signs = signs;
  TvdForwardArgs<T> fa_nosigns = fa;
  fa_nosigns.signs = nullptr;
  const size_t flush_bytes = size_t(256) << 20;  // more than the L2
  void* p_flush;
  CHECK(cudaMalloc(&p_flush, flush_bytes));
  T* p_copy;  // q == p in value, another buffer (the same buffer twice would be read once)
  CHECK(cudaMalloc(&p_copy, bytes));
  CHECK(cudaMemcpy(p_copy, p, bytes, cudaMemcpyDeviceToDevice));
  TvdForwardArgs<T> fa_ties = fa;  // every tile all ties
  fa_ties.q = p_copy;
  TvdBackwardArgs<T> ba{signs, BT, V, go, scale, grad, sms};
  {  // as the library's adapter launches them: programmatic dependent launch on sm_90+
    int major = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    fa.pdl = fa_nosigns.pdl = fa_ties.pdl = ba.pdl = major >= 9;
  }
  auto hinted = [&](int forward_hints, int backward_hints) {  // the library's kernels with other CacheHint flags
    TvdForwardArgs<T> f = fa;
    f.cache_hints = forward_hints;
    TvdBackwardArgs<T> b = ba;
    b.cache_hints = backward_hints;
    return std::make_pair(f, b);
  };
  const double limit = 3.0 * bytes;
  std::printf("\n%s (%lld, %lld): 3 streams = %.0f MB\n", name, (long long)BT, (long long)V, limit / 1e6);
  float copy_ms = 0.f;
  auto row_full = [&](const char* what, float ms) {  // a full pass, against the 3-stream limit
    std::printf("  %-52s %8.4f ms  %6.0f GB/s  %5.1f%% of the limit at copy speed\n", what, ms,
                limit / (ms * 1e-3) / 1e9, 100.0 * (1.5 * copy_ms) / ms);
  };
  auto row_rw = [&](const char* what, float ms, double moved) {
    std::printf("  %-52s %8.4f ms  %6.0f GB/s\n", what, ms, moved / (ms * 1e-3) / 1e9);
  };
  const double sign_bytes = double(BT) * (V / 8.0 + double(sign_tiles(V)));  // tie-free data
  row_rw("fill (write-only, 16B stores)", time_ms([&] { fill_kernel<<<sms * 8, 256>>>((uint4*)grad, bytes / 16); }), bytes);
  row_rw("cudaMemsetAsync (write-only)", time_ms([&] { CHECK(cudaMemsetAsync(grad, 0, bytes)); }), bytes);
  copy_ms = time_ms([&] { CHECK(cudaMemcpyAsync(grad, p, bytes, cudaMemcpyDeviceToDevice)); });
  row_rw("cudaMemcpy D2D (read+write)", copy_ms, 2.0 * bytes);
  row_rw("forward, no signs (+finalize)", time_ms([&] { CHECK(tvd_forward(fa_nosigns, kBatchMean, loss, scale, 0)); }), 2.0 * bytes);
  row_rw("forward, signs (+finalize)", time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); }), 2.0 * bytes + sign_bytes);
  auto rows_pass = [&](const TvdForwardArgs<T>& f0) {
    TvdForwardArgs<T> f = f0;
    f.chunks = detail::forward_chunks<T>(BT, V, sms);
    CHECK((detail::launch_forward_sel<T, true>(f, 0)));
  };
  row_rw("forward rows pass only (no signs, no finalize)", time_ms([&] { rows_pass(fa_nosigns); }), 2.0 * bytes);
  row_rw("forward rows pass only (signs, no finalize)", time_ms([&] { rows_pass(fa); }), 2.0 * bytes + sign_bytes);
  CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0));
  row_rw("backward (library)", time_ms([&] { CHECK(tvd_backward(ba, kBatchMean, 0)); }), bytes + sign_bytes);
  {
    constexpr int kTh = detail::BackwardShape<T>::kTh, kU = detail::BackwardShape<T>::kU;
    row_rw("  fill with the backward's grid (block per row)", time_ms([&] { fill_rows<T, kTh, kU><<<unsigned(BT), kTh>>>(grad, V); }), bytes);
    row_rw("  backward with constant signs (no sign loads)", time_ms([&] { backward_no_loads<T, kTh, kU><<<unsigned(BT), kTh>>>(ba); }), bytes);
  }
  {
    constexpr int kTh = detail::BackwardShape<T>::kTh, kU = detail::BackwardShape<T>::kU;
    row_rw("  backward with its signs in L2 (8 rows' signs)", time_ms([&] { backward_l2_signs<T, kTh, kU><<<unsigned(BT), kTh>>>(ba); }), bytes);
    for (int64_t k : {256, 1024, 2048}) {  // how big a sign set stays in L2 under the grad stream
      if (k >= BT) continue;
      char what[96];
      std::snprintf(what, sizeof what, "  backward with signs of %lld rows (%.1f MB)", (long long)k, k * sign_row_pitch(V) / 1e6);
      row_rw(what, time_ms([&] { backward_l2_signs<T, kTh, kU><<<unsigned(BT), kTh>>>(ba, k - 1); }), bytes);
    }
  }
  {  // after a forward: does the backward find the signs the forward just wrote in L2?
    auto flush = [&] { CHECK(cudaMemsetAsync(p_flush, 0, flush_bytes)); };
    const float f_ms = time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); });
    const float ff_ms = time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); flush(); });
    const float fb_ms = time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); CHECK(tvd_backward(ba, kBatchMean, 0)); });
    const float ffb_ms = time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); flush(); CHECK(tvd_backward(ba, kBatchMean, 0)); });
    row_rw("  backward right after a forward (fwd+bwd - fwd)", fb_ms - f_ms, bytes + sign_bytes);
    row_rw("  backward after a forward and a 256 MB memset (difference)", ffb_ms - ff_ms, bytes + sign_bytes);
  }
  if (g_pipelines) {
    row_rw("backward ahead (loads one step ahead) 512 x 2, 4 blocks/SM", time_ms([&] { backward_ahead<T, 512, 2, 4><<<unsigned(BT), 512>>>(ba); }), bytes + sign_bytes);
    row_rw("backward ahead 512 x 2, 2 blocks/SM", time_ms([&] { backward_ahead<T, 512, 2, 2><<<unsigned(BT), 512>>>(ba); }), bytes + sign_bytes);
    row_rw("backward ahead 512 x 1, 4 blocks/SM", time_ms([&] { backward_ahead<T, 512, 1, 4><<<unsigned(BT), 512>>>(ba); }), bytes + sign_bytes);
    row_rw("backward ahead 256 x 4, 8 blocks/SM", time_ms([&] { backward_ahead<T, 256, 4, 8><<<unsigned(BT), 256>>>(ba); }), bytes + sign_bytes);
    const int stage = int(sign_tie_offset(V) + round_up_128(sign_tiles(V)));
    for (int per_sm : {2, 3, 4}) {
      for (int th : {256, 512}) {
        if (size_t(2 * stage) * per_sm > 200 * 1024 || th * per_sm > 2048) continue;
        const unsigned g = unsigned(std::min<int64_t>(BT, int64_t(sms) * per_sm));
        auto launch = [&] {
          if (th == 512) backward_staged<T, 512><<<g, 512, 2 * stage>>>(ba, stage);
          else backward_staged<T, 256><<<g, 256, 2 * stage>>>(ba, stage);
        };
        char what[96];
        std::snprintf(what, sizeof what, "backward staged (cp.async, next row ahead) %d x %d/SM", th, per_sm);
        row_rw(what, time_ms(launch), bytes + sign_bytes);
        std::snprintf(what, sizeof what, "full: library forward + backward staged %d x %d/SM", th, per_sm);
        row_full(what, time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); launch(); }));
      }
    }
    {  // phased: threads x blocks per SM, rows per block per phase (as many as fit, or 2)
      const int64_t st = sign_tie_offset(V) + round_up_128(sign_tiles(V));
      auto rows_per_block = [&](int B, int kmax) {
        const int64_t G = int64_t(sms) * B, fit = (220 * 1024 / B) / st;
        return int(std::min<int64_t>({fit, (BT + G - 1) / G, int64_t(kmax)}));
      };
      CHECK(cudaFuncSetAttribute(forward_phased<T, 1024, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
      CHECK(cudaFuncSetAttribute(forward_phased<T, 512, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 110 * 1024));
      CHECK(cudaFuncSetAttribute(backward_phased<T, 1024, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 110 * 1024));
      CHECK(cudaFuncSetAttribute(backward_phased<T, 512, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 55 * 1024));
      auto fwd = [&](int th, int kmax) {
        const int B = th == 1024 ? 1 : 2, k = rows_per_block(B, kmax);
        const size_t smem = size_t(k) * st;
        if (th == 1024) forward_phased<T, 1024, 1><<<unsigned(sms * B), 1024, smem>>>(fa, k, row_loss);
        else forward_phased<T, 512, 2><<<unsigned(sms * B), 512, smem>>>(fa, k, row_loss);
      };
      auto bwd = [&](int th, int kmax) {
        const int B = th == 1024 ? 2 : 4, k = rows_per_block(B, kmax);
        const size_t smem = size_t(k) * st;
        if (th == 1024) backward_phased<T, 1024, 2><<<unsigned(sms * B), 1024, smem>>>(ba, k);
        else backward_phased<T, 512, 4><<<unsigned(sms * B), 512, smem>>>(ba, k);
      };
      auto phases = [&](int B, int kmax) {
        const int64_t G = int64_t(sms) * B, k = rows_per_block(B, kmax);
        return int((BT + G * k - 1) / (G * k));
      };
      const int big = 1 << 20;
      char what[128];
      for (int th : {1024, 512}) {
        for (int kmax : {big, 2}) {
          const int Bf = th == 1024 ? 1 : 2, Bb = th == 1024 ? 2 : 4;
          std::snprintf(what, sizeof what, "forward phased %d x %d/SM, %d rows/block/phase, %d phases", th, Bf, rows_per_block(Bf, kmax), phases(Bf, kmax));
          row_rw(what, time_ms([&] { fwd(th, kmax); }), 2.0 * bytes + sign_bytes);
          std::snprintf(what, sizeof what, "backward phased %d x %d/SM, %d rows/block/phase, %d phases", th, Bb, rows_per_block(Bb, kmax), phases(Bb, kmax));
          row_rw(what, time_ms([&] { bwd(th, kmax); }), bytes + sign_bytes);
          std::snprintf(what, sizeof what, "full: phased fwd + phased bwd (%d threads, %s)", th, kmax == big ? "rows that fit" : "2 rows");
          row_full(what, time_ms([&] { fwd(th, kmax); bwd(th, kmax); }));
          if (kmax != big) continue;
          std::snprintf(what, sizeof what, "full: library fwd + phased bwd (%d threads)", th);
          row_full(what, time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); bwd(th, kmax); }));
          std::snprintf(what, sizeof what, "full: phased fwd + library bwd (%d threads)", th);
          row_full(what, time_ms([&] { fwd(th, kmax); CHECK(tvd_backward(ba, kBatchMean, 0)); }));
        }
      }
      {  // same gradient as the library, on tie data
        T* pt2;
        CHECK(cudaMalloc(&pt2, bytes));
        tie_pattern<T><<<sms * 8, 256>>>(pt2, q, int64_t(n), 2884u);
        const TvdForwardArgs<T> fa_saved = fa;
        fa.p = pt2;
        CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0));
        CHECK(tvd_backward(ba, kBatchMean, 0));
        std::vector<unsigned char> want(bytes), got(bytes);
        CHECK(cudaMemcpy(want.data(), grad, bytes, cudaMemcpyDeviceToHost));
        for (int th : {1024, 512}) {
          CHECK(cudaMemset(grad, 0, bytes));
          CHECK(cudaMemset(signs, 0x77, sign_buf));
          fwd(th, big);
          bwd(th, big);
          CHECK(cudaMemcpy(got.data(), grad, bytes, cudaMemcpyDeviceToHost));
          std::printf("  check phased fwd+bwd %d (4.40%% tied): %s\n", th, want == got ? "same gradient" : "DIFFERENT GRADIENT");
        }
        fa = fa_saved;
        CHECK(cudaFree(pt2));
        CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0));
      }
    }
    row_full("full: library forward + backward ahead 512 x 2, 4/SM", time_ms([&] {
      CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0));
      backward_ahead<T, 512, 2, 4><<<unsigned(BT), 512>>>(ba);
    }));
  }
  row_rw("backward 256 x 2 tiles", time_ms([&] { CHECK((tvd_backward<T, 256, 2>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_rw("backward 256 x 4 tiles", time_ms([&] { CHECK((tvd_backward<T, 256, 4>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_rw("backward 512 x 1 tile", time_ms([&] { CHECK((tvd_backward<T, 512, 1>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_rw("backward 512 x 2 tiles", time_ms([&] { CHECK((tvd_backward<T, 512, 2>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_rw("backward 512 x 4 tiles", time_ms([&] { CHECK((tvd_backward<T, 512, 4>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_rw("backward 1024 x 1 tile", time_ms([&] { CHECK((tvd_backward<T, 1024, 1>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_rw("backward 1024 x 2 tiles", time_ms([&] { CHECK((tvd_backward<T, 1024, 2>(ba, kBatchMean, 0))); }), bytes + sign_bytes);
  row_full("full: library forward + backward (default hints)", time_ms([&] {
    CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0));
    CHECK(tvd_backward(ba, kBatchMean, 0));
  }));
  row_full("full: library, q equal to p (every tile all ties)", time_ms([&] {
    CHECK(tvd_forward(fa_ties, kBatchMean, loss, scale, 0));
    CHECK(tvd_backward(ba, kBatchMean, 0));
  }));
  // Sparse ties: 0.16% of elements (a third of the tiles have one; random bf16 softmax pairs look
  // like this) and 4.4% (every tile has some; a student close to its teacher in bf16).
  T* pt;
  CHECK(cudaMalloc(&pt, bytes));
  for (uint32_t per : {105u, 2884u}) {
    tie_pattern<T><<<sms * 8, 256>>>(pt, q, int64_t(n), per);
    TvdForwardArgs<T> f = fa;
    f.p = pt;
    char what[96];
    std::snprintf(what, sizeof what, "full: library, %.2f%% of elements tied", 100.0 * per / 65536);
    row_full(what, time_ms([&] {
      CHECK(tvd_forward(f, kBatchMean, loss, scale, 0));
      CHECK(tvd_backward(ba, kBatchMean, 0));
    }));
    std::snprintf(what, sizeof what, "  its backward (%.2f%% tied)", 100.0 * per / 65536);
    row_rw(what, time_ms([&] { CHECK(tvd_backward(ba, kBatchMean, 0)); }), bytes + sign_bytes);
    if (!g_pipelines) continue;
    const int stage = int(sign_tie_offset(V) + round_up_128(sign_tiles(V)));
    const unsigned g = unsigned(std::min<int64_t>(BT, int64_t(sms) * 4));
    {  // the variants must write what the library writes
      CHECK(tvd_forward(f, kBatchMean, loss, scale, 0));
      CHECK(tvd_backward(ba, kBatchMean, 0));
      std::vector<unsigned char> want(bytes), got(bytes);
      CHECK(cudaMemcpy(want.data(), grad, bytes, cudaMemcpyDeviceToHost));
      auto same = [&](const char* what) {
        CHECK(cudaMemcpy(got.data(), grad, bytes, cudaMemcpyDeviceToHost));
        std::printf("  check %s (%.2f%% tied): %s\n", what, 100.0 * per / 65536, want == got ? "same gradient" : "DIFFERENT GRADIENT");
        CHECK(cudaMemset(grad, 0, bytes));
      };
      CHECK(cudaMemset(grad, 0, bytes));
      backward_staged<T, 512><<<g, 512, 2 * stage>>>(ba, stage);
      same("staged");
      backward_ahead<T, 512, 2, 4><<<unsigned(BT), 512>>>(ba);
      same("ahead");
    }
    std::snprintf(what, sizeof what, "  its backward staged 512 x 4/SM (%.2f%% tied)", 100.0 * per / 65536);
    row_rw(what, time_ms([&] { backward_staged<T, 512><<<g, 512, 2 * stage>>>(ba, stage); }), bytes + sign_bytes);
    std::snprintf(what, sizeof what, "full: fwd + backward staged 512 x 4/SM, %.2f%% tied", 100.0 * per / 65536);
    row_full(what, time_ms([&] {
      CHECK(tvd_forward(f, kBatchMean, loss, scale, 0));
      backward_staged<T, 512><<<g, 512, 2 * stage>>>(ba, stage);
    }));
  }
  if (g_layout) {  // sign layout: row-major (G = 0) against column blocks of G code words
    const int64_t groups = V / (16 / int64_t(sizeof(T)));
    const int64_t word = sizeof(T) == 2 ? 2 : 1;
    const unsigned g = unsigned(BT);
    auto one = [&](auto Gc) {
      constexpr int G = decltype(Gc)::value;
      const int64_t need = G == 0 ? BT * legacy::pitch(V) : BT * ((groups + G - 1) / G) * G * word;
      if (size_t(need) > sign_buf) return;
      char what[112];
      std::snprintf(what, sizeof what, "layout G=%d: 2-bit probe forward", G);
      row_rw(what, time_ms([&] { forward_probe<T, SignSink::kStore, G><<<g, 256>>>(p, q, V, signs, row_loss); }), 2.0 * bytes + need);
      std::snprintf(what, sizeof what, "layout G=%d: its backward 512 x 2", G);
      row_rw(what, time_ms([&] { backward_layout<T, G, 512, 2><<<g, 512>>>(signs, BT, V, go, scale, grad); }), bytes + need);
      std::snprintf(what, sizeof what, "full: layout G=%d (probe forward + backward)", G);
      row_full(what, time_ms([&] {
        forward_probe<T, SignSink::kStore, G><<<g, 256>>>(p, q, V, signs, row_loss);
        backward_layout<T, G, 512, 2><<<g, 512>>>(signs, BT, V, go, scale, grad);
      }));
    };
    one(std::integral_constant<int, 0>{});
    one(std::integral_constant<int, 32>{});
    one(std::integral_constant<int, 64>{});
    one(std::integral_constant<int, 256>{});
    one(std::integral_constant<int, 1024>{});
    {  // the layouts decode to the same gradient (row-major against G = 64), on the 4.4%-ties data
      std::vector<unsigned char> a(bytes), b(bytes);
      forward_probe<T, SignSink::kStore, 0><<<g, 256>>>(pt, q, V, signs, row_loss);
      backward_layout<T, 0, 512, 2><<<g, 512>>>(signs, BT, V, go, scale, grad);
      CHECK(cudaMemcpy(a.data(), grad, bytes, cudaMemcpyDeviceToHost));
      CHECK(cudaMemset(grad, 0, bytes));
      forward_probe<T, SignSink::kStore, 64><<<g, 256>>>(pt, q, V, signs, row_loss);
      backward_layout<T, 64, 512, 2><<<g, 512>>>(signs, BT, V, go, scale, grad);
      CHECK(cudaMemcpy(b.data(), grad, bytes, cudaMemcpyDeviceToHost));
      std::printf("  check layouts: %s\n", a == b ? "same gradient" : "DIFFERENT GRADIENT");
    }
  }
  if (g_pdl) {  // programmatic dependent launch: forward rows pass, finalize, backward
    constexpr int kTh = detail::BackwardShape<T>::kTh, kU = detail::BackwardShape<T>::kU;
    TvdForwardArgs<T> f = fa;
    f.chunks = detail::forward_chunks<T>(BT, V, sms);
    const dim3 fgrid(unsigned(BT), unsigned(f.chunks));
    const dim3 bgrid(unsigned(BT), unsigned(detail::chunks_per_row(BT, sign_tiles(V), (kTh / 32) * kU, sms)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto chain = [&](cudaStream_t st, bool pdl_fin, bool pdl_bwd) {
      detail::tvd_forward_kernel<T, true, true, false><<<fgrid, detail::kThreads, 0, st>>>(f);
      if (pdl_fin)
        launch_pdl<detail::tvd_finalize_kernel>(st, dim3(1), dim3(detail::kThreads), (const float*)row_loss,
                   int64_t(BT * f.chunks), (const int64_t*)nullptr, int64_t(-100), int64_t(BT), int64_t(V),
                   int64_t(kBatchMean), loss, scale);
      else
        detail::tvd_finalize_kernel<<<1, detail::kThreads, 0, st>>>(row_loss, BT * f.chunks, nullptr, -100, BT, V,
                                                                    kBatchMean, loss, scale);
      if (pdl_bwd) launch_pdl<detail::tvd_backward_kernel<T, true, kTh, kU>>(st, bgrid, dim3(kTh), ba);
      else detail::tvd_backward_kernel<T, true, kTh, kU><<<bgrid, kTh, 0, st>>>(ba);
    };
    for (cudaStream_t st : {cudaStream_t(0), s}) {
      const char* on = st == 0 ? "stream 0" : "own stream";
      char what[112];
      std::snprintf(what, sizeof what, "full, %s: plain launches", on);
      row_full(what, time_ms_on(st, [&] { chain(st, false, false); }));
      std::snprintf(what, sizeof what, "full, %s: finalize PDL", on);
      row_full(what, time_ms_on(st, [&] { chain(st, true, false); }));
      std::snprintf(what, sizeof what, "full, %s: finalize and backward PDL", on);
      row_full(what, time_ms_on(st, [&] { chain(st, true, true); }));
      std::snprintf(what, sizeof what, "fwd+finalize, %s: plain / PDL", on);
      const float a0 = time_ms_on(st, [&] {
        detail::tvd_forward_kernel<T, true, true, false><<<fgrid, detail::kThreads, 0, st>>>(f);
        detail::tvd_finalize_kernel<<<1, detail::kThreads, 0, st>>>(row_loss, BT * f.chunks, nullptr, -100, BT, V, kBatchMean, loss, scale);
      });
      const float a1 = time_ms_on(st, [&] {
        detail::tvd_forward_kernel<T, true, true, false><<<fgrid, detail::kThreads, 0, st>>>(f);
        launch_pdl<detail::tvd_finalize_kernel>(st, dim3(1), dim3(detail::kThreads), (const float*)row_loss,
                   int64_t(BT * f.chunks), (const int64_t*)nullptr, int64_t(-100), int64_t(BT), int64_t(V),
                   int64_t(kBatchMean), loss, scale);
      });
      std::printf("  %-52s %8.4f / %.4f ms\n", what, a0, a1);
    }
    {  // the PDL chain computes what the plain one does
      float want_loss = 0.f, got_loss = 0.f;
      std::vector<unsigned char> want(bytes), got(bytes);
      chain(s, false, false);
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaMemcpy(&want_loss, loss, 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(want.data(), grad, bytes, cudaMemcpyDeviceToHost));
      for (int rep = 0; rep < 20; ++rep) {
        CHECK(cudaMemsetAsync(grad, 0, bytes, s));
        CHECK(cudaMemsetAsync(loss, 0, 4, s));
        CHECK(cudaMemsetAsync(scale, 0, 4, s));
        chain(s, true, true);
      }
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaMemcpy(&got_loss, loss, 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(got.data(), grad, bytes, cudaMemcpyDeviceToHost));
      std::printf("  check PDL chain: %s (loss %.6g / %.6g)\n", want == got && want_loss == got_loss ? "same loss and gradient" : "DIFFERENT",
                  double(want_loss), double(got_loss));
    }
    CHECK(cudaStreamDestroy(s));
  }
  if (g_l2) {  // an L2 set-aside for persisting lines: device-wide, so an application's choice, never a library's
    int l2 = 0, max_persist = 0;
    CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    CHECK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0));
    std::printf("  L2 %.1f MB, persisting set-aside up to %.1f MB; signs %.1f MB\n", l2 / 1e6, max_persist / 1e6, sign_bytes / 1e6);
    auto flush = [&] { CHECK(cudaMemsetAsync(p_flush, 0, flush_bytes)); };
    const float flush_ms = time_ms(flush);
    for (size_t aside : {size_t(0), size_t(max_persist) / 2, size_t(max_persist)}) {
      CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, aside));
      size_t got_aside = 0;
      CHECK(cudaDeviceGetLimit(&got_aside, cudaLimitPersistingL2CacheSize));
      const std::pair<int, int> combos[] = {{0, kDefaultBackwardHints}, {kKeepSignsInL2, kDefaultBackwardHints},
                                            {kKeepSignsInL2, kDefaultBackwardHints | kStreamSignLoads},
                                            {kKeepSignsInL2, kStreamGradStores}};
      for (auto [fh, bh] : combos) {
        const auto fb = hinted(fh, bh);
        const TvdForwardArgs<T>& f = fb.first;
        const TvdBackwardArgs<T>& b = fb.second;
        char what[140];
        std::snprintf(what, sizeof what, "set-aside %.1f MB, fwd%s, bwd%s%s", got_aside / 1e6, fh ? " keep" : " default",
                      bh & kReverseRows ? " reverse" : " forward-order", bh & kStreamSignLoads ? " stream-sign-loads" : "");
        std::printf("  %s\n", what);
        row_full("  full, back to back", time_ms([&] {
          CHECK(tvd_forward(f, kBatchMean, loss, scale, 0));
          CHECK(tvd_backward(b, kBatchMean, 0));
        }));
        const float fwd_flush = time_ms([&] { CHECK(tvd_forward(f, kBatchMean, loss, scale, 0)); flush(); });
        const float full_flush = time_ms([&] {
          CHECK(tvd_forward(f, kBatchMean, loss, scale, 0));
          CHECK(tvd_backward(b, kBatchMean, 0));
          flush();
        });
        row_full("  full, L2 flushed after each (flush time taken off)", full_flush - flush_ms);
        row_rw("  its backward (fwd+bwd+flush - fwd+flush)", full_flush - fwd_flush, bytes + sign_bytes);
        row_rw("  its forward (fwd+flush - flush)", fwd_flush - flush_ms, 2.0 * bytes + sign_bytes);
      }
      CHECK(cudaCtxResetPersistingL2Cache());
    }
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0));
  }
  CHECK(cudaFree(pt));
  CHECK(cudaFree(p_copy));
  CHECK(cudaFree(p_flush));
  {  // cache knobs (CacheHint): forward flags x backward flags
    const std::pair<int, int> combos[] = {{0, 0}, {0, kReverseRows}, {0, kStreamGradStores}, {kKeepSignsInL2, 0},
                                          {kKeepSignsInL2, kReverseRows | kStreamSignLoads | kStreamGradStores}};
    for (auto [fh, bh] : combos) {
      const auto fb = hinted(fh, bh);
        const TvdForwardArgs<T>& f = fb.first;
        const TvdBackwardArgs<T>& b = fb.second;
      char what[112];
      std::snprintf(what, sizeof what, "full: hints%s%s%s%s%s", fh + bh == 0 ? " none" : "", fh & kKeepSignsInL2 ? " keep-signs-in-L2" : "",
                    bh & kReverseRows ? " reverse-rows" : "", bh & kStreamSignLoads ? " stream-sign-loads" : "",
                    bh & kStreamGradStores ? " stream-grad-stores" : "");
      row_full(what, time_ms([&] {
        CHECK(tvd_forward(f, kBatchMean, loss, scale, 0));
        CHECK(tvd_backward(b, kBatchMean, 0));
      }));
    }
  }
  const unsigned grid = unsigned(BT);
  row_full("full: 2-bit design (probe forward + backward 512 x U2)", time_ms([&] {
    forward_probe<T, SignSink::kStore><<<grid, 256>>>(p, q, V, signs, row_loss);
    backward_variant<T, false, 2, 512><<<grid, 512>>>(signs, V, go, scale, grad);
  }));
  if (g_legacy) run_legacy<T>(BT, V, sms, p, q, grad, signs, row_loss, go, scale, bytes);
  CHECK(cudaGetLastError());
  for (void* ptr : {(void*)p, (void*)q, (void*)grad, (void*)signs, (void*)row_loss, (void*)loss, (void*)scale, (void*)go})
    CHECK(cudaFree(ptr));
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--profile") g_profile = true;
    else if (arg == "--legacy") g_legacy = true;
    else if (arg == "--pipelines") g_pipelines = true;
    else if (arg == "--l2") g_l2 = true;
    else if (arg == "--pdl") g_pdl = true;
    else if (arg == "--layout") g_layout = true;
    else {
      std::fprintf(stderr, "usage: tvd_kernel_variants [--profile] [--legacy] [--pipelines] [--l2] [--pdl] [--layout]\n");
      return 2;
    }
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  run_shape<__nv_bfloat16>(4096, 32000, "bf16", sms);
  if (g_profile) {
    run_shape<__nv_bfloat16>(8192, 128256, "bf16", sms);
    return 0;
  }
  run_shape<float>(4096, 32000, "fp32", sms);
  run_shape<__nv_bfloat16>(8192, 128256, "bf16", sms);
  run_shape<float>(16384, 131072, "fp32", sms);
  run_shape<__nv_bfloat16>(512, 32000, "bf16", sms);
  return 0;
}

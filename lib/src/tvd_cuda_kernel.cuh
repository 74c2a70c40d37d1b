// Framework-free CUDA kernels of the TVD loss. Raw pointers, sizes and a cudaStream_t; every
// launcher returns the cudaError_t of its launches. Includes nothing from Torch; the adapter
// (tvd_cuda.cu) checks inputs, maps dtypes and takes the current stream.
//
// Data movement (the loss is memory-bound): forward reads p and q once and writes packed signs
// (tvd_common.h: 1 bit per element plus a byte per 256-element tile, tie bits only for tiles
// with ties) and one float per block; backward reads the signs and writes grad once. Loads
// and stores are 16 bytes wide when rows are 16-byte aligned, with several in flight per thread.
//
// Row sums: each thread adds |p - q| in fp32 over one step of its tiles (at most 32 elements) and
// folds that into a double, so a sum keeps ~1e-7 relative error however long a thread's share
// of a row is (issue 17: one fp32 chain per thread lost 1e-5 and more at V = 2^24 and stopped
// growing at 2^27 beyond V = 2^31). The partial per block is rounded to float once; the finalize
// adds the partials in double. One fp64 add per 16 or 32 elements costs nothing measurable here
// (docs/benchmarks.md, "Row sums").
//
// Cache choices, each the winner of bench/tvd_kernel_variants on an H200 (docs/benchmarks.md,
// "Kernel workshop"), which keeps the alternatives as its own knobs: forward loads of p and q
// evict-first; sign stores plain (an L2 evict-last policy on them was no faster at (4096, 32000)
// and at the two large shapes); backward rows in reverse order (the signs the forward wrote
// last are read first), plain sign loads and evict-first gradient stores (+0-3 points of the
// full pass: +3 at (4096, 32000) fp32, +2 in bf16, within 1 at the two large shapes).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "tvd_common.h"

namespace lossfns::kernels {

template <typename T>
struct TvdForwardArgs {
  const T* p;             // (rows, V), unit stride inside a row
  const T* q;             // (rows, V), unit stride inside a row
  int64_t p_row_stride;   // elements
  int64_t q_row_stride;   // elements
  const int64_t* labels;  // (rows,) contiguous, or nullptr: every row counts
  int64_t ignore_index;
  int64_t rows;
  int64_t V;
  int64_t chunks;    // blocks per row (set by tvd_forward from num_sms; >= 1)
  int num_sms;       // multiprocessors of the device (sizes the grid)
  float* row_loss;   // (rows, chunks) partial sums of |p - q| (0 for ignored rows), or
                     // nullptr ('none'); tvd_forward_scratch floats
  float* elem_loss;  // (rows, V) contiguous 0.5*|p - q| ('none'), or nullptr
  uint8_t* signs;    // (rows, sign_row_pitch(V)) packed signs (tvd_common.h), or nullptr
  bool pdl = false;  // allow programmatic dependent launch of the finalize (used where the
                     // kernel was built for sm_90+: see detail::launch)
};

template <typename T>
struct TvdBackwardArgs {
  const uint8_t* signs;  // (rows, sign_row_pitch(V))
  int64_t rows;
  int64_t V;
  const float* grad_output;  // 1 value (reduced loss), or (rows, V) contiguous ('none')
  const float* scale;        // 1 value from the forward's finalize (unused for 'none')
  T* grad;                   // (rows, V) contiguous
  int num_sms;               // multiprocessors of the device (sizes the grid)
  bool pdl = false;          // allow programmatic dependent launch (used where the kernel was built
                             // for sm_90+): it may start while the previous kernel finishes
};

namespace detail {

constexpr int kThreads = 256;  // forward: threads per block
constexpr int kWarps = kThreads / 32;
constexpr int kBlocksPerSm = 2048 / kThreads;

// How a warp covers one tile of kTileElems elements: lane l holds R vectors of N elements (16
// bytes each), vector r covering elements [r*32*N + l*N, +N) of the tile, so every load and
// store of a warp is 512 contiguous bytes. For 16-bit types (N = 8, R = 1) lane l's bits are
// byte l of the tile's 32; for fp32 (N = 4, R = 2) a lane's two nibbles are paired with its
// neighbour's by a shuffle, so every lane still stores exactly one byte.
template <typename T>
struct TileShape {
  static constexpr int N = 16 / int(sizeof(T));
  static constexpr int R = int(kTileElems) / (32 * N);
  static constexpr int kForwardTiles =
      4 / R;  // forward: tiles per warp in flight (4 loads per tensor)
  static constexpr int kChunkTiles = kWarps * kForwardTiles;  // forward: tiles per block step
};
__device__ __forceinline__ int64_t lane_elem(int64_t tile, int lane, int r, int N) {
  return tile * kTileElems + int64_t(r) * 32 * N + int64_t(lane) * N;
}

// A grid of (rows, chunks) blocks, one chunk of a row per block. Rows are split into chunks when
// there are too few rows to fill the device (e.g. BT = 512), but never into chunks of fewer than
// min_tiles tiles. (A persistent grid-stride order over all rows' tiles, tried on an H200, ran
// 5-20% slower in both kernels: docs/benchmarks.md.)
inline int64_t chunks_per_row(int64_t rows, int64_t tiles, int64_t min_tiles, int num_sms) {
  const int64_t want = 2 * int64_t{num_sms} * kBlocksPerSm;  // two waves of resident blocks
  const int64_t by_rows = (want + rows - 1) / (rows > 0 ? rows : 1);
  const int64_t by_size = tiles / min_tiles;
  const int64_t c = by_rows < by_size ? by_rows : by_size;
  return c < 1 ? 1 : (c > 65535 ? 65535 : c);
}
template <typename T>
int64_t forward_chunks(int64_t rows, int64_t V, int num_sms) {
  return chunks_per_row(rows, sign_tiles(V), TileShape<T>::kChunkTiles, num_sms);
}

// Tiles [begin, end) of a row that chunk `chunk` of `chunks` handles; chunks start on multiples
// of 8 tiles, so a chunk's flag stores fill whole 8-byte words.
struct ChunkRange {
  int64_t begin, end;
};
__device__ __forceinline__ ChunkRange chunk_range(int64_t tiles, int64_t chunk, int64_t chunks) {
  const int64_t per_chunk = ((tiles + chunks - 1) / chunks + 7) / 8 * 8;
  const int64_t begin = chunk * per_chunk < tiles ? chunk * per_chunk : tiles;
  return {begin, begin + per_chunk < tiles ? begin + per_chunk : tiles};
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

// The byte of the tile's 32 that a lane stores, and its value from the lane's R*N bits (bit
// r*N + k for element k of vector r). Warp-collective for R = 2.
template <int R>
__device__ __forceinline__ int lane_byte(int lane) {
  return R == 1 ? lane : ((lane & 1) ? 16 + (lane >> 1) : lane >> 1);
}
template <int R>
__device__ __forceinline__ uint32_t pack_lane_bits(uint32_t bits, int lane) {
  if constexpr (R == 1) {
    return bits;
  } else {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, bits, 1);
    return (lane & 1) ? ((other >> 4) | (bits & 0xF0u)) : ((bits & 0xFu) | ((other & 0xFu) << 4));
  }
}
// The inverse: a lane's R*N bits from the byte `byte` it loaded (byte `lane` of the tile).
template <int R>
__device__ __forceinline__ uint32_t unpack_lane_bits(uint32_t byte, int lane) {
  if constexpr (R == 1) {
    return byte;
  } else {
    const int shift = (lane & 1) * 4;
    const uint32_t lo = __shfl_sync(0xffffffffu, byte, lane >> 1);
    const uint32_t hi = __shfl_sync(0xffffffffu, byte, 16 + (lane >> 1));
    return ((lo >> shift) & 0xFu) | (((hi >> shift) & 0xFu) << 4);
  }
}

// Programmatic dependent launch (sm_90): a kernel launched with the programmatic stream
// serialization attribute may start while the kernel before it in the stream finishes; it must
// wait for that kernel's memory before reading it. Without the attribute (and below sm_90) both
// are no-ops, so every kernel below is correct however it is launched.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void let_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The flag of a tile from each lane's packed tie byte (byte lane_byte<R>(lane) of the tile's 32),
// and whether the tile needs its tie bits stored. Warp-collective; every lane gets the same.
template <int R>
__device__ __forceinline__ uint32_t tile_flag(uint32_t tie_byte, int lane, bool& store_ties) {
  const uint32_t lanes = __ballot_sync(0xffffffffu, tie_byte != 0u);
  const bool all = __all_sync(0xffffffffu, tie_byte == 0xFFu);
  // Exactly one tie: one lane with one bit. Its index in the tile is byte * 8 + bit.
  const bool one =
      __popc(lanes) == 1 && __popc(__shfl_sync(0xffffffffu, tie_byte, __ffs(lanes) - 1)) == 1;
  const uint32_t index = uint32_t(lane_byte<R>(lane)) * 8u + uint32_t(__ffs(tie_byte) - 1);
  const uint32_t one_index = one ? __shfl_sync(0xffffffffu, index, __ffs(lanes) - 1) : 0u;
  const bool inline_one = one && one_index <= kOneTieMaxIndex;
  store_ties = lanes != 0u && !all && !inline_one;
  if (lanes == 0u) return kNoTies;
  if (all) return kAllTies;
  return inline_one ? kOneTie + one_index : uint32_t(kSomeTies);
}

// One tile, one lane's R*N differences d = p - q (0 for elements past V): accumulates |d|, stores
// the tile's pos bits, its tie bits if its flag does not say where its ties are, and its flag.
// Warp-collective.
template <int R, int N>
__device__ __forceinline__ void emit_tile(const float (&d)[R * N], float& acc, uint8_t* srow,
                                          int64_t V, int64_t tile, int lane) {
  uint32_t pos = 0, tie = 0;
#pragma unroll
  for (int i = 0; i < R * N; ++i) {
    acc += fabsf(d[i]);
    pos |= static_cast<uint32_t>(d[i] > 0.f) << i;
    tie |= static_cast<uint32_t>(!(d[i] > 0.f) && !(d[i] < 0.f)) << i;  // a NaN difference too
  }
  const uint32_t tie_byte = pack_lane_bits<R>(tie, lane);
  bool store_ties;
  const uint32_t flag = tile_flag<R>(tie_byte, lane, store_ties);
  const int64_t b = tile * kTileBytes + lane_byte<R>(lane);
  srow[b] = static_cast<uint8_t>(pack_lane_bits<R>(pos, lane));
  if (store_ties) srow[sign_tie_offset(V) + b] = static_cast<uint8_t>(tie_byte);
  if (lane == 0) srow[sign_flag_offset(V) + tile] = static_cast<uint8_t>(flag);
}

// Rows pass of the forward: grid (rows, chunks), kThreads per block, warp w of a block taking
// tiles w, w + kWarps, ... of its chunk, kForwardTiles of them in flight. With kVec (rows 16-byte
// aligned) full tiles are read with 16-byte loads; the rest, element by element.
template <typename T, bool kVec, bool kSaveSigns, bool kElemLoss>
__global__ void __launch_bounds__(kThreads) tvd_forward_kernel(TvdForwardArgs<T> a) {
  constexpr int N = TileShape<T>::N, R = TileShape<T>::R, U = TileShape<T>::kForwardTiles;
  __shared__ double shared[kWarps];
  const int64_t row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t V = a.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const ChunkRange range = chunk_range(sign_tiles(V), chunk, chunks);
  uint8_t* srow = kSaveSigns ? a.signs + row * sign_row_pitch(V) : nullptr;
  float* erow = kElemLoss ? a.elem_loss + row * V : nullptr;

  if (a.labels != nullptr && a.labels[row] == a.ignore_index) {  // no loss, no gradient
    for (int64_t t = range.begin + warp; t < range.end; t += kWarps) {
      if constexpr (kSaveSigns) {  // pos bits 0 and flag "all ties": backward writes zeros
        srow[t * kTileBytes + lane] = 0;
        if (lane == 0) srow[sign_flag_offset(V) + t] = kAllTies;
      }
      if constexpr (kElemLoss)
        for (int64_t j = t * kTileElems + lane; j < (t + 1) * kTileElems && j < V; j += 32)
          erow[j] = 0.f;
    }
    if (a.row_loss != nullptr && threadIdx.x == 0) a.row_loss[row * chunks + chunk] = 0.f;
    return;
  }

  const T* prow = a.p + row * a.p_row_stride;
  const T* qrow = a.q + row * a.q_row_stride;
  float acc = 0.f;     // this step's |d|, in fp32
  double total = 0.0;  // the steps before it
  // One tile's differences d (0 past V): the element losses ('none'), the signs, |d|.
  auto finish = [&](int64_t tile, const float(&d)[R * N]) {
    if constexpr (kElemLoss) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int64_t j = lane_elem(tile, lane, r, N) + k;
          if (j < V) erow[j] = 0.5f * fabsf(d[r * N + k]);
        }
      }
    }
    if constexpr (kSaveSigns) {
      emit_tile<R, N>(d, acc, srow, V, tile, lane);
    } else {
#pragma unroll
      for (int i = 0; i < R * N; ++i) acc += fabsf(d[i]);
    }
  };
  const uint4* p4 = reinterpret_cast<const uint4*>(prow);
  const uint4* q4 = reinterpret_cast<const uint4*>(qrow);
  auto vec_diff = [&](const uint4(&pv)[R], const uint4(&qv)[R], float(&d)[R * N]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int k = 0; k < N; ++k)
        d[r * N + k] = to_float(reinterpret_cast<const T*>(&pv[r])[k]) -
                       to_float(reinterpret_cast<const T*>(&qv[r])[k]);
  };
  const int64_t full_tiles = V / kTileElems;
  int64_t t = range.begin + warp;
  if constexpr (kVec) {
    const int64_t fast_end = range.end < full_tiles ? range.end : full_tiles;
    for (; t + (U - 1) * kWarps < fast_end; t += U * kWarps) {
      uint4 pv[U][R], qv[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t v = lane_elem(t + u * kWarps, lane, r, N) / N;
          pv[u][r] = __ldcs(p4 + v);
          qv[u][r] = __ldcs(q4 + v);
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float d[R * N];
        vec_diff(pv[u], qv[u], d);
        finish(t + u * kWarps, d);
      }
      total += acc;
      acc = 0.f;
    }
  }
  for (; t < range.end; t += kWarps) {  // the rest, one tile at a time
    float d[R * N];
    if (kVec && t < full_tiles) {
      uint4 pv[R], qv[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        pv[r] = __ldcs(p4 + lane_elem(t, lane, r, N) / N);
        qv[r] = __ldcs(q4 + lane_elem(t, lane, r, N) / N);
      }
      vec_diff(pv, qv, d);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int64_t j = lane_elem(t, lane, r, N) + k;
          d[r * N + k] = j < V ? to_float(prow[j]) - to_float(qrow[j]) : 0.f;  // past V: a tie
        }
    }
    finish(t, d);
    total += acc;
    acc = 0.f;
  }
  if (a.row_loss != nullptr) {
    // This block has read all it reads: the finalize may be scheduled (it waits for this grid's
    // memory before it reads the partial sums). 'none' has no finalize, and triggers nothing.
    let_next_grid_launch();
    total = block_sum(total, shared);
    if (threadIdx.x == 0) a.row_loss[row * chunks + chunk] = static_cast<float>(total);
  }
}

// One block: total loss (in double) from the forward's partial sums (one per block), the
// non-ignored row count, the reduction's scale.
__global__ void __launch_bounds__(kThreads)
    tvd_finalize_kernel(const float* partials, int64_t n_partials, const int64_t* labels,
                        int64_t ignore_index, int64_t rows, int64_t V, Reduction reduction,
                        float* loss, float* scale) {
  __shared__ double shared_sum[kThreads / 32];
  __shared__ double shared_cnt[kThreads / 32];
  wait_for_previous_grid();
  double sum = 0.0, cnt = 0.0;
  for (int64_t i = threadIdx.x; i < n_partials; i += kThreads) sum += partials[i];
  for (int64_t r = threadIdx.x; r < rows; r += kThreads)
    cnt += (labels == nullptr || labels[r] != ignore_index) ? 1.0 : 0.0;
  let_next_grid_launch();  // all reads done; the next kernel waits for the loss and scale
  sum = block_sum(sum, shared_sum);
  cnt = block_sum(cnt, shared_cnt);
  if (threadIdx.x == 0) {
    const double s = reduction_scale<double>(reduction, static_cast<int64_t>(cnt), V);
    *loss = static_cast<float>(0.5 * sum * s);
    *scale = static_cast<float>(s);
  }
}

// The gradient values, by selects: a table indexed at run time would live in local memory.
template <typename T>
struct Decoder {
  T pos, neg, zero;  // 0.5*scale*g, -0.5*scale*g, 0*(0.5*scale*g) (NaN if that is not finite)
  __device__ __forceinline__ T operator()(uint32_t pos_bit, uint32_t tie_bit) const {
    return tie_bit ? zero : (pos_bit ? pos : neg);
  }
};

// The tie byte a lane needs (byte `lane` of the tile's 32) for a tile with this flag: loaded only
// for kSomeTies, made from the flag for kOneTie + i.
__device__ __forceinline__ uint32_t tie_byte(const uint8_t* srow, int64_t V, int64_t tile,
                                             uint32_t flag, int lane) {
  if (flag == kSomeTies) return srow[sign_tie_offset(V) + tile * kTileBytes + lane];
  if (flag >= kOneTie)
    return ((flag - kOneTie) >> 3) == uint32_t(lane) ? 1u << ((flag - kOneTie) & 7u) : 0u;
  return flag == kAllTies ? 0xFFu : 0u;
}

// Writes one tile of gradient from the pos and tie bytes a lane loaded (byte `lane` of the
// tile's). Warp-collective. With kVec (rows of grad 16-byte aligned, so V % N == 0) a vector is
// either wholly inside the row or wholly past it, and is stored evict-first.
template <typename T, bool kVec>
__device__ __forceinline__ void write_tile(T* grow, int64_t V, int64_t tile, uint32_t pos_byte,
                                           uint32_t tie_byte, const Decoder<T>& dec, int lane) {
  constexpr int N = TileShape<T>::N, R = TileShape<T>::R;
  const uint32_t pos = unpack_lane_bits<R>(pos_byte, lane),
                 tie = unpack_lane_bits<R>(tie_byte, lane);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t e = lane_elem(tile, lane, r, N);
    if constexpr (kVec) {
      if (e < V) {
        uint4 out;
        T* o = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int k = 0; k < N; ++k)
          o[k] = dec((pos >> (r * N + k)) & 1u, (tie >> (r * N + k)) & 1u);
        __stcs(reinterpret_cast<uint4*>(grow) + e / N, out);
      }
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (e + k < V) grow[e + k] = dec((pos >> (r * N + k)) & 1u, (tie >> (r * N + k)) & 1u);
    }
  }
}

// Backward of a reduced loss: grid (rows, chunks), rows in reverse order, kTh threads, each warp
// taking tiles of its chunk with kU of them in flight (their flag and pos bytes, then the tie
// bytes of tiles that have some ties, all loaded before any store). The launcher's kTh and kU
// were measured on an H200 with bench/tvd_kernel_variants.
template <typename T, bool kVec, int kTh, int kU>
__global__ void __launch_bounds__(kTh) tvd_backward_kernel(TvdBackwardArgs<T> a) {
  constexpr int W = kTh / 32;
  wait_for_previous_grid();
  const int64_t row = a.rows - 1 - blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t V = a.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* srow = a.signs + row * sign_row_pitch(V);
  const uint8_t* flags = srow + sign_flag_offset(V);
  T* grow = a.grad + row * V;
  const float h = 0.5f * a.grad_output[0] * a.scale[0];  // device values: no host sync
  const Decoder<T> dec{from_float<T>(h), from_float<T>(-h), from_float<T>(0.f * h)};
  const ChunkRange range = chunk_range(sign_tiles(V), chunk, chunks);
  int64_t t = range.begin + warp;
  for (; t + (kU - 1) * W < range.end; t += kU * W) {
    uint32_t flag[kU], pos[kU], tie[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      flag[u] = flags[t + u * W];
      pos[u] = srow[(t + u * W) * kTileBytes + lane];
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      tie[u] = tie_byte(srow, V, t + u * W, flag[u], lane);  // all before any store
#pragma unroll
    for (int u = 0; u < kU; ++u) write_tile<T, kVec>(grow, V, t + u * W, pos[u], tie[u], dec, lane);
  }
  for (; t < range.end; t += W)
    write_tile<T, kVec>(grow, V, t, srow[t * kTileBytes + lane],
                        tie_byte(srow, V, t, flags[t], lane), dec, lane);
}

// Backward of 'none': grad_ij = sign_ij * 0.5 * grad_output_ij, element by element.
template <typename T>
__global__ void __launch_bounds__(kThreads) tvd_backward_none_kernel(TvdBackwardArgs<T> a) {
  wait_for_previous_grid();
  const int64_t row = blockIdx.x;
  const uint8_t* srow = a.signs + row * sign_row_pitch(a.V);
  for (int64_t j = threadIdx.x; j < a.V; j += kThreads)
    a.grad[row * a.V + j] = from_float<T>(sign_value<float>(sign_code_at(srow, a.V, j)) *
                                          (0.5f * a.grad_output[row * a.V + j]));
}

// Threads per block and tiles in flight per warp of the backward, per element size.
template <typename T>
struct BackwardShape {
  static constexpr int kTh = sizeof(T) == 4 ? 1024 : 512;
  static constexpr int kU = sizeof(T) == 4 ? 1 : 2;
};

// Whether Kernel, as it runs on the current device, has the griddepcontrol instructions: built
// from sm_90+ code (PTX version >= 9.0). A build that runs on Hopper from older PTX (say
// TORCH_CUDA_ARCH_LIST=8.0+PTX) has none, and must not be launched with programmatic dependent
// launch. Asked once per kernel and device.
template <auto Kernel>
bool waits_for_previous_grid() {
  constexpr int kMaxDevices = 64;
  static std::atomic<signed char> known[kMaxDevices];  // 0 not asked yet, 1 yes, -1 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return false;
  }
  signed char v = known[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    cudaFuncAttributes attr{};
    const bool ok = cudaFuncGetAttributes(&attr, Kernel) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    v = ok && attr.ptxVersion >= 90 ? 1 : -1;
    known[dev].store(v, std::memory_order_relaxed);
  }
  return v > 0;
}

// Kernel<<<grid, block, 0, stream>>>(args...), with programmatic dependent launch allowed if pdl
// and Kernel waits for the previous grid (then it may start while the kernel before it in the
// stream finishes; it waits for that kernel's memory before it reads any).
template <auto Kernel, typename... Args>
cudaError_t launch(bool pdl, dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && waits_for_previous_grid<Kernel>() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, Kernel, args...);
  if (err != cudaSuccess)
    (void)cudaGetLastError();  // reported by the return value, not left pending
  return err;
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

template <typename T, bool kVec, int kTh, int kU>
cudaError_t launch_backward(const TvdBackwardArgs<T>& a, cudaStream_t stream) {
  const dim3 grid(
      static_cast<unsigned>(a.rows),
      static_cast<unsigned>(chunks_per_row(a.rows, sign_tiles(a.V), (kTh / 32) * kU, a.num_sms)));
  return launch<tvd_backward_kernel<T, kVec, kTh, kU>>(a.pdl, grid, dim3(kTh), stream, a);
}

}  // namespace detail

// Scratch floats that tvd_forward needs in a.row_loss for a reduced loss: rows * chunks.
template <typename T>
int64_t tvd_forward_scratch(int64_t rows, int64_t V, int num_sms) {
  return rows * detail::forward_chunks<T>(rows, V, num_sms);
}

// Forward. Reduced losses (reduction != kNone) need a.row_loss (tvd_forward_scratch floats) and
// write the loss and the reduction's scale to *loss and *scale (device pointers). 'none' needs
// a.elem_loss. Two launches for reduced losses (rows pass + finalize), one for 'none'. With a.pdl
// the finalize is launched while the rows pass finishes and waits on the device for its memory
// (programmatic dependent launch: the finalize's launch latency overlaps the rows pass's tail).
template <typename T>
cudaError_t tvd_forward(TvdForwardArgs<T> a, Reduction reduction, float* loss, float* scale,
                        cudaStream_t stream) {
  const bool vec = detail::aligned16(a.p, a.p_row_stride * int64_t(sizeof(T))) &&
                   detail::aligned16(a.q, a.q_row_stride * int64_t(sizeof(T)));
  a.chunks = detail::forward_chunks<T>(a.rows, a.V, a.num_sms);
  if (a.rows > 0) {
    const cudaError_t err = vec ? detail::launch_forward_sel<T, true>(a, stream)
                                : detail::launch_forward_sel<T, false>(a, stream);
    if (err != cudaSuccess) return err;
  }
  if (reduction == kNone) return cudaSuccess;
  return detail::launch<detail::tvd_finalize_kernel>(
      a.pdl, dim3(1), dim3(detail::kThreads), stream, a.row_loss, a.rows * a.chunks, a.labels,
      a.ignore_index, a.rows, a.V, reduction, loss, scale);
}

// Backward: one launch, grad = sign * 0.5 * scale * grad_output (or * grad_output_ij for 'none').
// With a.pdl it may start while the kernel before it in the stream (whichever) finishes; it waits
// for that kernel's memory before it reads grad_output, the scale or the signs.
template <typename T, int kTh = detail::BackwardShape<T>::kTh,
          int kU = detail::BackwardShape<T>::kU>
cudaError_t tvd_backward(const TvdBackwardArgs<T>& a, Reduction reduction, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (reduction == kNone) {
    return detail::launch<detail::tvd_backward_none_kernel<T>>(
        a.pdl, dim3(static_cast<unsigned>(a.rows)), dim3(detail::kThreads), stream, a);
  }
  if (detail::aligned16(a.grad, a.V * int64_t(sizeof(T))))
    return detail::launch_backward<T, true, kTh, kU>(a, stream);
  return detail::launch_backward<T, false, kTh, kU>(a, stream);
}

}  // namespace lossfns::kernels

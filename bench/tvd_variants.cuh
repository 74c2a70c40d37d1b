// The workshop's kernels (bench/tvd_kernel_variants.cu times them): its own copy of the library's
// TVD kernels with the cache knobs the library fixed as constants, probes that take one cost out
// of the library's kernels, and the latency-hiding and phased variants of the backward. Built
// from the library's pieces (lib/src/tvd_cuda_kernel.cuh); workshop restrictions: V % 256 == 0
// and 16-byte aligned rows, no labels.
#pragma once

#include <cstdint>

#include "tvd_cuda_kernel.cuh"

namespace tvd_workshop {

using namespace lossfns::kernels;

// --- Cache knobs ------------------------------------------------------------------------------
// What the library chose (lib/src/tvd_cuda_kernel.cuh's header says why) is kLibraryHints; the
// workshop times the other combinations against it:
//   kKeepSignsInL2     forward: sign stores with an L2 evict-last policy (library: plain)
//   kReverseRows       backward: rows in reverse order, the signs the forward wrote last first
//   kStreamSignLoads   backward: evict-first sign loads (library: plain)
//   kStreamGradStores  backward: evict-first gradient stores
enum CacheHint : int {
  kKeepSignsInL2 = 1,
  kReverseRows = 2,
  kStreamSignLoads = 4,
  kStreamGradStores = 8
};
constexpr int kLibraryHints = kReverseRows | kStreamGradStores;

__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
template <bool kKeep>
__device__ __forceinline__ void store_byte(uint8_t* ptr, uint32_t v, uint64_t policy) {
  if constexpr (kKeep)
    asm volatile("st.global.L2::cache_hint.b8 [%0], %1, %2;" ::"l"(ptr),
                 "h"(static_cast<unsigned short>(v)), "l"(policy)
                 : "memory");
  else
    *ptr = static_cast<uint8_t>(v);
}
template <bool kStream>
__device__ __forceinline__ uint32_t load_byte(const uint8_t* ptr) {
  if constexpr (kStream)
    return __ldcs(ptr);
  else
    return *ptr;
}

// detail::emit_tile with the sign stores' policy as a knob.
template <int R, int N, bool kKeep>
__device__ __forceinline__ void emit_tile_knobs(const float (&d)[R * N], float& acc, uint8_t* srow,
                                                int64_t V, int64_t tile, int lane,
                                                uint64_t policy) {
  uint32_t pos = 0, tie = 0;
#pragma unroll
  for (int i = 0; i < R * N; ++i) {
    acc += fabsf(d[i]);
    pos |= static_cast<uint32_t>(d[i] > 0.f) << i;
    tie |= static_cast<uint32_t>(!(d[i] > 0.f) && !(d[i] < 0.f)) << i;
  }
  const uint32_t tie_byte = detail::pack_lane_bits<R>(tie, lane);
  bool store_ties;
  const uint32_t flag = detail::tile_flag<R>(tie_byte, lane, store_ties);
  const int64_t b = tile * kTileBytes + detail::lane_byte<R>(lane);
  store_byte<kKeep>(srow + b, detail::pack_lane_bits<R>(pos, lane), policy);
  if (store_ties) store_byte<kKeep>(srow + sign_tie_offset(V) + b, tie_byte, policy);
  if (lane == 0) store_byte<kKeep>(srow + sign_flag_offset(V) + tile, flag, policy);
}

// The library's forward rows pass (detail::tvd_forward_kernel: grid (rows, chunks), kThreads per
// block, kForwardTiles tiles per warp in flight) for whole aligned tiles with the signs saved,
// the sign stores' policy as a knob. The library's finalize follows it.
template <typename T, bool kKeep>
__global__ void __launch_bounds__(detail::kThreads) forward_knobs(TvdForwardArgs<T> a) {
  using detail::TileShape;
  constexpr int N = TileShape<T>::N, R = TileShape<T>::R, U = TileShape<T>::kForwardTiles,
                W = detail::kWarps;
  __shared__ float shared[W];
  const int64_t row = blockIdx.x, V = a.V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const detail::ChunkRange range = detail::chunk_range(sign_tiles(V), blockIdx.y, gridDim.y);
  uint8_t* srow = a.signs + row * sign_row_pitch(V);
  const uint4* p4 = reinterpret_cast<const uint4*>(a.p + row * a.p_row_stride);
  const uint4* q4 = reinterpret_cast<const uint4*>(a.q + row * a.q_row_stride);
  const uint64_t policy = kKeep ? l2_evict_last_policy() : 0;
  float acc = 0.f;
  for (int64_t t = range.begin + warp; t < range.end;
       t += U * W) {  // t is the same for a whole warp
    uint4 pv[U][R], qv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t v = detail::lane_elem(t + u * W < range.end ? t + u * W : t, lane, r, N) / N;
        pv[u][r] = __ldcs(p4 + v);
        qv[u][r] = __ldcs(q4 + v);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t + u * W >= range.end) break;
      float d[R * N];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int k = 0; k < N; ++k)
          d[r * N + k] = to_float(reinterpret_cast<const T*>(&pv[u][r])[k]) -
                         to_float(reinterpret_cast<const T*>(&qv[u][r])[k]);
      emit_tile_knobs<R, N, kKeep>(d, acc, srow, V, t + u * W, lane, policy);
    }
  }
  detail::let_next_grid_launch();
  acc = detail::block_sum(acc, shared);
  if (threadIdx.x == 0) a.row_loss[row * gridDim.y + blockIdx.y] = acc;
}

// detail::write_tile for aligned rows, with the gradient stores' policy as a knob.
template <typename T, bool kStream>
__device__ __forceinline__ void write_tile_knobs(T* grow, int64_t V, int64_t tile,
                                                 uint32_t pos_byte, uint32_t tie_byte,
                                                 const detail::Decoder<T>& dec, int lane) {
  constexpr int N = detail::TileShape<T>::N, R = detail::TileShape<T>::R;
  const uint32_t pos = detail::unpack_lane_bits<R>(pos_byte, lane),
                 tie = detail::unpack_lane_bits<R>(tie_byte, lane);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t e = detail::lane_elem(tile, lane, r, N);
    if (e >= V) continue;
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = dec((pos >> (r * N + k)) & 1u, (tie >> (r * N + k)) & 1u);
    if constexpr (kStream)
      __stcs(reinterpret_cast<uint4*>(grow) + e / N, out);
    else
      reinterpret_cast<uint4*>(grow)[e / N] = out;
  }
}

// The library's backward (detail::tvd_backward_kernel) for aligned rows with the row order, the
// sign loads' and the gradient stores' policy as knobs (kHints: CacheHint flags).
template <typename T, int kTh, int kU, int kHints>
__global__ void __launch_bounds__(kTh) backward_knobs(TvdBackwardArgs<T> a) {
  constexpr int W = kTh / 32;
  constexpr bool kRev = kHints & kReverseRows, kSl = kHints & kStreamSignLoads,
                 kSg = kHints & kStreamGradStores;
  detail::wait_for_previous_grid();
  const int64_t row = kRev ? a.rows - 1 - blockIdx.x : blockIdx.x, V = a.V;
  const int lane = threadIdx.x % 32;
  const uint8_t* srow = a.signs + row * sign_row_pitch(V);
  const uint8_t* flags = srow + sign_flag_offset(V);
  T* grow = a.grad + row * V;
  const float h = 0.5f * a.grad_output[0] * a.scale[0];
  const detail::Decoder<T> dec{from_float<T>(h), from_float<T>(-h), from_float<T>(0.f * h)};
  auto tie_of = [&](int64_t tile,
                    uint32_t flag) {  // the library's tie_byte, its one load as a knob
    return flag == kSomeTies ? load_byte<kSl>(srow + sign_tie_offset(V) + tile * kTileBytes + lane)
                             : detail::tie_byte(srow, V, tile, flag, lane);
  };
  const detail::ChunkRange range = detail::chunk_range(sign_tiles(V), blockIdx.y, gridDim.y);
  int64_t t = range.begin + threadIdx.x / 32;
  for (; t + (kU - 1) * W < range.end; t += kU * W) {
    uint32_t flag[kU], pos[kU], tie[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      flag[u] = load_byte<kSl>(flags + t + u * W);
      pos[u] = load_byte<kSl>(srow + (t + u * W) * kTileBytes + lane);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) tie[u] = tie_of(t + u * W, flag[u]);  // all before any store
#pragma unroll
    for (int u = 0; u < kU; ++u)
      write_tile_knobs<T, kSg>(grow, V, t + u * W, pos[u], tie[u], dec, lane);
  }
  for (; t < range.end; t += W)
    write_tile_knobs<T, kSg>(grow, V, t, load_byte<kSl>(srow + t * kTileBytes + lane),
                             tie_of(t, load_byte<kSl>(flags + t)), dec, lane);
}

// A forward (library finalize included) and a backward with the given knobs, launched as the
// library launches its kernels (programmatic dependent launch where a.pdl).
template <typename T>
cudaError_t forward_with_knobs(int hints, TvdForwardArgs<T> a, float* loss, float* scale,
                               cudaStream_t stream) {
  a.chunks = detail::forward_chunks<T>(a.rows, a.V, a.num_sms);
  const dim3 grid(unsigned(a.rows), unsigned(a.chunks));
  if (hints & kKeepSignsInL2)
    forward_knobs<T, true><<<grid, detail::kThreads, 0, stream>>>(a);
  else
    forward_knobs<T, false><<<grid, detail::kThreads, 0, stream>>>(a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return detail::launch<detail::tvd_finalize_kernel>(
      a.pdl, dim3(1), dim3(detail::kThreads), stream, a.row_loss, a.rows * a.chunks, a.labels,
      a.ignore_index, a.rows, a.V, kBatchMean, loss, scale);
}
template <typename T>
cudaError_t backward_with_knobs(int hints, const TvdBackwardArgs<T>& a, cudaStream_t stream) {
  constexpr int kTh = detail::BackwardShape<T>::kTh, kU = detail::BackwardShape<T>::kU;
  const dim3 grid(unsigned(a.rows), unsigned(detail::chunks_per_row(a.rows, sign_tiles(a.V),
                                                                    (kTh / 32) * kU, a.num_sms)));
  switch (hints & ~kKeepSignsInL2) {  // the combinations the workshop times
    case 0:
      return detail::launch<backward_knobs<T, kTh, kU, 0>>(a.pdl, grid, dim3(kTh), stream, a);
    case kReverseRows:
      return detail::launch<backward_knobs<T, kTh, kU, kReverseRows>>(a.pdl, grid, dim3(kTh),
                                                                      stream, a);
    case kStreamGradStores:
      return detail::launch<backward_knobs<T, kTh, kU, kStreamGradStores>>(a.pdl, grid, dim3(kTh),
                                                                           stream, a);
    case kLibraryHints:
      return detail::launch<backward_knobs<T, kTh, kU, kLibraryHints>>(a.pdl, grid, dim3(kTh),
                                                                       stream, a);
    case kLibraryHints | kStreamSignLoads:
      return detail::launch<backward_knobs<T, kTh, kU, kLibraryHints | kStreamSignLoads>>(
          a.pdl, grid, dim3(kTh), stream, a);
    default:
      return cudaErrorInvalidValue;
  }
}

// --- Data, probes and pipelines ---------------------------------------------------------------
// p for a tie pattern: p_i = q_i (a tie) where a hash of i falls below `tie_per_65536`, else a
// value that differs from q.
template <typename T>
__global__ void tie_pattern(T* p, const T* q, int64_t n, uint32_t tie_per_65536) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = uint32_t(i) * 2654435761u;
    p[i] = (h >> 16) < tie_per_65536 ? q[i] : from_float<T>(to_float(q[i]) * 1.5f + 1e-3f);
  }
}

// The library backward's gradient values, 0.5 * grad_output * scale, for the variants of it below.
template <typename T>
__device__ __forceinline__ detail::Decoder<T> library_decoder(const TvdBackwardArgs<T>& a) {
  const float h = 0.5f * a.grad_output[0] * a.scale[0];
  return {from_float<T>(h), from_float<T>(-h), from_float<T>(0.f * h)};
}

// Probes of the backward's grid: a fill with the library backward's grid (one block per row,
// kTh threads, kU 16-byte stores in flight), and the library backward itself with its sign loads
// replaced by constants, to split the backward's time between its grid and its loads. (The probes
// store the gradient plainly, as when docs/benchmarks.md's table was measured.)
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
    write_tile_knobs<T, false>(grow, V, t, uint32_t(0x5Au ^ lane ^ uint32_t(t)), 0u, dec, lane);
}

// The library backward reading every row's signs from one of 8 rows (which stay in L2): what the
// backward costs when its sign loads hit L2.
template <typename T, int kTh, int kU>
__global__ void __launch_bounds__(kTh)
    backward_l2_signs(TvdBackwardArgs<T> a, int64_t row_mask = 7) {
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
    for (int u = 0; u < kU; ++u)
      write_tile_knobs<T, false>(grow, V, t + u * W, pos[u], tie[u], dec, lane);
  }
  for (; t < tiles; t += W)
    write_tile_knobs<T, false>(grow, V, t, srow[t * kTileBytes + lane],
                               detail::tie_byte(srow, V, t, flags[t], lane), dec, lane);
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
    for (int u = 0; u < kU; ++u)
      tie[u] = t + u * W < tiles ? detail::tie_byte(srow, V, t + u * W, flag[u], lane) : 0u;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t tt = t + (kU + u) * W;
      nflag[u] = tt < tiles ? flags[tt] : 0u;
      npos[u] = tt < tiles ? srow[tt * kTileBytes + lane] : 0u;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (t + u * W < tiles)
        detail::write_tile<T, true>(grow, V, t + u * W, pos[u], tie[u], dec, lane);
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
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <typename T, int kTh>
__global__ void __launch_bounds__(kTh) backward_staged(TvdBackwardArgs<T> a, int stage_bytes) {
  constexpr int W = kTh / 32;
  extern __shared__ uint4 smem4[];
  const int64_t V = a.V, tiles = sign_tiles(V), pitch = sign_row_pitch(V);
  const int64_t pos_bytes = sign_tie_offset(V), flag_bytes = round_up_128(tiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const detail::Decoder<T> dec = library_decoder(a);
  uint8_t* buf[2] = {reinterpret_cast<uint8_t*>(smem4),
                     reinterpret_cast<uint8_t*>(smem4) + stage_bytes};
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
      detail::write_tile<T, true>(grow, V, t, sp[t * kTileBytes + lane],
                                  detail::tie_byte(srow, V, t, flag, lane), dec, lane);
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
__global__ void __launch_bounds__(kTh, kMinB)
    forward_phased(TvdForwardArgs<T> a, int k, float* partial) {
  constexpr int N = detail::TileShape<T>::N, R = detail::TileShape<T>::R,
                U = detail::TileShape<T>::kForwardTiles, W = kTh / 32;
  extern __shared__ uint4 smem4[];
  __shared__ float red[32];
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem4);
  const int64_t V = a.V, tiles = sign_tiles(V), pos_bytes = sign_tie_offset(V),
                flag_bytes = round_up_128(tiles);
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
              const float d = to_float(reinterpret_cast<const T*>(&pv[u][r])[e]) -
                              to_float(reinterpret_cast<const T*>(&qv[u][r])[e]);
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
        *reinterpret_cast<uint4*>(
            off < pos_bytes ? srow + off : srow + sign_flag_offset(V) + (off - pos_bytes)) = s4[i];
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
  const int64_t V = a.V, tiles = sign_tiles(V), pos_bytes = sign_tie_offset(V),
                flag_bytes = round_up_128(tiles);
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
        cp_async16(sm + j * stage + off,
                   off < pos_bytes ? srow + off : srow + sign_flag_offset(V) + (off - pos_bytes));
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
        detail::write_tile<T, true>(grow, V, t, s[t * kTileBytes + lane],
                                    detail::tie_byte(srow, V, t, s[pos_bytes + t], lane), dec,
                                    lane);
    }
    __syncthreads();
  }
}

__global__ void fill_kernel(uint4* dst, int64_t n16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = make_uint4(1, 2, 3, 4);
}

}  // namespace tvd_workshop

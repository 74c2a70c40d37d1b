// Workshop, not the library: times the library's TVD CUDA kernels (lib/src/tvd_cuda_kernel.cuh),
// the workshop's variants of them (tvd_variants.cuh) and the device's own fill and copy on raw
// CUDA buffers, one question a function, and checks what every variant computes against a
// float64 CPU reference. Prints a table; exits 1 when a check fails. Built in bench/ when the
// CUDA kernels are built; docs/benchmarks.md ("Kernel workshop") has the numbers.
// Usage: tvd_kernel_variants [--pipelines] [--pdl] [--l2] [--profile]
// (--profile: every row once, untimed, on two shapes, for Nsight Compute's counters: ncu
// --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum tvd_kernel_variants
// --profile) (The 2-bit design's variants and the column-blocked sign layouts of earlier sessions
// are gone: docs/benchmarks.md has their numbers, git history their code, bench/ at commit
// 749f0e4.)
#include <algorithm>
#include <cstdio>
#include <string>

#include "tvd_variants.cuh"
#include "tvd_workshop_host.cuh"

using namespace tvd_workshop;

namespace {

bool g_pipelines = false;  // --pipelines: the backward's latency-hiding and phased variants
bool g_pdl = false;        // --pdl: programmatic dependent launch of the finalize and the backward
bool g_l2 = false;         // --l2: an L2 set-aside for persisting lines with the keep-signs hint

__global__ void fill_kernel(uint4* dst, int64_t n16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = make_uint4(1, 2, 3, 4);
}

// The inputs a full pass runs on: p and q constant and different (no ties); q a copy of p (every
// tile all ties); p equal to q at 0.16% of the elements (what two unrelated bf16 softmax rows
// give: a third of the tiles have one tie) and at 4.4% (a student close to its teacher in bf16:
// every tile has several).
enum Data { kNoTies, kAllTies, kTies016, kTies44, kNumData };
constexpr uint32_t kTiesPer65536[kNumData] = {0, 65536, 105, 2884};

// One shape's buffers, the library's arguments for them, the references, and the table's rows.
template <typename T>
struct Shape {
  int64_t BT, V;
  int sms;
  size_t n, bytes;
  double limit, sign_bytes;  // the 3-stream bytes of a full pass; the signs of tie-free data
  float copy_ms = 0.f;       // the device's D2D copy: "% of the limit at copy speed"
  T *p, *q, *grad;
  T* data_p[kNumData];  // p of each data set (q is always q)
  uint8_t* signs;
  size_t sign_buf;
  float *row_loss, *loss, *scale, *go;
  TvdForwardArgs<T> fa{};
  TvdBackwardArgs<T> ba{};
  Reference refs[kNumData];
  bool have_ref[kNumData] = {};

  Shape(int64_t BT_, int64_t V_, int sms_)
      : BT(BT_), V(V_), sms(sms_), n(size_t(BT_) * V_), bytes(n * sizeof(T)) {
    limit = 3.0 * bytes;
    sign_bytes = double(BT) * (V / 8.0 + double(sign_tiles(V)));
    sign_buf = size_t(BT) * sign_row_pitch(V);
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
    data_p[kNoTies] = p;
    for (int d = kAllTies; d < kNumData;
         ++d) {  // separate buffers: the same buffer twice is read once
      CHECK(cudaMalloc(&data_p[d], bytes));
      if (d == kAllTies)
        CHECK(cudaMemcpy(data_p[d], q, bytes, cudaMemcpyDeviceToDevice));
      else
        tie_pattern<T><<<sms * 8, 256>>>(data_p[d], q, int64_t(n), kTiesPer65536[d]);
    }
    CHECK(cudaGetLastError());
    fa.p = p, fa.q = q, fa.p_row_stride = V, fa.q_row_stride = V, fa.labels = nullptr,
    fa.ignore_index = -100;
    fa.rows = BT, fa.V = V, fa.num_sms = sms, fa.row_loss = row_loss, fa.signs = signs;
    ba = TvdBackwardArgs<T>{signs, BT, V, go, scale, grad, sms};
    int major = 0;  // as the library's adapter launches: programmatic dependent launch on sm_90+
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    fa.pdl = ba.pdl = major >= 9;
  }
  ~Shape() {
    for (int d = kAllTies; d < kNumData; ++d) CHECK(cudaFree(data_p[d]));
    for (void* ptr : {(void*)p, (void*)q, (void*)grad, (void*)signs, (void*)row_loss, (void*)loss,
                      (void*)scale, (void*)go})
      CHECK(cudaFree(ptr));
  }

  TvdForwardArgs<T> forward_args(Data d) const {
    TvdForwardArgs<T> f = fa;
    f.p = data_p[d];
    return f;
  }
  const Reference& reference(Data d) {
    if (!have_ref[d]) refs[d] = MakeReference(data_p[d], q, BT, V), have_ref[d] = true;
    return refs[d];
  }
  void forward(Data d) { CHECK(tvd_forward(forward_args(d), kBatchMean, loss, scale, 0)); }
  void backward() { CHECK(tvd_backward(ba, kBatchMean, 0)); }
  // The gradient (and, unless the pass wrote none, the loss) of `pass` on data d against the
  // reference; the gradient buffer is cleared first, so a kernel that writes nothing fails.
  template <typename F>
  void check(const char* what, Data d, bool with_loss, F&& pass) {
    CHECK(cudaMemset(grad, 0x7f, bytes));
    pass();
    CHECK(cudaDeviceSynchronize());
    CheckPass<T>(what, reference(d), grad, with_loss ? loss : nullptr);
  }

  void row_full(const char* what, float ms) const {  // a full pass, against the 3-stream limit
    std::printf("  %-56s %8.4f ms  %6.0f GB/s  %5.1f%% of the limit at copy speed\n", what, ms,
                limit / (ms * 1e-3) / 1e9, 100.0 * (1.5 * copy_ms) / ms);
  }
  void row_rw(const char* what, float ms, double moved) const {
    std::printf("  %-56s %8.4f ms  %6.0f GB/s\n", what, ms, moved / (ms * 1e-3) / 1e9);
  }
};

// What the device itself does: a write-only fill and memset, a D2D copy (the "limit" of the
// full-pass rows is 1.5 copies: p and q read, grad written, at copy speed).
template <typename T>
void DeviceSpeed(Shape<T>& s) {
  s.row_rw("fill (write-only, 16B stores)",
           time_ms([&] { fill_kernel<<<s.sms * 8, 256>>>((uint4*)s.grad, s.bytes / 16); }),
           s.bytes);
  s.row_rw("cudaMemsetAsync (write-only)",
           time_ms([&] { CHECK(cudaMemsetAsync(s.grad, 0, s.bytes)); }), s.bytes);
  s.copy_ms =
      time_ms([&] { CHECK(cudaMemcpyAsync(s.grad, s.p, s.bytes, cudaMemcpyDeviceToDevice)); });
  s.row_rw("cudaMemcpy D2D (read+write)", s.copy_ms, 2.0 * s.bytes);
}

// The library's kernels as the adapter launches them: each pass, the forward without the
// finalize, and the full pass on each data set, checked.
template <typename T>
void LibraryKernels(Shape<T>& s) {
  TvdForwardArgs<T> nosigns = s.fa;
  nosigns.signs = nullptr;
  s.row_rw("forward, no signs (+finalize)",
           time_ms([&] { CHECK(tvd_forward(nosigns, kBatchMean, s.loss, s.scale, 0)); }),
           2.0 * s.bytes);
  s.row_rw("forward, signs (+finalize)", time_ms([&] { s.forward(kNoTies); }),
           2.0 * s.bytes + s.sign_bytes);
  auto rows_pass = [&](TvdForwardArgs<T> f) {
    f.chunks = detail::forward_chunks<T>(s.BT, s.V, s.sms);
    CHECK((detail::launch_forward_sel<T, true>(f, 0)));
  };
  s.row_rw("forward rows pass only (no signs, no finalize)", time_ms([&] { rows_pass(nosigns); }),
           2.0 * s.bytes);
  s.row_rw("forward rows pass only (signs, no finalize)", time_ms([&] { rows_pass(s.fa); }),
           2.0 * s.bytes + s.sign_bytes);
  s.forward(kNoTies);
  s.row_rw("backward (library)", time_ms([&] { s.backward(); }), s.bytes + s.sign_bytes);
  const char* names[kNumData] = {
      "full: library", "full: library, q equal to p (every tile all ties)",
      "full: library, 0.16% of elements tied", "full: library, 4.40% of elements tied"};
  for (Data d : {kNoTies, kAllTies, kTies016, kTies44}) {
    s.row_full(names[d], time_ms([&] {
                 s.forward(d);
                 s.backward();
               }));
    if (d == kTies016 || d == kTies44) {
      s.forward(d);
      s.row_rw(d == kTies016 ? "  its backward (0.16% tied)" : "  its backward (4.40% tied)",
               time_ms([&] { s.backward(); }), s.bytes + s.sign_bytes);
    }
    s.check(names[d] + 6, d, true, [&] {
      s.forward(d);
      s.backward();
    });
  }
}

// The backward's block shapes: threads per block x tiles in flight per warp (the library's:
// detail::BackwardShape).
template <typename T>
void BackwardShapes(Shape<T>& s) {
  auto shape = [&](const char* what, auto run) {
    s.forward(kTies44);
    s.row_rw(what, time_ms([&] { CHECK(run()); }), s.bytes + s.sign_bytes);
    s.check(what, kTies44, true, [&] {
      s.forward(kTies44);
      CHECK(run());
    });
  };
  shape("backward 256 x 2 tiles", [&] { return tvd_backward<T, 256, 2>(s.ba, kBatchMean, 0); });
  shape("backward 256 x 4 tiles", [&] { return tvd_backward<T, 256, 4>(s.ba, kBatchMean, 0); });
  shape("backward 512 x 1 tile", [&] { return tvd_backward<T, 512, 1>(s.ba, kBatchMean, 0); });
  shape("backward 512 x 2 tiles", [&] { return tvd_backward<T, 512, 2>(s.ba, kBatchMean, 0); });
  shape("backward 512 x 4 tiles", [&] { return tvd_backward<T, 512, 4>(s.ba, kBatchMean, 0); });
  shape("backward 1024 x 1 tile", [&] { return tvd_backward<T, 1024, 1>(s.ba, kBatchMean, 0); });
  shape("backward 1024 x 2 tiles", [&] { return tvd_backward<T, 1024, 2>(s.ba, kBatchMean, 0); });
}

// Where the backward's time goes: its grid, its sign loads, L2. Probes, not variants: their
// gradients are wrong by design and are not checked.
template <typename T>
void BackwardProbes(Shape<T>& s) {
  constexpr int kTh = detail::BackwardShape<T>::kTh, kU = detail::BackwardShape<T>::kU;
  const unsigned rows = unsigned(s.BT);
  s.forward(kNoTies);
  s.row_rw("  fill with the backward's grid (block per row)",
           time_ms([&] { fill_rows<T, kTh, kU><<<rows, kTh>>>(s.grad, s.V); }), s.bytes);
  s.row_rw("  backward with constant signs (no sign loads)",
           time_ms([&] { backward_no_loads<T, kTh, kU><<<rows, kTh>>>(s.ba); }), s.bytes);
  s.row_rw("  backward with its signs in L2 (8 rows' signs)",
           time_ms([&] { backward_l2_signs<T, kTh, kU><<<rows, kTh>>>(s.ba); }), s.bytes);
  for (int64_t k : {256, 1024, 2048}) {  // how big a sign set stays in L2 under the grad stream
    if (k >= s.BT) continue;
    char what[96];
    std::snprintf(what, sizeof what, "  backward with signs of %lld rows (%.1f MB)", (long long)k,
                  k * sign_row_pitch(s.V) / 1e6);
    s.row_rw(what, time_ms([&] { backward_l2_signs<T, kTh, kU><<<rows, kTh>>>(s.ba, k - 1); }),
             s.bytes);
  }
  // After a forward: does the backward find the signs the forward just wrote in L2?
  const size_t flush_bytes = size_t(256) << 20;  // more than the L2
  void* flush_buf;
  CHECK(cudaMalloc(&flush_buf, flush_bytes));
  auto flush = [&] { CHECK(cudaMemsetAsync(flush_buf, 0, flush_bytes)); };
  const float f_ms = time_ms([&] { s.forward(kNoTies); });
  const float ff_ms = time_ms([&] {
    s.forward(kNoTies);
    flush();
  });
  const float fb_ms = time_ms([&] {
    s.forward(kNoTies);
    s.backward();
  });
  const float ffb_ms = time_ms([&] {
    s.forward(kNoTies);
    flush();
    s.backward();
  });
  s.row_rw("  backward right after a forward (fwd+bwd - fwd)", fb_ms - f_ms,
           s.bytes + s.sign_bytes);
  s.row_rw("  backward after a forward and a 256 MB memset (difference)", ffb_ms - ff_ms,
           s.bytes + s.sign_bytes);
  CHECK(cudaFree(flush_buf));
}

// The cache knobs the library fixed (tvd_variants.cuh's CacheHint), on the workshop's copy of
// its kernels: each combination timed on tie-free data and checked on the 4.4%-ties data.
template <typename T>
void CacheHints(Shape<T>& s) {
  const int combos[] = {kLibraryHints,  0,
                        kReverseRows,   kStreamGradStores,
                        kKeepSignsInL2, kKeepSignsInL2 | kLibraryHints | kStreamSignLoads};
  for (int hints : combos) {
    char what[112];
    std::snprintf(what, sizeof what, "full: hints%s%s%s%s%s%s", hints == 0 ? " none" : "",
                  hints & kKeepSignsInL2 ? " keep-signs-in-L2" : "",
                  hints & kReverseRows ? " reverse-rows" : "",
                  hints & kStreamSignLoads ? " stream-sign-loads" : "",
                  hints & kStreamGradStores ? " stream-grad-stores" : "",
                  hints == kLibraryHints ? " (the library's)" : "");
    auto pass = [&](Data d) {
      CHECK(forward_with_knobs(hints, s.forward_args(d), s.loss, s.scale, 0));
      CHECK(backward_with_knobs(hints, s.ba, 0));
    };
    s.row_full(what, time_ms([&] { pass(kNoTies); }));
    s.check(what + 6, kTies44, true, [&] { pass(kTies44); });
  }
}

// Phased: threads x blocks per SM, rows per block per phase (as many as fit, or 2).
template <typename T>
void Phased(Shape<T>& s) {
  const int64_t st = sign_tie_offset(s.V) + round_up_128(sign_tiles(s.V));
  auto rows_per_block = [&](int B, int kmax) {
    const int64_t G = int64_t(s.sms) * B, fit = (220 * 1024 / B) / st;
    return int(std::min<int64_t>({fit, (s.BT + G - 1) / G, int64_t(kmax)}));
  };
  CHECK(cudaFuncSetAttribute(forward_phased<T, 1024, 1>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  CHECK(cudaFuncSetAttribute(forward_phased<T, 512, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             110 * 1024));
  CHECK(cudaFuncSetAttribute(backward_phased<T, 1024, 2>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, 110 * 1024));
  CHECK(cudaFuncSetAttribute(backward_phased<T, 512, 4>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, 55 * 1024));
  auto fwd = [&](const TvdForwardArgs<T>& f, int th, int kmax) {
    const int B = th == 1024 ? 1 : 2, k = rows_per_block(B, kmax);
    const size_t smem = size_t(k) * st;
    if (th == 1024)
      forward_phased<T, 1024, 1><<<unsigned(s.sms * B), 1024, smem>>>(f, k, s.row_loss);
    else
      forward_phased<T, 512, 2><<<unsigned(s.sms * B), 512, smem>>>(f, k, s.row_loss);
  };
  auto bwd = [&](int th, int kmax) {
    const int B = th == 1024 ? 2 : 4, k = rows_per_block(B, kmax);
    const size_t smem = size_t(k) * st;
    if (th == 1024)
      backward_phased<T, 1024, 2><<<unsigned(s.sms * B), 1024, smem>>>(s.ba, k);
    else
      backward_phased<T, 512, 4><<<unsigned(s.sms * B), 512, smem>>>(s.ba, k);
  };
  auto phases = [&](int B, int kmax) {
    const int64_t G = int64_t(s.sms) * B, k = rows_per_block(B, kmax);
    return int((s.BT + G * k - 1) / (G * k));
  };
  const int big = 1 << 20;
  char what[128];
  for (int th : {1024, 512}) {
    for (int kmax : {big, 2}) {
      const int Bf = th == 1024 ? 1 : 2, Bb = th == 1024 ? 2 : 4;
      std::snprintf(what, sizeof what, "forward phased %d x %d/SM, %d rows/block/phase, %d phases",
                    th, Bf, rows_per_block(Bf, kmax), phases(Bf, kmax));
      s.row_rw(what, time_ms([&] { fwd(s.fa, th, kmax); }), 2.0 * s.bytes + s.sign_bytes);
      std::snprintf(what, sizeof what, "backward phased %d x %d/SM, %d rows/block/phase, %d phases",
                    th, Bb, rows_per_block(Bb, kmax), phases(Bb, kmax));
      s.row_rw(what, time_ms([&] { bwd(th, kmax); }), s.bytes + s.sign_bytes);
      std::snprintf(what, sizeof what, "full: phased fwd + phased bwd (%d threads, %s)", th,
                    kmax == big ? "rows that fit" : "2 rows");
      s.row_full(what, time_ms([&] {
                   fwd(s.fa, th, kmax);
                   bwd(th, kmax);
                 }));
      if (kmax != big) continue;
      std::snprintf(what, sizeof what, "full: library fwd + phased bwd (%d threads)", th);
      s.row_full(what, time_ms([&] {
                   s.forward(kNoTies);
                   bwd(th, kmax);
                 }));
      std::snprintf(what, sizeof what, "full: phased fwd + library bwd (%d threads)", th);
      s.row_full(what, time_ms([&] {
                   fwd(s.fa, th, kmax);
                   s.backward();
                 }));
      // The phased forward writes per-block partial sums, not the library's: its loss is not
      // checked; its signs are, through the phased backward (and the scale of a library pass).
      std::snprintf(what, sizeof what, "phased fwd + phased bwd %d (4.40%% tied)", th);
      s.check(what, kTies44, false, [&] {
        s.forward(kTies44);  // the scale
        CHECK(cudaMemset(s.signs, 0x77, s.sign_buf));
        fwd(s.forward_args(kTies44), th, kmax);
        bwd(th, kmax);
      });
    }
  }
}

// --pipelines: the backward with its sign loads ahead of its stores (registers, or cp.async into
// shared memory a row ahead), and the phased forward and backward (sign traffic in whole-GPU
// bursts). Each checked on both tie patterns.
template <typename T>
void Pipelines(Shape<T>& s) {
  const unsigned rows = unsigned(s.BT);
  const int stage = int(sign_tie_offset(s.V) + round_up_128(sign_tiles(s.V)));
  auto staged = [&](int th, int per_sm) {
    const unsigned g = unsigned(std::min<int64_t>(s.BT, int64_t(s.sms) * per_sm));
    if (th == 512)
      backward_staged<T, 512><<<g, 512, 2 * stage>>>(s.ba, stage);
    else
      backward_staged<T, 256><<<g, 256, 2 * stage>>>(s.ba, stage);
  };
  s.forward(kNoTies);
  s.row_rw("backward ahead (loads one step ahead) 512 x 2, 4 blocks/SM",
           time_ms([&] { backward_ahead<T, 512, 2, 4><<<rows, 512>>>(s.ba); }),
           s.bytes + s.sign_bytes);
  s.row_rw("backward ahead 512 x 2, 2 blocks/SM",
           time_ms([&] { backward_ahead<T, 512, 2, 2><<<rows, 512>>>(s.ba); }),
           s.bytes + s.sign_bytes);
  s.row_rw("backward ahead 512 x 1, 4 blocks/SM",
           time_ms([&] { backward_ahead<T, 512, 1, 4><<<rows, 512>>>(s.ba); }),
           s.bytes + s.sign_bytes);
  s.row_rw("backward ahead 256 x 4, 8 blocks/SM",
           time_ms([&] { backward_ahead<T, 256, 4, 8><<<rows, 256>>>(s.ba); }),
           s.bytes + s.sign_bytes);
  s.row_full("full: library forward + backward ahead 512 x 2, 4/SM", time_ms([&] {
               s.forward(kNoTies);
               backward_ahead<T, 512, 2, 4><<<rows, 512>>>(s.ba);
             }));
  for (int per_sm : {2, 3, 4}) {
    for (int th : {256, 512}) {
      if (size_t(2 * stage) * per_sm > 200 * 1024 || th * per_sm > 2048) continue;
      char what[96];
      s.forward(kNoTies);
      std::snprintf(what, sizeof what, "backward staged (cp.async, next row ahead) %d x %d/SM", th,
                    per_sm);
      s.row_rw(what, time_ms([&] { staged(th, per_sm); }), s.bytes + s.sign_bytes);
      std::snprintf(what, sizeof what, "full: library forward + backward staged %d x %d/SM", th,
                    per_sm);
      s.row_full(what, time_ms([&] {
                   s.forward(kNoTies);
                   staged(th, per_sm);
                 }));
    }
  }
  for (Data d : {kTies016, kTies44}) {
    const char* tied = d == kTies016 ? "0.16%" : "4.40%";
    char what[112];
    s.forward(d);
    std::snprintf(what, sizeof what, "  its backward staged 512 x 4/SM (%s tied)", tied);
    s.row_rw(what, time_ms([&] { staged(512, 4); }), s.bytes + s.sign_bytes);
    std::snprintf(what, sizeof what, "full: fwd + backward staged 512 x 4/SM, %s tied", tied);
    s.row_full(what, time_ms([&] {
                 s.forward(d);
                 staged(512, 4);
               }));
    std::snprintf(what, sizeof what, "library forward + backward staged (%s tied)", tied);
    s.check(what, d, true, [&] {
      s.forward(d);
      staged(512, 4);
    });
    std::snprintf(what, sizeof what, "library forward + backward ahead (%s tied)", tied);
    s.check(what, d, true, [&] {
      s.forward(d);
      backward_ahead<T, 512, 2, 4><<<rows, 512>>>(s.ba);
    });
  }
  Phased(s);
}

// --pdl: programmatic dependent launch of the forward's finalize and of the backward, on the
// default stream and on a stream of its own.
template <typename T>
void ProgrammaticLaunch(Shape<T>& s) {
  constexpr int kTh = detail::BackwardShape<T>::kTh, kU = detail::BackwardShape<T>::kU;
  TvdForwardArgs<T> f = s.fa;
  f.chunks = detail::forward_chunks<T>(s.BT, s.V, s.sms);
  const dim3 fgrid(unsigned(s.BT), unsigned(f.chunks));
  const dim3 bgrid(unsigned(s.BT),
                   unsigned(detail::chunks_per_row(s.BT, sign_tiles(s.V), (kTh / 32) * kU, s.sms)));
  auto finalize = [&](cudaStream_t st, bool pdl) {
    CHECK(detail::launch<detail::tvd_finalize_kernel>(
        pdl, dim3(1), dim3(detail::kThreads), st, (const float*)s.row_loss,
        int64_t(s.BT * f.chunks), (const int64_t*)nullptr, int64_t(-100), int64_t(s.BT),
        int64_t(s.V), kBatchMean, s.loss, s.scale));
  };
  auto chain = [&](cudaStream_t st, bool pdl_fin, bool pdl_bwd) {
    detail::tvd_forward_kernel<T, true, true, false><<<fgrid, detail::kThreads, 0, st>>>(f);
    finalize(st, pdl_fin);
    CHECK((detail::launch<detail::tvd_backward_kernel<T, true, kTh, kU>>(pdl_bwd, bgrid, dim3(kTh),
                                                                         st, s.ba)));
  };
  cudaStream_t own;
  CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  for (cudaStream_t st : {cudaStream_t(0), own}) {
    const char* on = st == 0 ? "stream 0" : "own stream";
    char what[112];
    std::snprintf(what, sizeof what, "full, %s: plain launches", on);
    s.row_full(what, time_ms_on(st, [&] { chain(st, false, false); }));
    std::snprintf(what, sizeof what, "full, %s: finalize PDL", on);
    s.row_full(what, time_ms_on(st, [&] { chain(st, true, false); }));
    std::snprintf(what, sizeof what, "full, %s: finalize and backward PDL", on);
    s.row_full(what, time_ms_on(st, [&] { chain(st, true, true); }));
    std::snprintf(what, sizeof what, "fwd+finalize, %s: plain / PDL", on);
    const float a0 = time_ms_on(st, [&] {
      detail::tvd_forward_kernel<T, true, true, false><<<fgrid, detail::kThreads, 0, st>>>(f);
      finalize(st, false);
    });
    const float a1 = time_ms_on(st, [&] {
      detail::tvd_forward_kernel<T, true, true, false><<<fgrid, detail::kThreads, 0, st>>>(f);
      finalize(st, true);
    });
    std::printf("  %-56s %8.4f / %.4f ms\n", what, a0, a1);
  }
  s.check("PDL chain, 20 times back to back on its own stream", kNoTies, true, [&] {
    for (int rep = 0; rep < 20; ++rep) {
      CHECK(cudaMemsetAsync(s.grad, 0, s.bytes, own));
      CHECK(cudaMemsetAsync(s.loss, 0, 4, own));
      CHECK(cudaMemsetAsync(s.scale, 0, 4, own));
      chain(own, true, true);
    }
  });
  CHECK(cudaStreamDestroy(own));
}

// --l2: an L2 set-aside for persisting lines (device-wide state: an application's choice, never a
// library's; reset after), with and without the keep-signs hint, back to back and L2-flushed.
template <typename T>
void L2SetAside(Shape<T>& s) {
  int l2 = 0, max_persist = 0;
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  CHECK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0));
  std::printf("  L2 %.1f MB, persisting set-aside up to %.1f MB; signs %.1f MB\n", l2 / 1e6,
              max_persist / 1e6, s.sign_bytes / 1e6);
  const size_t flush_bytes = size_t(256) << 20;
  void* flush_buf;
  CHECK(cudaMalloc(&flush_buf, flush_bytes));
  auto flush = [&] { CHECK(cudaMemsetAsync(flush_buf, 0, flush_bytes)); };
  const float flush_ms = time_ms(flush);
  for (size_t aside : {size_t(0), size_t(max_persist) / 2, size_t(max_persist)}) {
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, aside));
    size_t got_aside = 0;
    CHECK(cudaDeviceGetLimit(&got_aside, cudaLimitPersistingL2CacheSize));
    for (int hints :
         {kLibraryHints, kKeepSignsInL2 | kLibraryHints,
          kKeepSignsInL2 | kLibraryHints | kStreamSignLoads, kKeepSignsInL2 | kStreamGradStores}) {
      auto fwd = [&] { CHECK(forward_with_knobs(hints, s.fa, s.loss, s.scale, 0)); };
      auto bwd = [&] { CHECK(backward_with_knobs(hints, s.ba, 0)); };
      std::printf("  set-aside %.1f MB, fwd%s, bwd%s%s\n", got_aside / 1e6,
                  hints & kKeepSignsInL2 ? " keep" : " default",
                  hints & kReverseRows ? " reverse" : " forward-order",
                  hints & kStreamSignLoads ? " stream-sign-loads" : "");
      s.row_full("  full, back to back", time_ms([&] {
                   fwd();
                   bwd();
                 }));
      const float fwd_flush = time_ms([&] {
        fwd();
        flush();
      });
      const float full_flush = time_ms([&] {
        fwd();
        bwd();
        flush();
      });
      s.row_full("  full, L2 flushed after each (flush time taken off)", full_flush - flush_ms);
      s.row_rw("  its backward (fwd+bwd+flush - fwd+flush)", full_flush - fwd_flush,
               s.bytes + s.sign_bytes);
      s.row_rw("  its forward (fwd+flush - flush)", fwd_flush - flush_ms,
               2.0 * s.bytes + s.sign_bytes);
    }
    CHECK(cudaCtxResetPersistingL2Cache());
  }
  CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0));
  CHECK(cudaFree(flush_buf));
}

template <typename T>
void RunShape(int64_t BT, int64_t V, const char* name, int sms) {
  Shape<T> s(BT, V, sms);
  std::printf("\n%s (%lld, %lld): 3 streams = %.0f MB\n", name, (long long)BT, (long long)V,
              s.limit / 1e6);
  DeviceSpeed(s);
  LibraryKernels(s);
  BackwardShapes(s);
  BackwardProbes(s);
  CacheHints(s);
  if (g_pipelines) Pipelines(s);
  if (g_pdl) ProgrammaticLaunch(s);
  if (g_l2) L2SetAside(s);
  CHECK(cudaGetLastError());
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--profile")
      g_profile = true;
    else if (arg == "--pipelines")
      g_pipelines = true;
    else if (arg == "--pdl")
      g_pdl = true;
    else if (arg == "--l2")
      g_l2 = true;
    else {
      std::fprintf(stderr, "usage: tvd_kernel_variants [--pipelines] [--pdl] [--l2] [--profile]\n");
      return 2;
    }
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The workshop's shapes (V % 256 == 0: whole tiles, aligned rows).
  RunShape<__nv_bfloat16>(4096, 32000, "bf16", sms);
  if (!g_profile) {
    RunShape<float>(4096, 32000, "fp32", sms);
  }
  RunShape<__nv_bfloat16>(8192, 128256, "bf16", sms);
  if (!g_profile) {
    RunShape<float>(16384, 131072, "fp32", sms);
    RunShape<__nv_bfloat16>(512, 32000, "bf16", sms);
  }
  std::printf("\n%s\n",
              g_failed ? "FAIL: a check differs from the float64 reference" : "every check ok");
  return g_failed ? 1 : 0;
}

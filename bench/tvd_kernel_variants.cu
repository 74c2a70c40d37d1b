// Workshop, not the library: times the TVD CUDA kernels (from lib/src/tvd_cuda_kernel.cuh) and
// candidate backward variants against the device's own write and copy speed, on raw CUDA buffers.
// Prints a table. Build: part of bench/ when the CUDA kernels are built. Usage: tvd_kernel_variants
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../lib/src/tvd_cuda_kernel.cuh"

using namespace lossfns::kernels;

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// Backward variant: kStream (st.global.cs or plain), kU (independent 16-byte stores in flight),
// kThreadsV (threads per block). One block per (row, chunk) as in the library.
template <typename T, bool kStream, int kU, int kThreadsV>
__global__ void __launch_bounds__(kThreadsV) backward_variant(const uint8_t* signs, int64_t V, const float* go,
                                                              const float* scale, T* grad) {
  constexpr int N = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const uint8_t* srow = signs + row * sign_row_pitch(V);
  uint4* g4 = reinterpret_cast<uint4*>(grad + row * V);
  const float h = 0.5f * go[0] * scale[0];
  const detail::Decoder<T> dec{detail::from_float<T>(h), detail::from_float<T>(-h), detail::from_float<T>(0.f * h)};
  const int64_t groups = V / N;
  auto decode = [&](uint32_t bits) {
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = dec(bits >> (2 * k));
    return out;
  };
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

__global__ void fill_kernel(uint4* dst, int64_t n16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = make_uint4(1, 2, 3, 4);
}

template <typename F>
float time_ms(F&& f) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < 10; ++i) f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / 10);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
void run_shape(int64_t BT, int64_t V, const char* name, int sms) {
  const size_t n = size_t(BT) * V, bytes = n * sizeof(T);
  T *p, *q, *grad;
  uint8_t* signs;
  float *row_loss, *loss, *scale, *go;
  CHECK(cudaMalloc(&p, bytes));
  CHECK(cudaMalloc(&q, bytes));
  CHECK(cudaMalloc(&grad, bytes));
  CHECK(cudaMalloc(&signs, BT * sign_row_pitch(V)));
  CHECK(cudaMalloc(&row_loss, tvd_forward_scratch<T>(BT, V, sms) * sizeof(float)));
  CHECK(cudaMalloc(&loss, 4));
  CHECK(cudaMalloc(&scale, 4));
  CHECK(cudaMalloc(&go, 4));
  CHECK(cudaMemset(p, 0x3c, bytes));  // arbitrary finite values, p != q in most places
  CHECK(cudaMemset(q, 0x3b, bytes));
  const float one = 1.f;
  CHECK(cudaMemcpy(go, &one, 4, cudaMemcpyHostToDevice));
  TvdForwardArgs<T> fa{};
  fa.p = p; fa.q = q; fa.p_row_stride = V; fa.q_row_stride = V; fa.labels = nullptr; fa.ignore_index = -100;
  fa.rows = BT; fa.V = V; fa.num_sms = sms; fa.row_loss = row_loss; fa.signs = signs;
  TvdForwardArgs<T> fa_nosigns = fa;
  fa_nosigns.signs = nullptr;
  TvdBackwardArgs<T> ba{signs, BT, V, go, scale, grad, sms};
  const double limit = 3.0 * bytes;
  std::printf("\n%s (%lld, %lld): 3 streams = %.0f MB\n", name, (long long)BT, (long long)V, limit / 1e6);
  auto row = [&](const char* what, float ms, double moved) {
    std::printf("  %-44s %8.4f ms  %6.0f GB/s\n", what, ms, moved / (ms * 1e-3) / 1e9);
  };
  const double sign_bytes = double(BT) * V / 4;
  row("fill (write-only, 16B stores)", time_ms([&] { fill_kernel<<<sms * 8, 256>>>((uint4*)grad, bytes / 16); }), bytes);
  row("cudaMemcpy D2D (read+write)", time_ms([&] { CHECK(cudaMemcpyAsync(grad, p, bytes, cudaMemcpyDeviceToDevice)); }), 2.0 * bytes);
  row("forward, no signs (+finalize)", time_ms([&] { CHECK(tvd_forward(fa_nosigns, kBatchMean, loss, scale, 0)); }), 2.0 * bytes);
  row("forward, signs (+finalize)", time_ms([&] { CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0)); }), 2.0 * bytes + sign_bytes);
  row("backward (library)", time_ms([&] { CHECK(tvd_backward(ba, kBatchMean, 0)); }), bytes + sign_bytes);
  const unsigned grid = unsigned(BT);
  row("backward plain stores, U4, 256", time_ms([&] { backward_variant<T, false, 4, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward .cs stores, U4, 256", time_ms([&] { backward_variant<T, true, 4, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward plain stores, U8, 256", time_ms([&] { backward_variant<T, false, 8, 256><<<grid, 256>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward plain stores, U2, 512", time_ms([&] { backward_variant<T, false, 2, 512><<<grid, 512>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  row("backward plain stores, U1, 1024", time_ms([&] { backward_variant<T, false, 1, 1024><<<grid, 1024>>>(signs, V, go, scale, grad); }), bytes + sign_bytes);
  const float full = time_ms([&] {
    CHECK(tvd_forward(fa, kBatchMean, loss, scale, 0));
    CHECK(tvd_backward(ba, kBatchMean, 0));
  });
  row("full: forward (signs) + backward (library)", full, limit);
  CHECK(cudaGetLastError());
  for (void* ptr : {(void*)p, (void*)q, (void*)grad, (void*)signs, (void*)row_loss, (void*)loss, (void*)scale, (void*)go})
    CHECK(cudaFree(ptr));
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  run_shape<__nv_bfloat16>(4096, 32000, "bf16", sms);
  run_shape<float>(4096, 32000, "fp32", sms);
  run_shape<__nv_bfloat16>(8192, 128256, "bf16", sms);
  run_shape<float>(16384, 131072, "fp32", sms);
  run_shape<__nv_bfloat16>(512, 32000, "bf16", sms);
  return 0;
}

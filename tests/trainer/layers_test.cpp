// The model layers of trainer/src/models/layers.h: the LayerNorm with column-sum weight
// gradients, the composite AddNorm, RoPE and SwiGLU on the CPU (against ATen / float64), the
// fused CUDA kernels (AddNorm against a float64 reference over widths, dtypes and autocast; RoPE
// and SwiGLU against the composite, value for value, and float64), and whole models on CUDA
// (fused) against the same weights on the CPU (composite); a frozen model's matmul weights stored
// in bf16 (StoreMatmulWeightsAs) compute what autocast computed from fp32 ones, bit for bit; the
// CUDA Linear's bias gradient (a column-sum kernel) against float64 and at::linear's; the CUDA
// LinearGelu against gelu(Linear(...)), bit for bit, and float64.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "distill/autocast.h"
#include "distill/model.h"
#include "models/layers.h"

namespace distill {
namespace {

double MaxRelDiff(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().cpu().to(at::kDouble), w = want.detach().cpu().to(at::kDouble);
  // Relative to the largest reference value (at least 1e-3: some references are all zero, as
  // the weight gradient of a LayerNorm over one element).
  return (g - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-3);
}

torch::nn::LayerNorm MakeLayerNorm(int64_t d, const at::Device& device) {
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({d}));
  torch::NoGradGuard no_grad;
  ln->weight.copy_(at::randn({d}) * 0.5 + 1.0);
  ln->bias.copy_(at::randn({d}) * 0.1);
  ln->to(device);
  return ln;
}

TEST(LayersTest, LayerNormMatchesAtenIncludingGradients) {
  torch::manual_seed(1);
  auto ln = MakeLayerNorm(37, at::kCPU);
  ln->to(at::kDouble);
  const at::Tensor x = (at::randn({5, 3, 37}, at::kDouble) * 3 + 1).requires_grad_();
  const at::Tensor go = at::randn({5, 3, 37}, at::kDouble);
  const at::Tensor ours = LayerNorm(ln, x);
  const auto grads = torch::autograd::grad({ours}, {x, ln->weight, ln->bias}, {go});
  const at::Tensor ref = at::layer_norm(x, {37}, ln->weight, ln->bias, 1e-5);
  const auto ref_grads = torch::autograd::grad({ref}, {x, ln->weight, ln->bias}, {go});
  EXPECT_LT(MaxRelDiff(ours, ref), 1e-12);
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(MaxRelDiff(grads[i], ref_grads[i]), 1e-12) << i;
}

TEST(LayersTest, CompositeAddNormOnCpu) {
  torch::manual_seed(2);
  auto ln = MakeLayerNorm(16, at::kCPU);
  const at::Tensor x = at::randn({4, 16}), y = at::randn({4, 16}), w = at::randn({16});
  const AddNormResult a = AddLayerNorm(x, y, ln);
  EXPECT_TRUE(a.h.equal(x + y));
  EXPECT_TRUE(a.out.equal(LayerNorm(ln, x + y)));
  const AddNormResult r = AddRmsNorm(x, y, w, 1e-6);
  EXPECT_TRUE(r.out.equal(RmsNorm(x + y, w, 1e-6)));
  const at::Tensor h = (x + y).to(at::kDouble);
  const at::Tensor ref = w.to(at::kDouble) * h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-6);
  EXPECT_LT(MaxRelDiff(r.out, ref), 1e-6);
}

struct FusedCase {
  int64_t rows, d;
  at::ScalarType y_dtype;
  bool autocast, rms, grad_h;
  bool misaligned = false;    // the output's gradient starts one element past an aligned address
  bool misaligned_h = false;  // grad_h likewise
  bool misaligned_w = false;  // the weight and bias likewise (views one element into a buffer)
  bool fp16_out = false;      // under autocast: fp16 autocast (the output fp16), else bf16
};

std::string Name(const FusedCase& c) {
  return fmt::format("rows {} d {} y {} autocast {}{} {} grad_h {}{}{}{}", c.rows, c.d,
                     c10::toString(c.y_dtype), c.autocast, c.fp16_out ? " fp16" : "",
                     c.rms ? "rms" : "layer", c.grad_h, c.misaligned ? " misaligned" : "",
                     c.misaligned_h ? " misaligned grad_h" : "",
                     c.misaligned_w ? " misaligned weight" : "");
}

// A contiguous (rows, d) view one element past an aligned start when `misaligned`.
at::Tensor MaybeMisaligned(const at::Tensor& flat_src, int64_t rows, int64_t d, bool misaligned) {
  return flat_src.narrow(0, misaligned ? 1 : 0, rows * d).view({rows, d});
}

void CheckFused(const FusedCase& c) {
  SCOPED_TRACE(Name(c));
  torch::manual_seed(3);
  const at::Device cuda(at::kCUDA, 0);
  const double eps = 1e-5;
  const at::Tensor x = (at::randn({c.rows, c.d}) * 2 + 0.5).to(cuda);
  const at::Tensor y = at::randn({c.rows, c.d}).to(cuda).to(c.y_dtype);
  auto ln = MakeLayerNorm(c.d, cuda);
  if (c.misaligned_w) {
    // The module's own parameters moved one element into a wider buffer (as a flat parameter
    // buffer can place them), keeping their values.
    torch::NoGradGuard no_grad;
    for (at::Tensor p : {ln->weight, ln->bias}) {
      const at::Tensor buf = at::empty({c.d + 1}, p.options());
      buf.narrow(0, 1, c.d).copy_(p);
      p.set_(buf.storage(), 1, {c.d}, {1});
    }
    ASSERT_NE(reinterpret_cast<uintptr_t>(ln->weight.const_data_ptr()) % 16, 0u);
  }
  const at::Tensor w = ln->weight, b = ln->bias;
  const at::Tensor xf = x.clone().requires_grad_(), yf = y.clone().requires_grad_();
  // The output's dtype is autocast's (FusedOutDtype), whatever y's.
  const at::ScalarType out_dtype = !c.autocast  ? at::kFloat
                                   : c.fp16_out ? at::kHalf
                                                : at::kBFloat16;
  AddNormResult r;
  {
    AutocastGuard autocast(c.autocast);
    if (c.autocast) at::autocast::set_autocast_dtype(at::kCUDA, out_dtype);
    r = c.rms ? AddRmsNorm(xf, yf, w, eps) : AddLayerNorm(xf, yf, ln);
    if (c.autocast) at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  ASSERT_EQ(r.out.scalar_type(), out_dtype);
  ASSERT_EQ(r.h.scalar_type(), at::kFloat);
  ASSERT_NE(r.out.grad_fn()->name().find("AddNormFunction"), std::string::npos)
      << r.out.grad_fn()->name();
  const at::Tensor go = MaybeMisaligned(at::randn({c.rows * c.d + 1}).to(cuda).to(out_dtype),
                                        c.rows, c.d, c.misaligned);
  const at::Tensor gh =
      MaybeMisaligned(at::randn({c.rows * c.d + 1}).to(cuda), c.rows, c.d, c.misaligned_h);
  std::vector<at::Tensor> inputs = {xf, yf, w};
  if (!c.rms) inputs.push_back(b);
  std::vector<at::Tensor> outputs = {r.out}, grads = {go};
  if (c.grad_h) {
    outputs.push_back(r.h);
    grads.push_back(gh);
  }
  const auto got = torch::autograd::grad(outputs, inputs, grads);

  // float64 reference on the CPU from the same (rounded) inputs.
  auto d64 = [](const at::Tensor& t) { return t.detach().cpu().to(at::kDouble); };
  const at::Tensor xd = d64(x).requires_grad_(), yd = d64(y).requires_grad_();
  const at::Tensor wd = d64(w).requires_grad_(), bd = d64(b).requires_grad_();
  const at::Tensor hd = xd + yd;
  const at::Tensor outd = c.rms ? wd * hd * at::rsqrt(hd.pow(2).mean(-1, true) + eps)
                                : at::layer_norm(hd, {c.d}, wd, bd, eps);
  std::vector<at::Tensor> ref_inputs = {xd, yd, wd};
  if (!c.rms) ref_inputs.push_back(bd);
  std::vector<at::Tensor> ref_outputs = {outd}, ref_grads = {d64(go)};
  if (c.grad_h) {
    ref_outputs.push_back(hd);
    ref_grads.push_back(d64(gh));
  }
  const auto want = torch::autograd::grad(ref_outputs, ref_inputs, ref_grads);

  // A 16-bit result is within its dtype's rounding (bf16 2^-8, fp16 2^-11) of float64.
  const auto tol = [](at::ScalarType t) {
    return t == at::kBFloat16 ? 8e-3 : t == at::kHalf ? 1e-3 : 2e-5;
  };
  EXPECT_LT(MaxRelDiff(r.h, hd), 1e-6);
  EXPECT_LT(MaxRelDiff(r.out, outd), tol(out_dtype));
  EXPECT_LT(MaxRelDiff(got[0], want[0]), 2e-5) << "grad x";
  EXPECT_LT(MaxRelDiff(got[1], want[1]), tol(c.y_dtype)) << "grad y";
  EXPECT_LT(MaxRelDiff(got[2], want[2]), 2e-5) << "grad weight";
  if (!c.rms) {
    EXPECT_LT(MaxRelDiff(got[3], want[3]), 2e-5) << "grad bias";
  }
}

// RoPE's float64 reference: x * cos + rotate_half(x) * sin with everything in float64.
at::Tensor RopeReference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor x64 = x.detach().cpu().to(at::kDouble);
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rot = at::cat({-x64.narrow(-1, half, half), x64.narrow(-1, 0, half)}, -1);
  return x64 * cos.cpu().to(at::kDouble).unsqueeze(1) +
         rot * sin.cpu().to(at::kDouble).unsqueeze(1);
}

// (T, D) tables as the llama model makes them: cat(freqs, freqs) of positions x inverse
// frequencies (theta 10000).
std::pair<at::Tensor, at::Tensor> RopeTables(int64_t T, int64_t D) {
  const at::Tensor inv = 1.0 / at::pow(10000.0, at::arange(0, D, 2, at::kFloat) / double(D));
  const at::Tensor freqs = at::outer(at::arange(T, at::kFloat), inv);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

TEST(LayersTest, CompositeRopeMatchesFloat64AndItsGradientIsTheTranspose) {
  torch::manual_seed(3);
  const auto [cos, sin] = RopeTables(7, 16);
  const at::Tensor x = at::randn({2, 7, 3, 16}, at::kDouble).requires_grad_();
  const at::Tensor out = ApplyRope(x, cos.to(at::kDouble), sin.to(at::kDouble));
  EXPECT_LT(MaxRelDiff(out, RopeReference(x, cos, sin)), 1e-12);
  // A rotation of each pair (j, j + D/2) by the angle t * inv_freq: norms are kept (to the float32
  // tables' cos^2 + sin^2 = 1), and the
  // gradient of <g, out> is the inverse rotation of g.
  EXPECT_LT(MaxRelDiff(out.norm(2, -1), x.norm(2, -1)), 1e-6);  // float32 tables
  const at::Tensor g = at::randn_like(out);
  out.backward(g);
  const at::Tensor inverse = ApplyRope(g, cos.to(at::kDouble), -sin.to(at::kDouble));
  EXPECT_LT(MaxRelDiff(x.grad(), inverse), 1e-12);
}

// The fused kernel gives the composite's bits (forward and backward) in every dtype, and is
// within the dtype's rounding of float64. The composite runs on CUDA too, for a non-contiguous x.
TEST(LayersCudaTest, FusedRopeIsTheCompositeBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(4);
  struct Shape {
    int64_t B, T, H, D;
  };
  for (const Shape sh : {Shape{1, 1, 1, 2}, Shape{2, 5, 3, 64}, Shape{3, 37, 9, 64},
                         Shape{1, 129, 2, 128}, Shape{2, 17, 4, 6}}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const std::string what =
          fmt::format("({}, {}, {}, {}) {}", sh.B, sh.T, sh.H, sh.D, c10::toString(dtype));
      auto [cos, sin] = RopeTables(sh.T, sh.D);
      cos = cos.cuda();
      sin = sin.cuda();
      const at::Tensor base = (at::randn({sh.B, sh.T, sh.H, sh.D}) * 3).to(dtype).cuda();
      const at::Tensor g = at::randn({sh.B, sh.T, sh.H, sh.D}).to(dtype).cuda();
      const at::Tensor x = base.clone().requires_grad_();
      // The same values, not contiguous (every second element of a wider row).
      at::Tensor wide = at::zeros({sh.B, sh.T, sh.H, 2 * sh.D}, base.options());
      wide.slice(-1, 0, 2 * sh.D, 2).copy_(base);
      const at::Tensor xs = wide.slice(-1, 0, 2 * sh.D, 2).detach().requires_grad_();
      ASSERT_FALSE(xs.is_contiguous());
      const at::Tensor fused = ApplyRope(x, cos, sin), composite = ApplyRope(xs, cos, sin);
      ASSERT_NE(fused.grad_fn()->name().find("RopeFunction"), std::string::npos) << what;
      ASSERT_EQ(composite.grad_fn()->name().find("RopeFunction"), std::string::npos) << what;
      EXPECT_TRUE(at::equal(fused, composite)) << what;
      fused.backward(g);
      composite.backward(g);
      EXPECT_TRUE(at::equal(x.grad(), xs.grad())) << what;
      const double tol = dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 2e-3 : 1.6e-2;
      EXPECT_LT(MaxRelDiff(fused, RopeReference(base, cos, sin)), tol) << what;
      EXPECT_LT(MaxRelDiff(x.grad(), RopeReference(g, cos, -sin)), tol) << what;
    }
  }
}

// SwiGLU's float64 reference: silu(gate) * up and its gradients, everything in float64.
std::array<at::Tensor, 3> SwiGluReference(const at::Tensor& gate, const at::Tensor& up,
                                          const at::Tensor& grad) {
  const at::Tensor g = gate.detach().cpu().to(at::kDouble), u = up.detach().cpu().to(at::kDouble),
                   dy = grad.detach().cpu().to(at::kDouble);
  const at::Tensor s = at::sigmoid(g);
  return {g * s * u, dy * u * s * (1 + g * (1 - s)), dy * g * s};
}

TEST(LayersTest, CompositeSwiGluMatchesFloat64) {
  torch::manual_seed(5);
  const at::Tensor gate = (at::randn({3, 5, 7}, at::kDouble) * 4).requires_grad_();
  const at::Tensor up = at::randn({3, 5, 7}, at::kDouble).requires_grad_();
  const at::Tensor grad = at::randn({3, 5, 7}, at::kDouble);
  const at::Tensor out = SwiGlu(gate, up);
  out.backward(grad);
  const auto ref = SwiGluReference(gate, up, grad);
  EXPECT_LT(MaxRelDiff(out, ref[0]), 1e-12);
  EXPECT_LT(MaxRelDiff(gate.grad(), ref[1]), 1e-12);
  EXPECT_LT(MaxRelDiff(up.grad(), ref[2]), 1e-12);
  EXPECT_THROW(SwiGlu(gate, up.narrow(-1, 0, 6)), c10::Error);
}

// The fused kernels give the composite's values (forward and both gradients) in every dtype, on
// sizes that are and are not a multiple of the 16-byte vector and on a misaligned contiguous view
// (the scalar path), and are within the dtype's rounding of float64. The composite runs on CUDA
// too, for non-contiguous inputs.
TEST(LayersCudaTest, FusedSwiGluIsTheComposite) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(6);
  for (const int64_t n : {1, 7, 8, 1000, 4096 * 3 + 5}) {
    for (const bool misaligned : {false, true}) {
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        const std::string what =
            fmt::format("n {} {}{}", n, c10::toString(dtype), misaligned ? " misaligned" : "");
        // A contiguous (2, n) pair, one element past an aligned start when `misaligned`.
        const auto make = [&](double scale) {
          const at::Tensor flat = (at::randn({2 * n + 1}) * scale).to(dtype).cuda();
          return flat.narrow(0, misaligned ? 1 : 0, 2 * n).view({2, n});
        };
        const at::Tensor gate0 = make(4.0), up0 = make(1.0), grad = make(1.0);
        const at::Tensor gate = gate0.clone().requires_grad_(), up = up0.clone().requires_grad_();
        const at::Tensor gate_m = misaligned ? gate0.detach().requires_grad_() : gate;
        const at::Tensor up_m = misaligned ? up0.detach().requires_grad_() : up;
        // The composite's inputs: the same values, every second element of a wider tensor.
        const auto strided = [](const at::Tensor& t) {
          at::Tensor wide = at::zeros({2, 2 * t.size(1)}, t.options());
          wide.slice(1, 0, 2 * t.size(1), 2).copy_(t);
          return wide.slice(1, 0, 2 * t.size(1), 2).detach().requires_grad_();
        };
        const at::Tensor gate_s = strided(gate0), up_s = strided(up0);
        ASSERT_FALSE(gate_s.is_contiguous());
        const at::Tensor fused = SwiGlu(gate_m, up_m), composite = SwiGlu(gate_s, up_s);
        // The two paths really ran: the kernel's autograd node, and the composite's product.
        ASSERT_NE(fused.grad_fn()->name().find("SwiGluFunction"), std::string::npos)
            << fused.grad_fn()->name();
        ASSERT_EQ(composite.grad_fn()->name().find("SwiGluFunction"), std::string::npos);
        fused.backward(grad);
        composite.backward(grad);
        EXPECT_TRUE(at::equal(gate_m.grad(), gate_s.grad())) << what << " grad gate";
        EXPECT_TRUE(at::equal(up_m.grad(), up_s.grad())) << what << " grad up";
        const auto ref = SwiGluReference(gate0, up0, grad);
        const double tol = dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 4e-3 : 3.2e-2;
        EXPECT_LT(MaxRelDiff(fused, ref[0]), tol) << what;
        EXPECT_LT(MaxRelDiff(gate_m.grad(), ref[1]), tol) << what;
        EXPECT_LT(MaxRelDiff(up_m.grad(), ref[2]), tol) << what;
      }
    }
  }
}

TEST(LayersCudaTest, FusedAddNormMatchesFloat64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // 577 and 1022: rows of 4-value vectors' size but not a multiple of 4 (the scalar path).
  for (int64_t d : {1, 64, 100, 576, 577, 768, 1022, 1024, 1536, 4096, 8192}) {
    for (int64_t rows : {1, 37, 2048}) {
      for (bool rms : {false, true}) {
        CheckFused({rows, d, at::kBFloat16, /*autocast=*/true, rms, /*grad_h=*/true});
      }
    }
  }
  for (bool rms : {false, true}) {
    for (bool grad_h : {false, true}) {
      CheckFused({333, 1024, at::kFloat, /*autocast=*/false, rms, grad_h});
      CheckFused({333, 768, at::kBFloat16, /*autocast=*/true, rms, grad_h});
      CheckFused({333, 768, at::kFloat, /*autocast=*/true, rms, grad_h});
      CheckFused({333, 1024, at::kFloat, /*autocast=*/false, rms, grad_h, /*misaligned=*/true});
      CheckFused({333, 768, at::kBFloat16, /*autocast=*/true, rms, grad_h, /*misaligned=*/true});
    }
  }
  // The 16-byte path's other operands and dtypes, at widths it takes (768, 1024) and one it does
  // not (1022): a misaligned grad_h, a misaligned weight (the scalar path for both), fp16 y and
  // output, mixed 16-bit y and output, a bf16 or fp16 y with an fp32 output (no autocast).
  // (grad_h false: h is unused, its gradient undefined, and the kernel reads none.)
  for (bool rms : {false, true}) {
    for (int64_t d : {768, 1022, 1024}) {
      CheckFused({333, d, at::kBFloat16, true, rms, true, false, /*misaligned_h=*/true});
      CheckFused({333, d, at::kBFloat16, true, rms, true, false, false, /*misaligned_w=*/true});
      CheckFused({333, d, at::kFloat, false, rms, false, false, false, /*misaligned_w=*/true});
      CheckFused({333, d, at::kHalf, true, rms, true, false, false, false, /*fp16_out=*/true});
      CheckFused({333, d, at::kHalf, true, rms, false, /*misaligned=*/true, false, false, true});
      CheckFused({333, d, at::kBFloat16, true, rms, true, false, false, false, /*fp16_out=*/true});
      CheckFused({333, d, at::kHalf, true, rms, false});
      CheckFused({333, d, at::kFloat, true, rms, true, false, false, false, /*fp16_out=*/true});
      CheckFused({333, d, at::kBFloat16, false, rms, true});
      CheckFused({333, d, at::kHalf, false, rms, false});
    }
  }
}

// distill::Linear on CUDA (a bias that takes a gradient): the output and the input's gradient are
// at::linear's bit for bit (the same matmuls), the weight's too in fp32 and, under autocast, the
// same GEMM writing fp32; the bias gradient is the column sum of the output's gradient in fp32
// (against float64; within bf16 rounding of at::linear's under autocast, which rounds it to
// bf16), rounded once to float16 for a float16 layer. Widths that take the 16-byte path and
// widths that do not, a misaligned gradient, one row and many, 3-d and 2-d inputs.
TEST(LayersCudaTest, LinearBiasGradientIsTheColumnSum) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(9);
  struct Shape {
    int64_t batch, seq, in, out;
  };
  for (const Shape& sh : {Shape{2, 4096, 64, 3072}, Shape{1, 1, 16, 8}, Shape{3, 37, 24, 1001},
                          Shape{5, 7, 8, 1}, Shape{1, 300, 32, 96}, Shape{0, 300, 32, 96}}) {
    // float32; float32 parameters under bf16 autocast (the trainer's); a float16 layer and input
    // (the 16-bit vectors with __half).
    for (const at::ScalarType mode : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const bool autocast = mode == at::kBFloat16;
      const at::ScalarType param = mode == at::kHalf ? at::kHalf : at::kFloat;
      for (const bool misaligned : {false, true}) {
        const std::string what = fmt::format("{}x{}x{} -> {} {}{}", sh.batch, sh.seq, sh.in, sh.out,
                                             autocast ? "bf16 autocast" : c10::toString(mode),
                                             misaligned ? " misaligned" : "");
        torch::nn::Linear layer(sh.in, sh.out), ref(sh.in, sh.out);
        layer->to(at::kCUDA, param);
        ref->to(at::kCUDA, param);
        {
          torch::NoGradGuard no_grad;
          ref->weight.copy_(layer->weight);
          ref->bias.copy_(layer->bias);
        }
        // batch 0: a 2-d (tokens, in) input.
        const at::Tensor x0 =
            (sh.batch > 0 ? at::randn({sh.batch, sh.seq, sh.in}) : at::randn({sh.seq, sh.in}))
                .to(at::kCUDA, param);
        const at::Tensor x = x0.clone().requires_grad_(), xr = x0.clone().requires_grad_();
        at::Tensor y, yr;
        {
          AutocastGuard guard(autocast);
          y = Linear(layer, x);
          yr = at::linear(xr, ref->weight, ref->bias);
        }
        ASSERT_NE(y.grad_fn()->name().find("LinearFunction"), std::string::npos)
            << y.grad_fn()->name();
        EXPECT_TRUE(at::equal(y, yr)) << what;
        // The output's gradient, one element past an aligned start when `misaligned`.
        const int64_t n = y.numel();
        const at::Tensor flat = at::randn({n + 1}, y.options());
        const at::Tensor grad = flat.narrow(0, misaligned ? 1 : 0, n).view(y.sizes());
        y.backward(grad);
        yr.backward(grad);
        EXPECT_TRUE(at::equal(x.grad(), xr.grad())) << what << " input gradient";
        if (autocast) {
          // The weight gradient's GEMM writes fp32: g^T x of the bf16 operands, unrounded; within
          // bf16 rounding of at::linear's (which rounds the product to bf16).
          const at::Tensor g2 = grad.reshape({-1, sh.out}).to(at::kBFloat16);
          const at::Tensor x2 = x0.reshape({-1, sh.in}).to(at::kBFloat16);
          ASSERT_EQ(layer->weight.grad().scalar_type(), at::kFloat);
          EXPECT_TRUE(at::equal(layer->weight.grad(), at::mm(g2.t(), x2, at::kFloat)))
              << what << " weight";
          EXPECT_LT(MaxRelDiff(layer->weight.grad(), ref->weight.grad()), 8e-3) << what;
        } else {
          EXPECT_TRUE(at::equal(layer->weight.grad(), ref->weight.grad())) << what << " weight";
        }
        // The bias gradient in the parameter's dtype: float16's is the fp32 sum rounded once.
        ASSERT_EQ(layer->bias.grad().scalar_type(), param);
        const at::Tensor want = grad.to(at::kDouble).reshape({-1, sh.out}).sum(0);
        const double bias_tol = mode == at::kHalf ? 1e-3 : 1e-5;
        EXPECT_LT(MaxRelDiff(layer->bias.grad(), want), bias_tol) << what << " bias";
        // float16: each side rounded once, within one unit in the last place of the largest.
        EXPECT_LT(MaxRelDiff(layer->bias.grad(), ref->bias.grad()),
                  autocast ? 5e-3 : (mode == at::kHalf ? 2e-3 : 1e-5))
            << what << " bias against at::linear's";
      }
    }
  }
}

// distill::LinearGelu on CUDA is gelu(Linear(...)) bit for bit: the output (ATen's formula in the
// kernel), and the gradients of the input, the weight and the bias (the fused pass's column sums
// are ColumnSum's of the same gradient, in the same order), in float32, under bf16 autocast and in
// float16, on widths that take the 16-byte path and widths that do not, with a misaligned output
// gradient, for 3-d and 2-d inputs of one row, many and none; within the dtype's rounding of
// float64; and without grad mode (the forward kernel alone) at::gelu(at::linear(...))'s values.
TEST(LayersCudaTest, LinearGeluIsGeluOfLinear) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(10);
  struct Shape {
    int64_t batch, seq, in, out;
  };
  for (const bool tanh : {false, true})
    for (const Shape& sh :
         {Shape{2, 1024, 64, 3072}, Shape{1, 1, 16, 8}, Shape{3, 37, 24, 1001}, Shape{5, 7, 8, 1},
          Shape{1, 300, 32, 96}, Shape{0, 300, 32, 96}, Shape{1, 0, 32, 96}}) {
      // float32; float32 parameters under bf16 autocast (the trainer's); a float16 layer and input
      // (the 16-bit vectors with __half).
      for (const at::ScalarType mode : {at::kFloat, at::kBFloat16, at::kHalf}) {
        const bool autocast = mode == at::kBFloat16;
        const at::ScalarType param = mode == at::kHalf ? at::kHalf : at::kFloat;
        for (const bool misaligned : {false, true}) {
          const std::string what = fmt::format(
              "{} {}x{}x{} -> {} {}{}", tanh ? "tanh" : "erf", sh.batch, sh.seq, sh.in, sh.out,
              autocast ? "bf16 autocast" : c10::toString(mode), misaligned ? " misaligned" : "");
          torch::nn::Linear layer(sh.in, sh.out), ref(sh.in, sh.out);
          layer->to(at::kCUDA, param);
          ref->to(at::kCUDA, param);
          {
            torch::NoGradGuard no_grad;
            layer->bias.normal_();  // pre-activations on both sides of 0
            ref->weight.copy_(layer->weight);
            ref->bias.copy_(layer->bias);
          }
          // batch 0: a 2-d (tokens, in) input; seq 0: no rows.
          const at::Tensor x0 =
              (sh.batch > 0 ? at::randn({sh.batch, sh.seq, sh.in}) : at::randn({sh.seq, sh.in}))
                  .to(at::kCUDA, param);
          const at::Tensor x = x0.clone().requires_grad_(), xr = x0.clone().requires_grad_();
          at::Tensor y, yr, y_nograd;
          {
            AutocastGuard guard(autocast);
            y = LinearGelu(layer, x, tanh);
            yr = at::gelu(Linear(ref, xr), tanh ? "tanh" : "none");
            torch::NoGradGuard no_grad;
            y_nograd = LinearGelu(layer, x0, tanh);
          }
          ASSERT_NE(y.grad_fn()->name().find("LinearGeluFunction"), std::string::npos)
              << y.grad_fn()->name();
          ASSERT_NE(yr.grad_fn()->name().find("GeluBackward"), std::string::npos)
              << yr.grad_fn()->name();
          EXPECT_TRUE(at::equal(y, yr)) << what;
          EXPECT_TRUE(at::equal(y_nograd, yr)) << what << " without grad mode";
          const int64_t n = y.numel();
          const at::Tensor flat = at::randn({n + 1}, y.options());
          const at::Tensor grad = flat.narrow(0, misaligned ? 1 : 0, n).view(y.sizes());
          y.backward(grad);
          yr.backward(grad);
          EXPECT_TRUE(at::equal(x.grad(), xr.grad())) << what << " input gradient";
          EXPECT_TRUE(at::equal(layer->weight.grad(), ref->weight.grad())) << what << " weight";
          EXPECT_TRUE(at::equal(layer->bias.grad(), ref->bias.grad())) << what << " bias";
          // float64: the operands as the matmul took them, everything after in float64.
          const at::ScalarType op = mode;
          const auto f64 = [&](const at::Tensor& t) { return t.detach().to(op).to(at::kDouble); };
          const at::Tensor u = at::linear(f64(x0), f64(layer->weight), f64(layer->bias));
          // gelu(u) = u * cdf(u), gelu'(u) = cdf(u) + u * pdf(u); tanh: cdf ~ (1 + tanh(k(u +
          // 0.044715 u^3))) / 2, pdf its derivative.
          const double k = std::sqrt(2 / M_PI);
          const at::Tensor th = at::tanh(k * (u + 0.044715 * u * u * u));
          const at::Tensor cdf = tanh ? 0.5 * (1 + th) : 0.5 * (1 + at::erf(u / std::sqrt(2.0)));
          const at::Tensor pdf = tanh ? 0.5 * (1 - th * th) * k * (1 + 3 * 0.044715 * u * u)
                                      : at::exp(-0.5 * u * u) / std::sqrt(2 * M_PI);
          const at::Tensor du = grad.to(op).to(at::kDouble) * (cdf + u * pdf);
          const double tol = mode == at::kFloat ? 1e-5 : (mode == at::kHalf ? 8e-3 : 3.2e-2);
          if (y.numel() > 0) {
            EXPECT_LT(MaxRelDiff(y, u * cdf), tol) << what;
          }
          // A sum's rounding is relative to the sum of its terms' magnitudes, not to the sum
          // itself: a column whose terms cancel (one output column, 35 rows) is measured by that.
          const at::Tensor terms = du.reshape({-1, sh.out});
          const double scale = std::max(terms.abs().sum(0).max().item<double>(), 1e-3);
          const at::Tensor bias_grad = layer->bias.grad().detach().to(terms.device(), at::kDouble);
          EXPECT_LT((bias_grad - terms.sum(0)).abs().max().item<double>() / scale, tol) << what;
        }
      }
    }
}

// A whole model on CUDA in fp32 (the fused kernels) against the same weights on the CPU (the
// composite): logits and every parameter's gradient.
void CheckModel(ModelFamily family, Activation activation = Activation::kGelu) {
  ModelConfig config;
  config.family = family;
  config.activation = activation;
  config.vocab_size = 100;
  config.n_layer = 3;
  config.d_model = 96;
  config.n_head = 4;
  if (family == ModelFamily::kLlama) config.n_kv_head = 2;
  torch::manual_seed(4);
  Model cpu = MakeModel(config), gpu = MakeModel(config);
  {
    torch::NoGradGuard no_grad;
    auto src = cpu->named_parameters();
    for (auto& p : gpu->named_parameters()) p.value().copy_(src[p.key()]);
  }
  gpu->to(at::Device(at::kCUDA, 0));
  const at::Tensor tokens = at::randint(0, config.vocab_size, {2, 50}, at::kLong);
  const at::Tensor logits_cpu = cpu->forward(tokens);
  const at::Tensor logits_gpu = gpu->forward(tokens.cuda());
  // The real columns (the padded ones are -inf on both).
  EXPECT_LT(MaxRelDiff(logits_gpu.narrow(-1, 0, 100), logits_cpu.narrow(-1, 0, 100)), 1e-4);
  at::cross_entropy_loss(logits_cpu.reshape({-1, logits_cpu.size(-1)}).narrow(1, 0, 100),
                         tokens.reshape({-1}))
      .backward();
  at::cross_entropy_loss(logits_gpu.reshape({-1, logits_gpu.size(-1)}).narrow(1, 0, 100),
                         tokens.cuda().reshape({-1}))
      .backward();
  auto grads_cpu = cpu->named_parameters();
  for (const auto& p : gpu->named_parameters()) {
    EXPECT_LT(MaxRelDiff(p.value().grad(), grads_cpu[p.key()].grad()), 1e-3) << p.key();
  }
}

TEST(LayersCudaTest, GptOnCudaMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckModel(ModelFamily::kGpt);
  CheckModel(ModelFamily::kGpt, Activation::kGeluTanh);
}

TEST(LayersCudaTest, LlamaOnCudaMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckModel(ModelFamily::kLlama);
}

// A frozen teacher's matmul weights stored in bf16 give the logits (and the fused-linear path's
// operands) that bf16 autocast gave from the fp32 weights, bit for bit; the embeddings and norms
// stay fp32, a tied lm_head with them, an untied one is converted.
void CheckStoredBf16(ModelFamily family, bool tied) {
  ModelConfig config;
  config.family = family;
  config.vocab_size = 100;
  config.n_layer = 2;
  config.d_model = 64;
  config.n_head = 4;
  config.tie_embeddings = tied;
  if (family == ModelFamily::kLlama) {
    config.n_kv_head = 2;
    config.attention_bias = true;  // biases are converted too
  }
  torch::manual_seed(5);
  Model model = MakeModel(config);
  model->to(at::Device(at::kCUDA, 0));
  model->eval();
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  const at::Tensor tokens = at::randint(0, config.vocab_size, {2, 40}, at::kLong).cuda();
  auto run = [&] {
    torch::NoGradGuard no_grad;
    AutocastGuard autocast(true);
    const LogitsOperands ops = MakeLogitsOperands(*model, model->forward_hidden(tokens));
    return std::array<at::Tensor, 3>{model->forward(tokens), ops.hidden, ops.lm_head};
  };
  const auto before = run();
  int64_t linears = 0;
  for (const auto& m : model->modules(false)) {
    if (const auto* l = m->as<torch::nn::LinearImpl>()) linears += 1 + (l->bias.defined() ? 1 : 0);
  }
  const bool raw_head = !tied && family == ModelFamily::kGpt;  // GPT's untied head: a parameter
  EXPECT_EQ(StoreMatmulWeightsAs(*model, at::kBFloat16), linears + (raw_head ? 1 : 0));
  EXPECT_EQ(model->lm_head_weight().scalar_type(), tied ? at::kFloat : at::kBFloat16);
  for (const auto& m : model->modules(false)) {
    if (const auto* e = m->as<torch::nn::EmbeddingImpl>()) {
      EXPECT_EQ(e->weight.scalar_type(), at::kFloat);
    }
  }
  const auto after = run();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(after[i].scalar_type(), before[i].scalar_type()) << i;
    EXPECT_TRUE(after[i].equal(before[i])) << "output " << i << " tied " << tied;
  }
  EXPECT_EQ(StoreMatmulWeightsAs(*model, at::kBFloat16), 0);  // nothing left to convert
}

TEST(LayersCudaTest, FrozenMatmulWeightsInBf16GiveAutocastsBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const ModelFamily family : {ModelFamily::kGpt, ModelFamily::kLlama}) {
    for (const bool tied : {true, false}) CheckStoredBf16(family, tied);
  }
}

// Activation checkpointing (CausalLM::set_activation_checkpointing, CheckpointedBlock): a model
// of `family` on `device` takes two backward passes that accumulate (as a step's micro-batches
// do), the second one's logits kept; autocast to bf16 on CUDA when `autocast`.
struct CheckpointRun {
  at::Tensor logits;
  std::vector<at::Tensor> grads;
  int64_t checkpoint_nodes = 0;  // CheckpointFunction nodes in the second pass's graph
  int64_t graph_nodes = 0;       // all nodes of that graph
};

CheckpointRun RunCheckpointed(ModelFamily family, bool checkpoint, const at::Device& device,
                              bool autocast) {
  ModelConfig config;
  config.family = family;
  config.vocab_size = 100;
  config.n_layer = 3;
  config.d_model = 64;
  config.n_head = 4;
  config.tie_embeddings = family == ModelFamily::kGpt;
  if (family == ModelFamily::kLlama) config.n_kv_head = 2;
  torch::manual_seed(5);
  Model model = MakeModel(config);
  model->to(device);
  model->set_activation_checkpointing(checkpoint);
  torch::manual_seed(6);
  CheckpointRun run;
  for (int pass = 0; pass < 2; ++pass) {
    const at::Tensor tokens = at::randint(0, config.vocab_size, {2, 40}, at::kLong).to(device);
    {
      const AutocastGuard guard(autocast);
      run.logits = model->forward(tokens);
    }
    const at::Tensor loss = at::cross_entropy_loss(run.logits.reshape({-1, run.logits.size(-1)})
                                                       .narrow(1, 0, config.vocab_size)
                                                       .to(at::kFloat),
                                                   tokens.reshape({-1}));
    if (pass == 1) {  // count the graph's nodes (each once)
      std::vector<torch::autograd::Node*> stack = {loss.grad_fn().get()};
      std::set<torch::autograd::Node*> seen;
      while (!stack.empty()) {
        torch::autograd::Node* node = stack.back();
        stack.pop_back();
        if (node == nullptr || !seen.insert(node).second) continue;
        run.checkpoint_nodes += node->name().find("CheckpointFunction") != std::string::npos;
        for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
      }
      run.graph_nodes = static_cast<int64_t>(seen.size());
    }
    loss.backward();
  }
  run.logits = run.logits.detach();
  for (const auto& p : model->parameters()) run.grads.push_back(p.grad().clone());
  return run;
}

double MaxGradDiff(const CheckpointRun& a, const CheckpointRun& b) {
  double worst = 0;
  for (size_t i = 0; i < a.grads.size(); ++i)
    worst = std::max(worst, MaxRelDiff(a.grads[i], b.grads[i]));
  return worst;
}

// On the CPU the recomputation is the same arithmetic: the same logits and the same gradients,
// bit for bit, with one checkpoint node per block in place of the blocks' own nodes.
TEST(LayersTest, CheckpointedBlocksGiveTheSameGradients) {
  for (const ModelFamily family : {ModelFamily::kGpt, ModelFamily::kLlama}) {
    const std::string what = family == ModelFamily::kGpt ? "gpt" : "llama";
    const CheckpointRun plain = RunCheckpointed(family, false, at::kCPU, false);
    const CheckpointRun checkpointed = RunCheckpointed(family, true, at::kCPU, false);
    EXPECT_TRUE(at::equal(checkpointed.logits, plain.logits)) << what;
    ASSERT_EQ(checkpointed.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_TRUE(at::equal(checkpointed.grads[i], plain.grads[i]))
          << what << " parameter " << i << ": "
          << MaxRelDiff(checkpointed.grads[i], plain.grads[i]);
    }
    EXPECT_EQ(plain.checkpoint_nodes, 0) << what;
    EXPECT_EQ(checkpointed.checkpoint_nodes, 3) << what;  // n_layer
    EXPECT_LT(checkpointed.graph_nodes, plain.graph_nodes / 2) << what;
  }
}

// On CUDA under bf16 autocast (the fused kernels; the recomputation runs on autograd's device
// thread under the forward's autocast state): the gradients differ from the plain run's by no
// more than two plain runs differ from each other (nothing, where the kernels are deterministic),
// and the forward keeps less memory for the backward.
TEST(LayersCudaTest, CheckpointedBlocksUnderAutocastGiveTheSameGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  for (const ModelFamily family : {ModelFamily::kGpt, ModelFamily::kLlama}) {
    const std::string what = family == ModelFamily::kGpt ? "gpt" : "llama";
    const CheckpointRun plain = RunCheckpointed(family, false, cuda, true);
    const CheckpointRun again = RunCheckpointed(family, false, cuda, true);
    const CheckpointRun checkpointed = RunCheckpointed(family, true, cuda, true);
    EXPECT_TRUE(at::equal(checkpointed.logits, plain.logits)) << what;
    EXPECT_LE(MaxGradDiff(checkpointed, plain), MaxGradDiff(again, plain)) << what;
    EXPECT_EQ(checkpointed.checkpoint_nodes, 3) << what;
  }
  // Memory held between the forward and the backward: a wider model, so that activations
  // dominate; the checkpointed one keeps each block's two inputs only.
  for (const ModelFamily family : {ModelFamily::kGpt, ModelFamily::kLlama}) {
    ModelConfig config;
    config.family = family;
    config.vocab_size = 128;
    config.n_layer = 4;
    config.d_model = 256;
    config.n_head = 4;
    config.context_length = 512;
    std::array<int64_t, 2> held{};
    for (const bool checkpoint : {false, true}) {
      Model model = MakeModel(config);
      model->to(cuda);
      model->set_activation_checkpointing(checkpoint);
      const at::Tensor tokens = at::randint(0, config.vocab_size, {8, 512}, at::kLong).to(cuda);
      torch::cuda::synchronize();
      const int64_t before = at::accelerator::getDeviceStats(0).allocated_bytes[0].current;
      at::Tensor hidden;
      {
        const AutocastGuard guard(true);
        hidden = model->forward_hidden(tokens);
      }
      held[checkpoint] = at::accelerator::getDeviceStats(0).allocated_bytes[0].current - before;
      hidden.sum().backward();
    }
    EXPECT_LT(held[1], held[0] / 3) << (family == ModelFamily::kGpt ? "gpt" : "llama") << ": "
                                    << held[1] << " vs " << held[0] << " bytes";
  }
}

TEST(LayersTest, StoreMatmulWeightsAsRefusesATrainableModel) {
  ModelConfig config;
  config.vocab_size = 50;
  config.n_layer = 1;
  config.d_model = 32;
  config.n_head = 2;
  Model model = MakeModel(config);
  EXPECT_THROW(StoreMatmulWeightsAs(*model, at::kBFloat16), c10::Error);
}

}  // namespace
}  // namespace distill

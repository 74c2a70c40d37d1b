// The chunk driver of lossfns::fused_linear_distill_loss: per chunk of tokens the logits (ATen
// matmuls in the input dtype, fp32 accumulation inside the GEMM), the divergence through
// distill_loss's internal ops and the cross-entropy through cross_entropy_loss's (so the device
// picks its kernels), and the gradient w.r.t. the student's hidden states and lm_head.
// Device-agnostic: written with ATen ops only and registered for CPU and CUDA alike. At most one
// chunk's logits are alive at a time.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "cross_entropy_common.h"
#include "cross_entropy_internal.h"
#include "distill_common.h"
#include "distill_internal.h"
#include "fused_linear_internal.h"

namespace lossfns::detail {

void check_same_dtype_and_device(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                                 const at::Tensor& tw) {
  using Named = std::pair<const at::Tensor*, const char*>;
  for (const auto& [x, name] : {Named{&sw, "student_lm_head"}, Named{&th, "teacher_hidden"},
                                Named{&tw, "teacher_lm_head"}}) {
    TORCH_CHECK(x->device() == sh.device(), kFusedOp, ": ", name,
                " must be on student_hidden's device ", sh.device(), "; got ", x->device());
    TORCH_CHECK(x->scalar_type() == sh.scalar_type(), kFusedOp, ": ", name,
                " must have student_hidden's dtype ", sh.scalar_type(), "; got ", x->scalar_type(),
                " (convert with .to(dtype): one dtype for the four inputs)");
  }
}

namespace {

// The inputs as the driver reads them: (rows, H) hidden states, (V, H) lm_heads, labels (rows,)
// contiguous int64 (undefined when absent).
struct FusedInputs {
  at::Tensor sh, sw, th, tw, labels;
  int64_t rows = 0, ws = 0, wt = 0;
};

constexpr std::initializer_list<at::ScalarType> kCpuDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                                              at::kBFloat16};
constexpr std::initializer_list<at::ScalarType> kCudaDtypes = {at::kFloat, at::kHalf,
                                                               at::kBFloat16};

FusedInputs check_fused_inputs(const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
                               const at::Tensor& tw, const std::optional<at::Tensor>& labels,
                               const FusedArgs& a) {
  constexpr const char* op = kFusedOp;
  TORCH_CHECK(sh.defined() && sw.defined() && th.defined() && tw.defined(), op,
              ": the hidden states and lm_heads must be defined tensors");
  TORCH_CHECK(sh.dim() == 2 && th.dim() == 2 && th.size(0) == sh.size(0), op,
              ": the hidden states must be (BT, H_s) and (BT, H_t) here; got ", dims(sh.sizes()),
              " and ", dims(th.sizes()));
  TORCH_CHECK(sw.dim() == 2 && sw.size(1) == sh.size(1), op,
              ": student_lm_head must be (V_s, H_s) with H_s = ", num(sh.size(1)),
              " (student_hidden's last dimension); got ", dims(sw.sizes()));
  TORCH_CHECK(tw.dim() == 2 && tw.size(1) == th.size(1), op,
              ": teacher_lm_head must be (V_t, H_t) with H_t = ", num(th.size(1)),
              " (teacher_hidden's last dimension); got ", dims(tw.sizes()));
  check_same_dtype_and_device(sh, sw, th, tw);
  const auto dtype = sh.scalar_type();
  const bool cpu = sh.device().is_cpu();
  const auto supported = cpu ? kCpuDtypes : kCudaDtypes;
  TORCH_CHECK(std::find(supported.begin(), supported.end(), dtype) != supported.end(), op, ": on ",
              cpu ? "CPU" : "CUDA", " the inputs must be one of ", dtype_list(supported), "; got ",
              dtype);
  TORCH_CHECK(sw.size(0) > 0 && tw.size(0) > 0, op,
              ": the lm_heads need at least one row (V >= 1); got ", dims(sw.sizes()), " and ",
              dims(tw.sizes()));
  const int64_t V = a.V.expect_int();  // the kernels' arguments are concrete
  TORCH_CHECK(V >= 1 && V <= std::max(sw.size(0), tw.size(0)), op,
              ": the vocabulary's column count must be in [1, ",
              num(std::max(sw.size(0), tw.size(0))), "]; got ", num(V));
  TORCH_CHECK(a.divergence >= kernels::kTvd && a.divergence <= kernels::kJsd, op,
              ": divergence code must be 0..3 (tvd, forward_kl, reverse_kl, jsd); got ",
              num(a.divergence));
  TORCH_CHECK(a.divergence != kernels::kJsd || (a.beta > 0.0 && a.beta < 1.0), op,
              ": the JSD kernels take beta in (0, 1) (0 and 1 are the KLs); got ", num(a.beta));
  check_temperature(op, a.temperature);
  reduction_from_code(a.reduction, op);  // throws on a code that is no reduction
  TORCH_CHECK(std::isfinite(a.kd_weight) && std::isfinite(a.ce_weight), op,
              ": kd_weight and ce_weight must be finite; got ", num(a.kd_weight), " and ",
              num(a.ce_weight));
  TORCH_CHECK(a.chunk_size >= 0, op, ": chunk_size must be >= 1 (or ", kUnset,
              ", for automatic); got ", num(a.chunk_size));
  FusedInputs in;
  in.rows = sh.size(0);
  in.ws = sw.size(0);
  in.wt = tw.size(0);
  in.sh = sh;
  in.sw = sw;
  in.th = th;
  in.tw = tw;
  in.labels =
      check_labels(labels, sh.sizes().slice(0, 1), in.rows, sh.device(), op, "student_hidden");
  TORCH_CHECK(a.ce_weight == 0.0 || in.labels.defined(), op, ": ce_weight ", num(a.ce_weight),
              " needs labels (the cross-entropy's targets); pass labels or set ce_weight to 0");
  return in;
}

at::ScalarType acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Bytes the chunk driver may hold per chunk: on CUDA min(free / 8, 2 GiB), free counting the
// caching allocator's reserved but unused blocks; on the CPU a fixed 256 MiB. Fewer chunks are
// a little faster (each one after the first re-reads and re-writes the float32 lm_head gradient,
// and smaller GEMMs tile worse: 1.5-2% at V = 151936 with a 3 GiB cap, 2 chunks of 4096 instead
// of 3 of 2752), but a 3 GiB cap also made the trainer's smollm2 step hold one chunk of 16384
// tokens instead of two: +2.9 GiB of peak memory for no measurable speed (docs/fused_linear.md,
// session 16). The op is chosen for its memory, so the cap stays at 2 GiB. An allocator that
// cannot tell (an application's own, through torch.cuda.memory.change_current_allocator: the
// native one is then not initialised, and a pluggable one keeps no statistics) gets no credit for
// cached blocks, and where not even the free memory is known, the CPU's 256 MiB.
int64_t memory_budget(const at::Device& device) {
  constexpr int64_t kCap = int64_t{2} << 30, kFallback = int64_t{256} << 20;
  if (device.is_cpu()) return kFallback;
  c10::DeviceAllocator* alloc = c10::getDeviceAllocator(device.type());
  int64_t free = 0, cached = 0;
  try {
    free = static_cast<int64_t>(alloc->getMemoryInfo(device.index()).first);
  } catch (const c10::Error&) {
    return kFallback;
  }
  try {
    const auto stats = alloc->getDeviceStats(device.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    cached = stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current;
  } catch (const c10::Error&) {
    cached = 0;
  }
  return std::min(free / 8 + std::max<int64_t>(cached, 0) / 8, kCap);
}

// Rows per chunk: what a chunk allocates per row within the budget. The student's and teacher's
// logits in the input dtype; the logits' gradient overwrites the student's (_distill_ce_grad_ in
// place) on CUDA, with the cross-entropy's gradient added in the same pass. Where that is a
// composite (the CPU), or without a divergence term (kd_weight 0: the cross-entropy's own
// backward), one or two more rows.
int64_t chunk_rows(const FusedInputs& in, const FusedArgs& a) {
  // A chunk never has more rows than the CUDA kernels take, whatever the budget or chunk_size.
  const int64_t rows = std::max<int64_t>(in.rows, 1);
  const int64_t limit = in.sh.is_cuda() ? std::min(rows, kCudaMaxRows) : rows;
  if (a.chunk_size > 0) return std::min(a.chunk_size, limit);
  const int64_t elem = static_cast<int64_t>(in.sh.element_size());
  const bool fused = in.sh.is_cuda() && a.kd_weight != 0.0;
  const int64_t extra = fused ? 0 : in.ws * (in.labels.defined() ? 2 : 1);
  const int64_t per_row = elem * (in.ws + in.wt + extra);
  const int64_t most = std::clamp<int64_t>(memory_budget(in.sh.device()) / per_row, 1, limit);
  // As many chunks as the budget needs, of equal size (a small last chunk runs its GEMMs and
  // kernels below the device's width), rounded up to 64 rows for the GEMMs' tiles when that fits.
  const int64_t chunks = (rows + most - 1) / most;
  const int64_t even = (rows + chunks - 1) / chunks, rounded = (even + 63) / 64 * 64;
  return rounded <= most ? rounded : even;
}

// Whether CUDA's addmm accumulates bf16 products into a float32 matrix in place
// (addmm.dtype_out with self = out in float32: newer Torch; older ones refuse it, insisting on
// self in the inputs' dtype, when called). Probed on 2x2 matrices, on the current stream and
// without reading the result back: no host synchronisation (under a CUDA graph's capture, or
// torch.cuda.set_sync_debug_mode("error"), it is two small kernels more). The answer is the
// Torch build's, kept once known; an out-of-memory error answers nothing and is asked again, and
// a CUDA error is the caller's.
bool cuda_addmm_accumulates_in_float(const at::Device& device) {
  static std::atomic<int> known{-1};  // -1 unknown, 0 no, 1 yes
  const int answer = known.load(std::memory_order_relaxed);
  if (answer >= 0) return answer == 1;
  try {
    at::Tensor acc = at::ones({2, 2}, at::TensorOptions(device).dtype(at::kFloat));
    const at::Tensor one = at::ones({2, 2}, at::TensorOptions(device).dtype(at::kBFloat16));
    at::addmm_out(acc, acc, one, one, at::kFloat);
  } catch (const c10::OutOfMemoryError&) {
    return false;  // this call takes the sliced path; the next one asks again
  } catch (const c10::AcceleratorError&) {
    throw;  // a CUDA error (an earlier kernel's, sticky): the answer to nothing, and the caller's
  } catch (const c10::Error&) {
    known.store(0, std::memory_order_relaxed);
    return false;
  }
  known.store(1, std::memory_order_relaxed);
  return true;
}

// Rows of the lm_head per float32 product where ATen cannot accumulate the product in place
// (accumulate_grad_lm_head): 128 MiB of float32.
int64_t lm_head_slice_rows(int64_t hidden) {
  return std::max<int64_t>(1, (int64_t{128} << 20) / (4 * std::max<int64_t>(hidden, 1)));
}

// acc += g^T h: acc (V_s, H_s) in the accumulation dtype (the inputs' for float32 and float64,
// float32 for the half types), g (n, V_s), h (n, H_s) in the inputs' dtype. An undefined acc is
// the first chunk's product (no zero-filled matrix read back: on CUDA the product is written
// once, in float32, by the GEMM).
void accumulate_grad_lm_head(at::Tensor& acc, const at::Tensor& g, const at::Tensor& h) {
  const auto dtype = acc_dtype(g);
  const bool same = dtype == g.scalar_type();
  const bool cuda_float = !same && g.is_cuda() && cuda_addmm_accumulates_in_float(g.device());
  if (!acc.defined()) {
    if (same || cuda_float) {  // the GEMM writes the first product in the accumulation dtype
      acc = same ? at::mm(g.t(), h) : at::mm(g.t(), h, at::kFloat);
      return;
    }
    acc = at::zeros({g.size(1), h.size(1)}, g.options().dtype(dtype));
  }
  if (same) {
    acc.addmm_(g.t(), h);
  } else if (cuda_float) {
    at::addmm_out(acc, acc, g.t(), h, at::kFloat);
  } else {
    // A float32 product per slice of the vocabulary, added: the temporary stays <= 128 MiB, not
    // a second (V_s, H_s) float32 matrix beside acc (8 GiB at V 256000, H 8192). On the CPU from
    // float32 copies of the slice of g and of h (its matmul of the half types gives no float32).
    const at::Tensor hf = g.is_cuda() ? h : h.to(dtype);
    const int64_t slice = lm_head_slice_rows(h.size(1));
    for (int64_t v0 = 0; v0 < acc.size(0); v0 += slice) {
      const int64_t n = std::min(slice, acc.size(0) - v0);
      const at::Tensor gs = g.narrow(1, v0, n).t();
      acc.narrow(0, v0, n).add_(g.is_cuda() ? at::mm(gs, h, at::kFloat) : at::mm(gs.to(dtype), hf));
    }
  }
}

// Cross-entropy of one chunk, forward: s (n, V_s) the student's logits, the columns [0, Vce)
// counting, labels (n,). Writes each row's -log softmax(s)[label] into ce_rows (0 for ignored
// rows). A counted label outside [0, Vce) has probability 0: +inf here, where the op itself
// refuses it (CPU) or gives NaN (CUDA), so such a row goes to the kernels as ignored (`y`) and
// gets +inf afterwards, and no cross-entropy gradient (`inside`: 1 for the rows whose gradient
// counts), with no host synchronisation.
//
// `distill_stats`: when defined, the distill forward's statistics of the same chunk at
// temperature 1, whose student half is the cross-entropy's normaliser (the same columns [0, Vce),
// in the units of the device's kernels: log2-scaled logits on CUDA, natural on the CPU; the
// student's own also in a row whose divergence is NaN, such as one whose teacher is -inf
// everywhere); the cross-entropy forward kernel, a second read of the logits, is then skipped.
struct CeChunk {
  at::Tensor stats, scale;  // (n, kCeStatsPerRow) the student's max and log-sum; the scale (1,)
  at::Tensor y, inside;     // labels with the outside ones as ignored; (n,) bool
};

CeChunk cross_entropy_chunk(const at::Tensor& s, int64_t Vce, const at::Tensor& labels,
                            int64_t ignore_index, at::Tensor ce_rows,
                            const at::Tensor& distill_stats) {
  const at::Tensor counted = labels.ne(ignore_index);
  const at::Tensor outside = counted.logical_and(labels.lt(0).logical_or(labels.ge(Vce)));
  CeChunk c;
  c.y = at::where(outside, ignore_index, labels);
  c.inside = outside.logical_not();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (distill_stats.defined()) {
    c.stats = distill_stats.narrow(1, 0, kernels::kCeStatsPerRow).contiguous();
    c.scale = at::ones({1}, c.stats.options());  // 'none': the scale is not read
    const at::Tensor mx = c.stats.select(1, 0), ls = c.stats.select(1, 1);
    at::Tensor xy = s.gather(1, at::where(counted.logical_and(c.inside), labels, 0).unsqueeze(1))
                        .squeeze(1)
                        .to(c.stats.scalar_type());
    // The kernels' formula, (max - x_y) + log_sum: on CUDA in log2 units (log2(e) and ln 2 as
    // the kernels' float constants: a float tensor times a double scalar rounds it to float).
    constexpr double kLog2e = 1.4426950408889634, kLn2 = 0.6931471805599453;
    const at::Tensor row = s.is_cuda() ? ((mx - xy * kLog2e) + ls) * kLn2 : (mx - xy) + ls;
    ce_rows.copy_(at::where(outside, kInf, at::where(counted, row, 0)));
  } else {
    auto [loss, st, sc] = cross_entropy_forward_op(s, c.y, ignore_index, kernels::kNone, Vce);
    ce_rows.copy_(at::where(outside, kInf, loss));
    c.stats = st;
    c.scale = sc;
  }
  return c;
}

// The rows' weights (grad_output times the reduction's scale) of one term: a 0-dim tensor (one
// weight for every row) or (rows,); undefined: no gradient.
at::Tensor rows_of(const at::Tensor& w, int64_t r0, int64_t n) {
  return w.dim() == 0 ? w.expand({n}) : w.narrow(0, r0, n);
}

struct DriverOut {
  at::Tensor kd_rows, ce_rows;  // (rows,) in the accumulation dtype
  at::Tensor grad_h;            // (rows, H_s) in the inputs' dtype, or undefined
  at::Tensor grad_w;            // (V_s, H_s) in the accumulation dtype, or undefined
};

// Runs every chunk. kd_w / ce_w: the rows' weights of the two terms' gradients (see rows_of);
// both undefined: losses only.
DriverOut run_chunks(const FusedInputs& in, const FusedArgs& a, const at::Tensor& kd_w,
                     const at::Tensor& ce_w, bool want_h, bool want_w) {
  const auto acc_opts = in.sh.options().dtype(acc_dtype(in.sh));
  const bool grad = kd_w.defined() && (want_h || want_w);
  const bool ce = in.labels.defined();
  const int64_t Vce = std::min(a.V.expect_int(), in.ws);  // the student's columns that count
  DriverOut out;
  out.kd_rows = at::zeros({in.rows}, acc_opts);
  out.ce_rows = at::zeros({in.rows}, acc_opts);
  at::Tensor acc_w;  // the lm_head's gradient over the chunks (accumulate_grad_lm_head)
  if (grad && want_h) out.grad_h = at::empty({in.rows, in.sh.size(1)}, in.sh.options());
  const int64_t chunk = chunk_rows(in, a);
  for (int64_t r0 = 0; r0 < in.rows; r0 += chunk) {
    const int64_t n = std::min(chunk, in.rows - r0);
    const at::Tensor h = in.sh.narrow(0, r0, n);
    const std::optional<at::Tensor> labels =
        ce ? std::optional<at::Tensor>(in.labels.narrow(0, r0, n)) : std::nullopt;
    at::Tensor s = at::mm(h, in.sw.t());  // (n, V_s)
    at::Tensor g;                         // d loss / d s, (n, V_s) in the inputs' dtype
    const bool kd_grad = grad && a.kd_weight != 0.0, ce_grad = grad && ce && a.ce_weight != 0.0;
    {
      const at::Tensor t = at::mm(in.th.narrow(0, r0, n), in.tw.t());  // (n, V_t)
      auto [loss, stats, scale, unused] =
          distill_forward_op(s, t, labels, a.divergence, a.beta, a.temperature, a.ignore_index,
                             kernels::kNone, a.V, std::nullopt, /*save=*/kd_grad);
      out.kd_rows.narrow(0, r0, n).copy_(loss);
      CeChunk c;
      if (ce)
        c = cross_entropy_chunk(s, Vce, *labels, a.ignore_index, out.ce_rows.narrow(0, r0, n),
                                a.temperature == 1.0 ? stats : at::Tensor());
      if (kd_grad) {
        // Both terms' gradients in one pass, over the student's logits (no second (n, V_s)).
        std::optional<at::Tensor> cw, cs;
        if (ce_grad) {
          cw = rows_of(ce_w, r0, n) * c.inside;
          cs = c.stats;
        }
        distill_ce_grad_op(s, s, t, labels, stats, rows_of(kd_w, r0, n), cw, cs, a.divergence,
                           a.beta, a.temperature, a.ignore_index, a.V.expect_int());
        g = s;
      } else if (ce_grad) {
        g = cross_entropy_backward_op(rows_of(ce_w, r0, n), s, c.y, c.stats, c.scale,
                                      a.ignore_index, kernels::kNone, Vce);
      }
    }
    if (!grad) continue;
    if (!g.defined()) {  // both weights 0: nothing flows back
      if (want_h) out.grad_h.narrow(0, r0, n).zero_();
      continue;
    }
    if (want_h) {
      // Over the columns that count: the lm_head's padding rows (at or past V) are never read,
      // and a NaN or inf there times the gradient's 0 would be NaN in every row.
      at::Tensor gh = out.grad_h.narrow(0, r0, n);
      at::mm_out(gh, g.narrow(1, 0, Vce), in.sw.narrow(0, 0, Vce));
    }
    if (want_w) {
      // Ignored rows count nowhere: their hidden states (a masked position's may be NaN) are
      // zeroed, as their gradient rows are, so that 0 times NaN does not reach the lm_head.
      accumulate_grad_lm_head(
          acc_w, g, labels ? at::where(labels->ne(a.ignore_index).unsqueeze(1), h, 0) : h);
    }
  }
  if (grad && want_w)  // no chunk with a gradient (no rows, or both weights 0): zeros
    out.grad_w = acc_w.defined() ? acc_w : at::zeros(in.sw.sizes(), acc_opts);
  return out;
}

// The reduction's scales of the two terms as 0-dim double tensors on the device (no host sync):
// the divergence's as distill_loss's (batchmean 1/N, mean 1/(N V), sum 1), the cross-entropy's as
// torch's cross_entropy (batchmean and mean 1/N, sum 1); 0 when N is 0.
std::pair<at::Tensor, at::Tensor> reduction_scales(const FusedInputs& in, const FusedArgs& a) {
  const auto dbl = in.sh.options().dtype(at::kDouble);
  if (a.reduction == kernels::kSum) return {at::ones({}, dbl), at::ones({}, dbl)};
  const at::Tensor n = in.labels.defined() ? in.labels.ne(a.ignore_index).sum().to(at::kDouble)
                                           : at::full({}, static_cast<double>(in.rows), dbl);
  const at::Tensor inv = at::where(n > 0, n.reciprocal(), 0);
  return {a.reduction == kernels::kMean ? inv / static_cast<double>(a.V.expect_int()) : inv, inv};
}

at::Tensor empty_grad(const at::Tensor& like) {
  return at::empty({0, like.size(1)}, like.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_forward(
    const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th, const at::Tensor& tw,
    const std::optional<at::Tensor>& labels, int64_t divergence, double beta, double temperature,
    int64_t ignore_index, int64_t reduction, int64_t V, double kd_weight, double ce_weight,
    int64_t chunk_size, bool grad_hidden, bool grad_lm_head) {
  // The matmuls in the inputs' dtype whatever autocast region calls this (the public op's
  // autocast kernel casts the inputs first; see fused_linear_op.cpp).
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const FusedArgs a{divergence, beta,      temperature, ignore_index, reduction,
                    V,          kd_weight, ce_weight,   chunk_size};
  const FusedInputs in = check_fused_inputs(sh, sw, th, tw, labels, a);
  const auto acc = acc_dtype(sh);
  const bool none = reduction == kernels::kNone;
  const auto [kd_scale, ce_scale] = reduction_scales(in, a);
  at::Tensor kd_w, ce_w;
  if (!none && (grad_hidden || grad_lm_head)) {
    kd_w = (kd_scale * kd_weight).to(acc);
    ce_w = (ce_scale * ce_weight).to(acc);
  }
  DriverOut out = run_chunks(in, a, kd_w, ce_w, grad_hidden, grad_lm_head);
  at::Tensor div = out.kd_rows, ce = out.ce_rows;
  if (!none) {  // rows summed in double: many rows must not lose the small ones
    div = (div.to(at::kDouble).sum() * kd_scale).to(acc);
    ce = (ce.to(at::kDouble).sum() * ce_scale).to(acc);
  }
  // A weight of 0 drops its term (its value may be inf: 0 * inf would be NaN).
  at::Tensor loss = kd_weight != 0.0 ? div * kd_weight : at::zeros_like(div);
  if (ce_weight != 0.0) loss = loss + ce * ce_weight;
  return {loss, div, ce, out.grad_h.defined() ? out.grad_h : empty_grad(sh),
          out.grad_w.defined() ? out.grad_w : at::empty({0, sw.size(1)}, sw.options().dtype(acc))};
}

std::tuple<at::Tensor, at::Tensor> fused_linear_backward(
    const at::Tensor& grad_output, const at::Tensor& sh, const at::Tensor& sw, const at::Tensor& th,
    const at::Tensor& tw, const std::optional<at::Tensor>& labels, int64_t divergence, double beta,
    double temperature, int64_t ignore_index, int64_t V, double kd_weight, double ce_weight,
    int64_t chunk_size, bool grad_hidden, bool grad_lm_head) {
  // As in forward: a backward run inside an autocast region (reduction 'none' recomputes every
  // chunk here) must not recast the matmuls while the gradient buffers keep the inputs' dtype.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const FusedArgs a{divergence, beta,      temperature, ignore_index, kernels::kNone,
                    V,          kd_weight, ce_weight,   chunk_size};
  const FusedInputs in = check_fused_inputs(sh, sw, th, tw, labels, a);
  TORCH_CHECK(grad_output.numel() == in.rows && grad_output.device() == sh.device(),
              "lossfns._fused_linear_distill_backward: grad_output must have ", num(in.rows),
              " elements (one per token) on ", sh.device(), "; got ", dims(grad_output.sizes()),
              " on ", grad_output.device());
  const at::Tensor go = grad_output.reshape({in.rows}).to(acc_dtype(sh));
  DriverOut out = run_chunks(in, a, go * kd_weight, go * ce_weight, grad_hidden, grad_lm_head);
  return {out.grad_h.defined() ? out.grad_h : empty_grad(sh),
          out.grad_w.defined() ? out.grad_w.to(sw.scalar_type()) : empty_grad(sw)};
}

// _scale_cast on the CPU: ATen's multiplication into the dtype (one rounding).
at::Tensor scale_cast_cpu(const at::Tensor& src, const at::Tensor& scale, at::ScalarType dtype) {
  TORCH_CHECK(scale.numel() == 1, "lossfns._scale_cast: scale must have 1 element; got ",
              dims(scale.sizes()));
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(dtype));
  at::mul_out(out, src, scale.reshape({}));
  return out;
}

}  // namespace

// One implementation for every device: the driver is ATen ops and the distill ops' dispatch.
TORCH_LIBRARY_IMPL(lossfns, CPU, m) {
  m.impl("_fused_linear_distill_forward", &fused_linear_forward);
  m.impl("_fused_linear_distill_backward", &fused_linear_backward);
  m.impl("_scale_cast", &scale_cast_cpu);
}
TORCH_LIBRARY_IMPL(lossfns, CUDA, m) {
  m.impl("_fused_linear_distill_forward", &fused_linear_forward);
  m.impl("_fused_linear_distill_backward", &fused_linear_backward);
}

}  // namespace lossfns::detail

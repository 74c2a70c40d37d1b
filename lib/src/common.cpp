// Glue every op of liblossfns shares (common.h), the library's version and reduction names.
#include "common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/SymNodeImpl.h>

#include "kernels_common.h"
#include "lossfns/reduction.h"
#include "lossfns/version.h"

namespace lossfns {

const char* version() { return LOSSFNS_VERSION; }

const char* reduction_name(const Reduction& reduction) {
  struct Code {
    kernels::Reduction operator()(torch::enumtype::kNone) const { return kernels::kNone; }
    kernels::Reduction operator()(torch::enumtype::kBatchMean) const { return kernels::kBatchMean; }
    kernels::Reduction operator()(torch::enumtype::kSum) const { return kernels::kSum; }
    kernels::Reduction operator()(torch::enumtype::kMean) const { return kernels::kMean; }
  };
  return kernels::kReductionNames[std::visit(Code{}, reduction)];
}

namespace detail {

std::string dtype_list(std::initializer_list<at::ScalarType> types) {
  std::string out;
  for (auto t : types) out += (out.empty() ? "" : ", ") + std::string(c10::toString(t));
  return out;
}

std::string dims(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::string sym_num(const c10::SymInt& v) {
  if (const auto n = v.maybe_as_int()) return std::to_string(*n);
  return v.toSymNode()->str();  // (not c10::str: its number insertion, above)
}

std::string dims(c10::SymIntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + sym_num(sizes[i]);
  return out + "]";
}

namespace {
std::string reduction_list() {  // 'none', 'sum', 'mean', 'batchmean'
  std::string out;
  for (const char* name : kernels::kReductionNames)
    out += (out.empty() ? "'" : ", '") + std::string(name) + "'";
  return out;
}
}  // namespace

kernels::Reduction parse_reduction(std::string_view name, const char* op) {
  for (int64_t code = 0; code < kernels::kNumReductions; ++code)
    if (name == kernels::kReductionNames[code]) return static_cast<kernels::Reduction>(code);
  TORCH_CHECK(false, op, ": reduction must be one of ", reduction_list(), "; got '", name, "'");
}

kernels::Reduction reduction_from_code(int64_t code, const char* op) {
  TORCH_CHECK(code >= 0 && code < kernels::kNumReductions, op, ": reduction code must be 0..",
              num(kernels::kNumReductions - 1), " (", reduction_list(), "); got ", num(code));
  return static_cast<kernels::Reduction>(code);
}

at::Tensor rows_view(const at::Tensor& x, int64_t rows) {
  at::Tensor r = x.reshape({rows, x.size(-1)});  // a view whenever the layout allows one
  return r.stride(1) == 1 ? r : r.contiguous();
}

c10::SymInt resolve_vocab_size(std::optional<int64_t> vocab_size, const c10::SymInt& width,
                               const char* op) {
  TORCH_CHECK(!vocab_size || *vocab_size >= 1, op, ": vocab_size must be >= 1 (or ", kUnset,
              "); got ", num(*vocab_size));
  return vocab_size ? width.min(c10::SymInt(*vocab_size)) : width;
}

at::Tensor check_labels(const std::optional<at::Tensor>& labels, c10::SymIntArrayRef lead,
                        const c10::SymInt& rows, const at::Device& device, const char* op,
                        const char* what) {
  if (!labels.has_value() || !labels->defined()) return at::Tensor();
  const at::Tensor& l = *labels;
  TORCH_CHECK(l.scalar_type() == at::kLong, op, ": labels must be int64 (Long); got ",
              l.scalar_type(), " (", kLabelsToLong, ")");
  TORCH_CHECK(l.device() == device, op, ": labels must be on the device of ", what, ", ", device,
              "; got ", l.device());
  // (BT,) labels go with (B, T, V) logits too; with (BT, V) logits the two forms are one.
  TORCH_CHECK(
      l.sym_sizes() == lead || (l.dim() == 1 && l.sym_size(0) == rows), op,
      ": labels must have shape ", dims(lead), " (the shape of ", what,
      " without its last dimension)",
      lead.size() > 1 ? " or (" + sym_num(rows) + ",)" : std::string(), "; got ",
      dims(l.sym_sizes()),
      l.sym_numel() == rows ? " (the same number of labels: flatten them with reshape(-1))" : "");
  return l.reshape_symint({rows}).contiguous();
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 ? "avx512" : isa == CpuIsa::kAvx2 ? "avx2" : "default";
}

namespace {
// Where LOSSFNS_X86_ISA_DISPATCH (kernels_common.h) holds, the compiler can ask the CPU what it
// has.
CpuIsa best_cpu_isa() {
#if LOSSFNS_X86_ISA_DISPATCH
  __builtin_cpu_init();
  // What the avx512 and avx2 builds are compiled for (kernels_common.h's target strings).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kDefault;
}

CpuIsa choose_cpu_isa() {
  const CpuIsa best = best_cpu_isa();
  const char* env = std::getenv("LOSSFNS_CPU_CAPABILITY");
  if (env == nullptr || *env == '\0') return best;
  const std::string want(env);
  for (CpuIsa isa : {CpuIsa::kDefault, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (want != cpu_isa_name(isa)) continue;
    if (isa > best) {
      TORCH_WARN("LOSSFNS_CPU_CAPABILITY=", want, ": this CPU (or this build) has only '",
                 cpu_isa_name(best), "'; using that");
      return best;
    }
    return isa;
  }
  TORCH_WARN("LOSSFNS_CPU_CAPABILITY=", want,
             " is not one of default, avx2, avx512; ignored (using '", cpu_isa_name(best), "')");
  return best;
}
}  // namespace

CpuIsa cpu_isa() {
  static const CpuIsa isa = choose_cpu_isa();
  return isa;
}

}  // namespace detail
}  // namespace lossfns

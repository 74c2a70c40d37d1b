// Glue every op of liblossfns shares: error-message formatting, reduction names, and the checks
// of labels and (rows, V) views that the CPU and CUDA adapters of each op run. Not installed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "kernels_common.h"

namespace lossfns::detail {

// Shapes and numbers for error messages, formatted without std::ostream's number insertion: in
// some Python processes (seen with the GPU machine's torch image, Ubuntu 24.04 / gcc 13) a
// library's call of ostream::operator<<(long) or <<(double) crashes the process (a segmentation
// fault instead of the RuntimeError), while strings stream fine.
std::string dims(c10::IntArrayRef sizes);
// The same for symbolic sizes (torch.compile's dynamic shapes: a symbol prints as its name).
std::string dims(c10::SymIntArrayRef sizes);
std::string sym_num(const c10::SymInt& v);  // a number, or a symbol's expression
inline std::string num(int64_t v) { return std::to_string(v); }
std::string num(double v);  // as "%g" (0.5, 1e-05, inf, nan)
std::string dtype_list(std::initializer_list<at::ScalarType> types);
// The spellings the errors name for both APIs: an unset optional argument, and the conversion of
// labels to int64.
inline constexpr char kUnset[] = "unset: None in Python, std::nullopt in C++";
inline constexpr char kLabelsToLong[] = "convert with .long() in Python, .to(torch::kLong) in C++";

// The public ops' reduction name ("none" | "sum" | "mean" | "batchmean") as the internal ops take
// it; `op` names the caller in the error ("lossfns.tvd_loss").
kernels::Reduction parse_reduction(std::string_view name, const char* op);
// An internal op's `int reduction`, checked (it comes from our own public op unless someone calls
// the internal op directly).
kernels::Reduction reduction_from_code(int64_t code, const char* op);

// A (rows, V) view of x with unit stride inside a row (a copy only when no view has one).
at::Tensor rows_view(const at::Tensor& x, int64_t rows);

// vocab_size (the columns at or past it are padding), checked >= 1 when set: the number of
// columns of a row of `width` that count.
// In the public ops' autograd and composite kernels the width is a symbol under torch.compile's
// dynamic shapes: V stays one (min(vocab_size, width)), never a constant that would make every
// new width a recompile.
c10::SymInt resolve_vocab_size(std::optional<int64_t> vocab_size, const c10::SymInt& width,
                               const char* op);

// labels: int64 on `device`, shape `lead` (the input's shape without its last dimension) or
// (rows,); returns them as a contiguous (rows,) tensor, or an undefined tensor when absent. On
// symbolic sizes too (the fused op's autograd kernel, under torch.compile's dynamic shapes).
at::Tensor check_labels(const std::optional<at::Tensor>& labels, c10::SymIntArrayRef lead,
                        const c10::SymInt& rows, const at::Device& device, const char* op,
                        const char* what);
inline at::Tensor check_labels(const std::optional<at::Tensor>& labels, c10::IntArrayRef lead,
                               int64_t rows, const at::Device& device, const char* op,
                               const char* what) {
  return check_labels(labels, c10::fromIntArrayRefSlow(lead), c10::SymInt(rows), device, op, what);
}

// The x86-64 instruction set the CPU kernels that are built per ISA run with, chosen once per
// process: the best the CPU has, or LOSSFNS_CPU_CAPABILITY (default | avx2 | avx512, as ATen's
// ATEN_CPU_CAPABILITY), never above what the CPU has (then the best it has, with a warning).
// Other architectures and compilers: always kDefault.
enum class CpuIsa { kDefault, kAvx2, kAvx512 };
CpuIsa cpu_isa();
const char* cpu_isa_name(CpuIsa isa);

}  // namespace lossfns::detail

// Glue every op of liblossfns shares (common.h), the library's version and reduction names.
#include "common.h"

#include <ATen/ATen.h>

#include "kernels_common.h"
#include "lossfns/reduction.h"
#include "lossfns/version.h"

namespace lossfns {

const char* version() { return LOSSFNS_VERSION; }

const char* reduction_name(const Reduction& reduction) {
  struct Name {
    const char* operator()(torch::enumtype::kNone) const { return "none"; }
    const char* operator()(torch::enumtype::kBatchMean) const { return "batchmean"; }
    const char* operator()(torch::enumtype::kSum) const { return "sum"; }
    const char* operator()(torch::enumtype::kMean) const { return "mean"; }
  };
  return std::visit(Name{}, reduction);
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

int64_t parse_reduction(std::string_view name, const char* op) {
  if (name == "none") return kernels::kNone;
  if (name == "sum") return kernels::kSum;
  if (name == "mean") return kernels::kMean;
  if (name == "batchmean") return kernels::kBatchMean;
  TORCH_CHECK(false, op, ": reduction must be one of 'none', 'sum', 'mean', 'batchmean'; got '", name, "'");
}

at::Tensor rows_view(const at::Tensor& x, int64_t rows) {
  at::Tensor r = x.reshape({rows, x.size(-1)});  // a view whenever the layout allows one
  return r.stride(1) == 1 ? r : r.contiguous();
}

at::Tensor check_labels(const std::optional<at::Tensor>& labels, c10::IntArrayRef lead, int64_t rows,
                        const at::Device& device, const char* op, const char* what) {
  if (!labels.has_value() || !labels->defined()) return at::Tensor();
  const at::Tensor& l = *labels;
  TORCH_CHECK(l.scalar_type() == at::kLong, op, ": labels must be int64 (Long); got ", l.scalar_type(),
              " (convert with .to(torch::kLong))");
  TORCH_CHECK(l.device() == device, op, ": labels must be on ", what, "'s device ", device, "; got ", l.device());
  TORCH_CHECK(l.sizes() == lead || (l.dim() == 1 && l.size(0) == rows), op, ": labels must have shape ",
              dims(lead), " (", what, "'s shape without its last dimension) or (", num(rows), ",); got ", dims(l.sizes()));
  return l.reshape({rows}).contiguous();
}

}  // namespace detail
}  // namespace lossfns

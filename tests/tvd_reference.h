// Float64 reference of the TVD loss (composite ATen in double: abs's backward is 0 at 0), and the
// helpers the op tests share: the element-wise comparison and the message of an expected error.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lossfns/tvd.h"

namespace lossfns::testing {

// The reduction's name -> the option value.
inline TVDLossOptions::reduction_t reduction_from(const std::string& name) {
  if (name == "none") return torch::kNone;
  if (name == "sum") return torch::kSum;
  if (name == "mean") return torch::kMean;
  return torch::kBatchMean;
}

// loss = 0.5*|p - q| masked by non-ignored rows, reduced; p, q: (..., V) leaves in double.
inline at::Tensor reference_tvd(const at::Tensor& p, const at::Tensor& q,
                                const std::optional<at::Tensor>& labels, int64_t ignore_index,
                                const std::string& reduction) {
  const int64_t V = p.size(-1);
  at::Tensor elem = (p - q).abs() * 0.5;
  at::Tensor mask = at::ones(p.sizes().slice(0, p.dim() - 1), p.options());
  if (labels) mask = labels->reshape(mask.sizes()).ne(ignore_index).to(p.options());
  elem = elem * mask.unsqueeze(-1);
  if (reduction == "none") return elem;
  at::Tensor total = elem.sum();
  if (reduction == "sum") return total;
  at::Tensor n = mask.sum();
  // Every row ignored: 0, like the op (the clamp only avoids 0/0; total is 0 then).
  if (reduction == "mean") return total / (n * V).clamp_min(1);
  return total / n.clamp_min(1);
}

// Every element: equal, or |actual - expected| <= atol + rtol*|expected|, and NaN exactly where
// expected has NaN. Reports the first offending index.
inline ::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected,
                                            double rtol, double atol) {
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble).reshape(-1).contiguous();
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble).reshape(-1).contiguous();
  if (a.numel() != e.numel())
    return ::testing::AssertionFailure() << "numel " << a.numel() << " != " << e.numel();
  const double* ap = a.const_data_ptr<double>();
  const double* ep = e.const_data_ptr<double>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (ap[i] == ep[i]) continue;  // equal, infinities included
    const bool an = std::isnan(ap[i]), en = std::isnan(ep[i]);
    if (an != en || (!en && !(std::abs(ap[i] - ep[i]) <= atol + rtol * std::abs(ep[i]))))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << a.numel() << ": got " << ap[i] << ", expected "
             << ep[i] << " (rtol " << rtol << ", atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

// The message (without backtrace) of the c10::Error f throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace lossfns::testing

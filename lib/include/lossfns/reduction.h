// The reduction option every loss of liblossfns takes, in LibTorch's style (torch::kSum, ...),
// and its name as the registered ops take it.
#pragma once

#include <variant>

#include <torch/enum.h>

namespace lossfns {

using Reduction = std::variant<torch::enumtype::kNone, torch::enumtype::kBatchMean,
                               torch::enumtype::kSum, torch::enumtype::kMean>;

// "none", "batchmean", "sum" or "mean".
const char* reduction_name(const Reduction& reduction);

}  // namespace lossfns

// Defaults every loss of liblossfns shares, in one place: the C++ options, the registered ops'
// schemas (so Python sees the same values) and distill_trainer's config start from these. No
// Torch headers: cheap to include anywhere.
#pragma once

#include <cstdint>

namespace lossfns {

// Rows whose label equals this contribute no loss and get no gradient (PyTorch's convention for
// cross-entropy, so the same label tensor serves both losses).
inline constexpr int64_t kDefaultIgnoreIndex = -100;

}  // namespace lossfns

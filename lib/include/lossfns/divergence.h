// The divergences of lossfns::distill_loss and their names: one table behind the op's
// `divergence` argument, Python's lossfns.distill_loss and distill_trainer's
// `distill.divergence`. No Torch headers: cheap to include anywhere.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lossfns {

// With p = softmax(s / T) (student), q = softmax(t / T) (teacher), per row (token):
//   kTvd:       0.5 * sum_j |p_j - q_j|
//   kForwardKl: KL(q || p) = sum_j q_j (log q_j - log p_j)
//   kReverseKl: KL(p || q) = sum_j p_j (log p_j - log q_j)
//   kJsd:       beta * KL(q || m) + (1 - beta) * KL(p || m), m = beta q + (1 - beta) p;
//               beta = 0 is kForwardKl and beta = 1 is kReverseKl (TRL's and Liger's convention)
enum class Divergence : int64_t { kTvd = 0, kForwardKl = 1, kReverseKl = 2, kJsd = 3 };

// The names of Divergence, in its order.
inline constexpr std::array<const char*, 4> kDivergenceNames = {"tvd", "forward_kl", "reverse_kl",
                                                                "jsd"};
// (A value outside the enum, e.g. static_cast<Divergence>(7), is "(not a Divergence)": the ops
// then refuse it as an unknown name.)
inline const char* divergence_name(Divergence d) {
  const auto i = static_cast<uint64_t>(d);
  return i < kDivergenceNames.size() ? kDivergenceNames[i] : "(not a Divergence)";
}
// The divergence named `name`, or std::nullopt.
inline std::optional<Divergence> divergence_from_name(std::string_view name) {
  for (size_t i = 0; i < kDivergenceNames.size(); ++i)
    if (name == kDivergenceNames[i]) return static_cast<Divergence>(i);
  return std::nullopt;
}

}  // namespace lossfns

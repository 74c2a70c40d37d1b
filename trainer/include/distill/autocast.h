// distill::AutocastGuard: bf16 autocast of CUDA forward passes for the guard's lifetime, shared
// by the Trainer and the convergence harness so both train under exactly the same precision.
#pragma once

#include <ATen/autocast_mode.h>

namespace distill {

// enabled=false: a no-op. Restores the previous autocast state on destruction.
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    previous_ = at::autocast::is_autocast_enabled(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    at::autocast::set_autocast_enabled(at::kCUDA, previous_);
    at::autocast::clear_cache();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  bool previous_ = false;
};

}  // namespace distill

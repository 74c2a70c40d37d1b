#include "distill/grad_reducer.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distill/distributed.h"

namespace distill {

// Called by autograd after a parameter's .grad has been accumulated in a backward.
struct GradReducer::Hook : torch::autograd::PostAccumulateGradHook {
  Hook(GradReducer* reducer, size_t param) : reducer(reducer), param(param) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override {
    reducer->OnGradReady(param);
  }
  GradReducer* reducer;
  size_t param;
};

GradReducer::GradReducer(const std::vector<at::Tensor>& parameters, int64_t bucket_bytes,
                         GradientCommunicator& comm)
    : comm_(comm) {
  if (bucket_bytes <= 0) {
    throw std::invalid_argument(fmt::format(
        "GradReducer: bucket_bytes must be positive (train.bucket_mb), got {}", bucket_bytes));
  }
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    if (!p.is_leaf()) {
      throw std::invalid_argument(
          "GradReducer: a parameter that requires a gradient is not a leaf tensor; pass the "
          "module's parameters()");
    }
    params_.push_back(p);
  }
  // Reverse order: a backward produces the last layers' gradients first.
  std::vector<at::Tensor> reversed(params_.rbegin(), params_.rend());
  for (auto bucket : Buckets(reversed, bucket_bytes)) {
    for (size_t& i : bucket) i = params_.size() - 1 - i;  // back to indices into params_
    bucket_params_.push_back(std::move(bucket));
  }
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < bucket_params_.size(); ++b) {
    Bucket bucket;
    int64_t numel = 0;
    for (size_t k = 0; k < bucket_params_[b].size(); ++k) {
      const size_t i = bucket_params_[b][k];
      bucket_of_[i] = b;
      slot_of_[i] = k;
      bucket.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    const at::Tensor& first = params_[bucket_params_[b].front()];
    bucket.flat = at::empty({numel}, first.options().requires_grad(false));
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(params_[i]);
    if (hook != nullptr) {
      for (size_t j = 0; j < i; ++j)
        torch::autograd::impl::set_post_acc_grad_hooks(params_[j], nullptr);
      throw std::invalid_argument(fmt::format(
          "GradReducer: parameter {} (shape {}) already has a post-accumulate-grad hook; one "
          "reducer per model",
          i, fmt::join(params_[i].sizes(), "x")));
    }
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<Hook>(this, i));
  }
}

GradReducer::~GradReducer() {
  for (const auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradReducer::ResetStep() {
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = static_cast<int64_t>(bucket_params_[b].size());
    buckets_[b].wait = nullptr;
  }
  next_start_ = 0;
  started_during_backward_ = 0;
}

void GradReducer::BeginBackward(bool last) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (step_open_) {
    throw std::logic_error(
        "GradReducer: a backward began after the step's last one without Finish(); the "
        "previous step's sums were never collected");
  }
  if (last) {
    ResetStep();
    step_open_ = true;
  }
  armed_ = last;
}

void GradReducer::CopyIn(size_t i) {
  const at::Tensor& p = params_[i];
  Bucket& bucket = buckets_[bucket_of_[i]];
  at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[slot_of_[i]], p.numel());
  const at::Tensor& g = p.grad();
  if (g.defined()) {
    slot.copy_(g.reshape({-1}));
  } else {
    slot.zero_();
  }
  ready_[i] = true;
  bucket.pending -= 1;
}

void GradReducer::StartReadyBuckets() {
  while (next_start_ < buckets_.size() && buckets_[next_start_].pending == 0) {
    Bucket& bucket = buckets_[next_start_];
    bucket.wait = comm_.AllReduceSumAsync(bucket.flat);
    if (armed_) ++started_during_backward_;
    ++next_start_;
  }
}

void GradReducer::OnGradReady(size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || ready_[i]) return;
  c10::NoGradGuard no_grad;
  CopyIn(i);
  if (buckets_[bucket_of_[i]].pending == 0) StartReadyBuckets();
}

void GradReducer::Finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::NoGradGuard no_grad;
  if (!step_open_) ResetStep();  // no backward was marked last: nothing started yet
  armed_ = false;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) CopyIn(i);
  StartReadyBuckets();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].wait();
    for (size_t k = 0; k < bucket_params_[b].size(); ++k) {
      at::Tensor& p = params_[bucket_params_[b][k]];
      const at::Tensor sum = buckets_[b].flat.narrow(0, buckets_[b].offsets[k], p.numel());
      if (!p.grad().defined()) p.mutable_grad() = at::empty_like(p);
      p.mutable_grad().copy_(sum.view(p.sizes()));
    }
    buckets_[b].wait = nullptr;
  }
  step_open_ = false;
}

}  // namespace distill

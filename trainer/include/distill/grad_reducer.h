// Data-parallel gradient reduction overlapped with the backward pass, as PyTorch's DDP does it:
// the parameters' gradients are grouped into buckets of about `bucket_bytes` in the reverse
// order of the parameters (the order in which a backward produces them), and each bucket's
// all-reduce starts, asynchronously, as soon as the step's last backward has produced every
// gradient in it; the optimizer step waits for them (Finish).
//
//   GradReducer reducer(model.parameters(), 25 << 20, dist);  // dist: Distributed (NCCL)
//   for each micro-batch i of the step:
//     reducer.BeginBackward(/*last=*/i == n - 1);
//     loss_i.backward();
//   reducer.Finish();  // every rank's .grad now holds the sum over the ranks
//
// Only the last micro-batch's backward communicates (the earlier ones accumulate locally, as
// DDP's no_sync). Buckets are started strictly in order (bucket k only after bucket k - 1), so
// every rank issues the same collectives in the same order even if its backward produced the
// gradients in a different order. A parameter that got no gradient in the last backward (unused
// by the graph) is filled in by Finish (its own gradient if it has one, zeros otherwise), which
// then starts the buckets still waiting for it.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

namespace distill {

// The one collective the reducer needs from a process group.
class GradientCommunicator {
 public:
  virtual ~GradientCommunicator() = default;
  // Starts summing the 1-D tensor `flat` over all ranks, in place, and returns a function that
  // waits for the sum (for NCCL: makes the current CUDA stream wait; the host does not block).
  // `flat` stays alive and untouched until then. Every rank starts the same sums (same sizes)
  // in the same order.
  virtual std::function<void()> AllReduceSumAsync(at::Tensor flat) = 0;
};

class GradReducer {
 public:
  // Hooks every parameter of `parameters` that requires a gradient (a post-accumulate-grad hook;
  // a parameter that already has one is an error). Buckets hold one dtype and device each, at
  // most bucket_bytes (a larger parameter gets a bucket of its own); their flat buffers are
  // allocated here, once: one more copy of the gradients, as DDP's.
  GradReducer(const std::vector<at::Tensor>& parameters, int64_t bucket_bytes,
              GradientCommunicator& comm);
  ~GradReducer();  // removes the hooks
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Before each backward of a step: `last` for the step's last micro-batch, whose backward
  // starts the all-reduces; the earlier ones only accumulate. After a `last` one, Finish must
  // come before the next backward (else std::logic_error).
  void BeginBackward(bool last);
  // After the step's last backward: starts the buckets still waiting (parameters without a
  // gradient), waits for every sum and copies it into the parameters' .grad.
  void Finish();

  // The buckets as indices into the hooked parameters (those that require a gradient, in the
  // order given), in the order their all-reduces start.
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }
  // Buckets of the last finished step whose all-reduce started during the backward (the rest
  // started in Finish).
  int64_t started_during_backward() const { return started_during_backward_; }

 private:
  struct Bucket {
    at::Tensor flat;               // the bucket's gradients, concatenated
    std::vector<int64_t> offsets;  // of each parameter in `flat`
    int64_t pending = 0;           // gradients still to come in this step
    std::function<void()> wait;    // set when its all-reduce started
  };
  struct Hook;

  void OnGradReady(size_t param);  // a hooked parameter's gradient is final for this step
  void CopyIn(size_t param);       // its gradient (or zeros) into its bucket; the bucket's count
  void StartReadyBuckets();        // in order, as far as they are complete
  void ResetStep();

  GradientCommunicator& comm_;
  std::vector<at::Tensor> params_;  // the hooked parameters
  std::vector<size_t> bucket_of_, slot_of_;
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<Bucket> buckets_;
  std::vector<bool> ready_;
  size_t next_start_ = 0;
  bool armed_ = false;      // the step's last backward is running (hooks copy and start)
  bool step_open_ = false;  // BeginBackward(true) was called and Finish not yet
  int64_t started_during_backward_ = 0;
  std::mutex mutex_;  // the hooks run on autograd's threads
};

}  // namespace distill

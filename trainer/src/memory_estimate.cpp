// The start-up memory estimate and check (memory_estimate.h): the terms a config needs, what
// the device has, and the refusal that names the keys driving the estimate.
#include "distill/memory_estimate.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "config_schema.h"  // TrainedModelDropouts
#include "distill/run.h"

namespace distill {
namespace {

// Bytes per fp32 parameter: the weight, its gradient, AdamW's exp_avg and exp_avg_sq (amsgrad is
// off, so max_exp_avg_sq is never allocated; the step count is a host integer).
constexpr double kTrainedBytesPerParameter = 4 * 4;
constexpr double kFrozenBytesPerParameter = 4;  // the teacher: weights only, no autograd

// Activation elements saved for the backward per token and layer, counted from the forward code
// (models/gpt.cpp, models/llama.cpp). gpt: the LayerNorm inputs and outputs, q/k/v, the
// attention output and its projection's input, the residual: ~10 d_model; the MLP's GELU input
// and output: 2 mlp_width. llama: RMSNorm keeps fp32 intermediates and RoPE copies q and k:
// ~16 d_model; SwiGLU keeps gate, up, silu(gate) and the product: 4 mlp_width (3 with the fused
// CUDA kernel, which recomputes silu(gate) in its backward; the estimate keeps the composite's 4).
// Attention scores (T x T) are not counted: SDPA's fused kernels keep O(T) per row.
struct PerToken {
  double d_model, mlp_width;
};
PerToken ActivationsPerLayer(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt:
      return {10, 2};
    case ModelFamily::kLlama:
      return {16, 4};
  }
  return {16, 4};
}

// (BT, V) tensors alive at the loss's peak (loss.cpp), in the logits' dtype: the fused losses
// (lossfns::cross_entropy_loss, lossfns::distill_loss) make no fp32 copies. Pretraining: the
// logits and their gradient; distillation: both models' logits, the cross-entropy's and the
// divergence's gradients and their sum.
constexpr double kLossTensorsPretrain = 2;
constexpr double kLossTensorsDistill = 5;

std::string FormatBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  double value = bytes;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (value >= 1e4) return fmt::format("{:.3g} {}", value, kUnits[unit]);
  return fmt::format("{:.{}f} {}", value, unit == 0 ? 0 : 1, kUnits[unit]);
}

std::string FormatCount(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

// The keys that set a model section's size; with hf_dir its config.json sets them.
std::string ModelKeys(const ModelConfig& m, const std::string& section) {
  if (!m.hf_dir.empty()) return section + ".hf_dir (its config.json)";
  std::string keys = fmt::format("{0}.n_layer, {0}.d_model, {0}.vocab_size", section);
  keys += m.intermediate_size > 0 ? ", " + section + ".intermediate_size"
                                  : ", " + section + ".mlp_ratio";
  return keys;
}

std::string WidthKeys(const ModelConfig& m, const std::string& section) {
  if (!m.hf_dir.empty()) return section + ".hf_dir (its config.json)";
  return fmt::format("{0}.n_layer, {0}.d_model, {0}.{1}", section,
                     m.intermediate_size > 0 ? "intermediate_size" : "mlp_ratio");
}

// Whether the run stores its frozen teacher's matmul weights in bf16 (trainer.cpp: distillation
// under bf16 autocast, which only happens on CUDA).
bool TeacherMatmulsInBf16(const Config& c, c10::DeviceType device_type) {
  return c.train.mode == Mode::kDistill && c.train.precision == Precision::kBf16 &&
         device_type == c10::DeviceType::CUDA;
}

// One plain training run. `student_section` names the config section whose architecture the
// run's student has (the pipeline's teacher stage trains the teacher's architecture).
MemoryEstimate EstimateSteadyRun(const Config& c, c10::DeviceType device_type,
                                 const std::string& student_section, int world_size) {
  const bool distill = c.train.mode == Mode::kDistill;
  const bool bf16 = c.train.precision == Precision::kBf16 && device_type == c10::DeviceType::CUDA;
  const double activation_bytes = bf16 ? 2 : 4;
  const double tokens = static_cast<double>(c.data.batch_size) * c.data.seq_len;  // BT
  const ModelConfig& s = c.student;
  MemoryEstimate e;

  const double student_params = ParameterCount(s);
  e.terms.push_back({fmt::format("{} weights, gradients and AdamW state ({} parameters x 16 B)",
                                 student_section, FormatCount(student_params)),
                     student_params * kTrainedBytesPerParameter, ModelKeys(s, student_section)});
  if (world_size > 1) {
    e.terms.push_back(
        {fmt::format("data-parallel gradient buckets ({} parameters x 4 B: one more copy of the "
                     "gradients, summed over the {} ranks)",
                     FormatCount(student_params), world_size),
         student_params * 4, ModelKeys(s, student_section)});
  }
  if (distill) {
    const double teacher_params = ParameterCount(c.teacher);
    const double bf16_params =
        TeacherMatmulsInBf16(c, device_type) ? MatmulParameterCount(c.teacher) : 0;
    e.terms.push_back(
        {bf16_params > 0
             ? fmt::format("teacher weights ({} parameters, frozen: {} matmul weights x 2 B "
                           "(bf16), the rest x 4 B)",
                           FormatCount(teacher_params), FormatCount(bf16_params))
             : fmt::format("teacher weights ({} parameters x 4 B, frozen)",
                           FormatCount(teacher_params)),
         bf16_params * 2 + (teacher_params - bf16_params) * kFrozenBytesPerParameter,
         ModelKeys(c.teacher, "teacher")});
  }

  const PerToken per_layer = ActivationsPerLayer(s.family);
  const double layer_elements = per_layer.d_model * s.d_model + per_layer.mlp_width * s.mlp_width();
  double activations = tokens * activation_bytes * 3.0 * s.d_model;  // embeddings, final norm
  std::string activation_keys = "data.batch_size, data.seq_len, " + WidthKeys(s, student_section);
  if (c.train.activation_checkpointing) {
    // Each block keeps its inputs (the fp32 residual stream and the previous block's output);
    // the backward holds one block's recomputed activations at a time.
    activations += tokens * (s.n_layer * (4.0 + activation_bytes) * s.d_model +
                             activation_bytes * layer_elements);
    activation_keys += ", train.activation_checkpointing";
  } else {
    activations += tokens * activation_bytes * s.n_layer * layer_elements;
  }
  if (distill) {
    // The teacher's forward keeps nothing for a backward: one layer's working set at a time.
    const ModelConfig& t = c.teacher;
    activations += tokens * activation_bytes *
                   (2.0 * t.d_model + std::max<double>(3.0 * t.d_model, t.mlp_width()));
  }
  if (bf16) activation_keys += ", train.precision";
  e.terms.push_back({fmt::format("activations kept for the backward ({} tokens per micro-batch{})",
                                 FormatCount(tokens),
                                 c.train.activation_checkpointing
                                     ? "; checkpointed: each block's inputs, one block's rest"
                                     : ""),
                     activations, activation_keys});

  if (distill && UsesFusedLinear(c.distill.fused_linear, device_type == c10::DeviceType::CUDA)) {
    // lossfns::fused_linear_distill_loss: no (BT, V) tensor. It certainly holds both models'
    // last hidden states, the student's hidden-state gradient and the fp32 (V_s, H_s) lm_head
    // gradient accumulator; one token chunk's logits at a time (sized by the allocator's free
    // memory, not counted).
    e.terms.push_back(
        {fmt::format("fused loss (distill.fused_linear): (BT, H) hidden states ({} tokens) and "
                     "the fp32 (V, H) lm_head gradient",
                     FormatCount(tokens)),
         tokens * activation_bytes * (2.0 * s.d_model + c.teacher.d_model) +
             4.0 * static_cast<double>(s.padded_vocab_size()) * s.d_model,
         fmt::format("data.batch_size, data.seq_len, {0}.d_model, {0}.vocab_size, "
                     "teacher.d_model, distill.fused_linear",
                     student_section)});
    return e;
  }
  double width = static_cast<double>(s.padded_vocab_size());
  std::string logit_keys =
      fmt::format("data.batch_size, data.seq_len, {0}.vocab_size, {0}.pad_vocab_to_multiple_of",
                  student_section);
  double logits = 0;
  if (distill) {
    width = std::max(width, static_cast<double>(c.teacher.padded_vocab_size()));
    logits = activation_bytes * kLossTensorsDistill;
    logit_keys += ", teacher.vocab_size";
  } else {
    logits = activation_bytes * kLossTensorsPretrain;
  }
  e.terms.push_back({fmt::format("(BT, V) = ({}, {}) logits and their gradients in the loss",
                                 FormatCount(tokens), FormatCount(width)),
                     tokens * width * logits, logit_keys});
  return e;
}

// One plain training run, at its peak: the steady state above, or the start-up when that is
// more. Under bf16 on CUDA the trainer builds the teacher with fp32 weights, then the student
// (which may be initialised from them), and only then stores the teacher's matmul weights in
// bf16 (trainer.cpp): both models' fp32 weights are on the device together first, which a large
// teacher with a small student needs more than the steady state.
MemoryEstimate EstimateRun(const Config& c, c10::DeviceType device_type,
                           const std::string& student_section, int world_size) {
  MemoryEstimate e = EstimateSteadyRun(c, device_type, student_section, world_size);
  if (TeacherMatmulsInBf16(c, device_type)) {
    const double teacher = ParameterCount(c.teacher), student = ParameterCount(c.student);
    const double start = 4 * (teacher + student), steady = e.total();
    if (start > steady) {
      e.terms.push_back(
          {fmt::format("start-up: the teacher's matmul weights in fp32 until the student is built "
                       "({} parameters x 4 B for both models together)",
                       FormatCount(teacher + student)),
           start - steady, ModelKeys(c.teacher, "teacher")});
    }
  }
  return e;
}

// The first number of a file like /proc/meminfo's line or a cgroup limit; -1 when absent.
double ReadNumberAfter(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::istringstream rest(line.substr(prefix.size()));
    double value = -1;
    if (rest >> value) return value;
  }
  return -1;
}

}  // namespace

double MemoryEstimate::total() const {
  double sum = 0;
  for (const auto& t : terms) sum += t.bytes;
  return sum;
}

double MatmulParameterCount(const ModelConfig& c) {
  const double V = static_cast<double>(c.padded_vocab_size());
  const double D = static_cast<double>(c.d_model);
  const double H = static_cast<double>(c.mlp_width());
  const double L = static_cast<double>(c.n_layer);
  const double lm_head = c.tie_embeddings ? 0 : V * D;
  switch (c.family) {
    case ModelFamily::kGpt:  // qkv, attn_out, mlp_in, mlp_out with their biases
      return L * ((3 * D * D + 3 * D) + (D * D + D) + (D * H + H) + (H * D + D)) + lm_head;
    case ModelFamily::kLlama: {
      const double q = static_cast<double>(c.n_head) * c.head_size();
      const double kv = static_cast<double>(c.kv_heads()) * c.head_size();
      double layer = D * q + 2 * D * kv + q * D + 3 * D * H;
      if (c.attention_bias) layer += q + 2 * kv;
      if (c.attention_out_bias) layer += D;
      if (c.mlp_bias) layer += 2 * H + D;
      return L * layer + lm_head;
    }
  }
  return 0;
}

double ParameterCount(const ModelConfig& c) {
  // The matmuls', then the embeddings and norms.
  const double V = static_cast<double>(c.padded_vocab_size());
  const double D = static_cast<double>(c.d_model);
  const double L = static_cast<double>(c.n_layer);
  double rest = V * D;  // the token embedding (the lm_head too when tied)
  switch (c.family) {
    case ModelFamily::kGpt:  // learned positions; two LayerNorms per block and the final one
      rest += static_cast<double>(c.context_length) * D + L * 4 * D + 2 * D;
      break;
    case ModelFamily::kLlama:  // two RMSNorms per block (and q/k norms), the final one
      rest += L * 2 * D + D + (c.qk_norm ? L * 2.0 * c.head_size() : 0.0);
      break;
  }
  return MatmulParameterCount(c) + rest;
}

MemoryEstimate EstimateMemory(const Config& config, c10::DeviceType device_type, int world_size) {
  if (!IsPipeline(config)) return EstimateRun(config, device_type, "student", world_size);
  MemoryEstimate teacher =
      EstimateRun(TeacherStageConfig(config), device_type, "teacher", world_size);
  teacher.stage = "teacher pretraining";
  MemoryEstimate student =
      EstimateRun(StudentStageConfig(config), device_type, "student", world_size);
  student.stage = "distillation";
  // The baseline stage trains the same student without a teacher: never more than this.
  return teacher.total() > student.total() ? teacher : student;
}

AvailableMemory DeviceMemory(const c10::Device& device) {
  if (device.is_cuda()) {
    try {
      const auto info = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                            ->getMemoryInfo(device.has_index() ? device.index() : 0);
      return {static_cast<double>(info.first),
              fmt::format("free on {} (cudaMemGetInfo)", device.str())};
    } catch (const c10::Error&) {
      return {};  // unknown: not checked
    }
  }
  AvailableMemory m;
  const double kib = ReadNumberAfter("/proc/meminfo", "MemTotal:");
  if (kib > 0) {
    m = {kib * 1024, "physical memory (/proc/meminfo MemTotal)"};
  } else {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) {
      m = {static_cast<double>(pages) * page, "physical memory (sysconf)"};
    }
  }
  const AvailableMemory limit = CgroupMemoryLimit();
  if (limit.bytes > 0 && (m.bytes < 0 || limit.bytes < m.bytes)) m = limit;
  return m;
}

AvailableMemory CgroupMemoryLimit(const std::string& root) {
  AvailableMemory smallest;
  auto consider = [&](const std::string& file) {
    const double limit = ReadNumberAfter(root + file, "");  // "max": no number, no limit
    if (limit > 0 && limit < 1e18 && (smallest.bytes < 0 || limit < smallest.bytes)) {
      smallest = {
          limit,
          fmt::format("the memory limit of this process's cgroup or one above it ({})", file)};
    }
  };
  struct Hierarchy {
    std::string mount, file;
  };
  const Hierarchy v2{"/sys/fs/cgroup", "memory.max"};
  const Hierarchy v1{"/sys/fs/cgroup/memory", "memory.limit_in_bytes"};
  // The hierarchies where distributions and container runtimes mount them (not looked up in
  // /proc/self/mountinfo: a hierarchy mounted elsewhere gives no limit, and a bind mount of a
  // group below the root is read at its root). The root as mounted: a container's own group
  // where it has a cgroup namespace.
  for (const Hierarchy* h : {&v2, &v1}) consider(h->mount + "/" + h->file);
  // The process's own group and every group above it (a parent's limit applies too): where the
  // mount shows the whole tree (systemd-run -p MemoryMax=, Slurm, a container without a cgroup
  // namespace). Lines "0::/a/b" (v2) and "4:memory:/a/b" (v1, controllers comma-separated).
  std::ifstream in(root + "/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    std::string path = line.substr(second + 1);
    const Hierarchy* h = line.compare(0, first, "0") == 0 && controllers == ",," ? &v2
                         : controllers.find(",memory,") != std::string::npos     ? &v1
                                                                                 : nullptr;
    // (A path outside this namespace's root, "/../x", is not below the mount.)
    if (h == nullptr || path.rfind('/', 0) != 0 || path.find("/..") != std::string::npos) {
      continue;
    }
    while (path.size() > 1) {  // "/a/b", then "/a"; the root was considered above
      consider(h->mount + path + "/" + h->file);
      path.resize(path.rfind('/'));
    }
  }
  return smallest;
}

std::string FormatEstimate(const MemoryEstimate& e, const c10::Device& device,
                           const AvailableMemory& available) {
  std::string terms;
  for (const auto& t : e.terms) {
    terms += fmt::format("{}{} {}", terms.empty() ? "" : ", ", FormatBytes(t.bytes), t.what);
  }
  return fmt::format("memory estimate{}: {} on {} ({}); available: {}",
                     e.stage.empty() ? "" : " (" + e.stage + ", the stage that needs most)",
                     FormatBytes(e.total()), device.str(), terms,
                     available.bytes < 0 ? "unknown, not checked"
                                         : FormatBytes(available.bytes) + ", " + available.source);
}

void CheckMemoryFits(const MemoryEstimate& e, const c10::Device& device,
                     const AvailableMemory& available) {
  if (available.bytes < 0 || e.total() <= available.bytes) return;
  std::vector<MemoryTerm> terms = e.terms;
  std::stable_sort(terms.begin(), terms.end(),
                   [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  std::string detail;
  for (const auto& t : terms) {
    detail += fmt::format("{}{} {} [{}]", detail.empty() ? "" : "; ", FormatBytes(t.bytes), t.what,
                          t.keys);
  }
  throw MemoryError(fmt::format(
      "memory: this config needs about {} on {}{} but {} has {} ({}): {}. Make the keys of the "
      "largest terms smaller (or train.grad_accum larger, data.batch_size smaller), or pass "
      "--no-memory-check to try anyway",
      FormatBytes(e.total()), device.str(), e.stage.empty() ? "" : " (" + e.stage + " stage)",
      device.str(), FormatBytes(available.bytes), available.source, detail));
}

bool IsOutOfMemory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  const std::string what = e.what_without_backtrace();
  // The CPU allocator's refusal, and the device's allocations outside the caching allocator:
  // CUDA's runtime (cudaErrorMemoryAllocation), a cuBLAS or cuSOLVER handle's own workspace, cuDNN.
  for (const char* words :
       {"DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory",
        "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED",
        "CUDNN_STATUS_ALLOC_FAILED"}) {
    if (what.find(words) != std::string::npos) return true;
  }
  return false;
}

std::string OutOfMemoryMessage(const std::string& what, const Config& config, bool cuda,
                               const Config& command) {
  std::vector<std::string> switches;
  // Activation checkpointing needs the trained models without dropout (the config refuses it
  // otherwise). Those of the command too, which the override goes to: a pipeline's teacher stage
  // does not know the student's dropout.
  const auto dropout = [](const Config& c) {
    const auto trained = internal::TrainedModelDropouts(c);
    return std::any_of(trained.begin(), trained.end(), [](const auto& m) { return m.second > 0; });
  };
  if (!config.train.activation_checkpointing && !dropout(config) && !dropout(command)) {
    switches.push_back("train.activation_checkpointing=true");
  }
  if (config.train.mode == Mode::kDistill && !UsesFusedLinear(config.distill.fused_linear, cuda)) {
    switches.push_back("distill.fused_linear=true");
  }
  std::string text = what;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '.')) {
    text.pop_back();
  }
  return fmt::format(
      "out of memory: {}. What needs less memory: {}{}a smaller data.batch_size with a larger "
      "train.grad_accum (the same batch; a new run, in another train.out_dir or with --fresh)",
      text, fmt::join(switches, " or "),
      switches.empty()       ? ""
      : switches.size() == 1 ? " (a run resumes with it: the same command plus the override); or "
                             : " (a run resumes with either: the same command plus the "
                               "override); or ");
}

}  // namespace distill

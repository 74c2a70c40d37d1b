// The start-up memory estimate: exact parameter, gradient and AdamW bytes against built models
// and a trained step; the refusal path with an injected 'available' number.
#include "distill/memory_estimate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <functional>
#include <sstream>

#include "distill/run.h"
#include "distill/trainer.h"
#include "test_files.h"
#include "test_util.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using testing::ExpectContains;
using testing::TempRunDir;
using testing::TinyConfig;

double TensorBytes(const at::Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel() * t.element_size()) : 0.0;
}

// ParameterCount computes from the config alone what MakeModel builds, for every family and
// the options that add or remove parameters.
TEST(MemoryEstimateTest, ParameterCountMatchesBuiltModels) {
  std::vector<ModelConfig> configs;
  ModelConfig gpt;
  gpt.vocab_size = 50;
  gpt.pad_vocab_to_multiple_of = 16;
  gpt.context_length = 12;
  gpt.n_layer = 3;
  gpt.n_head = 2;
  gpt.d_model = 10;
  gpt.mlp_ratio = 2.7;  // 27 wide: not a multiple of anything
  configs.push_back(gpt);
  gpt.tie_embeddings = false;
  configs.push_back(gpt);

  ModelConfig llama = gpt;
  llama.family = ModelFamily::kLlama;
  llama.n_head = 4;
  llama.n_kv_head = 2;
  llama.d_model = 16;
  llama.intermediate_size = 24;
  configs.push_back(llama);
  llama.head_dim = 6;  // n_head * head_dim != d_model
  llama.attention_bias = true;
  llama.qk_norm = true;
  llama.tie_embeddings = true;
  configs.push_back(llama);
  llama.attention_out_bias = true;
  llama.mlp_bias = true;
  llama.n_kv_head = 0;
  llama.intermediate_size = 0;  // round(mlp_ratio * d_model)
  configs.push_back(llama);

  for (const ModelConfig& c : configs) {
    const Model model = MakeModel(c);
    EXPECT_EQ(ParameterCount(c), static_cast<double>(model->num_parameters()))
        << ArchitectureString(c);
    // MatmulParameterCount: what StoreMatmulWeightsAs converts, counted on the built model.
    for (auto& p : model->parameters()) p.set_requires_grad(false);
    StoreMatmulWeightsAs(*model, at::kBFloat16);
    double converted = 0;
    for (const auto& p : model->parameters())
      if (p.scalar_type() == at::kBFloat16) converted += static_cast<double>(p.numel());
    EXPECT_EQ(MatmulParameterCount(c), converted) << ArchitectureString(c);
  }
}

// Under bf16 on CUDA the trainer keeps the frozen teacher's matmul weights in bf16: the teacher
// term is those at 2 B and the rest at 4 B, the bytes of a teacher so converted.
TEST(MemoryEstimateTest, Bf16TeacherTermIsTheConvertedTeachersBytes) {
  for (bool tied : {true, false}) {
    Config c = TinyConfig("unused");
    c.train.mode = Mode::kDistill;
    c.teacher.checkpoint = "teacher.pt";  // not read: the estimate needs the architecture only
    c.train.precision = Precision::kBf16;
    c.teacher.tie_embeddings = tied;
    const MemoryEstimate estimate = EstimateMemory(c, c10::DeviceType::CUDA);
    ASSERT_GE(estimate.terms.size(), 2u);
    const Model teacher = MakeModel(c.teacher);
    for (auto& p : teacher->parameters()) p.set_requires_grad(false);
    StoreMatmulWeightsAs(*teacher, at::kBFloat16);
    double bytes = 0;
    for (const auto& p : teacher->parameters()) bytes += TensorBytes(p);
    EXPECT_EQ(estimate.terms[1].bytes, bytes) << estimate.terms[1].what;
    EXPECT_NE(estimate.terms[1].what.find("bf16"), std::string::npos) << estimate.terms[1].what;
    // The same config on the CPU (no autocast there): 4 B per parameter.
    EXPECT_EQ(EstimateMemory(c, c10::DeviceType::CPU).terms[1].bytes,
              4 * ParameterCount(c.teacher));
  }
}

// Before the teacher's matmul weights become bf16 both models' fp32 weights are on the device
// together (trainer.cpp builds the teacher, then the student): a large teacher with a small
// student needs that more than its steady state, and the estimate is never below it.
TEST(MemoryEstimateTest, Bf16EstimateCoversTheStartUpWithBothModelsInFp32) {
  Config c = TinyConfig("unused");
  c.train.mode = Mode::kDistill;
  c.teacher.checkpoint = "teacher.pt";
  c.train.precision = Precision::kBf16;
  const double fp32_weights = 4 * (ParameterCount(c.teacher) + ParameterCount(c.student));
  EXPECT_GE(EstimateMemory(c, c10::DeviceType::CUDA).total(), fp32_weights);
  c.teacher.n_layer = 8;
  c.teacher.d_model = 256;
  c.teacher.n_head = 4;
  c.data.batch_size = 1;
  const MemoryEstimate big = EstimateMemory(c, c10::DeviceType::CUDA);
  EXPECT_DOUBLE_EQ(big.total(), 4 * (ParameterCount(c.teacher) + ParameterCount(c.student)));
  EXPECT_NE(big.terms.back().what.find("start-up"), std::string::npos) << big.terms.back().what;
  ExpectContains(big.terms.back().keys, {"teacher.n_layer", "teacher.d_model"});
}

// After a distillation step the student holds weights, gradients and AdamW's two moments, the
// teacher its weights: the first two terms of the estimate are exactly those bytes, measured.
TEST(MemoryEstimateTest, TrainedStateTermsAreTheMeasuredBytes) {
  Config c = testing::TinyDistillConfig(TempRunDir());
  const MemoryEstimate estimate = EstimateMemory(c, c10::DeviceType::CPU);
  ASSERT_GE(estimate.terms.size(), 2u);
  Trainer trainer(c, RunOptions::Quiet());
  trainer.Step();
  double student_bytes = 0;
  for (const auto& p : trainer.student().parameters()) {
    student_bytes += TensorBytes(p) + TensorBytes(p.grad());
    auto& state = static_cast<torch::optim::AdamWParamState&>(
        *trainer.optimizer().state().at(p.unsafeGetTensorImpl()));
    student_bytes += TensorBytes(state.exp_avg()) + TensorBytes(state.exp_avg_sq()) +
                     TensorBytes(state.max_exp_avg_sq());
  }
  double teacher_bytes = 0;
  for (const auto& p : trainer.teacher()->parameters()) {
    teacher_bytes += TensorBytes(p) + TensorBytes(p.grad());
  }
  EXPECT_EQ(estimate.terms[0].bytes, student_bytes) << estimate.terms[0].what;
  EXPECT_EQ(estimate.terms[1].bytes, teacher_bytes) << estimate.terms[1].what;
  ExpectContains(estimate.terms[0].keys,
                 {"student.n_layer", "student.d_model", "student.vocab_size"});
  ExpectContains(estimate.terms[1].keys, {"teacher.n_layer", "teacher.d_model"});
}

// Activations and logits grow linearly with the tokens of a micro-batch; a pipeline is
// estimated by its largest stage, named with that stage's keys.
TEST(MemoryEstimateTest, TermsScaleWithTheirKeys) {
  Config c = TinyConfig("unused");
  const MemoryEstimate one = EstimateMemory(c, c10::DeviceType::CPU);
  c.data.batch_size *= 2;
  const MemoryEstimate two = EstimateMemory(c, c10::DeviceType::CPU);
  ASSERT_EQ(one.terms.size(), 3u);  // pretrain: student state, activations, logits
  EXPECT_EQ(two.terms[0].bytes, one.terms[0].bytes);
  EXPECT_EQ(two.terms[1].bytes, 2 * one.terms[1].bytes);
  EXPECT_EQ(two.terms[2].bytes, 2 * one.terms[2].bytes);
  ExpectContains(one.terms[1].keys, {"data.batch_size", "data.seq_len", "student.n_layer"});
  ExpectContains(one.terms[2].keys, {"data.batch_size", "data.seq_len", "student.vocab_size"});
  // Data-parallel: each rank holds one more copy of the gradients (the reducer's buckets).
  const MemoryEstimate ranks = EstimateMemory(c, c10::DeviceType::CPU, /*world_size=*/2);
  ASSERT_EQ(ranks.terms.size(), two.terms.size() + 1);
  EXPECT_DOUBLE_EQ(ranks.total() - two.total(), two.terms[0].bytes / 4);  // 4 of 16 B/parameter
  EXPECT_NE(ranks.terms[1].what.find("gradient buckets"), std::string::npos);

  Config pipeline = TinyConfig("unused");
  pipeline.train.mode = Mode::kDistill;
  pipeline.teacher.pretrain_steps = 10;
  pipeline.teacher.n_layer = 40;  // the teacher stage dominates
  ASSERT_TRUE(IsPipeline(pipeline));
  const MemoryEstimate stages = EstimateMemory(pipeline, c10::DeviceType::CPU);
  EXPECT_EQ(stages.stage, "teacher pretraining");
  EXPECT_EQ(stages.terms[0].bytes, 16 * ParameterCount(pipeline.teacher));
  ExpectContains(stages.terms[0].keys, {"teacher.n_layer"});
}

// train.activation_checkpointing: the activation term counts each block's two inputs and one
// block's activations, not every block's.
TEST(MemoryEstimateTest, ActivationCheckpointingShrinksTheActivationTerm) {
  Config c = TinyConfig("unused");
  c.student.n_layer = 12;
  const MemoryEstimate plain = EstimateMemory(c, c10::DeviceType::CPU);
  c.train.activation_checkpointing = true;
  const MemoryEstimate checkpointed = EstimateMemory(c, c10::DeviceType::CPU);
  ASSERT_EQ(checkpointed.terms.size(), plain.terms.size());
  EXPECT_LT(checkpointed.terms[1].bytes, plain.terms[1].bytes / 3);
  EXPECT_EQ(checkpointed.terms[0].bytes, plain.terms[0].bytes);
  ExpectContains(checkpointed.terms[1].keys, {"train.activation_checkpointing", "student.n_layer"});
  EXPECT_NE(checkpointed.terms[1].what.find("checkpointed"), std::string::npos);
}

// The refusal: the total, the terms (largest first) with their keys, what is available and
// where that number came from, and the override. Availability is injected, not the machine's.
TEST(MemoryEstimateTest, RefusalNamesKeysEstimateAndAvailable) {
  Config c = TinyConfig("unused");
  c.data.batch_size = 512;
  const MemoryEstimate estimate = EstimateMemory(c, c10::DeviceType::CPU);
  const c10::Device cpu(c10::DeviceType::CPU);
  EXPECT_NO_THROW(CheckMemoryFits(estimate, cpu, {estimate.total(), "exactly enough"}));
  EXPECT_NO_THROW(CheckMemoryFits(estimate, cpu, {}));  // unknown: not checked
  const std::string message = testing::ErrorOf<MemoryError>([&] {
    CheckMemoryFits(estimate, cpu, {1024.0 * 1024, "an injected test limit"});
  });
  ExpectContains(message,
                 {"memory: this config needs about ", " on cpu",
                  "but cpu has 1.0 MiB (an injected test limit)", "data.batch_size", "data.seq_len",
                  "student.n_layer", "student.d_model", "student.vocab_size", "--no-memory-check"});
  // Largest term first: at batch 512 the logits' copies outweigh the tiny model's state.
  EXPECT_LT(message.find("logits"), message.find("weights, gradients and AdamW state")) << message;
  const std::string line = FormatEstimate(estimate, cpu, {2.0 * 1024 * 1024 * 1024, "test"});
  ExpectContains(line, {"memory estimate: ", " on cpu (", "available: 2.0 GiB, test"});
}

// Run refuses a config far beyond any machine before it creates anything.
TEST(MemoryEstimateTest, RunRefusesBeforeWritingAnything) {
  Config c = TinyConfig(TempRunDir());
  c.data.batch_size = 1 << 20;
  c.data.seq_len = 1 << 16;
  c.student.context_length = 1 << 16;
  c.student.vocab_size = 1 << 20;  // (BT, V) = (2^36, 2^20): ~2^58 bytes per copy
  std::ostringstream out;
  const std::string message = testing::ErrorOf<MemoryError>([&] {
    distill::Run(c, RunFlags{false, true}, out);
  });
  ExpectContains(message, {"needs about", "data.batch_size"});
  EXPECT_FALSE(fs::exists(c.train.out_dir));
  const AvailableMemory cpu = DeviceMemory(c10::Device(c10::DeviceType::CPU));
  EXPECT_GT(cpu.bytes, 0) << cpu.source;
}

// An allocation that failed mid-run: the allocator's words, then what needs less memory for this
// config, naming only the switches the run has off (distill.fused_linear only in distill mode,
// and not where auto turns it on: CUDA), and the batch split that keeps the batch.
TEST(MemoryEstimateTest, OutOfMemoryNamesWhatNeedsLess) {
  const std::string what = "CUDA out of memory. Tried to allocate 2.00 GiB.\n";
  const std::string batch =
      "a smaller data.batch_size with a larger train.grad_accum (the same batch; a new run, in "
      "another train.out_dir or with --fresh)";
  Config c;
  c.train.mode = Mode::kDistill;
  EXPECT_EQ(OutOfMemoryMessage(what, c, /*cuda=*/false, c),
            "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. What needs less "
            "memory: train.activation_checkpointing=true or distill.fused_linear=true (a run "
            "resumes with either: the same command plus the override); or " +
                batch);
  EXPECT_EQ(OutOfMemoryMessage(what, c, /*cuda=*/true, c),
            "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. What needs less "
            "memory: train.activation_checkpointing=true (a run resumes with it: the same "
            "command plus the override); or " +
                batch);
  c.train.activation_checkpointing = true;
  EXPECT_EQ(OutOfMemoryMessage(what, c, /*cuda=*/true, c),
            "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. What needs less "
            "memory: " +
                batch);
  c.train.mode = Mode::kPretrain;  // no distillation loss: distill.fused_linear is not named
  c.train.activation_checkpointing = false;
  EXPECT_EQ(OutOfMemoryMessage(what, c, /*cuda=*/false, c).find("fused_linear"), std::string::npos);
  // With dropout in a trained model the config refuses activation checkpointing: not named.
  c.student.dropout = 0.1;
  EXPECT_EQ(OutOfMemoryMessage(what, c, /*cuda=*/false, c).find("activation_checkpointing"),
            std::string::npos);
  c.student.dropout = 0;
  c.train.mode = Mode::kDistill;
  c.teacher.pretrain_steps = 10;
  c.teacher.dropout = 0.1;  // a teacher the pipeline trains first
  EXPECT_EQ(
      OutOfMemoryMessage(what, c, /*cuda=*/true, c),
      "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. What needs less memory: " +
          batch);
  // A pipeline's stages: the override goes to the pipeline's command, whose config refuses it
  // where a model trained in another stage has dropout (the teacher stage does not know the
  // student's dropout, the baseline stage the teacher's).
  Config pipeline;
  pipeline.teacher.pretrain_steps = 10;
  pipeline.student.dropout = 0.1;
  const Config teacher_stage = TeacherStageConfig(pipeline);
  ASSERT_EQ(teacher_stage.student.dropout, 0);
  EXPECT_NE(OutOfMemoryMessage(what, teacher_stage, /*cuda=*/true, teacher_stage)
                .find("activation_checkpointing"),
            std::string::npos);
  EXPECT_EQ(OutOfMemoryMessage(what, teacher_stage, /*cuda=*/true, pipeline),
            "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. What needs less "
            "memory: " +
                batch);
  pipeline.student.dropout = 0;
  pipeline.teacher.dropout = 0.1;
  const Config baseline_stage = BaselineStageConfig(pipeline);
  EXPECT_EQ(OutOfMemoryMessage(what, baseline_stage, /*cuda=*/true, pipeline),
            "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. What needs less "
            "memory: " +
                batch);
  pipeline.teacher.dropout = 0;  // no dropout anywhere: named in every stage
  for (const Config& stage : {TeacherStageConfig(pipeline), StudentStageConfig(pipeline),
                              BaselineStageConfig(pipeline)}) {
    EXPECT_NE(OutOfMemoryMessage(what, stage, /*cuda=*/true, pipeline)
                  .find("train.activation_checkpointing=true"),
              std::string::npos)
        << stage.train.out_dir;
  }
}

// The CPU's memory limit is the smallest of the cgroup hierarchy's root as mounted (a
// container's own group) and the process's own group and its parents (systemd-run -p MemoryMax=,
// Slurm), cgroup v2 and v1; "max" and v1's huge default are no limit.
TEST(MemoryEstimateTest, CgroupLimitIsTheSmallestOnTheProcesssPath) {
  const std::string root = TempRunDir();
  auto write = [&](const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(root + path).parent_path());
    testing::WriteBytes(root + path, text);
  };
  EXPECT_LT(CgroupMemoryLimit(root).bytes, 0);  // nothing there: no limit
  write("/proc/self/cgroup", "0::/user.slice/job.scope\n");
  write("/sys/fs/cgroup/memory.max", "max\n");
  write("/sys/fs/cgroup/user.slice/job.scope/memory.max", "max\n");
  EXPECT_LT(CgroupMemoryLimit(root).bytes, 0);
  write("/sys/fs/cgroup/user.slice/memory.max", "3221225472\n");  // a parent's limit applies
  AvailableMemory limit = CgroupMemoryLimit(root);
  EXPECT_EQ(limit.bytes, 3221225472.0);
  EXPECT_EQ(limit.source,
            "the memory limit of this process's cgroup or one above it "
            "(/sys/fs/cgroup/user.slice/memory.max)");
  write("/sys/fs/cgroup/user.slice/job.scope/memory.max", "2147483648\n");
  EXPECT_EQ(CgroupMemoryLimit(root).bytes, 2147483648.0);
  // v1 (here beside v2, as in a hybrid layout): the memory controller's line, its own tree.
  write("/proc/self/cgroup", "4:cpu,memory:/slurm/uid_0/job_7\n0::/user.slice/job.scope\n");
  write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write("/sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes", "1073741824\n");
  limit = CgroupMemoryLimit(root);
  EXPECT_EQ(limit.bytes, 1073741824.0);
  EXPECT_NE(limit.source.find("/sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes"),
            std::string::npos)
      << limit.source;
  // A path outside the namespace's root is not read below the mount.
  write("/proc/self/cgroup", "0::/../../elsewhere\n");
  write("/sys/fs/cgroup/elsewhere/memory.max", "1024\n");
  EXPECT_LT(CgroupMemoryLimit(root).bytes, 0);
  // The mount's own limit (a container with its own cgroup namespace, "0::/").
  write("/proc/self/cgroup", "0::/\n");
  write("/sys/fs/cgroup/memory.max", "536870912\n");
  EXPECT_EQ(CgroupMemoryLimit(root).bytes, 536870912.0);
}

// What counts as out of memory: c10's OutOfMemoryError (CUDA's allocator), the CPU allocator's
// refusal, which c10 raises as a plain enforce failure, and CUDA's, cuBLAS's and cuDNN's own
// allocation failures; no other error.
TEST(MemoryEstimateTest, OutOfMemoryIsRecognised) {
  const auto caught = [](const std::function<void()>& f) -> bool {
    try {
      f();
    } catch (const c10::Error& e) {
      return IsOutOfMemory(e);
    }
    ADD_FAILURE() << "nothing thrown";
    return false;
  };
  EXPECT_TRUE(caught([] {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB.");
  }));
  EXPECT_TRUE(caught([] {
    TORCH_CHECK(false, "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes");
  }));
  // The device's allocations outside the caching allocator, as c10's CUDA checks word them.
  for (const char* what :
       {"CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
        "other API call, so the stacktrace below might be incorrect.",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"}) {
    EXPECT_TRUE(caught([&] { TORCH_CHECK(false, what); })) << what;
  }
  EXPECT_FALSE(caught([] { TORCH_CHECK(false, "shape mismatch"); }));
  EXPECT_FALSE(
      caught([] { TORCH_CHECK(false, "CUDA error: an illegal memory access was encountered"); }));
}
}  // namespace
}  // namespace distill

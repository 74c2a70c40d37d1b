// Shared helpers of the trainer tests: a tiny, fast config and fresh temporary run directories.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "distill/config.h"
#include "distill/run_dir.h"

namespace distill::testing {

// A fresh directory path under the system temp dir, named after the running test. Removes
// what earlier runs of the test left there, including the derived "<dir>-*" run directories.
inline std::string TempRunDir(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name =
      std::string("distill_test_") + info->test_suite_name() + "_" + info->name() + suffix;
  // Parameterised tests are named "Suite/Test/param": one flat directory name, so that the
  // clean-up below finds what earlier runs left.
  for (char& ch : name)
    if (ch == '/') ch = '_';
  const auto root = std::filesystem::temp_directory_path();
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string entry_name = entry.path().filename().string();
    if (entry_name == name || entry_name.rfind(name + "-", 0) == 0)
      RemoveTree(entry.path().string());
  }
  return (root / name).string();
}

// Small models on the synthetic language (a few ms per step on one CPU core): vocab 24 padded
// to 32, variable sequence lengths so that micro-batches hold different token counts.
inline Config TinyConfig(const std::string& out_dir) {
  Config c;
  for (ModelConfig* m :
       {static_cast<ModelConfig*>(&c.student), static_cast<ModelConfig*>(&c.teacher)}) {
    m->vocab_size = 24;
    m->pad_vocab_to_multiple_of = 32;
    m->context_length = 16;
    m->n_layer = 1;
    m->n_head = 2;
    m->d_model = 32;
  }
  c.teacher.n_layer = 2;
  c.data.batch_size = 8;
  c.data.seq_len = 16;
  c.data.min_seq_len = 4;
  c.data.synthetic.order = 1;
  c.train.mode = Mode::kPretrain;
  c.train.steps = 20;
  c.train.device = "cpu";
  c.train.log_interval = 5;
  c.train.eval_interval = 0;
  c.train.eval_batches = 2;
  c.train.checkpoint_interval = 0;
  c.schedule.warmup_steps = 2;
  c.train.out_dir = out_dir;
  return c;
}

}  // namespace distill::testing

#include "distill/run.h"
#include "distill/trainer.h"

namespace distill::testing {

// Pretrains the teacher architecture of `config` for `steps` steps into `dir` (the pipeline's
// teacher stage); returns `dir` (a run directory usable as teacher.checkpoint).
inline std::string MakeTeacher(const Config& config, const std::string& dir, int64_t steps = 5) {
  Config c = TeacherStageConfig(config);
  c.train.steps = steps;
  c.train.out_dir = dir;
  Trainer(c, RunOptions::Quiet()).TrainUntil(steps);
  return dir;
}

// A tiny distill config whose teacher was pretrained a few steps (in `<out_dir>-teacher`).
inline Config TinyDistillConfig(const std::string& out_dir, int64_t teacher_steps = 5) {
  Config c = TinyConfig(out_dir);
  c.train.mode = Mode::kDistill;
  c.distill.ce_weight = 0.5;
  c.teacher.checkpoint = MakeTeacher(c, out_dir + "-teacher", teacher_steps);
  return c;
}

// Copies of every parameter's gradient (zeros for parameters without one).
inline std::vector<at::Tensor> Grads(CausalLM& model) {
  std::vector<at::Tensor> grads;
  for (const auto& p : model.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  }
  return grads;
}

}  // namespace distill::testing

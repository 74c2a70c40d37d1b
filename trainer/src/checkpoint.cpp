#include "distill/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "distill/file_io.h"

namespace distill {
namespace fs = std::filesystem;

namespace {

at::Generator DefaultGenerator(const at::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

std::vector<fs::path> CheckpointFiles(const std::string& run_dir) {
  std::vector<fs::path> files;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && entry.path().extension() == ".pt") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());  // zero-padded step numbers sort by step
  return files;
}

void CheckArchitecture(torch::serialize::InputArchive& archive, const CausalLM& model,
                       const std::string& path) {
  c10::IValue saved;
  archive.read("architecture", saved);
  const std::string expected = ArchitectureString(model.config());
  if (saved.toStringRef() != expected) {
    throw std::runtime_error(fmt::format("{}: the checkpoint's model ({}) differs from the "
                                         "configured one ({})",
                                         path, saved.toStringRef(), expected));
  }
}

}  // namespace

std::string CheckpointPath(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / fmt::format("step_{:07d}.pt", step)).string();
}

std::optional<std::string> LatestCheckpoint(const std::string& run_dir) {
  auto files = CheckpointFiles(run_dir);
  if (files.empty()) return std::nullopt;
  return files.back().string();
}

void PruneCheckpoints(const std::string& run_dir, int64_t keep) {
  auto files = CheckpointFiles(run_dir);
  for (size_t i = 0; i + keep < files.size(); ++i) fs::remove(files[i]);
}

void SaveCheckpoint(const std::string& path, const CausalLM& model,
                    const torch::optim::Optimizer& optimizer, const TrainingPosition& position,
                    const at::Device& device) {
  // One sync for all parameters; a non-finite checkpoint would poison every resume.
  std::vector<at::Tensor> finite;
  for (const auto& p : model.parameters()) finite.push_back(at::isfinite(p).all());
  if (!finite.empty() && !at::stack(finite).all().item<bool>()) {
    for (const auto& p : model.named_parameters()) {
      if (!at::isfinite(p.value()).all().item<bool>()) {
        throw std::runtime_error(fmt::format(
            "not writing {}: the model's parameter {} holds NaN or inf values", path, p.key()));
      }
    }
  }
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("architecture", c10::IValue(ArchitectureString(model.config())));
  archive.write("step", c10::IValue(position.step));
  archive.write("data_position", c10::IValue(position.data_position));
  archive.write("rng_cpu", DefaultGenerator(at::Device(at::kCPU)).get_state(), /*is_buffer=*/true);
  if (device.is_cuda()) {
    archive.write("rng_cuda", DefaultGenerator(device).get_state(), /*is_buffer=*/true);
  }
  // Serialized in memory, then written by us: torch's file writer aborts the process when a
  // write fails (its destructor throws), ours reports the file and the cause.
  std::string bytes;
  try {
    archive.save_to([&bytes](const void* data, size_t size) -> size_t {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
  } catch (const c10::Error& e) {
    throw FileError(fmt::format("cannot write {}: serializing the checkpoint failed: {}", path,
                                e.what_without_backtrace()));
  }
  std::error_code error;
  fs::create_directories(fs::path(path).parent_path(), error);
  if (error) {
    throw FileError(fmt::format("cannot write {}: cannot create its directory: {}", path,
                                error.message()));
  }
  WriteFileAtomically(path, bytes);
}

TrainingPosition LoadCheckpoint(const std::string& path, CausalLM& model,
                                torch::optim::Optimizer& optimizer, const at::Device& device) {
  torch::serialize::InputArchive archive;
  archive.load_from(path, device);
  CheckArchitecture(archive, model, path);
  torch::serialize::InputArchive model_archive, optimizer_archive;
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  model.load(model_archive);
  optimizer.load(optimizer_archive);
  TrainingPosition position;
  c10::IValue value;
  archive.read("step", value);
  position.step = value.toInt();
  archive.read("data_position", value);
  position.data_position = value.toInt();
  at::Tensor state;
  archive.read("rng_cpu", state, /*is_buffer=*/true);
  DefaultGenerator(at::Device(at::kCPU)).set_state(state.cpu());
  if (device.is_cuda() && archive.try_read("rng_cuda", state, /*is_buffer=*/true)) {
    DefaultGenerator(device).set_state(state.cpu());
  }
  return position;
}

std::string LoadWeights(const std::string& path, CausalLM& model, const at::Device& device) {
  std::string file = path;
  if (fs::is_directory(path)) {
    auto latest = LatestCheckpoint(path);
    if (!latest) {
      throw std::runtime_error(
          fmt::format("teacher.checkpoint: \"{}\" is a directory without checkpoints/step_*.pt",
                      path));
    }
    file = *latest;
  } else if (!fs::exists(path)) {
    throw std::runtime_error(fmt::format("teacher.checkpoint: \"{}\" does not exist", path));
  }
  torch::serialize::InputArchive archive;
  archive.load_from(file, device);
  CheckArchitecture(archive, model, file);
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  model.load(model_archive);
  return file;
}

}  // namespace distill

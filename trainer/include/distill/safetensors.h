// safetensors: a validating, memory-mapped reader (one file or an HF directory of shards), an
// atomic writer, and loading / saving a torch::nn::Module by parameter name (the HF layout).
//
// The format (https://github.com/huggingface/safetensors): u64 little-endian N, N bytes of JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data section; offsets are relative to its start.
// A header is input, and input lies: every size and offset is checked before memory is touched,
// and every error names the file and the tensor.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distill {

// A malformed, missing or mismatching weights file, formatted as
// `<file>: tensor "<name>": expected ..., got ...` or `<file>: header: ...`.
class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One .safetensors file, mapped read-only for the object's lifetime and validated fully by the
// constructor (throws WeightsError). Movable, not copyable.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // Throw WeightsError naming the file and the tensor when it is absent.
  const std::vector<int64_t>& shape(const std::string& name) const;
  const std::string& dtype(const std::string& name) const;     // "F32", "BF16", "I64", ...
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__"

  // An owned, contiguous CPU copy converted to `to`. The source must be F32, F16 or BF16 (other
  // dtypes are parsed but are not weights: WeightsError).
  at::Tensor Tensor(const std::string& name, at::ScalarType to = at::kFloat) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The weights of a Hugging Face model directory: <dir>/model.safetensors, or the shards listed
// in <dir>/model.safetensors.index.json ("weight_map": tensor -> shard file). Every shard must
// exist, hold the tensors the index gives it, and no tensor may be in two shards.
class SafetensorsDir {
 public:
  explicit SafetensorsDir(const std::string& dir);

  // model.safetensors or model.safetensors.index.json: the file to name in messages about the
  // directory as a whole (e.g. a missing tensor).
  const std::string& source() const { return source_; }
  std::vector<std::string> names() const;  // sorted, over all shards
  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  const std::string& file_of(const std::string& name) const;  // the shard holding `name`
  const std::vector<int64_t>& shape(const std::string& name) const;
  const std::string& dtype(const std::string& name) const;
  at::Tensor Tensor(const std::string& name, at::ScalarType to = at::kFloat) const;

 private:
  const SafetensorsFile& FileOf(const std::string& name) const;

  std::string source_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index into files_
};

// Writes `tensors` (any device, any layout; saved contiguous, in their own dtype, in the given
// order) and `metadata` as a safetensors file, atomically: <path>.tmp.<pid> in the same
// directory, fsync, rename over `path`, fsync the directory. On failure the temporary is
// removed and WeightsError names the file and strerror(errno); `path` is never half-written.
void WriteSafetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// How a module's tensors are named in Hugging Face files. `rename`: a module tensor's name ->
// {the files' name, whether they hold its transpose}, or nullopt for a tensor the files do not
// hold (not loaded); unset: the same name, not transposed. `base_prefix` (transformers'
// base_model_prefix, e.g. "transformer"): a name under it that the files lack is looked up
// without it, as transformers loads a bare base model's file into a model with a head.
struct HfNaming {
  std::function<std::optional<std::pair<std::string, bool>>(const std::string&)> rename;
  std::string base_prefix;
  // Tensors a file may hold as copies of a tensor the module ties to another (the tied lm_head):
  // (the copy's name in the files, the module's name of the tensor it must equal). A copy that
  // is there must hold exactly the same values: one that differs is an error (transformers would
  // load the two untied, another model than the module's).
  std::vector<std::pair<std::string, std::string>> tied_copies;
};

// Copies the weights of the HF directory `hf_dir` into `module`: every named parameter and
// buffer (register only persistent buffers) must be there with exactly its shape (under
// `naming`'s name, transposed where it says so); each is converted to the parameter's dtype and
// copied onto its device. A tensor of the files the module lacks is an error unless `ignorable`
// names it, or a suffix of it ("*rotary_emb.inv_freq"), or it is one of `naming`'s tied copies
// (equal to its tensor). All names, shapes, dtypes, values' finiteness and copies are checked
// before the first copy, so a WeightsError leaves the module untouched.
void LoadModuleFromHf(const std::string& hf_dir, torch::nn::Module& module,
                      const std::set<std::string>& ignorable = {}, const HfNaming& naming = {});

// Writes every named parameter and buffer of `module` to `path` (a model.safetensors), floating
// point ones converted to `dtype`, with metadata {"format": "pt"} (what transformers expects).
void SaveModuleAsHf(const std::string& path, const torch::nn::Module& module,
                    at::ScalarType dtype = at::kFloat);

}  // namespace distill

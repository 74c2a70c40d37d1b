// The names of the files an export writes (hf_export.h), without the model headers: run
// directories (run_dir.h) tell theirs from a user's by them.
#pragma once

#include <string>

namespace distill {

// Whether an export writes a file of this name (config.json, model.safetensors, the tokenizer
// files); anything else in an export directory is a user's (a model card).
bool IsExportFileName(const std::string& name);

}  // namespace distill

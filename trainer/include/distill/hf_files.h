// The names of the files an export writes (hf_export.h), without the model headers: run
// directories (run_dir.h) tell theirs from a user's by them.
#pragma once

#include <string>
#include <vector>

namespace distill {

// Whether an export writes a file of this name (config.json, model.safetensors, the tokenizer
// files); anything else in an export directory is a user's (a model card).
bool IsExportFileName(const std::string& name);

// The same, or the temporary of such a file that a killed export left: "<file>.tmp"
// (WriteFileAtomically's) or "<file>.tmp.<pid>" (WriteSafetensors').
bool IsExportFileOrTemporary(const std::string& name);

// Whether `dir` holds a tokenizer an export copies: tokenizer.json, or a SentencePiece
// tokenizer.model alone (older Llama and Mistral repositories), or GPT-2's vocab.json (with
// merges.txt); not generation_config.json alone, which save_pretrained writes beside any model.
bool HasTokenizer(const std::string& dir);

// The tokenizer files in `dir` that are links to nothing (a Hugging Face cache whose blobs were
// deleted), each as "\"<dir>/<name>\" (a link to \"<target>\")": an export cannot copy them, so
// the trainer refuses them at start-up where the run exports, and an export says it left them out.
std::vector<std::string> DanglingTokenizerFiles(const std::string& dir);

// Whether `name` is "<target><kind><digits>" (kind ".tmp-" or ".old-"): an export's temporary or
// its previous copy moved aside, named after the exporting process's id.
bool IsExportSibling(const std::string& name, const std::string& target, const std::string& kind);

}  // namespace distill

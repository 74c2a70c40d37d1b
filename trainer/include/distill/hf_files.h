// The names of the files an export writes (hf_export.h), without the model headers: run
// directories (run_dir.h) tell theirs from a user's by them.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace distill {

// Whether an export writes a file of this name (config.json, model.safetensors, the tokenizer
// files); anything else in an export directory is a user's (a model card).
bool IsExportFileName(const std::string& name);

// The same, or the temporary of such a file that a killed export left: "<file>.tmp"
// (WriteFileAtomically's) or "<file>.tmp.<pid>" (WriteSafetensors').
bool IsExportFileOrTemporary(const std::string& name);

// A tokenizer file an export cannot copy: a link to nothing (a Hugging Face cache whose blobs
// were deleted), or a JSON file that does not parse.
struct UncopyableTokenizerFile {
  size_t dir;        // the index of its directory in the list given
  std::string file;  // its path, quoted, and why: "\"<dir>/<name>\" (a link to \"<target>\")"
};

// Those in the directories an export takes tokenizer files from: `dirs` in the export's order
// (the student's hf_dir, the teacher's, train.export_from; "" and directories without config.json
// passed over, as the export passes them), up to the first with a tokenizer (tokenizer.json, a
// SentencePiece tokenizer.model or GPT-2's vocab.json), whose files it copies; a dangling
// tokenizer.json passes its directory over. The trainer refuses them at start-up where the run
// exports; ExportSources' note names them.
std::vector<UncopyableTokenizerFile> DanglingExportTokenizerFiles(
    const std::vector<std::string>& dirs);

// The JSON tokenizer files (tokenizer_config.json, generation_config.json, ...) in the same
// directories, in the same order, that do not parse: copied as they are, they would make the
// export unloadable (transformers' from_pretrained fails on them). `file` is "\"<path>\" (<the
// parser's message>)". The trainer refuses them at start-up where the run exports, and the
// export refuses to copy one.
std::vector<UncopyableTokenizerFile> InvalidJsonExportTokenizerFiles(
    const std::vector<std::string>& dirs);

// The index in `dirs` (the order and rules above) of the directory whose tokenizer files the
// export copies, or nothing where none has a tokenizer. The trainer refuses at start-up a
// tokenizer there with more ids than the student has embedding rows.
std::optional<size_t> ExportTokenizerDir(const std::vector<std::string>& dirs);

// Whether `name` is "<target><kind><digits>" (kind ".tmp-" or ".old-"): an export's temporary or
// its previous copy moved aside, named after the exporting process's id.
bool IsExportSibling(const std::string& name, const std::string& target, const std::string& kind);

}  // namespace distill

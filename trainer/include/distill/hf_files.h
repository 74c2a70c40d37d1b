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

// The empty file an export puts in the directories it creates or moves aside (its temporary,
// the previous export): a later export deletes what a stopped one left only where it finds it.
// Removed once the export is in place.
inline constexpr char kExportMarker[] = ".distill_trainer_export";

// The same, the marker, or the temporary of such a file that a killed export left:
// "<file>.tmp" (WriteFileAtomically's) or "<file>.tmp.<pid>" (WriteSafetensors').
bool IsExportFileOrTemporary(const std::string& name);

// A tokenizer file an export cannot copy: a link to nothing (a Hugging Face cache whose blobs
// were deleted), a link that loops, a directory or a pipe where a file belongs, or a JSON file
// that does not parse.
struct UncopyableTokenizerFile {
  size_t dir;           // the index of its directory in the list given
  std::string file;     // its path, quoted, and more where there is: "\"<dir>/<name>\" (a link to
                        // \"<target>\")", "\"<dir>/<name>\" (<the JSON parser's message>)"
  std::string problem;  // UncopyableExportTokenizerFiles': "not valid JSON", "a directory, not a
                        // file", ...
};

// The links to nothing (or that loop) among the tokenizer files of the directories an export
// takes them from: `dirs` in the export's order (the student's hf_dir, the teacher's,
// train.export_from; "" and directories without config.json passed over, as the export passes
// them), up to the first with a tokenizer (tokenizer.json, a SentencePiece tokenizer.model or
// GPT-2's vocab.json), whose files it copies; a dangling tokenizer.json passes its directory
// over. The trainer refuses them at start-up where the run exports; ExportSources' note names
// them.
std::vector<UncopyableTokenizerFile> DanglingExportTokenizerFiles(
    const std::vector<std::string>& dirs);

// The other tokenizer files in the directory the export copies from (ExportTokenizerDir's) that
// it cannot copy: a link that loops or cannot be reached, a directory, pipe or device (the copy
// refuses them), one that cannot be read, and a JSON file (tokenizer_config.json,
// generation_config.json, ...) that does not parse: copied as it is, it would make the export
// unloadable (transformers' from_pretrained fails on it). The trainer refuses them at start-up
// where the run exports, and the export refuses to copy one.
std::vector<UncopyableTokenizerFile> UncopyableExportTokenizerFiles(
    const std::vector<std::string>& dirs);

// The index in `dirs` (the order and rules above) of the directory whose tokenizer files the
// export copies, or nothing where none has a tokenizer. The trainer refuses at start-up a
// tokenizer there with more ids than the student has embedding rows.
std::optional<size_t> ExportTokenizerDir(const std::vector<std::string>& dirs);

// Whether `name` is "<target><kind><digits>" (kind ".tmp-" or ".old-"): an export's temporary or
// its previous copy moved aside, named after the exporting process's id.
bool IsExportSibling(const std::string& name, const std::string& target, const std::string& kind);

}  // namespace distill

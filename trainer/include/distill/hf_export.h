// Export to the ecosystem's format: a model written as a Hugging Face directory (config.json +
// model.safetensors + the tokenizer files), which transformers.AutoModelForCausalLM.from_pretrained
// loads with the trainer's own logits: the llama family as its hf_model_type's class, the gpt
// family as GPT2LMHeadModel.
#pragma once

#include <string>

#include "distill/config.h"
#include "distill/hf_files.h"  // IsExportFileName
#include "distill/model.h"

namespace distill {

// Where an export of `config`'s student takes its config.json template (bos/eos ids and other
// non-architecture keys) and its tokenizer files: the student's hf_dir, else the teacher's.
// With `run_dir` (exporting a finished run): where an hf_dir's config.json is gone (moved or
// deleted since the run), the run's own export <run_dir>/hf, made from those directories at the
// end of the run, stands in for both; `note` then says so (and what is missing when the run has
// no export of its own).
struct HfExportSources {
  std::string config_template;  // a config.json path, or "" (written from scratch)
  std::string tokenizer_dir;    // a directory with tokenizer files, or "" (none copied)
  std::string note;             // a warning about the sources, or ""
};
HfExportSources ExportSources(const Config& config, const std::string& run_dir = "");

// Writes `model` to `out_dir`: config.json (llama: the template's keys, every architecture key
// set from model.config(); gpt: GPT-2's keys, only the template's token ids), model.safetensors
// (float32) and the tokenizer files of sources.tokenizer_dir. Atomic: built in
// "<out_dir>.tmp-<pid>", then renamed into place. An existing out_dir is replaced only when
// `replace` (the run's own <out_dir>/hf); otherwise it is an error that names it. A replaced
// directory that holds files the export does not write (a user's model card) is not deleted but
// kept as "<out_dir>.previous" (or ".previous-N"): the returned warning says so (else ""). What a
// stopped export left beside out_dir ("<out_dir>.tmp-<pid>" of a process gone; with `replace`
// also "<out_dir>.old-<pid>") is tidied first. Throws std::runtime_error naming the file on any
// failure, leaving no temporary behind.
std::string ExportHf(const CausalLM& model, const std::string& out_dir,
                     const HfExportSources& sources, bool replace);

}  // namespace distill

// The nesting bound for JSON the trainer reads from others (config.json, tokenizer.json, the
// safetensors header and index): nlohmann's parser is iterative, but dump() -- the export's
// config.json, the error messages that quote a value -- recurses once per level, so a key holding
// a 10^5-deep [[[...]]] crashed the process (a stack overflow). Real files nest 2-6 deep.
#pragma once

#include <exception>
#include <string>

namespace distill {

constexpr int kMaxJsonDepth = 64;

// The words of every reader's error past it (after "<file>: ").
inline std::string JsonTooDeep() {
  return "expected JSON nested at most " + std::to_string(kMaxJsonDepth) +
         " levels deep, got deeper";
}

// nlohmann's exception text without its "[json.exception.parse_error.101] " tag, which tells a
// user nothing; with `drop_position`, also without a parse error's "parse error at line L,
// column C: " (for a reader that names the byte itself: a safetensors header is one line).
inline std::string JsonReason(const std::exception& e, bool drop_position = false) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  if (drop_position && text.rfind("parse error", 0) == 0) {
    const size_t colon = text.find(": ");
    if (colon != std::string::npos) text.erase(0, colon + 2);
  }
  return text;
}

}  // namespace distill

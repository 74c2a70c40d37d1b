// The nesting bound for JSON the trainer reads from others (config.json, tokenizer.json, the
// safetensors header and index): nlohmann's parser is iterative, but dump() -- the export's
// config.json, the error messages that quote a value -- recurses once per level, so a key holding
// a 10^5-deep [[[...]]] crashed the process (a stack overflow). Real files nest 2-6 deep.
#pragma once

#include <string>

namespace distill {

constexpr int kMaxJsonDepth = 64;

// The words of every reader's error past it (after "<file>: ").
inline std::string JsonTooDeep() {
  return "expected JSON nested at most " + std::to_string(kMaxJsonDepth) +
         " levels deep, got deeper";
}

}  // namespace distill

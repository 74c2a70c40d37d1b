// The nesting bound for JSON the trainer reads from others (config.json, tokenizer.json, the
// safetensors header and index): nlohmann's parser is iterative, but dump() -- the export's
// config.json, the error messages that quote a value -- recurses once per level, so a key holding
// a 10^5-deep [[[...]]] crashed the process (a stack overflow). Real files nest 2-6 deep.
#pragma once

namespace distill {

constexpr int kMaxJsonDepth = 64;

}  // namespace distill

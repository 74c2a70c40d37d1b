// The key table behind config.h: one declaration per key (path, accepted values, meaning, how
// to read and write it). Parsing, validation, --help and --print-config all walk this table.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "distill/config.h"

namespace distill::internal {

struct KeyDecl {
  std::string path;      // "distill.temperature"
  std::string expected;  // "a number > 0": the "expected" part of an error message
  std::string help;      // one sentence, for --help and docs/config.md
  // Stores `node` into `config` when acceptable; returns false (config untouched) otherwise.
  std::function<bool(const YAML::Node& node, Config& config)> set;
  // The value as YAML flow text ("0.9", "[0.9, 0.95]", "synthetic").
  std::function<std::string(const Config& config)> get;
  // Set for a key that holds a path or a glob (the rule PathOrGlob): its value, for the checks
  // every path gets (a leading '~' in a requested config: CheckCrossKey).
  std::function<const std::string&(const Config& config)> path_value;
};

// All keys, in declaration (and --print-config) order. Built once.
const std::vector<KeyDecl>& Keys();

// An integer written with a leading zero ("0100", "-007"): YAML 1.1 (and yaml-cpp) reads it as
// octal, YAML 1.2 as decimal, so no number key accepts it (a float "010" would be 10 here, 8 in
// YAML 1.1).
bool HasLeadingZero(const std::string& scalar);

// The dropout of each model a run of `c` trains, by section: the student, and a teacher that the
// pipeline pretrains first. train.activation_checkpointing needs every one 0 (the recomputed
// forward would draw other dropout masks): the config's check and the out-of-memory advice.
std::vector<std::pair<std::string, double>> TrainedModelDropouts(const Config& c);

}  // namespace distill::internal

// Metrics as JSON Lines (<run>/metrics.jsonl, one flat object per line) and console progress:
// a redrawn status line on a terminal, plain log lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "distill/file_io.h"

namespace distill {

// One flat JSON object, built field by field. Non-finite numbers are written as null.
class JsonRecord {
 public:
  JsonRecord& Add(const std::string& key, double value);
  JsonRecord& Add(const std::string& key, int64_t value);
  JsonRecord& Add(const std::string& key, const std::string& value);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(const std::string& key);
  std::string body_;
};

// `text` as a JSON string literal: quotes, backslashes and control bytes (DEL too) escaped, other
// bytes (UTF-8) as they are. Also a YAML double-quoted scalar that reads back as `text` (the
// config dump's quoted strings).
std::string JsonQuote(const std::string& text);

using RecordKeys = std::set<std::pair<std::string, int64_t>>;  // (type, step) of records

// What a metrics file keeps when a run resumes at step `keep_up_to_step`: its complete lines
// (a partial last line -- no '\n', a write cut short -- is dropped) that are records with
// "step" <= keep_up_to_step or no records of the trainer's (no "step": kept as they are), in
// order. Adds the records' (type, step) to `kept`.
std::string KeptMetrics(const std::string& content, int64_t keep_up_to_step, RecordKeys* kept);

class MetricsLog {
 public:
  // Opens `path` for appending, first dropping records with "step" > keep_up_to_step (written
  // after the checkpoint a run resumes from; they are recomputed identically) and a partial
  // last line; a whole line without "step" is not the trainer's and is kept. The kept records are
  // rewritten atomically (file_io.h): a kill at any moment leaves either the old file or the new
  // one, never an empty or truncated one.
  MetricsLog(const std::string& path, int64_t keep_up_to_step);
  ~MetricsLog();
  void Write(const JsonRecord& record);  // one whole line, one write(); throws FileError
  // Whether a kept record has "type":"<type>" and this step (e.g. the final evaluation of a
  // finished run that is opened again).
  bool Has(const std::string& type, int64_t step) const;

 private:
  std::unique_ptr<LineAppender> out_;
  RecordKeys kept_;
};

class Progress {
 public:
  // A status line on a TTY stderr, else log lines. quiet (--quiet, tests): only warnings;
  // silent (a rank other than 0): nothing.
  Progress(int64_t total_steps, int64_t first_step, bool quiet, bool silent = false);
  // After each step: redraws the status line on a TTY.
  void Update(int64_t step, double loss, double tokens_per_second);
  // A log line (printed above the status line on a TTY), unless quiet.
  void Log(const std::string& line);
  // A warning: printed like a log line, also when quiet (not when silent).
  void Warn(const std::string& line);
  void Finish();
  // "ETA 1:05" for the remaining steps at the rate measured in this process.
  std::string Eta(int64_t step) const;

 private:
  int64_t total_, first_;
  void Print(const std::string& line);
  bool quiet_, silent_, tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace distill

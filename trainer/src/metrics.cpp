#include "distill/metrics.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace distill {

std::string JsonQuote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {  // DEL: config dump (YAML)
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void JsonRecord::Key(const std::string& key) {
  if (!body_.empty()) body_ += ",";
  body_ += JsonQuote(key) + ":";
}
JsonRecord& JsonRecord::Add(const std::string& key, double value) {
  Key(key);
  body_ += std::isfinite(value) ? fmt::format("{}", value) : "null";
  return *this;
}
JsonRecord& JsonRecord::Add(const std::string& key, int64_t value) {
  Key(key);
  body_ += std::to_string(value);
  return *this;
}
JsonRecord& JsonRecord::Add(const std::string& key, const std::string& value) {
  Key(key);
  body_ += JsonQuote(value);
  return *this;
}

namespace {

// The type and step of a record the trainer wrote ({"type":"train","step":12,...: JsonRecord
// puts them first, in that order); nullopt for any other line (a note someone added, even one
// with a "step": of its own).
std::optional<std::pair<std::string, int64_t>> TrainerRecord(const std::string& line) {
  const std::string head = "{\"type\":\"";
  if (line.rfind(head, 0) != 0 || line.back() != '}') return std::nullopt;
  const size_t type_end = line.find('"', head.size());
  if (type_end == std::string::npos) return std::nullopt;
  const std::string type = line.substr(head.size(), type_end - head.size());
  const std::string step_key = "\",\"step\":";
  if (type.empty() || line.compare(type_end, step_key.size(), step_key) != 0) return std::nullopt;
  const size_t digits = type_end + step_key.size();
  size_t end = digits;
  while (end < line.size() && std::isdigit(static_cast<unsigned char>(line[end]))) ++end;
  if (end == digits || (line[end] != ',' && line[end] != '}')) return std::nullopt;
  return std::make_pair(type, std::atoll(line.c_str() + digits));
}

}  // namespace

std::string KeptMetrics(const std::string& content, int64_t keep_up_to_step, RecordKeys* kept) {
  std::string out;
  for (size_t begin = 0; begin < content.size();) {
    const size_t end = content.find('\n', begin);
    if (end == std::string::npos) break;  // a partial last line: never completed, dropped
    const std::string line = content.substr(begin, end - begin);
    begin = end + 1;
    const auto record = TrainerRecord(line);
    if (!record) {  // not a record of ours (a note someone added): kept
      out += line + '\n';
      continue;
    }
    if (record->second > keep_up_to_step) continue;
    kept->emplace(record->first, record->second);
    out += line + '\n';
  }
  return out;
}

MetricsLog::MetricsLog(const std::string& path, int64_t keep_up_to_step) {
  if (std::filesystem::exists(path)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FileError(fmt::format("cannot read {}", path));
    std::stringstream content;
    content << in.rdbuf();
    const std::string kept = KeptMetrics(content.str(), keep_up_to_step, &kept_);
    if (kept != content.str()) WriteFileAtomically(path, kept);
  }
  out_ = std::make_unique<LineAppender>(path);
}

MetricsLog::~MetricsLog() = default;

bool MetricsLog::Has(const std::string& type, int64_t step) const {
  return kept_.count({type, step}) > 0;
}

void MetricsLog::Write(const JsonRecord& record) { out_->Append(record.str()); }

Progress::Progress(int64_t total_steps, int64_t first_step, bool quiet, bool silent)
    : total_(total_steps),
      first_(first_step),
      quiet_(quiet || silent),
      silent_(silent),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

std::string Progress::Eta(int64_t step) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (step <= first_) return "ETA --:--";
  const auto left = static_cast<int64_t>(elapsed / (step - first_) * (total_ - step));
  return fmt::format("ETA {}:{:02d}", left / 60, left % 60);
}

void Progress::Update(int64_t step, double loss, double tokens_per_second) {
  if (quiet_ || !tty_) return;
  const int width = 24;
  const int filled = static_cast<int>(width * step / std::max<int64_t>(total_, 1));
  std::fprintf(stderr, "\r\033[K[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  %s",
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
               static_cast<long long>(step), static_cast<long long>(total_), loss,
               tokens_per_second, Eta(step).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::Log(const std::string& line) {
  if (!quiet_) Print(line);
}

void Progress::Warn(const std::string& line) {
  if (!silent_) Print(line);
}

void Progress::Print(const std::string& line) {
  if (tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  drawn_ = false;
}

void Progress::Finish() {
  if (!quiet_ && tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace distill

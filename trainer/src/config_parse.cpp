// Parsing and validation of the config: YAML file, then command-line overrides, then the
// constraints between keys. Every error names where (file:line or the override), the key path,
// what was expected and what was found.
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config_schema.h"
#include "distill/config.h"
#include "distill/file_io.h"
#include "distill/hf_config.h"
#include "distill/hf_files.h"  // DanglingExportTokenizerFiles, UncopyableExportTokenizerFiles
#include "distill/run_dir.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using internal::HasLeadingZero;
using internal::KeyDecl;
using internal::Keys;

// Where each key got its value ("configs/x.yaml:12", "override \"a.b=1\""); absent: default.
using Locations = std::map<std::string, std::string>;

const KeyDecl* FindKey(const std::string& path) {
  for (const auto& k : Keys()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

bool IsSection(const std::string& path) {
  for (const auto& k : Keys()) {
    if (k.path.size() > path.size() && k.path.compare(0, path.size(), path) == 0 &&
        k.path[path.size()] == '.') {
      return true;
    }
  }
  return false;
}

// A scalar as an error message shows it: quoted, control characters as escapes (a NUL or a
// newline would cut the message short).
std::string Shown(const std::string& scalar) {
  std::string shown;
  for (const char ch : scalar) {
    const auto byte = static_cast<unsigned char>(ch);
    shown += byte < 0x20 || byte == 0x7f ? fmt::format("\\x{:02x}", byte) : std::string(1, ch);
  }
  return fmt::format("\"{}\"", shown);
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return Shown(node.Scalar());
    case YAML::NodeType::Sequence: {
      // A short list of scalars shown whole (which item is wrong, or how many there are).
      bool scalars = node.size() <= 8;
      for (size_t i = 0; scalars && i < node.size(); ++i) scalars = node[i].IsScalar();
      if (!scalars || node.size() == 0) return "a list";
      std::vector<std::string> items;
      for (size_t i = 0; i < node.size(); ++i) items.push_back(Shown(node[i].Scalar()));
      return fmt::format("a list of {}: [{}]", node.size(), fmt::join(items, ", "));
    }
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A model key spelled as Hugging Face's config.json spells it (a YAML written from one): its key
// here.
std::string HfAlias(const std::string& path) {
  static const std::map<std::string, std::string> kHfNames = {
      {"hidden_size", "d_model"},
      {"n_embd", "d_model"},
      {"num_hidden_layers", "n_layer"},
      {"num_attention_heads", "n_head"},
      {"num_key_value_heads", "n_kv_head"},
      {"max_position_embeddings", "context_length"},
      {"n_positions", "context_length"},
      {"n_inner", "intermediate_size"},
      {"rms_norm_eps", "norm_eps"},
      {"tie_word_embeddings", "tie_embeddings"},
      {"attention_dropout", "dropout"},
      {"attn_pdrop", "dropout"},
      {"activation_function", "activation"},
      {"model_type", "family"}};
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return "";
  const std::string section = path.substr(0, dot);
  if (section != "student" && section != "teacher") return "";
  auto it = kHfNames.find(path.substr(dot + 1));
  return it == kHfNames.end() ? "" : section + "." + it->second;
}

// ": did you mean "x"?" for the closest key or section, or "" when nothing is close.
std::string Suggestion(const std::string& path) {
  if (const std::string alias = HfAlias(path); !alias.empty()) {
    return fmt::format(
        "; did you mean \"{}\" (Hugging Face's {})? Or set {}.hf_dir to the "
        "model's directory: its config.json is read as it is",
        alias, path.substr(path.find('.') + 1), path.substr(0, path.find('.')));
  }
  // A key of another section with the same name ("train.lr", top-level "steps"): the section is
  // what is wrong, not a typo. Where several sections have it (n_layer: student and teacher),
  // each is named, unless one section is a typo away from the one typed ("techer.hf_dir").
  const size_t last_dot = path.rfind('.');
  const std::string name = path.substr(last_dot == std::string::npos ? 0 : last_dot + 1);
  const std::string section = last_dot == std::string::npos ? "" : path.substr(0, last_dot);
  std::vector<std::pair<size_t, std::string>> same_name;  // (distance of the sections, path)
  for (const auto& k : Keys()) {
    if (k.path != path && k.path.size() > name.size() &&
        k.path.compare(k.path.size() - name.size() - 1, std::string::npos, "." + name) == 0) {
      same_name.emplace_back(
          EditDistance(section, k.path.substr(0, k.path.size() - name.size() - 1)), k.path);
    }
  }
  std::stable_sort(same_name.begin(), same_name.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  if (same_name.size() > 1 && same_name[0].first <= 2 && same_name[1].first > same_name[0].first) {
    same_name.resize(1);
  }
  if (!same_name.empty() && same_name.size() <= 3) {
    std::vector<std::string> quoted;
    for (const auto& candidate : same_name) quoted.push_back("\"" + candidate.second + "\"");
    return fmt::format("; did you mean {}?", fmt::join(quoted, " or "));
  }
  std::string best;
  size_t best_distance = 4;  // more than 3 edits away is not a typo
  auto consider = [&](const std::string& candidate) {
    // Not a section that the path is inside of ("train" for "train.lr": it exists already).
    if (path.rfind(candidate + ".", 0) == 0) return;
    size_t d = EditDistance(path, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  };
  for (const auto& k : Keys()) {
    consider(k.path);
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1)) {
      consider(k.path.substr(0, dot));
    }
  }
  return best.empty() ? "" : fmt::format("; did you mean \"{}\"?", best);
}

[[noreturn]] void Fail(const std::string& where, const std::string& path, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}: {}", where, path, what));
}

// Whether `value` is a null written out (`~`, `null`, `Null`, `NULL`, a `!!null` tag) in
// `text`, the YAML it was read from, rather than left empty (`key:`, which is the empty string
// for a text key). yaml-cpp marks a node at its first property (`&anchor`, `!tag`) if it has any,
// and counts from after a UTF-8 byte-order mark. (A UTF-16 or UTF-32 file, whose marks count
// characters, is not checked.)
bool ExplicitNull(const YAML::Node& value, const std::string& text) {
  if (value.Tag() == "tag:yaml.org,2002:null") return true;  // "!!null ~" was read as "~"
  if (!value.IsNull() || value.Mark().pos < 0) return false;
  if (text.find('\0') != std::string::npos) return false;  // UTF-16 or UTF-32
  const bool bom = text.rfind("\xEF\xBB\xBF", 0) == 0;
  size_t pos = static_cast<size_t>(value.Mark().pos) + (bom ? 3 : 0);
  // The properties before the value: each a word, then spaces.
  while (pos < text.size() && (text[pos] == '&' || text[pos] == '!')) {
    pos = text.find_first_of(" \t\r\n", pos);
    if (pos == std::string::npos) return false;
    pos = text.find_first_not_of(" \t", pos);
    if (pos == std::string::npos) return false;
  }
  if (pos >= text.size()) return false;
  if (text[pos] == '~') return true;
  for (const char* word : {"null", "Null", "NULL"}) {
    if (text.compare(pos, 4, word) == 0) return true;
  }
  return false;
}

// `explicit_null`: the value is a null written out (ExplicitNull), refused: YAML's "no value" is
// not a text key's empty string (`hf_dir: ~` read as "" trained a model with random weights).
void SetKey(const KeyDecl& key, const YAML::Node& value, const std::string& where, Config& config,
            Locations& locations, bool explicit_null = false) {
  if (explicit_null) {
    Fail(where, key.path,
         fmt::format(
             "expected {}, got null (YAML's no-value, written ~ or null){}", key.expected,
             key.path_value ? "; for no path leave the value empty (\"key:\") or write \"\"" : ""));
  }
  // A local tag ("!name"): a value that starts with '!' is a YAML tag, not text, and the text
  // after it is dropped ("hf_dir: !mydir" read as "", a model with random weights).
  const std::string& tag = value.Tag();
  if (tag.size() > 1 && tag[0] == '!' && tag[1] != '!') {
    Fail(where, key.path,
         fmt::format("expected {}, got the YAML tag \"{}\" (a value that starts with '!' is a "
                     "tag, not text); quote the value",
                     key.expected, tag));
  }
  // A standard tag other than the core schema's ("!!binary aGVsbG8=" was read as its text).
  const std::string standard = "tag:yaml.org,2002:";
  if (tag.rfind(standard, 0) == 0) {
    const std::string name = tag.substr(standard.size());
    if (name != "str" && name != "int" && name != "float" && name != "bool" && name != "null" &&
        name != "seq" && name != "map") {
      Fail(where, key.path,
           fmt::format("expected {}, got the YAML tag \"!!{}\", which this config does not read "
                       "(only the core schema's: !!str, !!int, !!float, !!bool, !!null, !!seq, "
                       "!!map); remove it",
                       key.expected, name));
    }
  }
  if (!key.set(value, config)) {
    const bool octal =
        (key.expected.rfind("an integer", 0) == 0 || key.expected.rfind("a number", 0) == 0) &&
        value.IsScalar() && HasLeadingZero(value.Scalar());
    Fail(where, key.path,
         fmt::format("expected {}, got {}{}", key.expected, Describe(value),
                     octal ? " (a leading zero: YAML 1.1 reads it as octal, YAML 1.2 as "
                             "decimal; write the number without it)"
                           : ""));
  }
  locations[key.path] = where;
}

// Walks a mapping node whose keys live under `prefix` ("" for the document root).
void ApplyMap(const YAML::Node& map, const std::string& prefix, const std::string& source,
              const std::string& text, Config& config, Locations& locations) {
  for (const auto& item : map) {
    const std::string where_key = fmt::format("{}:{}", source, item.first.Mark().line + 1);
    // A null value's mark points past it (at the next token): report the key's line instead.
    const std::string where_value = item.second.IsNull()
                                        ? where_key
                                        : fmt::format("{}:{}", source, item.second.Mark().line + 1);
    if (!item.first.IsScalar()) {
      Fail(where_key, prefix.empty() ? "<root>" : prefix, "expected key names, got a complex key");
    }
    const std::string name = item.first.Scalar();
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (locations.count(path) && locations[path].rfind(source + ":", 0) == 0) {
      Fail(where_key, path, fmt::format("duplicate key (first set at {})", locations[path]));
    }
    if (const KeyDecl* key = FindKey(path)) {
      SetKey(*key, item.second, where_value, config, locations, ExplicitNull(item.second, text));
    } else if (IsSection(path)) {
      if (!item.second.IsMap() && !item.second.IsNull()) {
        Fail(where_value, path,
             fmt::format("expected a mapping (the {} section), got {}", path,
                         Describe(item.second)));
      }
      locations[path] = where_key;
      if (item.second.IsMap()) ApplyMap(item.second, path, source, text, config, locations);
    } else if (name == "<<") {  // yaml-cpp has no merge keys: "<<" is a key like any other
      Fail(where_key, path,
           "a YAML merge key (<<), which the config reader does not support; write the keys out");
    } else {
      Fail(where_key, path, "unknown key" + Suggestion(path));
    }
  }
}

// Where a YAML comment starts in `value` (a '#' at its start, after a space or tab, or right
// after a closing quote or a flow collection's closing bracket, outside quotes), or npos. A quote
// opens a quoted scalar only where one starts: at the value's first character or after its tags
// and anchors ("!!str 'a #b'"), or in a flow collection ("[...]", "{...}") after '[', '{', ','
// or ':' and spaces; elsewhere it is plain text (the apostrophe of "it's").
size_t CommentStart(const std::string& value) {
  const size_t first = value.find_first_not_of(" \t");
  if (first == std::string::npos) return std::string::npos;
  const bool flow = value[first] == '[' || value[first] == '{';
  char quote = 0, last = 0;  // last: the previous character that is not a space or tab
  bool closed = false;       // the previous character closed a quoted scalar or a collection
  bool properties = true;    // the words before this one are all tags or anchors ("!!str", "&a")
  for (size_t i = first; i < value.size(); ++i) {
    const char c = value[i];
    if (quote == '"') {
      if (c == '\\') {
        ++i;  // an escape: the next character is its
      } else if (c == '"') {
        quote = 0;
        closed = true;
        last = c;
      }
      continue;
    }
    if (quote == '\'') {
      if (c == '\'' && i + 1 < value.size() && value[i + 1] == '\'') {
        ++i;  // '' is a quote inside single quotes
      } else if (c == '\'') {
        quote = 0;
        closed = true;
        last = c;
      }
      continue;
    }
    const bool word_start = i == first || value[i - 1] == ' ' || value[i - 1] == '\t';
    if (c == '#' && (word_start || closed)) return i;
    closed = false;
    if (c == ' ' || c == '\t') continue;
    if ((c == '"' || c == '\'') && ((word_start && properties) ||
                                    (flow && last != 0 && std::strchr("[{,:", last) != nullptr))) {
      quote = c;
    }
    if (word_start) properties = properties && (c == '!' || c == '&');
    if (flow && (c == ']' || c == '}')) closed = true;
    last = c;
  }
  return std::string::npos;
}

// How to keep a value that YAML reads as syntax ('*' an alias, '&' an anchor, '!' a tag, '['
// or '{' a collection) as text.
constexpr const char* kQuoteHint =
    "; to keep the value as text, quote it in YAML (in a shell: key='\"...\"')";

void ApplyOverride(const std::string& text, Config& config, Locations& locations) {
  const std::string where = fmt::format("override \"{}\"", text);
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    // A config file given without --config reads as an override.
    std::error_code ec;
    const bool file = eq == std::string::npos && std::filesystem::is_regular_file(text, ec);
    throw ConfigError(
        fmt::format("{}: expected key.path=value{}", where,
                    file ? fmt::format(" (a config file is given with --config {})", text) : ""));
  }
  const std::string path = text.substr(0, eq);
  const KeyDecl* key = FindKey(path);
  if (key == nullptr) {
    if (IsSection(path)) Fail(where, path, "is a section; set one of its keys (see --help)");
    Fail(where, path, "unknown key" + Suggestion(path));
  }
  // A comment in a command-line value is a mistake, not a note: "out_dir=runs/x #2" would
  // silently be runs/x, maybe another run, resumed.
  const std::string raw = text.substr(eq + 1);
  if (const size_t hash = CommentStart(raw); hash != std::string::npos) {
    Fail(where, path,
         fmt::format("expected {}, got a YAML comment at \"{}\" (a '#' after a space starts one, "
                     "and what follows it would be dropped); quote the whole value in YAML to "
                     "keep the '#' (in a shell: {}='\"...\"'), or leave the comment out",
                     key->expected, raw.substr(hash), path));
  }
  // A document that starts with ',' (a flow indicator, invalid there) sends yaml-cpp 0.7 into an
  // endless allocation (std::bad_alloc after all the memory): refused before it parses.
  if (const size_t start = raw.find_first_not_of(" \t");
      start != std::string::npos && raw[start] == ',') {
    Fail(where, path,
         fmt::format("expected {}, got invalid YAML (a value cannot start with ',', a flow "
                     "indicator; quote the value to keep it)",
                     key->expected));
  }
  // Text keys (paths and globs) get the hint to quote a value that YAML reads as syntax.
  const char* hint = key->path_value ? kQuoteHint : "";
  YAML::Node value;
  try {
    // One document, as for the file: YAML::Load would keep the first of "2\n---\n3".
    const std::vector<YAML::Node> documents = YAML::LoadAll(text.substr(eq + 1));
    if (documents.size() > 1) {
      Fail(where, path,
           fmt::format("expected {}, got more than one YAML document (a \"---\" line, or text "
                       "after a closing ']' or '}}'){}",
                       key->expected, hint));
    }
    if (!documents.empty()) value = documents[0];
  } catch (const YAML::Exception& e) {
    Fail(where, path,
         fmt::format("expected {}, got invalid YAML ({}){}", key->expected, e.msg, hint));
  }
  // An anchor ("&x") or a tag ("!x") with nothing after it: YAML syntax, not the text. (With
  // text after it, an anchor or a tag is the value's property, as YAML reads it: "&x runs/a" is
  // "runs/a", "!!str 1" the text "1".)
  if (const size_t start = raw.find_first_not_of(" \t");
      start != std::string::npos && (raw[start] == '&' || raw[start] == '!') &&
      (value.IsNull() || (value.IsScalar() && value.Scalar().empty()))) {
    Fail(where, path,
         fmt::format("expected {}, got an empty value: YAML reads a leading '{}' as {}{}",
                     key->expected, raw[start], raw[start] == '&' ? "an anchor" : "a tag", hint));
  }
  SetKey(*key, value, where, config, locations, ExplicitNull(value, raw));
}

std::string Where(const Locations& locations, const std::string& path) {
  auto it = locations.find(path);
  return it == locations.end() ? "(default)" : it->second;
}

// Whether paths reach into a directory (train.out_dir, absolute and resolved): --fresh deletes
// it, so a path may neither name a place inside it (its parent directories resolved), nor lead
// into it through links, nor pass through a link that lies inside it. Each path's directories
// are resolved once (memoised: a glob's matches share a few).
class InsideCheck {
 public:
  explicit InsideCheck(fs::path dir) : dir_(std::move(dir)) {}

  // Whether `path` reaches into the directory: nullopt if not, else what to say after it in an
  // error ("" where its name lies inside; else where it leads, or the link it passes through).
  std::optional<std::string> Reach(const std::string& path) {
    if (path.size() > 4096) return std::nullopt;  // longer than PATH_MAX: no file has it
    std::error_code ec;
    fs::path absolute = fs::absolute(path.empty() ? "." : path, ec);
    if (ec) return std::nullopt;
    if (!absolute.has_filename()) absolute = absolute.parent_path();  // "runs/x/" is runs/x
    Walk walk = Directory(absolute.parent_path());
    const fs::path name = absolute.filename();
    const fs::path named = name == "."    ? walk.resolved
                           : name == ".." ? walk.resolved.parent_path()
                                          : walk.resolved / name;
    Step(walk, name);
    if (Inside(named)) return std::string();
    if (Inside(walk.resolved))
      return fmt::format(", which leads to \"{}\"", walk.resolved.string());
    if (walk.link) return fmt::format(", through the link \"{}\" inside it", walk.link->string());
    return std::nullopt;
  }

 private:
  struct Walk {
    fs::path resolved;             // the path so far, its links followed
    std::optional<fs::path> link;  // the first link met that lies inside the directory
  };

  // Component by component: "runs/x2" is not inside "runs/x".
  bool Inside(const fs::path& p) const {
    auto pi = p.begin();
    for (auto di = dir_.begin(); di != dir_.end(); ++di, ++pi) {
      if (di->empty()) continue;  // a trailing separator's empty component
      if (pi == p.end() || *pi != *di) return false;
    }
    return true;
  }

  // One more component of a path whose part so far is resolved.
  void Step(Walk& walk, const fs::path& name) const {
    if (name.empty() || name == ".") return;
    if (name == "..") {
      walk.resolved = walk.resolved.parent_path();
      return;
    }
    fs::path next = walk.resolved / name;
    std::error_code ec;
    if (fs::is_symlink(next, ec)) {
      if (!walk.link && Inside(next)) walk.link = next;
      // weakly_canonical follows a link only to something that exists: a link to nothing (yet:
      // a file the run will write), or a chain of them, is followed by its text (at most 40
      // links, as the kernel's limit).
      fs::path target = next;
      std::error_code missing;
      for (int hops = 0;
           hops < 40 && !ec && !fs::exists(target, missing) && fs::is_symlink(target, missing);
           ++hops) {
        const fs::path text = fs::read_symlink(target, ec);
        if (!ec) target = text.is_relative() ? target.parent_path() / text : text;
      }
      if (!ec) target = fs::weakly_canonical(target, ec);
      if (!ec) next = target;
    }
    walk.resolved = std::move(next);
  }

  // An absolute directory's walk from the root, memoised.
  Walk Directory(const fs::path& absolute) {
    if (auto known = walks_.find(absolute.native()); known != walks_.end()) return known->second;
    Walk walk{absolute.root_path(), std::nullopt};
    for (const fs::path& name : absolute.relative_path()) Step(walk, name);
    return walks_[absolute.native()] = walk;
  }

  fs::path dir_;
  std::map<std::string, Walk> walks_;
};

// Whether `path` reaches into `dir` (InsideCheck): nullopt if not, else what to say after its
// value in the error (the glob's match, where a link leads). A glob (`glob_key`: the keys that
// take one) is checked at its directories before the first wildcard, then at every file it
// matches now.
std::optional<std::string> InsideDirectory(const std::string& path, const std::string& dir,
                                           bool glob_key, bool model_dir = false) {
  std::error_code ec;
  const fs::path d = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (ec || d.empty()) return std::nullopt;
  InsideCheck check(d);
  const std::string directories = glob_key ? GlobDirectories(path) : path;
  if (directories == path) {
    if (auto said = check.Reach(path); said || !model_dir) return said;
    // A model directory (hf_dir): its files too, which may be links (a Hugging Face cache's
    // snapshot is one link per file) into the directory --fresh deletes.
    std::vector<std::string> links;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_symlink(ec)) links.push_back(it->path().string());
    }
    std::sort(links.begin(), links.end());  // the first by name: the same error every time
    for (const std::string& link : links) {
      if (const auto said = check.Reach(link)) {
        return fmt::format(", whose file \"{}\"{}", link,
                           said->empty() ? " lies inside it" : *said);
      }
    }
    return std::nullopt;
  }
  // "runs/x*" may match runs/x2: its directories are runs/, not runs/x.
  if (auto said = check.Reach(directories)) return said;
  glob_t g{};
  std::optional<std::string> found;
  if (glob(path.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc && !found; ++i) {
      if (const auto said = check.Reach(g.gl_pathv[i])) {
        found = fmt::format(", which matches \"{}\"{}", g.gl_pathv[i], *said);
      }
    }
  }
  globfree(&g);
  return found;
}

// The keys of a model section that define its architecture (all but hf_dir and dropout), without
// the section prefix.
std::vector<std::string> ArchitectureKeys() {
  std::vector<std::string> names;
  const std::string prefix = "teacher.";  // the section without StudentConfig's own keys
  for (const auto& k : Keys()) {
    if (k.path.rfind(prefix, 0) != 0) continue;
    const std::string name = k.path.substr(prefix.size());
    if (name != "hf_dir" && name != "dropout" && name != "checkpoint" && name != "pretrain_steps") {
      names.push_back(name);
    }
  }
  return names;
}

// A model section with hf_dir: its architecture comes from <hf_dir>/config.json. A key that the
// YAML or an override also sets must agree (a different value could not load the weights);
// the keys left at their defaults take config.json's values.
//
// A run's stored config.yaml (kStored) holds every architecture key resolved from config.json
// when the run started: an hf_dir moved or deleted since then keeps those values (the run can
// still be exported; its teacher weights are needed only to train on).
template <typename Section>
void ResolveHfModel(const std::string& name, Section& model, Config& config, Locations& at,
                    ConfigOrigin origin) {
  if (model.hf_dir.empty()) return;
  if (origin == ConfigOrigin::kStored &&
      !std::filesystem::exists(std::filesystem::path(model.hf_dir) / "config.json")) {
    return;
  }
  Section from_hf = model;
  try {
    ReadHfConfig(model.hf_dir, from_hf);
  } catch (const std::exception& e) {
    Fail(Where(at, name + ".hf_dir"), name + ".hf_dir", e.what());
  }
  Config with_hf = config;
  if constexpr (std::is_same_v<Section, StudentConfig>) {
    with_hf.student = from_hf;
  } else {
    with_hf.teacher = from_hf;
  }
  // config.json's values within the keys' own ranges: the run's config.yaml stores them, and one
  // that no key accepts (max_position_embeddings 2^31, rope_theta 1) trained, then could be
  // neither resumed nor exported.
  Config scratch = with_hf;  // each key set back to its own value: the copy stays with_hf
  for (const auto& key : ArchitectureKeys()) {
    const std::string path = name + "." + key;
    const internal::KeyDecl* decl = FindKey(path);
    const std::string value = decl->get(with_hf);
    if (!decl->set(YAML::Load(value), scratch)) {
      Fail(model.hf_dir + "/config.json", path,
           fmt::format("expected {}, got {} (the value config.json gives this key)", decl->expected,
                       value));
    }
  }
  for (const auto& key : ArchitectureKeys()) {
    const std::string path = name + "." + key;
    if (!at.count(path)) continue;
    const internal::KeyDecl* decl = FindKey(path);
    const std::string wanted = decl->get(with_hf), got = decl->get(config);
    if (wanted != got && origin == ConfigOrigin::kStored) {
      // A run's own config.yaml: not a key to remove, but a directory whose model changed since
      // the run read it (replaced by another model: a resume or an export would read that one).
      Fail(at[path], path,
           fmt::format("the run was made with {}, but {}/config.json now gives {}: the "
                       "directory holds another model than the one this run read (replaced "
                       "since?); put that model back, or move the directory away (the run's "
                       "config.yaml keeps the architecture, so the run can still be exported)",
                       got, model.hf_dir, wanted));
    }
    if (wanted != got) {
      Fail(at[path], path,
           fmt::format("expected {} (from {}/config.json: the architecture of a Hugging Face "
                       "model comes from its config.json; remove the key), got {}",
                       wanted, model.hf_dir, got));
    }
  }
  // The keys config.json set are reported at it (an error about teacher.vocab_size names the
  // file its value came from, not "(default)").
  for (const auto& key : ArchitectureKeys()) {
    const std::string path = name + "." + key;
    if (!at.count(path)) at[path] = model.hf_dir + "/config.json";
  }
  // Dropout is a training choice, not the architecture: the YAML's or an override's value is
  // kept; left unset, config.json's attention_dropout.
  if (at.count(name + ".dropout")) {
    from_hf.dropout = model.dropout;
  } else {
    at[name + ".dropout"] = model.hf_dir + "/config.json";  // attention_dropout
  }
  model = from_hf;
}

// The keys of a model section that only the llama family reads (the gpt family's architecture
// is fixed there: LayerNorm with epsilon 1e-5, learned positions, biases everywhere).
constexpr const char* kLlamaOnlyKeys[] = {"n_kv_head",
                                          "head_dim",
                                          "norm_eps",
                                          "rope_theta",
                                          "rope_scaling.type",
                                          "rope_scaling.factor",
                                          "rope_scaling.low_freq_factor",
                                          "rope_scaling.high_freq_factor",
                                          "rope_scaling.original_max_position_embeddings",
                                          "attention_bias",
                                          "attention_out_bias",
                                          "mlp_bias",
                                          "qk_norm",
                                          "hf_model_type"};

// The constraints that involve more than one key. Each error is reported at the key that the
// user most likely has to change.
void CheckCrossKey(const Config& c, const Locations& at, ConfigOrigin origin) {
  auto fail = [&](const std::string& path, const std::string& what) {
    Fail(Where(at, path), path, what);
  };
  const bool distill = c.train.mode == Mode::kDistill;
  // A run's stored config skips the checks that refuse keys a run would not use.
  const bool requested = origin == ConfigOrigin::kRequested;
  auto check_model = [&](const std::string& name, const ModelConfig& m) {
    if (m.family == ModelFamily::kLlama) {
      if (m.n_head % m.kv_heads() != 0) {
        fail(name + ".n_kv_head", fmt::format("expected a divisor of {}.n_head ({}), got {}", name,
                                              m.n_head, m.n_kv_head));
      }
      if (m.head_dim == 0 && m.d_model % m.n_head != 0) {
        fail(name + ".d_model", fmt::format("expected a multiple of {}.n_head ({}) when head_dim "
                                            "is 0, got {}",
                                            name, m.n_head, m.d_model));
      }
      if (m.head_size() % 2 != 0) {
        fail(
            name + ".head_dim",
            fmt::format("expected an even head width (RoPE rotates pairs), got {}", m.head_size()));
      }
      if (m.rope_scaling.type == "llama3" &&
          m.rope_scaling.high_freq_factor <= m.rope_scaling.low_freq_factor) {
        fail(name + ".rope_scaling.high_freq_factor",
             fmt::format("expected more than low_freq_factor ({}), got {}",
                         m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor));
      }
      if (m.activation != Activation::kGelu) {
        fail(name + ".activation",
             fmt::format("expected gelu (the llama family's MLP is SwiGLU; activation chooses the "
                         "gpt family's GELU), got {}",
                         EnumName(m.activation)));
      }
    } else {
      if (m.d_model % m.n_head != 0) {
        fail(name + ".d_model", fmt::format("expected a multiple of {}.n_head ({}), got {}", name,
                                            m.n_head, m.d_model));
      }
      // A llama-family key set on a gpt model would be ignored without a word: a YAML that
      // forgot `family: llama` (gpt is the default) trained and exported a GPT-2-style model.
      // Not for a stored config: a run that set one before this check still resumes and exports.
      if (requested) {
        static const Config defaults;
        for (const char* key : kLlamaOnlyKeys) {
          const std::string path = name + "." + key;
          const internal::KeyDecl* decl = FindKey(path);
          const std::string value = decl->get(c), fallback = decl->get(defaults);
          if (value == fallback) continue;
          fail(path, fmt::format("expected {}, its default ({} is a llama-family key and "
                                 "{}.family is gpt{}, which does not read it: for a "
                                 "Llama/Qwen/Mistral-style model set {}.family: llama), got {}",
                                 fallback, key, name,
                                 at.count(name + ".family") ? "" : ", the default", name, value));
        }
      }
    }
    if (c.data.seq_len > m.context_length) {
      // A Hugging Face model's context length comes from its config.json: say so.
      const std::string from =
          m.hf_dir.empty() ? ""
                           : fmt::format(", {}/config.json's {}", m.hf_dir,
                                         m.family == ModelFamily::kGpt ? "n_positions"
                                                                       : "max_position_embeddings");
      fail("data.seq_len", fmt::format("expected at most {}.context_length ({}{}), got {}", name,
                                       m.context_length, from, c.data.seq_len));
    }
    if (c.data.source == "text" && m.vocab_size != 256) {
      fail(name + ".vocab_size",
           fmt::format("expected 256 (byte tokens; data.source is text), got {}", m.vocab_size));
    }
    if (c.data.source == "synthetic" && c.data.synthetic.branching > m.vocab_size) {
      fail("data.synthetic.branching", fmt::format("expected at most {}.vocab_size ({}), got {}",
                                                   name, m.vocab_size, c.data.synthetic.branching));
    }
    if (c.distill.ignore_index >= 0 && c.distill.ignore_index < m.vocab_size) {
      fail("distill.ignore_index",
           fmt::format("expected a value outside the token range [0, {}), got {}", m.vocab_size,
                       c.distill.ignore_index));
    }
  };
  // A Hugging Face model given as teacher.checkpoint: said before the architecture checks, whose
  // errors (the teacher's default vocab_size) would hide it.
  if (distill && requested && !c.teacher.checkpoint.empty()) {
    namespace fs = std::filesystem;
    const fs::path given = c.teacher.checkpoint;
    std::error_code error;
    const bool hf_dir = fs::is_directory(given, error) &&
                        fs::is_regular_file(given / "config.json", error) &&
                        !fs::exists(given / "checkpoints", error);
    // A file of one: config.json or weights beside it.
    const fs::path beside = given.has_parent_path() ? given.parent_path() : fs::path(".");
    const bool hf_file =
        fs::is_regular_file(given, error) && fs::is_regular_file(beside / "config.json", error) &&
        (given.extension() == ".safetensors" || given.filename() == "config.json" ||
         given.filename() == "model.safetensors.index.json");
    if (hf_dir || hf_file) {
      const std::string dir = hf_dir ? c.teacher.checkpoint : beside.string();
      fail("teacher.checkpoint",
           fmt::format("expected a distill_trainer checkpoint file or run directory, got \"{}\": "
                       "{}; give {} as teacher.hf_dir instead (and unset teacher.checkpoint)",
                       c.teacher.checkpoint,
                       hf_dir ? "a Hugging Face model directory (config.json, no checkpoints/)"
                              : "a file of a Hugging Face model",
                       hf_dir ? "it" : fmt::format("its directory \"{}\"", dir)));
    }
  }
  check_model("student", c.student);
  if (distill) check_model("teacher", c.teacher);

  // Each factor is range-checked (batch_size <= 2^20, seq_len <= 2^24, grad_accum <= 2^20), so
  // these products cannot overflow int64; the limits keep token counts far from it.
  const int64_t micro_tokens = c.data.batch_size * c.data.seq_len;
  if (micro_tokens > (int64_t{1} << 31)) {
    fail("data.batch_size",
         fmt::format("expected at most {} (2^31 tokens per micro-batch / data.seq_len {}), got {}",
                     (int64_t{1} << 31) / c.data.seq_len, c.data.seq_len, c.data.batch_size));
  }
  if (micro_tokens * c.train.grad_accum > (int64_t{1} << 40)) {
    fail("train.grad_accum",
         fmt::format("expected at most {} (2^40 tokens per step / {} tokens per micro-batch), "
                     "got {}",
                     (int64_t{1} << 40) / micro_tokens, micro_tokens, c.train.grad_accum));
  }
  if (c.data.source == "synthetic" && c.data.min_seq_len > c.data.seq_len) {  // synthetic only
    if (!at.count("data.min_seq_len")) {  // its default: the key the user set is seq_len
      fail("data.seq_len",
           fmt::format("expected at least data.min_seq_len ({}, its default), got {}; set "
                       "data.min_seq_len too, to at most {}",
                       c.data.min_seq_len, c.data.seq_len, c.data.seq_len));
    }
    fail("data.min_seq_len", fmt::format("expected at most data.seq_len ({}), got {}",
                                         c.data.seq_len, c.data.min_seq_len));
  }
  // A run already in train.out_dir (its config.yaml) continues under the checks it started with:
  // the checks marked "starting" below, which judge a config's sense, refuse only a run that
  // starts. A run made before them still resumes: the requested config must equal its stored
  // one, which may hold what they refuse (--config <out_dir>/config.yaml included).
  std::error_code exists_error;
  const bool starting =
      requested && !fs::exists(fs::path(c.train.out_dir) / "config.yaml", exists_error);
  // Nothing expands a leading '~' (YAML does not; a shell does only unquoted, at a word's
  // start): out_dir "~/runs/x" made a directory named '~' here. A stored config (a run made so)
  // still loads.
  if (requested) {
    for (const auto& k : Keys()) {
      if (!k.path_value) continue;
      const std::string& value = k.path_value(c);
      if (value.empty()) continue;
      if (value[0] == '~') {
        fail(k.path, fmt::format("expected a path that does not start with ~ (nothing expands "
                                 "it here; write the home directory out, e.g. with $HOME "
                                 "unquoted in a shell override), got \"{}\"",
                                 value));
      }
      // Starting: a YAML block scalar ('>' or '|') ends its text with a newline, and a quoted
      // value keeps its spaces: legal names, but a directory "runs/x\n" beside "runs/x" is never
      // meant.
      if (starting && std::any_of(value.begin(), value.end(), [](char ch) {
            const auto b = static_cast<unsigned char>(ch);
            return b < 0x20 || b == 0x7f;
          })) {
        fail(k.path, fmt::format("expected a path without control characters (a newline or a "
                                 "tab: a YAML block scalar, '>' or '|', ends with a newline), "
                                 "got {}",
                                 Shown(value)));
      }
      if (starting && (value.front() == ' ' || value.back() == ' ')) {
        fail(k.path, fmt::format("expected a path without leading or trailing spaces (quotes "
                                 "keep them), got {}",
                                 Shown(value)));
      }
      // Every requested config: what the run reads must not lie inside the directory it writes.
      // --fresh deletes that directory, and the run's export and checkpoints go into it (a
      // teacher exported by an earlier run into <out_dir>/hf, distilled again with the same
      // out_dir, was deleted by --fresh before it was read, and overwritten by the new export).
      // data.path and data.val_path of token shards are globs; every other path is a name.
      const bool glob_key =
          c.data.source == "tokens" && (k.path == "data.path" || k.path == "data.val_path");
      const auto inside =
          k.path == "train.out_dir"
              ? std::nullopt
              : InsideDirectory(value, c.train.out_dir, glob_key,
                                k.path == "student.hf_dir" || k.path == "teacher.hf_dir" ||
                                    k.path == "train.export_from");
      if (inside) {
        fail(k.path,
             fmt::format("expected a path outside train.out_dir \"{}\" (set at {}): --fresh "
                         "deletes that directory and the run writes its checkpoints and export "
                         "there; copy or export it elsewhere, or choose another train.out_dir, "
                         "got \"{}\"{}",
                         c.train.out_dir, Where(at, "train.out_dir"), value, *inside));
      }
    }
  }
  // Starting: the student and the teacher share a tokenizer. The divergence compares their logits
  // id by id, the data's ids are the teacher's, and the export copies the student's tokenizer
  // files (Llama 2 and Mistral both have 32000 ids, for other tokens).
  if (starting && distill && !c.student.hf_dir.empty() && !c.teacher.hf_dir.empty()) {
    std::optional<TokenizerDifference> diff;
    try {
      diff = HfTokenizerDifference(c.teacher.hf_dir, c.student.hf_dir);
    } catch (const ConfigError& e) {
      // Whose tokenizer it is: the teacher's is read first, so the teacher's where it fails alone.
      const char* key = "student.hf_dir";
      try {
        HfTokenizerSize(c.teacher.hf_dir);
      } catch (const ConfigError&) {
        key = "teacher.hf_dir";
      }
      fail(key, fmt::format("expected a readable tokenizer: {}", e.what()));
    }
    if (diff) {
      fail("student.hf_dir",
           fmt::format("expected a model with the teacher's tokenizer (distillation compares the "
                       "two models' logits id by id, and the data's ids are the teacher's), got "
                       "\"{}\", whose tokenizer.json gives id {} the token {} where the teacher's "
                       "(teacher.hf_dir \"{}\") has {}, and {} id{} in all; take a student "
                       "that uses the teacher's tokenizer",
                       c.student.hf_dir, diff->id, Shown(diff->b), c.teacher.hf_dir, Shown(diff->a),
                       diff->count, diff->count == 1 ? " differs" : "s differ"));
    }
  }
  // Starting: a key set away from its default where the run does not read it is a mistake (a
  // schedule thought to decay, a beta thought to weigh), not a choice: refused, naming what
  // would read it.
  if (starting) {
    static const Config defaults;
    const bool synthetic = c.data.source == "synthetic";
    const std::string source = fmt::format("data.source is {}", c.data.source);
    const struct {
      const char* key;
      bool unused;
      std::string why;
    } unused_keys[] = {
        {"distill.jsd_beta", c.distill.divergence != Divergence::kJsd,
         fmt::format("read by distill.divergence jsd only, and distill.divergence is {}",
                     EnumName(c.distill.divergence))},
        {"schedule.min_lr_ratio", c.schedule.kind == ScheduleKind::kConstant,
         "schedule.kind constant does not decay"},
        {"data.val_fraction", synthetic || (c.data.source == "tokens" && !c.data.val_path.empty()),
         synthetic ? "synthetic validation is its own generated stream"
                   : "data.val_path gives the validation shards"},
        {"data.min_seq_len", !synthetic, "read by data.source synthetic only; " + source},
        {"data.synthetic.order", !synthetic, "read by data.source synthetic only; " + source},
        {"data.synthetic.branching", !synthetic, "read by data.source synthetic only; " + source},
        {"data.synthetic.zipf", !synthetic, "read by data.source synthetic only; " + source},
    };
    for (const auto& u : unused_keys) {
      const internal::KeyDecl* decl = FindKey(u.key);
      const std::string value = decl->get(c), fallback = decl->get(defaults);
      if (!u.unused || value == fallback) continue;
      fail(u.key, fmt::format("expected {}, its default (the run does not read it: {}; remove "
                              "the key), got {}",
                              fallback, u.why, value));
    }
  }
  // A path the run would not read is a mistake (data.source left at its default), not a choice.
  if (requested && c.data.source == "synthetic" && !c.data.path.empty()) {
    fail("data.path", fmt::format("expected \"\" with data.source synthetic (the synthetic "
                                  "language reads no files; set data.source to text or tokens to "
                                  "train on it), got \"{}\"",
                                  c.data.path));
  }
  if (requested && c.data.source != "tokens" && !c.data.val_path.empty()) {
    fail("data.val_path",
         fmt::format("expected \"\" with data.source {} (validation shards are for data.source "
                     "tokens; {}), got \"{}\"",
                     c.data.source,
                     c.data.source == "text" ? "text holds out data.val_fraction"
                                             : "synthetic validation is its own generated stream",
                     c.data.val_path));
  }
  if (c.data.source != "synthetic" && c.data.path.empty()) {
    fail("data.path", fmt::format("expected a {} (data.source is {}), got \"\"",
                                  c.data.source == "text" ? "file path" : "glob of token shards",
                                  c.data.source));
  }
  if (c.train.device == "cpu" && c.train.precision == Precision::kBf16) {
    fail("train.precision",
         "expected fp32 with train.device cpu (bf16 autocast is CUDA-only), got \"bf16\"");
  }
  if (c.train.out_dir.empty()) fail("train.out_dir", "expected a directory path, got \"\"");
  if (requested && c.optim.lr * c.optim.weight_decay >= 1) {
    fail("optim.weight_decay",
         fmt::format("expected below 1 / optim.lr = {:g} (AdamW multiplies the weights by 1 - lr "
                     "* weight_decay at every step: at 1 or more they vanish or change sign), "
                     "got {:g}",
                     1 / c.optim.lr, c.optim.weight_decay));
  }
  if (c.train.device == "cpu" && c.train.cuda_graph == CudaGraph::kOn) {
    fail("train.cuda_graph",
         "expected auto or false with train.device cpu (CUDA graphs need CUDA), got true");
  }
  if (requested && c.train.export_hf) {
    // The end-of-run export writes the trained model as its hf_model_type's class (the student;
    // the teacher too when the pipeline pretrains it): a choice that class cannot express is
    // refused now, not after the training (a stored config is not checked again: an older run
    // still resumes).
    const bool teacher_trained = distill && c.teacher.pretrain_steps > 0;
    for (const auto& [name, m] : {std::pair<std::string, const ModelConfig*>{"student", &c.student},
                                  {"teacher", teacher_trained ? &c.teacher : nullptr}}) {
      if (m == nullptr || m->family != ModelFamily::kLlama) continue;
      if (const auto mismatch = HfExpressibleMismatch(*m)) {
        fail(name + "." + mismatch->key,
             fmt::format("expected {} with {}.hf_model_type \"{}\" (the end-of-run export "
                         "writes that model class's config.json; set {}.hf_model_type to a "
                         "type that has it, or train.export_hf: false), got {}",
                         mismatch->expected, name, m->hf_model_type, name, mismatch->got));
      }
    }
    // train.export_from: a model directory whose tokenizer fits the student (its ids are rows of
    // the exported embedding), checked now, not found missing after the training.
    const std::string& from = c.train.export_from;
    if (!from.empty()) {
      std::error_code ec;  // an unreadable path is "does not exist" here; the reads below say more
      const bool is_dir = fs::is_directory(from, ec);
      if (!is_dir || !fs::is_regular_file(fs::path(from) / "config.json", ec)) {
        fail("train.export_from",
             fmt::format("expected a Hugging Face model directory with a config.json (whose "
                         "token ids and tokenizer files the export takes), or \"\" for none; "
                         "got \"{}\", {}",
                         from,
                         !fs::exists(from, ec) ? "which does not exist"
                         : !is_dir             ? "a file"
                         : fs::exists(fs::path(from) / "config.json", ec)
                             ? "whose config.json is not a regular file"
                             : "a directory without config.json"));
      }
      std::optional<int64_t> ids;
      try {
        ids = HfTokenizerSize(from);
      } catch (const ConfigError& e) {
        fail("train.export_from", fmt::format("expected a readable tokenizer.json: {}", e.what()));
      }
      if (ids && *ids > c.student.vocab_size) {
        fail("train.export_from",
             fmt::format("expected the directory of a model whose tokenizer the student can "
                         "take (at most student.vocab_size {} token ids), got \"{}\", whose "
                         "tokenizer.json has {} ids: the exported model would have no rows for "
                         "ids from {} on",
                         c.student.vocab_size, from, *ids, c.student.vocab_size));
      }
    }
    // The tokenizer files the end-of-run export copies, where the run exports (a llama student,
    // or one from a Hugging Face model: trainer.cpp's condition): a link to nothing is refused
    // now, not left out of the export after the training.
    const bool exports = c.student.family == ModelFamily::kLlama || !c.student.hf_dir.empty() ||
                         (distill && !c.teacher.hf_dir.empty()) || !c.train.export_from.empty();
    const std::vector<std::string> dirs = {c.student.hf_dir, c.teacher.hf_dir, c.train.export_from};
    const char* keys[] = {"student.hf_dir", "teacher.hf_dir", "train.export_from"};  // of dirs
    const auto dangling =
        exports ? DanglingExportTokenizerFiles(dirs) : std::vector<UncopyableTokenizerFile>{};
    if (!dangling.empty()) {
      const size_t dir = dangling.front().dir;  // the first directory that has any, all of its
      std::vector<std::string> files;
      for (const auto& d : dangling) {
        if (d.dir == dir) files.push_back(d.file);
      }
      fail(keys[dir], fmt::format("expected tokenizer files that the end-of-run export can copy "
                                  "(train.export_hf is on), got {}: {}; restore {} (e.g. "
                                  "download the model again) or set train.export_hf: false",
                                  fmt::join(files, ", "),
                                  files.size() == 1 ? "a link that leads to no file"
                                                    : "links that lead to no file",
                                  files.size() == 1 ? "it" : "them"));
    }
    // A JSON file there that does not parse (a cut-short download, an edit gone wrong) would be
    // copied as it is, and the exported model would not load; a directory or a pipe where a file
    // belongs, or a link that loops, would fail the export after the training.
    const auto uncopyable =
        exports ? UncopyableExportTokenizerFiles(dirs) : std::vector<UncopyableTokenizerFile>{};
    if (!uncopyable.empty()) {
      fail(keys[uncopyable.front().dir],
           fmt::format("expected tokenizer files that the end-of-run export can copy "
                       "(train.export_hf is on), got {}: {}; restore it (e.g. download the "
                       "model again) or set train.export_hf: false",
                       uncopyable.front().file, uncopyable.front().problem));
    }
    // The teacher's tokenizer, where the export ships it (the student's hf_dir has none): its ids
    // must be rows of the student's embedding (a student narrower than the teacher's tokenizer,
    // distill.vocab_size, exported with the teacher's tokenizer.json, failed in transformers on
    // the ids past its rows). Not the student's own tokenizer: a model whose tokenizer has an id
    // past its rows (a pad token added without resizing) is exported as it came;
    // train.export_from's is checked above.
    const std::optional<size_t> d = exports ? ExportTokenizerDir(dirs) : std::nullopt;
    if (d && *d == 1) {
      std::optional<int64_t> ids;
      try {
        ids = HfTokenizerSize(dirs[*d]);
      } catch (const ConfigError& e) {
        fail(keys[*d], fmt::format("expected a readable tokenizer.json (the end-of-run export "
                                   "copies it): {}",
                                   e.what()));
      }
      if (ids && *ids > c.student.vocab_size) {
        fail(keys[*d],
             fmt::format("expected a tokenizer the exported student can take (at most "
                         "student.vocab_size {} token ids), got \"{}\", whose tokenizer.json has "
                         "{} ids, which the end-of-run export copies (student.hf_dir has no "
                         "tokenizer): the exported model would have no rows for ids from {} on; "
                         "give the student vocab_size {} or more, or set train.export_hf: false "
                         "and export the student with a tokenizer of its ids yourself",
                         c.student.vocab_size, dirs[*d], *ids, c.student.vocab_size, *ids));
      }
    }
  }
  if (c.train.activation_checkpointing) {
    for (const auto& [name, dropout] : internal::TrainedModelDropouts(c)) {
      if (dropout > 0) {
        fail(name + ".dropout",
             fmt::format("expected 0 with train.activation_checkpointing true (the recomputed "
                         "forward would draw other dropout masks than the first), got {}",
                         dropout));
      }
    }
  }
  // distill.vocab_size bounds the data's tokens in either mode (the real vocabulary; pretraining
  // draws its data from it too).
  if (c.distill.vocab_size > 0) {
    if (c.distill.vocab_size > c.student.vocab_size) {
      fail("distill.vocab_size", fmt::format("expected at most student.vocab_size ({}), got {}",
                                             c.student.vocab_size, c.distill.vocab_size));
    }
    // The data's tokens are below distill.vocab_size: every byte for text, and the synthetic
    // language's successors, which it draws distinct (fewer tokens than branches never ends).
    if (c.data.source == "text" && c.distill.vocab_size != 256) {
      fail("distill.vocab_size",
           fmt::format("expected 256 or 0 (unset) with data.source text (its tokens are the bytes "
                       "0-255, all real), got {}",
                       c.distill.vocab_size));
    }
    if (c.data.source == "synthetic" && c.data.synthetic.branching > c.distill.vocab_size) {
      fail("data.synthetic.branching",
           fmt::format("expected at most distill.vocab_size ({}, the tokens the data draws "
                       "from), got {}",
                       c.distill.vocab_size, c.data.synthetic.branching));
    }
  }
  if (!distill) {
    if (c.train.baseline) fail("train.baseline", "expected false in pretrain mode, got true");
    if (c.student.init_from_teacher) {
      fail("student.init_from_teacher", "expected false in pretrain mode, got true");
    }
    if (c.distill.fused_linear == FusedLinear::kOn) {
      fail("distill.fused_linear",
           "expected false or auto in pretrain mode (it fuses the distillation loss; pretraining "
           "computes the cross-entropy from the logits), got true");
    }
    return;
  }
  if (c.teacher.checkpoint.empty() && c.teacher.pretrain_steps == 0 && c.teacher.hf_dir.empty()) {
    fail("teacher.checkpoint",
         "expected a checkpoint file or run directory in distill mode (or teacher.hf_dir, or "
         "teacher.pretrain_steps > 0 to pretrain one first), got \"\"");
  }
  if (!c.teacher.hf_dir.empty() &&
      (!c.teacher.checkpoint.empty() || c.teacher.pretrain_steps > 0)) {
    fail(c.teacher.checkpoint.empty() ? "teacher.pretrain_steps" : "teacher.checkpoint",
         "expected no other teacher source when teacher.hf_dir is set (the weights come from it)");
  }
  if (!c.teacher.checkpoint.empty() && c.teacher.pretrain_steps > 0) {
    fail("teacher.pretrain_steps",
         fmt::format("expected 0 when teacher.checkpoint is set (the teacher is loaded, not "
                     "pretrained), got {}",
                     c.teacher.pretrain_steps));
  }
  if (requested && c.distill.kd_weight == 0 && c.distill.ce_weight == 0) {
    fail("distill.kd_weight",
         "expected a weight above 0 for the divergence or for "
         "distill.ce_weight (with both 0 the loss is 0 and the student does "
         "not learn), got 0");
  }
  if (c.distill.vocab_size > 0) {
    // Tokens below distill.vocab_size must be rows of both embeddings (the student's is checked
    // above, in either mode); the logits are aligned.
    if (c.distill.vocab_size > c.teacher.vocab_size) {
      fail("distill.vocab_size", fmt::format("expected at most teacher.vocab_size ({}), got {}",
                                             c.teacher.vocab_size, c.distill.vocab_size));
    }
  } else if (c.teacher.vocab_size != c.student.vocab_size ||
             c.teacher.padded_vocab_size() != c.student.padded_vocab_size()) {
    // Reported at the key to change: the student's when the teacher's width comes from a
    // Hugging Face config.json (fixed by its weights) and the student's does not.
    const bool teacher_fixed = !c.teacher.hf_dir.empty() && c.student.hf_dir.empty();
    const std::string change = teacher_fixed ? "student" : "teacher";
    const std::string other = teacher_fixed ? "teacher" : "student";
    const ModelConfig& student = c.student;
    const ModelConfig& teacher = c.teacher;
    const ModelConfig& changed = teacher_fixed ? student : teacher;
    const ModelConfig& fixed = teacher_fixed ? teacher : student;
    const std::string origin =
        teacher_fixed ? fmt::format(", from {}/config.json", c.teacher.hf_dir) : "";
    if (c.teacher.vocab_size != c.student.vocab_size) {
      fail(change + ".vocab_size",
           fmt::format("expected {}.vocab_size ({}{}) (or set distill.vocab_size to the "
                       "tokenizer's size to align logits of different widths), got {}",
                       other, fixed.vocab_size, origin, changed.vocab_size));
    } else {
      fail(change + ".pad_vocab_to_multiple_of",
           fmt::format("expected a value that pads to the {}'s {} logits{}, got {} (pads to {}); "
                       "or set distill.vocab_size to {} (the real vocabulary) to align logits of "
                       "different widths",
                       other, fixed.padded_vocab_size(), origin, changed.pad_vocab_to_multiple_of,
                       changed.padded_vocab_size(), c.student.vocab_size));
    }
  }
  if (c.student.init_from_teacher && !c.student.hf_dir.empty() && origin != ConfigOrigin::kStored) {
    // The student starts as the teacher: from the teacher's directory (set above when the student
    // names none), never from weights of its own, which the copy would silently give way to.
    // (Not for a run's stored config: a run made before this check trained and exports as it
    // was started.)
    std::error_code ec;
    const bool same = c.student.hf_dir == c.teacher.hf_dir ||
                      (!c.teacher.hf_dir.empty() &&
                       fs::equivalent(c.student.hf_dir, c.teacher.hf_dir, ec) && !ec);
    if (!same) {
      fail("student.hf_dir",
           fmt::format("expected {} (student.init_from_teacher is true: the student starts as an "
                       "exact copy of the teacher; unset student.hf_dir, or set "
                       "student.init_from_teacher to false to start from {}), got \"{}\"",
                       c.teacher.hf_dir.empty()
                           ? std::string("no student.hf_dir (the teacher has no hf_dir)")
                           : fmt::format("\"{}\" (= teacher.hf_dir) or none", c.teacher.hf_dir),
                       c.student.hf_dir, c.student.hf_dir));
    }
  }
  if (c.student.init_from_teacher) {
    // The copy needs identical parameter shapes; dropout may differ.
    for (const auto& name : ArchitectureKeys()) {
      const std::string s = FindKey("student." + name)->get(c);
      const std::string t = FindKey("teacher." + name)->get(c);
      if (s != t) {
        fail("student." + name,
             fmt::format("expected {} (= teacher.{}; student.init_from_teacher is true), got {}", t,
                         name, s));
      }
    }
  }
}

// The 1-based line where a second YAML document starts: the "---" (or the content after a
// "...") that follows content or an earlier "---".
int SecondDocumentLine(const std::string& text) {
  std::istringstream in(text);
  bool started = false;  // inside the first document (content or its "---" seen)
  int line_number = 0, ended = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    const bool marker = line.rfind("---", 0) == 0 &&
                        (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
    const size_t first = line.find_first_not_of(" \t\r");
    const bool blank = first == std::string::npos || line[first] == '#';
    if (marker) {
      if (started) return line_number;
      started = true;
    } else if (line.rfind("...", 0) == 0) {
      ended = line_number;
    } else if (!blank) {
      if (ended > 0) return line_number;
      started = true;
    }
  }
  return line_number;
}

// The offset of the first NUL byte in a config's text, unless the text is UTF-16 or UTF-32,
// which yaml-cpp decodes (told by a byte-order mark, or by the zero bytes of an ASCII first
// character: 't' in UTF-16 or UTF-32; a file of zeros is neither).
std::optional<size_t> NulByteOffset(const std::string& text) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  if (text.size() >= 2 &&
      ((byte(0) == 0xFF && byte(1) == 0xFE) || (byte(0) == 0xFE && byte(1) == 0xFF) ||
       ((byte(0) == 0) != (byte(1) == 0)))) {
    return std::nullopt;
  }
  if (text.size() >= 4 && byte(0) == 0 && byte(1) == 0 &&
      ((byte(2) == 0xFE && byte(3) == 0xFF) || (byte(2) == 0 && byte(3) != 0))) {
    return std::nullopt;  // UTF-32BE, with or without its byte-order mark
  }
  const size_t nul = text.find('\0');
  return nul == std::string::npos ? std::nullopt : std::optional<size_t>(nul);
}

}  // namespace

Config ParseConfig(const std::string& yaml_text, const std::string& source_name,
                   const std::vector<std::string>& overrides, ConfigOrigin origin) {
  Config config;
  Locations locations;
  // A NUL byte (a write cut short by a crash, a binary file): yaml-cpp reads it as the start of
  // an escape, which gives an error carrying the NUL itself, or another key ("a: 1\n\0b: 2"
  // read as the keys a and "\b"), and passes unseen in a comment.
  if (const auto nul = NulByteOffset(yaml_text)) {
    throw ConfigError(fmt::format(
        "{}:{}: expected YAML text, got a NUL byte (at byte offset {}): the file is damaged or "
        "not a config",
        source_name, 1 + std::count(yaml_text.begin(), yaml_text.begin() + *nul, '\n'), *nul));
  }
  YAML::Node root;
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(yaml_text);
    if (documents.size() > 1) {
      throw ConfigError(fmt::format(
          "{}:{}: a second YAML document (after \"---\"); a config is one document: remove the "
          "marker and merge its keys into the first",
          source_name, SecondDocumentLine(yaml_text)));
    }
    if (!documents.empty()) root = documents[0];
  } catch (const YAML::ParserException& e) {
    // A tab in the indentation is the classic cause, which yaml-cpp's message does not name.
    std::string line;
    std::istringstream lines(yaml_text);
    for (int i = 0; i <= e.mark.line; ++i) {
      if (!std::getline(lines, line)) line.clear();
    }
    const size_t text = line.find_first_not_of(" \t");
    const bool tab = e.mark.line >= 0 && line.substr(0, text).find('\t') != std::string::npos;
    const bool alias = e.msg.find("anchor") != std::string::npos;
    throw ConfigError(fmt::format(
        "{}:{}: invalid YAML: {}{}", source_name, e.mark.line + 1, e.msg,
        tab     ? " (this line is indented with a tab: YAML indents with spaces only)"
        : alias ? " (a value that starts with '*' is a YAML alias: quote it to keep it as text, "
                  "e.g. path: \"*.bin\")"
                : ""));
  }
  if (root.IsNull() && origin == ConfigOrigin::kStored) {  // not the defaults: a damaged file
    throw ConfigError(fmt::format(
        "{}: expected the run's config (distill_trainer writes every key there when the run "
        "starts), got an empty file",
        source_name));
  }
  if (root.IsMap()) {
    ApplyMap(root, "", source_name, yaml_text, config, locations);
  } else if (!root.IsNull()) {
    throw ConfigError(
        fmt::format("{}:{}: expected a mapping of sections (student, teacher, data, "
                    "distill, optim, schedule, train), got {}",
                    source_name, root.Mark().line + 1, Describe(root)));
  }
  for (const auto& text : overrides) ApplyOverride(text, config, locations);
  // "runs/x/" is the run "runs/x" (its baseline runs/x-baseline, not runs/x/-baseline).
  config.train.out_dir = WithoutTrailingSeparators(config.train.out_dir);
  // Self-distillation from a Hugging Face teacher: the student starts from the same directory.
  if (config.student.init_from_teacher && config.student.hf_dir.empty() &&
      !config.teacher.hf_dir.empty()) {
    config.student.hf_dir = config.teacher.hf_dir;
    locations["student.hf_dir"] = Where(locations, "student.init_from_teacher");
  }
  ResolveHfModel("student", config.student, config, locations, origin);
  ResolveHfModel("teacher", config.teacher, config, locations, origin);
  CheckCrossKey(config, locations, origin);
  config.given_at = std::move(locations);
  return config;
}

std::string WithWhereGiven(const Config& config, const std::string& message) {
  // The key path the message starts with: "train.device: ...", "train.out_dir \"x\" is a file",
  // "train.grad_accum=3 is not ...".
  const size_t end = message.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_.");
  if (end == std::string::npos ||
      (message[end] != ':' && message[end] != ' ' && message[end] != '=')) {
    return message;
  }
  const auto it = config.given_at.find(message.substr(0, end));
  if (it == config.given_at.end() || IsSection(it->first)) return message;
  return fmt::format("{}: {}", it->second, message);
}

Config LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides,
                      ConfigOrigin origin) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw ConfigError(fmt::format("{}: is a directory; expected a YAML config file", path));
  }
  if (!std::filesystem::exists(path, error) && !error) {  // else: the read says why
    throw ConfigError(fmt::format("{}: no such file; expected a YAML config file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(
        fmt::format("{}: cannot read the config file ({})", path, std::strerror(errno)));
  }
  // A pipe (--config <(...)) is read as a file; a stream without end (/dev/zero) is cut off.
  constexpr size_t kMaxBytes = size_t{16} << 20;
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxBytes) {
      throw ConfigError(fmt::format("{}: more than {} MiB; expected a YAML config file (a few KiB)",
                                    path, kMaxBytes >> 20));
    }
  }
  if (in.bad()) throw ConfigError(fmt::format("{}: cannot read the config file", path));
  // A file without a key (empty, or comments only: cut short, or the wrong file) would be every
  // key's default, not the embedded quickstart; a stored one is refused by ParseConfig itself.
  // (A NUL byte: ParseConfig names it.)
  if (origin == ConfigOrigin::kRequested && !NulByteOffset(text) &&
      std::filesystem::is_regular_file(path, error)) {
    // (Not /dev/null: `--config /dev/null key=value ...` asks for the defaults on purpose.)
    const bool no_keys = [&] {
      try {
        const std::vector<YAML::Node> documents = YAML::LoadAll(text);
        return documents.empty() || (documents.size() == 1 && documents[0].IsNull());
      } catch (const YAML::Exception&) {  // ParseConfig reports it, with the line
        return false;
      }
    }();
    if (no_keys) {
      throw ConfigError(fmt::format(
          "{}: the file holds no keys (it is empty, or comments only); write the keys to set in "
          "it ({{}} for every key's default), or leave --config out to run the embedded "
          "quickstart",
          path));
    }
  }
  return ParseConfig(text, path, overrides, origin);
}

std::string ConfigToYaml(const Config& config) {
  std::string out;
  std::vector<std::string> open;  // the sections of the previous key
  for (const auto& key : Keys()) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t dot = key.path.find('.', start);
      parts.push_back(key.path.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      out += fmt::format("{:{}}{}:\n", "", 2 * i, parts[i]);
    }
    out += fmt::format("{:{}}{}: {}\n", "", 2 * (parts.size() - 1), parts.back(), key.get(config));
    open.assign(parts.begin(), parts.end() - 1);
  }
  return out;
}

std::string ConfigHelp() {
  const Config defaults;
  std::string out;
  for (const auto& key : Keys()) {
    out += fmt::format("  {} = {}\n      {} Accepts {}.\n", key.path, key.get(defaults), key.help,
                       key.expected);
  }
  return out;
}

std::string ConfigReference() {
  const Config defaults;
  std::string out, section;
  for (const auto& key : Keys()) {
    const std::string top = key.path.substr(0, key.path.find('.'));
    if (top != section) {
      out += fmt::format("{}## `{}`\n\n| key | default | accepts | meaning |\n|---|---|---|---|\n",
                         section.empty() ? "" : "\n", top);
      section = top;
    }
    std::string value = key.get(defaults);
    if (value.empty() || value == "\"\"") value = "\"\"";
    out += fmt::format("| `{}` | `{}` | {} | {} |\n", key.path, value, key.expected, key.help);
  }
  return out;
}

std::vector<std::string> ConfigKeys() {
  std::vector<std::string> paths;
  for (const auto& key : Keys()) paths.push_back(key.path);
  return paths;
}

}  // namespace distill

// safetensors reading (mmap + full header validation), atomic writing, and the module <-> HF
// directory copies. See distill/safetensors.h for the format and the contracts.
#include "distill/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distill/file_io.h"
#include "json_limits.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp assumes a little-endian host (the format's byte order)"
#endif

namespace distill {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The header length is untrusted input; the reference implementation's limit is 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  const char* name;
  size_t itemsize;
  at::ScalarType scalar;  // Undefined: parsed, but never read or written here
};

// Every dtype of the format. Only F32, F16 and BF16 are read as weights.
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1, at::kBool},
    {"U8", 1, at::kByte},
    {"I8", 1, at::kChar},
    {"F8_E5M2", 1, at::ScalarType::Undefined},
    {"F8_E4M3", 1, at::ScalarType::Undefined},
    {"I16", 2, at::kShort},
    {"U16", 2, at::ScalarType::Undefined},
    {"F16", 2, at::kHalf},
    {"BF16", 2, at::kBFloat16},
    {"I32", 4, at::kInt},
    {"U32", 4, at::ScalarType::Undefined},
    {"F32", 4, at::kFloat},
    {"F64", 8, at::kDouble},
    {"I64", 8, at::kLong},
    {"U64", 8, at::ScalarType::Undefined},
};

const DtypeInfo* FindDtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

bool IsWeightDtype(const std::string& name) {
  return name == "F32" || name == "F16" || name == "BF16";
}

std::string ShapeString(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string Quoted(const std::string& s) { return Json(s).dump(); }

[[noreturn]] void TensorError(const std::string& file, const std::string& name,
                              const std::string& what) {
  throw WeightsError(fmt::format("{}: tensor {}: {}", file, Quoted(name), what));
}

[[noreturn]] void HeaderError(const std::string& file, const std::string& what) {
  throw WeightsError(fmt::format("{}: header: {}", file, what));
}

// A JSON value's type in words, for "got ..." (the value itself when it is short).
std::string Describe(const Json& v) {
  if (v.is_string() || v.is_number() || v.is_boolean() || v.is_null()) {
    std::string s = v.dump();
    return s.size() <= 40 ? s : s.substr(0, 40) + "...";
  }
  return v.is_array() ? "an array" : "an object";
}

// A JSON value as text for a message, cut at 80 characters (a header is input: a shape may hold
// a million entries).
std::string Shown(const Json& v) {
  std::string s = v.dump();
  return s.size() <= 80 ? s : s.substr(0, 80) + "...";
}

// A non-negative JSON integer that fits in int64, or nullopt-like false.
bool AsCount(const Json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
  } else {
    return false;
  }
  return out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

// Whether `path` is there to read. What can't be looked at (a symbolic link loop, a directory
// without search permission) is an error naming the file, not a file that is missing.
bool IsPresent(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path, ec)) return true;
  if (ec) {
    throw WeightsError(
        fmt::format("{}: expected a file that can be read, got an error looking at it: {}",
                    path.string(), ec.message()));
  }
  return false;
}

// A symbolic link to nothing at `path` (a half-downloaded Hugging Face snapshot): an error naming
// it, for a directory that holds no weights otherwise.
void RefuseDanglingLink(const fs::path& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    throw WeightsError(
        fmt::format("{}: expected a file, got a symbolic link to {}, which does not "
                    "exist",
                    path.string(), fs::read_symlink(path, ec).string()));
  }
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw WeightsError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TensorInfo {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the data section
  uint64_t end = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

struct SafetensorsFile::Impl {
  std::string path;
  const uint8_t* map = nullptr;  // the whole file
  size_t size = 0;
  const uint8_t* data = nullptr;  // the data section: map + 8 + header length
  uint64_t data_size = 0;
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;

  ~Impl() {
    if (map != nullptr) munmap(const_cast<uint8_t*>(map), size);
  }

  void Open();
  void ParseHeader(const char* text, size_t length);
  const TensorInfo& Find(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) TensorError(path, name, "expected a tensor of that name, got none");
    return it->second;
  }
};

void SafetensorsFile::Impl::Open() {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw WeightsError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw WeightsError(fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw WeightsError(
        fmt::format("{}: expected a regular file, got a directory or a special file", path));
  }
  if (st.st_size < 8) {
    ::close(fd);
    HeaderError(path, fmt::format("expected at least 8 bytes (the header length), got a file of "
                                  "{} bytes",
                                  st.st_size));
  }
  size = static_cast<size_t>(st.st_size);
  void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (addr == MAP_FAILED) {
    size = 0;
    throw WeightsError(fmt::format("{}: cannot mmap: {}", path, std::strerror(err)));
  }
  map = static_cast<const uint8_t*>(addr);

  uint64_t header_length = 0;
  std::memcpy(&header_length, map, 8);  // little-endian host (checked at compile time)
  if (header_length > kMaxHeaderBytes) {
    HeaderError(path, fmt::format("expected a header length <= {} bytes, got {}", kMaxHeaderBytes,
                                  header_length));
  }
  if (header_length > size - 8) {
    HeaderError(path, fmt::format("expected a header length <= {} (the file has {} bytes: "
                                  "truncated?), got {}",
                                  size - 8, size, header_length));
  }
  data = map + 8 + header_length;
  data_size = size - 8 - header_length;
  ParseHeader(reinterpret_cast<const char*>(map + 8), header_length);
}

void SafetensorsFile::Impl::ParseHeader(const char* text, size_t length) {
  // The DOM parser keeps the last of duplicate keys; a top-level duplicate is an error here.
  std::string duplicate;
  std::vector<std::set<std::string>> keys;  // one set per open object
  const auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxJsonDepth) HeaderError(path, JsonTooDeep());
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && depth == 1 && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  // JSON padded with spaces, as the format says: a NUL (after which nlohmann stops reading)
  // with anything behind it is refused, as Python's safetensors refuses it.
  if (const void* nul = std::memchr(text, 0, length)) {
    const size_t at = static_cast<size_t>(static_cast<const char*>(nul) - text);
    HeaderError(path, fmt::format("expected JSON padded with spaces, got a NUL byte at byte {} of "
                                  "the header (file offset {})",
                                  at, at + 8));
  }
  Json header;
  try {
    header = Json::parse(text, text + length, callback);
  } catch (const Json::parse_error& e) {
    HeaderError(path, fmt::format("expected JSON, got a parse error at byte {} of the header "
                                  "(file offset {}): {}",
                                  e.byte, e.byte + 8, JsonReason(e, /*drop_position=*/true)));
  } catch (const Json::exception& e) {  // a number out of range (1e400), ...
    HeaderError(path, fmt::format("expected JSON that fits: {}", JsonReason(e)));
  }
  if (!header.is_object()) HeaderError(path, "expected a JSON object, got " + Describe(header));
  if (!duplicate.empty()) TensorError(path, duplicate, "expected one entry, got two");

  std::vector<std::pair<const TensorInfo*, const std::string*>> by_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        HeaderError(path, "__metadata__: expected an object of strings, got " + Describe(entry));
      }
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          HeaderError(path, fmt::format("__metadata__: {}: expected a string, got {}",
                                        Quoted(m.key()), Describe(m.value())));
        }
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) TensorError(path, name, "expected an object, got " + Describe(entry));
    TensorInfo info;

    auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string()) {
      TensorError(path, name,
                  "dtype: expected a string, got " +
                      (dtype == entry.end() ? std::string("no dtype") : Describe(*dtype)));
    }
    info.dtype = dtype->get<std::string>();
    const DtypeInfo* dtype_info = FindDtype(info.dtype);
    if (dtype_info == nullptr) {
      TensorError(path, name,
                  fmt::format("dtype: expected one of BOOL, U8, I8, F8_E5M2, F8_E4M3, "
                              "I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, got {}",
                              Quoted(info.dtype)));
    }

    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) {
      TensorError(path, name,
                  "shape: expected an array of non-negative integers, got " +
                      (shape == entry.end() ? std::string("no shape") : Describe(*shape)));
    }
    uint64_t numel = 1;
    for (const Json& dim : *shape) {
      uint64_t d = 0;
      if (!AsCount(dim, d)) {
        TensorError(path, name,
                    fmt::format("shape: expected non-negative integers, got {} in {}",
                                Describe(dim), Shown(*shape)));
      }
      if (__builtin_mul_overflow(numel, d, &numel)) {
        TensorError(path, name,
                    "shape: expected a size that fits in 64 bits, got " + Shown(*shape));
      }
      info.shape.push_back(static_cast<int64_t>(d));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_info->itemsize), &nbytes)) {
      TensorError(path, name, "shape: expected a size that fits in 64 bits, got " + Shown(*shape));
    }

    auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !AsCount((*offsets)[0], info.begin) || !AsCount((*offsets)[1], info.end)) {
      TensorError(path, name,
                  "data_offsets: expected [begin, end] (non-negative integers), got " +
                      (offsets == entry.end() ? std::string("none") : Shown(*offsets)));
    }
    if (info.begin > info.end) {
      TensorError(
          path, name,
          fmt::format("data_offsets: expected begin <= end, got [{}, {}]", info.begin, info.end));
    }
    if (info.end > data_size) {
      TensorError(path, name,
                  fmt::format("data_offsets: expected end <= {} (the data section's "
                              "size: truncated file?), got [{}, {}]",
                              data_size, info.begin, info.end));
    }
    if (info.end - info.begin != nbytes) {
      TensorError(path, name,
                  fmt::format("data_offsets: expected {} bytes ({} {} of shape {}), "
                              "got [{}, {}] ({} bytes)",
                              nbytes, numel, info.dtype, ShapeString(info.shape), info.begin,
                              info.end, info.end - info.begin));
    }
    auto [slot, inserted] = tensors.emplace(name, std::move(info));
    (void)inserted;
    if (slot->second.end > slot->second.begin) by_offset.emplace_back(&slot->second, &slot->first);
  }

  // No two tensors share bytes (empty tensors own none).
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return a.first->begin != b.first->begin ? a.first->begin < b.first->begin
                                            : a.first->end < b.first->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1].first;
    const TensorInfo& cur = *by_offset[i].first;
    if (cur.begin < prev.end) {
      TensorError(
          path, *by_offset[i].second,
          fmt::format("data_offsets: expected bytes no other tensor uses, got [{}, {}], "
                      "which overlaps tensor {} at [{}, {}]",
                      cur.begin, cur.end, Quoted(*by_offset[i - 1].second), prev.begin, prev.end));
    }
  }
  // Every byte of the data section belongs to a tensor, as the format requires (no holes, nothing
  // after the last tensor: the reference reader refuses such a file, "not fully covered").
  uint64_t covered = 0;
  for (const auto& [info, name] : by_offset) {
    if (info->begin != covered) {
      TensorError(path, *name,
                  fmt::format("data_offsets: expected the tensors to cover the data section "
                              "without holes (the safetensors format), got [{}, {}], after bytes "
                              "[{}, {}) that no tensor uses: a damaged or hand-made file",
                              info->begin, info->end, covered, info->begin));
    }
    covered = info->end;
  }
  if (covered != data_size) {
    HeaderError(path,
                fmt::format("expected the tensors to cover the data section ({} bytes), got "
                            "{} byte{} after the last tensor that no tensor uses (the "
                            "safetensors format allows none: a damaged or appended file)",
                            data_size, data_size - covered, data_size - covered == 1 ? "" : "s"));
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->Open();  // on a throw, ~Impl unmaps
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const std::string& SafetensorsFile::path() const { return impl_->path; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->tensors.size());
  for (const auto& [name, info] : impl_->tensors) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return impl_->tensors.count(name) != 0;
}

const std::vector<int64_t>& SafetensorsFile::shape(const std::string& name) const {
  return impl_->Find(name).shape;
}

const std::string& SafetensorsFile::dtype(const std::string& name) const {
  return impl_->Find(name).dtype;
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}

at::Tensor SafetensorsFile::Tensor(const std::string& name, at::ScalarType to) const {
  const TensorInfo& info = impl_->Find(name);
  const at::ScalarType source = FindDtype(info.dtype)->scalar;
  // Integer tensors (token ids of test fixtures) are read as integers only.
  const bool integers = at::isIntegralType(source, /*includeBool=*/false) &&
                        at::isIntegralType(to, /*includeBool=*/false);
  if (!IsWeightDtype(info.dtype) && !integers) {
    TensorError(impl_->path, name,
                fmt::format("expected dtype F32, F16 or BF16 (weights), got {}", info.dtype));
  }
  // Copied into an aligned tensor first: data offsets need not be multiples of the item size.
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(source));
  const size_t nbytes = static_cast<size_t>(info.end - info.begin);
  if (nbytes > 0) std::memcpy(t.data_ptr(), impl_->data + info.begin, nbytes);
  return source == to ? t : t.to(to);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsDir

SafetensorsDir::SafetensorsDir(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (IsPresent(single)) {
    source_ = single.string();
    files_.emplace_back(source_);
  } else if (IsPresent(index)) {
    source_ = index.string();
    if (!fs::is_regular_file(index, ec)) {  // a FIFO would block the read, a device never end
      throw WeightsError(fmt::format(
          "{}: not a regular file (a directory, device or pipe); expected the JSON index of a "
          "sharded checkpoint",
          source_));
    }
    Json json;
    // The DOM parser keeps the last of duplicate keys: a tensor the index maps twice (to two
    // shards, say) is an error here, as a duplicate in a header is.
    std::string top_key, duplicate;
    std::set<std::string> mapped;
    const auto bounded = [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (depth > kMaxJsonDepth) throw WeightsError(source_ + ": " + JsonTooDeep());
      if (event == Json::parse_event_t::key && depth == 1) top_key = parsed.get<std::string>();
      if (event == Json::parse_event_t::key && depth == 2 && top_key == "weight_map" &&
          !mapped.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    };
    try {
      json = Json::parse(ReadTextFile(source_), bounded);
    } catch (const Json::parse_error& e) {
      throw WeightsError(fmt::format("{}: expected JSON, got a {}", source_, JsonReason(e)));
    } catch (const Json::exception& e) {  // a number out of range (1e400), ...
      throw WeightsError(fmt::format("{}: expected JSON that fits: {}", source_, JsonReason(e)));
    }
    if (!duplicate.empty()) {
      throw WeightsError(fmt::format("{}: weight_map: tensor {}: expected one entry, got two",
                                     source_, Quoted(duplicate)));
    }
    auto weight_map = json.is_object() ? json.find("weight_map") : json.end();
    if (!json.is_object() || weight_map == json.end() || !weight_map->is_object()) {
      throw WeightsError(fmt::format(
          "{}: weight_map: expected an object (tensor name -> shard file), got {}", source_,
          !json.is_object()          ? Describe(json)
          : weight_map == json.end() ? "no weight_map"
                                     : Describe(*weight_map)));
    }
    // Shard file names in the index, in order of first appearance in sorted tensor order.
    std::map<std::string, size_t> shard_index;
    std::vector<std::pair<std::string, std::string>> listed;  // tensor, shard
    for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
      const std::string& name = it.key();
      if (!it.value().is_string()) {
        throw WeightsError(
            fmt::format("{}: weight_map: tensor {}: expected a shard file name, "
                        "got {}",
                        source_, Quoted(name), Describe(it.value())));
      }
      const std::string shard = it.value().get<std::string>();
      const fs::path shard_path(shard);
      bool escapes = shard.empty() || shard_path.is_absolute();
      for (const auto& part : shard_path) escapes = escapes || part == "..";
      if (escapes) {
        throw WeightsError(
            fmt::format("{}: weight_map: tensor {}: expected a file name relative "
                        "to {}, got {}",
                        source_, Quoted(name), dir, Quoted(shard)));
      }
      const std::string full = (fs::path(dir) / shard_path).string();
      if (!IsPresent(full) || !fs::is_regular_file(full, ec)) {
        throw WeightsError(
            fmt::format("{}: weight_map: tensor {}: expected shard file {} to exist, got {}",
                        source_, Quoted(name), full,
                        fs::exists(full, ec) ? "no regular file (a directory, device or pipe)"
                                             : "no such file"));
      }
      if (shard_index.emplace(full, files_.size()).second) files_.emplace_back(full);
      listed.emplace_back(name, full);
    }
    // Every tensor the index lists is in its shard (the owner check below finds duplicates).
    for (const auto& [name, shard] : listed) {
      if (!files_[shard_index.at(shard)].contains(name)) {
        TensorError(shard, name,
                    fmt::format("expected it here ({} lists it in this shard), got no such tensor",
                                source_));
      }
    }
  } else {
    RefuseDanglingLink(single);  // as transformers, one that dangles beside an index is not used
    RefuseDanglingLink(index);
    throw WeightsError(
        fmt::format("{}: expected model.safetensors or "
                    "model.safetensors.index.json, got neither",
                    dir));
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    for (const std::string& name : files_[i].names()) {
      auto [it, inserted] = owner_.emplace(name, i);
      if (!inserted) {
        TensorError(files_[i].path(), name,
                    fmt::format("expected each tensor in one shard, got it also in {}",
                                files_[it->second].path()));
      }
    }
  }
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, file] : owner_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsDir::FileOf(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) TensorError(source_, name, "expected a tensor of that name, got none");
  return files_[it->second];
}

const std::string& SafetensorsDir::file_of(const std::string& name) const {
  return FileOf(name).path();
}
const std::vector<int64_t>& SafetensorsDir::shape(const std::string& name) const {
  return FileOf(name).shape(name);
}
const std::string& SafetensorsDir::dtype(const std::string& name) const {
  return FileOf(name).dtype(name);
}
at::Tensor SafetensorsDir::Tensor(const std::string& name, at::ScalarType to) const {
  return FileOf(name).Tensor(name, to);
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

// Writes all of [data, data + n) to fd; false with errno set on failure.
bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = EIO;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

const char* DtypeName(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.scalar == t) return d.name;
  }
  return nullptr;
}

}  // namespace

void WriteSafetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // The header, in the given order, "__metadata__" first.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__" || header.contains(name)) {
      TensorError(path, name,
                  "expected a unique, non-empty name other than __metadata__, got a "
                  "repeated or reserved one");
    }
    if (!tensor.defined() || tensor.layout() != at::kStrided) {
      TensorError(path, name, "expected a defined dense tensor, got an undefined or sparse one");
    }
    const char* dtype = DtypeName(tensor.scalar_type());
    if (dtype == nullptr) {
      TensorError(path, name,
                  fmt::format("expected a dtype safetensors can hold, got {}",
                              c10::toString(tensor.scalar_type())));
    }
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    const uint64_t nbytes = contiguous.back().nbytes();
    header[name] = {{"dtype", dtype},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t header_length = text.size();

  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const auto fail = [&](const std::string& what, int err, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw WeightsError(fmt::format("{}: {} ({}): {}", path, what, tmp, DescribeWriteError(err)));
  };
  const int fd = CreateFileForWriting(tmp);
  if (fd < 0) {
    const int err = errno;
    throw WeightsError(
        fmt::format("{}: cannot create the temporary {}: {}", path, tmp, DescribeWriteError(err)));
  }
  uint8_t length_bytes[8];
  std::memcpy(length_bytes, &header_length, 8);  // little-endian host
  if (!WriteAll(fd, length_bytes, 8) || !WriteAll(fd, text.data(), text.size())) {
    fail("cannot write", errno, fd);
  }
  for (const at::Tensor& t : contiguous) {
    if (t.nbytes() > 0 && !WriteAll(fd, t.data_ptr(), t.nbytes())) fail("cannot write", errno, fd);
  }
  if (::fsync(fd) != 0) fail("cannot fsync", errno, fd);
  if (::close(fd) != 0) fail("cannot close", errno, -1);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename the temporary", errno, -1);
  // The rename is durable once the directory is synced. Some filesystems cannot fsync a
  // directory (EINVAL); the data itself is then as durable as that filesystem allows (as
  // WriteFileAtomically's).
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int synced = ::fsync(dir_fd);
    const int err = errno;
    ::close(dir_fd);
    if (synced != 0 && err != EINVAL) {
      throw WeightsError(fmt::format("{}: written, but cannot fsync its directory {}: {}", path,
                                     dir.string(), DescribeWriteError(err)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Modules

namespace {

bool IsIgnorable(const std::string& name, const std::set<std::string>& ignorable) {
  if (ignorable.count(name) != 0) return true;
  for (const std::string& pattern : ignorable) {
    if (pattern.empty() || pattern[0] != '*') continue;
    const size_t n = pattern.size() - 1;
    if (name.size() >= n && name.compare(name.size() - n, n, pattern, 1, n) == 0) return true;
  }
  return false;
}

std::vector<std::pair<std::string, at::Tensor>> NamedTensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace

void LoadModuleFromHf(const std::string& hf_dir, torch::nn::Module& module,
                      const std::set<std::string>& ignorable, const HfNaming& naming) {
  const SafetensorsDir weights(hf_dir);
  // Each tensor of the module with its name in the files and whether they hold its transpose.
  struct Target {
    std::string file_name;
    bool transpose;
    at::Tensor tensor;
    std::string module_name;
  };
  std::vector<Target> targets;
  for (auto& [name, tensor] : NamedTensors(module)) {
    std::pair<std::string, bool> hf{name, false};
    if (naming.rename) {
      const auto renamed = naming.rename(name);
      if (!renamed) continue;
      hf = *renamed;
    }
    const std::string prefix = naming.base_prefix.empty() ? "" : naming.base_prefix + ".";
    if (!prefix.empty() && !weights.contains(hf.first) && hf.first.rfind(prefix, 0) == 0 &&
        weights.contains(hf.first.substr(prefix.size()))) {
      hf.first = hf.first.substr(prefix.size());
    }
    targets.push_back({hf.first, hf.second, tensor, name});
  }

  // A tied tensor the files keep under its copy's name alone: safetensors' save_model (and so
  // some published checkpoints) keeps one name of a tied pair, the lm_head's where it sorts
  // first, and transformers ties the two again on load.
  for (Target& t : targets) {
    if (weights.contains(t.file_name)) continue;
    for (const auto& [copy, source] : naming.tied_copies) {
      if (t.module_name == source && weights.contains(copy)) {
        t.file_name = copy;
        break;
      }
    }
  }
  std::set<std::string> wanted;
  std::vector<std::string> missing;
  for (const Target& t : targets) {
    wanted.insert(t.file_name);
    if (!weights.contains(t.file_name)) missing.push_back(t.file_name);
  }
  if (!missing.empty()) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) shown.push_back(Quoted(missing[i]));
    throw WeightsError(fmt::format(
        "{}: expected every parameter and buffer of the module, got {} missing: {}{} (the "
        "architecture in config.json does not match the weights?)",
        weights.source(), missing.size(), fmt::join(shown, ", "),
        missing.size() > shown.size() ? fmt::format(" and {} more", missing.size() - shown.size())
                                      : ""));
  }
  // The tied copies the files hold, each with the file name of the tensor it must equal.
  std::vector<std::pair<std::string, std::string>> copies;
  for (const auto& [copy, source] : naming.tied_copies) {
    if (wanted.count(copy) != 0 || !weights.contains(copy)) continue;
    for (const Target& t : targets) {
      if (t.module_name == source) copies.push_back({copy, t.file_name});
    }
  }
  auto is_copy = [&copies](const std::string& name) {
    for (const auto& c : copies) {
      if (c.first == name) return true;
    }
    return false;
  };
  for (const std::string& name : weights.names()) {
    if (wanted.count(name) == 0 && !IsIgnorable(name, ignorable) && !is_copy(name)) {
      TensorError(weights.file_of(name), name,
                  "unexpected tensor: the module has no parameter or buffer of that name (the "
                  "architecture in config.json does not match the weights?)");
    }
  }
  // Every check before the first copy: a throw leaves the module untouched.
  for (const Target& t : targets) {
    const auto& shape = weights.shape(t.file_name);
    const at::Tensor expected = t.transpose ? t.tensor.t() : t.tensor;
    if (!expected.sizes().equals(shape)) {
      TensorError(weights.file_of(t.file_name), t.file_name,
                  fmt::format("expected shape {} (the module's{}), got {} (the architecture in "
                              "config.json does not match the weights?)",
                              ShapeString(expected.sizes()), t.transpose ? ", transposed" : "",
                              ShapeString(shape)));
    }
    if (!IsWeightDtype(weights.dtype(t.file_name))) {
      TensorError(weights.file_of(t.file_name), t.file_name,
                  fmt::format("expected dtype F32, F16 or BF16 (weights), got {}",
                              weights.dtype(t.file_name)));
    }
  }
  // One converted CPU temporary at a time (a second copy of a whole large model would not fit).
  at::NoGradGuard no_grad;
  for (const auto& [copy, source] : copies) {
    const std::string tied = fmt::format(
        "the module ties it to {} (config.json: \"tie_word_embeddings\": true), and transformers "
        "would load the two untied, another model: set \"tie_word_embeddings\": false in "
        "config.json to train with both, or delete {} from the file if the tie is what was meant",
        Quoted(source), Quoted(copy));
    if (weights.shape(copy) != weights.shape(source)) {
      TensorError(
          weights.file_of(copy), copy,
          fmt::format("expected the shape of {}, {}, got {}; {}", Quoted(source),
                      ShapeString(weights.shape(source)), ShapeString(weights.shape(copy)), tied));
    }
    if (!IsWeightDtype(weights.dtype(copy))) {
      TensorError(
          weights.file_of(copy), copy,
          fmt::format("expected dtype F32, F16 or BF16 (weights), got {}", weights.dtype(copy)));
    }
    // In the files' dtype where both have the same (two tensors of it, no temporaries: the
    // embedding of a large vocabulary is gigabytes); the details only for an error.
    {
      const std::string& dtype = weights.dtype(copy);
      const at::ScalarType common = dtype == weights.dtype(source) && dtype == "BF16"
                                        ? at::kBFloat16
                                    : dtype == weights.dtype(source) && dtype == "F16" ? at::kHalf
                                                                                       : at::kFloat;
      if (at::equal(weights.Tensor(copy, common), weights.Tensor(source, common))) continue;
    }
    const at::Tensor a = weights.Tensor(copy, at::kFloat).reshape({-1});
    const at::Tensor b = weights.Tensor(source, at::kFloat).reshape({-1});
    const at::Tensor differ = a.ne(b).logical_and(a.isnan().logical_and(b.isnan()).logical_not());
    const int64_t count = differ.sum().item<int64_t>();
    if (count > 0) {
      const int64_t first = differ.to(at::kByte).argmax().item<int64_t>();
      TensorError(weights.file_of(copy), copy,
                  fmt::format("expected a copy of {}, got {} of {} values different (the first at "
                              "flat index {}: {} against {}); {}",
                              Quoted(source), count, a.numel(), first, a[first].item<double>(),
                              b[first].item<double>(), tied));
    }
  }
  // Finite values only (a NaN row of an embedding is used by no training batch that lacks its
  // token, and would surface as a NaN evaluation or a NaN step much later): a read of its own
  // before the first copy, so that a throw still leaves the module untouched.
  for (const Target& target : targets) {
    const at::Tensor t = weights.Tensor(target.file_name, target.tensor.scalar_type());
    const at::Tensor bad = at::logical_not(at::isfinite(t)).reshape({-1});
    const int64_t count = bad.sum().item<int64_t>();
    if (count > 0) {
      const int64_t first = bad.to(at::kByte).argmax().item<int64_t>();  // the first true
      TensorError(weights.file_of(target.file_name), target.file_name,
                  fmt::format("expected finite values, got {} NaN or infinite (the first at flat "
                              "index {}: {}); the file is damaged or the model diverged",
                              count, first, t.reshape({-1})[first].item<double>()));
    }
  }
  for (const Target& target : targets) {
    const at::Tensor t = weights.Tensor(target.file_name, target.tensor.scalar_type());
    target.tensor.copy_(target.transpose ? t.t() : t);
  }
}

void SaveModuleAsHf(const std::string& path, const torch::nn::Module& module,
                    at::ScalarType dtype) {
  auto tensors = NamedTensors(module);
  for (auto& [name, t] : tensors) {
    if (at::isFloatingType(t.scalar_type())) t = t.detach().to(dtype);
  }
  WriteSafetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace distill

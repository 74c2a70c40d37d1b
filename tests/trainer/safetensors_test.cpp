// safetensors: round trips, the writer's exact layout, the reader against hand-built malformed
// files (every error names the file and the tensor), sharded directories, and module loading
// that checks everything before it copies anything.
#include "distill/safetensors.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distill/file_io.h"
#include "distill/profile.h"
#include "distill/token_shards.h"
#include "test_files.h"

namespace distill {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A fresh, empty directory named after the running test.
std::string TempDir() { return testing::FreshTestDir("distill_st_"); }
using testing::Names;
using testing::ReadBytes;
using testing::WriteBytes;

std::string U64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file by hand: the header text as given (no padding) and `data` bytes.
std::string HandFile(const std::string& dir, const std::string& header, const std::string& data,
                     const std::string& name = "hand.safetensors") {
  const std::string path = dir + "/" + name;
  WriteBytes(path, U64(header.size()) + header + data);
  return path;
}

// The message of the WeightsError `f` throws ("" and a failure when it throws none).
std::string ErrorOf(const std::function<void()>& f) { return testing::ErrorOf<WeightsError>(f); }
using testing::ExpectContains;

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes().equals(b.sizes()) &&
         a.nbytes() == b.nbytes() &&
         // An empty tensor's data_ptr may be null: memcmp(nullptr, ..., 0) is undefined (UBSan).
         (a.nbytes() == 0 ||
          std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0);
}

TEST(Safetensors, RoundTripIsBitExactPerDtype) {
  const std::string dir = TempDir();
  at::manual_seed(0);
  const at::Tensor base = at::randn({3, 5}) * 100;
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", base},
      {"f16", base.to(at::kHalf)},
      {"bf16", base.to(at::kBFloat16)},
      {"scalar", at::full({}, 2.5)},
      {"empty", at::zeros({0, 4}, at::kHalf)},
      {"strided", base.t()},  // non-contiguous: saved contiguous
  };
  const std::string path = dir + "/model.safetensors";
  WriteSafetensors(path, tensors, {{"format", "pt"}, {"k", "v"}});

  const SafetensorsFile file(path);
  EXPECT_EQ(file.names(),
            (std::vector<std::string>{"bf16", "empty", "f16", "f32", "scalar", "strided"}));
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
  EXPECT_EQ(file.dtype("f32"), "F32");
  EXPECT_EQ(file.dtype("f16"), "F16");
  EXPECT_EQ(file.dtype("bf16"), "BF16");
  EXPECT_EQ(file.shape("strided"), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(file.shape("scalar"), std::vector<int64_t>{});
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = file.Tensor(name, t.scalar_type());
    EXPECT_TRUE(SameBytes(back, t.contiguous())) << name;
    EXPECT_TRUE(back.is_contiguous()) << name;
  }
  // Converted on the way: F16 / BF16 -> F32 is exact.
  EXPECT_TRUE(SameBytes(file.Tensor("bf16"), base.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(SameBytes(file.Tensor("f16", at::kBFloat16), base.to(at::kHalf).to(at::kBFloat16)));
}

// A link where the writer puts its temporary (a stale one, or planted) is replaced, never written
// through: its target keeps its bytes, and the file written is a plain file. The same holds for
// every run file (WriteFileAtomically) and token shard.
TEST(Safetensors, WritersNeverWriteThroughALinkAtTheirTemporary) {
  const std::string dir = TempDir();
  const std::string victim = dir + "/victim";
  WriteBytes(victim, "not yours");
  const std::string weights = dir + "/w.safetensors";
  fs::create_symlink(victim, weights + ".tmp." + std::to_string(::getpid()));
  WriteSafetensors(weights, {{"t", at::arange(4, at::kFloat)}});
  const std::string summary = dir + "/summary.json";
  fs::create_symlink(victim, summary + ".tmp");
  WriteFileAtomically(summary, std::string("{}"));
  const std::string shard = dir + "/train_000000.bin";
  fs::create_symlink(victim, shard + ".tmp." + std::to_string(::getpid()));
  WriteTokenShard(shard, {1, 2, 3}, false);
  EXPECT_EQ(ReadBytes(victim), "not yours");
  for (const auto& path : {weights, summary, shard}) {
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path))) << path;
  }
  EXPECT_EQ(ReadBytes(summary), "{}");
  EXPECT_TRUE(SameBytes(SafetensorsFile(weights).Tensor("t"), at::arange(4, at::kFloat)));
  EXPECT_EQ(Names(dir), (std::vector<std::string>{"summary.json", "train_000000.bin", "victim",
                                                  "w.safetensors"}));
}

// A writer that only takes a path (Kineto's trace) goes through a checked temporary: the file is
// replaced whole when the writer succeeds, and kept as it was (no temporary left, the message
// naming the file and the writer's problem) when it fails or throws; a planted link is not
// written through.
TEST(Safetensors, AWriterThatTakesAPathReplacesTheFileWholeOrNotAtAll) {
  const std::string dir = TempDir();
  const std::string trace = dir + "/trace.json";
  WriteBytes(trace, "{\"old\": 1}");
  const std::string victim = dir + "/victim";
  WriteBytes(victim, "not yours");
  fs::create_symlink(victim, trace + ".tmp." + std::to_string(::getpid()));
  std::string given;
  WriteFileAtomicallyBy(trace, [&](const std::string& tmp) {
    given = tmp;
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(tmp))) << tmp;
    WriteBytes(tmp, "{\"new\": 2}");
    return std::string();
  });
  EXPECT_EQ(given, trace + ".tmp." + std::to_string(::getpid()));
  EXPECT_EQ(ReadBytes(trace), "{\"new\": 2}");
  EXPECT_EQ(ReadBytes(victim), "not yours");
  const auto cut = [&](const std::string& tmp) {
    WriteBytes(tmp, "{\"cut");
    return std::string("the profiler wrote 5 bytes, not a whole JSON trace");
  };
  ExpectContains(testing::ErrorOf<FileError>([&] { WriteFileAtomicallyBy(trace, cut); }),
                 {"cannot write " + trace +
                  ": the profiler wrote 5 bytes, not a whole JSON trace; the previous file, if "
                  "any, is unchanged"});
  ExpectContains(testing::ErrorOf<FileError>([&] {
                   WriteFileAtomicallyBy(trace, [](const std::string&) -> std::string {
                     throw std::runtime_error("no space");
                   });
                 }),
                 {"cannot write " + trace + ": no space"});
  EXPECT_EQ(ReadBytes(trace), "{\"new\": 2}");
  EXPECT_EQ(Names(dir), (std::vector<std::string>{"trace.json", "victim"}));
}

// The check of what Kineto wrote before its trace is renamed into place.
TEST(Safetensors, ATraceIsWholeOnlyWithItsClosingBracket) {
  const std::string dir = TempDir();
  const std::string trace = dir + "/trace.json";
  WriteBytes(trace, "{\"traceEvents\": [{}]}\n\n");
  EXPECT_EQ(TraceFileProblem(trace), "");
  WriteBytes(trace, "[{}]");
  EXPECT_EQ(TraceFileProblem(trace), "");
  WriteBytes(trace, "{\"traceEvents\": [{\"na");
  EXPECT_EQ(TraceFileProblem(trace),
            "the profiler wrote 21 bytes, not a whole JSON trace (is the disk full?)");
  WriteBytes(trace, "");
  EXPECT_EQ(TraceFileProblem(trace),
            "the profiler wrote 0 bytes, not a whole JSON trace (is the disk full?)");
  EXPECT_EQ(TraceFileProblem(dir + "/absent.json"),
            "the profiler wrote 0 bytes, not a whole JSON trace (is the disk full?)");
}

TEST(Safetensors, OwnedCopyOutlivesTheMapping) {
  const std::string dir = TempDir();
  const at::Tensor t = at::arange(10, at::kFloat);
  WriteSafetensors(dir + "/a.safetensors", {{"t", t}});
  at::Tensor back;
  {
    const SafetensorsFile file(dir + "/a.safetensors");
    back = file.Tensor("t");
  }
  fs::remove(dir + "/a.safetensors");
  EXPECT_TRUE(SameBytes(back, t));
}

TEST(Safetensors, WriterLayoutByTheBook) {
  const std::string dir = TempDir();
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor b =
      at::arange(3, at::kFloat).to(at::kHalf);  // 6 bytes: the next offset is odd-free
  const at::Tensor c = at::arange(2, at::kInt);
  const std::string path = dir + "/w.safetensors";
  WriteSafetensors(path, {{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}});

  const std::string bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 24 + 6 + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1)
      << "the padding is spaces after the JSON";
  const Json json = Json::parse(header);
  EXPECT_EQ(json["__metadata__"], (Json{{"format", "pt"}}));
  EXPECT_EQ(json["a"], (Json{{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}));
  EXPECT_EQ(json["b"], (Json{{"dtype", "F16"}, {"shape", {3}}, {"data_offsets", {24, 30}}}));
  EXPECT_EQ(json["c"], (Json{{"dtype", "I32"}, {"shape", {2}}, {"data_offsets", {30, 38}}}));
  EXPECT_EQ(header.find("__metadata__"), 2u) << "metadata first, then the tensors in order";
  EXPECT_LT(header.find("\"a\""), header.find("\"b\""));
  EXPECT_LT(header.find("\"b\""), header.find("\"c\""));
  const char* data = bytes.data() + 8 + n;
  EXPECT_EQ(std::memcmp(data, a.data_ptr(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 24, b.data_ptr(), 6), 0);
  EXPECT_EQ(std::memcmp(data + 30, c.data_ptr(), 8), 0);
}

TEST(Safetensors, WriterRejectsDuplicateNames) {
  const std::string dir = TempDir();
  const std::string path = dir + "/d.safetensors";
  ExpectContains(ErrorOf([&] {
                   WriteSafetensors(path, {{"x", at::ones({1})}, {"x", at::ones({1})}});
                 }),
                 {path, "\"x\""});
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, TruncatedAtEveryByteIsAnError) {
  const std::string dir = TempDir();
  const std::string full_path = dir + "/full.safetensors";
  WriteSafetensors(full_path, {{"w", at::arange(4, at::kFloat)}, {"v", at::ones({3}, at::kHalf)}});
  const std::string full = ReadBytes(full_path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(full[i]);
  const std::string path = dir + "/cut.safetensors";
  for (size_t size = 0; size < full.size(); ++size) {
    SCOPED_TRACE("cut at " + std::to_string(size));
    WriteBytes(path, full.substr(0, size));
    const std::string message = ErrorOf([&] { SafetensorsFile file(path); });
    ExpectContains(message, {path});
    if (size < 8) {
      ExpectContains(message, {"header", "at least 8 bytes"});
    } else if (size < 8 + n) {
      ExpectContains(message, {"header", "truncated"});
    } else {
      // Inside the data: the last tensor ("v", written second) no longer fits.
      ExpectContains(message, {"tensor \"v\"", "data_offsets", "truncated"});
    }
  }
  EXPECT_NO_THROW(SafetensorsFile{full_path});
  // A FIFO (no writer) is refused at once, not waited on.
  ASSERT_EQ(::mkfifo((dir + "/fifo.safetensors").c_str(), 0600), 0);
  ExpectContains(ErrorOf([&] { SafetensorsFile file(dir + "/fifo.safetensors"); }),
                 {"fifo.safetensors", "expected a regular file"});
}

TEST(Safetensors, HeaderLengthPastTheFileOrAbsurd) {
  const std::string dir = TempDir();
  const std::string path = dir + "/len.safetensors";
  WriteBytes(path, U64(100) + std::string("{}      "));
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }), {path, "header", "100"});
  WriteBytes(path, U64(uint64_t{1} << 63) + std::string("{}      "));
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }),
                 {path, "header", "9223372036854775808"});
  WriteBytes(path, U64(~uint64_t{0}) + std::string("{}"));
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }), {path, "header"});
}

TEST(Safetensors, InvalidJsonAndNonObjectHeader) {
  const std::string dir = TempDir();
  std::string path = HandFile(dir, "{\"w\": {\"dtype\": ", "");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }),
                 {path, "header",
                  "parse error at byte 17 of the header (file offset 25): "
                  "syntax error while parsing value"});
  EXPECT_EQ(ErrorOf([&] { SafetensorsFile file(path); }).find("json.exception"), std::string::npos);
  path = HandFile(dir, "[1, 2]", "");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }), {path, "header", "JSON object"});
  path = HandFile(dir, "", "");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }), {path, "header"});
  // An empty object is a valid file without tensors.
  path = HandFile(dir, "{}", "");
  EXPECT_TRUE(SafetensorsFile(path).names().empty());
}

// A header is input: nested past any real file (a shape of [[[...]]] 10^5 deep overflowed the
// stack in the message that quoted it), a number past double, and bytes after a NUL (where the
// parser stops) are refused, naming the file; a long shape is quoted cut short.
TEST(Safetensors, HostileHeadersAreRefusedNamingTheFile) {
  const std::string dir = TempDir();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string path = HandFile(
      dir, "{\"w\": {\"dtype\": \"F32\", \"shape\": " + deep + ", \"data_offsets\": [0, 4]}}",
      std::string(4, '\0'));
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }),
                 {path, "header", "nested at most 64 levels deep"});
  path =
      HandFile(dir, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1e400], \"data_offsets\": [0, 4]}}",
               std::string(4, '\0'));
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }), {path, "header", "fits"});
  path = HandFile(dir, std::string("{}") + '\0' + "garbage{{{", "");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }),
                 {path, "header", "NUL byte at byte 2 of the header (file offset 10)"});
  std::string dims = "[1";
  for (int i = 0; i < 100000; ++i) dims += ", 0.5";
  path = HandFile(
      dir, "{\"w\": {\"dtype\": \"F32\", \"shape\": " + dims + "], \"data_offsets\": [0, 4]}}",
      std::string(4, '\0'));
  const std::string message = ErrorOf([&] { SafetensorsFile file(path); });
  ExpectContains(message, {path, "tensor \"w\"", "shape: expected non-negative integers"});
  EXPECT_LT(message.size(), 400u) << message;
}

TEST(Safetensors, EntryErrorsNameTheTensor) {
  const std::string dir = TempDir();
  struct Case {
    std::string header;
    std::string data;
    std::vector<std::string> expect;
  };
  const std::string d16(16, '\0');
  const std::vector<Case> cases = {
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 20]}})",
       d16,
       {"data_offsets", "end <= 16", "[0, 20]"}},
      {R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
       d16,
       {"data_offsets", "expected 16 bytes", "12 bytes"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", d16, {"begin <= end"}},
      {R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})",
       d16,
       {"shape", "non-negative integers", "-1"}},
      {R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
       d16,
       {"shape", "non-negative integers", "2.5"}},
      {R"({"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})",
       d16,
       {"shape", "\"2\""}},
      {R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", d16, {"shape"}},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", d16, {"shape"}},
      {R"({"w": {"dtype": "F12", "shape": [2], "data_offsets": [0, 8]}})",
       d16,
       {"dtype", "\"F12\"", "BF16"}},
      {R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", d16, {"dtype"}},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", d16, {"data_offsets"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", d16, {"data_offsets"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", d16, {"data_offsets"}},
      {R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 8]}})",
       d16,
       {"shape", "64 bits"}},
      {R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 8]}})",
       d16,
       {"shape", "64 bits"}},
      {R"({"w": [1, 2]})", d16, {"expected an object"}},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       d16,
       {"one entry"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].header);
    const std::string path = HandFile(dir, cases[i].header, cases[i].data);
    const std::string message = ErrorOf([&] { SafetensorsFile file(path); });
    ExpectContains(message, {path, "tensor \"w\""});
    for (const auto& part : cases[i].expect) ExpectContains(message, {part});
  }
}

TEST(Safetensors, OverlappingTensorsNameBoth) {
  const std::string dir = TempDir();
  const std::string path =
      HandFile(dir,
               R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
               std::string(24, '\0'));
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }),
                 {path, "tensor \"b\"", "overlaps tensor \"a\""});
  // Empty tensors own no bytes; out-of-order offsets and unaligned ones are fine.
  const std::string ok = HandFile(dir,
                                  R"({"a": {"dtype": "F16", "shape": [2], "data_offsets": [6, 10]},
          "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
          "c": {"dtype": "U8", "shape": [6], "data_offsets": [0, 6]}})",
                                  std::string(10, '\0'), "ok.safetensors");
  const SafetensorsFile file(ok);
  EXPECT_EQ(file.names().size(), 3u);
  EXPECT_TRUE(SameBytes(file.Tensor("a", at::kHalf), at::zeros({2}, at::kHalf)));
}

// The data section is covered by the tensors, without holes and without bytes after the last
// one, as the format says (the reference reader refuses such files too).
TEST(Safetensors, BytesNoTensorUsesAreRefused) {
  const std::string dir = TempDir();
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const std::string trailing = HandFile(dir, header, std::string(9, '\0'), "trailing.safetensors");
  EXPECT_EQ(ErrorOf([&] { SafetensorsFile file(trailing); }),
            trailing +
                ": header: expected the tensors to cover the data section (9 bytes), got 1 byte "
                "after the last tensor that no tensor uses (the safetensors format allows none: a "
                "damaged or appended file)");
  const std::string hole = HandFile(dir,
                                    R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                                    std::string(12, '\0'), "hole.safetensors");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(hole); }),
                 {hole, "tensor \"b\"", "after bytes [4, 8) that no tensor uses"});
  const std::string leading =
      HandFile(dir, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
               std::string(8, '\0'), "leading.safetensors");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(leading); }),
                 {leading, "tensor \"a\"", "after bytes [0, 4) that no tensor uses"});
  // Only empty tensors: an empty data section.
  const SafetensorsFile empty(
      HandFile(dir, R"({"e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}})", "",
               "empty.safetensors"));
  EXPECT_EQ(empty.names().size(), 1u);
}

TEST(Safetensors, MetadataMustBeStrings) {
  const std::string dir = TempDir();
  const std::string path = HandFile(dir, R"({"__metadata__": {"format": 1}})", "");
  ExpectContains(ErrorOf([&] { SafetensorsFile file(path); }),
                 {path, "__metadata__", "\"format\""});
}

TEST(Safetensors, NonWeightDtypeAndMissingTensor) {
  const std::string dir = TempDir();
  const std::string path = dir + "/ids.safetensors";
  WriteSafetensors(path, {{"ids", at::arange(3, at::kLong)}, {"w", at::ones({2})}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.dtype("ids"), "I64");
  ExpectContains(ErrorOf([&] { file.Tensor("ids"); }), {path, "tensor \"ids\"", "I64", "F32"});
  ExpectContains(ErrorOf([&] { file.Tensor("nope"); }), {path, "tensor \"nope\""});
  ExpectContains(ErrorOf([&] { file.shape("nope"); }), {path, "tensor \"nope\""});
  ExpectContains(ErrorOf([&] { SafetensorsFile missing(dir + "/absent.safetensors"); }),
                 {dir + "/absent.safetensors", "No such file"});
  ExpectContains(ErrorOf([&] { SafetensorsFile directory(dir); }),
                 {dir, "expected a regular file"});
}

// ---------------------------------------------------------------------------------------------
// Writing failures

TEST(Safetensors, WriteIntoMissingDirectoryNamesTheFile) {
  const std::string dir = TempDir();
  const std::string path = dir + "/no/such/dir/model.safetensors";
  ExpectContains(ErrorOf([&] {
                   WriteSafetensors(path, {{"w", at::ones({2})}});
                 }),
                 {path, "No such file or directory"});
  EXPECT_FALSE(fs::exists(dir + "/no"));
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Safetensors, FailedRenameRemovesTheTemporary) {
  const std::string dir = TempDir();
  const std::string path = dir + "/target";  // a non-empty directory: rename() fails
  fs::create_directories(path);
  WriteBytes(path + "/keep", "x");
  ExpectContains(ErrorOf([&] {
                   WriteSafetensors(path, {{"w", at::ones({4})}});
                 }),
                 {path, "rename"});
  EXPECT_EQ(Listing(dir), std::vector<std::string>{"target"});
}

TEST(Safetensors, FailedWriteKeepsTheOldFileAndRemovesTheTemporary) {
  const std::string dir = TempDir();
  const std::string path = dir + "/model.safetensors";
  WriteSafetensors(path, {{"old", at::ones({2})}});
  const std::string before = ReadBytes(path);
  // A file size limit makes write() fail with EFBIG part-way, as a full disk would (ENOSPC).
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string message = ErrorOf([&] {
    WriteSafetensors(path, {{"new", at::ones({1 << 16})}});
  });
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  // With what it means, as the trainer's other files say it (the safetensors writer gave
  // strerror alone).
  ExpectContains(message, {path, "cannot write", std::strerror(EFBIG),
                           "(a file-size limit, ulimit -f, was reached)"});
  EXPECT_EQ(Listing(dir), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(ReadBytes(path), before);
  // And an overwrite that succeeds replaces it.
  WriteSafetensors(path, {{"new", at::ones({3})}});
  EXPECT_EQ(SafetensorsFile(path).names(), std::vector<std::string>{"new"});
  EXPECT_EQ(Listing(dir), std::vector<std::string>{"model.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Sharded directories

std::string WriteIndex(const std::string& dir, const Json& weight_map) {
  const std::string path = dir + "/model.safetensors.index.json";
  WriteBytes(path, Json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2));
  return path;
}

TEST(SafetensorsDir, SingleFileAndTwoShards) {
  const std::string dir = TempDir();
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors",
                   {{"a", at::ones({2})}, {"b", at::full({3}, 2.0)}});
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors", {{"c", at::full({1, 2}, 3.0)}});
  const std::string index = WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                                             {"b", "model-00001-of-00002.safetensors"},
                                             {"c", "model-00002-of-00002.safetensors"}});
  const SafetensorsDir sharded(dir);
  EXPECT_EQ(sharded.source(), index);
  EXPECT_EQ(sharded.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(sharded.shape("c"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(sharded.file_of("c"), dir + "/model-00002-of-00002.safetensors");
  EXPECT_TRUE(SameBytes(sharded.Tensor("b"), at::full({3}, 2.0)));
  ExpectContains(ErrorOf([&] { sharded.Tensor("d"); }), {index, "\"d\""});

  // model.safetensors wins when both exist (transformers' order).
  WriteSafetensors(dir + "/model.safetensors", {{"z", at::ones({1})}});
  const SafetensorsDir single(dir);
  EXPECT_EQ(single.source(), dir + "/model.safetensors");
  EXPECT_EQ(single.names(), std::vector<std::string>{"z"});
}

TEST(SafetensorsDir, NeitherFileNamesDirectoryAndBothNames) {
  const std::string dir = TempDir();
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {dir, "model.safetensors", "model.safetensors.index.json"});
}

TEST(SafetensorsDir, MissingShardFile) {
  const std::string dir = TempDir();
  WriteSafetensors(dir + "/s1.safetensors", {{"a", at::ones({2})}});
  const std::string index = WriteIndex(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "tensor \"b\"", dir + "/s2.safetensors", "no such file"});
}

TEST(SafetensorsDir, TensorListedButNotInItsShard) {
  const std::string dir = TempDir();
  WriteSafetensors(dir + "/s1.safetensors", {{"a", at::ones({2})}});
  WriteSafetensors(dir + "/s2.safetensors", {{"b", at::ones({2})}});
  WriteIndex(dir, {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {dir + "/s1.safetensors", "tensor \"b\"", "no such tensor"});
}

TEST(SafetensorsDir, TensorInTwoShards) {
  const std::string dir = TempDir();
  WriteSafetensors(dir + "/s1.safetensors", {{"a", at::ones({2})}, {"b", at::ones({1})}});
  WriteSafetensors(dir + "/s2.safetensors", {{"a", at::ones({2})}});
  WriteIndex(dir, {{"a", "s2.safetensors"}, {"b", "s1.safetensors"}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {"s1.safetensors", "s2.safetensors", "tensor \"a\"", "one shard"});
}

TEST(SafetensorsDir, BadIndex) {
  const std::string dir = TempDir();
  const std::string index = dir + "/model.safetensors.index.json";
  WriteBytes(index, "{\"weight_map\": {");
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "expected JSON, got a parse error at line 1, column 17: syntax error"});
  EXPECT_EQ(ErrorOf([&] { SafetensorsDir weights(dir); }).find("json.exception"),
            std::string::npos);
  WriteBytes(index, "{\"metadata\": {}}");
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }), {index, "weight_map"});
  WriteIndex(dir, {{"a", 3}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }), {index, "tensor \"a\""});
  WriteIndex(dir, {{"a", "../outside.safetensors"}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "tensor \"a\"", "../outside.safetensors"});
  WriteIndex(dir, {{"a", "gone.safetensors"}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "tensor \"a\"", "gone.safetensors to exist, got no such file"});
  fs::create_directory(dir + "/shard_dir");
  WriteIndex(dir, {{"a", "shard_dir"}});
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "tensor \"a\"", "shard_dir to exist, got no regular file"});
}

// A model.safetensors that cannot be looked at, or a symbolic link to nothing, is named with
// what is wrong with it: not "got neither" (as if the directory held no weights).
TEST(SafetensorsDir, ALinkThatLeadsNowhereIsNamed) {
  const std::string dir = TempDir();
  const std::string single = dir + "/model.safetensors";
  fs::create_symlink("model.safetensors", single);  // a loop
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {single, "got an error looking at it: Too many levels of symbolic links"});
  fs::remove(single);
  fs::create_symlink(dir + "/elsewhere.safetensors", single);
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {single, "a symbolic link to " + dir +
                              "/elsewhere.safetensors, which does not "
                              "exist"});
  // Beside an index, as transformers does, the link to nothing is passed over for the index.
  WriteSafetensors(dir + "/s1.safetensors", {{"a", at::ones({2})}});
  WriteIndex(dir, {{"a", "s1.safetensors"}});
  EXPECT_EQ(SafetensorsDir(dir).names(), std::vector<std::string>{"a"});
  fs::remove(dir + "/model.safetensors.index.json");
  fs::remove(single);
  const std::string index = dir + "/model.safetensors.index.json";
  fs::create_symlink("model.safetensors.index.json", index);
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "Too many levels of symbolic links"});
  fs::remove(index);
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {dir, "expected model.safetensors or model.safetensors.index.json, got neither"});
}

// The index is input too: a FIFO or a device in its place is refused at once (not read until a
// writer comes or memory runs out), and so are nesting past any real file and numbers past
// double.
TEST(SafetensorsDir, AnIndexThatIsNotAPlainJsonFileIsRefused) {
  const std::string dir = TempDir();
  const std::string index = dir + "/model.safetensors.index.json";
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }), {index, "not a regular file"});
  fs::remove(index);
  fs::create_symlink("/dev/zero", index);
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }), {index, "not a regular file"});
  fs::remove(index);
  WriteBytes(index, "{\"weight_map\": {}, \"x\": " + std::string(100000, '[') +
                        std::string(100000, ']') + "}");
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "nested at most 64 levels deep"});
  WriteBytes(index, "{\"metadata\": {\"total_size\": 1e400}, \"weight_map\": {}}");
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }), {index, "JSON that fits"});
  // A tensor mapped twice (the parser would keep the last), and at depth 2 outside weight_map
  // (allowed: metadata's own keys).
  WriteBytes(index,
             "{\"metadata\": {\"a\": 1}, \"weight_map\": {\"a\": \"x.safetensors\", \"b\": "
             "\"x.safetensors\", \"a\": \"y.safetensors\"}}");
  ExpectContains(ErrorOf([&] { SafetensorsDir weights(dir); }),
                 {index, "weight_map: tensor \"a\": expected one entry, got two"});
}

// ---------------------------------------------------------------------------------------------
// Modules

// Parameters named like an HF llama: model.layers.0.mlp.up_proj.weight, model.norm.weight, and a
// buffer model.norm.scale.
std::shared_ptr<torch::nn::Module> MakeModule() {
  using torch::nn::Module;
  auto root = std::make_shared<Module>();
  auto model = root->register_module("model", std::make_shared<Module>());
  auto layers = model->register_module("layers", std::make_shared<Module>());
  auto layer = layers->register_module("0", std::make_shared<Module>());
  auto mlp = layer->register_module("mlp", std::make_shared<Module>());
  auto up = mlp->register_module("up_proj", std::make_shared<Module>());
  up->register_parameter("weight", at::zeros({4, 3}));
  auto norm = model->register_module("norm", std::make_shared<Module>());
  norm->register_parameter("weight", at::zeros({3}));
  norm->register_buffer("scale", at::zeros({2}));
  return root;
}

const char* kUp = "model.layers.0.mlp.up_proj.weight";

std::vector<std::pair<std::string, at::Tensor>> GoodWeights() {
  return {{kUp, at::arange(12, at::kFloat).reshape({4, 3}).to(at::kBFloat16)},
          {"model.norm.weight", at::full({3}, 1.5)},
          {"model.norm.scale", at::full({2}, 0.25, at::kHalf)}};
}

std::map<std::string, at::Tensor> Snapshot(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : module.named_parameters()) out[p.key()] = p.value().clone();
  for (const auto& b : module.named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

void ExpectUntouched(const torch::nn::Module& module,
                     const std::map<std::string, at::Tensor>& before) {
  for (const auto& [name, t] : Snapshot(module)) {
    EXPECT_TRUE(SameBytes(t, before.at(name))) << name << " changed";
  }
}

TEST(LoadModuleFromHf, CopiesConvertingDtypes) {
  const std::string dir = TempDir();
  auto weights = GoodWeights();
  weights.emplace_back("lm_head.weight", at::ones({4, 3}));
  weights.emplace_back("model.rotary_emb.inv_freq", at::ones({2}));
  WriteSafetensors(dir + "/model.safetensors", weights);
  auto module = MakeModule();
  LoadModuleFromHf(dir, *module, {"lm_head.weight", "*rotary_emb.inv_freq"});
  const auto loaded = Snapshot(*module);
  EXPECT_TRUE(SameBytes(loaded.at(kUp), at::arange(12, at::kFloat).reshape({4, 3})));
  EXPECT_TRUE(SameBytes(loaded.at("model.norm.weight"), at::full({3}, 1.5)));
  EXPECT_TRUE(SameBytes(loaded.at("model.norm.scale"), at::full({2}, 0.25)));
  EXPECT_TRUE(module->named_parameters()[kUp].requires_grad());
}

// A tied copy (the lm_head of tied embeddings) loads when it holds the same values, in any
// weight dtype; one that differs, or has another shape, is an error before anything is copied.
TEST(LoadModuleFromHf, ATiedCopyMustEqualItsTensor) {
  const std::string dir = TempDir();
  HfNaming naming;
  naming.tied_copies = {{"lm_head.weight", kUp}};
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  auto weights = GoodWeights();
  weights.emplace_back("lm_head.weight", at::arange(12, at::kFloat).reshape({4, 3}));  // F32
  WriteSafetensors(dir + "/model.safetensors", weights);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
                 {"tensor \"lm_head.weight\"", "unexpected"});  // not a copy of anything
  LoadModuleFromHf(dir, *module, {}, naming);
  EXPECT_TRUE(SameBytes(Snapshot(*module).at(kUp), at::arange(12, at::kFloat).reshape({4, 3})));
  module = MakeModule();
  weights.back().second = at::arange(12, at::kFloat).reshape({4, 3});
  weights.back().second[2][2] = -1.0;
  WriteSafetensors(dir + "/model.safetensors", weights);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module, {}, naming); }),
                 {dir + "/model.safetensors", "tensor \"lm_head.weight\"",
                  std::string("expected a copy of \"") + kUp + "\"",
                  "got 1 of 12 values different (the first at flat index 8: -1 against 8)",
                  "\"tie_word_embeddings\": false"});
  ExpectUntouched(*module, before);
  weights.back().second = at::ones({3, 4});
  WriteSafetensors(dir + "/model.safetensors", weights);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module, {}, naming); }),
                 {"tensor \"lm_head.weight\"", "[4, 3]", "got [3, 4]"});
  ExpectUntouched(*module, before);
}

// A tied pair kept under the copy's name alone (safetensors' save_model keeps the name that
// sorts first, "lm_head.weight" before "model.embed_tokens.weight"): the module's tensor loads
// from it, as transformers ties the two on load. Without the tie, the tensor is missing.
TEST(LoadModuleFromHf, ATiedTensorKeptUnderItsCopysNameAloneLoads) {
  const std::string dir = TempDir();
  auto weights = GoodWeights();
  ASSERT_EQ(weights[0].first, kUp);
  weights[0].first = "lm_head.weight";
  WriteSafetensors(dir + "/model.safetensors", weights);
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
                 {"got 1 missing", std::string("\"") + kUp + "\""});
  ExpectUntouched(*module, before);
  HfNaming naming;
  naming.tied_copies = {{"lm_head.weight", kUp}};
  LoadModuleFromHf(dir, *module, {}, naming);
  EXPECT_TRUE(SameBytes(Snapshot(*module).at(kUp), at::arange(12, at::kFloat).reshape({4, 3})));
  EXPECT_TRUE(SameBytes(Snapshot(*module).at("model.norm.weight"), at::full({3}, 1.5)));
}

TEST(LoadModuleFromHf, FromShards) {
  const std::string dir = TempDir();
  const auto w = GoodWeights();
  WriteSafetensors(dir + "/s1.safetensors", {w[0]});
  WriteSafetensors(dir + "/s2.safetensors", {w[1], w[2]});
  WriteIndex(dir, {{kUp, "s1.safetensors"},
                   {"model.norm.weight", "s2.safetensors"},
                   {"model.norm.scale", "s2.safetensors"}});
  auto module = MakeModule();
  LoadModuleFromHf(dir, *module);
  EXPECT_TRUE(SameBytes(Snapshot(*module).at("model.norm.weight"), at::full({3}, 1.5)));
}

TEST(LoadModuleFromHf, ShapeMismatchNamesFileTensorAndShapes) {
  const std::string dir = TempDir();
  auto weights = GoodWeights();
  weights[0].second = at::ones({4, 2});
  WriteSafetensors(dir + "/model.safetensors", weights);
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
                 {dir + "/model.safetensors", std::string("tensor \"") + kUp + "\"", "[4, 3]",
                  "[4, 2]", "(the architecture in config.json does not match the weights?)"});
  ExpectUntouched(*module, before);
}

TEST(LoadModuleFromHf, LastCheckFailingLeavesEverythingUntouched) {
  const std::string dir = TempDir();
  auto weights = GoodWeights();
  weights[2].second = at::ones({3});  // the buffer, checked (and copied) last
  WriteSafetensors(dir + "/model.safetensors", weights);
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }), {"model.norm.scale", "[2]"});
  ExpectUntouched(*module, before);

  weights = GoodWeights();
  weights[2].second = at::ones({2}, at::kLong);  // a dtype that is not weights
  WriteSafetensors(dir + "/model.safetensors", weights);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
                 {dir + "/model.safetensors", "tensor \"model.norm.scale\"", "I64"});
  ExpectUntouched(*module, before);
}

// A NaN or an infinity anywhere in the weights (here one value of the last tensor copied) is an
// error naming the file, the tensor, the count and the first place, before anything is copied.
TEST(LoadModuleFromHf, NonFiniteWeightsNameTheTensorAndLeaveEverythingUntouched) {
  const std::string dir = TempDir();
  auto weights = GoodWeights();
  weights[2].second = at::tensor({0.25, std::numeric_limits<double>::quiet_NaN()}).to(at::kHalf);
  WriteSafetensors(dir + "/model.safetensors", weights);
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  ExpectContains(
      ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
      {dir + "/model.safetensors", "tensor \"model.norm.scale\"",
       "expected finite values, got 1 NaN or infinite (the first at flat index 1: nan)"});
  ExpectUntouched(*module, before);
  weights = GoodWeights();
  weights[0].second = at::full({4, 3}, -INFINITY).to(at::kBFloat16);
  WriteSafetensors(dir + "/model.safetensors", weights);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
                 {std::string("tensor \"") + kUp + "\"",
                  "got 12 NaN or infinite (the first at "
                  "flat index 0: -inf)"});
  ExpectUntouched(*module, before);
}

TEST(LoadModuleFromHf, UnexpectedTensorUnlessIgnorable) {
  const std::string dir = TempDir();
  auto weights = GoodWeights();
  weights.emplace_back("model.layers.0.mlp.gate_proj.weight", at::ones({4, 3}));
  WriteSafetensors(dir + "/model.safetensors", weights);
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  ExpectContains(ErrorOf([&] {
                   LoadModuleFromHf(dir, *module, {"lm_head.weight", "*up_proj.weight"});
                 }),
                 {dir + "/model.safetensors", "tensor \"model.layers.0.mlp.gate_proj.weight\"",
                  "unexpected", "config.json"});
  ExpectUntouched(*module, before);
  LoadModuleFromHf(dir, *module, {"*gate_proj.weight"});
  EXPECT_TRUE(SameBytes(Snapshot(*module).at("model.norm.weight"), at::full({3}, 1.5)));
}

TEST(LoadModuleFromHf, MissingTensorsListedWithCount) {
  const std::string dir = TempDir();
  WriteSafetensors(dir + "/model.safetensors", {GoodWeights()[0]});
  auto module = MakeModule();
  const auto before = Snapshot(*module);
  ExpectContains(ErrorOf([&] { LoadModuleFromHf(dir, *module); }),
                 {dir + "/model.safetensors", "parameter and buffer", "2 missing",
                  "\"model.norm.weight\"", "\"model.norm.scale\""});
  ExpectUntouched(*module, before);

  // More than five: five names and the rest counted.
  auto big = std::make_shared<torch::nn::Module>();
  for (int i = 0; i < 8; ++i) big->register_parameter("p" + std::to_string(i), at::zeros({1}));
  WriteSafetensors(dir + "/model.safetensors", {{"p0", at::ones({1})}});
  const std::string message = ErrorOf([&] { LoadModuleFromHf(dir, *big); });
  ExpectContains(message, {"7 missing", "\"p1\"", "\"p5\"", "and 2 more"});
  EXPECT_EQ(message.find("\"p6\""), std::string::npos) << message;
}

TEST(SaveModuleAsHf, RoundTripsThroughLoad) {
  const std::string dir = TempDir();
  auto source = MakeModule();
  {
    at::NoGradGuard no_grad;
    for (auto& p : source->parameters()) p.copy_(at::randn(p.sizes()));
    for (auto& b : source->buffers()) b.copy_(at::randn(b.sizes()));
  }
  SaveModuleAsHf(dir + "/model.safetensors", *source, at::kBFloat16);
  const SafetensorsFile file(dir + "/model.safetensors");
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(file.names(), (std::vector<std::string>{kUp, "model.norm.scale", "model.norm.weight"}));
  EXPECT_EQ(file.dtype(kUp), "BF16");

  auto target = MakeModule();
  LoadModuleFromHf(dir, *target);
  const auto want = Snapshot(*source);
  for (const auto& [name, t] : Snapshot(*target)) {
    EXPECT_TRUE(SameBytes(t, want.at(name).to(at::kBFloat16).to(at::kFloat))) << name;
  }
}

}  // namespace
}  // namespace distill

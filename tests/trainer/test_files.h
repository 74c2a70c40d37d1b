// Light helpers for tests that write files (no torch): a fresh directory per test, bytes in and
// out, a directory's names, and the message of an expected exception.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distill/run_dir.h"  // RemoveTree

namespace distill::testing {

// A fresh, empty directory "<tmp>/<prefix><suite>_<test><suffix>" for the running test.
inline std::string FreshTestDir(const std::string& prefix, const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + info->test_suite_name() + "_" + info->name() + suffix);
  RemoveTree(dir.string());
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// The names in directory `dir`, sorted.
inline std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The message of the E that `f` throws ("" and a test failure when it throws none, or another
// exception).
template <typename E>
std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a different exception type, got: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, got none";
  return "";
}

inline void ExpectContains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const auto& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "message: " << message << "\nlacks: " << part;
  }
}

}  // namespace distill::testing

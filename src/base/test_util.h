// Test helpers every layer's tests share (header-only, gtest): a temporary directory removed at
// the end of its scope, normal random data, a file's bytes. Layer-specific helpers build on it
// (model/test_util.h: random models, the reference forward pass).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace scalesweep::testing {

// A fresh directory under the temp directory, named by `prefix`, the process, a counter and the
// running test, removed with everything in it when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ss_test") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    p = std::filesystem::temp_directory_path() /
        (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) +
         (info ? std::string("_") + info->name() : std::string()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
  }
  ~TempDir() { std::filesystem::remove_all(p); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string sub(const std::string& s) const { return (p / s).string(); }
  const std::filesystem::path& path() const { return p; }
  std::filesystem::path p;

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// n draws of N(0, scale²) (64-bit Mersenne twister seeded by `seed`, double precision rounded
// to float): the same values on every platform.
inline std::vector<float> randn(int64_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(nd(rng) * scale);
  return v;
}

// The whole file as bytes ("" when it cannot be opened).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// What `fn` throws as an E, its message (`none` when it throws nothing; any other exception
// escapes and fails the test), for checking messages byte for byte.
template <class E = std::exception, class F>
std::string error_of(F&& fn, const std::string& none = "") {
  try {
    std::forward<F>(fn)();
  } catch (const E& e) {
    return e.what();
  }
  return none;
}

// Success when `fn` throws an E whose message contains `text`; else a failure that shows the
// message ("" when nothing was thrown).
template <class E = std::exception, class F>
::testing::AssertionResult throws_with(F&& fn, std::string_view text) {
  const std::string m = error_of<E>(std::forward<F>(fn));
  if (m.find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << m << "\" lacks \"" << text << "\"";
}

// Checks a progress callback's calls (done, total): the start (done 0) comes before any step,
// and every step is one past the last. Keeps the last step's done and total and counts the
// steps.
struct ProgressSteps {
  int64_t last = 0, total = 0, calls = 0;
  std::function<void(int64_t, int64_t)> fn() {
    return [this](int64_t done, int64_t t) {
      if (done == 0) {  // the start, announced once before any step
        EXPECT_EQ(calls, 0);
        return;
      }
      EXPECT_EQ(done, last + 1);
      last = done;
      total = t;
      ++calls;
    };
  }
};

}  // namespace scalesweep::testing

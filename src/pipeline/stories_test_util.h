// Test helpers of pipeline/quantize_model: a test suite over the shared data's stories260K
// (llama2.c model and tokenizer, the TinyStories text) converted once to a Hugging Face
// directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "scalesweep/io/convert.h"

namespace scalesweep::pipeline::testing {

// The suite's files: stories260K converted to a bf16 Hugging Face directory `hf_` (tokenizer
// included) under a fresh temporary root named by Derived::kRoot and the process, removed at
// the end of the suite; every test is skipped where the shared data is absent. Each suite
// (Derived) has its own files.
template <class Derived>
class Stories260kHfTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string data = SS_SHARED_DATA_DIR;
    bin_ = data + "/models/stories260K/stories260K.bin";
    tok_ = data + "/models/stories260K/tok512.bin";
    text_ = data + "/text/tinystories_val.txt";
    namespace fs = std::filesystem;
    if (!fs::exists(bin_) || !fs::exists(tok_) || !fs::exists(text_)) return;
    root_ = fs::temp_directory_path() /
            (std::string(Derived::kRoot) + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    io::ConvertOptions co;
    co.tokenizer = tok_;
    co.require_tokenizer = true;
    co.dtype = DType::kBF16;
    hf_ = (root_ / "hf").string();
    io::convert_llama2c_to_hf(bin_, hf_, co);
  }
  static void TearDownTestSuite() {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }
  void SetUp() override {
    if (hf_.empty())
      GTEST_SKIP() << "stories260K / tok512.bin / tinystories_val.txt not under "
                   << SS_SHARED_DATA_DIR;
  }
  static inline std::filesystem::path root_;
  static inline std::string bin_, tok_, text_, hf_;
};

}  // namespace scalesweep::pipeline::testing

// `calibrate` (calibrate_to_file, calib_stats_for) on stories260K; the statistics file
// format alone is tested in src/io/calib_stats_test.cc.
#include "scalesweep/pipeline/calibrate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "model/test_util.h"
#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/load.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// `calibrate` on stories260K: the layer-by-layer file is byte-identical to the whole-model
// statistics saved in memory.
TEST(Calibrate, StreamedCalibrateStories260K) {
  const std::string data = SS_SHARED_DATA_DIR;
  const std::string bin = data + "/models/stories260K/stories260K.bin";
  const std::string tok = data + "/models/stories260K/tok512.bin";
  const std::string text = data + "/text/tinystories_val.txt";
  if (!std::filesystem::exists(bin) || !std::filesystem::exists(text))
    GTEST_SKIP() << "shared data absent: " << bin;
  const LoadedModel m = load_model(bin, tok);
  const std::string a = ::testing::TempDir() + "/s260_mem.safetensors";
  const std::string b = ::testing::TempDir() + "/s260_stream.safetensors";
  save_calib_stats(calib_stats_for(m, CalibSource{text, "", 6, 96, 4}), a);
  int64_t done = 0, total = 0;
  const model::CalibStats summary =
      calibrate_to_file(m, CalibSource{text, "", 6, 96, 4}, b, [&](int64_t d, int64_t t) {
        done = d;
        total = t;
      });
  EXPECT_EQ(total, 6 * 5);
  EXPECT_EQ(done, total);
  const auto ba = file_bytes(a), bb = file_bytes(b);
  EXPECT_GT(ba.size(), 100000u);
  EXPECT_EQ(ba, bb);
  const model::CalibStats back = load_calib_stats(b);
  ASSERT_EQ(summary.layers.size(), back.layers.size());
  for (size_t l = 0; l < back.layers.size(); ++l) {
    EXPECT_FALSE(summary.layers[l].inputs[0].has_xtx());
    EXPECT_EQ(summary.layers[l].inputs[3].amax, back.layers[l].inputs[3].amax);
    EXPECT_EQ(summary.layers[l].inputs[3].xdiag, back.layers[l].inputs[3].xdiag);
  }
  // From text without ΣxxT (ppl/generate --calib): the values of the file read without it.
  const model::CalibStats lite = calib_stats_for(m, CalibSource{text, "", 6, 96, 4}, {}, false);
  const model::CalibStats lite_file = load_calib_stats(b, false);
  ASSERT_EQ(lite.layers.size(), lite_file.layers.size());
  for (size_t l = 0; l < lite.layers.size(); ++l) {
    for (int i = 0; i < model::kNumInputs; ++i) {
      const auto& x = lite.layers[l].inputs[static_cast<size_t>(i)];
      const auto& y = lite_file.layers[l].inputs[static_cast<size_t>(i)];
      EXPECT_FALSE(x.has_xtx());
      EXPECT_EQ(x.xdiag, y.xdiag);
      EXPECT_EQ(x.amax, y.amax);
      EXPECT_EQ(x.tokens, y.tokens);
    }
    EXPECT_EQ(lite.layers[l].v_sqnorm, lite_file.layers[l].v_sqnorm);
  }
  // A text too short is refused before the output file is created.
  const std::string c = ::testing::TempDir() + "/s260_short.safetensors";
  const std::string short_text = ::testing::TempDir() + "/s260_short.txt";
  std::ofstream(short_text) << "Once upon a time there was a cat.";
  std::filesystem::remove(c);
  EXPECT_THROW(calibrate_to_file(m, CalibSource{short_text, "", 2, 96, 0}, c),
               std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(c));
}

}  // namespace
}  // namespace scalesweep::pipeline

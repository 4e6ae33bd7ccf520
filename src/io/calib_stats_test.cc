#include "scalesweep/io/calib_stats.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "model/test_util.h"
#include "scalesweep/io/safetensors.h"

namespace scalesweep::io {
namespace {

TEST(CalibStatsFile, RoundTrip) {
  const model::Config c = model::testing::small_config();
  const model::Weights w = model::testing::random_model(c, 3);
  std::vector<int> toks(200);
  for (int i = 0; i < 200; ++i) toks[i] = (i * 11) % c.vocab_size;
  const model::CalibStats s = model::calibrate(w, toks, 3, 16, 7, 1);
  const std::string path = ::testing::TempDir() + "/stats.safetensors";
  save_calib_stats(s, path);
  const model::CalibStats r = load_calib_stats(path);
  EXPECT_EQ(r.nsamples, 3);
  EXPECT_EQ(r.seqlen, 16);
  EXPECT_EQ(r.seed, 7u);
  ASSERT_EQ(r.layers.size(), s.layers.size());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    for (int i = 0; i < model::kNumInputs; ++i) {
      EXPECT_EQ(r.layers[l].inputs[i].xtx, s.layers[l].inputs[i].xtx);
      EXPECT_EQ(r.layers[l].inputs[i].tokens, s.layers[l].inputs[i].tokens);
      EXPECT_EQ(r.layers[l].inputs[i].amax, s.layers[l].inputs[i].amax);
      EXPECT_EQ(r.layers[l].inputs[i].dim, s.layers[l].inputs[i].dim);
    }
    EXPECT_EQ(r.layers[l].q_sqnorm, s.layers[l].q_sqnorm);
    EXPECT_EQ(r.layers[l].v_sqnorm, s.layers[l].v_sqnorm);
    EXPECT_EQ(r.layers[l].k_amax, s.layers[l].k_amax);
  }
  EXPECT_NO_THROW(model::check_calib_stats(r, c));
}

TEST(CalibStatsFile, RejectsWrongFiles) {
  const std::string path = ::testing::TempDir() + "/not_stats.safetensors";
  SafetensorsWriter w;
  std::vector<float> x = {1, 2};
  w.add_f32("x", {2}, x);
  w.write(path);
  try {
    load_calib_stats(path);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not_stats.safetensors"), std::string::npos);
  }
  // Right metadata, missing tensors.
  SafetensorsWriter w2;
  w2.add_f32("x", {2}, x);
  w2.set_metadata("format", "scalesweep-calib-v1");
  w2.set_metadata("n_layers", "1");
  w2.set_metadata("nsamples", "1");
  w2.set_metadata("seqlen", "2");
  w2.set_metadata("seed", "0");
  const std::string p2 = ::testing::TempDir() + "/missing.safetensors";
  w2.write(p2);
  try {
    load_calib_stats(p2);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attn_in.xtx"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_calib_stats(path + ".absent"), IoError);
}

}  // namespace
}  // namespace scalesweep::io

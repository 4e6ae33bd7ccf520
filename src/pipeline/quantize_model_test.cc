// GPTQ on the real stories260K layers: for every selector and every Linear, the layer-output
// loss tr((W - Q) H (W - Q)^T) (= 2/n ||X W^T - X Q^T||^2 over the calibration inputs) is
// lower with GPTQ than with RTN using the same scales.
#include "scalesweep/pipeline/quantize_model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "scalesweep/io/load.h"
#include "scalesweep/pipeline/calibrate.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

const std::string kData = SS_SHARED_DATA_DIR;

TEST(QuantizeModelReal, GptqLowersLayerLossOnStories260K) {
  const std::string model = kData + "/models/stories260K/stories260K.bin";
  const std::string text = kData + "/text/tinystories_val.txt";
  if (!std::filesystem::exists(model) || !std::filesystem::exists(text))
    GTEST_SKIP() << "stories260K / tinystories_val.txt not found under " << kData;
  const LoadedModel m = load_model(model);
  ASSERT_TRUE(m.tokenizer);
  const model::CalibStats stats = calib_stats_for(m, "", text, 16, 256, 0);
  for (Method meth :
       {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse}) {
    QuantizeOptions o;
    o.method = meth;
    o.gptq = true;
    double sr = 0, sg = 0;
    for (int l = 0; l < m.weights.config.n_layers; ++l)
      for (const LinearResult& r : quantize_layer(m.weights, l, &stats, o)) {
        EXPECT_LT(r.loss_gptq, r.loss_rtn) << method_name(meth) << " " << r.name;
        sr += r.loss_rtn;
        sg += r.loss_gptq;
      }
    std::printf("%-10s stories260K sum of layer losses: RTN %.4f  GPTQ %.4f  (%.1f%%)\n",
                std::string(method_name(meth)).c_str(), sr, sg, 100.0 * sg / sr);
    EXPECT_LT(sg, 0.9 * sr);
  }
}

}  // namespace
}  // namespace scalesweep::pipeline

// Models loaded in their stored precision (bf16 / f16 safetensors in place) go through the
// consumers of weights below the pipeline: the runtime, calibration, simulated quantization,
// the llama2.c and HF writers. Each must give what it gives for the same model widened to
// fp32 (a consumer reading `Tensor::data` of a non-fp32 tensor reads a null pointer and
// crashes this test). The quantized-checkpoint writers are tested the same way in
// src/pipeline/weight_dtype_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "io/test_util.h"
#include "model/test_util.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

using model::testing::slurp;
using model::testing::TempDir;

class StoredPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(StoredPrecision, EveryConsumerMatchesTheWidenedModel) {
  io::testing::for_tiny_stored_models(
      GetParam(), "ss_io_wdtype_",
      [&](const model::Config& c, LoadedModel& m, LoadedModel& wide, const TempDir& tmp) {
        // Runtime and calibration.
        const std::vector<int> toks = model::testing::token_stream(300, c.vocab_size);
        const model::CalibStats cs = model::calibrate(m.weights, toks, 3, 16, 7, 1);
        const model::CalibStats cw = model::calibrate(wide.weights, toks, 3, 16, 7, 1);
        ASSERT_EQ(cs.layers.size(), cw.layers.size());
        for (size_t l = 0; l < cs.layers.size(); ++l)
          for (int i = 0; i < model::kNumInputs; ++i) {
            const auto &a = cs.layers[l].inputs[static_cast<size_t>(i)],
                       &b = cw.layers[l].inputs[static_cast<size_t>(i)];
            ASSERT_EQ(a.xtx.size(), b.xtx.size());
            for (size_t k = 0; k < a.xtx.size(); ++k)
              ASSERT_NEAR(a.xtx[k], b.xtx[k], 1e-4 * (1 + std::fabs(b.xtx[k])));
          }

        // Simulated quantization of the weights.
        const model::SimQuantSpec spec = model::parse_sim_quant("W", Method::kSweepWmse);
        const model::Weights qa = model::quantize_weights(m.weights, spec, &cw);
        const model::Weights qb = model::quantize_weights(wide.weights, spec, &cw);
        model::testing::for_each_tensor_pair(
            qa, qb, [](const model::Tensor& x, const model::Tensor& y, const char* what) {
              EXPECT_EQ(model::to_f32(x), model::to_f32(y)) << what;
            });

        // Writers: llama2.c (fp32) and HF in fp32 and in the stored dtype.
        save_llama2c(m.weights, tmp.sub("a.bin"), Llama2cFormat::kV1);
        save_llama2c(wide.weights, tmp.sub("b.bin"), Llama2cFormat::kV1);
        EXPECT_EQ(slurp(tmp.sub("a.bin")), slurp(tmp.sub("b.bin")));
        for (DType dt : {DType::kF32, GetParam()}) {
          HfWriteOptions w2;
          w2.dtype = dt;
          fs::remove_all(tmp.sub("ha"));
          fs::remove_all(tmp.sub("hb"));
          save_hf_dir(m.weights, tmp.sub("ha"), w2);
          save_hf_dir(wide.weights, tmp.sub("hb"), w2);
          EXPECT_EQ(slurp(tmp.sub("ha/model.safetensors")), slurp(tmp.sub("hb/model.safetensors")));
        }
        // Written in its own dtype (the last round above), the file holds the source's bytes.
        EXPECT_EQ(slurp(tmp.sub("ha/model.safetensors")), slurp(tmp.sub("src/model.safetensors")));
      });
}

INSTANTIATE_TEST_SUITE_P(All, StoredPrecision, ::testing::Values(DType::kBF16, DType::kF16),
                         io::testing::stored_dtype_name);

}  // namespace
}  // namespace scalesweep::io

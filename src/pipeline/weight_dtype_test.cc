// Models loaded in their stored precision (bf16 / f16 safetensors in place) go through the
// quantized-checkpoint writers (GPTQ, whole-model and streamed), and the checkpoint loads with
// its NVFP4 weights packed: each gives what it gives for the same model widened to fp32. The
// consumers below the pipeline (runtime, calibration, simulated quantization, llama2.c and HF
// writers) are tested the same way in src/io/weight_dtype_test.cc.
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
#include "scalesweep/io/load.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

using model::testing::slurp;
using model::testing::TempDir;

class CheckpointStoredPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(CheckpointStoredPrecision, QuantizedCheckpointMatchesTheWidenedModel) {
  io::testing::for_tiny_stored_models(
      GetParam(), "ss_wdtype_",
      [&](const model::Config& c, LoadedModel& m, LoadedModel& wide, const TempDir& tmp) {
        // Calibration statistics of the widened model (the comparison of calibration in stored
        // vs widened precision is in src/io/weight_dtype_test.cc).
        const std::vector<int> toks = model::testing::token_stream(300, c.vocab_size);
        const model::CalibStats cw = model::calibrate(wide.weights, toks, 3, 16, 7, 1);

        // Quantized checkpoints (GPTQ with the same statistics): the same bytes.
        QuantizeOptions o;
        o.gptq = true;
        o.method = Method::kSweepWmse;
        write_quantized_checkpoint(m, tmp.sub("src"), &cw, o, tmp.sub("qa"), {});
        write_quantized_checkpoint(wide, tmp.sub("src"), &cw, o, tmp.sub("qb"), {});
        EXPECT_EQ(slurp(tmp.sub("qa/model.safetensors")), slurp(tmp.sub("qb/model.safetensors")));
        // Streamed from the directory, with the statistics given: the same checkpoint again.
        StreamOptions so;
        so.stats = &cw;
        write_quantized_checkpoint_streamed(tmp.sub("src"), so, o, tmp.sub("qs"), {});
        EXPECT_EQ(slurp(tmp.sub("qs/model.safetensors")), slurp(tmp.sub("qb/model.safetensors")));

        // A quantized checkpoint loads with NVFP4 weights packed (no fp32 copy) and runs as its
        // fp32 dequantization does.
        {
          const LoadedModel q = load_model(tmp.sub("qa"));
          EXPECT_EQ(q.weights.layers[1].w2.dtype, model::WeightDType::kNvfp4);
          auto qp = std::make_shared<model::Weights>(q.weights);
          auto qw = std::make_shared<model::Weights>(q.weights);
          model::materialize_f32(*qw);
          model::Transformer ta(qp), tb(qw);
          const float* a = ta.decode(3, 0);
          const std::vector<float> av(a, a + c.vocab_size);
          const float* b = tb.decode(3, 0);
          EXPECT_EQ(av, std::vector<float>(b, b + c.vocab_size));
        }
      });
}

INSTANTIATE_TEST_SUITE_P(All, CheckpointStoredPrecision,
                         ::testing::Values(DType::kBF16, DType::kF16),
                         io::testing::stored_dtype_name);

}  // namespace
}  // namespace scalesweep::pipeline

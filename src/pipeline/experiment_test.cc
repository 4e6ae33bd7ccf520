// Tests of the experiment grid's row weights (src/pipeline/experiment.cc) on stories260K:
// - the rows that read ΣxxT, built layer by layer while calibrating (prebuild_rows), give the
//   grid of whole-model statistics bit for bit, from a text and from a statistics file;
// - quantized_weights' packed form decodes to its fp32 form bit for bit.
#include "scalesweep/pipeline/experiment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
namespace {

namespace fs = std::filesystem;
const std::string kData = SS_SHARED_DATA_DIR;

class ExperimentRows : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = kData + "/models/stories260K/stories260K.bin";
    text_ = kData + "/text/tinystories_val.txt";
    if (!fs::exists(model) || !fs::exists(text_))
      GTEST_SKIP() << "stories260K / tinystories_val.txt not found under " << kData;
    m_ = io::load_model(model);
    eval_ = m_.tokenizer->encode(io::read_text_file(text_), true, false);
    eval_.resize(600);
    opt_.methods = {Method::kSweepMse, Method::kSweepHessian};
    opt_.settings = {"W", "WA"};
    opt_.errors = false;
    opt_.ppl.ctx = 256;
  }
  CalibSource calib() const { return CalibSource{text_, "", 8, 64, 3}; }

  io::LoadedModel m_;
  std::string text_;
  std::vector<int> eval_;
  ExperimentOptions opt_;
};

void expect_same_grid(const ExperimentResult& a, const ExperimentResult& b) {
  ASSERT_EQ(a.cells.size(), b.cells.size());
  for (size_t i = 0; i < a.cells.size(); ++i) {
    const ExperimentCell &x = a.cells[i], &y = b.cells[i];
    SCOPED_TRACE(x.algo + " " + std::string(kMethodNames.name(x.method)) + " " + x.setting);
    EXPECT_EQ(x.algo, y.algo);
    EXPECT_EQ(x.method, y.method);
    EXPECT_EQ(x.setting, y.setting);
    EXPECT_EQ(x.r.nll_sum, y.r.nll_sum);  // bit for bit
  }
}

TEST_F(ExperimentRows, BuiltWhileCalibratingEqualWholeModelStatistics) {
  // GPTQ rows for both selectors and the RTN row of the block-Hessian one read ΣxxT.
  const auto need = rows_needing_xtx(opt_);
  ASSERT_EQ(need.size(), 3u);
  EXPECT_EQ(need[0], std::make_pair(false, Method::kSweepHessian));
  EXPECT_EQ(need[1], std::make_pair(true, Method::kSweepMse));
  EXPECT_EQ(need[2], std::make_pair(true, Method::kSweepHessian));

  const model::CalibStats whole = calib_stats_for(m_, calib(), {}, true);
  const ExperimentResult a = run_experiment(m_, whole, eval_, {}, opt_);

  std::vector<PrebuiltRow> rows;
  int64_t last = 0, total = 0;
  const model::CalibStats layered =
      prebuild_rows(m_, calib(), opt_, &rows, [&](int64_t d, int64_t t) {
        EXPECT_GE(d, last);
        last = d;
        total = t;
      });
  EXPECT_EQ(last, total);
  EXPECT_EQ(total, int64_t{m_.weights.config.n_layers} * 8);
  ASSERT_EQ(rows.size(), 3u);
  for (const PrebuiltRow& r : rows) {
    EXPECT_GT(r.seconds, 0);
    for (const model::LayerWeights& L : r.weights->layers)
      EXPECT_EQ(L.wq.dtype, model::WeightDType::kNvfp4);  // packed
  }
  for (const model::LayerStats& L : layered.layers) {  // ΣxxT freed, the diagonal kept
    EXPECT_FALSE(L.input(model::InputId::kAttnIn).has_xtx());
    EXPECT_EQ(L.input(model::InputId::kAttnIn).xdiag.size(),
              static_cast<size_t>(m_.weights.config.dim));
  }
  const ExperimentResult b = run_experiment(m_, layered, eval_, {}, opt_, {}, rows);
  expect_same_grid(a, b);
  for (const ExperimentCell& c : b.cells)  // the rows' own quantization time
    if (c.algo == "GPTQ") {
      EXPECT_GT(c.weight_seconds, 0);
    }

  // From a statistics file (ΣxxT included): the same rows.
  const fs::path stats =
      fs::temp_directory_path() / ("ss_experiment_test_" + std::to_string(::getpid()));
  io::save_calib_stats(whole, stats.string());
  CalibSource from_file;
  from_file.stats = stats.string();
  std::vector<PrebuiltRow> rows2;
  const model::CalibStats s2 = prebuild_rows(m_, from_file, opt_, &rows2);
  fs::remove(stats);
  expect_same_grid(a, run_experiment(m_, s2, eval_, {}, opt_, {}, rows2));

  // Without the prebuilt rows, statistics lacking ΣxxT are refused by the GPTQ rows.
  EXPECT_THROW(run_experiment(m_, layered, eval_, {}, opt_), std::invalid_argument);
}

TEST_F(ExperimentRows, PackedWeightsDecodeToTheFp32Form) {
  const model::CalibStats whole = calib_stats_for(m_, calib(), {}, true);
  for (bool gptq : {false, true}) {
    QuantizeOptions o;
    o.method = Method::kSweepWmse;
    o.gptq = gptq;
    const model::Weights f = quantized_weights(m_.weights, &whole, o);
    const model::Weights p =
        quantized_weights(m_.weights, &whole, o, {}, nullptr, QuantizedForm::kPacked);
    for (size_t l = 0; l < f.layers.size(); ++l)
      for (model::LinearId id : io::kAllLinears) {
        const model::Tensor &a = io::linear_weight(f.layers[l], id),
                            &b = io::linear_weight(p.layers[l], id);
        ASSERT_EQ(a.dtype, model::WeightDType::kF32);
        ASSERT_EQ(b.dtype, model::WeightDType::kNvfp4);
        const std::vector<float> bb = model::to_f32(b);
        EXPECT_EQ(std::memcmp(bb.data(), a.data, bb.size() * 4), 0)
            << (gptq ? "GPTQ" : "RTN") << " layer " << l << " " << io::hf_module_name(0, id);
      }
  }
}

}  // namespace
}  // namespace scalesweep::pipeline

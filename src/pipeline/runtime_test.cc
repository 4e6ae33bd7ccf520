// load_runtime (ppl, generate) on stories260K: full precision, simulated W/WA with
// calibration from a text, the seqlen note and the refusals.
#include "scalesweep/pipeline/runtime.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
namespace {

struct Paths {
  std::string bin, tok, text;
};

std::optional<Paths> stories() {
  const std::string data = SS_SHARED_DATA_DIR;
  Paths p{data + "/models/stories260K/stories260K.bin", data + "/models/stories260K/tok512.bin",
          data + "/text/tinystories_val.txt"};
  if (!std::filesystem::exists(p.bin) || !std::filesystem::exists(p.text)) return std::nullopt;
  return p;
}

RuntimeRequest request(const Paths& p) {
  RuntimeRequest r;
  r.model = p.bin;
  r.tokenizer = p.tok;
  return r;
}

// request(p) simulating `setting` with `method`.
RuntimeRequest sim_request(const Paths& p, model::QuantSetting setting, Method method) {
  RuntimeRequest r = request(p);
  r.sim.setting = setting;
  r.sim.method = method;
  return r;
}

std::string error_of(const RuntimeRequest& r) {
  return scalesweep::testing::error_of([&] { load_runtime(r); });
}

// The field of the OptionError that load_runtime throws ("" for none or another error).
std::string field_of(const RuntimeRequest& r) {
  try {
    load_runtime(r);
  } catch (const OptionError& e) {
    return e.field();
  } catch (const std::exception&) {
  }
  return "";
}

TEST(Runtime, FullPrecision) {
  const auto p = stories();
  if (!p) GTEST_SKIP() << "shared data absent";
  RuntimeModel rm = load_runtime(request(*p));
  ASSERT_TRUE(rm.model.tokenizer);
  EXPECT_FALSE(rm.spec.any());
  EXPECT_FALSE(rm.stats);
  EXPECT_FALSE(rm.checkpoint_rq);
  const RuntimeDescription d = describe_runtime(rm);
  EXPECT_EQ(d.quant, "FP");
  EXPECT_EQ(d.method, "none");
  EXPECT_EQ(d.format, "none");
  EXPECT_EQ(d.source, "none");
  EXPECT_EQ(d.compute, "fp32");
  auto fp = std::make_shared<const model::Weights>(std::move(rm.model.weights));
  auto tf = make_runtime_transformer(rm, fp, 64);
  ASSERT_TRUE(tf);
}

TEST(Runtime, SimulatedWeightsNeedNoStats) {
  const auto p = stories();
  if (!p) GTEST_SKIP() << "shared data absent";
  const RuntimeModel rm = load_runtime(sim_request(*p, model::QuantSetting::kW, Method::kAbsMax));
  EXPECT_TRUE(rm.spec.any());
  EXPECT_FALSE(rm.stats);
  const RuntimeDescription d = describe_runtime(rm);
  EXPECT_EQ(d.quant, "W");
  EXPECT_EQ(d.method, "absmax");
  EXPECT_EQ(d.format, "nvfp4");
  EXPECT_EQ(d.block, 16);
  EXPECT_EQ(d.source, "simulated");
}

TEST(Runtime, SimulatedActivationsCalibrateFromText) {
  const auto p = stories();
  if (!p) GTEST_SKIP() << "shared data absent";
  RuntimeRequest r = sim_request(*p, model::QuantSetting::kWA, Method::kSweepWmse);
  r.calib.text = p->text;
  r.calib.nsamples = 2;
  r.calib.seqlen = 100000;  // capped at max_seq_len, with a note
  std::vector<std::string> notes;
  int64_t done = 0, total = 0;
  RuntimeProgress progress;
  progress.note = [&](const std::string& s) { notes.push_back(s); };
  progress.progress = [&](const std::string&, const char*, int64_t d, int64_t t) {
    done = d;
    total = t;
  };
  RuntimeModel rm = load_runtime(r, progress);
  ASSERT_TRUE(rm.stats);
  EXPECT_EQ(rm.stats->layers.size(), static_cast<size_t>(rm.model.weights.config.n_layers));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("calib_seqlen 100000 exceeds"), std::string::npos) << notes[0];
  EXPECT_GT(total, 0);
  EXPECT_EQ(done, total);
  const RuntimeDescription d = describe_runtime(rm);
  EXPECT_EQ(d.quant, "WA");
  EXPECT_EQ(d.method, "sweep-wmse");
  EXPECT_EQ(d.source, "simulated");
  auto fp = std::make_shared<const model::Weights>(std::move(rm.model.weights));
  ASSERT_TRUE(make_runtime_transformer(rm, fp, 64));
}

TEST(Runtime, Refusals) {
  const auto p = stories();
  if (!p) GTEST_SKIP() << "shared data absent";
  RuntimeRequest shaping = request(*p);
  shaping.sim.method = Method::kAbsMax;
  shaping.sim.block = 16;
  EXPECT_EQ(error_of(shaping),
            "given without a simulated-quantization setting (quant): simulated quantization is "
            "off and the run would be full precision; set quant to W, WA, WAKV or WAKVQ, or "
            "drop it");
  EXPECT_EQ(field_of(shaping), "method");
  EXPECT_THROW(runtime_spec(shaping), OptionError);

  RuntimeRequest no_stats = request(*p);
  no_stats.sim.setting = model::QuantSetting::kWA;
  no_stats.sim.method = Method::kSweepWmse;
  EXPECT_NE(error_of(no_stats).find("calibration statistics needed"), std::string::npos)
      << error_of(no_stats);

  RuntimeRequest mx16 = request(*p);
  mx16.sim.setting = model::QuantSetting::kWA;
  mx16.sim.format = TensorFormat::kMxfp4;
  mx16.sim.block = 16;
  EXPECT_EQ(field_of(mx16), "block");
}

// A W4A4 checkpoint (stories260K quantized RTN absmax with input global scales) runs as it
// declares; --quant on it is refused without --force-requant; --method shapes its activations.
TEST(Runtime, W4A4CheckpointAsDeclaredAndRefusals) {
  const auto p = stories();
  if (!p) GTEST_SKIP() << "shared data absent";
  const std::string dir = ::testing::TempDir() + "/runtime_w4a4";
  std::filesystem::remove_all(dir);
  QuantizeRequest q;
  q.options.method = Method::kAbsMax;
  q.options.w4a4 = true;
  q.out_dir = dir;
  q.tokenizer = p->tok;
  q.calib.text = p->text;
  q.calib.nsamples = 2;
  q.calib.seqlen = 32;
  quantize_model(p->bin, q);
  RuntimeRequest r;
  r.model = dir;
  r.tokenizer = p->tok;
  RuntimeModel rm = load_runtime(r);
  ASSERT_TRUE(rm.checkpoint_rq);
  EXPECT_FALSE(rm.stats);
  RuntimeDescription d = describe_runtime(rm);
  EXPECT_EQ(d.quant, "WA");
  EXPECT_EQ(d.method, "absmax");
  EXPECT_EQ(d.format, "nvfp4");
  EXPECT_EQ(d.block, 16);
  EXPECT_EQ(d.source, "checkpoint");
  auto fp = std::make_shared<const model::Weights>(std::move(rm.model.weights));
  ASSERT_TRUE(make_runtime_transformer(rm, fp, 64));

  RuntimeRequest requant = r;
  requant.sim.setting = model::QuantSetting::kW;
  requant.sim.method = Method::kAbsMax;
  EXPECT_NE(error_of(requant).find("already NVFP4 (config.json quantization_config, W4A4)"),
            std::string::npos)
      << error_of(requant);
  EXPECT_NE(error_of(requant).find("or give " + option_ref("force_requant")), std::string::npos);
  requant.force_requant = true;
  d = describe_runtime(load_runtime(requant));
  EXPECT_EQ(d.source, "checkpoint+simulated");
  EXPECT_EQ(d.quant, "W");

  RuntimeRequest shaped = r;
  shaped.sim.method = Method::kFourOverSix;
  EXPECT_EQ(describe_runtime(load_runtime(shaped)).method, "4over6");
  shaped.sim.method = Method::kSweepWmse;
  EXPECT_NE(error_of(shaped).find("needs calibration (importance or Hessians)"), std::string::npos)
      << error_of(shaped);
  RuntimeRequest mx = r;
  mx.sim.format = TensorFormat::kMxfp4;
  EXPECT_EQ(error_of(mx),
            "mxfp4: the W4A4 checkpoint " + dir + " quantizes its activations as NVFP4");
  EXPECT_EQ(field_of(mx), "format");
  RuntimeRequest b32 = r;
  b32.sim.block = 32;
  EXPECT_EQ(error_of(b32),
            "32: the W4A4 checkpoint " + dir + " quantizes its activations in 16-blocks");
  EXPECT_EQ(field_of(b32), "block");
}

}  // namespace
}  // namespace scalesweep::pipeline

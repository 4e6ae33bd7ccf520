// On the real stories260K model:
// - GPTQ: for every selector and every Linear, the layer-output loss tr((W - Q) H (W - Q)^T)
//   (= 2/n ||X W^T - X Q^T||^2 over the calibration inputs) is lower with GPTQ than with RTN
//   using the same scales;
// - quantize_model, the one entry: a Hugging Face source (stories260K converted by io's
//   converter) gives the same bytes streamed and in memory (RTN, weighted W4A4 RTN, GPTQ on
//   full-precision activations); the events receive the notes and the progress in order; a
//   llama2.c source is quantized in memory; impossible requests fail before anything is read.
#include "scalesweep/pipeline/quantize_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "base/test_util.h"
#include "pipeline/stories_test_util.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/io/convert.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/quant/evaluate.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

const std::string kData = SS_SHARED_DATA_DIR;

// stories260K from the shared data and its calibration statistics (`nsamples` TinyStories
// sequences of `seqlen` tokens, seed 0); null where the shared data is absent.
struct Stories260K {
  LoadedModel m;
  model::CalibStats stats;
};
std::unique_ptr<const Stories260K> stories260k(int64_t nsamples, int64_t seqlen) {
  const std::string model = kData + "/models/stories260K/stories260K.bin";
  const std::string text = kData + "/text/tinystories_val.txt";
  if (!std::filesystem::exists(model) || !std::filesystem::exists(text)) return nullptr;
  auto s = std::make_unique<Stories260K>();
  s->m = load_model(model);
  s->stats = calib_stats_for(s->m, CalibSource{text, "", nsamples, seqlen, 0});
  return s;
}
const char* const kNoStories = "stories260K / tinystories_val.txt not found under ";

TEST(QuantizeModelReal, GptqLowersLayerLossOnStories260K) {
  const auto s = stories260k(16, 256);
  if (!s) GTEST_SKIP() << kNoStories << kData;
  const auto& [m, stats] = *s;
  ASSERT_TRUE(m.tokenizer);
  for (Method meth :
       {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse}) {
    QuantizeOptions o;
    o.method = meth;
    o.gptq = true;
    double sr = 0, sg = 0;
    for (int l = 0; l < m.weights.config.n_layers; ++l)
      for (const LinearResult& r : quantize_layer(m.weights, l, &stats, o)) {
        EXPECT_LT(r.loss_gptq, r.loss_rtn) << kMethodNames.name(meth) << " " << r.name;
        sr += r.loss_rtn;
        sg += r.loss_gptq;
      }
    std::printf("%-10s stories260K sum of layer losses: RTN %.4f  GPTQ %.4f  (%.1f%%)\n",
                std::string(kMethodNames.name(meth)).c_str(), sr, sg, 100.0 * sg / sr);
    EXPECT_LT(sg, 0.9 * sr);
  }
}

// --gptq-scales / --gptq-importance reach GPTQ: a Linear of quantize_layer with dynamic scales
// equals gptq_quantize with the same timing, importance and group global scale, keeps static's
// global scales and chooses other block scales.
TEST(QuantizeModelReal, GptqDynamicScalesReachGptq) {
  const auto s = stories260k(8, 128);
  if (!s) GTEST_SKIP() << kNoStories << kData;
  const auto& [m, stats] = *s;
  QuantizeOptions o;
  o.method = Method::kSweepWmse;
  o.gptq = true;
  const std::vector<LinearResult> st = quantize_layer(m.weights, 0, &stats, o);
  for (gptq::DynamicImportance di :
       {gptq::DynamicImportance::kHessianDiag, gptq::DynamicImportance::kObs}) {
    o.gptq_scales = gptq::ScaleTiming::kDynamic;
    o.gptq_importance = di;
    const std::vector<LinearResult> dy = quantize_layer(m.weights, 0, &stats, o);
    ASSERT_EQ(dy.size(), st.size());
    int64_t differ = 0;
    for (size_t i = 0; i < dy.size(); ++i) {
      EXPECT_EQ(dy[i].q.global_scale, st[i].q.global_scale) << dy[i].name;
      for (size_t b = 0; b < dy[i].q.scales.size(); ++b)
        differ += dy[i].q.scales[b] != st[i].q.scales[b];
    }
    EXPECT_GT(differ, 0) << gptq::kDynamicImportanceNames.name(di);
    const LinearResult& down = dy.back();  // down_proj: the last Linear
    ASSERT_EQ(down.id, model::LinearId::kDown);
    std::vector<std::shared_ptr<void>> keep;
    const model::Tensor w = model::as_f32(m.weights.layers[0].w2, keep);
    const model::InputStats& in = stats.layers[0].input(model::input_of(model::LinearId::kDown));
    gptq::GptqConfig g;
    g.quant.selector.method = Method::kSweepWmse;
    g.quant.global_scale = down.q.global_scale;
    g.scale_timing = gptq::ScaleTiming::kDynamic;
    g.importance = di;
    const QuantizedTensor ref =
        gptq::gptq_quantize(w.data, w.shape[0], w.shape[1], in.xtx.data(), in.tokens, g, down.name);
    EXPECT_EQ(down.q.scales, ref.scales) << gptq::kDynamicImportanceNames.name(di);
    EXPECT_EQ(down.q.codes, ref.codes) << gptq::kDynamicImportanceNames.name(di);
  }
}

// The global scale of a fused group is 6C/amax over the group's quantized members, with C the
// method's default or QuantizeOptions::max_block_scale (448: compressed-tensors' convention,
// which llm-compressor's observers use).
TEST(QuantizeModelReal, MaxBlockScaleSetsTheGroupGlobalScale) {
  const std::string model = kData + "/models/stories260K/stories260K.bin";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "stories260K not found under " << kData;
  const LoadedModel m = load_model(model);
  const model::LayerWeights& lw = m.weights.layers[0];
  const float qkv_amax =
      std::max({model::tensor_amax(lw.wq), model::tensor_amax(lw.wk), model::tensor_amax(lw.wv)});
  for (std::optional<float> c :
       {std::optional<float>{}, std::optional<float>{448.0f}, std::optional<float>{100.0f}}) {
    QuantizeOptions o;
    o.method = Method::kSweepMse;
    o.max_block_scale = c;
    const float want = global_scale_for_amax(qkv_amax, c.value_or(256.0f));
    int seen = 0;
    for (const LinearResult& r : quantize_layer(m.weights, 0, nullptr, o))
      if (r.id == model::LinearId::kQ || r.id == model::LinearId::kK ||
          r.id == model::LinearId::kV) {
        EXPECT_EQ(r.q.global_scale, want) << r.name << " C=" << c.value_or(256.0f);
        ++seen;
      }
    EXPECT_EQ(seen, 3);
  }
}

// --search-global-scale: every fused group's scale is search_global_scale over its quantized
// members with the importance the method reads (here the block Hessians of sweep-hessian and
// GPTQ's static scales), and the group's total objective is never above the rule's.
TEST(QuantizeModelReal, SearchedGlobalScaleIsTheGroupsArgmin) {
  const auto s = stories260k(8, 128);
  if (!s) GTEST_SKIP() << kNoStories << kData;
  const auto& [m, stats] = *s;
  const model::LayerWeights& lw = m.weights.layers[1];
  const model::InputStats& in = stats.layers[1].input(model::InputId::kAttnIn);
  const std::vector<double> hb = block_hessians(in.xtx.data(), in.dim, 16);
  const Importance imp{ImportanceKind::kBlockHessian, nullptr, hb.data(), 16};
  std::vector<GlobalScaleMember> ms;
  for (const model::Tensor* t : {&lw.wq, &lw.wk, &lw.wv})
    ms.push_back({tensor_ref(t->f32(), t->shape[0], t->shape[1]), imp, "qkv"});
  QuantConfig qc;
  qc.selector.method = Method::kSweepHessian;
  const GlobalScaleSearch want = search_global_scale(ms, qc, 8);
  EXPECT_LE(want.objective[static_cast<size_t>(want.best)], want.objective[0]);
  for (bool gptq : {false, true}) {
    QuantizeOptions o;
    o.method = Method::kSweepHessian;
    o.gptq = gptq;
    o.global_scale_steps = 8;
    int seen = 0;
    for (const LinearResult& r : quantize_layer(m.weights, 1, &stats, o))
      if (model::input_of(r.id) == model::InputId::kAttnIn) {
        EXPECT_EQ(r.q.global_scale, want.global_scale) << r.name;
        ++seen;
      }
    EXPECT_EQ(seen, 3);
  }
  std::printf("layer 1 q/k/v: rule gs %.6g objective %.6g; searched gs %.6g objective %.6g\n",
              want.candidates[0], want.objective[0], want.global_scale,
              want.objective[static_cast<size_t>(want.best)]);
}

namespace fs = std::filesystem;

using scalesweep::testing::slurp;

// What a QuantizeEvents receives.
struct Recorded {
  std::vector<std::string> notes;
  std::vector<std::tuple<std::string, int64_t, int64_t>> progress;
  QuantizeEvents events() {
    QuantizeEvents ev;
    ev.note = [this](const std::string& n) { notes.push_back(n); };
    ev.progress = [this](const std::string& s, const char*, int64_t d, int64_t t) {
      progress.emplace_back(s, d, t);
    };
    return ev;
  }
  // Calibration events (if any) all come first, counting sequences up to `nsamples`; then
  // quantize events count the Linears one by one up to `linears`.
  void expect_order(int64_t nsamples, int64_t linears) const {
    size_t i = 0;
    int64_t prev = 0;
    for (; i < progress.size() && std::get<0>(progress[i]) == "calibrate"; ++i) {
      const auto [s, d, t] = progress[i];
      EXPECT_EQ(t, nsamples);
      EXPECT_GE(d, prev) << "calibration progress goes back";
      EXPECT_LE(d, t);
      prev = d;
    }
    if (i > 0) {
      EXPECT_EQ(prev, nsamples) << "calibration progress does not reach its total";
    }
    int64_t done = 0;
    // The stage announces its start once, (0, total), before its first Linear.
    ASSERT_LT(i, progress.size());
    EXPECT_EQ(std::get<0>(progress[i]), "quantize");
    EXPECT_EQ(std::get<1>(progress[i]), 0) << "the quantize stage does not announce its start";
    ++i;
    for (; i < progress.size(); ++i) {
      const auto [s, d, t] = progress[i];
      ASSERT_EQ(s, "quantize") << "an event of another stage after quantize began";
      EXPECT_EQ(t, linears);
      EXPECT_EQ(d, ++done);
    }
    EXPECT_EQ(done, linears);
  }
};

class QuantizeModelEntry : public testing::Stories260kHfTest<QuantizeModelEntry> {
 public:
  static constexpr const char* kRoot = "ss_qm_entry_test";

 protected:
  static QuantizeRequest request(const std::string& out) {
    QuantizeRequest rq;
    rq.out_dir = (root_ / out).string();
    rq.calib.text = text_;
    rq.calib.nsamples = 6;
    rq.calib.seqlen = 64;
    rq.calib.seed = 2;
    return rq;
  }
};

TEST_F(QuantizeModelEntry, StreamedAndInMemoryGiveIdenticalBytes) {
  const model::Config cfg = load_model(hf_).weights.config;
  ASSERT_NE(cfg.hidden_dim % 16, 0) << "stories260K's down_proj was expected to stay dense";
  std::vector<std::string> ignore;
  for (int l = 0; l < cfg.n_layers; ++l)
    ignore.push_back("model.layers." + std::to_string(l) + ".mlp.down_proj");
  ignore.push_back("lm_head");
  struct Case {
    const char* name;
    Method m;
    bool gptq, w4a4;
  };
  for (const Case& c : {Case{"rtn", Method::kSweepMse, false, false},
                        Case{"wmse_wa", Method::kSweepWmse, false, true},
                        Case{"gptq", Method::kSweepMse, true, false}}) {
    QuantizeRequest a = request(std::string(c.name) + "_stream");
    a.options.method = c.m;
    a.options.gptq = c.gptq;
    a.options.w4a4 = c.w4a4;
    a.sequential = false;  // GPTQ: full-precision activations, as the in-memory path
    QuantizeRequest b = a;
    b.out_dir = (root_ / (std::string(c.name) + "_memory")).string();
    b.stream = false;
    const QuantizeResult ra = quantize_model(hf_, a), rb = quantize_model(hf_, b);
    EXPECT_TRUE(ra.streamed) << c.name;
    EXPECT_FALSE(rb.streamed) << c.name;
    EXPECT_EQ(ra.dense, DType::kBF16) << "the source's torch_dtype";
    EXPECT_EQ(rb.dense, DType::kBF16);
    EXPECT_EQ(ra.report.linears.size(), static_cast<size_t>(cfg.n_layers) * 7);
    EXPECT_EQ(ra.report.ignore, ignore) << c.name;
    EXPECT_EQ(rb.report.ignore, ignore) << c.name;
    const std::string wa = slurp(fs::path(a.out_dir) / "model.safetensors"),
                      wb = slurp(fs::path(b.out_dir) / "model.safetensors");
    ASSERT_GT(wa.size(), 10000u) << c.name;
    EXPECT_TRUE(wa == wb) << c.name << ": streamed and in-memory checkpoints differ";
    EXPECT_EQ(slurp(fs::path(a.out_dir) / "config.json"),
              slurp(fs::path(b.out_dir) / "config.json"))
        << c.name;
    EXPECT_TRUE(fs::exists(fs::path(a.out_dir) / "tokenizer.json")) << c.name;
    if (c.gptq)
      for (const LinearResult& r : ra.report.linears)
        if (!r.dense) {
          EXPECT_LT(r.loss_gptq, r.loss_rtn) << r.name;
        }
  }
}

// The notes (seqlen capped at max_seq_len; each Linear left dense for vLLM) and the progress
// (calibration sequences, then Linears one by one) reach the events, on both paths.
TEST_F(QuantizeModelEntry, EventsReceiveNotesAndProgress) {
  const model::Config cfg = load_model(hf_).weights.config;
  const int64_t linears = int64_t{cfg.n_layers} * 7;
  for (const bool stream : {true, false}) {
    QuantizeRequest rq = request(stream ? "events_stream" : "events_memory");
    rq.options.gptq = true;
    rq.calib.nsamples = 2;
    rq.calib.seqlen = cfg.max_seq_len + 100;
    rq.stream = stream;
    Recorded rec;
    quantize_model(hf_, rq, rec.events());
    const std::string cap = "calib_seqlen " + std::to_string(cfg.max_seq_len + 100) + " exceeds " +
                            hf_ + "'s max_seq_len " + std::to_string(cfg.max_seq_len) + "; using " +
                            std::to_string(cfg.max_seq_len);
    const std::vector<std::string> dense =
        vllm_dense_notes(cfg, 1, PartialBlocks::kDense, DType::kBF16);
    ASSERT_EQ(dense.size(), static_cast<size_t>(cfg.n_layers));
    std::multiset<std::string> want(dense.begin(), dense.end());
    want.insert(cap);
    EXPECT_EQ(std::multiset<std::string>(rec.notes.begin(), rec.notes.end()), want)
        << (stream ? "streamed" : "in memory");
    rec.expect_order(2, linears);
    const bool calibrated_first =
        !rec.progress.empty() && std::get<0>(rec.progress.front()) == "calibrate";
    // In memory the model is calibrated whole before quantizing; streamed, calibration runs
    // layer by layer inside the quantize stage.
    EXPECT_EQ(calibrated_first, !stream);
  }
  // No notes where nothing is capped and nothing stays dense (policy quantize), progress still.
  QuantizeRequest rq = request("events_quiet");
  rq.partial_blocks = PartialBlocks::kQuantize;
  Recorded rec;
  const QuantizeResult r = quantize_model(hf_, rq, rec.events());
  EXPECT_TRUE(rec.notes.empty()) << rec.notes.front();
  rec.expect_order(0, linears);
  EXPECT_TRUE(r.report.ignore == std::vector<std::string>{"lm_head"});
}

// A llama2.c source is loaded whole (nothing to stream), its dense tensors in f32; an
// explicit dense dtype is used as given.
TEST_F(QuantizeModelEntry, Llama2cSourceInMemory) {
  QuantizeRequest rq = request("l2c");
  rq.tokenizer = tok_;
  Recorded rec;
  const QuantizeResult r = quantize_model(bin_, rq, rec.events());
  EXPECT_FALSE(r.streamed);
  EXPECT_EQ(r.dense, DType::kF32);
  const model::Config cfg = load_model(bin_).weights.config;
  rec.expect_order(0, int64_t{cfg.n_layers} * 7);
  EXPECT_EQ(rec.notes.size(), static_cast<size_t>(cfg.n_layers));
  std::ifstream cf(rq.out_dir + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_TRUE(fs::exists(rq.out_dir + "/tokenizer.json"));
  rq.out_dir = (root_ / "l2c_f16").string();
  rq.dense = DType::kF16;
  EXPECT_EQ(quantize_model(bin_, rq).dense, DType::kF16);
  std::ifstream cf2(rq.out_dir + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf2)["torch_dtype"], "float16");
}

// Requests that cannot succeed fail with std::invalid_argument before the source is read
// (here it does not exist) and before any output appears.
TEST(QuantizeModelRequest, ImpossibleRequestsFailBeforeReading) {
  const fs::path out = fs::temp_directory_path() / ("ss_qm_never_" + std::to_string(::getpid()));
  auto message = [&](const QuantizeRequest& rq) -> std::string {
    try {
      quantize_model("/nonexistent/model.bin", rq);
    } catch (const OptionError& e) {
      return e.field() + ": " + e.what();
    } catch (const std::invalid_argument& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("wrong exception: ") + e.what();
    }
    return "no error";
  };
  QuantizeRequest rq;
  rq.out_dir = out.string();
  rq.options.gptq = true;  // no --calib, no --stats
  EXPECT_NE(message(rq).find("GPTQ needs calibration"), std::string::npos) << message(rq);
  rq = {};
  rq.out_dir = out.string();
  rq.options.block = 32;
  EXPECT_NE(message(rq).find("block 32"), std::string::npos) << message(rq);
  rq = {};
  rq.out_dir = out.string();
  rq.tp = 0;
  EXPECT_NE(message(rq).find("tensor-parallel size 0 is not in 1.."), std::string::npos)
      << message(rq);
  rq = {};
  rq.out_dir = out.string();
  rq.options.method = Method::kOptFp32;
  EXPECT_NE(message(rq).find("opt-fp32"), std::string::npos) << message(rq);
  for (float c : {0.0f, 449.0f, -1.0f}) {
    rq = {};
    rq.out_dir = out.string();
    rq.options.max_block_scale = c;
    EXPECT_EQ(message(rq),
              "max_block_scale: C must satisfy 0 < C <= 448 (the largest FP8 E4M3 value)");
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace scalesweep::pipeline

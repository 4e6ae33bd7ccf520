// Mixed precision by sensitivity (include/scalesweep/pipeline/mixed_precision.h):
// - the bits each storage takes (NVFP4 4.5, Q8_0 8.5 or F16 where ggml falls back, dtypes);
// - the greedy on constructed sensitivities: highest gain per extra bit first, a unit that no
//   longer fits skipped for smaller ones after it, whole fused groups when asked, the budget
//   never exceeded; refusals of targets below 4.5 or below the model's least;
// - quantize_model --target-bpw on stories260K (HF directory, streamed and in memory): the same
//   choice and bytes on both paths; the GGUF's Linear weight tensors take exactly the bits the
//   plan counts (Q8_0 where chosen, NVFP4 elsewhere); the compressed-tensors checkpoint lists
//   exactly the chosen modules in `ignore`, q/k/v and gate/up all or none per layer.
#include "scalesweep/pipeline/mixed_precision.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>

#include "base/test_util.h"
#include "pipeline/stories_test_util.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/convert.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/load.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "scalesweep/pipeline/vllm_compat.h"

namespace scalesweep::pipeline {
namespace {
namespace fs = std::filesystem;
using io::kAllLinears;
using model::LinearId;

TEST(MixedPrecision, StorageBits) {
  EXPECT_EQ(nvfp4_weight_bits(576, 1536), 576u * 1536 * 9 / 2);  // 4.5 bits
  EXPECT_EQ(nvfp4_weight_bits(3, 172), 3u * 8 * (86 + 11));      // a partial last block
  EXPECT_EQ(dense_weight_bits(576, 1536, DType::kF32, true, true), 576u * 1536 * 17 / 2);
  EXPECT_EQ(dense_weight_bits(64, 172, DType::kF32, true, true), 64u * 172 * 16);  // F16
  EXPECT_EQ(dense_weight_bits(64, 172, DType::kBF16, false, false), 64u * 172 * 16);
  EXPECT_EQ(dense_weight_bits(64, 64, DType::kF32, true, false), 64u * 64 * 32);
  EXPECT_EQ(dense_weight_bits(64, 64, DType::kF16, false, true), 64u * 64 * 16);  // CT: no q8_0
  // Exactly the writers' tensor bytes: ggml's types and compressed-tensors' shapes.
  EXPECT_EQ(dense_weight_bits(32, 96, DType::kF32, true, true),
            8 * io::ggml_tensor_bytes(static_cast<uint32_t>(io::GgmlType::kQ8_0), {96, 32}, "t"));
  EXPECT_EQ(nvfp4_weight_bits(32, 128),
            8 * io::ggml_tensor_bytes(static_cast<uint32_t>(io::GgmlType::kNVFP4), {128, 32}, "t"));
}

model::Config two_layers() {
  model::Config c;
  c.n_layers = 2;
  return c;
}

// Every Linear 100 weights: NVFP4 450 bits, dense 850 (+400 each).
std::array<LinearStorage, 7> flat_storage() {
  std::array<LinearStorage, 7> s{};
  for (LinearStorage& x : s) x = {10, 10, 450, 850};
  return s;
}

std::vector<LinearSensitivity> scores(const std::vector<std::tuple<int, LinearId, double>>& v) {
  std::vector<LinearSensitivity> out;
  for (const auto& [l, id, g] : v) {
    LinearSensitivity x;
    x.layer = l;
    x.id = id;
    x.score = g;
    out.push_back(x);
  }
  return out;
}

std::vector<LinearSensitivity> all_scored(const model::Config& c, double base = 1.0) {
  std::vector<std::tuple<int, LinearId, double>> v;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears) v.emplace_back(l, id, base);
  return scores(v);
}

TEST(MixedPrecision, GreedyTakesTheHighestGainPerBitAndRespectsTheBudget) {
  const model::Config c = two_layers();
  std::vector<LinearSensitivity> s = all_scored(c, 0.01);
  auto set = [&](int l, LinearId id, double g) {
    for (LinearSensitivity& x : s)
      if (x.layer == l && x.id == id) x.score = g;
  };
  set(1, LinearId::kDown, 5);
  set(0, LinearId::kO, 3);
  set(1, LinearId::kQ, 2);
  // 14 Linears x 100 weights; budget for exactly three Q8_0 Linears: 6300 + 3 * 400 bits.
  const double b = (6300.0 + 1200.0) / 1400.0;
  const MixedPlan p = plan_mixed_precision(c, flat_storage(), s, {}, b, false);
  EXPECT_EQ(p.weights, 1400u);
  EXPECT_EQ(p.base_bits, 6300u);
  EXPECT_EQ(p.budget_bits, 7500u);
  EXPECT_EQ(p.bits, 7500u);
  ASSERT_EQ(p.steps.size(), 3u);
  EXPECT_EQ(p.steps[0].linears, (std::vector<std::pair<int, LinearId>>{{1, LinearId::kDown}}));
  EXPECT_EQ(p.steps[1].linears, (std::vector<std::pair<int, LinearId>>{{0, LinearId::kO}}));
  EXPECT_EQ(p.steps[2].linears, (std::vector<std::pair<int, LinearId>>{{1, LinearId::kQ}}));
  EXPECT_EQ(p.steps[2].bits, 7500u);
  EXPECT_EQ(p.dense.count(2), 3u);
  EXPECT_TRUE(p.dense.contains(1, LinearId::kDown));
  EXPECT_DOUBLE_EQ(p.bpw(), 7500.0 / 1400.0);
  // One bit less: the third does not fit, and no other one does either.
  const MixedPlan q = plan_mixed_precision(c, flat_storage(), s, {}, 7499.0 / 1400.0, false);
  EXPECT_EQ(q.steps.size(), 2u);
  EXPECT_EQ(q.bits, 7100u);
  // Gain per bit, not gain: a Linear twice as expensive needs twice the gain.
  std::array<LinearStorage, 7> st = flat_storage();
  st[static_cast<size_t>(LinearId::kDown)] = {10, 20, 900, 1700};  // +800
  const MixedPlan r = plan_mixed_precision(c, st, s, {}, 12.0, false);
  ASSERT_GE(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[0].linears.front(), std::make_pair(0, LinearId::kO));     // 3 / 400
  EXPECT_EQ(r.steps[1].linears.front(), std::make_pair(1, LinearId::kDown));  // 5 / 800
  EXPECT_EQ(r.steps[2].linears.front(), std::make_pair(1, LinearId::kQ));     // 2 / 400
  EXPECT_EQ(r.dense.count(2), 14u);  // 12 bits per weight: room for every Linear
}

TEST(MixedPrecision, AUnitThatDoesNotFitIsSkippedForSmallerOnes) {
  const model::Config c = two_layers();
  std::array<LinearStorage, 7> st = flat_storage();
  st[static_cast<size_t>(LinearId::kDown)] = {10, 100, 4500, 8500};  // +4000
  std::vector<LinearSensitivity> s = all_scored(c, 0.0);
  for (LinearSensitivity& x : s) {
    if (x.layer == 0 && x.id == LinearId::kDown) x.score = 100;  // the best per bit
    if (x.layer == 1 && x.id == LinearId::kDown) x.score = 90;   // second, but too large
    if (x.id == LinearId::kUp) x.score = 1;
  }
  // Base: 12 x 450 + 2 x 4500 = 14400 over 3200 weights; budget base + 4000 + 800.
  const MixedPlan p = plan_mixed_precision(c, st, s, {}, (14400.0 + 4800.0) / 3200.0, false);
  ASSERT_EQ(p.steps.size(), 3u);
  EXPECT_EQ(p.steps[0].linears.front(), std::make_pair(0, LinearId::kDown));
  EXPECT_EQ(p.steps[1].linears.front(), std::make_pair(0, LinearId::kUp));
  EXPECT_EQ(p.steps[2].linears.front(), std::make_pair(1, LinearId::kUp));
  EXPECT_FALSE(p.dense.contains(1, LinearId::kDown));
  EXPECT_EQ(p.bits, p.budget_bits);
  // Nothing is gained from a zero score: those stay NVFP4 whatever the budget.
  const MixedPlan all = plan_mixed_precision(c, st, s, {}, 32.0, false);
  EXPECT_EQ(all.dense.count(2), 4u);
}

TEST(MixedPrecision, FusedGroupsAreChosenWhole) {
  const model::Config c = two_layers();
  std::vector<LinearSensitivity> s = all_scored(c, 0.01);
  for (LinearSensitivity& x : s)
    if (x.layer == 1 && x.id == LinearId::kK) x.score = 10;  // q/k/v of layer 1: 10.02 / 1200
  // Room for one group of three, not for q/k/v and anything else.
  const MixedPlan p =
      plan_mixed_precision(c, flat_storage(), s, {}, (6300.0 + 1300.0) / 1400.0, true);
  ASSERT_EQ(p.steps.size(), 1u);
  EXPECT_EQ(p.steps[0].linears, (std::vector<std::pair<int, LinearId>>{
                                    {1, LinearId::kQ}, {1, LinearId::kK}, {1, LinearId::kV}}));
  EXPECT_DOUBLE_EQ(p.steps[0].gain, 10.02);
  EXPECT_EQ(p.steps[0].extra_bits, 1200u);
  EXPECT_EQ(vllm_mixed_fused_note(c, p.dense), "");
  // Per Linear, the same budget takes k_proj and then the best single ones.
  const MixedPlan q =
      plan_mixed_precision(c, flat_storage(), s, {}, (6300.0 + 1300.0) / 1400.0, false);
  EXPECT_EQ(q.steps.size(), 3u);
  EXPECT_TRUE(q.dense.contains(1, LinearId::kK));
  EXPECT_FALSE(vllm_mixed_fused_note(c, q.dense).empty());
}

// What `f` throws as "field: message", or "no error".
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const OptionError& e) {
    return e.field() + ": " + e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(MixedPrecision, Refusals) {
  const model::Config c = two_layers();
  const auto s = all_scored(c);
  for (double b : {4.49, 0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::infinity()}) {
    const std::string e =
        error_of([&] { plan_mixed_precision(c, flat_storage(), s, {}, b, false); });
    EXPECT_EQ(e.rfind("target_bpw: ", 0), 0u) << e;
    EXPECT_NE(e.find("below NVFP4's 4.5"), std::string::npos) << e;
  }
  EXPECT_EQ(error_of([&] { plan_mixed_precision(c, flat_storage(), s, {}, 4.5, false); }),
            "no error");
  // Forced dense Linears (ggml or vLLM cannot take them) raise the least target.
  model::LinearSet forced;
  forced.add_every_layer(LinearId::kDown);
  std::vector<LinearSensitivity> rest;
  for (const LinearSensitivity& x : s)
    if (x.id != LinearId::kDown) rest.push_back(x);
  EXPECT_EQ(error_of([&] { plan_mixed_precision(c, flat_storage(), rest, forced, 4.6, false); }),
            "target_bpw: 4.6 bits per weight is below this model's least: 5.0714 with every "
            "Linear that can be NVFP4 in NVFP4 (the others dense)");
  EXPECT_NE(error_of([&] {
              plan_mixed_precision(c, flat_storage(), s, forced, 6, false);
            }).find("forced dense"),
            std::string::npos);
}

// ---- the whole run on stories260K ----------------------------------------------------------

const std::string kData = SS_SHARED_DATA_DIR;

using scalesweep::testing::slurp;

class MixedRun : public testing::Stories260kHfTest<MixedRun> {
 public:
  static constexpr const char* kRoot = "ss_mixed_test";

 protected:
  static QuantizeRequest request(const std::string& out, double bpw) {
    QuantizeRequest rq;
    rq.out_dir = (root_ / out).string();
    rq.options.method = Method::kSweepWmse;
    rq.calib.text = text_;
    rq.calib.nsamples = 4;
    rq.calib.seqlen = 64;
    rq.target_bpw = bpw;
    return rq;
  }
};

// The GGUF: every Linear chosen is Q8_0, the others NVFP4 (down_proj, 172 columns, F16 in
// every layer); the weight tensors' bytes are the plan's bits exactly; streamed and in memory
// give the same file.
TEST_F(MixedRun, GgufHoldsThePlanExactly) {
  QuantizeRequest a = request("mixed.gguf", 8.0);
  a.dense_q8_0 = true;
  QuantizeRequest b = a;
  b.out_dir = (root_ / "mixed_memory.gguf").string();
  b.stream = false;
  const QuantizeResult ra = quantize_model(hf_, a), rb = quantize_model(hf_, b);
  ASSERT_TRUE(ra.report.mixed && rb.report.mixed);
  EXPECT_TRUE(ra.streamed);
  const MixedPlan& p = *ra.report.mixed;
  const model::Config c = io::load_model(hf_).weights.config;
  EXPECT_TRUE(p.dense.same(rb.report.mixed->dense, c.n_layers));
  EXPECT_TRUE(slurp(a.out_dir) == slurp(b.out_dir)) << "streamed and in-memory files differ";
  EXPECT_GT(p.steps.size(), 1u);
  EXPECT_LE(p.bits, p.budget_bits);
  EXPECT_EQ(p.budget_bits, 8 * p.weights);
  EXPECT_EQ(ra.report.sensitivities.size(), static_cast<size_t>(c.n_layers) * 6);  // not down
  const io::GgufFile f = io::GgufFile::open(a.out_dir);
  uint64_t bits = 0, weights = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears) {
      const io::GgufTensorInfo* t = f.find_tensor(io::gguf_linear_name(l, id) + ".weight");
      ASSERT_NE(t, nullptr);
      bits += 8 * t->nbytes;
      weights += static_cast<uint64_t>(t->numel());
      const auto type = static_cast<io::GgmlType>(t->type);
      if (id == LinearId::kDown) {
        EXPECT_EQ(type, io::GgmlType::kF16);
        EXPECT_FALSE(p.dense.contains(l, id));
      } else {
        EXPECT_EQ(type, p.dense.contains(l, id) ? io::GgmlType::kQ8_0 : io::GgmlType::kNVFP4)
            << io::gguf_linear_name(l, id);
      }
    }
  EXPECT_EQ(bits, p.bits);
  EXPECT_EQ(weights, p.weights);
  // The steps are in the plan's order: gain per extra bit never rises.
  for (size_t i = 1; i < p.steps.size(); ++i)
    EXPECT_LE(p.steps[i].gain / p.steps[i].extra_bits,
              p.steps[i - 1].gain / p.steps[i - 1].extra_bits);
}

// The compressed-tensors checkpoint: `ignore` lists the chosen modules and the vLLM-forced
// down_proj, q/k/v and gate/up all or none per layer; the tensors' bytes are the plan's bits.
TEST_F(MixedRun, CheckpointIgnoresTheChosenGroups) {
  QuantizeRequest rq = request("mixed_ct", 8.5);
  const QuantizeResult r = quantize_model(hf_, rq);
  ASSERT_TRUE(r.report.mixed);
  const MixedPlan& p = *r.report.mixed;
  const model::Config c = io::load_model(hf_).weights.config;
  EXPECT_FALSE(p.steps.empty());
  std::set<std::string> want = {"lm_head"};
  for (int l = 0; l < c.n_layers; ++l) {
    want.insert(io::hf_module_name(l, LinearId::kDown));
    for (LinearId g : {LinearId::kQ, LinearId::kGate}) {
      const std::vector<LinearId> m = vllm_fused_group(g);
      for (LinearId id : m) EXPECT_EQ(p.dense.contains(l, id), p.dense.contains(l, g));
    }
    for (LinearId id : kAllLinears)
      if (p.dense.contains(l, id)) want.insert(io::hf_module_name(l, id));
  }
  const std::vector<std::string> ignore = io::hf_quantization_config(rq.out_dir).ignore;
  EXPECT_EQ(std::set<std::string>(ignore.begin(), ignore.end()), want);
  EXPECT_EQ(ignore.size(), want.size());
  const io::SafetensorsFile f = io::SafetensorsFile::open(rq.out_dir + "/model.safetensors");
  uint64_t bits = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears) {
      const std::string n = io::hf_module_name(l, id);
      if (const io::TensorInfo* t = f.find(n + ".weight")) {
        EXPECT_TRUE(p.dense.contains(l, id) || id == LinearId::kDown) << n;
        bits += 8 * t->nbytes;
      } else {
        EXPECT_FALSE(p.dense.contains(l, id)) << n;
        bits += 8 * (f.at(n + ".weight_packed").nbytes + f.at(n + ".weight_scale").nbytes);
      }
    }
  EXPECT_EQ(bits, p.bits);
  EXPECT_LE(p.bits, p.budget_bits);
}

// Measured sensitivities: every Linear's KL is positive, the score is the KL, the proxies are
// those of the statistics, and the choice is made from them; streamed and in memory alike.
TEST_F(MixedRun, MeasuredKlSensitivity) {
  QuantizeRequest rq = request("kl.gguf", 8.0);
  rq.dense_q8_0 = true;
  rq.sensitivity = Sensitivity::kKl;
  rq.sensitivity_samples = 2;
  const QuantizeResult r = quantize_model(hf_, rq);
  // The measured pass loads the whole model; the quantization itself still streams, and gives
  // the in-memory path's file.
  EXPECT_TRUE(r.streamed);
  ASSERT_TRUE(r.report.mixed);
  QuantizeRequest mem = rq;
  mem.out_dir = (root_ / "kl_memory.gguf").string();
  mem.stream = false;
  const QuantizeResult rm = quantize_model(hf_, mem);
  EXPECT_TRUE(r.report.mixed->dense.same(rm.report.mixed->dense, 5));
  EXPECT_TRUE(slurp(rq.out_dir) == slurp(mem.out_dir));
  QuantizeRequest rel = request("rel.gguf", 8.0);
  rel.dense_q8_0 = true;
  const QuantizeResult rr = quantize_model(hf_, rel);
  ASSERT_EQ(r.report.sensitivities.size(), rr.report.sensitivities.size());
  for (size_t i = 0; i < r.report.sensitivities.size(); ++i) {
    const LinearSensitivity& x = r.report.sensitivities[i];
    EXPECT_GT(x.kl, 0) << i;
    EXPECT_EQ(x.score, x.kl) << i;
    EXPECT_EQ(x.loss, rr.report.sensitivities[i].loss) << i;
    EXPECT_EQ(x.energy, rr.report.sensitivities[i].energy) << i;
    EXPECT_EQ(rr.report.sensitivities[i].kl, 0) << i;
  }
  EXPECT_LE(r.report.mixed->bits, r.report.mixed->budget_bits);
  EXPECT_NE(error_of([&] {
              QuantizeRequest s = rq;
              s.calib.text.clear();
              s.calib.stats = "stats.safetensors";
              quantize_model(hf_, s);
            }).find("sensitivity: kl runs the model on calibration text"),
            std::string::npos);
}

TEST_F(MixedRun, Refusals) {
  QuantizeRequest rq = request("never.gguf", 4.4);
  EXPECT_NE(error_of([&] { quantize_model(hf_, rq); }).find("target_bpw: 4.4 bits per weight"),
            std::string::npos);
  rq.target_bpw = 5.0;
  rq.calib = {};
  rq.options.method = Method::kSweepMse;
  EXPECT_NE(error_of([&] {
              quantize_model(hf_, rq);
            }).find("target_bpw: mixed precision measures each Linear's sensitivity"),
            std::string::npos);
  // stories260K's down_proj (F16 in a GGUF) lifts the least above 5.
  rq = request("never.gguf", 5.0);
  rq.dense_q8_0 = true;
  EXPECT_NE(error_of([&] {
              quantize_model(hf_, rq);
            }).find("target_bpw: 5 bits per weight is below this model's least: 7.2"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(rq.out_dir));
}

}  // namespace
}  // namespace scalesweep::pipeline

// Mixture-of-experts quantization (quantize_layer, quantized_weights): every expert Linear
// quantized, gate/up of an expert sharing one global scale, the router left dense, experts
// without enough calibration tokens data-free (data_free_method, RTN) and named, W4A4 input
// global scales of every expert by the documented policy (own amax / the layer's largest).
// The model: a tiny random Qwen3-MoE (model/test_util.h) whose layer 1 router is zeroed, so
// that every token goes to experts 3 and 5 of 6 there (torch.topk's tie order, model/moe.h).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::pipeline {
namespace {

using model::LinearId;

struct MoeFixture {
  model::Config c;
  model::Weights w;
  std::vector<int> toks;
  MoeFixture() {
    c = model::testing::small_config();
    c.arch = model::Arch::kQwen3Moe;
    c.qk_norm = true;
    c.head_dim = 16;
    c.n_experts = 6;
    c.experts_per_tok = 2;
    c.moe_hidden_dim = 32;
    c.norm_topk_prob = true;
    w = model::testing::random_model(c, 9);
    model::LayerWeights& L1 = w.layers[1];
    w.alloc(L1.router, L1.router.shape);  // zeros: experts 3 and 5 take every token
    toks = model::testing::token_stream(400, c.vocab_size);
  }
};

const LinearResult& find(const std::vector<LinearResult>& rs, int expert, LinearId id) {
  for (const LinearResult& r : rs)
    if (r.expert == expert && r.id == id) return r;
  throw std::runtime_error("no result");
}

TEST(MoeQuantize, DataFreeMethods) {
  EXPECT_EQ(data_free_method(Method::kSweepWmse), Method::kSweepMse);
  EXPECT_EQ(data_free_method(Method::kSweepHessian), Method::kSweepMse);
  EXPECT_EQ(data_free_method(Method::kExhaustiveWmse), Method::kExhaustiveMse);
  EXPECT_EQ(data_free_method(Method::kExhaustiveHessian), Method::kExhaustiveMse);
  EXPECT_EQ(data_free_method(Method::kOptFp8Wmse), Method::kOptFp8Mse);
  EXPECT_EQ(data_free_method(Method::kSweepMse), Method::kSweepMse);
  EXPECT_EQ(data_free_method(Method::kFourOverSix), Method::kFourOverSix);
}

// 4 x 16 = 64 calibration tokens, all routed to experts 3 and 5 of layer 1 (64 >= dim 48);
// the others saw none and fall back; W4A4 gives every expert a finite positive input scale.
TEST(MoeQuantize, ExpertsWithoutTokensFallBackAndTakeTheLayersLargestInputScale) {
  const MoeFixture f;
  const model::CalibStats cs = model::calibrate(f.w, f.toks, 4, 16, 3, 1);
  ASSERT_EQ(cs.layers[1].experts[3].routed, 64);
  ASSERT_EQ(cs.layers[1].experts[0].routed, 0);
  QuantizeOptions o;
  o.method = Method::kSweepWmse;
  o.gptq = true;
  o.w4a4 = true;
  const std::vector<LinearResult> rs = quantize_layer(f.w, 1, &cs, o);
  ASSERT_EQ(rs.size(), 4u + 3u * 6u);  // q, k, v, o, then 6 experts x 3; no router
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rs[i].expert, -1);
  const float C = default_max_block_scale(o.method);
  const float big_in = std::max(cs.layers[1].experts[3].in.amax, cs.layers[1].experts[5].in.amax);
  const float big_mid =
      std::max(cs.layers[1].experts[3].mid.amax, cs.layers[1].experts[5].mid.amax);
  for (int e = 0; e < 6; ++e) {
    const bool seen = e == 3 || e == 5;
    const model::LayerWeights::Expert& ex = f.w.layers[1].experts[static_cast<size_t>(e)];
    const LinearResult &g = find(rs, e, LinearId::kGate), &u = find(rs, e, LinearId::kUp),
                       &d = find(rs, e, LinearId::kDown);
    EXPECT_EQ(g.name, "model.layers.1.mlp.experts." + std::to_string(e) + ".gate_proj");
    EXPECT_EQ(d.name, "model.layers.1.mlp.experts." + std::to_string(e) + ".down_proj");
    // gate and up: one global scale from the larger amax; down its own.
    const float gu =
        global_scale_for_amax(std::max(model::tensor_amax(ex.w1), model::tensor_amax(ex.w3)), C);
    EXPECT_EQ(g.q.global_scale, gu);
    EXPECT_EQ(u.q.global_scale, gu);
    EXPECT_EQ(d.q.global_scale, global_scale_for_amax(model::tensor_amax(ex.w2), C));
    const model::ExpertStats& st = cs.layers[1].experts[static_cast<size_t>(e)];
    for (const LinearResult* r : {&g, &u, &d}) {
      EXPECT_EQ(r->data_free, !seen) << r->name;
      EXPECT_EQ(r->routed, seen ? 64 : 0);
      ASSERT_TRUE(r->input_global_scale.has_value());
      EXPECT_TRUE(std::isfinite(*r->input_global_scale) && *r->input_global_scale > 0);
      const float amax =
          r->id == LinearId::kDown ? (seen ? st.mid.amax : big_mid) : (seen ? st.in.amax : big_in);
      EXPECT_EQ(*r->input_global_scale, global_scale_for_amax(amax, C)) << r->name;
      EXPECT_EQ(*r->input_scale_source,
                seen ? InputScaleSource::kOwn : InputScaleSource::kLayerMax);
      // Seen experts ran GPTQ on their own ΣxxT; the others are RTN with sweep-mse.
      EXPECT_EQ(r->loss_gptq > 0, seen) << r->name;
    }
    if (!seen) {  // bit for bit the data-free RTN
      QuantConfig cfg;
      cfg.selector.method = Method::kSweepMse;
      cfg.global_scale = gu;
      const model::Tensor t = ex.w1;
      const QuantizedTensor q = quantize(t.data, t.shape[0], t.shape[1], {}, cfg);
      EXPECT_EQ(q.codes, g.q.codes);
      EXPECT_EQ(q.scales, g.q.scales);
    }
  }
  // --calib-all-experts statistics: every expert has 64 tokens; nobody falls back.
  const model::CalibStats all = model::calibrate(f.w, f.toks, 4, 16, 3, 1, {}, true, true);
  for (const LinearResult& r : quantize_layer(f.w, 1, &all, o)) {
    EXPECT_FALSE(r.data_free) << r.name;
    if (r.expert >= 0) {
      EXPECT_EQ(*r.input_scale_source, InputScaleSource::kOwn);
    }
  }
  // A threshold of 65 makes every expert of layer 1 data-free; W4A4 then takes the largest
  // amax of those that saw any token.
  o.expert_min_tokens = 65;
  for (const LinearResult& r : quantize_layer(f.w, 1, &cs, o)) {
    if (r.expert < 0) continue;
    EXPECT_TRUE(r.data_free);
    EXPECT_EQ(*r.input_global_scale,
              global_scale_for_amax(r.id == LinearId::kDown ? big_mid : big_in, C));
  }
}

// Without calibration (RTN, a data-free method) every expert is quantized and none is marked
// data-free; the dequantized model runs, its router the source's.
TEST(MoeQuantize, QuantizedWeightsReplaceEveryExpertAndKeepTheRouter) {
  const MoeFixture f;
  QuantizeOptions o;
  std::vector<LinearResult> rs;
  const model::Weights q = quantized_weights(f.w, nullptr, o, {}, &rs);
  EXPECT_EQ(rs.size(), 2u * (4u + 18u));
  for (const LinearResult& r : rs) EXPECT_FALSE(r.data_free) << r.name;
  for (int l = 0; l < 2; ++l) {
    const model::LayerWeights &a = f.w.layers[static_cast<size_t>(l)],
                              &b = q.layers[static_cast<size_t>(l)];
    EXPECT_EQ(a.router.data, b.router.data);
    for (int e = 0; e < 6; ++e) {
      const model::Tensor &x = a.experts[static_cast<size_t>(e)].w2,
                          &y = b.experts[static_cast<size_t>(e)].w2;
      ASSERT_NE(x.data, y.data);
      double err = 0, norm = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        err += (x.data[i] - y.data[i]) * double{x.data[i] - y.data[i]};
        norm += x.data[i] * double{x.data[i]};
      }
      EXPECT_GT(err, 0);
      EXPECT_LT(err / norm, 0.05);  // NVFP4's error, not another tensor
    }
  }
  model::Transformer tf(std::make_shared<const model::Weights>(q));
  const std::vector<float> logits = tf.forward(f.toks.data(), 12, 0);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// Statistics of a dense model (no experts) given for a MoE layer are refused naming the layer.
TEST(MoeQuantize, RefusesStatisticsWithoutExperts) {
  const MoeFixture f;
  model::CalibStats cs = model::calibrate(f.w, f.toks, 2, 16, 3, 1);
  cs.layers[1].experts.clear();
  QuantizeOptions o;
  o.method = Method::kSweepWmse;
  try {
    quantize_layer(f.w, 1, &cs, o);
    ADD_FAILURE() << "statistics without experts accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "model.layers.1: calibration statistics of 0 experts, the model has 6"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace scalesweep::pipeline

// The mixture-of-experts router (model/moe.h) on hand-made inputs, and the MoE forward pass of
// the Transformer against the naive reference of model/test_util.h.
#include "scalesweep/model/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::model {
namespace {

std::vector<int> topk(const std::vector<float>& v, int k) {
  std::vector<int> idx(static_cast<size_t>(k));
  topk_like_torch(v.data(), static_cast<int>(v.size()), k, idx.data());
  return idx;
}

// Expected orders are what torch.topk(torch.tensor(v), k).indices gives (torch 2.x, CPU).
TEST(MoeRouter, TopkBreaksTiesAsTorch) {
  EXPECT_EQ(topk({0.25f, 0.25f, 0.25f, 0.25f}, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(topk(std::vector<float>(8, 0.125f), 2), (std::vector<int>{6, 5}));
  EXPECT_EQ(topk({0.1f, 0.3f, 0.3f, 0.3f}, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(topk({0.3f, 0.1f, 0.3f, 0.3f, 0.0f, 0.3f}, 2), (std::vector<int>{3, 5}));
  // nth_element path with k = 8 of 128 equal values.
  EXPECT_EQ(topk(std::vector<float>(128, 1.0f / 128), 8),
            (std::vector<int>{84, 87, 86, 85, 82, 81, 88, 83}));
  // partial_sort path (k * 64 <= n): ties keep index order.
  EXPECT_EQ(topk(std::vector<float>(128, 1.0f / 128), 2), (std::vector<int>{0, 1}));
}

TEST(MoeRouter, TopkOrdersDistinctValuesAndNanFirst) {
  EXPECT_EQ(topk({0.5f, 0.2f, 0.3f}, 3), (std::vector<int>{0, 2, 1}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(topk({1.0f, nan, 2.0f}, 1), (std::vector<int>{1}));
  EXPECT_EQ(topk({1.0f, nan, 2.0f}, 2), (std::vector<int>{1, 2}));
  int idx[1];
  const float v[2] = {1, 2};
  EXPECT_THROW(topk_like_torch(v, 2, 0, idx), std::invalid_argument);
  EXPECT_THROW(topk_like_torch(v, 2, 3, idx), std::invalid_argument);
}

// logits ln(1), ln(2), ln(4), ln(1): probabilities 1/8, 2/8, 4/8, 1/8.
TEST(MoeRouter, RenormalisationOnAndOff) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(4.0f), 0.0f};
  for (bool renorm : {false, true}) {
    std::vector<float> l = logits;
    int idx[2];
    float w[2];
    route_token(l.data(), 4, 2, renorm, idx, w);
    EXPECT_EQ(idx[0], 2);
    EXPECT_EQ(idx[1], 1);
    EXPECT_NEAR(w[0], renorm ? 2.0 / 3 : 0.5, 1e-6) << renorm;
    EXPECT_NEAR(w[1], renorm ? 1.0 / 3 : 0.25, 1e-6) << renorm;
    EXPECT_NEAR(l[0], 0.125, 1e-6);  // the probabilities replace the logits
  }
  // k = n_experts with renormalisation: the probabilities themselves (they sum to 1).
  std::vector<float> l = logits;
  int idx[4];
  float w[4];
  route_token(l.data(), 4, 4, true, idx, w);
  EXPECT_EQ((std::vector<int>(idx, idx + 4)), (std::vector<int>{2, 1, 0, 3}));
  EXPECT_NEAR(w[0] + w[1] + w[2] + w[3], 1.0, 1e-6);
  EXPECT_THROW(route_token(l.data(), 4, 5, true, idx, w), std::invalid_argument);
  EXPECT_THROW(route_token(l.data(), 4, 0, true, idx, w), std::invalid_argument);
}

TEST(MoeRouter, EqualLogitsPickTorchsExperts) {  // a zero router: every probability 1/4
  std::vector<float> l(4, 0.0f);
  int idx[2];
  float w[2];
  route_token(l.data(), 4, 2, false, idx, w);
  EXPECT_EQ(idx[0], 2);
  EXPECT_EQ(idx[1], 3);
  EXPECT_FLOAT_EQ(w[0], 0.25f);
  EXPECT_FLOAT_EQ(w[1], 0.25f);
}

TEST(MoeConfig, LayersFollowSparseStepAndDenseLayers) {
  Config c;
  EXPECT_FALSE(c.moe());
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_NO_THROW(refuse_moe(c, "quantize"));
  c.n_experts = 4;
  c.experts_per_tok = 2;
  EXPECT_TRUE(c.moe_layer(0));
  c.moe_sparse_step = 2;  // (l + 1) % 2 == 0: layers 1, 3, ...
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(1));
  EXPECT_TRUE(c.moe_layer(3));
  c.dense_layers = {3};
  EXPECT_FALSE(c.moe_layer(3));
  const std::string err =
      testing::error_message([&] { refuse_moe(c, "quantize"); }, "a MoE config was not refused");
  EXPECT_EQ(err, "mixture-of-experts models are not yet supported by quantize");
}

Config moe_config(Arch arch, bool renorm) {
  Config c = testing::with_experts(testing::small_config(), 6, 2, 20, renorm);
  c.arch = arch;
  c.n_layers = 3;
  if (arch == Arch::kQwen3Moe) {
    c.qk_norm = true;
    c.head_dim = 16;
  }
  return c;
}

double max_abs_diff(const float* a, const std::vector<double>& b, size_t off, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[off + i]));
  return m;
}

// Prefill, decode and a prefill continuing through the cache all match the reference.
void check_moe_against_reference(const Config& c) {
  auto w = std::make_shared<const Weights>(testing::random_model(c, 11));
  const std::vector<int> toks = testing::token_stream(24, c.vocab_size);
  const std::vector<double> ref = testing::reference_forward(*w, toks);
  const size_t V = static_cast<size_t>(c.vocab_size);
  Transformer pre(w);
  const std::vector<float> all = pre.forward(toks.data(), 24, 0);
  EXPECT_LT(max_abs_diff(all.data(), ref, 0, all.size()), 2e-4);
  Transformer dec(w);
  for (int t = 0; t < 24; ++t)
    EXPECT_LT(max_abs_diff(dec.decode(toks[t], t), ref, t * V, V), 2e-4) << "decode " << t;
  Transformer part(w);
  part.forward(toks.data(), 9, 0);
  const std::vector<float> rest = part.forward(toks.data() + 9, 15, 9);
  EXPECT_LT(max_abs_diff(rest.data(), ref, 9 * V, rest.size()), 2e-4);
}

TEST(MoeTransformer, Qwen3MoeMatchesReference) {
  check_moe_against_reference(moe_config(Arch::kQwen3Moe, false));
  check_moe_against_reference(moe_config(Arch::kQwen3Moe, true));
}

TEST(MoeTransformer, MixtralMatchesReference) {
  check_moe_against_reference(moe_config(Arch::kMixtral, true));
}

TEST(MoeTransformer, DenseLayersBetweenMoeLayers) {
  Config c = moe_config(Arch::kQwen3Moe, true);
  c.n_layers = 4;
  c.moe_sparse_step = 2;  // layers 1 and 3 MoE ...
  c.dense_layers = {3};   // ... but 3 is dense
  ASSERT_FALSE(c.moe_layer(0));
  ASSERT_TRUE(c.moe_layer(1));
  ASSERT_FALSE(c.moe_layer(3));
  check_moe_against_reference(c);
}

// A zero router gives every expert probability 1/6: every token goes to experts 3 and 5 (what
// torch.topk picks among six equal values, k = 2) with weight 1/2 each. The four experts never
// chosen are never run: NaN weights there leave the logits equal, bit for bit, to the same
// model with those experts zeroed, and different from a model whose expert 3 differs.
TEST(MoeTransformer, ZeroRouterPicksTorchsTiesAndSkipsTheOthers) {
  Config c = moe_config(Arch::kMixtral, true);
  c.n_layers = 1;
  const Weights base = testing::random_model(c, 5);
  const auto variant = [&](float other, bool change3) {
    Weights w = base;
    LayerWeights& L = w.layers[0];
    w.alloc(L.router, L.router.shape);  // zeros
    for (int e = 0; e < c.n_experts; ++e) {
      LayerWeights::Expert& ex = L.experts[static_cast<size_t>(e)];
      if (e == 3 && change3) {
        float* p = w.alloc(ex.w2, ex.w2.shape);
        std::fill(p, p + ex.w2.numel(), 0.01f);
      }
      if (e == 3 || e == 5) continue;
      for (Tensor* t : {&ex.w1, &ex.w3, &ex.w2}) {
        float* p = w.alloc(*t, t->shape);
        std::fill(p, p + t->numel(), other);
      }
    }
    const auto shared = std::make_shared<const Weights>(std::move(w));
    Transformer tf(shared);
    const std::vector<int> toks = testing::token_stream(16, c.vocab_size);
    std::vector<float> out = tf.forward(toks.data(), 16, 0);
    Transformer one(shared);  // decode runs the same route
    const float* d = one.decode(toks[0], 0);
    for (int v = 0; v < c.vocab_size; ++v) EXPECT_NEAR(d[v], out[static_cast<size_t>(v)], 1e-5);
    return out;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_nan = variant(nan, false), zeroed = variant(0.0f, false);
  ASSERT_EQ(with_nan.size(), zeroed.size());
  for (size_t i = 0; i < zeroed.size(); ++i) {
    ASSERT_TRUE(std::isfinite(with_nan[i])) << i;
    ASSERT_EQ(with_nan[i], zeroed[i]) << i;
  }
  const std::vector<float> other3 = variant(0.0f, true);
  double diff = 0;
  for (size_t i = 0; i < zeroed.size(); ++i)
    diff = std::max(diff, std::fabs(double{other3[i]} - zeroed[i]));
  EXPECT_GT(diff, 1e-4);  // expert 3 is on the path
}

TEST(MoeTransformer, RefusesALayerWithoutItsExperts) {
  Config c = moe_config(Arch::kMixtral, true);
  Weights w = testing::random_model(c, 3);
  w.layers[1].experts.pop_back();
  Transformer t(std::make_shared<const Weights>(std::move(w)));
  const std::vector<int> toks = {1, 2, 3};
  const std::string err = testing::error_message([&] { t.forward(toks.data(), 3, 0); },
                                                 "a layer with 5 of 6 experts ran");
  EXPECT_NE(err.find("layer 1: a mixture-of-experts layer needs a router [6, 48] and 6 experts "
                     "(has 5)"),
            std::string::npos)
      << err;
  Config bad = c;
  bad.experts_per_tok = 7;
  EXPECT_THROW(Transformer(std::make_shared<const Weights>(testing::random_model(bad, 3))),
               std::invalid_argument);
}

// W4A4 of a MoE layer (a checkpoint's RuntimeQuant): each expert quantizes the rows routed to
// it with its own input global scales (gate/up input, down input); 0 leaves that input in full
// precision. With a zero router only experts 3 and 5 run: another expert's scales change
// nothing, expert 3's change the logits; every scale 0 is the unquantized model bit for bit.
// Transformers' reference of the same quantization: python/tests/test_moe_quantize.py.
TEST(MoeTransformer, W4A4ExpertsQuantizeTheirRoutedRowsWithTheirOwnScales) {
  Config c = moe_config(Arch::kMixtral, true);
  c.n_layers = 1;
  Weights base = testing::random_model(c, 5);
  base.alloc(base.layers[0].router, base.layers[0].router.shape);  // zeros: experts 3 and 5
  const auto w = std::make_shared<const Weights>(std::move(base));
  const std::vector<int> toks = testing::token_stream(16, c.vocab_size);
  const auto run = [&](const std::vector<std::array<float, 2>>& gs) {
    auto rq = std::make_shared<RuntimeQuant>();
    rq->acts = true;
    rq->cfg = parse_sim_quant("WA", Method::kAbsMax).cfg;
    rq->layers.resize(1);
    rq->layers[0].input_on.fill(false);  // the attention inputs stay full precision
    rq->layers[0].expert_input_gs = gs;
    Transformer tf(w);
    tf.set_runtime_quant(rq);
    return tf.forward(toks.data(), 16, 0);
  };
  const std::vector<float> plain = Transformer(w).forward(toks.data(), 16, 0);
  const std::vector<std::array<float, 2>> off(6, {0.0f, 0.0f});
  EXPECT_EQ(run(off), plain);
  std::vector<std::array<float, 2>> on(6, {900.0f, 700.0f});
  const std::vector<float> quant = run(on);
  const auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
    return m;
  };
  EXPECT_GT(max_diff(quant, plain), 1e-4);
  on[0] = {5.0f, 5.0f};  // never routed to
  EXPECT_EQ(run(on), quant);
  on[3] = {5.0f, 700.0f};  // routed to: its gate/up input on another grid
  EXPECT_GT(max_diff(run(on), quant), 1e-4);
  on[3] = {900.0f, 0.0f};  // its down input in full precision
  EXPECT_GT(max_diff(run(on), quant), 1e-6);
  const std::string err = testing::error_message(
      [&] {
        run(std::vector<std::array<float, 2>>(5, {1.0f, 1.0f}));
      },
      "5 experts' scales for 6 experts ran");
  EXPECT_EQ(err,
            "layer 0: activation quantization of a mixture-of-experts layer needs the input "
            "global scales of its 6 experts (has 5)");
}

// ---- calibration statistics of MoE layers (model/calib.h) ----

// An observer that keeps nothing: with all_experts the forward must not change.
class NullObserver : public Observer {
 public:
  void on_input(int, InputId, const float*, int, int) override {}
  void on_qkv(int, const float*, const float*, const float*, int) override {}
};

Config calib_moe_config() {
  Config c = moe_config(Arch::kQwen3Moe, true);
  c.moe_sparse_step = 2;  // layer 1 MoE, layers 0 and 2 dense
  return c;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b, double scale) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]) / scale);
  return m;
}

TEST(MoeCalibrate, ExpertsSeeTheirRoutedTokens) {
  const Config c = calib_moe_config();
  const Weights w = testing::random_model(c, 21);
  const std::vector<int> toks = testing::token_stream(300, c.vocab_size);
  const CalibStats s = calibrate(w, toks, 3, 16, 7, 1);
  EXPECT_NO_THROW(check_calib_stats(s, c));
  ASSERT_EQ(s.layers.size(), 3u);
  EXPECT_TRUE(s.layers[0].experts.empty());
  EXPECT_TRUE(s.layers[2].experts.empty());
  EXPECT_EQ(s.layers[0].input(InputId::kMlpOut).dim, c.hidden_dim);
  const LayerStats& L = s.layers[1];
  ASSERT_EQ(L.experts.size(), 6u);
  EXPECT_EQ(L.input(InputId::kMlpOut).dim, 0);  // no dense down projection
  const InputStats& router = L.input(InputId::kMlpIn);
  EXPECT_EQ(router.tokens, 48);
  int64_t routed = 0;
  std::vector<double> sum(router.xtx.size(), 0.0);
  for (const ExpertStats& e : L.experts) {
    EXPECT_EQ(e.in.tokens, e.routed);
    EXPECT_EQ(e.mid.tokens, e.routed);
    EXPECT_EQ(e.in.dim, c.dim);
    EXPECT_EQ(e.mid.dim, c.moe_hidden_dim);
    EXPECT_LE(e.in.amax, router.amax);
    routed += e.routed;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += e.in.xtx[i];
  }
  EXPECT_EQ(routed, 48 * c.experts_per_tok);
  // Every token is in experts_per_tok experts' sums: Σ_e ΣxxT_e = k ΣxxT of the router input.
  std::vector<double> k_router = router.xtx;
  for (double& v : k_router) v *= c.experts_per_tok;
  double scale = 0;
  for (double v : k_router) scale = std::max(scale, std::fabs(v));
  EXPECT_LT(max_rel_diff(sum, k_router, scale), 1e-12);
}

TEST(MoeCalibrate, AllExpertsSeeEveryTokenAndKeepTheRoutedForward) {
  const Config c = calib_moe_config();
  const Weights w = testing::random_model(c, 21);
  const std::vector<int> toks = testing::token_stream(300, c.vocab_size);
  const CalibStats routed = calibrate(w, toks, 3, 16, 7, 1);
  const CalibStats all = calibrate(w, toks, 3, 16, 7, 1, {}, true, true);
  EXPECT_NO_THROW(check_calib_stats(all, c));
  const LayerStats& L = all.layers[1];
  bool some_differ = false;
  for (size_t e = 0; e < L.experts.size(); ++e) {
    EXPECT_EQ(L.experts[e].in.tokens, 48) << e;
    EXPECT_EQ(L.experts[e].mid.tokens, 48) << e;
    EXPECT_EQ(L.experts[e].routed, routed.layers[1].experts[e].routed) << e;
    EXPECT_EQ(L.experts[e].in.xtx, L.input(InputId::kMlpIn).xtx) << e;  // the same rows
    some_differ |= L.experts[e].mid.amax != routed.layers[1].experts[e].mid.amax;
  }
  EXPECT_TRUE(some_differ);
  // The other layers' statistics do not change: the forward is the routed one.
  EXPECT_EQ(all.layers[2].input(InputId::kAttnIn).xtx,
            routed.layers[2].input(InputId::kAttnIn).xtx);
  // And the logits with an observer and all experts are those without, bit for bit.
  const auto shared = std::make_shared<const Weights>(w);
  Transformer plain(shared), observed(shared);
  NullObserver obs;
  observed.set_observer(&obs);
  observed.set_calib_all_experts(true);
  const std::vector<int> seq = testing::token_stream(20, c.vocab_size);
  EXPECT_EQ(plain.forward(seq.data(), 20, 0), observed.forward(seq.data(), 20, 0));
}

// A zero router sends every token to experts 3 and 5 (model/moe.h's ties): the other four see
// no token; with all_experts they see every token and their routed count stays 0.
TEST(MoeCalibrate, ExpertsTheRouterNeverPicks) {
  Config c = calib_moe_config();
  Weights w = testing::random_model(c, 4);
  LayerWeights& L1 = w.layers[1];
  w.alloc(L1.router, L1.router.shape);  // zeros
  const std::vector<int> toks = testing::token_stream(300, c.vocab_size);
  for (const bool all : {false, true}) {
    const CalibStats s = calibrate(w, toks, 2, 12, 3, 1, {}, true, all);
    const auto& ex = s.layers[1].experts;
    for (int e = 0; e < 6; ++e) {
      const bool chosen = e == 3 || e == 5;
      EXPECT_EQ(ex[static_cast<size_t>(e)].routed, chosen ? 24 : 0) << e;
      EXPECT_EQ(ex[static_cast<size_t>(e)].in.tokens, chosen || all ? 24 : 0) << e;
      if (!chosen && !all) {
        EXPECT_EQ(ex[static_cast<size_t>(e)].in.amax, 0.0f);
        for (double v : ex[static_cast<size_t>(e)].mid.xtx) ASSERT_EQ(v, 0.0);
      }
    }
  }
}

TEST(MoeCalibrate, CheckNamesTheMismatchedExperts) {
  const Config c = calib_moe_config();
  const Weights w = testing::random_model(c, 21);
  const std::vector<int> toks = testing::token_stream(300, c.vocab_size);
  CalibStats s = calibrate(w, toks, 1, 8, 7, 1, {}, false);
  CalibStats fewer = s;
  fewer.layers[1].experts.pop_back();
  const std::string fewer_err =
      testing::error_message([&] { check_calib_stats(fewer, c); }, "5 experts of 6 accepted");
  EXPECT_NE(fewer_err.find("layer 1 has statistics of 5 experts, the model 6"), std::string::npos)
      << fewer_err;
  CalibStats narrow = s;
  narrow.layers[1].experts[4].mid.dim = 19;
  narrow.layers[1].experts[4].mid.xdiag.resize(19);
  const std::string narrow_err =
      testing::error_message([&] { check_calib_stats(narrow, c); }, "a narrow expert accepted");
  EXPECT_NE(narrow_err.find("layer 1 expert 4 input mlp_out has dim 19, expected 20"),
            std::string::npos)
      << narrow_err;
  // The dense statistics of a MoE model's layer are refused too (no experts in layer 1).
  Config dc = testing::small_config();
  dc.n_layers = 3;
  EXPECT_THROW(check_calib_stats(s, dc), std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep::model

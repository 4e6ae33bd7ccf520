// Simulated quantization formats (model/simquant.h): MXFP4 next to NVFP4.
#include "scalesweep/model/simquant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::model {
namespace {

struct Lin {
  Tensor LayerWeights::*m;
  InputId input;
  const char* name;
};
const Lin kLinears[] = {{&LayerWeights::wq, InputId::kAttnIn, "self_attn.q_proj"},
                        {&LayerWeights::wk, InputId::kAttnIn, "self_attn.k_proj"},
                        {&LayerWeights::wv, InputId::kAttnIn, "self_attn.v_proj"},
                        {&LayerWeights::wo, InputId::kAttnOut, "self_attn.o_proj"},
                        {&LayerWeights::w1, InputId::kMlpIn, "mlp.gate_proj"},
                        {&LayerWeights::w3, InputId::kMlpIn, "mlp.up_proj"},
                        {&LayerWeights::w2, InputId::kMlpOut, "mlp.down_proj"}};

TEST(SimQuantFormat, SettingNameTable) {
  const std::vector<QuantSetting> all = {QuantSetting::kNone, QuantSetting::kW, QuantSetting::kWA,
                                         QuantSetting::kWAKV, QuantSetting::kWAKVQ};
  EXPECT_EQ(kQuantSettingNames.values(), all);
  for (QuantSetting v : all) {
    const std::string n(kQuantSettingNames.name(v));
    EXPECT_EQ(kQuantSettingNames.parse(n), v) << n;
    // parse_sim_quant reads the table: the spec names the same setting.
    const SimQuantSpec s = parse_sim_quant(n, Method::kSweepMse);
    EXPECT_EQ(s.name(), v == QuantSetting::kNone ? std::string("FP") : n);
  }
  EXPECT_EQ(kQuantSettingNames.parse("wakvq"), QuantSetting::kWAKVQ);
  EXPECT_EQ(kQuantSettingNames.parse("FP"), QuantSetting::kNone);
  const std::string err =
      testing::error_message([&] { parse_sim_quant("WX", Method::kSweepMse); }, "WX accepted");
  EXPECT_NE(err.find("unknown quantization setting 'WX' (accepted: none, W, WA, WAKV, WAKVQ)"),
            std::string::npos)
      << err;
}

TEST(SimQuantFormat, ParseFormatsBlocksAndImpossibleCombinations) {
  EXPECT_EQ(kTensorFormatNames.parse("nvfp4"), TensorFormat::kNvfp4);
  EXPECT_EQ(kTensorFormatNames.parse("MXFP4"), TensorFormat::kMxfp4);
  EXPECT_THROW(kTensorFormatNames.parse("fp8"), std::invalid_argument);
  EXPECT_EQ(kTensorFormatNames.name(TensorFormat::kMxfp4), "mxfp4");
  EXPECT_EQ(kTensorFormatNames.name(TensorFormat::kNvfp4), "nvfp4");
  // Block 0 = the format's default.
  EXPECT_EQ(parse_sim_quant("W", Method::kSweepMse, 0).cfg.block, 16);
  const SimQuantSpec mx = parse_sim_quant("WA", Method::kSweepMse, 0, TensorFormat::kMxfp4);
  EXPECT_EQ(mx.cfg.block, 32);
  EXPECT_EQ(mx.cfg.format, TensorFormat::kMxfp4);
  EXPECT_EQ(parse_sim_quant("W", Method::kAbsMax, 32, TensorFormat::kMxfp4).cfg.block, 32);
  for (int b : {8, 16, 64}) {
    const std::string err = testing::error_message(
        [&] { parse_sim_quant("W", Method::kAbsMax, b, TensorFormat::kMxfp4); },
        "mxfp4 block " + std::to_string(b) + " accepted");
    EXPECT_NE(err.find("MXFP4"), std::string::npos) << err;
    EXPECT_NE(err.find(std::to_string(b)), std::string::npos) << err;
    EXPECT_EQ(parse_sim_quant("W", Method::kAbsMax, b).cfg.block, b);  // fine for NVFP4
  }
  EXPECT_THROW(parse_sim_quant("W", Method::kAbsMax, 24), std::invalid_argument);
  // `sweep` needs a window that simulated quantization cannot take: refused up front.
  EXPECT_THROW(parse_sim_quant("W", Method::kSweep), std::invalid_argument);
  EXPECT_THROW(parse_sim_quant("W", Method::kSweep, 0, TensorFormat::kMxfp4),
               std::invalid_argument);
}

// Simulated NVFP4 weights with 16-element blocks stay packed (kNvfp4: codes, E4M3 scales and
// the group's global scale) and decode to the quant layer's fake quantization bit for bit, for
// every selector with a packed form; opt-fp32 (continuous scales) and other blocks are fp32.
TEST(SimQuantFormat, Nvfp4WeightsStayPackedAndDecodeToTheFakeQuantization) {
  const Config c = testing::small_config();  // dim 48
  const Weights w = testing::random_model(c, 12);
  const CalibStats stats = calibrate(w, testing::token_stream(200, c.vocab_size), 4, 32, 0, 1);
  for (Method m : {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
                   Method::kExhaustiveMse, Method::kOptFp8Wmse, Method::kOptFp32}) {
    const Weights q = quantize_weights(w, parse_sim_quant("W", m, 16), &stats);
    for (int l = 0; l < c.n_layers; ++l)
      for (const Lin& lin : kLinears) {
        const Tensor& src = w.layers[l].*lin.m;
        const Tensor& got = q.layers[l].*lin.m;
        SCOPED_TRACE(std::string(kMethodNames.name(m)) + " layer " + std::to_string(l) + " " +
                     lin.name);
        if (m == Method::kOptFp32) {
          EXPECT_EQ(got.dtype, WeightDType::kF32);
          continue;
        }
        ASSERT_EQ(got.dtype, WeightDType::kNvfp4);
        QuantConfig cfg;
        cfg.block = 16;
        cfg.selector.method = m;
        cfg.global_scale = got.nvfp4_global_scale;  // the group's, checked below
        std::vector<float> imp;
        Importance im;
        if (method_is_weighted(m)) {
          const InputStats& is = stats.layers[l].input(lin.input);
          for (int64_t j = 0; j < src.shape[1]; ++j) imp.push_back(static_cast<float>(is.diag(j)));
          im.kind = ImportanceKind::kPerColumn;
          im.data = imp.data();
        }
        const std::vector<float> ref =
            fake_quantize(src.data, src.shape[0], src.shape[1], im, cfg, lin.name);
        const std::vector<float> dec = to_f32(got);
        ASSERT_EQ(dec.size(), ref.size());
        EXPECT_EQ(std::memcmp(dec.data(), ref.data(), ref.size() * sizeof(float)), 0);
        // One global scale per group of Linears sharing an input (from the group's amax).
        float amax = 0;
        for (const Lin& o : kLinears)
          if (o.input == lin.input) amax = std::max(amax, tensor_amax(w.layers[l].*o.m));
        EXPECT_EQ(got.nvfp4_global_scale, global_scale_for_amax(amax, default_max_block_scale(m)));
      }
  }
  const Weights b32 = quantize_weights(w, parse_sim_quant("W", Method::kAbsMax, 32), &stats);
  EXPECT_EQ(b32.layers[0].wq.dtype, WeightDType::kF32);
}

// The simulated MXFP4 weights are the quant layer's MXFP4 fake quantization, bit for bit
// (every Linear, every selector, weighted ones with the calibration importance), and they are
// MXFP4: every block of 32 is an FP4 grid times one power of two.
TEST(SimQuantFormat, Mxfp4WeightsEqualQuantLayerBitForBit) {
  const Config c = testing::small_config();  // dim 48: K = 48 has a partial block of 16
  const Weights w = testing::random_model(c, 11);
  const CalibStats stats = calibrate(w, testing::token_stream(200, c.vocab_size), 4, 32, 0, 1);
  for (Method m : {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
                   Method::kExhaustiveMse, Method::kOptFp8Wmse}) {
    const SimQuantSpec spec = parse_sim_quant("W", m, 0, TensorFormat::kMxfp4);
    const Weights q = quantize_weights(w, spec, &stats);
    const Weights nv = quantize_weights(w, parse_sim_quant("W", m, 32), &stats);
    for (int l = 0; l < c.n_layers; ++l)
      for (const Lin& lin : kLinears) {
        const Tensor& src = w.layers[l].*lin.m;
        const Tensor& got = q.layers[l].*lin.m;
        const int64_t rows = src.shape[0], cols = src.shape[1];
        QuantConfig cfg;
        cfg.format = TensorFormat::kMxfp4;
        cfg.block = 32;
        cfg.selector.method = m;
        std::vector<float> imp;
        Importance im;
        if (method_is_weighted(m)) {
          const InputStats& is = stats.layers[l].input(lin.input);
          for (int64_t j = 0; j < cols; ++j) imp.push_back(static_cast<float>(is.diag(j)));
          im.kind = ImportanceKind::kPerColumn;
          im.data = imp.data();
        }
        const std::vector<float> ref = fake_quantize(src.data, rows, cols, im, cfg, lin.name);
        ASSERT_EQ(got.numel(), static_cast<int64_t>(ref.size()));
        EXPECT_EQ(std::memcmp(got.data, ref.data(), ref.size() * sizeof(float)), 0)
            << kMethodNames.name(m) << " layer " << l << " " << lin.name;
        // Not the NVFP4 result of the same block size.
        EXPECT_NE(std::memcmp((nv.layers[l].*lin.m).data, ref.data(), ref.size() * sizeof(float)),
                  0)
            << kMethodNames.name(m) << " layer " << l << " " << lin.name;
        // Every block: values q * 2^e with q on the FP4 grid {0, .5, 1, 1.5, 2, 3, 4, 6}.
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t b0 = 0; b0 < cols; b0 += 32) {
            const int64_t b1 = std::min<int64_t>(cols, b0 + 32);
            float amax = 0;
            for (int64_t j = b0; j < b1; ++j)
              amax = std::max(amax, std::fabs(got.data[r * cols + j]));
            if (amax == 0) continue;
            bool any_scale = false;
            for (int e = -140; e <= 20 && !any_scale; ++e) {
              bool ok = true;
              for (int64_t j = b0; j < b1 && ok; ++j) {
                const double v = std::fabs(got.data[r * cols + j]) / std::ldexp(1.0, e);
                ok = v == 0 || v == 0.5 || v == 1 || v == 1.5 || v == 2 || v == 3 || v == 4 ||
                     v == 6;
              }
              any_scale = ok;
            }
            ASSERT_TRUE(any_scale) << kMethodNames.name(m) << " layer " << l << " " << lin.name
                                   << " row " << r << " block " << b0 / 32;
          }
      }
  }
}

// MXFP4 has no global scale: the activation quantization does not depend on the calibration
// amax (which only feeds NVFP4's static global scales), while it does quantize.
TEST(SimQuantFormat, Mxfp4ActivationsUseNoGlobalScale) {
  Config c = testing::small_config();
  c.dim = 64;  // K a multiple of 32 for attn_in / mlp_in
  auto w = std::make_shared<const Weights>(testing::random_model(c, 3));
  const auto toks = testing::token_stream(200, c.vocab_size);
  const CalibStats stats = calibrate(*w, toks, 4, 32, 0, 1);
  CalibStats scaled = stats;
  for (LayerStats& L : scaled.layers) {
    for (InputStats& in : L.inputs) in.amax *= 3.7f;
    L.q_amax *= 3.7f;
    L.k_amax *= 3.7f;
    L.v_amax *= 3.7f;
  }
  auto logits = [&](TensorFormat f, const char* setting, const CalibStats& s) {
    auto tf = make_sim_quant_transformer(w, parse_sim_quant(setting, Method::kSweepMse, 0, f), &s);
    return tf->forward(toks.data(), 24, 0);
  };
  const auto mx = logits(TensorFormat::kMxfp4, "WAKVQ", stats);
  for (float v : mx) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(mx, logits(TensorFormat::kMxfp4, "WAKVQ", scaled));
  EXPECT_NE(logits(TensorFormat::kNvfp4, "WAKVQ", stats),
            logits(TensorFormat::kNvfp4, "WAKVQ", scaled));
  EXPECT_NE(mx, logits(TensorFormat::kMxfp4, "W", stats));      // activations are quantized
  EXPECT_NE(mx, logits(TensorFormat::kNvfp4, "WAKVQ", stats));  // and differently from NVFP4
  // Prefill and decode agree under MXFP4 too (per-token block scales).
  auto tf = make_sim_quant_transformer(
      w, parse_sim_quant("WAKVQ", Method::kSweepMse, 0, TensorFormat::kMxfp4), &stats);
  EXPECT_LT(testing::max_decode_diff(*tf, toks, 24, mx), 0.5);
}

}  // namespace
}  // namespace scalesweep::model

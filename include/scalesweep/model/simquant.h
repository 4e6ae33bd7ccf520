// Simulated NVFP4 or MXFP4 in the forward pass (quantize-dequantize, as the paper's
// experiments do):
//   W  : every Linear weight except lm_head, once at load (q/k/v and gate/up share one
//        global scale, as fused projections do in vLLM / compressed-tensors);
//   A  : every Linear input, static global scale from the calibration amax, block scales
//        chosen per token at run time (q/k/v share one quantized input, gate/up too);
//   KV : keys (after RoPE) and values as they enter the cache;
//   Q  : query states (after RoPE) before the scores.
// NVFP4: E4M3 block scales and a per-tensor global scale (6C/amax; fused projections share
// the weight one, activations use the calibration amax), block 8/16/32/64. MXFP4 (OCP MX):
// UE8M0 block scales, no global scale, block 32 only; the same selectors run over the UE8M0
// patterns (their UE8M0 windows: docs/BOUNDS.md).
// Importance for weighted selectors (SPEC): weights use diag(Σ XᵀX) of their input; Linear
// inputs use the input-channel squared norms of the Linear(s) reading them; Q uses K's
// channel norms, K uses Q's, V uses W_O's input-channel norms (GQA: summed over the query
// heads sharing a KV head, or repeated to them).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "scalesweep/model/calib.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::model {

// Which tensors a simulated-quantization run quantizes (the settings of the paper's tables).
enum class QuantSetting { kNone, kW, kWA, kWAKV, kWAKVQ };
// Case-insensitive; "fp" and "" are accepted for none.
inline constexpr auto kQuantSettingNames =
    make_names<QuantSetting>("quantization setting",
                             {{QuantSetting::kNone, "none"},
                              {QuantSetting::kW, "W"},
                              {QuantSetting::kWA, "WA"},
                              {QuantSetting::kWAKV, "WAKV"},
                              {QuantSetting::kWAKVQ, "WAKVQ"},
                              {QuantSetting::kNone, "fp"},
                              {QuantSetting::kNone, ""}},
                             true);

struct SimQuantSpec {
  bool weights = false, acts = false, kv = false, query = false;
  QuantConfig cfg;  // format, block, selector (method); global/max scale left default
  bool any() const { return weights || acts || kv || query; }
  // Calibration statistics are needed (runtime global scales, or weighted weight selectors).
  bool needs_stats() const {
    return acts || kv || query || (weights && method_needs_calibration(cfg.selector.method));
  }
  std::string name() const;  // "FP", "W", "WA", "WAKV", "WAKVQ"
};

// The block size a format uses when none is given: 16 (NVFP4), 32 (MXFP4).
int default_block(TensorFormat f);

// Parses a setting of kQuantSettingNames; throws std::invalid_argument listing them. `block` 0 =
// default_block(format). Impossible combinations throw std::invalid_argument before any work: a
// block size other than 8/16/32/64, MXFP4 with a block other than 32 (check_block), method `sweep`
// (it needs an explicit window, which simulated quantization does not take).
SimQuantSpec parse_sim_quant(std::string_view setting, Method method, int block = 16,
                             TensorFormat format = TensorFormat::kNvfp4);

// A copy of `w` whose Linear weights (not lm_head, not embeddings) are quantize-dequantized.
// NVFP4 with 16-element blocks (every method but opt-fp32) stays packed (WeightDType::kNvfp4:
// 4.5 bits a weight, decoded to the fake-quantized values bit for bit); other formats, blocks
// and opt-fp32 are fp32. `stats` is required for weighted methods. `progress(done, total)` per
// layer.
Weights quantize_weights(const Weights& w, const SimQuantSpec& spec, const CalibStats* stats,
                         const std::function<void(int, int)>& progress = {});

// Run-time quantizer for A / KV / Q from calibration statistics and the FP weights.
std::shared_ptr<RuntimeQuant> make_runtime_quant(const Weights& fp, const SimQuantSpec& spec,
                                                 const CalibStats& stats);

// Both steps: a Transformer running `spec` on `fp`.
std::unique_ptr<Transformer> make_sim_quant_transformer(std::shared_ptr<const Weights> fp,
                                                        const SimQuantSpec& spec,
                                                        const CalibStats* stats, int max_ctx = 0);

}  // namespace scalesweep::model

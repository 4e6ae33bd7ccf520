// Simulated NVFP4 in the forward pass (quantize-dequantize, as the paper's experiments do):
//   W  : every Linear weight except lm_head, once at load (q/k/v and gate/up share one
//        global scale, as fused projections do in vLLM / compressed-tensors);
//   A  : every Linear input, static global scale from the calibration amax, block scales
//        chosen per token at run time (q/k/v share one quantized input, gate/up too);
//   KV : keys (after RoPE) and values as they enter the cache;
//   Q  : query states (after RoPE) before the scores.
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
#include "scalesweep/model/config.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::model {

struct SimQuantSpec {
  bool weights = false, acts = false, kv = false, query = false;
  QuantConfig cfg;  // format, block, selector (method); global/max scale left default
  bool any() const { return weights || acts || kv || query; }
  // Calibration statistics are needed (runtime global scales, or weighted weight selectors).
  bool needs_stats() const {
    return acts || kv || query || (weights && method_is_weighted(cfg.selector.method));
  }
  std::string name() const;  // "FP", "W", "WA", "WAKV", "WAKVQ"
};

// Parses "none"/"fp", "W", "WA", "WAKV", "WAKVQ" (case-insensitive); throws
// std::invalid_argument listing the valid settings.
SimQuantSpec parse_sim_quant(std::string_view setting, Method method, int block = 16);

// A copy of `w` whose Linear weights (not lm_head, not embeddings) are quantize-dequantized.
// `stats` is required for weighted methods. `progress(done, total)` per layer.
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

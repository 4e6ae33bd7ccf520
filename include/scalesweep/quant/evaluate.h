// The evaluation of a block-scale method on one tensor: its errors against the source, the
// opt-fp32 references (every block at its exact continuous optimum scale), the gaps to them,
// and the per-block contract losses of a QuantizedTensor. One API for the CLI (`scalesweep
// tensor`, `demo`), the Python module and the experiments, so they report the same numbers.
// Layer `quant`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/quant/quantize.h"

namespace scalesweep {

// A 2-D source tensor X[rows, cols], row-major, elements of `dtype` (widened exactly).
struct TensorRef {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
};

inline TensorRef tensor_ref(const float* x, int64_t rows, int64_t cols) {
  return {x, DType::kF32, rows, cols};
}

// One run of cfg.selector.method: quantize (+ dequantize), or fake_quantize for opt-fp32.
struct MethodRun {
  Method method = Method::kSweepMse;
  std::optional<QuantizedTensor> q;  // absent for opt-fp32 (no FP8 scales)
  std::vector<float> xhat;           // dequantized, [rows, cols]
  float global_scale = 1;            // encode direction (1 for MXFP4)
  ErrorMetrics err;                  // against x; nwmse weighted with the metric importance
  double seconds = 0;                // quantize + dequantize (or fake_quantize)
};

// Runs the method with `imp` (read by the methods that use weights) and measures the result
// with `metric_imp` (NWMSE weights; the method's own `imp` in the one-importance overload).
// Validates like quantize(); `name` names the tensor in messages.
MethodRun run_method(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                     const std::string& name, const Importance& metric_imp);
MethodRun run_method(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                     const std::string& name = "tensor");

// The opt-fp32 references: `plain` picks each block's continuous optimum without importance
// (the reference for NMSE), `weighted` with it (the reference for NWMSE; a copy of `plain`
// without importance). Both are measured with the importance. A sweep window in cfg does not
// apply; cfg's format, block and global scale do. xhat of both runs is dropped.
struct OptFp32Refs {
  MethodRun plain, weighted;
  double nmse() const { return plain.err.nmse; }
  double nwmse() const { return weighted.err.nwmse; }
};
// `step` (optional) is called after each of the one or two runs (progress bars).
OptFp32Refs opt_fp32_refs(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                          const std::string& name = "tensor",
                          const std::function<void()>& step = {});

// Gaps (gap_percent) of a method's errors to the opt-fp32 references.
struct Gaps {
  double nmse_pct = 0;   // NMSE against the unweighted optimum
  double nwmse_pct = 0;  // NWMSE against the weighted optimum
  // The gap in the method's own objective: NWMSE for the methods that weigh their loss
  // (*-wmse, and sweep) when an importance is given, else NMSE.
  double own_pct = 0;
};
Gaps gaps_to_opt(const ErrorMetrics& err, const OptFp32Refs& opt, Method m, bool has_importance);

// One method on one tensor with its references and gaps (run, then the references).
struct Evaluation {
  MethodRun run;
  OptFp32Refs opt;
  Gaps gaps;
};
// `step` is called after the method run and after each reference run.
Evaluation evaluate(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                    const std::string& name = "tensor", const std::function<void()>& step = {});

// Per-block contract loss (docs/NUMERICS.md; contract_loss) of q's chosen scales on x, the
// selectors' objective: weighted with `imp` for the methods that use weights (`method`),
// unweighted otherwise; for the *-hessian methods their block-Hessian loss (hessian_loss) with
// the kBlockHessian `imp` they quantized with. [q.rows * q.blocks_per_row()], row-major. x and
// q must have the same shape; q's format, block and global scale are used.
std::vector<double> block_losses(const TensorRef& x, const Importance& imp, Method method,
                                 const QuantizedTensor& q);

// ---- Global scale chosen, not ruled ----
// One member of a group of tensors that share one encode-direction global scale (vLLM's fused
// q/k/v and gate/up), with the importance its method reads.
struct GlobalScaleMember {
  TensorRef x;
  Importance imp;
  std::string name = "tensor";
};
struct GlobalScaleSearch {
  float global_scale = 1;         // the chosen encode-direction gs
  std::vector<float> candidates;  // in the order tried
  std::vector<double> objective;  // per candidate: sum over members and blocks of
                                  // block_losses / gs^2 (the weight-domain objective)
  int best = 0;                   // index of the chosen candidate (ties: the first)
};
// The candidates of a group with largest |x| `amax` (NVFP4): the rule's own
// global_scale_for_amax(amax, C_rule) first (C_rule = cfg.max_block_scale or the method's
// default), then C_k = 448 * 2^(-k/steps) for k = 0 .. steps-1 (one octave of the FP8 grid's
// alignment, from 448 down to 224), duplicates dropped. steps >= 1.
std::vector<float> global_scale_candidates(float amax, const QuantConfig& cfg, int steps);
// Quantizes every member at every candidate with cfg's method (the exact block search inside
// each) and keeps the candidate whose objective is lowest: never above the rule's on this
// objective. cfg.global_scale is ignored. Throws std::invalid_argument for MXFP4 (no global
// scale), steps < 1 or an empty group; members are validated as quantize() does.
GlobalScaleSearch search_global_scale(const std::vector<GlobalScaleMember>& members,
                                      const QuantConfig& cfg, int steps);

// Per-block exact continuous optimum scale (opt_fp32_scale, y domain, weighted when `imp` is
// given), [rows * ceil(cols/block)]; global scale and validation as fake_quantize(opt-fp32).
std::vector<double> opt_fp32_block_scales(const TensorRef& x, const Importance& imp,
                                          const QuantConfig& cfg,
                                          const std::string& name = "tensor");

}  // namespace scalesweep

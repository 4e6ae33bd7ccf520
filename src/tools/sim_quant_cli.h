// Shared by `ppl` and `generate`: what the simulated-quantization options (tools/options.h,
// SimQuantOptions) mean: the model-loading + calibration-statistics setup behind them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"
#include "tools/options.h"

namespace scalesweep::tools {

// Whether a text is encoded with BOS in front: the flag when given, else the tokenizer's
// policy. Throws std::invalid_argument for --bos with a tokenizer that has no BOS token.
bool resolve_bos(const BosOption& a, const model::Tokenizer& tok);

// The spec these options describe (throws std::invalid_argument for an unknown setting,
// format or method, and for impossible combinations such as --format mxfp4 --block 16).
model::SimQuantSpec parse_sim_quant_args(const SimQuantOptions& a);

struct SimQuantModel {
  io::LoadedModel model;                     // its tokenizer is always set
  model::SimQuantSpec spec;                  // what is simulated on top of the loaded weights
  std::unique_ptr<model::CalibStats> stats;  // null unless spec.needs_stats()
  // A W4A4 checkpoint run as it declares (no --quant): its Linear inputs quantized per token
  // at run time with its stored input_global_scale and `act_method` block scales.
  std::shared_ptr<const model::RuntimeQuant> checkpoint_rq;
  std::string act_method;
  model::Compute compute = model::Compute::kF32;  // --compute (checked available before loading)
};

// The --json fields that say how the model runs: quant ("FP", "W", "WA", ...), method,
// format ("none" for FP), block and source: "none" (full precision), "simulated" (--quant),
// "checkpoint" (the quantization the checkpoint declares: NVFP4 weights as stored, W4A4
// inputs at run time), "checkpoint+simulated" (--force-requant on an NVFP4 checkpoint).
nlohmann::json sim_quant_json(const SimQuantModel& sm, const SimQuantOptions& a);

// The Transformer that runs `sm` on `fp` (its weights, moved out of sm.model), in sm.compute.
std::unique_ptr<model::Transformer> make_run_transformer(const SimQuantModel& sm,
                                                         std::shared_ptr<const model::Weights> fp,
                                                         int max_ctx);

// Validates the options (before loading anything), loads `model_path` (requiring a
// tokenizer), applies what the checkpoint declares (W4A4: run-time activation quantization
// with the stored global scales, --method naming the block-scale selector, absmax by
// default as vLLM; --quant on NVFP4 weights is refused without --force-requant) and, when
// the spec needs them, loads or collects calibration statistics (with a ProgressBar; `seed`
// picks the calibration sequences; --calib-seqlen is capped at the model's max_seq_len with
// a note, tools/seqlen.h).
SimQuantModel load_sim_quant_model(const ModelOptions& model, const SimQuantOptions& a,
                                   uint64_t seed);

}  // namespace scalesweep::tools

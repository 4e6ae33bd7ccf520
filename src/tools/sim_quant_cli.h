// Shared by `ppl` and `generate`: the simulated-quantization options (--quant/--format/
// --method/--block and the calibration source) and the model-loading + calibration-statistics
// setup behind them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::tools {

struct SimQuantArgs {
  std::string quant = "none", format = "nvfp4", method = "sweep-mse", stats, calib;
  int block = 0;  // 0: the format's block (16 NVFP4, 32 MXFP4)
  // Set by add_sim_quant_options: --format/--method/--block given on the command line
  // (they only shape --quant; without it they are refused rather than silently ignored).
  const CLI::Option* format_opt = nullptr;
  const CLI::Option* method_opt = nullptr;
  const CLI::Option* block_opt = nullptr;
  int calib_nsamples = 128, calib_seqlen = 512;
  // --force-requant: --quant on a checkpoint whose weights are already NVFP4 quantizes the
  // dequantized weights again (refused without it).
  bool force_requant = false;
  // --compute: the arithmetic of the prefill matrix products (model::Compute; fp32 default).
  std::string compute = "fp32";
};

// --bos / --no-bos (one option, the same on ppl and generate): overrides the tokenizer's own
// add-BOS policy (model::Tokenizer::add_bos).
struct BosArg {
  bool bos = false;
  const CLI::Option* opt = nullptr;
};
void add_bos_option(CLI::App& sub, BosArg& a);
// Whether a text is encoded with BOS in front: the flag when given, else the tokenizer's
// policy. Throws std::invalid_argument for --bos with a tokenizer that has no BOS token.
bool resolve_bos(const BosArg& a, const model::Tokenizer& tok);

// Adds --quant, --format, --method, --block, --stats, --calib, --calib-nsamples,
// --calib-seqlen, --force-requant, --compute.
void add_sim_quant_options(CLI::App& sub, SimQuantArgs& a);

// The spec these options describe (throws std::invalid_argument for an unknown setting,
// format or method, and for impossible combinations such as --format mxfp4 --block 16).
model::SimQuantSpec parse_sim_quant_args(const SimQuantArgs& a);

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
// inputs at run time), "checkpoint+simulated" (--force-requant on an NVFP4 checkpoint); and
// compute ("fp32" or "bf16", the --compute mode).
nlohmann::json sim_quant_json(const SimQuantModel& sm, const SimQuantArgs& a);

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
SimQuantModel load_sim_quant_model(const std::string& model_path, const std::string& tokenizer,
                                   const SimQuantArgs& a, uint64_t seed);

}  // namespace scalesweep::tools

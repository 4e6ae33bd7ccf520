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
};

// Adds --quant, --format, --method, --block, --stats, --calib, --calib-nsamples,
// --calib-seqlen.
void add_sim_quant_options(CLI::App& sub, SimQuantArgs& a);

// The spec these options describe (throws std::invalid_argument for an unknown setting,
// format or method, and for impossible combinations such as --format mxfp4 --block 16).
model::SimQuantSpec parse_sim_quant_args(const SimQuantArgs& a);

// The --json fields that say what was simulated: quant, method, format ("none" for FP) and
// block, as ppl and generate report them.
nlohmann::json sim_quant_json(const model::SimQuantSpec& spec, const SimQuantArgs& a);

struct SimQuantModel {
  io::LoadedModel model;  // its tokenizer is always set
  model::SimQuantSpec spec;
  std::unique_ptr<model::CalibStats> stats;  // null unless spec.needs_stats()
};

// Validates the options (before loading anything), loads `model_path` (requiring a
// tokenizer) and, when the spec needs them, loads or collects calibration statistics (with a
// ProgressBar; `seed` picks the calibration sequences; --calib-seqlen is capped at the model's
// max_seq_len with a note, tools/seqlen.h).
SimQuantModel load_sim_quant_model(const std::string& model_path, const std::string& tokenizer,
                                   const SimQuantArgs& a, uint64_t seed);

}  // namespace scalesweep::tools

// Shared by `ppl` and `generate`: the simulated-NVFP4 options (--quant/--method/--block and the
// calibration source) and the model-loading + calibration-statistics setup behind them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"

namespace scalesweep::tools {

struct SimQuantArgs {
  std::string quant = "none", method = "sweep-mse", stats, calib;
  int block = 16, calib_nsamples = 128, calib_seqlen = 512;
};

// Adds --quant, --method, --block, --stats, --calib, --calib-nsamples, --calib-seqlen.
void add_sim_quant_options(CLI::App& sub, SimQuantArgs& a);

struct SimQuantModel {
  io::LoadedModel model;  // its tokenizer is always set
  model::SimQuantSpec spec;
  std::unique_ptr<model::CalibStats> stats;  // null unless spec.needs_stats()
};

// Loads `model_path` (requiring a tokenizer), parses the simulated-quant spec and, when the
// spec needs them, loads or collects calibration statistics (with a ProgressBar; `seed` picks
// the calibration sequences).
SimQuantModel load_sim_quant_model(const std::string& model_path, const std::string& tokenizer,
                                   const SimQuantArgs& a, uint64_t seed);

}  // namespace scalesweep::tools

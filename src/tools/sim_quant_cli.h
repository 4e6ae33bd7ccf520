// Shared by `ppl` and `generate`: the simulated-quantization options (tools/options.h,
// SimQuantOptions) as a pipeline::RuntimeRequest, pipeline::load_runtime behind a "calibrate"
// ProgressBar, and the --json fields that say how the model runs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "scalesweep/model/simquant.h"
#include "scalesweep/pipeline/runtime.h"
#include "tools/options.h"

namespace scalesweep::tools {

// Whether a text is encoded with BOS in front: the flag when given, else the tokenizer's
// policy. Throws std::invalid_argument for --bos with a tokenizer that has no BOS token.
bool resolve_bos(const BosOption& a, const model::Tokenizer& tok);

// The request these options describe; `seed` picks the calibration sequences.
pipeline::RuntimeRequest runtime_request(const ModelOptions& model, const SimQuantOptions& a,
                                         uint64_t seed);

// pipeline::load_runtime with its notes on stderr (print_note) and its calibration behind a
// ProgressBar; `check_config` is the command's checks on the model config, run before the
// weights are read (RuntimeRequest::check_config).
pipeline::RuntimeModel load_sim_quant_model(
    const ModelOptions& model, const SimQuantOptions& a, uint64_t seed,
    std::function<void(const model::Config&)> check_config = {});

// The --json fields of pipeline::describe_runtime: quant, method, format, block, source,
// compute.
nlohmann::json sim_quant_json(const pipeline::RuntimeModel& rm);

}  // namespace scalesweep::tools

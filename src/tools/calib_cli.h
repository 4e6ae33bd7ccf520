// print_note, the one form of a pipeline note on stderr (every command; ppl and generate pass
// it to pipeline::load_runtime, tools/sim_quant_cli.cc). calibrate and experiment make one
// pipeline call (pipeline::calibrate, pipeline::run_experiment) that caps and calibrates
// itself.
#pragma once

#include <cstdint>
#include <string>

#include "scalesweep/pipeline/calibrate.h"

namespace scalesweep::tools {

// One "note: <text>" line on stderr.
void print_note(const std::string& text);

}  // namespace scalesweep::tools

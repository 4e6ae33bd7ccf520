// Calibration for the CLI: pipeline::calib_stats_for (load --stats, or collect them from a
// calibration text) behind a "calibrate" ProgressBar, and pipeline::cap_seqlen with its note
// printed on stderr (ppl, generate: tools/sim_quant_cli.cc); print_note, the one form of a
// pipeline note on stderr (every command). calibrate and experiment make one pipeline call
// (pipeline::calibrate, pipeline::run_experiment) that caps and calibrates itself.
#pragma once

#include <cstdint>
#include <string>

#include "scalesweep/pipeline/calibrate.h"

namespace scalesweep::tools {

// One "note: <text>" line on stderr.
void print_note(const std::string& text);

model::CalibStats calib_stats_with_progress(const io::LoadedModel& m, const std::string& stats_path,
                                            const std::string& calib_text, int64_t nsamples,
                                            int64_t seqlen, uint64_t seed, bool need_xtx = true);

// pipeline::cap_seqlen, its note printed (print_note).
int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& option = "--seqlen");

}  // namespace scalesweep::tools

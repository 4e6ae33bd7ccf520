// Calibration statistics for the CLI: io::calib_stats_for (load --stats, or collect them from a
// calibration text) behind a "calibrate" ProgressBar. Used by calibrate, ppl, generate,
// experiment and quantize.
#pragma once

#include <cstdint>
#include <string>

#include "scalesweep/io/load.h"

namespace scalesweep::tools {

model::CalibStats calib_stats_with_progress(const io::LoadedModel& m, const std::string& stats_path,
                                            const std::string& calib_text, int64_t nsamples,
                                            int64_t seqlen, uint64_t seed, bool need_xtx = true);

}  // namespace scalesweep::tools

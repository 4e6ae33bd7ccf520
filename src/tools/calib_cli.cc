#include "tools/calib_cli.h"

#include "tools/ui.h"

namespace scalesweep::tools {

model::CalibStats calib_stats_with_progress(const io::LoadedModel& m, const std::string& stats_path,
                                            const std::string& calib_text, int64_t nsamples,
                                            int64_t seqlen, uint64_t seed, bool need_xtx) {
  ProgressBar bar("calibrate", nsamples, "seq");
  return io::calib_stats_for(
      m, stats_path, calib_text, nsamples, seqlen, seed,
      [&](int64_t d, int64_t t) { bar.update(d * nsamples / t); }, need_xtx);
}

}  // namespace scalesweep::tools

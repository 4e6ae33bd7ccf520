#include "tools/calib_cli.h"

#include <cstdio>

#include "tools/ui.h"

namespace scalesweep::tools {

void print_note(const std::string& text) {
  std::fprintf(stderr, "note: %s\n", text.c_str());
  std::fflush(stderr);
}

model::CalibStats calib_stats_with_progress(const io::LoadedModel& m, const std::string& stats_path,
                                            const std::string& calib_text, int64_t nsamples,
                                            int64_t seqlen, uint64_t seed, bool need_xtx) {
  ProgressBar bar("calibrate", nsamples, "seq");
  return pipeline::calib_stats_for(
      m, stats_path, calib_text, nsamples, seqlen, seed,
      [&](int64_t d, int64_t t) { bar.update(d * nsamples / t); }, need_xtx);
}

int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& option) {
  return pipeline::cap_seqlen(seqlen, max_seq_len, model, option, print_note);
}

}  // namespace scalesweep::tools

// Calibration jobs (layer `pipeline`): the statistics a simulated or real quantization needs,
// loaded from a stats file or collected from a text; `scalesweep calibrate` (written layer by
// layer through io::CalibStatsWriter); and the policy for sequence lengths.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/calib.h"

namespace scalesweep::pipeline {

// Sequence-length options (--seqlen, --calib-seqlen, ...): a value above the model's
// max_seq_len is capped to it, with one note
//   <option> <seqlen> exceeds <model>'s max_seq_len <max_seq_len>; using <max_seq_len>
// passed to `note` (the CLI prints it on stderr as "note: ..."). `model` is how the user
// named the model. Throws std::invalid_argument when max_seq_len < 1 (a broken config).
int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& option, const std::function<void(const std::string&)>& note);

// Calibration statistics: loaded from `stats_path` when non-empty, else computed on the fly
// from the text file `calib_text` (model::calibrate with nsamples/seqlen/seed; seqlen is
// capped at the model's max_seq_len). Throws when neither is given. need_xtx = false: without
// ΣxxT (InputStats::xtx empty; amax, tokens, the diagonal and q/k/v only), which is all that
// simulated quantization reads; GPTQ needs it. From text it then runs layer by layer
// (model::calibrate_layers; progress(done, n_layers * nsamples)) and keeps one layer's ΣxxT
// at a time; the values are those of a stats file.
model::CalibStats calib_stats_for(const io::LoadedModel& m, const std::string& stats_path,
                                  const std::string& calib_text, int64_t nsamples = 128,
                                  int64_t seqlen = 512, uint64_t seed = 0,
                                  const std::function<void(int64_t, int64_t)>& progress = {},
                                  bool need_xtx = true);

// `scalesweep calibrate`: the statistics of the text file `calib_text` (the sequences of
// calib_stats_for) computed layer by layer (model::calibrate_layers) and written to `out`
// (io::CalibStatsWriter, atomic) as each layer finishes; peak memory is the weights, the
// hidden states (nsamples * seqlen * dim floats) and one layer's statistics. Returns the
// statistics without ΣxxT (for a summary). `progress(done, n_layers * nsamples)`.
model::CalibStats calibrate_to_file(const io::LoadedModel& m, const std::string& calib_text,
                                    int64_t nsamples, int64_t seqlen, uint64_t seed,
                                    const std::string& out,
                                    const std::function<void(int64_t, int64_t)>& progress = {});

// `scalesweep calibrate` from the command line's values: loads `model` (with `tokenizer` when
// non-empty), refuses a model without a tokenizer, caps `seqlen` at the model's max_seq_len
// (cap_seqlen, its note passed to `note`, named `seqlen_option`) and runs calibrate_to_file.
struct CalibrateRequest {
  std::string model, tokenizer, calib_text, out;
  int64_t nsamples = 128, seqlen = 512;
  uint64_t seed = 0;
  std::string seqlen_option = "--calib-seqlen";
};
model::CalibStats calibrate(const CalibrateRequest& request,
                            const std::function<void(const std::string&)>& note = {},
                            const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace scalesweep::pipeline

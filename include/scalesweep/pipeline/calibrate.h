// Calibration jobs (layer `pipeline`): the statistics a simulated or real quantization needs,
// loaded from a stats file or collected from a text; `scalesweep calibrate` (written layer by
// layer through io::CalibStatsWriter); and the policy for sequence lengths.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/io/load.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/pipeline/events.h"

namespace scalesweep::pipeline {

// Where the calibration of a job comes from, the one vocabulary of every request that
// calibrates (quantize, calibrate, experiment, the run-time setup of ppl/generate): the
// statistics file `stats` of `scalesweep calibrate` when non-empty, else the sequences drawn
// from the text file `text` (nsamples sequences of seqlen tokens, BOS included, placed as
// `windows` says: random starts picked by `seed`, or evenly spread, model::CalibWindows; seqlen is
// capped at the model's max_seq_len with a note naming the field "calib_seqlen").
// Mixture-of-experts models: all_experts runs every token through every expert for the
// experts' statistics (the forward keeps the routed output; model::calibrate); an expert the
// router sent fewer than expert_min_tokens tokens (-1: the model's hidden size dim, below which
// the expert's gate/up ΣxxT [dim, dim] cannot have full rank) is reported (expert_coverage)
// and quantized data-free (pipeline/quantize_model.h).
struct CalibSource {
  std::string text, stats;
  int64_t nsamples = 128, seqlen = 512;
  uint64_t seed = 0;
  model::CalibWindows windows = model::CalibWindows::kRandom;
  bool all_experts = false;
  int64_t expert_min_tokens = -1;
  model::CalibDraw draw() const { return {seed, windows}; }
};

// The checks of a calibration source that need no model, run before any weight is read: a
// statistics file or a text is given (std::runtime_error "calibration statistics needed: ..."),
// and the one given opens (the message its reader gives: io::MappedFile's, io::check_text_file's).
void check_calib_source(const CalibSource& c);

// The threshold of `c` for a model of hidden size `dim`: expert_min_tokens, or dim when it is -1.
int64_t expert_min_tokens(const CalibSource& c, int64_t dim);

// Per MoE layer, the experts the router sent no calibration token (`unseen`) and those it sent
// fewer than `min_tokens` (`few`, with their counts); layers where every expert reached
// min_tokens are left out.
struct ExpertCoverage {
  int layer = 0;
  int n_experts = 0;
  std::vector<int> unseen;
  std::vector<std::pair<int, int64_t>> few;  // (expert, routed tokens), 0 < tokens < min_tokens
};
std::vector<ExpertCoverage> expert_coverage(const model::CalibStats& s, int64_t min_tokens);

// Sequence lengths: a value above the model's max_seq_len is capped to it, with one note
//   <field> <seqlen> exceeds <model>'s max_seq_len <max_seq_len>; using <max_seq_len>
// passed to `note` (the CLI names the field as the option typed, tools/options.h option_note,
// and prints it on stderr as "note: ..."). `model` is how the user named the model. Throws
// std::invalid_argument when max_seq_len < 1 (a broken config).
int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& field, const std::function<void(const std::string&)>& note);
// cap_seqlen of a calibration source's seqlen (the field "calib_seqlen").
int64_t cap_calib_seqlen(const CalibSource& c, int64_t max_seq_len, const std::string& model,
                         const std::function<void(const std::string&)>& note);

// The one text-to-tokens step of calibration: the text file `path` encoded by `tok` (no BOS,
// no EOS) and the BOS the sequences start with (the tokenizer's own policy; -1: none).
// Throws when `tok` is null ("calibration from text needs a tokenizer").
struct CalibTokens {
  std::vector<int> tokens;
  int bos = -1;
};
CalibTokens calib_tokens(const model::Tokenizer* tok, const std::string& path);

// Calibration statistics: loaded from `c.stats` when non-empty, else computed on the fly
// from the text file `c.text` (model::calibrate with nsamples/seqlen/seed; seqlen is
// capped at the model's max_seq_len). Throws when neither is given. need_xtx = false: without
// ΣxxT (InputStats::xtx empty; amax, tokens, the diagonal and q/k/v only), which is all that
// simulated quantization reads; GPTQ needs it. From text it then runs layer by layer
// (model::calibrate_layers; progress(done, n_layers * nsamples)) and keeps one layer's ΣxxT
// at a time; the values are those of a stats file.
model::CalibStats calib_stats_for(const io::LoadedModel& m, const CalibSource& c,
                                  const std::function<void(int64_t, int64_t)>& progress = {},
                                  bool need_xtx = true);

// The statistics of calib_stats_for(m, c, progress, need_xtx = true), each layer's handed
// whole (ΣxxT included) to `layer(l, stats)` in layer order and then kept without ΣxxT, which
// is what the returned statistics hold. From text the calibration runs layer by layer
// (model::calibrate_layers), so one layer's ΣxxT is in memory at a time; a statistics file is
// read whole and its layers handed over in turn. For jobs that use each layer's ΣxxT once
// (experiment's GPTQ rows).
model::CalibStats calib_stats_by_layer(const io::LoadedModel& m, const CalibSource& c,
                                       const std::function<void(int, model::LayerStats&)>& layer,
                                       const std::function<void(int64_t, int64_t)>& progress = {});

// `scalesweep calibrate`: the statistics of the text file `c.text` (the sequences of
// calib_stats_for; c.stats is not read) computed layer by layer (model::calibrate_layers) and
// written to `out` (io::CalibStatsWriter, atomic) as each layer finishes; peak memory is the
// weights, the hidden states (nsamples * seqlen * dim floats) and one layer's statistics. Returns
// the statistics without ΣxxT (for a summary). `progress(done, n_layers * nsamples)`.
model::CalibStats calibrate_to_file(const io::LoadedModel& m, const CalibSource& c,
                                    const std::string& out,
                                    const std::function<void(int64_t, int64_t)>& progress = {});

// `scalesweep calibrate` from the command line's values: loads `model` (with `tokenizer` when
// non-empty), refuses a model without a tokenizer, caps calib.seqlen at the model's
// max_seq_len (cap_calib_seqlen, its note passed to `note`) and runs calibrate_to_file.
struct CalibrateRequest {
  std::string model, tokenizer, out;
  CalibSource calib;  // calib.text; calib.stats is not read
};
// Progress: the stage "calibrate", unit "seq", counted over layers x sequences.
model::CalibStats calibrate(const CalibrateRequest& request, const JobEvents& events = {});

}  // namespace scalesweep::pipeline

// One entry point for every checkpoint format the runtime reads: a llama2.c .bin file
// (legacy or v1 "ak42"), a llama.cpp .gguf file or a Hugging Face model directory. The
// format is sniffed from the content (a directory, the "GGUF" magic, a plausible llama2.c
// header), not from the file name; anything else is "unrecognised model file".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/tokenizer.h"

namespace scalesweep::io {

struct LoadedModel {
  model::Weights weights;
  std::unique_ptr<model::Tokenizer> tokenizer;  // null when none was found or given
  std::string format;                           // "llama2c-legacy", "llama2c-v1", "hf", "gguf"
  // What the checkpoint declares about quantization (HF compressed-tensors; default: none).
  CheckpointQuant quant;
};

// `path` is a llama2.c .bin file, a GGUF file or a HF directory. `tokenizer_path` (optional)
// overrides the tokenizer: a llama2.c tokenizer.bin (or a tokenizer.json for HF and GGUF; a
// GGUF's own tokenizer comes from its metadata). For a llama2.c
// model without `tokenizer_path`, a `tokenizer.bin` or `tok<vocab>.bin` beside the model
// file is used when present. Throws std::runtime_error naming the file.
LoadedModel load_model(const std::string& path, const std::string& tokenizer_path = "");

// Whole text file (throws std::runtime_error naming the file; rejects empty files).
std::string read_text_file(const std::string& path);

// Calibration statistics: loaded from `stats_path` when non-empty, else computed on the fly
// from the text file `calib_text` (model::calibrate with nsamples/seqlen/seed; seqlen is
// capped at the model's max_seq_len). Throws when neither is given. need_xtx = false: without
// ΣxxT (InputStats::xtx empty; amax, tokens, the diagonal and q/k/v only), which is all that
// simulated quantization reads; GPTQ needs it. From text it then runs layer by layer
// (model::calibrate_layers; progress(done, n_layers * nsamples)) and keeps one layer's ΣxxT
// at a time; the values are those of a stats file.
model::CalibStats calib_stats_for(const LoadedModel& m, const std::string& stats_path,
                                  const std::string& calib_text, int64_t nsamples = 128,
                                  int64_t seqlen = 512, uint64_t seed = 0,
                                  const std::function<void(int64_t, int64_t)>& progress = {},
                                  bool need_xtx = true);

// `scalesweep calibrate`: the statistics of the text file `calib_text` (the sequences of
// calib_stats_for) computed layer by layer (model::calibrate_layers) and written to `out`
// (io::CalibStatsWriter, atomic) as each layer finishes; peak memory is the weights, the
// hidden states (nsamples * seqlen * dim floats) and one layer's statistics. Returns the
// statistics without ΣxxT (for a summary). `progress(done, n_layers * nsamples)`.
model::CalibStats calibrate_to_file(const LoadedModel& m, const std::string& calib_text,
                                    int64_t nsamples, int64_t seqlen, uint64_t seed,
                                    const std::string& out,
                                    const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace scalesweep::io

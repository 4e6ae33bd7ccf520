// Calibration jobs (include/scalesweep/pipeline/calibrate.h).
#include "scalesweep/pipeline/calibrate.h"

#include <algorithm>
#include <stdexcept>

#include "scalesweep/io/calib_stats.h"

namespace scalesweep::pipeline {

int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& option, const std::function<void(const std::string&)>& note) {
  if (max_seq_len < 1)
    throw std::invalid_argument(model + ": max_seq_len " + std::to_string(max_seq_len) +
                                " in its config is not a sequence length");
  if (seqlen <= max_seq_len) return seqlen;
  if (note)
    note(option + " " + std::to_string(seqlen) + " exceeds " + model + "'s max_seq_len " +
         std::to_string(max_seq_len) + "; using " + std::to_string(max_seq_len));
  return max_seq_len;
}

model::CalibStats calib_stats_for(const io::LoadedModel& m, const std::string& stats_path,
                                  const std::string& calib_text, int64_t nsamples, int64_t seqlen,
                                  uint64_t seed,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  bool need_xtx) {
  if (!stats_path.empty()) {
    model::CalibStats s = io::load_calib_stats(stats_path, need_xtx);
    try {
      model::check_calib_stats(s, m.weights.config);
    } catch (const std::exception& e) {
      throw std::runtime_error(stats_path + ": " + e.what());
    }
    return s;
  }
  if (calib_text.empty())
    throw std::runtime_error(
        "calibration statistics needed: give --stats STATS.safetensors "
        "(from `scalesweep calibrate`) or --calib TEXT");
  if (!m.tokenizer)
    throw std::runtime_error("calibration from text needs a tokenizer (--tokenizer)");
  const std::vector<int> toks = m.tokenizer->encode(io::read_text_file(calib_text), false, false);
  const int64_t len = std::min<int64_t>(seqlen, m.weights.config.max_seq_len);
  // The tokenizer's own BOS policy (-1: sequences without BOS).
  const int bos = m.tokenizer->add_bos() ? m.tokenizer->bos() : -1;
  if (need_xtx) return model::calibrate(m.weights, toks, nsamples, len, seed, bos, progress);
  // Without ΣxxT: layer by layer, each layer's ΣxxT freed once its diagonal is taken (the same
  // values as a stats file's, in the memory of one layer).
  model::CalibStats s;
  s.nsamples = nsamples;
  s.seqlen = len;
  s.seed = seed;
  s.layers.resize(static_cast<size_t>(m.weights.config.n_layers));
  model::calibrate_layers(
      m.weights, toks, nsamples, len, seed, bos, true,
      [&](int l, model::LayerStats& L) {
        for (auto& in : L.inputs) std::vector<double>().swap(in.xtx);
        s.layers[static_cast<size_t>(l)] = std::move(L);
      },
      progress);
  return s;
}

model::CalibStats calibrate_to_file(const io::LoadedModel& m, const std::string& calib_text,
                                    int64_t nsamples, int64_t seqlen, uint64_t seed,
                                    const std::string& out,
                                    const std::function<void(int64_t, int64_t)>& progress) {
  if (!m.tokenizer)
    throw std::runtime_error("calibration from text needs a tokenizer (--tokenizer)");
  const std::vector<int> toks = m.tokenizer->encode(io::read_text_file(calib_text), false, false);
  const model::Config& c = m.weights.config;
  const int64_t len = std::min<int64_t>(seqlen, c.max_seq_len);
  const int bos = m.tokenizer->add_bos() ? m.tokenizer->bos() : -1;
  // Checks the sampling (text long enough) before the output file is created.
  (void)model::calibration_sequences(toks, nsamples, len, seed, bos, c.max_seq_len);
  model::CalibStats summary;
  summary.nsamples = nsamples;
  summary.seqlen = len;
  summary.seed = seed;
  summary.layers.resize(static_cast<size_t>(c.n_layers));
  io::CalibStatsWriter w(c, nsamples, len, seed, out);
  model::calibrate_layers(
      m.weights, toks, nsamples, len, seed, bos, true,
      [&](int l, model::LayerStats& L) {
        w.write_layer(l, L);
        for (auto& in : L.inputs) std::vector<double>().swap(in.xtx);  // free ΣxxT
        summary.layers[static_cast<size_t>(l)] = std::move(L);
      },
      progress);
  w.commit();
  return summary;
}

model::CalibStats calibrate(const CalibrateRequest& r,
                            const std::function<void(const std::string&)>& note,
                            const std::function<void(int64_t, int64_t)>& progress) {
  const io::LoadedModel m = io::load_model(r.model, r.tokenizer);
  if (!m.tokenizer)
    throw std::runtime_error(r.model + ": no tokenizer found; give --tokenizer FILE");
  const int64_t seqlen =
      cap_seqlen(r.seqlen, m.weights.config.max_seq_len, r.model, r.seqlen_option, note);
  return calibrate_to_file(m, r.calib_text, r.nsamples, seqlen, r.seed, r.out, progress);
}

}  // namespace scalesweep::pipeline

// Calibration jobs (include/scalesweep/pipeline/calibrate.h).
#include "scalesweep/pipeline/calibrate.h"

#include <algorithm>
#include <stdexcept>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/load.h"

namespace scalesweep::pipeline {

int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& field, const std::function<void(const std::string&)>& note) {
  if (max_seq_len < 1)
    throw std::invalid_argument(model + ": max_seq_len " + std::to_string(max_seq_len) +
                                " in its config is not a sequence length");
  if (seqlen <= max_seq_len) return seqlen;
  if (note)
    note(field + " " + std::to_string(seqlen) + " exceeds " + model + "'s max_seq_len " +
         std::to_string(max_seq_len) + "; using " + std::to_string(max_seq_len));
  return max_seq_len;
}

int64_t cap_calib_seqlen(const CalibSource& c, int64_t max_seq_len, const std::string& model,
                         const std::function<void(const std::string&)>& note) {
  return cap_seqlen(c.seqlen, max_seq_len, model, "calib_seqlen", note);
}

CalibTokens calib_tokens(const model::Tokenizer* tok, const std::string& path) {
  if (!tok)
    throw std::runtime_error("calibration from text needs a tokenizer (" + option_ref("tokenizer") +
                             ")");
  return {io::text_file_tokens(*tok, path, false), tok->add_bos() ? tok->bos() : -1};
}

namespace {

model::CalibStats load_checked_stats(const io::LoadedModel& m, const std::string& path,
                                     bool need_xtx) {
  model::CalibStats s = io::load_calib_stats(path, need_xtx);
  try {
    model::check_calib_stats(s, m.weights.config);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return s;
}

// Frees a layer's ΣxxT (its inputs' and experts'); the diagonal stays.
void drop_xtx(model::LayerStats& L) {
  for (auto& in : L.inputs) std::vector<double>().swap(in.xtx);
  for (auto& e : L.experts) {
    std::vector<double>().swap(e.in.xtx);
    std::vector<double>().swap(e.mid.xtx);
  }
}

// Statistics of nsamples x len sequences layer by layer, each layer passed to `layer` (which
// may free its ΣxxT) and then kept without it.
model::CalibStats calibrate_by_layer(const io::LoadedModel& m, const CalibTokens& t,
                                     const CalibSource& c, int64_t len,
                                     const std::function<void(int, model::LayerStats&)>& layer,
                                     const std::function<void(int64_t, int64_t)>& progress) {
  model::CalibStats s;
  s.nsamples = c.nsamples;
  s.seqlen = len;
  s.draw = c.draw();
  s.layers.resize(static_cast<size_t>(m.weights.config.n_layers));
  model::calibrate_layers(
      m.weights, t.tokens, c.nsamples, len, c.draw(), t.bos, true,
      [&](int l, model::LayerStats& L) {
        if (layer) layer(l, L);
        drop_xtx(L);
        s.layers[static_cast<size_t>(l)] = std::move(L);
      },
      progress, c.all_experts);
  return s;
}

}  // namespace

void check_calib_source(const CalibSource& c) {
  if (c.stats.empty() && c.text.empty())
    throw std::runtime_error("calibration statistics needed: give " + option_ref("stats") +
                             " STATS.safetensors (from `scalesweep calibrate`) or " +
                             option_ref("calib") + " TEXT");
  if (!c.stats.empty())
    io::MappedFile{c.stats};  // opens (maps, reads nothing): the statistics reader's message
  else
    io::check_text_file(c.text);
}

model::CalibStats calib_stats_for(const io::LoadedModel& m, const CalibSource& c,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  bool need_xtx) {
  if (!c.stats.empty()) return load_checked_stats(m, c.stats, need_xtx);
  check_calib_source(c);
  const CalibTokens t = calib_tokens(m.tokenizer.get(), c.text);
  const int64_t len = std::min<int64_t>(c.seqlen, m.weights.config.max_seq_len);
  if (need_xtx)
    return model::calibrate(m.weights, t.tokens, c.nsamples, len, c.draw(), t.bos, progress, true,
                            c.all_experts);
  // Without ΣxxT: layer by layer, each layer's ΣxxT freed once its diagonal is taken (the same
  // values as a stats file's, in the memory of one layer).
  return calibrate_by_layer(m, t, c, len, {}, progress);
}

model::CalibStats calib_stats_by_layer(const io::LoadedModel& m, const CalibSource& c,
                                       const std::function<void(int, model::LayerStats&)>& layer,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  if (c.stats.empty()) {
    check_calib_source(c);
    const CalibTokens t = calib_tokens(m.tokenizer.get(), c.text);
    const int64_t len = std::min<int64_t>(c.seqlen, m.weights.config.max_seq_len);
    return calibrate_by_layer(m, t, c, len, layer, progress);
  }
  model::CalibStats s = load_checked_stats(m, c.stats, true);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    layer(static_cast<int>(l), s.layers[l]);
    drop_xtx(s.layers[l]);
  }
  return s;
}

model::CalibStats calibrate_to_file(const io::LoadedModel& m, const CalibSource& c,
                                    const std::string& out,
                                    const std::function<void(int64_t, int64_t)>& progress) {
  const CalibTokens t = calib_tokens(m.tokenizer.get(), c.text);
  const model::Config& cfg = m.weights.config;
  const int64_t len = std::min<int64_t>(c.seqlen, cfg.max_seq_len);
  // Checks the sampling (text long enough) before the output file is created.
  (void)model::calibration_sequences(t.tokens, c.nsamples, len, c.draw(), t.bos, cfg.max_seq_len);
  io::CalibStatsWriter w(cfg, c.nsamples, len, c.draw(), out);
  model::CalibStats summary = calibrate_by_layer(
      m, t, c, len, [&](int l, model::LayerStats& L) { w.write_layer(l, L); }, progress);
  w.commit();
  return summary;
}

int64_t expert_min_tokens(const CalibSource& c, int64_t dim) {
  return c.expert_min_tokens < 0 ? dim : c.expert_min_tokens;
}

std::vector<ExpertCoverage> expert_coverage(const model::CalibStats& s, int64_t min_tokens) {
  std::vector<ExpertCoverage> out;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& ex = s.layers[l].experts;
    ExpertCoverage c;
    c.layer = static_cast<int>(l);
    c.n_experts = static_cast<int>(ex.size());
    for (size_t e = 0; e < ex.size(); ++e) {
      if (ex[e].routed == 0)
        c.unseen.push_back(static_cast<int>(e));
      else if (ex[e].routed < min_tokens)
        c.few.emplace_back(static_cast<int>(e), ex[e].routed);
    }
    if (!c.unseen.empty() || !c.few.empty()) out.push_back(std::move(c));
  }
  return out;
}

model::CalibStats calibrate(const CalibrateRequest& r, const JobEvents& ev) {
  io::check_text_file(r.calib.text);  // before the model is read
  const io::LoadedModel m = io::load_model(r.model, r.tokenizer);
  if (!m.tokenizer)
    throw std::runtime_error(r.model + ": no tokenizer found; give " + option_ref("tokenizer") +
                             " FILE");
  CalibSource c = r.calib;
  c.seqlen = cap_calib_seqlen(c, m.weights.config.max_seq_len, r.model, ev.note);
  return calibrate_to_file(m, c, r.out,
                           [&](int64_t d, int64_t t) { ev.step("calibrate", "seq", d, t); });
}

}  // namespace scalesweep::pipeline

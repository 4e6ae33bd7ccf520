// Checkpoint dispatch (include/scalesweep/io/load.h).
#include "scalesweep/io/load.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/llama2c.h"

namespace scalesweep::io {

namespace fs = std::filesystem;

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open text file");
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (s.empty()) throw std::runtime_error(path + ": empty text file");
  return s;
}

LoadedModel load_model(const std::string& path, const std::string& tokenizer_path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error(path + ": no such file or directory");
  LoadedModel m;
  if (fs::is_directory(path, ec)) {  // Hugging Face directory (src/io/hf.cc)
    m.weights = load_hf_dir(path);
    m.format = "hf";
    m.quant = read_hf_checkpoint_quant(path, m.weights.config);
    if (tokenizer_path.empty())
      m.tokenizer = load_hf_tokenizer(path, m.weights.config);
    else if (tokenizer_path.ends_with(".bin"))
      m.tokenizer = model::Llama2cTokenizer::load(tokenizer_path, m.weights.config.vocab_size);
    else
      m.tokenizer = model::HfBpeTokenizer::load(tokenizer_path);
    return m;
  }
  if (GgufFile::sniff(path)) {  // llama.cpp GGUF (src/io/gguf_model.cc)
    const auto f = std::make_shared<const GgufFile>(GgufFile::open(path));
    m.weights = load_gguf_weights(*f, f);  // F16/BF16 matrices stay in the mapping
    m.format = "gguf";
    if (tokenizer_path.empty())
      m.tokenizer = load_gguf_tokenizer(*f);
    else if (tokenizer_path.ends_with(".bin"))
      m.tokenizer = model::Llama2cTokenizer::load(tokenizer_path, m.weights.config.vocab_size);
    else
      m.tokenizer = model::HfBpeTokenizer::load(tokenizer_path);
    return m;
  }
  if (!is_llama2c_file(path))
    throw std::runtime_error(path +
                             ": unrecognised model file (accepted: a Hugging Face model directory, "
                             "a .gguf file, a llama2.c .bin checkpoint)");
  Llama2cFormat fmt;
  m.weights = load_llama2c(path, &fmt);
  m.format = fmt == Llama2cFormat::kLegacy ? "llama2c-legacy" : "llama2c-v1";
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    const fs::path dir = fs::path(path).parent_path();
    const std::string cands[] = {"tokenizer.bin",
                                 "tok" + std::to_string(m.weights.config.vocab_size) + ".bin"};
    for (const std::string& cand : cands) {
      if (fs::exists(dir / cand, ec)) {
        tok = (dir / cand).string();
        break;
      }
    }
  }
  if (!tok.empty()) m.tokenizer = model::Llama2cTokenizer::load(tok, m.weights.config.vocab_size);
  return m;
}

model::CalibStats calib_stats_for(const LoadedModel& m, const std::string& stats_path,
                                  const std::string& calib_text, int64_t nsamples, int64_t seqlen,
                                  uint64_t seed,
                                  const std::function<void(int64_t, int64_t)>& progress,
                                  bool need_xtx) {
  if (!stats_path.empty()) {
    model::CalibStats s = load_calib_stats(stats_path, need_xtx);
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
  const std::vector<int> toks = m.tokenizer->encode(read_text_file(calib_text), false, false);
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

model::CalibStats calibrate_to_file(const LoadedModel& m, const std::string& calib_text,
                                    int64_t nsamples, int64_t seqlen, uint64_t seed,
                                    const std::string& out,
                                    const std::function<void(int64_t, int64_t)>& progress) {
  if (!m.tokenizer)
    throw std::runtime_error("calibration from text needs a tokenizer (--tokenizer)");
  const std::vector<int> toks = m.tokenizer->encode(read_text_file(calib_text), false, false);
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
  CalibStatsWriter w(c, nsamples, len, seed, out);
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

}  // namespace scalesweep::io

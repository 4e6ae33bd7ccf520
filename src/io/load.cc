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

void check_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::error_code ec;
  if (!f || std::filesystem::is_directory(path, ec))
    throw std::runtime_error(path + ": cannot open text file");
  if (f.tellg() <= 0) throw std::runtime_error(path + ": empty text file");
}

std::vector<int> text_file_tokens(const model::Tokenizer& tok, const std::string& path, bool bos) {
  return tok.encode(read_text_file(path), bos, false);
}

std::string read_text_file(const std::string& path) {
  check_text_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open text file");
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (s.empty()) throw std::runtime_error(path + ": empty text file");
  return s;
}

std::unique_ptr<model::Tokenizer> load_tokenizer_file(const std::string& path, int vocab_size) {
  if (path.ends_with(".bin")) return model::Llama2cTokenizer::load(path, vocab_size);
  return model::HfBpeTokenizer::load(path);
}

std::optional<model::Config> peek_model_config(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return read_hf_config(path);
  if (fs::is_regular_file(path, ec) && GgufFile::sniff(path)) {
    const GgufFile f = GgufFile::open(path);
    return gguf_model_config(
        f.metadata(), [&](std::string_view n) { return f.find_tensor(n) != nullptr; }, path);
  }
  return std::nullopt;
}

void refuse_moe_model(const std::string& path, const std::string& what) {
  const std::optional<model::Config> c = peek_model_config(path);
  if (!c) return;
  try {
    model::refuse_moe(*c, what);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

LoadedModel load_model(const std::string& path, const std::string& tokenizer_path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error(path + ": no such file or directory");
  LoadedModel m;
  if (fs::is_directory(path, ec)) {  // Hugging Face directory (src/io/hf.cc)
    m.weights = load_hf_dir(path);
    m.format = "hf";
    m.quant = read_hf_checkpoint_quant(path, m.weights.config);
    m.tokenizer = tokenizer_path.empty()
                      ? load_hf_tokenizer(path, m.weights.config)
                      : load_tokenizer_file(tokenizer_path, m.weights.config.vocab_size);
    return m;
  }
  if (GgufFile::sniff(path)) {  // llama.cpp GGUF (src/io/gguf_model.cc)
    const auto f = std::make_shared<const GgufFile>(GgufFile::open(path));
    m.weights = load_gguf_weights(*f, f);  // F16/BF16 matrices stay in the mapping
    m.format = "gguf";
    m.tokenizer = tokenizer_path.empty()
                      ? load_gguf_tokenizer(*f)
                      : load_tokenizer_file(tokenizer_path, m.weights.config.vocab_size);
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

}  // namespace scalesweep::io

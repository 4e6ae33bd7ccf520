// scalesweep tokenize TOKENIZER [--text STR | --file F [--lines]] [--bos] [--eos] [--json]
//   [--decode ID...]
// TOKENIZER: a tokenizer.json, a Hugging Face model directory, a llama2.c tokenizer.bin, or a
// GGUF file (its tokenizer.ggml.* metadata).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"
#include "tools/command.h"
#include "tools/options.h"

namespace scalesweep::tools {
namespace {

struct TokenizeArgs {
  std::string tokenizer, text, file;
  std::vector<int> decode;
  bool lines = false, bos = false, eos = false, have_text = false, special = false;
  OutputOptions out;  // --json
};

std::unique_ptr<model::Tokenizer> open_tokenizer(const std::string& path) {
  if (io::GgufFile::sniff(path)) {
    auto t = io::load_gguf_tokenizer(path);
    if (!t)
      throw std::runtime_error(path + ": the GGUF file has no tokenizer (tokenizer.ggml.model)");
    return t;
  }
  return io::load_tokenizer_file(path);
}

int run_tokenize(const TokenizeArgs& a) {
  const auto tok = open_tokenizer(a.tokenizer);
  if (!a.decode.empty()) {
    for (int id : a.decode)
      if (id < 0 || id >= tok->vocab_size())
        throw std::invalid_argument("--decode: token id " + std::to_string(id) + " outside [0, " +
                                    std::to_string(tok->vocab_size()) + ")");
    const std::string s = tok->decode(a.decode, !a.special);
    if (a.out.json)
      std::printf("%s\n", nlohmann::json({{"text", s}})
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
    else
      std::fwrite(s.data(), 1, s.size(), stdout), std::printf("\n");
    return 0;
  }
  std::vector<std::string> texts;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) throw std::runtime_error(a.file + ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    const std::string all = ss.str();
    if (a.lines) {
      size_t s = 0;
      while (s <= all.size()) {
        size_t e = all.find('\n', s);
        if (e == std::string::npos) e = all.size();
        texts.push_back(all.substr(s, e - s));
        s = e + 1;
      }
    } else {
      texts.push_back(all);
    }
  } else if (a.have_text) {
    texts.push_back(a.text);
  } else {
    throw std::invalid_argument("give --text, --file or --decode");
  }
  nlohmann::json all_ids = nlohmann::json::array();
  size_t total = 0;
  for (const auto& t : texts) {
    const std::vector<int> ids = tok->encode(t, a.bos, a.eos);
    total += ids.size();
    if (a.out.json) {
      all_ids.push_back(ids);
    } else {
      for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
      std::printf("\n");
    }
  }
  if (a.out.json) {
    nlohmann::json j = {{"ids", a.lines ? all_ids : all_ids[0]},
                        {"tokens", total},
                        {"bos", tok->bos()},
                        {"eos", tok->eos()},
                        {"vocab_size", tok->vocab_size()}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

SS_COMMAND(
    "tokenize",
    "Encode text (or decode ids) with a tokenizer.json / HF directory / tokenizer.bin / .gguf",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<TokenizeArgs>();
      sub.add_option("tokenizer", a->tokenizer,
                     "tokenizer.json, HF model directory, llama2.c tokenizer.bin, or GGUF file")
          ->required();
      auto* text =
          sub.add_option("--text", a->text, "text to encode")->each([a](const std::string&) {
            a->have_text = true;
          });
      auto* file = sub.add_option("--file", a->file, "file to encode")->excludes(text);
      sub.add_flag("--lines", a->lines, "with --file: encode each line separately")->needs(file);
      sub.add_flag("--bos", a->bos, "prepend BOS");
      sub.add_flag("--eos", a->eos, "append EOS");
      auto* decode = sub.add_option("--decode", a->decode, "token ids to decode instead")
                         ->excludes(text)
                         ->excludes(file);
      sub.add_flag("--special", a->special,
                   "print special tokens (<|im_start|>, BOS, EOS) as the vocabulary spells them, "
                   "as transformers' decode with skip_special_tokens=False; without it they print "
                   "as nothing, as transformers' pipelines and chat outputs do")
          ->needs(decode);
      add_output_options(sub, a->out, json_only("JSON output"));
      return [a] { return run_tokenize(*a); };
    });

}  // namespace
}  // namespace scalesweep::tools

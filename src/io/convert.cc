// llama2.c -> Hugging Face conversion (include/scalesweep/io/convert.h).
#include "scalesweep/io/convert.h"

#include <chrono>
#include <filesystem>
#include <stdexcept>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"

namespace scalesweep::io {

namespace fs = std::filesystem;

namespace {

void count_tensors(const model::Weights& w, ConvertReport& rep) {
  const auto count = [&](const model::Tensor& t) {
    if (t.present()) rep.parameters += t.numel(), ++rep.tensors;
  };
  count(w.tok_embeddings);
  for (const auto& L : w.layers)
    for (const model::Tensor* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv,
                                   &L.q_norm, &L.k_norm, &L.ffn_norm, &L.w1, &L.w2, &L.w3})
      count(*t);
  count(w.final_norm);
  if (!w.config.tied_embeddings) count(w.lm_head);
}

uint64_t safetensors_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") n += e.file_size();
  return n;
}

}  // namespace

ConvertReport convert_gguf_to_hf(const std::string& src, const std::string& out_dir,
                                 const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!opt.tokenizer.empty())
    throw std::runtime_error(src + ": " + option_ref("tokenizer") +
                             " is not used with a GGUF input (its tokenizer comes from the "
                             "file's metadata)");
  if (fs::exists(out_dir) && !opt.overwrite)
    throw std::runtime_error(out_dir + ": output already exists (use " + option_ref("force") +
                             " to replace it)");
  ConvertReport rep;
  rep.source_format = "gguf";
  refuse_moe_model(src, "convert");
  const auto fp = std::make_shared<const GgufFile>(GgufFile::open(src));
  const GgufFile& f = *fp;
  const model::Weights w = load_gguf_weights(f, fp);  // as stored: written a tensor at a time
  rep.config = w.config;
  HfWriteOptions wo;
  wo.dtype = opt.dtype;
  wo.shard_bytes = opt.shard_bytes;
  wo.overwrite = opt.overwrite;
  model::BpeSpec spec;
  if (gguf_has_tokenizer(f.metadata())) {
    spec = gguf_tokenizer_spec(f.metadata(), src);
    try {
      const model::HfBpeTokenizer check(spec);  // validates the merges against the vocabulary
      rep.vocab = check.vocab_size();
    } catch (const std::exception& e) {
      throw std::runtime_error(src + ": " + e.what());
    }
    rep.tokenizer_path = src;
    rep.merges = static_cast<int>(spec.merges.size());
    wo.tokenizer = &spec;
  } else if (opt.require_tokenizer) {
    throw std::runtime_error(src + ": the GGUF file has no tokenizer (no tokenizer.ggml.model)");
  }
  wo.chat = read_chat_meta(src, nullptr, w.config);
  save_hf_dir(w, out_dir, wo);
  count_tensors(w, rep);
  rep.bytes = safetensors_bytes(out_dir);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

ConvertReport convert_to_hf(const std::string& src, const std::string& out_dir,
                            const ConvertOptions& opt) {
  if (!fs::is_directory(src) && GgufFile::sniff(src)) return convert_gguf_to_hf(src, out_dir, opt);
  if (fs::exists(src) && !fs::is_directory(src) && !is_llama2c_file(src))
    throw std::runtime_error(src +
                             ": unrecognised model file (convert accepts a .gguf file or a "
                             "llama2.c .bin checkpoint)");
  return convert_llama2c_to_hf(src, out_dir, opt);
}

ConvertReport convert_llama2c_to_hf(const std::string& src, const std::string& out_dir,
                                    const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (fs::is_directory(src))
    throw std::runtime_error(src + ": is a directory; convert expects a llama2.c .bin file");
  if (fs::exists(out_dir) && !opt.overwrite)
    throw std::runtime_error(out_dir + ": output already exists (use " + option_ref("force") +
                             " to replace it)");
  ConvertReport rep;
  Llama2cFormat fmt;
  const model::Weights w = load_llama2c(src, &fmt);
  rep.source_format = fmt == Llama2cFormat::kLegacy ? "llama2c-legacy" : "llama2c-v1";
  rep.config = w.config;

  std::string tok = opt.tokenizer;
  if (tok.empty()) {
    const fs::path dir = fs::path(src).parent_path();
    for (const std::string& cand :
         {std::string("tokenizer.bin"), "tok" + std::to_string(w.config.vocab_size) + ".bin"}) {
      if (fs::exists(dir / cand)) {
        tok = (dir / cand).string();
        break;
      }
    }
    if (tok.empty() && opt.require_tokenizer)
      throw std::runtime_error(src + ": no tokenizer.bin beside the model; give " +
                               option_ref("tokenizer"));
  }
  model::BpeSpec spec;
  HfWriteOptions wo;
  wo.dtype = opt.dtype;
  wo.shard_bytes = opt.shard_bytes;
  wo.overwrite = opt.overwrite;
  if (!tok.empty()) {
    auto t = model::Llama2cTokenizer::load(tok, w.config.vocab_size);
    spec = model::sentencepiece_spec_from_llama2c(t->vocab(), t->scores());
    model::HfBpeTokenizer check(spec);  // validates the merges against the vocabulary
    rep.tokenizer_path = tok;
    rep.vocab = check.vocab_size();
    rep.merges = static_cast<int>(spec.merges.size());
    wo.tokenizer = &spec;
  }
  save_hf_dir(w, out_dir, wo);

  count_tensors(w, rep);
  rep.bytes = safetensors_bytes(out_dir);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace scalesweep::io

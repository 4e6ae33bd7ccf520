// llama2.c -> Hugging Face conversion (include/scalesweep/io/convert.h).
#include "scalesweep/io/convert.h"

#include <chrono>
#include <filesystem>
#include <stdexcept>

#include "scalesweep/io/llama2c.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"

namespace scalesweep::io {

namespace fs = std::filesystem;

ConvertReport convert_llama2c_to_hf(const std::string& src, const std::string& out_dir,
                                    const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (fs::is_directory(src))
    throw std::runtime_error(src + ": is a directory; convert expects a llama2.c .bin file");
  if (fs::exists(out_dir) && !opt.overwrite)
    throw std::runtime_error(out_dir + ": output already exists (use --force to replace it)");
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
      throw std::runtime_error(src + ": no tokenizer.bin beside the model; give --tokenizer");
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

  const auto count = [&](const model::Tensor& t) {
    if (t.present()) rep.parameters += t.numel(), ++rep.tensors;
  };
  count(w.tok_embeddings);
  for (const auto& L : w.layers)
    for (const model::Tensor* t :
         {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.w1, &L.w2, &L.w3})
      count(*t);
  count(w.final_norm);
  if (!w.config.tied_embeddings) count(w.lm_head);
  for (const auto& e : fs::directory_iterator(out_dir))
    if (e.path().extension() == ".safetensors") rep.bytes += e.file_size();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace scalesweep::io

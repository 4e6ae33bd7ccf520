// A quantized model written, in memory or fed layer by layer (write_checkpoint), through the
// io::ModelWriter that the output path chooses.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "pipeline/quantize_internal.h"
#include "scalesweep/base/clock.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/checkpoint.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "scalesweep/quant/evaluate.h"

namespace scalesweep::pipeline {
namespace fs = std::filesystem;
using io::kAllLinears;
using model::LinearId;

namespace {

io::GgufDense gguf_dense_of(DType d, bool q8_0) {
  if (q8_0) return io::GgufDense::kQ8_0;
  return d == DType::kBF16  ? io::GgufDense::kBF16
         : d == DType::kF16 ? io::GgufDense::kF16
                            : io::GgufDense::kF32;
}

// The GGUF spec of a quantize run: tokenizer.* keys (a GGUF source's verbatim, else from the
// tokenizer), general.name (the source's, else its file or directory name).
io::GgufModelSpec gguf_spec(const model::Config& c, bool write_lm_head, const std::string& src,
                            bool hf_src, const model::Tokenizer* tokenizer,
                            const QuantizeOptions& opt, const WriteOptions& wopt) {
  io::GgufModelSpec g;
  g.config = c;
  g.write_lm_head = write_lm_head;
  g.dense = opt.dense;
  g.dense_type = gguf_dense_of(wopt.dense, wopt.dense_q8_0);
  g.qwen2_as = wopt.gguf_qwen2_as;
  g.source = src;
  g.overwrite = wopt.overwrite;
  // A directory's name, a file's stem ("stories260K" for stories260K.bin).
  g.name = hf_src ? fs::path(src).filename().string() : fs::path(src).stem().string();
  if (g.name.empty()) g.name = fs::path(src).parent_path().filename().string();
  g.chat = io::read_chat_meta(src, tokenizer, c);
  if (!hf_src && io::GgufFile::sniff(src)) {
    const io::GgufFile f = io::GgufFile::open(src);
    if (auto n = f.get_string("general.name")) g.name = *n;
    if (!wopt.tokenizer_override) {
      g.tokenizer_kv = io::gguf_tokenizer_kv_copy(f.metadata());
      return g;
    }
  }
  if (tokenizer) {
    g.tokenizer_kv = io::gguf_tokenizer_kv(*tokenizer, src);
  } else if (hf_src) {
    g.tokenizer_kv = io::gguf_tokenizer_kv_of_hf_dir(src);
  }
  return g;
}

}  // namespace

QuantizeReport write_checkpoint(const model::Config& c, bool write_lm_head,
                                const std::string& src_path, bool hf_src,
                                const model::Tokenizer* tokenizer, const QuantizeOptions& opt,
                                const std::string& out_dir, const WriteOptions& wopt,
                                const std::function<void(int64_t, int64_t)>& progress,
                                const CheckpointFeed& feed) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto ct_spec = [&] {
    io::CheckpointSpec spec;
    spec.config = c;
    spec.write_lm_head = write_lm_head;
    spec.dense = opt.dense;
    spec.w4a4 = opt.w4a4;
    spec.producer =
        "scalesweep " + std::string(kMethodNames.name(opt.method)) +
        (!opt.gptq ? " rtn"
         : opt.gptq_scales == gptq::ScaleTiming::kStatic
             ? " gptq"
             : " gptq dynamic " +
                   std::string(gptq::kDynamicImportanceNames.name(opt.gptq_importance)));
    spec.dense_dtype = wopt.dense;
    spec.max_shard_bytes = wopt.max_shard_bytes;
    spec.overwrite = wopt.overwrite;
    spec.source = src_path;
    spec.source_is_hf_dir = hf_src;
    spec.tokenizer = tokenizer;
    if (!hf_src) spec.chat = io::read_chat_meta(src_path, tokenizer, c);
    return spec;
  };
  const std::unique_ptr<io::ModelWriter> sink = io::open_model_writer(out_dir, ct_spec, [&] {
    return gguf_spec(c, write_lm_head, src_path, hf_src, tokenizer, opt, wopt);
  });
  QuantizeReport rep;
  rep.out_dir = out_dir;
  const auto linears = [&](int l) {  // seven, or a MoE layer's four and three per expert
    return c.moe_layer(l) ? 4 + 3 * static_cast<size_t>(c.n_experts) : size_t{7};
  };
  int64_t total = 0;
  for (int l = 0; l < c.n_layers; ++l) total += static_cast<int64_t>(linears(l));
  int64_t done = 0;
  if (progress) progress(0, total);  // the stage starts: its clock too
  sink->write_embeddings(feed.embeddings()->tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<LinearResult> rs;
    WeightsPtr w = feed.layer(l, rs);
    if (rs.size() != linears(l))
      throw std::logic_error("write_checkpoint: layer " + std::to_string(l) + " has " +
                             std::to_string(linears(l)) + " Linears");
    std::vector<io::CheckpointLinear> cl;
    for (const LinearResult& r : rs)
      cl.push_back({r.id, r.dense ? nullptr : &r.q, r.input_global_scale, r.expert});
    sink->write_layer(l, w->layers.at(static_cast<size_t>(l)), cl);
    for (LinearResult& r : rs) {
      r.q.codes.clear();
      r.q.codes.shrink_to_fit();
      rep.linears.push_back(std::move(r));
      if (progress) progress(++done, total);
    }
    w.reset();
  }
  {
    WeightsPtr h = feed.head();
    sink->write_head(h->final_norm, h->lm_head);
  }
  const io::CheckpointFiles files = sink->commit();
  rep.ignore = files.ignore;
  rep.files = files.files;
  rep.bytes = files.bytes;
  rep.phases.write = files.write_seconds;
  rep.seconds = seconds_since(t0);
  return rep;
}

QuantizeOptions with_vllm_dense(const QuantizeOptions& opt, const model::Config& c,
                                const WriteOptions& wopt, const std::string& out) {
  QuantizeOptions o = opt;
  if (io::is_gguf_path(out)) {
    const std::array<bool, 7> g = io::gguf_dense_linears(c, wopt.gguf_qwen2_as);
    for (LinearId id : kAllLinears)
      if (g[static_cast<size_t>(id)]) o.dense.add_every_layer(id);
    return o;
  }
  check_tp(wopt.tp);
  if (wopt.partial_blocks == PartialBlocks::kDense)
    for (const UnsupportedLinear& u : vllm_unsupported_linears(c, wopt.tp))
      o.dense.add_every_layer(u.id);
  return o;
}

QuantizeReport write_quantized_checkpoint(const io::LoadedModel& src, const std::string& src_path,
                                          const model::CalibStats* calib,
                                          const QuantizeOptions& opt_in, const std::string& out_dir,
                                          const WriteOptions& wopt,
                                          const std::function<void(int64_t, int64_t)>& progress) {
  check_quantize_options(opt_in, calib, true);
  const model::Weights& w = src.weights;
  const model::Config& c = w.config;
  const QuantizeOptions opt = with_vllm_dense(opt_in, c, wopt, out_dir);
  if (static_cast<int>(w.layers.size()) != c.n_layers)
    throw std::invalid_argument(src_path + ": the model has " + std::to_string(w.layers.size()) +
                                " layers, its config " + std::to_string(c.n_layers));
  // Views of the loaded model (no copies).
  const WeightsPtr view(&w, [](const model::Weights*) {});
  CheckpointFeed feed;
  feed.embeddings = [&] { return view; };
  double quantize_s = 0;
  feed.layer = [&](int l, std::vector<LinearResult>& rs) {
    const auto q0 = std::chrono::steady_clock::now();
    rs = quantize_layer(w, l, calib, opt);
    quantize_s += seconds_since(q0);
    return view;
  };
  feed.head = [&] { return view; };
  const bool write_lm_head = !c.tied_embeddings && (w.lm_head.data != w.tok_embeddings.data ||
                                                    w.lm_head.raw != w.tok_embeddings.raw);
  QuantizeReport rep = write_checkpoint(c, write_lm_head, src_path, fs::is_directory(src_path),
                                        src.tokenizer.get(), opt, out_dir, wopt, progress, feed);
  rep.phases.quantize = quantize_s;
  return rep;
}

QuantizeReport write_quantized_checkpoint_streamed(
    const std::string& hf_dir, const StreamOptions& so, const QuantizeOptions& opt,
    const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress) {
  const io::HfLazyModel parts(hf_dir);
  StreamSource s;
  s.parts = &parts;
  s.path = hf_dir;
  s.hf_dir = true;
  return write_quantized_checkpoint_streamed(s, so, opt, out_dir, wopt, progress);
}

}  // namespace scalesweep::pipeline

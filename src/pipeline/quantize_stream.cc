// Streamed quantization of a model read one decoder layer at a time (ModelParts): the
// calibration samples go through the layers as they are quantized.
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
using io::kAllLinears;
using model::LinearId;

namespace {

// The calibration samples of a streamed run, stepped through the layers as they are read: the
// calibration text tokenized (the override file, else the source's tokenizer, else the HF
// directory's tokenizer.json), the sequences sampled, the memory checked (with the layer being
// quantized: its fp32 weights and, for GPTQ, about three float64 K x K arrays of the widest
// input: Hessian, its Cholesky factor, work).
std::unique_ptr<model::LayerStepper> streamed_samples(const StreamSource& source,
                                                      const StreamOptions& so,
                                                      const model::Config& c,
                                                      const QuantizeOptions& opt, bool need_xtx) {
  std::unique_ptr<model::Tokenizer> own;
  const model::Tokenizer* tok = source.tokenizer;
  if (!so.tokenizer.empty())
    own = io::load_tokenizer_file(so.tokenizer, c.vocab_size);
  else if (!tok && source.hf_dir)
    own = io::load_hf_tokenizer(source.path, c);
  if (own) tok = own.get();
  const CalibTokens t = calib_tokens(tok, so.calib.text);
  const int64_t len = std::min<int64_t>(so.calib.seqlen, c.max_seq_len);
  std::vector<int> seqs = model::calibration_sequences(t.tokens, so.calib.nsamples, len,
                                                       so.calib.draw(), t.bos, c.max_seq_len);
  const int64_t kmax = std::max<int64_t>({c.dim, int64_t{c.n_heads} * c.head_dim, c.hidden_dim});
  model::check_calibration_memory(c, so.calib.nsamples, len, need_xtx, true, 1,
                                  model::layer_f32_bytes(c) + (opt.gptq ? 3 * 8 * kmax * kmax : 0));
  return std::make_unique<model::LayerStepper>(c, std::move(seqs), so.calib.nsamples, len,
                                               so.calib.all_experts);
}

// LayerStepper::observe, its forward's and accumulation's seconds added to `ph`.
void observe(model::LayerStepper& st, int l, const model::LayerWeights& lw, model::LayerStats* out,
             const std::array<bool, model::kNumInputs>& xtx_inputs, bool keep_input,
             QuantizeReport::Phases& ph) {
  const auto f0 = std::chrono::steady_clock::now();
  const double acc = st.observe(l, lw, out, xtx_inputs, keep_input);
  ph.forward += seconds_since(f0) - acc;
  ph.hessians += acc;
}

}  // namespace

std::vector<LinearSensitivity> streamed_sensitivities(
    const StreamSource& source, const StreamOptions& so, const QuantizeOptions& opt,
    Sensitivity sensitivity, const std::function<void(int64_t, int64_t)>& progress) {
  if (!source.parts) throw std::invalid_argument("streamed_sensitivities: no source");
  const io::ModelParts& src = *source.parts;
  const model::Config& c = src.config();
  QuantizeReport::Phases ph;
  std::unique_ptr<model::LayerStepper> smp;
  model::CalibStats cs;  // only the current layer's entry is filled
  if (!so.stats) {
    if (so.calib.text.empty())
      throw OptionError("target_bpw", "the sensitivities need calibration: pass " +
                                          option_ref("calib") + " TEXT or " + option_ref("stats") +
                                          " STATS");
    smp = streamed_samples(source, so, c, opt, true);
    cs.layers.resize(static_cast<size_t>(c.n_layers));
    const auto l0 = std::chrono::steady_clock::now();
    const model::Weights e = src.embeddings();
    ph.load += seconds_since(l0);
    smp->embed(e.tok_embeddings);
  } else {
    model::check_calib_stats(*so.stats, c);
  }
  std::vector<LinearSensitivity> out;
  const int64_t total = int64_t{c.n_layers} * 7;
  if (progress) progress(0, total);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto l0 = std::chrono::steady_clock::now();
    const model::Weights w = src.layer(l);
    ph.load += seconds_since(l0);
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const model::CalibStats* calib = so.stats;
    if (smp) {
      observe(*smp, l, lw, &cs.layers[static_cast<size_t>(l)], {true, true, true, true}, false, ph);
      calib = &cs;
    }
    const auto q0 = std::chrono::steady_clock::now();
    for (const LinearSensitivity& x : layer_sensitivities(w, l, *calib, opt, sensitivity))
      out.push_back(x);
    ph.quantize += seconds_since(q0);
    if (smp) cs.layers[static_cast<size_t>(l)] = {};
    if (progress) progress(int64_t{l + 1} * 7, total);
  }
  return out;
}

QuantizeReport write_quantized_checkpoint_streamed(
    const StreamSource& source, const StreamOptions& so, const QuantizeOptions& opt_in,
    const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress) {
  if (!source.parts) throw std::invalid_argument("write_quantized_checkpoint_streamed: no source");
  const bool calibrate = needs_calibration(opt_in) && !so.stats;
  if (calibrate && so.calib.text.empty())
    check_quantize_options(opt_in, nullptr, true);  // throws the user-facing message
  {
    model::CalibStats dummy;  // presence only: the real statistics come layer by layer
    check_quantize_options(opt_in, so.stats ? so.stats : (calibrate ? &dummy : nullptr), true);
  }
  const io::ModelParts& src = *source.parts;
  const model::Config& c = src.config();
  const QuantizeOptions opt_d = with_vllm_dense(opt_in, c, wopt, out_dir);
  const QuantizeOptions& opt = opt_d;
  if (so.stats) model::check_calib_stats(*so.stats, c);

  // Weighted methods read only the diagonal, but take it from ΣxxT as the whole-model path
  // does (dsyrk's sums), so both give the same importance to the last bit.
  const bool need_xtx = opt.gptq || method_needs_calibration(opt.method);
  // ΣxxT only for the inputs some quantized Linear of the layer reads (a qwen2 GGUF's FFN, or
  // --keep-dense, leaves the others to their diagonal).
  const auto xtx_inputs = [&](int l) {
    std::array<bool, model::kNumInputs> m{};
    for (LinearId id : kAllLinears)
      if (need_xtx && !opt.dense.contains(l, id))
        m[static_cast<size_t>(model::input_of(id))] = true;
    return m;
  };
  const bool propagate_quantized = opt.gptq && so.sequential;
  std::unique_ptr<model::LayerStepper> smp;
  if (calibrate)
    smp = streamed_samples(source, so, c, opt, opt.gptq || method_needs_calibration(opt.method));
  model::CalibStats cs;  // only the current layer's entry is filled
  cs.layers.resize(static_cast<size_t>(c.n_layers));
  if (smp) {
    cs.nsamples = smp->nsamples();
    cs.seqlen = smp->len();
  }
  cs.draw = so.calib.draw();

  QuantizeReport::Phases ph;
  CheckpointFeed feed;
  feed.embeddings = [&]() -> WeightsPtr {
    const auto l0 = std::chrono::steady_clock::now();
    auto e = std::make_shared<model::Weights>(src.embeddings());
    ph.load += seconds_since(l0);
    if (smp) smp->embed(e->tok_embeddings);
    return e;
  };
  feed.layer = [&](int l, std::vector<LinearResult>& rs) -> WeightsPtr {
    const auto l0 = std::chrono::steady_clock::now();
    auto holder = std::make_shared<model::Weights>(src.layer(l));
    ph.load += seconds_since(l0);
    const model::Weights& w = *holder;
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const model::CalibStats* calib = so.stats;
    if (smp) {
      // Sequential GPTQ keeps the input: the next layer sees this layer's quantized outputs.
      observe(*smp, l, lw, &cs.layers[static_cast<size_t>(l)], xtx_inputs(l), propagate_quantized,
              ph);
      calib = &cs;
    }
    const auto q0 = std::chrono::steady_clock::now();
    rs = quantize_layer(w, l, calib, opt);
    ph.quantize += seconds_since(q0);
    if (smp) {
      cs.layers[static_cast<size_t>(l)] = {};  // free this layer's Hessians
      if (propagate_quantized) {
        model::LayerWeights ql = lw;
        std::vector<std::vector<float>> dq;
        for (const LinearResult& r : rs) {
          if (r.dense) continue;  // the full-precision tensor stays
          dq.push_back(dequantize(r.q));
          model::Tensor& t = result_weight(ql, r);
          model::Tensor nt;
          nt.shape = t.shape;
          nt.data = dq.back().data();
          t = std::move(nt);
        }
        const auto f0 = std::chrono::steady_clock::now();
        smp->run(l, ql, false);
        ph.forward += seconds_since(f0);
      }
    }
    // The layer stays alive until the writer drops it.
    return holder;
  };
  feed.head = [&]() -> WeightsPtr {
    if (smp) smp->clear();
    return std::make_shared<model::Weights>(src.head());
  };
  QuantizeReport rep = write_checkpoint(c, !c.tied_embeddings, source.path, source.hf_dir,
                                        source.tokenizer, opt, out_dir, wopt, progress, feed);
  const double write_s = rep.phases.write;
  rep.phases = ph;
  rep.phases.write = write_s;
  return rep;
}

}  // namespace scalesweep::pipeline

// Whole-model NVFP4 quantization: one entry (quantize_model), the in-memory and streamed
// paths, and the calibration they run.
#include "scalesweep/pipeline/quantize_model.h"

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
#include "scalesweep/quant/evaluate.h"

namespace scalesweep::pipeline {
namespace fs = std::filesystem;
using io::hf_module_name;
using io::kAllLinears;
using io::linear_weight;
using model::InputId;
using model::LinearId;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int group_of(LinearId id) {
  switch (id) {
    case LinearId::kQ:
    case LinearId::kK:
    case LinearId::kV:
      return 0;
    case LinearId::kO:
      return 1;
    case LinearId::kGate:
    case LinearId::kUp:
      return 2;
    case LinearId::kDown:
      return 3;
  }
  return 3;
}

// The importance a Linear's method reads, from the statistics of its input: per-column
// diag ΣxxT (weighted methods) or ΣxxT's diagonal blocks (block-Hessian methods); none else.
struct MethodImportance {
  std::vector<float> col;
  std::vector<double> blocks;
  Importance imp;
};
MethodImportance method_importance(Method m, int block, const model::InputStats* st, int64_t cols,
                                   const std::string& name) {
  MethodImportance r;
  if (method_uses_hessian(m)) {
    if (!st) throw std::invalid_argument(name + ": a block-Hessian method needs calibration");
    r.blocks = block_hessians(st->xtx.data(), cols, block);
    r.imp = {ImportanceKind::kBlockHessian, nullptr, r.blocks.data(), block};
  } else if (method_is_weighted(m)) {
    if (!st) throw std::invalid_argument(name + ": a weighted method needs calibration");
    r.col.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) r.col[j] = static_cast<float>(st->diag(j));
    r.imp = {ImportanceKind::kPerColumn, r.col.data()};
  }
  return r;
}

}  // namespace

void apply_preset(Preset p, QuantizeOptions& o) {
  switch (p) {
    case Preset::kBest:
      // SmolLM2-135M, 16,384 held-out WikiText-2 tokens (docs/PEERS.md): GPTQ with scales
      // chosen in the loop by sweep-wmse (hdiag importance) gave the lowest NLL of our recipes
      // (2.9634, against 2.9667 for the static block-Hessian exhaustive search), at a tenth of
      // its cost.
      o.method = Method::kSweepWmse;
      o.gptq = true;
      o.gptq_scales = gptq::ScaleTiming::kDynamic;
      o.gptq_importance = gptq::DynamicImportance::kHessianDiag;
      o.global_scale_steps = 0;
      return;
  }
}

std::vector<std::string> preset_fields(Preset p) {
  switch (p) {
    case Preset::kBest:
      return {"method", "gptq", "gptq_scales", "gptq_importance", "search_global_scale"};
  }
  return {};
}

bool needs_calibration(const QuantizeOptions& o) {
  return o.gptq || o.w4a4 || method_needs_calibration(o.method);
}

void check_quantize_options(const QuantizeOptions& o, const model::CalibStats* calib,
                            bool for_checkpoint) {
  if (o.method == Method::kOptFp32)
    throw std::invalid_argument(
        "method opt-fp32 is a continuous lower bound without FP8 scales; it cannot produce "
        "quantized weights (use it in `experiment` reports only)");
  if (o.method == Method::kSweep)
    throw std::invalid_argument(
        "method 'sweep' needs a custom window; use sweep-mse or "
        "sweep-wmse");
  check_block(TensorFormat::kNvfp4, o.block);
  if (for_checkpoint && o.block != 16)
    throw std::invalid_argument(
        "compressed-tensors NVFP4 checkpoints use block 16 (vLLM's "
        "kernels); block " +
        std::to_string(o.block) + " is only available for simulation (`experiment`, `ppl`)");
  if (needs_calibration(o) && !calib) {
    const std::string why(o.gptq ? "GPTQ" : o.w4a4 ? "WA" : kMethodNames.name(o.method));
    throw OptionError(o.gptq   ? "gptq"
                      : o.w4a4 ? "quant"
                               : "method",
                      why +
                          " needs calibration statistics (Hessians, amax, importance): pass "
                          "--calib TEXT (sampled with --nsamples/--seqlen/--seed) or --stats "
                          "STATS.safetensors (written by `scalesweep calibrate`)");
  }
  if (o.gptq && !(o.damp > 0)) throw OptionError("damp", "must be > 0");
  if (o.max_block_scale) check_max_block_scale(*o.max_block_scale);
  check_threads(o.threads);
}

Method data_free_method(Method m) {
  switch (m) {
    case Method::kSweepWmse:
    case Method::kSweepHessian:
      return Method::kSweepMse;
    case Method::kExhaustiveWmse:
    case Method::kExhaustiveHessian:
      return Method::kExhaustiveMse;
    case Method::kOptFp8Wmse:
      return Method::kOptFp8Mse;
    default:
      return m;
  }
}

namespace {

model::Tensor& expert_weight(model::LayerWeights::Expert& ex, LinearId id) {
  return id == LinearId::kGate ? ex.w1 : id == LinearId::kUp ? ex.w3 : ex.w2;
}

// The weight a result replaces: a Linear of the layer, or an expert's.
model::Tensor& result_weight(model::LayerWeights& lw, const LinearResult& r) {
  if (r.expert < 0) return linear_weight(lw, r.id);
  return expert_weight(lw.experts.at(static_cast<size_t>(r.expert)), r.id);
}

// One Linear's weights quantized as the run asks: GPTQ on `st`'s Hessian (`gptq`; st set), or
// RTN with cfg's selector and its importance from `st` (null: data-free). Fills r.q and, for
// GPTQ, the loss report.
void quantize_linear_weights(const float* w, int64_t rows, int64_t cols,
                             const model::InputStats* st, const QuantConfig& cfg,
                             const QuantizeOptions& opt, bool gptq, LinearResult& r) {
  if (gptq) {
    gptq::GptqConfig g;
    g.quant = cfg;
    g.damp = opt.damp;
    g.block_size = opt.gptq_block;
    g.act_order = opt.act_order;
    g.scale_timing = opt.gptq_scales;
    g.importance = opt.gptq_importance;
    g.compute_losses = true;
    gptq::GptqStats gs;
    r.q = gptq::gptq_quantize(w, rows, cols, st->xtx.data(), st->tokens, g, r.name, &gs);
    r.loss_rtn = gs.loss_rtn;
    r.loss_gptq = gs.loss_gptq;
    return;
  }
  const MethodImportance mi = method_importance(cfg.selector.method, opt.block, st, cols, r.name);
  r.q = quantize(w, rows, cols, mi.imp, cfg, r.name);
}

// The experts of MoE layer `layer` (QuantizeOptions::expert_min_tokens, quantize_layer), each
// gate, up, down appended to `out`.
void quantize_experts(const model::Weights& w, int layer, const model::CalibStats* calib,
                      const QuantizeOptions& opt, const QuantConfig& base, float C,
                      std::vector<LinearResult>& out) {
  const model::Config& c = w.config;
  const model::LayerWeights& lw = w.layers[static_cast<size_t>(layer)];
  const std::string where = "model.layers." + std::to_string(layer);
  if (static_cast<int>(lw.experts.size()) != c.n_experts)
    throw std::invalid_argument(where + ": " + std::to_string(lw.experts.size()) +
                                " experts, the config has " + std::to_string(c.n_experts));
  const std::vector<model::ExpertStats>* es = nullptr;
  if (calib) {
    es = &calib->layers[static_cast<size_t>(layer)].experts;
    if (static_cast<int>(es->size()) != c.n_experts)
      throw std::invalid_argument(where + ": calibration statistics of " +
                                  std::to_string(es->size()) + " experts, the model has " +
                                  std::to_string(c.n_experts) + " (statistics of a dense model?)");
  }
  const int64_t min_tokens = opt.expert_min_tokens < 0 ? c.dim : opt.expert_min_tokens;
  // Enough tokens in the expert's statistics: the routed ones, or every token when they were
  // collected with all_experts (calibrate --calib-all-experts).
  const auto calibrated = [&](int e) {
    const int64_t n = es ? (*es)[static_cast<size_t>(e)].in.tokens : 0;
    return n > 0 && n >= min_tokens;
  };
  // W4A4: the largest input amax of the layer's experts for gate/up (0) and down (1), over
  // those that reached min_tokens, else over those with any token (model/calib.h amax).
  float layer_amax[2] = {0, 0};
  if (es && opt.w4a4) {
    for (const bool strict : {true, false}) {
      for (int e = 0; e < c.n_experts; ++e) {
        const model::ExpertStats& x = (*es)[static_cast<size_t>(e)];
        if (strict ? !calibrated(e) : x.in.tokens <= 0) continue;
        layer_amax[0] = std::max(layer_amax[0], x.in.amax);
        layer_amax[1] = std::max(layer_amax[1], x.mid.amax);
      }
      if (layer_amax[0] > 0 && layer_amax[1] > 0) break;
    }
    if (!(layer_amax[0] > 0 && layer_amax[1] > 0 && std::isfinite(layer_amax[0]) &&
          std::isfinite(layer_amax[1])))
      throw std::invalid_argument(where +
                                  "experts: no expert of the layer has a calibrated "
                                  "input (amax 0): W4A4 input global scales need at "
                                  "least one calibration token routed to an expert");
  }
  static constexpr LinearId kExpertLinears[3] = {LinearId::kGate, LinearId::kUp, LinearId::kDown};
  for (int e = 0; e < c.n_experts; ++e) {
    const model::LayerWeights::Expert& ex = lw.experts[static_cast<size_t>(e)];
    const model::Tensor* src[3] = {&ex.w1, &ex.w3, &ex.w2};
    const bool own = calibrated(e);
    const bool data_free = calib && !own;
    // gate and up: one global scale (the fused gate_up group); down its own.
    const float gs_gate_up =
        global_scale_for_amax(std::max(model::tensor_amax(ex.w1), model::tensor_amax(ex.w3)), C);
    const float gs_down = global_scale_for_amax(model::tensor_amax(ex.w2), C);
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const LinearId id = kExpertLinears[k];
      std::vector<std::shared_ptr<void>> keep;
      const model::Tensor t = model::as_f32(*src[k], keep);
      LinearResult r;
      r.layer = layer;
      r.id = id;
      r.expert = e;
      r.routed = es ? (*es)[static_cast<size_t>(e)].routed : 0;
      r.data_free = data_free;
      r.name = io::hf_expert_module_name(c, layer, e, id);
      if (t.shape.size() != 2 || !t.data)
        throw std::invalid_argument(r.name + ": weight is not a 2-D tensor");
      const int64_t rows = t.shape[0], cols = t.shape[1];
      const model::InputStats* st = nullptr;
      if (es) {
        st = &(*es)[static_cast<size_t>(e)].input(model::input_of(id));
        const bool need_xtx = own && (opt.gptq || method_uses_hessian(opt.method));
        if (st->dim != cols || (need_xtx && st->xtx.size() != static_cast<size_t>(cols * cols)))
          throw std::invalid_argument(r.name + ": calibration input has dimension " +
                                      std::to_string(st->dim) +
                                      (need_xtx && st->dim == cols ? " but no ΣxxT" : "") +
                                      ", the weight has " + std::to_string(cols) + " columns");
      }
      QuantConfig cfg = base;
      cfg.global_scale = k < 2 ? gs_gate_up : gs_down;
      if (data_free) cfg.selector.method = data_free_method(opt.method);
      quantize_linear_weights(t.data, rows, cols, own ? st : nullptr, cfg, opt, opt.gptq && own, r);
      const std::vector<float> dq = dequantize(r.q);
      r.nmse = error_metrics(t.data, dq.data(), rows, cols, {}).nmse;
      if (opt.w4a4) {
        if (!st) throw std::invalid_argument(r.name + ": W4A4 needs calibration statistics");
        const float amax = own && st->amax > 0 ? st->amax : layer_amax[k < 2 ? 0 : 1];
        r.input_scale_source =
            own && st->amax > 0 ? InputScaleSource::kOwn : InputScaleSource::kLayerMax;
        r.input_global_scale = global_scale_for_amax(amax, C);
        if (!std::isfinite(*r.input_global_scale) || !(*r.input_global_scale > 0))
          throw std::logic_error(r.name + ": input global scale " +
                                 std::to_string(*r.input_global_scale) + " from amax " +
                                 std::to_string(amax));
      }
      r.seconds = seconds_since(t0);
      out.push_back(std::move(r));
    }
  }
}

}  // namespace

std::vector<LinearResult> quantize_layer(const model::Weights& w, int layer,
                                         const model::CalibStats* calib,
                                         const QuantizeOptions& opt) {
  if (layer < 0 || layer >= static_cast<int>(w.layers.size()))
    throw std::invalid_argument("quantize_layer: no layer " + std::to_string(layer));
  if (calib && static_cast<int>(calib->layers.size()) != static_cast<int>(w.layers.size()))
    throw std::invalid_argument("calibration statistics have " +
                                std::to_string(calib->layers.size()) + " layers, the model " +
                                std::to_string(w.layers.size()));
  const model::LayerWeights& lw = w.layers[static_cast<size_t>(layer)];
  const float C = opt.max_block_scale.value_or(default_max_block_scale(opt.method));
  auto is_dense = [&](LinearId id) { return opt.dense.contains(layer, id); };
  // A MoE layer has no dense gate/up/down: its experts are quantized after q/k/v/o.
  const bool moe = w.config.moe_layer(layer);
  auto in_layer = [&](LinearId id) { return !moe || group_of(id) < 2; };
  float group_amax[4] = {0, 0, 0, 0};
  for (LinearId id : kAllLinears)
    if (!is_dense(id) && in_layer(id))
      group_amax[group_of(id)] =
          std::max(group_amax[group_of(id)], model::tensor_amax(linear_weight(lw, id)));
  // The statistics of a Linear's input, checked against its weight (GPTQ and the block-Hessian
  // methods read ΣxxT; W4A4 the amax, weighted methods the diagonal).
  auto stats_of = [&](LinearId id, int64_t cols) -> const model::InputStats* {
    if (!calib) return nullptr;
    const bool need_xtx = opt.gptq || method_uses_hessian(opt.method);
    const model::InputStats* st =
        &calib->layers[static_cast<size_t>(layer)].input(model::input_of(id));
    if (st->dim != cols || (need_xtx && st->xtx.size() != static_cast<size_t>(cols * cols)))
      throw std::invalid_argument(hf_module_name(layer, id) + ": calibration input '" +
                                  std::string(model::input_name(model::input_of(id))) +
                                  "' has dimension " + std::to_string(st->dim) +
                                  (need_xtx && st->dim == cols ? " but no ΣxxT" : "") +
                                  ", the weight has " + std::to_string(cols) + " columns");
    return st;
  };
  QuantConfig base;
  base.format = TensorFormat::kNvfp4;
  base.block = opt.block;
  base.selector.method = opt.method;
  base.threads = opt.threads;
  // One encode-direction global scale per fused group: the rule 6C/amax, or the candidate
  // with the least total objective of the group's members (search_global_scale).
  float group_gs[4];
  for (int g = 0; g < 4; ++g) group_gs[g] = global_scale_for_amax(group_amax[g], C);
  if (opt.global_scale_steps > 0) {
    for (int g = 0; g < 4; ++g) {
      std::vector<std::vector<std::shared_ptr<void>>> keeps;
      std::vector<MethodImportance> imps;
      std::vector<GlobalScaleMember> members;
      keeps.reserve(3);
      imps.reserve(3);
      for (LinearId id : kAllLinears) {
        if (is_dense(id) || group_of(id) != g || !in_layer(id)) continue;
        keeps.emplace_back();
        const model::Tensor t = model::as_f32(linear_weight(lw, id), keeps.back());
        const std::string name = hf_module_name(layer, id);
        imps.push_back(
            method_importance(opt.method, opt.block, stats_of(id, t.shape[1]), t.shape[1], name));
        members.push_back({tensor_ref(t.data, t.shape[0], t.shape[1]), imps.back().imp, name});
      }
      if (!members.empty())
        group_gs[g] = search_global_scale(members, base, opt.global_scale_steps).global_scale;
    }
  }

  std::vector<LinearResult> out;
  for (LinearId id : kAllLinears) {
    if (!in_layer(id)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    // GPTQ and quantize read fp32: a weight stored in another precision is widened here, one
    // Linear at a time.
    std::vector<std::shared_ptr<void>> keep;
    const model::Tensor t = model::as_f32(linear_weight(lw, id), keep);
    LinearResult r;
    r.layer = layer;
    r.id = id;
    r.name = hf_module_name(layer, id);
    if (t.shape.size() != 2 || !t.data)
      throw std::invalid_argument(r.name + ": weight is not a 2-D tensor");
    const int64_t rows = t.shape[0], cols = t.shape[1];
    if (is_dense(id)) {  // left unquantized: the writer stores the source values
      r.dense = true;
      r.q.format = TensorFormat::kNvfp4;
      r.q.rows = rows;
      r.q.cols = cols;
      r.q.block = opt.block;
      out.push_back(std::move(r));
      continue;
    }
    const model::InputStats* st = stats_of(id, cols);
    QuantConfig cfg = base;
    cfg.global_scale = group_gs[group_of(id)];
    if (opt.gptq && !st)
      throw std::invalid_argument(r.name + ": GPTQ needs calibration statistics");
    quantize_linear_weights(t.data, rows, cols, st, cfg, opt, opt.gptq, r);
    const std::vector<float> dq = dequantize(r.q);
    r.nmse = error_metrics(t.data, dq.data(), rows, cols, {}).nmse;
    if (opt.w4a4) {
      if (!st) throw std::invalid_argument(r.name + ": W4A4 needs calibration statistics");
      if (!std::isfinite(st->amax))
        throw std::invalid_argument(r.name + ": calibration input amax is not finite");
      r.input_global_scale = global_scale_for_amax(st->amax, C);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(std::move(r));
  }
  if (moe) quantize_experts(w, layer, calib, opt, base, C, out);
  return out;
}

std::vector<LinearSensitivity> layer_sensitivities(const model::Weights& w, int layer,
                                                   const model::CalibStats& calib,
                                                   const QuantizeOptions& opt, Sensitivity s) {
  QuantizeOptions rtn = opt;
  rtn.gptq = false;
  rtn.w4a4 = false;
  const std::vector<LinearResult> rs = quantize_layer(w, layer, &calib, rtn);
  const model::LayerStats& L = calib.layers.at(static_cast<size_t>(layer));
  std::vector<LinearSensitivity> out;
  for (const LinearResult& r : rs) {
    if (r.dense) continue;
    const model::InputStats& st = L.input(model::input_of(r.id));
    if (!st.has_xtx() || st.tokens <= 0)
      throw std::invalid_argument(r.name + ": the sensitivity needs the calibration input's ΣxxT");
    std::vector<std::shared_ptr<void>> keep;
    const model::Tensor t =
        model::as_f32(io::linear_weight(w.layers[static_cast<size_t>(layer)], r.id), keep);
    const std::vector<float> dq = dequantize(r.q);
    const std::vector<float> zero(dq.size(), 0.0f);
    LinearSensitivity x;
    x.layer = layer;
    x.id = r.id;
    x.loss = gptq::hessian_loss(t.data, dq.data(), r.q.rows, r.q.cols, st.xtx.data(), st.tokens);
    x.energy =
        gptq::hessian_loss(t.data, zero.data(), r.q.rows, r.q.cols, st.xtx.data(), st.tokens);
    x.score = s == Sensitivity::kOutput ? x.loss : x.energy > 0 ? x.loss / x.energy : 0.0;
    if (sensitivity_is_measured(s))
      throw std::invalid_argument("layer_sensitivities: " + std::string(kSensitivityNames.name(s)) +
                                  " is measured by measured_sensitivities");
    out.push_back(x);
  }
  return out;
}

namespace {
// log Σ exp(x) of a row (float exponentials, float64 sum).
double log_sum_exp(const float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
  return static_cast<double>(mx) + std::log(sum);
}
}  // namespace

std::vector<LinearSensitivity> measured_sensitivities(
    const model::Weights& w, const model::CalibStats& calib, const QuantizeOptions& opt,
    const std::vector<int>& seqs, int64_t nsamp, int64_t len, Sensitivity sens,
    const std::function<void(int64_t, int64_t)>& progress) {
  const model::Config& c = w.config;
  if (nsamp < 1 || len < 2 || seqs.size() != static_cast<size_t>(nsamp * len))
    throw std::invalid_argument("measured_sensitivities: " + std::to_string(seqs.size()) +
                                " tokens for " + std::to_string(nsamp) + " sequences of " +
                                std::to_string(len));
  const std::shared_ptr<const model::Weights> wp(&w, [](const model::Weights*) {});
  model::Transformer tf(wp, static_cast<int>(len));
  const int64_t D = c.dim, V = c.vocab_size, L = c.n_layers, n = nsamp * len;
  // The hidden states entering each layer (X[L]: leaving the last), every sequence.
  std::vector<std::vector<float>> X(static_cast<size_t>(L + 1));
  X[0].resize(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i)
    model::dequantize_rows(w.tok_embeddings, seqs[static_cast<size_t>(i)],
                           seqs[static_cast<size_t>(i)] + 1, X[0].data() + i * D);
  for (int64_t l = 0; l < L; ++l) {
    X[static_cast<size_t>(l + 1)] = X[static_cast<size_t>(l)];
    for (int64_t s = 0; s < nsamp; ++s)
      tf.forward_layer(static_cast<int>(l), w.layers[static_cast<size_t>(l)],
                       X[static_cast<size_t>(l + 1)].data() + s * len * D, static_cast<int>(len),
                       0);
  }
  // The dense model's probabilities p [n, V], Σ p log p per row and the NLL of the next tokens.
  // With only one Linear quantized (logits z, log-probabilities z - lse(z)), per row
  //   KL(p || q) = Σ p log p - Σ p z + lse(z)      (Σ p = 1)
  // one pass of exponentials (lse) and one dot product.
  std::vector<float> p_dense(static_cast<size_t>(n * V)), logits(static_cast<size_t>(len * V)),
      x(static_cast<size_t>(len * D));
  std::vector<double> plogp(static_cast<size_t>(n));
  double nll_dense = 0;
  const int64_t scored = nsamp * (len - 1);
  auto target = [&](int64_t s, int64_t t) { return seqs[static_cast<size_t>(s * len + t + 1)]; };
  for (int64_t s = 0; s < nsamp; ++s) {
    std::copy_n(X[static_cast<size_t>(L)].data() + s * len * D, len * D, x.data());
    tf.final_logits(x.data(), static_cast<int>(len), logits.data());
    for (int64_t t = 0; t < len; ++t) {
      const float* z = logits.data() + t * V;
      const double lse = log_sum_exp(z, V);
      float* p = p_dense.data() + (s * len + t) * V;
      double e = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double lp = static_cast<double>(z[v]) - lse;
        p[v] = static_cast<float>(std::exp(lp));
        e += static_cast<double>(p[v]) * lp;
      }
      plogp[static_cast<size_t>(s * len + t)] = e;
      if (t + 1 < len) nll_dense += lse - z[target(s, t)];
    }
  }
  X[static_cast<size_t>(L)] = {};
  QuantizeOptions q = opt;  // the run's quantizer: RTN, or GPTQ on these statistics
  q.w4a4 = false;
  std::vector<LinearSensitivity> out;
  const int64_t total = L * 7;
  std::vector<double> kl_row(static_cast<size_t>(len)), nll_row(static_cast<size_t>(len));
  if (progress) progress(0, total);
  for (int64_t l = 0; l < L; ++l) {
    const std::vector<LinearSensitivity> prox =
        layer_sensitivities(w, static_cast<int>(l), calib, opt, Sensitivity::kRelative);
    const std::vector<LinearResult> rs = quantize_layer(w, static_cast<int>(l), &calib, q);
    size_t k = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      const LinearResult& r = rs[i];
      if (r.dense) {
        if (progress) progress(l * 7 + static_cast<int64_t>(i) + 1, total);
        continue;
      }
      LinearSensitivity ls = prox.at(k++);
      model::LayerWeights ql = w.layers[static_cast<size_t>(l)];
      const std::vector<float> dq = dequantize(r.q);
      model::Tensor& t = linear_weight(ql, r.id);
      model::Tensor nt;
      nt.shape = t.shape;
      nt.data = dq.data();
      t = std::move(nt);
      double kl = 0, nll = 0;
      for (int64_t s = 0; s < nsamp; ++s) {
        std::copy_n(X[static_cast<size_t>(l)].data() + s * len * D, len * D, x.data());
        tf.forward_layer(static_cast<int>(l), ql, x.data(), static_cast<int>(len), 0);
        for (int64_t m = l + 1; m < L; ++m)
          tf.forward_layer(static_cast<int>(m), w.layers[static_cast<size_t>(m)], x.data(),
                           static_cast<int>(len), 0);
        tf.final_logits(x.data(), static_cast<int>(len), logits.data());
        parallel_for(len, opt.threads, [&](int64_t b, int64_t e, int) {
          for (int64_t tt = b; tt < e; ++tt) {
            const float* z = logits.data() + tt * V;
            const float* p = p_dense.data() + (s * len + tt) * V;
            const double lse = log_sum_exp(z, V);
            double dot = 0;
            for (int64_t v = 0; v < V; ++v) dot += static_cast<double>(p[v]) * z[v];
            kl_row[static_cast<size_t>(tt)] = plogp[static_cast<size_t>(s * len + tt)] - dot + lse;
            nll_row[static_cast<size_t>(tt)] = tt + 1 < len ? lse - z[target(s, tt)] : 0.0;
          }
        });
        for (int64_t tt = 0; tt < len; ++tt) {  // summed in order: any thread count, same sum
          kl += kl_row[static_cast<size_t>(tt)];
          nll += nll_row[static_cast<size_t>(tt)];
        }
      }
      ls.kl = kl / static_cast<double>(n);
      ls.dnll = (nll - nll_dense) / static_cast<double>(scored);
      ls.score = sens == Sensitivity::kKl       ? ls.kl
                 : sens == Sensitivity::kNll    ? ls.dnll
                 : sens == Sensitivity::kOutput ? ls.loss
                                                : ls.score;
      out.push_back(ls);
      if (progress) progress(l * 7 + static_cast<int64_t>(i) + 1, total);
    }
  }
  return out;
}

void place_quantized_layer(model::Weights& out, int layer, std::vector<LinearResult>& rs,
                           QuantizedForm form) {
  model::LayerWeights& ol = out.layers[static_cast<size_t>(layer)];
  for (LinearResult& r : rs) {
    if (r.dense) continue;  // the source tensor stays (shared)
    model::Tensor& t = r.expert < 0
                           ? linear_weight(ol, r.id)
                           : expert_weight(ol.experts.at(static_cast<size_t>(r.expert)), r.id);
    const std::vector<int64_t> shape = t.shape;
    if (form == QuantizedForm::kPacked && r.q.format == TensorFormat::kNvfp4 && r.q.block == 16) {
      auto held = std::make_shared<QuantizedTensor>();
      held->codes = std::move(r.q.codes);
      held->scales = r.q.scales;
      t = model::Tensor{};
      t.shape = shape;
      t.dtype = model::WeightDType::kNvfp4;
      t.raw = held->codes.data();
      t.nvfp4_scales = held->scales.data();
      t.nvfp4_global_scale = r.q.global_scale;
      out.storage.push_back(std::move(held));
      continue;
    }
    const std::vector<float> dq = dequantize(r.q);
    float* p = out.alloc(t, shape);
    std::copy(dq.begin(), dq.end(), p);
    std::vector<uint8_t>().swap(r.q.codes);
  }
}

model::Weights quantized_weights(const model::Weights& w, const model::CalibStats* calib,
                                 const QuantizeOptions& opt,
                                 const std::function<void(int64_t, int64_t)>& progress,
                                 std::vector<LinearResult>* results, QuantizedForm form) {
  check_quantize_options(opt, calib, false);
  model::Weights out = w;  // shares every tensor and its storage; the Linears are replaced below
  int64_t total = 0;       // Linears: seven a layer, a MoE layer's four and 3 per expert
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l)
    total += w.config.moe_layer(l) ? 4 + 3 * int64_t{w.config.n_experts} : 7;
  int64_t done = 0;
  if (progress) progress(0, total);  // the stage starts: its clock too
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l) {
    std::vector<LinearResult> rs = quantize_layer(w, l, calib, opt);
    place_quantized_layer(out, l, rs, form);
    for (size_t i = 0; i < rs.size(); ++i)
      if (progress) progress(++done, total);
    if (results) std::move(rs.begin(), rs.end(), std::back_inserter(*results));
  }
  return out;
}

namespace {

using WeightsPtr = std::shared_ptr<const model::Weights>;

// What the checkpoint writer pulls, in file order; each returned object is dropped as soon
// as its tensors are written.
struct CheckpointFeed {
  std::function<WeightsPtr()> embeddings;  // ->tok_embeddings
  // ->layers[l] (dense tensors) and the seven quantized Linears of layer l.
  std::function<WeightsPtr(int l, std::vector<LinearResult>& rs)> layer;
  std::function<WeightsPtr()> head;  // ->final_norm, ->lm_head
};

// Either writer behind one protocol (embeddings, layers, head, commit).
struct ModelSink {
  virtual ~ModelSink() = default;
  virtual void embeddings(const model::Tensor& t) = 0;
  virtual void layer(int l, const model::LayerWeights& lw,
                     const std::vector<io::CheckpointLinear>& cl) = 0;
  virtual void head(const model::Tensor& norm, const model::Tensor& lm_head) = 0;
  virtual io::CheckpointFiles commit() = 0;
};
template <class W>
struct SinkOf : ModelSink {
  template <class Spec>
  SinkOf(const std::string& out, const Spec& spec) : w(out, spec) {}
  void embeddings(const model::Tensor& t) override { w.write_embeddings(t); }
  void layer(int l, const model::LayerWeights& lw,
             const std::vector<io::CheckpointLinear>& cl) override {
    w.write_layer(l, lw, cl);
  }
  void head(const model::Tensor& n, const model::Tensor& h) override { w.write_head(n, h); }
  io::CheckpointFiles commit() override { return w.commit(); }
  W w;
};

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
  } else if (hf_src && fs::exists(fs::path(src) / "tokenizer.json")) {
    g.tokenizer_kv = io::gguf_tokenizer_kv_spec(model::load_tokenizer_json(src), src);
  }
  return g;
}

// Drives the checkpoint writer: embeddings, layer 0 .. n-1 (quantized by the feed), head.
QuantizeReport write_checkpoint(const model::Config& c, bool write_lm_head,
                                const std::string& src_path, bool hf_src,
                                const model::Tokenizer* tokenizer, const QuantizeOptions& opt,
                                const std::string& out_dir, const WriteOptions& wopt,
                                const std::function<void(int64_t, int64_t)>& progress,
                                const CheckpointFeed& feed) {
  const auto t0 = std::chrono::steady_clock::now();
  io::CheckpointSpec spec;
  spec.config = c;
  spec.write_lm_head = write_lm_head;
  spec.dense = opt.dense;
  spec.w4a4 = opt.w4a4;
  spec.producer = "scalesweep " + std::string(kMethodNames.name(opt.method)) +
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
  std::unique_ptr<ModelSink> sink;
  if (is_gguf_output(out_dir))
    sink = std::make_unique<SinkOf<io::GgufModelWriter>>(
        out_dir, gguf_spec(c, write_lm_head, src_path, hf_src, tokenizer, opt, wopt));
  else
    sink = std::make_unique<SinkOf<io::CheckpointWriter>>(out_dir, spec);
  QuantizeReport rep;
  rep.out_dir = out_dir;
  const auto linears = [&](int l) {  // seven, or a MoE layer's four and three per expert
    return c.moe_layer(l) ? 4 + 3 * static_cast<size_t>(c.n_experts) : size_t{7};
  };
  int64_t total = 0;
  for (int l = 0; l < c.n_layers; ++l) total += static_cast<int64_t>(linears(l));
  int64_t done = 0;
  if (progress) progress(0, total);  // the stage starts: its clock too
  sink->embeddings(feed.embeddings()->tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<LinearResult> rs;
    WeightsPtr w = feed.layer(l, rs);
    if (rs.size() != linears(l))
      throw std::logic_error("write_checkpoint: layer " + std::to_string(l) + " has " +
                             std::to_string(linears(l)) + " Linears");
    std::vector<io::CheckpointLinear> cl;
    for (const LinearResult& r : rs)
      cl.push_back({r.id, r.dense ? nullptr : &r.q, r.input_global_scale, r.expert});
    sink->layer(l, w->layers.at(static_cast<size_t>(l)), cl);
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
    sink->head(h->final_norm, h->lm_head);
  }
  const io::CheckpointFiles files = sink->commit();
  rep.ignore = files.ignore;
  rep.files = files.files;
  rep.bytes = files.bytes;
  rep.phases.write = files.write_seconds;
  rep.seconds = seconds_since(t0);
  return rep;
}

}  // namespace

bool is_gguf_output(const std::string& out) { return out.ends_with(".gguf"); }

std::array<bool, 7> gguf_dense_linears(const model::Config& c, io::GgufQwen2As qwen2_as) {
  std::array<bool, 7> d{};
  for (LinearId id : kAllLinears)
    d[static_cast<size_t>(id)] = !io::gguf_nvfp4_obstacle(c, id, qwen2_as).empty();
  return d;
}

namespace {
// `opt` with the Linears vLLM cannot take marked dense (WriteOptions::partial_blocks), or for a
// GGUF output those ggml cannot store as NVFP4.
QuantizeOptions with_vllm_dense(const QuantizeOptions& opt, const model::Config& c,
                                const WriteOptions& wopt, const std::string& out) {
  QuantizeOptions o = opt;
  if (is_gguf_output(out)) {
    const std::array<bool, 7> g = gguf_dense_linears(c, wopt.gguf_qwen2_as);
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
}  // namespace

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

namespace {

// The calibration samples of a streamed run: their hidden states [nsamples, len, dim] stay in
// memory and go through one decoder layer at a time on a one-layer runtime.
struct StreamedSamples {
  std::vector<int> seqs;
  int64_t nsamp = 0, len = 0, dim = 0;
  bool all_experts = false;  // calibrate --calib-all-experts
  std::vector<float> X;      // hidden states
  std::vector<float> tmp;
  std::unique_ptr<model::Transformer> tf;
  std::shared_ptr<model::Weights> skel;  // the one-layer runtime's config

  // Tokenizes the calibration text (the override file, else the source's tokenizer, else the
  // HF directory's tokenizer.json), samples the sequences, checks the memory and makes the
  // runtime (KV cache for one layer, slot 0).
  StreamedSamples(const StreamSource& source, const StreamOptions& so, const model::Config& c,
                  const QuantizeOptions& opt, bool need_xtx) {
    std::unique_ptr<model::Tokenizer> own;
    const model::Tokenizer* tok = source.tokenizer;
    if (!so.tokenizer.empty())
      own = io::load_tokenizer_file(so.tokenizer, c.vocab_size);
    else if (!tok && source.hf_dir)
      own = io::load_hf_tokenizer(source.path, c);
    if (own) tok = own.get();
    const CalibTokens t = calib_tokens(tok, so.calib.text);
    len = std::min<int64_t>(so.calib.seqlen, c.max_seq_len);
    seqs = model::calibration_sequences(t.tokens, so.calib.nsamples, len, so.calib.seed, t.bos,
                                        c.max_seq_len);
    nsamp = so.calib.nsamples;
    dim = c.dim;
    all_experts = so.calib.all_experts;
    // The layer being quantized: its fp32 weights and, for GPTQ, about three float64 K x K
    // arrays (Hessian, its Cholesky factor, work) of the widest input.
    const int64_t kmax = std::max<int64_t>({c.dim, int64_t{c.n_heads} * c.head_dim, c.hidden_dim});
    model::check_calibration_memory(
        c, nsamp, len, need_xtx, true, 1,
        model::layer_f32_bytes(c) + (opt.gptq ? 3 * 8 * kmax * kmax : 0));
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i] < 0 || seqs[i] >= c.vocab_size)
        throw std::out_of_range("token id " + std::to_string(seqs[i]) + " at index " +
                                std::to_string(i % static_cast<size_t>(len)) +
                                " outside the vocabulary of " + std::to_string(c.vocab_size));
    skel = std::make_shared<model::Weights>();
    skel->config = c;
    skel->config.n_layers = 1;
    skel->layers.resize(1);
    tf = std::make_unique<model::Transformer>(skel, static_cast<int>(len));
  }
  // The one-layer runtime's layer 0 is a MoE layer exactly when layer l of `c` is (the
  // runtime reads its config at each forward; its buffers are sized for both).
  void as_layer(const model::Config& c, int l) {
    if (!c.moe()) return;
    skel->config.moe_sparse_step = 1;
    skel->config.dense_layers = c.moe_layer(l) ? std::vector<int>{} : std::vector<int>{0};
  }
  // The hidden states entering layer 0.
  void embed(const model::Tensor& tok_embeddings) {
    X.resize(static_cast<size_t>(nsamp * len * dim));
    for (size_t i = 0; i < seqs.size(); ++i)
      model::dequantize_rows(tok_embeddings, seqs[i], seqs[i] + 1, X.data() + i * dim);
  }
  // Runs every sample through `lw` (layer l of `c`); keep_input: the hidden states stay (the
  // statistics only).
  void run(const model::Config& c, int l, const model::LayerWeights& lw, bool keep_input) {
    as_layer(c, l);
    for (int64_t s = 0; s < nsamp; ++s) {
      float* x = X.data() + s * len * dim;
      if (keep_input) {
        tmp.assign(x, x + len * dim);
        x = tmp.data();
      }
      tf->forward_layer(0, lw, x, static_cast<int>(len), 0);
    }
  }
  // The statistics of `lw` on the hidden states into *out (propagated through it unless
  // keep_input). Adds the forward's and the accumulation's seconds to `ph`.
  void observe(const model::Config& c, int l, const model::LayerWeights& lw, model::LayerStats* out,
               const std::array<bool, model::kNumInputs>& xtx_inputs, bool keep_input,
               QuantizeReport::Phases& ph) {
    as_layer(c, l);
    model::LayerAccumulator acc(skel->config, 0, out, xtx_inputs);
    tf->set_observer(&acc);
    tf->set_calib_all_experts(all_experts);
    const auto f0 = std::chrono::steady_clock::now();
    run(c, l, lw, keep_input);
    tf->set_observer(nullptr);
    acc.finish();
    ph.forward += seconds_since(f0) - acc.seconds();
    ph.hessians += acc.seconds();
  }
  void clear() {
    X.clear();
    X.shrink_to_fit();
  }
};

// The sensitivities of every Linear that `opt` quantizes, streamed: the calibration samples go
// through the full-precision layers one at a time (or `so.stats` is read), each layer's
// statistics give its Linears' sensitivities and are freed.
std::vector<LinearSensitivity> streamed_sensitivities(
    const StreamSource& source, const StreamOptions& so, const QuantizeOptions& opt,
    Sensitivity sensitivity, const std::function<void(int64_t, int64_t)>& progress) {
  if (!source.parts) throw std::invalid_argument("streamed_sensitivities: no source");
  const io::ModelParts& src = *source.parts;
  const model::Config& c = src.config();
  QuantizeReport::Phases ph;
  std::optional<StreamedSamples> smp;
  model::CalibStats cs;  // only the current layer's entry is filled
  if (!so.stats) {
    if (so.calib.text.empty())
      throw OptionError("target_bpw",
                        "the sensitivities need calibration: pass --calib TEXT or --stats STATS");
    smp.emplace(source, so, c, opt, true);
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
      smp->observe(c, l, lw, &cs.layers[static_cast<size_t>(l)], {true, true, true, true}, false,
                   ph);
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

}  // namespace

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
  std::optional<StreamedSamples> smp;
  if (calibrate) smp.emplace(source, so, c, opt, opt.gptq || method_needs_calibration(opt.method));
  model::CalibStats cs;  // only the current layer's entry is filled
  cs.layers.resize(static_cast<size_t>(c.n_layers));
  if (smp) {
    cs.nsamples = smp->nsamp;
    cs.seqlen = smp->len;
  }
  cs.seed = so.calib.seed;

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
      smp->observe(c, l, lw, &cs.layers[static_cast<size_t>(l)], xtx_inputs(l), propagate_quantized,
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
        smp->run(c, l, ql, false);
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

namespace scalesweep::pipeline {

void check_quantize_request(const QuantizeRequest& rq) {
  const QuantizeOptions& o = rq.options;
  check_threads(o.threads);  // before anything is read, whatever else the options need
  check_tp(rq.tp);
  // Impossible options fail before anything is loaded (calibration is checked below).
  if (!method_needs_calibration(o.method)) {
    QuantizeOptions no_cal = o;
    no_cal.gptq = false;
    no_cal.w4a4 = false;
    check_quantize_options(no_cal, nullptr, true);
  }
  if (needs_calibration(o) && rq.calib.text.empty() && rq.calib.stats.empty())
    check_quantize_options(o, nullptr, true);  // throws the user-facing message
  if (rq.target_bpw) {
    check_target_bpw(*rq.target_bpw);
    if (rq.calib.text.empty() && rq.calib.stats.empty())
      throw OptionError("target_bpw",
                        "mixed precision measures each Linear's sensitivity on calibration "
                        "data: pass --calib TEXT (sampled with --nsamples/--seqlen/--seed) or "
                        "--stats STATS.safetensors (written by `scalesweep calibrate`)");
    if (sensitivity_is_measured(rq.sensitivity) && rq.calib.text.empty())
      throw OptionError("sensitivity",
                        std::string(kSensitivityNames.name(rq.sensitivity)) +
                            " runs the model on calibration text: pass --calib TEXT");
    if (rq.sensitivity_samples < 1) throw OptionError("sensitivity_samples", "must be >= 1");
  }
  if (!is_gguf_output(rq.out_dir)) {
    if (rq.dense_q8_0)
      throw OptionError("dense_dtype", "q8_0 is for GGUF outputs only (-o OUT.gguf)");
    if (rq.gguf_qwen2_as) throw OptionError("gguf_arch", "is for GGUF outputs only (-o OUT.gguf)");
    return;
  }
  // Options of compressed-tensors checkpoints that a GGUF cannot honour.
  if (o.w4a4)
    throw OptionError("quant",
                      "WA: llama.cpp applies NVFP4 input scales only to the LM head, not to "
                      "decoder Linears; a GGUF output is W4A16 (--quant W)");
  if (rq.partial_blocks != PartialBlocks::kDense)
    throw OptionError("partial_blocks",
                      "quantize: ggml NVFP4 needs rows of whole 64-element super-blocks; a GGUF "
                      "stores other Linears dense");
  if (rq.tp != 1) throw OptionError("tp", "applies to vLLM checkpoints, not to a GGUF output");
  if (rq.max_shard_bytes != QuantizeRequest{}.max_shard_bytes)
    throw OptionError("max_shard_size", "a GGUF output is one file");
}

QuantizeResult quantize_model(const std::string& source, const QuantizeRequest& rq,
                              const QuantizeEvents& ev) {
  check_quantize_request(rq);
  // The calibration file given is readable, before the model is read.
  if (needs_calibration(rq.options) || rq.target_bpw) check_calib_source(rq.calib);
  // Mixture-of-experts models: a Hugging Face directory to a compressed-tensors checkpoint or
  // a GGUF (io::check_gguf_config says which llama.cpp can run).
  if (const auto pc = io::peek_model_config(source); pc && pc->moe()) {
    if (!fs::is_directory(source))
      io::refuse_moe_model(source, "quantize from a file (a Hugging Face directory is needed)");
    if (is_gguf_output(rq.out_dir)) io::check_gguf_config(*pc, source);
    if (rq.target_bpw) io::refuse_moe_model(source, "quantize --target-bpw");
  }
  QuantizeOptions o = rq.options;  // --target-bpw adds its choice to o.dense
  o.expert_min_tokens = rq.calib.expert_min_tokens;
  auto note = [&](const std::string& s) {
    if (ev.note) ev.note(s);
  };
  const bool gguf = is_gguf_output(rq.out_dir);
  auto notes = [&](const model::Config& c, DType dense) {
    if (!gguf) {
      for (const std::string& n : vllm_dense_notes(c, rq.tp, rq.partial_blocks, dense)) note(n);
      if (const std::string v = vllm_mixed_fused_note(c, o.dense); !v.empty()) note(v);
      return;
    }
    io::check_gguf_config(c, source);  // refused before calibration, not at the first write
    const io::GgufQwen2As as = rq.gguf_qwen2_as.value_or(io::GgufQwen2As::kLlama);
    if (c.arch == model::Arch::kQwen2 && as == io::GgufQwen2As::kLlama)
      note(
          "qwen2: stored as llama.cpp's architecture 'llama' (q/k/v biases; q/k rows permuted as "
          "llama's; every Linear NVFP4, since llama.cpp's qwen2 graph ignores the FFN "
          "Linears' .scale); --gguf-arch qwen2 keeps qwen2 with gate/up/down dense");
    const std::array<bool, 7> d = gguf_dense_linears(c, as);
    const std::string dn = rq.dense_q8_0 ? "q8_0" : std::string(kDTypeNames.name(dense));
    for (LinearId id : kAllLinears) {
      if (!d[static_cast<size_t>(id)]) continue;
      const int64_t cols = io::hf_linear_shape(c, id).second;
      const bool f16 = rq.dense_q8_0 && cols % 32 != 0;
      note(std::string(model::linear_name(id)) + ": " + io::gguf_nvfp4_obstacle(c, id, as) +
           "; stored dense (" + (f16 ? "f16: not a multiple of Q8_0's 32 either" : dn) +
           ") in every layer");
    }
    if (rq.dense_q8_0 && c.dim % 32 != 0)
      note("token_embd/output: row length " + std::to_string(c.dim) +
           " is not a multiple of 32; stored f16 instead of q8_0");
  };
  auto quantize_progress = [&](int64_t d, int64_t t) { ev.step("quantize", "linear", d, t); };
  QuantizeResult res;
  const bool hf_dir = fs::is_directory(source);
  res.dense = rq.dense ? *rq.dense : hf_dir ? io::hf_dir_dtype(source) : DType::kF32;
  WriteOptions wo;
  wo.dense = res.dense;
  wo.partial_blocks = rq.partial_blocks;
  wo.tp = rq.tp;
  wo.max_shard_bytes = rq.max_shard_bytes;
  wo.overwrite = rq.overwrite;
  wo.dense_q8_0 = rq.dense_q8_0;
  wo.gguf_qwen2_as = rq.gguf_qwen2_as.value_or(io::GgufQwen2As::kLlama);
  wo.tokenizer_override = !rq.tokenizer.empty();
  const bool calibrate = needs_calibration(o) || rq.target_bpw.has_value();
  const bool gguf_src = !hf_dir && io::GgufFile::sniff(source);
  // --target-bpw: the plan from the sensitivities of the Linears that can be NVFP4; its choice
  // joins o.dense. `sens_of(forced)` measures them.
  std::optional<MixedPlan> plan;
  std::vector<LinearSensitivity> sens;
  auto choose =
      [&](const model::Config& c,
          const std::function<std::vector<LinearSensitivity>(const QuantizeOptions&)>& sens_of) {
        if (!rq.target_bpw) return;
        const QuantizeOptions forced = with_vllm_dense(o, c, wo, rq.out_dir);
        sens = sens_of(forced);
        plan = plan_mixed_precision(c, linear_storage(c, res.dense, gguf, rq.dense_q8_0), sens,
                                    forced.dense, *rq.target_bpw, !gguf);
        o.dense.add(plan->dense);
      };
  // Layers named by --keep-dense exist; a target below the model's least is refused before
  // anything is measured.
  auto check_budget = [&](const model::Config& c) {
    if (o.dense.single_layer_end() > c.n_layers) {
      const auto m = o.dense.members(o.dense.single_layer_end());
      throw OptionError("keep_dense", io::hf_module_name(m.back().first, m.back().second) +
                                          ": the model has " + std::to_string(c.n_layers) +
                                          " layers (0.." + std::to_string(c.n_layers - 1) + ")");
    }
    if (!rq.target_bpw) return;
    plan_mixed_precision(c, linear_storage(c, res.dense, gguf, rq.dense_q8_0), {},
                         with_vllm_dense(o, c, wo, rq.out_dir).dense, *rq.target_bpw, !gguf);
  };
  auto sens_progress = [&](int64_t d, int64_t t) { ev.step("sensitivity", "linear", d, t); };
  // Measured sensitivities run the layers after each Linear, on the whole model `m` with its
  // statistics `cal`, on the first sensitivity_samples calibration sequences.
  const bool measured = rq.target_bpw && sensitivity_is_measured(rq.sensitivity);
  auto measure = [&](const io::LoadedModel& m, const model::CalibStats& cal,
                     const QuantizeOptions& forced) {
    const CalibTokens t = calib_tokens(m.tokenizer.get(), rq.calib.text);
    const int64_t ns = std::min(rq.calib.nsamples, rq.sensitivity_samples);
    const int64_t len = std::min<int64_t>(rq.calib.seqlen, m.weights.config.max_seq_len);
    const std::vector<int> seqs = model::calibration_sequences(t.tokens, ns, len, rq.calib.seed,
                                                               t.bos, m.weights.config.max_seq_len);
    return measured_sensitivities(m.weights, cal, forced, seqs, ns, len, rq.sensitivity,
                                  sens_progress);
  };
  // The calibration statistics of a whole model (calib_stats_for), progress as "calibrate";
  // the seqlen cap's note goes to `cap_note` (empty: already noted).
  auto whole_stats = [&](const io::LoadedModel& m,
                         const std::function<void(const std::string&)>& cap_note) {
    CalibSource c = rq.calib;
    if (c.stats.empty())
      c.seqlen = cap_calib_seqlen(c, m.weights.config.max_seq_len, source, cap_note);
    const int64_t n = c.nsamples;
    return calib_stats_for(
        m, c, [&](int64_t d, int64_t t) { ev.step("calibrate", "seq", d * n / t, n); });
  };
  if ((hf_dir || gguf_src) && rq.stream) {
    // Layer-by-layer streaming (memory bounded by one layer): a HF directory's tensors are
    // read per layer; a GGUF is loaded as stored (its blocks stay in the mapping) and each
    // layer widened when it is reached.
    std::optional<io::HfLazyModel> hf;
    std::optional<io::StoredModelParts> stored;
    std::unique_ptr<model::Tokenizer> tok;
    StreamSource src;
    src.path = source;
    src.hf_dir = hf_dir;
    const auto l0 = std::chrono::steady_clock::now();
    if (hf_dir) {
      src.parts = &hf.emplace(source);
    } else {
      io::LoadedModel m = io::load_model(source, rq.tokenizer);
      tok = std::move(m.tokenizer);
      src.tokenizer = tok.get();
      src.parts =
          &stored.emplace(std::make_shared<const model::Weights>(std::move(m.weights)), source);
    }
    const double load_s = seconds_since(l0);
    StreamOptions so;
    so.calib = rq.calib;
    so.tokenizer = hf_dir ? rq.tokenizer : std::string();  // a GGUF's override is in `tok`
    so.sequential = rq.sequential;
    const model::Config& cfg = src.parts->config();
    if (calibrate && rq.calib.stats.empty())
      so.calib.seqlen = cap_calib_seqlen(rq.calib, cfg.max_seq_len, source, note);
    notes(cfg, res.dense);
    check_budget(cfg);
    model::CalibStats stats;
    if (calibrate && !rq.calib.stats.empty()) {
      stats = io::load_calib_stats(rq.calib.stats);
      try {
        model::check_calib_stats(stats, cfg);
      } catch (const std::exception& e) {
        throw std::runtime_error(rq.calib.stats + ": " + e.what());
      }
      so.stats = &stats;
    }
    const auto s0 = std::chrono::steady_clock::now();
    choose(cfg, [&](const QuantizeOptions& forced) {
      if (!measured) return streamed_sensitivities(src, so, forced, rq.sensitivity, sens_progress);
      // Measured: the whole model for this pass only (then streamed as always).
      const io::LoadedModel whole = io::load_model(source, rq.tokenizer);
      return measure(whole, so.stats ? *so.stats : whole_stats(whole, {}), forced);
    });
    const double sens_s = plan ? seconds_since(s0) : 0.0;
    res.report = write_quantized_checkpoint_streamed(src, so, o, rq.out_dir, wo, quantize_progress);
    res.report.phases.load += load_s;
    res.report.phases.sensitivity = sens_s;
    res.report.seconds += load_s + sens_s;
    res.report.mixed = plan;
    res.report.sensitivities = std::move(sens);
    res.streamed = true;
    return res;
  }
  // Whole-model sources (llama2.c, HF or GGUF without streaming): the load and the calibration
  // come before the writer's clock; they are timed here and added to its report, so that the
  // phases and `seconds` cover the whole job (load; calibration as forward, its Hessian
  // accumulation included).
  const auto l0 = std::chrono::steady_clock::now();
  const io::LoadedModel m = io::load_model(source, rq.tokenizer);
  const double load_s = seconds_since(l0);
  notes(m.weights.config, res.dense);
  check_budget(m.weights.config);
  model::CalibStats calib;
  const model::CalibStats* cal = nullptr;
  double calib_s = 0;
  if (calibrate) {
    const auto c0 = std::chrono::steady_clock::now();
    calib = whole_stats(m, note);
    cal = &calib;
    calib_s = seconds_since(c0);
  }
  const auto s0 = std::chrono::steady_clock::now();
  choose(m.weights.config, [&](const QuantizeOptions& forced) {
    if (measured) return measure(m, *cal, forced);
    std::vector<LinearSensitivity> out;
    const int n = m.weights.config.n_layers;
    sens_progress(0, int64_t{n} * 7);
    for (int l = 0; l < n; ++l) {
      for (const LinearSensitivity& x :
           layer_sensitivities(m.weights, l, *cal, forced, rq.sensitivity))
        out.push_back(x);
      sens_progress(int64_t{l + 1} * 7, int64_t{n} * 7);
    }
    return out;
  });
  const double sens_s = plan ? seconds_since(s0) : 0.0;
  res.report = write_quantized_checkpoint(m, source, cal, o, rq.out_dir, wo, quantize_progress);
  res.report.phases.load += load_s;
  res.report.phases.forward += calib_s;
  res.report.phases.sensitivity = sens_s;
  res.report.seconds += load_s + calib_s + sens_s;
  res.report.mixed = plan;
  res.report.sensitivities = std::move(sens);
  return res;
}

}  // namespace scalesweep::pipeline

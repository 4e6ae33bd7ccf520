// One decoder layer's Linears quantized (pipeline/quantize_model.h: quantize_layer, its
// experts, the options and presets it reads) and placed into a model (quantized_weights).
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
using io::hf_module_name;
using io::kAllLinears;
using io::linear_weight;
using model::LinearId;

namespace {

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
                      why + " needs calibration statistics (Hessians, amax, importance): pass " +
                          option_ref("calib") + " TEXT (sampled with " +
                          option_ref("calib_nsamples") + "/" + option_ref("calib_seqlen") + "/" +
                          option_ref("calib_seed") + ") or " + option_ref("stats") +
                          " STATS.safetensors (written by `scalesweep calibrate`)");
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
  auto in_layer = [&](LinearId id) { return !moe || !model::is_ffn_linear(id); };
  float group_amax[4] = {0, 0, 0, 0};
  for (LinearId id : kAllLinears)
    if (!is_dense(id) && in_layer(id))
      group_amax[static_cast<int>(model::input_of(id))] =
          std::max(group_amax[static_cast<int>(model::input_of(id))],
                   model::tensor_amax(linear_weight(lw, id)));
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
        if (is_dense(id) || static_cast<int>(model::input_of(id)) != g || !in_layer(id)) continue;
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
    cfg.global_scale = group_gs[static_cast<int>(model::input_of(id))];
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

model::Tensor& result_weight(model::LayerWeights& lw, const LinearResult& r) {
  if (r.expert < 0) return linear_weight(lw, r.id);
  return expert_weight(lw.experts.at(static_cast<size_t>(r.expert)), r.id);
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

}  // namespace scalesweep::pipeline

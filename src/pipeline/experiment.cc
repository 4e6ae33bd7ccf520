// The paper's experiment grid and the per-layer error report
// (include/scalesweep/pipeline/experiment.h).
#include "scalesweep/pipeline/experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "scalesweep/base/bytes.h"
#include "scalesweep/base/memory.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "scalesweep/quant/evaluate.h"

namespace scalesweep::pipeline {
using io::kAllLinears;
using io::linear_weight;
namespace {

using model::InputId;
using model::LinearId;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Records Linear inputs and Q/K/V of the FP model.
class Capture : public model::Observer {
 public:
  explicit Capture(int layers)
      : inputs_(static_cast<size_t>(layers)), qkv_(static_cast<size_t>(layers)) {}
  void on_input(int layer, InputId which, const float* x, int rows, int cols) override {
    auto& v = inputs_[static_cast<size_t>(layer)][static_cast<size_t>(which)];
    v.cols = cols;
    v.data.insert(v.data.end(), x, x + static_cast<size_t>(rows) * cols);
  }
  void on_qkv(int layer, const float* q, const float* k, const float* v, int rows) override {
    auto& s = qkv_[static_cast<size_t>(layer)];
    s[0].data.insert(s[0].data.end(), q, q + static_cast<size_t>(rows) * s[0].cols);
    s[1].data.insert(s[1].data.end(), k, k + static_cast<size_t>(rows) * s[1].cols);
    s[2].data.insert(s[2].data.end(), v, v + static_cast<size_t>(rows) * s[2].cols);
  }
  struct Mat {
    int64_t cols = 0;
    std::vector<float> data;
    int64_t rows() const { return cols ? static_cast<int64_t>(data.size()) / cols : 0; }
  };
  std::vector<std::array<Mat, model::kNumInputs>> inputs_;
  std::vector<std::array<Mat, 3>> qkv_;
};

LayerError measure(const std::vector<Method>& methods, const QuantConfig& base, int layer,
                   std::string tensor, std::string kind, const float* x, int64_t rows, int64_t cols,
                   const std::vector<float>& imp, const std::vector<float>& gs_per_method,
                   float gs_opt) {
  LayerError e;
  e.layer = layer;
  e.tensor = std::move(tensor);
  e.kind = std::move(kind);
  e.rows = rows;
  e.cols = cols;
  const Importance im{ImportanceKind::kPerColumn, imp.data()};
  const TensorRef xt = tensor_ref(x, rows, cols);
  auto config = [&](Method m, float gs) {
    QuantConfig cfg = base;  // format and block
    cfg.selector.method = m;
    if (cfg.format == TensorFormat::kNvfp4) cfg.global_scale = gs;  // MXFP4 has none
    return cfg;
  };
  const OptFp32Refs opt = opt_fp32_refs(xt, im, config(Method::kOptFp32, gs_opt), e.tensor);
  e.nmse_opt = opt.nmse();
  e.nwmse_opt = opt.nwmse();
  for (size_t i = 0; i < methods.size(); ++i) {
    const Method m = methods[i];
    // The block-Hessian methods are scored here with diagonal blocks of the report's
    // per-column importance (the report keeps no ΣxxT); the model rows use the full blocks.
    std::vector<double> diag_hess;
    Importance sel = method_is_weighted(m) ? im : Importance{};
    if (method_uses_hessian(m)) {
      diag_hess = diagonal_block_hessians(imp.data(), cols, base.block);
      sel = {ImportanceKind::kBlockHessian, nullptr, diag_hess.data(), base.block};
    }
    const MethodRun r = run_method(xt, sel, config(m, gs_per_method[i]), e.tensor, im);
    const Gaps g = gaps_to_opt(r.err, opt, m, true);
    e.nmse.push_back(r.err.nmse);
    e.nwmse.push_back(r.err.nwmse);
    e.nmse_gap.push_back(g.nmse_pct);
    e.nwmse_gap.push_back(g.nwmse_pct);
  }
  return e;
}

}  // namespace

namespace {

// The quantize options of one row (as `scalesweep quantize` with that selector would use).
QuantizeOptions row_options(const ExperimentOptions& opt, Method mt, bool gptq, int block) {
  QuantizeOptions qo;
  qo.method = mt;
  qo.block = block;
  qo.gptq = gptq;
  qo.damp = opt.damp;
  qo.global_scale_steps = opt.global_scale_steps;
  qo.gptq_scales = opt.gptq_scales;
  qo.gptq_importance = opt.gptq_importance;
  return qo;
}

int resolved_block(const ExperimentOptions& opt) {
  return opt.block > 0 ? opt.block : model::default_block(opt.format);
}

}  // namespace

std::vector<std::pair<bool, Method>> rows_needing_xtx(const ExperimentOptions& opt) {
  std::vector<std::pair<bool, Method>> out;
  if (opt.format == TensorFormat::kMxfp4) return out;
  for (bool gptq : {false, true}) {
    if (gptq ? !opt.gptq : !opt.rtn) continue;
    for (Method mt : opt.methods)
      if (gptq || method_uses_hessian(mt)) out.push_back({gptq, mt});
  }
  return out;
}

model::CalibStats prebuild_rows(const io::LoadedModel& m, const CalibSource& calib,
                                const ExperimentOptions& opt, std::vector<PrebuiltRow>* rows,
                                const std::function<void(int64_t, int64_t)>& progress) {
  const int block = resolved_block(opt);
  const std::vector<std::pair<bool, Method>> need = rows_needing_xtx(opt);
  const model::Weights& w = m.weights;
  // The rows held while calibrating: every quantized Linear packed (4.5 bits a weight).
  int64_t packed = 0;
  for (const model::LayerWeights& L : w.layers)
    for (LinearId id : kAllLinears) {
      const model::Tensor& t = linear_weight(L, id);
      if (t.present()) packed += t.numel() / 2 + t.numel() / 16;
    }
  check_fits("methods", "experiment's GPTQ rows (built while calibrating)",
             packed * static_cast<int64_t>(need.size()),
             std::to_string(need.size()) + " rows of packed NVFP4 Linears, " +
                 format_bytes(packed) + " each",
             "the rows held (fewer methods, or " + option_ref("no_gptq") + ")");
  model::CalibStats one;  // only the current layer's entry is filled
  one.layers.resize(w.layers.size());
  rows->clear();
  std::vector<std::shared_ptr<model::Weights>> built;
  for (const auto& [gptq, mt] : need) {
    check_quantize_options(row_options(opt, mt, gptq, block), &one, false);
    built.push_back(std::make_shared<model::Weights>(w));
    rows->push_back({gptq, mt, nullptr, 0});
  }
  model::CalibStats stats = calib_stats_by_layer(
      m, calib,
      [&](int l, model::LayerStats& L) {
        std::swap(one.layers[static_cast<size_t>(l)], L);
        for (size_t i = 0; i < need.size(); ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          std::vector<LinearResult> rs =
              quantize_layer(w, l, &one, row_options(opt, need[i].second, need[i].first, block));
          place_quantized_layer(*built[i], l, rs, QuantizedForm::kPacked);
          (*rows)[i].seconds +=
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        std::swap(one.layers[static_cast<size_t>(l)], L);
      },
      progress);
  for (size_t i = 0; i < need.size(); ++i) (*rows)[i].weights = std::move(built[i]);
  return stats;
}

namespace {

using ExperimentProgress = std::function<void(const std::string&, const char*, int64_t, int64_t)>;

// The refusals of run_experiment, before any work; returns the block used.
int check_experiment(const io::LoadedModel& m, const model::CalibStats& stats,
                     const ExperimentOptions& opt) {
  if (opt.methods.empty()) throw std::invalid_argument("experiment: no methods");
  for (Method mt : opt.methods)
    if (mt == Method::kOptFp32 || mt == Method::kSweep)
      throw std::invalid_argument("experiment: method " + std::string(kMethodNames.name(mt)) +
                                  " cannot quantize a model (opt-fp32 is the reference)");
  for (const auto& s : opt.settings)
    if (s != "WA" && s != "WAKV" && s != "WAKVQ" && s != "W")
      throw std::invalid_argument("experiment: setting '" + s + "' (expected W, WA, WAKV, WAKVQ)");
  const int block = resolved_block(opt);
  const bool mx = opt.format == TensorFormat::kMxfp4;
  // Format/block/method combinations checked before any work (MXFP4: block 32 only).
  for (Method mt : opt.methods) (void)model::parse_sim_quant("W", mt, block, opt.format);
  if (mx && opt.global_scale_steps > 0)
    throw std::invalid_argument("experiment: MXFP4 has no global scale to search");
  if (mx && opt.gptq)
    throw std::invalid_argument(
        "experiment: GPTQ rows are NVFP4 only (the checkpoint quantizer has no MXFP4 scales); "
        "run MXFP4 with RTN only");
  model::check_calib_stats(stats, m.weights.config);
  if (opt.tasks && !m.tokenizer)
    throw std::invalid_argument("experiment: task columns need the model's tokenizer");
  return block;
}

// What every part of one run_experiment reads: the model, its statistics, the options, the
// block used and the progress callback.
struct Grid {
  const io::LoadedModel& m;
  const model::CalibStats& stats;
  const ExperimentOptions& opt;
  int block;
  const ExperimentProgress& progress;

  void report(const std::string& stage, const char* unit, int64_t d, int64_t t) const {
    if (progress) progress(stage, unit, d, t);
  }
  model::SimQuantSpec spec(const std::string& setting, Method mt) const {
    return model::parse_sim_quant(setting, mt, block, opt.format);
  }
  // Task accuracy of one row's model (its Transformer's weights and run-time quantization).
  TaskScores task_scores(const model::Transformer& proto, const std::string& label) const {
    TaskScores ts;
    if (!opt.tasks) return ts;
    EvalEvents ev;
    ev.progress = [&](const std::string& task, const char* unit, int64_t d, int64_t t) {
      report(label + " " + task, unit, d, t);
    };
    const EvalResult er = evaluate(*opt.tasks, *m.tokenizer, m.weights.config,
                                   eval_transformer_factory(proto), opt.eval, ev);
    ts.results = er.tasks;
    ts.average = task_average(er.tasks);
    return ts;
  }
};

// One row's weights and the seconds spent quantizing them. NVFP4: exactly the checkpoint
// quantizer's weights, packed. MXFP4 (RTN only): the simulated weights
// (model::quantize_weights; fused projections need no shared scale there). Rows built while
// calibrating (prebuild_rows) are taken as they are.
std::pair<std::shared_ptr<const model::Weights>, double> row_weights(
    const Grid& g, bool gptq, Method mt, const std::string& label,
    const std::vector<PrebuiltRow>& prebuilt) {
  const auto pre = std::find_if(prebuilt.begin(), prebuilt.end(), [&](const PrebuiltRow& p) {
    return p.gptq == gptq && p.method == mt;
  });
  if (pre != prebuilt.end()) return {pre->weights, pre->seconds};
  auto weights_progress = [&](int64_t d, int64_t t) {
    g.report(label + " weights", "linear", d, t);
  };
  const auto tw = std::chrono::steady_clock::now();
  std::shared_ptr<const model::Weights> qw;
  if (g.opt.format == TensorFormat::kMxfp4)
    qw = std::make_shared<const model::Weights>(model::quantize_weights(
        g.m.weights, g.spec("W", mt), &g.stats, [&](int d, int t) { weights_progress(d, t); }));
  else
    qw = std::make_shared<const model::Weights>(
        quantized_weights(g.m.weights, &g.stats, row_options(g.opt, mt, gptq, g.block),
                          weights_progress, nullptr, QuantizedForm::kPacked));
  return {qw, std::chrono::duration<double>(std::chrono::steady_clock::now() - tw).count()};
}

// The cells of one row: its weights `qw` under each run-time setting (perplexity, tasks and
// their recovery against res->fp).
void add_row_cells(const Grid& g, const std::string& algo, Method mt,
                   const std::shared_ptr<const model::Weights>& qw, double weight_seconds,
                   const std::vector<int>& eval_tokens, ExperimentResult* res) {
  const std::string label = algo + " " + std::string(kMethodNames.name(mt));
  for (const auto& setting : g.opt.settings) {
    model::SimQuantSpec spec = g.spec(setting, mt);
    spec.weights = false;  // already quantized (RTN or GPTQ)
    model::Transformer tq(qw);
    if (spec.any()) tq.set_runtime_quant(model::make_runtime_quant(g.m.weights, spec, g.stats));
    ExperimentCell c;
    c.setting = setting;
    c.algo = algo;
    c.method = mt;
    c.weight_seconds = weight_seconds;
    c.r = model::perplexity(tq, eval_tokens, g.opt.ppl, [&](int64_t d, int64_t t) {
      g.report(label + " " + setting, "tok", d, t);
    });
    c.recovery = c.r.nll_per_token > 0 ? 100.0 * res->fp.nll_per_token / c.r.nll_per_token : 0;
    c.tasks = g.task_scores(tq, label + " " + setting);
    c.task_recovery =
        res->fp_tasks.average > 0 ? 100.0 * c.tasks.average / res->fp_tasks.average : 0;
    res->cells.push_back(c);
  }
}

// Paper layout: setting, then RTN/GPTQ, then the selectors in the given order.
void sort_cells(const ExperimentOptions& opt, std::vector<ExperimentCell>* cells) {
  auto rank = [&](const ExperimentCell& c) {
    const auto si =
        std::find(opt.settings.begin(), opt.settings.end(), c.setting) - opt.settings.begin();
    const auto mi =
        std::find(opt.methods.begin(), opt.methods.end(), c.method) - opt.methods.begin();
    return std::tuple(si, c.algo == "GPTQ", mi);
  };
  std::stable_sort(
      cells->begin(), cells->end(),
      [&](const ExperimentCell& a, const ExperimentCell& b) { return rank(a) < rank(b); });
}

// The FP model's Linear inputs and Q/K/V over `sample_tokens`, run in windows of the model's
// context (at most 512).
Capture capture_activations(const Grid& g, const std::shared_ptr<const model::Weights>& fp,
                            const std::vector<int>& sample_tokens) {
  const model::Config& cfg = g.m.weights.config;
  Capture cap(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    cap.qkv_[static_cast<size_t>(l)][0].cols = int64_t{cfg.n_heads} * cfg.head_dim;
    cap.qkv_[static_cast<size_t>(l)][1].cols = int64_t{cfg.n_kv_heads} * cfg.head_dim;
    cap.qkv_[static_cast<size_t>(l)][2].cols = int64_t{cfg.n_kv_heads} * cfg.head_dim;
  }
  model::Transformer tf(fp);
  tf.set_observer(&cap);
  const int ctx = std::min(cfg.max_seq_len, 512);
  const int64_t n = static_cast<int64_t>(sample_tokens.size());
  for (int64_t s = 0; s < n; s += ctx) {
    const int len = static_cast<int>(std::min<int64_t>(ctx, n - s));
    tf.forward_hidden(sample_tokens.data() + s, len, 0);
    g.report("activation samples", "tok", s + len, n);
  }
  return cap;
}

// The per-layer error report being built: the format and block, the global scales and
// importance as the runtime uses them per method (`rq`), the WMSE importance (`rq_w`, from
// sweep-wmse) and the opt-fp32 reference's global scales (`rq_opt`, from sweep-mse).
struct ErrorReport {
  const Grid& g;
  ExperimentResult* res;
  QuantConfig base;
  std::vector<std::shared_ptr<model::RuntimeQuant>> rq;
  std::shared_ptr<model::RuntimeQuant> rq_w, rq_opt;
  int64_t done = 0, total = 0;

  ErrorReport(const Grid& grid, ExperimentResult* r) : g(grid), res(r) {
    base.format = g.opt.format;
    base.block = g.block;
    for (Method mt : g.opt.methods)
      rq.push_back(model::make_runtime_quant(g.m.weights, g.spec("WAKVQ", mt), g.stats));
    rq_w = model::make_runtime_quant(g.m.weights, g.spec("WAKVQ", Method::kSweepWmse), g.stats);
    rq_opt = model::make_runtime_quant(g.m.weights, g.spec("WAKVQ", Method::kSweepMse), g.stats);
    total = int64_t{g.m.weights.config.n_layers} * 14;
  }
  // Measures one tensor under every method and reports it.
  void add(int layer, std::string tensor, std::string kind, const float* x, int64_t rows,
           int64_t cols, const std::vector<float>& imp, const std::vector<float>& gs,
           float gs_opt) {
    res->errors.push_back(measure(g.opt.methods, base, layer, std::move(tensor), std::move(kind), x,
                                  rows, cols, imp, gs, gs_opt));
    g.report("layer errors", "tensor", ++done, total);
  }
  void weights(int l);
  void inputs(int l, const Capture& cap);
  void qkv(int l, const Capture& cap);
};

// Weights: fused global scales, importance diag(sum x x^T).
void ErrorReport::weights(int l) {
  const auto& lw = g.m.weights.layers[static_cast<size_t>(l)];
  const auto& ls = g.stats.layers[static_cast<size_t>(l)];
  float gamax[4] = {0, 0, 0, 0};
  auto grp = [](LinearId id) {
    return id == LinearId::kQ || id == LinearId::kK || id == LinearId::kV ? 0
           : id == LinearId::kO                                           ? 1
           : id == LinearId::kDown                                        ? 3
                                                                          : 2;
  };
  for (LinearId id : kAllLinears)
    gamax[grp(id)] = std::max(gamax[grp(id)], model::tensor_amax(linear_weight(lw, id)));
  for (LinearId id : kAllLinears) {
    const model::Tensor& t = linear_weight(lw, id);
    const std::vector<float> wf = model::to_f32(t);  // any storage dtype
    const auto& in = ls.input(model::input_of(id));
    std::vector<float> imp(static_cast<size_t>(t.shape[1]));
    for (int64_t j = 0; j < t.shape[1]; ++j) imp[j] = static_cast<float>(in.diag(j));
    std::vector<float> gs;
    for (Method mt : g.opt.methods)
      gs.push_back(global_scale_for_amax(gamax[grp(id)], default_max_block_scale(mt)));
    add(l, std::string(model::linear_name(id)) + ".weight", "weight", wf.data(), t.shape[0],
        t.shape[1], imp, gs, global_scale_for_amax(gamax[grp(id)], 256.f));
  }
}

// The Linear inputs, at the runtime's input global scales.
void ErrorReport::inputs(int l, const Capture& cap) {
  for (int i = 0; i < model::kNumInputs; ++i) {
    const auto& x = cap.inputs_[static_cast<size_t>(l)][static_cast<size_t>(i)];
    std::vector<float> gs;
    for (const auto& r : rq)
      gs.push_back(r->layers[static_cast<size_t>(l)].input_gs[static_cast<size_t>(i)]);
    add(l, std::string(model::input_name(static_cast<InputId>(i))), "activation", x.data.data(),
        x.rows(), x.cols, rq_w->layers[static_cast<size_t>(l)].input_imp[static_cast<size_t>(i)],
        gs, rq_opt->layers[static_cast<size_t>(l)].input_gs[static_cast<size_t>(i)]);
  }
}

// Q, K and V, at the runtime's attention global scales.
void ErrorReport::qkv(int l, const Capture& cap) {
  const char* names[3] = {"Q", "K", "V"};
  const char* kinds[3] = {"query", "key", "value"};
  for (int s = 0; s < 3; ++s) {
    const auto& x = cap.qkv_[static_cast<size_t>(l)][static_cast<size_t>(s)];
    auto pick_gs = [&](const model::RuntimeQuant& r) {
      const auto& L = r.layers[static_cast<size_t>(l)];
      return s == 0 ? L.q_gs : s == 1 ? L.k_gs : L.v_gs;
    };
    const auto& Lw = rq_w->layers[static_cast<size_t>(l)];
    const std::vector<float>& imp = s == 0 ? Lw.q_imp : s == 1 ? Lw.k_imp : Lw.v_imp;
    std::vector<float> gs;
    for (const auto& r : rq) gs.push_back(pick_gs(*r));
    add(l, names[s], kinds[s], x.data.data(), x.rows(), x.cols, imp, gs, pick_gs(*rq_opt));
  }
}

}  // namespace

ExperimentResult run_experiment(const io::LoadedModel& m, const model::CalibStats& stats,
                                const std::vector<int>& eval_tokens,
                                const std::vector<int>& sample_tokens, const ExperimentOptions& opt,
                                const ExperimentProgress& progress,
                                const std::vector<PrebuiltRow>& prebuilt) {
  const auto t0 = std::chrono::steady_clock::now();
  const Grid g{m, stats, opt, check_experiment(m, stats, opt), progress};
  ExperimentResult res;
  res.methods = opt.methods;
  auto fp = std::make_shared<const model::Weights>(m.weights);
  if (opt.tasks) res.task_names = prepared_task_names(*opt.tasks);
  {
    model::Transformer tf(fp);
    res.fp = model::perplexity(tf, eval_tokens, opt.ppl,
                               [&](int64_t d, int64_t t) { g.report("FP", "tok", d, t); });
    res.fp_tasks = g.task_scores(tf, "FP");
  }
  std::vector<std::pair<std::string, bool>> algos;
  if (opt.rtn) algos.push_back({"RTN", false});
  if (opt.gptq) algos.push_back({"GPTQ", true});
  for (const auto& [algo, gptq] : algos)
    for (Method mt : opt.methods) {
      const auto [qw, weight_seconds] =
          row_weights(g, gptq, mt, algo + " " + std::string(kMethodNames.name(mt)), prebuilt);
      add_row_cells(g, algo, mt, qw, weight_seconds, eval_tokens, &res);
    }
  sort_cells(opt, &res.cells);
  if (opt.errors && !sample_tokens.empty()) {
    const Capture cap = capture_activations(g, fp, sample_tokens);
    res.sample_tokens = static_cast<int64_t>(sample_tokens.size());
    ErrorReport er(g, &res);
    for (int l = 0; l < m.weights.config.n_layers; ++l) {
      er.weights(l);
      er.inputs(l, cap);
      er.qkv(l, cap);
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::string gptq_scales_label(const ExperimentOptions& o) {
  std::string s(gptq::kScaleTimingNames.name(o.gptq_scales));
  if (o.gptq_scales == gptq::ScaleTiming::kDynamic)
    s += ", importance " + std::string(gptq::kDynamicImportanceNames.name(o.gptq_importance));
  return s;
}

std::string experiment_markdown(const ExperimentResult& r) {
  std::ostringstream s;
  const bool tasks = !r.task_names.empty();
  s << "| Setting | Method | Init | PPL | NLL/token | Recovery (%) |";
  if (tasks) {
    for (const std::string& t : r.task_names)
      s << " " << t << " " << task_headline_metric(t) << " |";
    s << " Task avg | Task recovery (%) |";
  }
  s << "\n|---|---|---|---:|---:|---:|";
  for (size_t i = 0; tasks && i < r.task_names.size() + 2; ++i) s << "---:|";
  s << "\n";
  auto task_cols = [&](const TaskScores& ts, double recovery) {
    if (!tasks) return;
    for (const TaskResult& t : ts.results)
      s << " " << fmt("%.2f", 100 * t.metrics.at(task_headline_metric(t.task)).value) << " |";
    s << " " << fmt("%.2f", 100 * ts.average) << " | " << fmt("%.2f", recovery) << " |";
  };
  s << "| FP | - | - | " << fmt("%.4f", r.fp.ppl) << " | " << fmt("%.5f", r.fp.nll_per_token)
    << " | 100.00 |";
  task_cols(r.fp_tasks, 100.0);
  s << "\n";
  for (const auto& c : r.cells) {
    s << "| " << c.setting << " | " << c.algo << " | " << kMethodNames.name(c.method) << " | "
      << fmt("%.4f", c.r.ppl) << " | " << fmt("%.5f", c.r.nll_per_token) << " | "
      << fmt("%.2f", c.recovery) << " |";
    task_cols(c.tasks, c.task_recovery);
    s << "\n";
  }
  if (tasks) {
    s << "\nTask columns: accuracy (%) of each task's headline metric on";
    for (const TaskResult& t : r.fp_tasks.results) s << " " << t.task << " (n = " << t.n << ")";
    s << "; a difference of two rows is inside noise when it is below about twice the stderr of "
         "a single row, sqrt(p(1-p)/n).\n";
  }
  return s.str();
}

std::string task_recovery_svg(const ExperimentResult& r) {
  if (r.task_names.empty() || r.cells.empty()) return "";
  const int W = 900, H = 420, L = 60, B = 90, T = 30;
  double lo = 100, hi = 100;
  for (const auto& c : r.cells)
    lo = std::min(lo, c.task_recovery), hi = std::max(hi, c.task_recovery);
  lo = std::floor(lo / 5) * 5 - 5;
  hi = std::ceil(hi / 5) * 5 + 5;
  const double n = static_cast<double>(r.cells.size());
  const double bw = (W - L - 20) / n;
  auto y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n"
    << "<text x='" << W / 2
    << "' y='18' text-anchor='middle' font-size='14'>Task-average "
       "recovery (%) vs FP</text>\n";
  for (double v = lo; v <= hi + 1e-9; v += 5)
    s << "<line x1='" << L << "' x2='" << W - 20 << "' y1='" << y(v) << "' y2='" << y(v)
      << "' stroke='#ddd'/><text x='" << L - 5 << "' y='" << y(v) + 4 << "' text-anchor='end'>"
      << fmt("%.0f", v) << "</text>\n";
  s << "<line x1='" << L << "' x2='" << W - 20 << "' y1='" << y(100) << "' y2='" << y(100)
    << "' stroke='black' stroke-dasharray='4 3'/>\n";
  const char* colors[] = {"#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"};
  for (size_t i = 0; i < r.cells.size(); ++i) {
    const auto& c = r.cells[i];
    const size_t mi = std::find(r.methods.begin(), r.methods.end(), c.method) - r.methods.begin();
    const double x = L + bw * static_cast<double>(i);
    const double top = std::min(y(c.task_recovery), y(lo)),
                 h = std::fabs(y(lo) - y(c.task_recovery));
    s << "<rect x='" << x + 2 << "' y='" << top << "' width='" << bw - 4 << "' height='" << h
      << "' fill='" << colors[mi % 6] << "' opacity='" << (c.algo == "GPTQ" ? 1.0 : 0.6)
      << "'><title>" << c.setting << " " << c.algo << " " << kMethodNames.name(c.method) << ": "
      << fmt("%.2f", c.task_recovery) << "%</title></rect>\n";
    s << "<text transform='translate(" << x + bw / 2 + 3 << "," << H - B + 8
      << ") rotate(60)' font-size='9'>" << c.setting << " " << c.algo << " "
      << kMethodNames.name(c.method) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

namespace {

// The rest of a header row of the error tables: each method's NMSE column, then each one's
// NWMSE column (titles ending in `suffix`); then the alignment row, `align` for the first
// columns and right-aligned method columns.
void method_columns(std::ostream& s, const std::vector<Method>& methods, const std::string& suffix,
                    const char* align) {
  for (Method m : methods) s << " " << kMethodNames.name(m) << " NMSE" << suffix << " |";
  for (Method m : methods) s << " " << kMethodNames.name(m) << " NWMSE" << suffix << " |";
  s << align;
  for (size_t i = 0; i < 2 * methods.size(); ++i) s << "---:|";
  s << "\n";
}

}  // namespace

std::string layer_errors_markdown(const ExperimentResult& r) {
  std::ostringstream s;
  s << "Gap (%) of each selector's error to the continuous optimum (opt-fp32): NMSE against "
       "the MSE optimum, NWMSE against the importance-weighted optimum. "
    << r.sample_tokens << " activation sample tokens.\n\n";
  s << "| layer | tensor | shape | opt NMSE | opt NWMSE |";
  method_columns(s, r.methods, " gap", "\n|---:|---|---|---:|---:|");
  for (const auto& e : r.errors) {
    s << "| " << e.layer << " | " << e.tensor << " | " << e.rows << "x" << e.cols << " | "
      << fmt("%.3e", e.nmse_opt) << " | " << fmt("%.3e", e.nwmse_opt) << " |";
    for (double g : e.nmse_gap) s << " " << fmt("%.1f", g) << " |";
    for (double g : e.nwmse_gap) s << " " << fmt("%.1f", g) << " |";
    s << "\n";
  }
  // Averages per tensor kind.
  s << "\nMean gap (%) per tensor kind:\n\n| kind | n |";
  method_columns(s, r.methods, "", "\n|---|---:|");
  for (const char* kind : {"weight", "activation", "query", "key", "value"}) {
    std::vector<double> a(r.methods.size(), 0.0), b(r.methods.size(), 0.0);
    int n = 0;
    for (const auto& e : r.errors) {
      if (e.kind != kind) continue;
      ++n;
      for (size_t i = 0; i < r.methods.size(); ++i) {
        a[i] += e.nmse_gap[i];
        b[i] += e.nwmse_gap[i];
      }
    }
    if (!n) continue;
    s << "| " << kind << " | " << n << " |";
    for (double v : a) s << " " << fmt("%.1f", v / n) << " |";
    for (double v : b) s << " " << fmt("%.1f", v / n) << " |";
    s << "\n";
  }
  return s.str();
}

std::string layer_errors_svg(const ExperimentResult& r) {
  const int W = 1100, PH = 300, top = 40, left = 70, right = 180, gap = 70;
  const int H = top + 2 * PH + gap + 60;
  const int pw = W - left - right;
  const char* colors[] = {"#d62728", "#ff7f0e", "#1f77b4", "#2ca02c",
                          "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  const size_t n = r.errors.size();
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  s << "<text x=\"" << left
    << "\" y=\"22\" font-size=\"15\">Per-tensor gap (%) to opt-fp32 "
       "(x: tensors of each layer: 7 weights, 4 Linear inputs, Q, K, V)</text>\n";
  for (int panel = 0; panel < 2; ++panel) {
    const int y0 = top + panel * (PH + gap);
    double ymax = 1;
    for (const auto& e : r.errors)
      for (double g : panel ? e.nwmse_gap : e.nmse_gap)
        if (std::isfinite(g)) ymax = std::max(ymax, g);
    ymax = std::ceil(ymax / 10.0) * 10.0;
    auto X = [&](size_t i) { return left + (n > 1 ? pw * static_cast<double>(i) / (n - 1) : 0.0); };
    auto Y = [&](double v) { return y0 + PH - PH * std::clamp(v, 0.0, ymax) / ymax; };
    s << "<rect x=\"" << left << "\" y=\"" << y0 << "\" width=\"" << pw << "\" height=\"" << PH
      << "\" fill=\"none\" stroke=\"#444\"/>\n";
    s << "<text x=\"" << left + 5 << "\" y=\"" << y0 - 6 << "\" font-size=\"13\">"
      << (panel ? "NWMSE gap (%)" : "NMSE gap (%)") << "</text>\n";
    for (int k = 0; k <= 5; ++k) {
      const double v = ymax * k / 5;
      s << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << Y(v) << "\" y2=\""
        << Y(v) << "\" stroke=\"#ddd\"/>\n<text x=\"" << left - 6 << "\" y=\"" << Y(v) + 4
        << "\" text-anchor=\"end\">" << fmt("%.0f", v) << "</text>\n";
    }
    for (size_t i = 0; i < n; ++i)
      if (i == 0 || r.errors[i].layer != r.errors[i - 1].layer) {
        s << "<line x1=\"" << X(i) << "\" x2=\"" << X(i) << "\" y1=\"" << y0 << "\" y2=\""
          << y0 + PH << "\" stroke=\"#bbb\" stroke-dasharray=\"4,3\"/>\n<text x=\"" << X(i) + 3
          << "\" y=\"" << y0 + PH + 14 << "\">L" << r.errors[i].layer << "</text>\n";
      }
    for (size_t mi = 0; mi < r.methods.size(); ++mi) {
      const char* col = colors[mi % 8];
      s << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"1.5\" points=\"";
      for (size_t i = 0; i < n; ++i) {
        const double g = (panel ? r.errors[i].nwmse_gap : r.errors[i].nmse_gap)[mi];
        s << X(i) << "," << Y(std::isfinite(g) ? g : ymax) << " ";
      }
      s << "\"/>\n";
      for (size_t i = 0; i < n; ++i) {
        const double g = (panel ? r.errors[i].nwmse_gap : r.errors[i].nmse_gap)[mi];
        s << "<circle cx=\"" << X(i) << "\" cy=\"" << Y(std::isfinite(g) ? g : ymax)
          << "\" r=\"2.5\" fill=\"" << col << "\"><title>layer " << r.errors[i].layer << " "
          << r.errors[i].tensor << " " << kMethodNames.name(r.methods[mi]) << ": " << fmt("%.2f", g)
          << "%</title></circle>\n";
      }
      if (panel == 0)
        s << "<rect x=\"" << left + pw + 15 << "\" y=\"" << top + 10 + 20 * mi
          << "\" width=\"14\" height=\"4\" fill=\"" << col << "\"/><text x=\"" << left + pw + 35
          << "\" y=\"" << top + 16 + 20 * mi << "\">" << kMethodNames.name(r.methods[mi])
          << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace scalesweep::pipeline

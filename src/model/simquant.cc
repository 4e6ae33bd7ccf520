// Simulated NVFP4 / MXFP4 in the forward pass (include/scalesweep/model/simquant.h).
#include "scalesweep/model/simquant.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/base/option_error.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::model {

std::string SimQuantSpec::name() const {
  if (!any()) return "FP";
  std::string s;
  if (weights) s += "W";
  if (acts) s += "A";
  if (kv) s += "KV";
  if (query) s += "Q";
  return s;
}

int default_block(TensorFormat f) { return f == TensorFormat::kMxfp4 ? 32 : 16; }

SimQuantSpec parse_sim_quant(std::string_view setting, Method method, int block,
                             TensorFormat format) {
  const QuantSetting q = kQuantSettingNames.parse(setting);
  SimQuantSpec s;
  s.weights = q != QuantSetting::kNone;
  s.acts = q == QuantSetting::kWA || q == QuantSetting::kWAKV || q == QuantSetting::kWAKVQ;
  s.kv = q == QuantSetting::kWAKV || q == QuantSetting::kWAKVQ;
  s.query = q == QuantSetting::kWAKVQ;
  if (block == 0) block = default_block(format);
  check_block(format, block);
  if (method == Method::kSweep)
    throw std::invalid_argument(
        "method 'sweep' needs an explicit offset window, which simulated quantization does not "
        "take; use sweep-mse or sweep-wmse (their default windows)");
  s.cfg.format = format;
  s.cfg.block = block;
  s.cfg.selector.method = method;
  return s;
}

namespace {

// C in S = amax/(6C) (NVFP4 only; MXFP4 has no global scale).
float max_block_scale(const SimQuantSpec& spec) {
  return spec.cfg.max_block_scale.value_or(default_max_block_scale(spec.cfg.selector.method));
}

float amax_of(const Tensor& t) {
  float a = 0;
  std::vector<float> row(static_cast<size_t>(t.cols()));
  for (int64_t r = 0; r < t.rows(); ++r) {  // a row at a time: any storage dtype
    dequantize_rows(t, r, r + 1, row.data());
    for (float v : row) a = std::max(a, std::fabs(v));
  }
  return a;
}

// Σ_o W[o, j]² per input column j, summed over the given matrices.
std::vector<float> col_sqnorms(std::initializer_list<const Tensor*> ws) {
  std::vector<double> acc;
  for (const Tensor* w : ws) {
    const int64_t out = w->shape[0], in = w->shape[1];
    acc.resize(static_cast<size_t>(in), 0.0);
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t o = 0; o < out; ++o) {
      dequantize_rows(*w, o, o + 1, row.data());
      for (int64_t j = 0; j < in; ++j) {
        const double v = row[j];
        acc[j] += v * v;
      }
    }
  }
  return std::vector<float>(acc.begin(), acc.end());
}

// The diagonal [block, block] blocks of sum over the matrices of W^T W (quant's kBlockHessian
// layout): the Hessian of the squared output error of Linears reading the same input.
std::vector<double> col_block_gram(std::initializer_list<const Tensor*> ws, int block) {
  std::vector<double> acc;
  for (const Tensor* w : ws) {
    const int64_t out = w->shape[0], in = w->shape[1], nb = (in + block - 1) / block;
    acc.resize(static_cast<size_t>(nb * block * block), 0.0);
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t o = 0; o < out; ++o) {
      dequantize_rows(*w, o, o + 1, row.data());
      for (int64_t c0 = 0; c0 < in; c0 += block) {
        const int n = static_cast<int>(std::min<int64_t>(block, in - c0));
        double* g = acc.data() + (c0 / block) * block * block;
        for (int i = 0; i < n; ++i) {
          const double vi = row[c0 + i];
          for (int j = 0; j < n; ++j) g[i * block + j] += vi * static_cast<double>(row[c0 + j]);
        }
      }
    }
  }
  return acc;
}

// NVFP4 with 16-element blocks and a packed form (every method but opt-fp32): the simulated
// weights can stay packed as model::WeightDType::kNvfp4.
bool packed_nvfp4(const QuantConfig& cfg) {
  return cfg.format == TensorFormat::kNvfp4 && cfg.block == 16 &&
         cfg.selector.method != Method::kOptFp32;
}

}  // namespace

Weights quantize_weights(const Weights& w, const SimQuantSpec& spec, const CalibStats* stats,
                         const std::function<void(int, int)>& progress) {
  const Config& c = w.config;
  const bool weighted = method_is_weighted(spec.cfg.selector.method);
  const bool hessian = method_uses_hessian(spec.cfg.selector.method);
  if ((weighted || hessian) && !stats)
    throw std::invalid_argument(std::string("method ") +
                                std::string(kMethodNames.name(spec.cfg.selector.method)) +
                                " weighs weights by calibration statistics: none given");
  if (stats) check_calib_stats(*stats, c);
  Weights out = w;  // shares the storage; quantized tensors get new storage
  const float C = max_block_scale(spec);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& lw = out.layers[l];
    const LayerWeights& src = w.layers[l];
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    struct Group {
      InputId input;
      std::vector<std::pair<Tensor LayerWeights::*, const char*>> members;
    };
    const Group groups[] = {
        {InputId::kAttnIn,
         {{&LayerWeights::wq, "self_attn.q_proj"},
          {&LayerWeights::wk, "self_attn.k_proj"},
          {&LayerWeights::wv, "self_attn.v_proj"}}},
        {InputId::kAttnOut, {{&LayerWeights::wo, "self_attn.o_proj"}}},
        {InputId::kMlpIn,
         {{&LayerWeights::w1, "mlp.gate_proj"}, {&LayerWeights::w3, "mlp.up_proj"}}},
        {InputId::kMlpOut, {{&LayerWeights::w2, "mlp.down_proj"}}},
    };
    for (const Group& g : groups) {
      float amax = 0;
      for (auto& [m, nm] : g.members) amax = std::max(amax, amax_of(src.*m));
      QuantConfig cfg = spec.cfg;
      if (cfg.format == TensorFormat::kNvfp4) cfg.global_scale = global_scale_for_amax(amax, C);
      std::vector<float> imp;
      std::vector<double> hb;
      Importance im;
      if (hessian) {
        const InputStats& is = stats->layers[l].input(g.input);
        if (!is.has_xtx())
          throw std::invalid_argument(
              "method " + std::string(kMethodNames.name(spec.cfg.selector.method)) +
              " needs ΣxxT of every input; the calibration statistics of layer " +
              std::to_string(l) + " have only its diagonal");
        hb = block_hessians(is.xtx.data(), is.dim, cfg.block);
        im = {ImportanceKind::kBlockHessian, nullptr, hb.data(), cfg.block};
      } else if (weighted) {
        const InputStats& is = stats->layers[l].input(g.input);
        imp.resize(static_cast<size_t>(is.dim));
        for (int64_t j = 0; j < is.dim; ++j) imp[j] = static_cast<float>(is.diag(j));
        im.kind = ImportanceKind::kPerColumn;
        im.data = imp.data();
      }
      for (auto& [m, nm] : g.members) {
        const Tensor& t = src.*m;
        const std::vector<float> wf = to_f32(t);  // fp32 of this Linear (any storage dtype)
        const std::string name = prefix + nm + ".weight";
        if (packed_nvfp4(cfg)) {
          // Kept packed (codes + E4M3 scales + gs, 4.5 bits a weight): the runtime decodes
          // fl(fl(fp4 * s) / gs), the values fake_quantize gives when dequantize's clamp never
          // applies, i.e. when 6 * 448 / gs is finite (checked below; else fp32).
          auto q = std::make_shared<QuantizedTensor>(
              quantize(wf.data(), t.shape[0], t.shape[1], im, cfg, name));
          if (std::isfinite(6.0f * 448.0f / q->global_scale)) {
            Tensor& d = lw.*m;
            d = Tensor{};
            d.shape = t.shape;
            d.dtype = WeightDType::kNvfp4;
            d.raw = q->codes.data();
            d.nvfp4_scales = q->scales.data();
            d.nvfp4_global_scale = q->global_scale;
            out.storage.push_back(std::move(q));
            continue;
          }
        }
        std::vector<float> q = fake_quantize(wf.data(), t.shape[0], t.shape[1], im, cfg, name);
        float* dst = out.alloc(lw.*m, t.shape);
        std::copy(q.begin(), q.end(), dst);
      }
    }
    if (progress) progress(l + 1, c.n_layers);
  }
  return out;
}

std::shared_ptr<RuntimeQuant> make_runtime_quant(const Weights& fp, const SimQuantSpec& spec,
                                                 const CalibStats& stats) {
  const Config& c = fp.config;
  check_calib_stats(stats, c);
  auto rq = std::make_shared<RuntimeQuant>();
  rq->acts = spec.acts;
  rq->kv = spec.kv;
  rq->query = spec.query;
  rq->cfg = spec.cfg;
  const float C = max_block_scale(spec);
  const bool nv = spec.cfg.format == TensorFormat::kNvfp4;
  auto gs = [&](float amax) { return nv ? global_scale_for_amax(amax, C) : 1.0f; };
  const bool hessian = method_uses_hessian(spec.cfg.selector.method);
  const bool weighted = method_is_weighted(spec.cfg.selector.method) || hessian;
  const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  rq->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerStats& S = stats.layers[l];
    const LayerWeights& lw = fp.layers[l];
    RuntimeQuant::Layer& R = rq->layers[l];
    for (int i = 0; i < kNumInputs; ++i) R.input_gs[i] = gs(S.inputs[i].amax);
    R.q_gs = gs(S.q_amax);
    R.k_gs = gs(S.k_amax);
    R.v_gs = gs(S.v_amax);
    if (!weighted) continue;
    R.input_imp[0] = col_sqnorms({&lw.wq, &lw.wk, &lw.wv});
    R.input_imp[1] = col_sqnorms({&lw.wo});
    R.input_imp[2] = col_sqnorms({&lw.w1, &lw.w3});
    R.input_imp[3] = col_sqnorms({&lw.w2});
    if (hessian) {
      const int B = spec.cfg.block;
      R.input_hess[0] = col_block_gram({&lw.wq, &lw.wk, &lw.wv}, B);
      R.input_hess[1] = col_block_gram({&lw.wo}, B);
      R.input_hess[2] = col_block_gram({&lw.w1, &lw.w3}, B);
      R.input_hess[3] = col_block_gram({&lw.w2}, B);
    }
    const std::vector<float> wo_cols = R.input_imp[1];  // [n_heads*hd]
    R.q_imp.assign(static_cast<size_t>(c.n_heads) * hd, 0.0f);
    R.k_imp.assign(static_cast<size_t>(c.n_kv_heads) * hd, 0.0f);
    R.v_imp.assign(static_cast<size_t>(c.n_kv_heads) * hd, 0.0f);
    std::vector<double> kacc(R.k_imp.size(), 0.0), vacc(R.v_imp.size(), 0.0);
    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / group;
      for (int d = 0; d < hd; ++d) {
        const size_t qi = static_cast<size_t>(h) * hd + d, ki = static_cast<size_t>(kvh) * hd + d;
        R.q_imp[qi] = static_cast<float>(S.k_sqnorm[ki]);  // Q from K's channel norms
        kacc[ki] += S.q_sqnorm[qi];                        // K from Q's
        vacc[ki] += wo_cols[qi];                           // V from W_O's input channels
      }
    }
    for (size_t i = 0; i < kacc.size(); ++i) {
      R.k_imp[i] = static_cast<float>(kacc[i]);
      R.v_imp[i] = static_cast<float>(vacc[i]);
    }
  }
  return rq;
}

std::unique_ptr<Transformer> make_sim_quant_transformer(std::shared_ptr<const Weights> fp,
                                                        const SimQuantSpec& spec,
                                                        const CalibStats* stats, int max_ctx) {
  if (spec.needs_stats() && !stats)
    throw std::invalid_argument("quantization setting " + spec.name() + " with method " +
                                std::string(kMethodNames.name(spec.cfg.selector.method)) +
                                " needs calibration statistics (" + option_ref("stats") +
                                " FILE or " + option_ref("calib") + " TEXT)");
  std::shared_ptr<const Weights> run = fp;
  if (spec.weights) run = std::make_shared<Weights>(quantize_weights(*fp, spec, stats));
  auto tf = std::make_unique<Transformer>(run, max_ctx);
  if (spec.acts || spec.kv || spec.query)
    tf->set_runtime_quant(make_runtime_quant(*fp, spec, *stats));
  return tf;
}

}  // namespace scalesweep::model

// What quantizing each Linear costs, measured (pipeline/quantize_model.h:
// layer_sensitivities, measured_sensitivities): the inputs of --target-bpw.
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
using io::linear_weight;

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

}  // namespace scalesweep::pipeline

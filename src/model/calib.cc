// Calibration statistics (include/scalesweep/model/calib.h).
#include "scalesweep/model/calib.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include "scalesweep/base/clock.h"
#include "scalesweep/base/memory.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::model {

InputId input_of(LinearId l) {
  switch (l) {
    case LinearId::kQ:
    case LinearId::kK:
    case LinearId::kV:
      return InputId::kAttnIn;
    case LinearId::kO:
      return InputId::kAttnOut;
    case LinearId::kGate:
    case LinearId::kUp:
      return InputId::kMlpIn;
    case LinearId::kDown:
      return InputId::kMlpOut;
  }
  return InputId::kAttnIn;
}

std::string_view linear_name(LinearId l) { return kLinearIdNames.name(l); }

std::string_view input_name(InputId i) {
  switch (i) {
    case InputId::kAttnIn:
      return "attn_in";
    case InputId::kAttnOut:
      return "attn_out";
    case InputId::kMlpIn:
      return "mlp_in";
    case InputId::kMlpOut:
      return "mlp_out";
  }
  return "?";
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t input_dim(const Config& c, InputId i) {
  switch (i) {
    case InputId::kAttnIn:
    case InputId::kMlpIn:
      return c.dim;
    case InputId::kAttnOut:
      return static_cast<int64_t>(c.n_heads) * c.head_dim;
    case InputId::kMlpOut:
      return c.hidden_dim;
  }
  return 0;
}

int64_t input_dim(const Config& c, InputId i, int layer) {
  if (i == InputId::kMlpOut && c.moe_layer(layer)) return 0;
  return input_dim(c, i);
}

LayerAccumulator::LayerAccumulator(const Config& c, int layer, LayerStats* out,
                                   const std::array<bool, kNumInputs>& xtx_inputs)
    : s_(out), layer_(layer) {
  *s_ = {};
  const auto shape = [&](InputStats& in, int64_t dim, InputId i) {
    in.dim = dim;
    if (xtx_inputs[static_cast<size_t>(i)])
      in.xtx.assign(static_cast<size_t>(in.dim * in.dim), 0.0);
    in.xdiag.assign(static_cast<size_t>(in.dim), 0.0);
  };
  for (int i = 0; i < kNumInputs; ++i) {
    const auto id = static_cast<InputId>(i);
    shape(s_->inputs[static_cast<size_t>(i)], input_dim(c, id, layer), id);
  }
  if (c.moe_layer(layer)) {
    s_->experts.resize(static_cast<size_t>(c.n_experts));
    for (ExpertStats& e : s_->experts) {
      shape(e.in, c.dim, InputId::kMlpIn);
      shape(e.mid, c.moe_hidden_dim, InputId::kMlpOut);
    }
  }
  s_->q_sqnorm.assign(static_cast<size_t>(c.n_heads) * c.head_dim, 0.0);
  s_->k_sqnorm.assign(static_cast<size_t>(c.n_kv_heads) * c.head_dim, 0.0);
  s_->v_sqnorm.assign(static_cast<size_t>(c.n_kv_heads) * c.head_dim, 0.0);
}

namespace {

// A NaN or Inf activation would poison the statistics silently (std::max skips NaN, so amax
// stays finite while xtx turns NaN): refuse it, naming the layer, the input and the element.
[[noreturn]] void non_finite_activation(int layer, std::string_view what, const float* x,
                                        int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (std::isfinite(x[i])) continue;
    throw std::invalid_argument(
        "calibrate: layer " + std::to_string(layer) + " " + std::string(what) + ": activation [" +
        std::to_string(i / cols) + ", " + std::to_string(i % cols) + "] (token, channel) is " +
        (std::isnan(x[i]) ? "NaN" : "infinite") +
        "; the forward pass overflowed float32 (weights or inputs out of range)");
  }
  throw std::logic_error("non_finite_activation: no non-finite element");
}

}  // namespace

void LayerAccumulator::accumulate(const std::string& what, InputStats& s, const float* x, int rows,
                                  int cols) {
  if (cols != s.dim)
    throw std::invalid_argument("calibrate: " + what + " has " + std::to_string(cols) +
                                " columns, expected " + std::to_string(s.dim));
  float amax = s.amax;
  const size_t n = static_cast<size_t>(rows) * cols;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) finite &= std::isfinite(x[i]);
  if (!finite) non_finite_activation(layer_, what, x, rows, cols);
  if (!s.xtx.empty()) {
    xd_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      xd_[i] = x[i];
      amax = std::max(amax, std::fabs(x[i]));
    }
    // Upper triangle of xtx += Xᵀ X (mirrored in finish()).
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, cols, rows, 1.0, xd_.data(), cols, 1.0,
                s.xtx.data(), cols);
  } else {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) {
        const float v = x[static_cast<size_t>(r) * cols + j];
        s.xdiag[static_cast<size_t>(j)] += static_cast<double>(v) * v;
        amax = std::max(amax, std::fabs(v));
      }
  }
  s.amax = amax;
  s.tokens += rows;
}

void LayerAccumulator::on_input(int /*layer*/, InputId which, const float* x, int rows, int cols) {
  const auto t0 = std::chrono::steady_clock::now();
  accumulate("input " + std::string(input_name(which)), s_->input(which), x, rows, cols);
  seconds_ += seconds_since(t0);
}

void LayerAccumulator::on_expert_input(int /*layer*/, int expert, InputId which, const float* x,
                                       int rows, int cols) {
  const auto t0 = std::chrono::steady_clock::now();
  if (expert < 0 || static_cast<size_t>(expert) >= s_->experts.size())
    throw std::logic_error("calibrate: layer " + std::to_string(layer_) + " expert " +
                           std::to_string(expert) + " outside the " +
                           std::to_string(s_->experts.size()) + " experts accumulated");
  ExpertStats& e = s_->experts[static_cast<size_t>(expert)];
  accumulate("expert " + std::to_string(expert) + " input " + std::string(input_name(which)),
             which == InputId::kMlpOut ? e.mid : e.in, x, rows, cols);
  seconds_ += seconds_since(t0);
}

void LayerAccumulator::on_routes(int layer, const int* chosen, int rows, int k) {
  const size_t E = s_->experts.size();
  for (size_t i = 0; i < static_cast<size_t>(rows) * k; ++i) {
    if (chosen[i] < 0 || static_cast<size_t>(chosen[i]) >= E)
      throw std::logic_error("calibrate: layer " + std::to_string(layer) + " routes to expert " +
                             std::to_string(chosen[i]) + " of " + std::to_string(E));
    ++s_->experts[static_cast<size_t>(chosen[i])].routed;
  }
}

void LayerAccumulator::on_qkv(int /*layer*/, const float* q, const float* k, const float* v,
                              int rows) {
  const auto t0 = std::chrono::steady_clock::now();
  LayerStats& L = *s_;
  auto acc = [&](const float* m, std::vector<double>& sq, float& amax) {
    const size_t w = sq.size();
    bool finite = true;
    for (size_t i = 0; i < static_cast<size_t>(rows) * w; ++i) finite &= std::isfinite(m[i]);
    if (!finite) {
      const char* what = m == q ? "q" : m == k ? "k" : "v";
      non_finite_activation(layer_, what, m, rows, static_cast<int64_t>(w));
    }
    for (int r = 0; r < rows; ++r)
      for (size_t j = 0; j < w; ++j) {
        const float val = m[r * w + j];
        sq[j] += static_cast<double>(val) * val;
        amax = std::max(amax, std::fabs(val));
      }
  };
  acc(q, L.q_sqnorm, L.q_amax);
  acc(k, L.k_sqnorm, L.k_amax);
  acc(v, L.v_sqnorm, L.v_amax);
  seconds_ += seconds_since(t0);
}

void LayerAccumulator::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto mirror = [](InputStats& in) {
    if (in.xtx.empty()) return;  // its diagonal was accumulated directly
    for (int64_t a = 0; a < in.dim; ++a) {
      for (int64_t b = 0; b < a; ++b) in.xtx[a * in.dim + b] = in.xtx[b * in.dim + a];
      in.xdiag[static_cast<size_t>(a)] = in.xtx[a * in.dim + a];
    }
  };
  for (auto& in : s_->inputs) mirror(in);
  for (ExpertStats& e : s_->experts) {
    mirror(e.in);
    mirror(e.mid);
  }
  seconds_ += seconds_since(t0);
}

namespace {

// Routes each layer's hooks to that layer's LayerAccumulator (the whole-model reference).
class ModelAccumulator : public Observer {
 public:
  ModelAccumulator(const Config& c, CalibStats* out, bool need_xtx) {
    out->layers.resize(static_cast<size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l)
      accs_.emplace_back(c, l, &out->layers[static_cast<size_t>(l)], need_xtx);
  }
  void on_input(int layer, InputId which, const float* x, int rows, int cols) override {
    accs_.at(static_cast<size_t>(layer)).on_input(layer, which, x, rows, cols);
  }
  void on_qkv(int layer, const float* q, const float* k, const float* v, int rows) override {
    accs_.at(static_cast<size_t>(layer)).on_qkv(layer, q, k, v, rows);
  }
  void on_expert_input(int layer, int expert, InputId which, const float* x, int rows,
                       int cols) override {
    accs_.at(static_cast<size_t>(layer)).on_expert_input(layer, expert, which, x, rows, cols);
  }
  void on_routes(int layer, const int* chosen, int rows, int k) override {
    accs_.at(static_cast<size_t>(layer)).on_routes(layer, chosen, rows, k);
  }
  void finish() {
    for (auto& a : accs_) a.finish();
  }

 private:
  std::vector<LayerAccumulator> accs_;
};

}  // namespace

std::string calib_draw_label(CalibDraw d) {
  return d.windows == CalibWindows::kSpread ? "spread windows" : "seed " + std::to_string(d.seed);
}

std::vector<int> calibration_sequences(const std::vector<int>& tokens, int64_t nsamples,
                                       int64_t seqlen, CalibDraw draw, int bos_token,
                                       int max_seq_len) {
  if (nsamples <= 0) throw std::invalid_argument("calibrate: nsamples must be positive");
  if (seqlen < 2) throw std::invalid_argument("calibrate: seqlen must be at least 2");
  if (seqlen > max_seq_len)
    throw std::invalid_argument("calibrate: seqlen " + std::to_string(seqlen) +
                                " exceeds the model's max_seq_len " + std::to_string(max_seq_len));
  const bool with_bos = bos_token >= 0;
  const int64_t body = with_bos ? seqlen - 1 : seqlen;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < body)
    throw std::invalid_argument("calibrate: the text has " + std::to_string(n) +
                                " tokens, fewer than " +
                                (with_bos ? "seqlen - 1 = " : "seqlen = ") + std::to_string(body));
  const bool spread = draw.windows == CalibWindows::kSpread;
  if (spread && n < body + nsamples - 1)
    throw std::invalid_argument("calibrate: the text has " + std::to_string(n) +
                                " tokens, fewer than the " + std::to_string(body + nsamples - 1) +
                                " that " + std::to_string(nsamples) + " spread windows of " +
                                std::to_string(body) + " text tokens need (distinct starts)");
  const int64_t step = std::max<int64_t>(1, (n - body) / std::max<int64_t>(1, nsamples - 1));
  uint64_t state = draw.seed;
  const uint64_t starts = static_cast<uint64_t>(n - body + 1);
  std::vector<int> out(static_cast<size_t>(nsamples * seqlen));
  for (int64_t s = 0; s < nsamples; ++s) {
    const int64_t start = spread ? s * step : static_cast<int64_t>(splitmix64(state) % starts);
    int* seq = out.data() + s * seqlen;
    if (with_bos) seq[0] = bos_token;
    std::copy(tokens.begin() + start, tokens.begin() + start + body, seq + (with_bos ? 1 : 0));
  }
  return out;
}

void check_calibration_memory(const Config& c, int64_t nsamples, int64_t seqlen, bool need_xtx,
                              bool layer_by_layer, int layers_held, int64_t extra) {
  int64_t stats = 0;  // one layer's (the largest), bytes
  const auto record = [&](int64_t d) { return 8 * 2 * d + (need_xtx ? 8 * d * d : 0); };
  for (const InputId i : {InputId::kAttnIn, InputId::kAttnOut, InputId::kMlpIn, InputId::kMlpOut})
    stats += record(input_dim(c, i));  // amax/diagonal, ΣxxT
  if (c.moe())  // a MoE layer: the dense records but mlp_out, and every expert's two
    stats = std::max(stats, stats - record(input_dim(c, InputId::kMlpOut)) +
                                c.n_experts * (record(c.dim) + record(c.moe_hidden_dim)));
  const int64_t hidden = (layer_by_layer ? nsamples : 1) * seqlen * c.dim * 4;
  Config one = c;
  if (layer_by_layer) one.n_layers = 1;
  const int64_t run = runtime_working_bytes(one, seqlen, seqlen);
  const int64_t held = stats * layers_held;
  check_fits(
      "calib_nsamples",
      "calibration on " + std::to_string(nsamples) + " x " + std::to_string(seqlen) + " tokens",
      hidden + held + run + extra,
      "hidden states " + format_bytes(hidden) + ", statistics of " + std::to_string(layers_held) +
          (layers_held == 1 ? " layer " : " layers ") + format_bytes(held) + ", runtime " +
          format_bytes(run) +
          (extra > 0 ? ", the layer being quantized " + format_bytes(extra) : ""),
      "the hidden states");
}

CalibStats calibrate(const Weights& w, const std::vector<int>& tokens, int64_t nsamples,
                     int64_t seqlen, CalibDraw draw, int bos_token,
                     const std::function<void(int64_t, int64_t)>& progress, bool need_xtx,
                     bool all_experts) {
  const Config& c = w.config;
  const std::vector<int> seqs =
      calibration_sequences(tokens, nsamples, seqlen, draw, bos_token, c.max_seq_len);
  check_calibration_memory(c, nsamples, seqlen, need_xtx, false, c.n_layers);
  // A non-owning view of w for the runtime.
  std::shared_ptr<const Weights> view(&w, [](const Weights*) {});
  Transformer tf(view, static_cast<int>(seqlen));
  CalibStats out;
  ModelAccumulator acc(c, &out, need_xtx);
  tf.set_observer(&acc);
  tf.set_calib_all_experts(all_experts);
  if (progress) progress(0, nsamples);  // the stage starts: its clock too
  for (int64_t s = 0; s < nsamples; ++s) {
    tf.forward_hidden(seqs.data() + s * seqlen, static_cast<int>(seqlen), 0);
    if (progress) progress(s + 1, nsamples);
  }
  acc.finish();
  out.nsamples = nsamples;
  out.seqlen = seqlen;
  out.draw = draw;
  return out;
}

LayerStepper::LayerStepper(const Config& c, std::vector<int> seqs, int64_t nsamples, int64_t len,
                           bool all_experts)
    : c_(c), seqs_(std::move(seqs)), nsamples_(nsamples), len_(len), dim_(c.dim) {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (seqs_[i] < 0 || seqs_[i] >= c.vocab_size)
      throw std::out_of_range("token id " + std::to_string(seqs_[i]) + " at index " +
                              std::to_string(i % static_cast<size_t>(len)) +
                              " outside the vocabulary of " + std::to_string(c.vocab_size));
  skel_ = std::make_shared<Weights>();
  skel_->config = c;
  skel_->config.n_layers = 1;
  skel_->layers.resize(1);
  tf_ = std::make_unique<Transformer>(skel_, static_cast<int>(len));
  tf_->set_calib_all_experts(all_experts);
}

LayerStepper::~LayerStepper() = default;

// The one-layer runtime's layer 0 is a MoE layer exactly when layer l of the model is (the
// runtime reads its config at each forward; its buffers are sized for both).
void LayerStepper::as_layer(int l) {
  if (!c_.moe()) return;
  skel_->config.moe_sparse_step = 1;
  skel_->config.dense_layers = c_.moe_layer(l) ? std::vector<int>{} : std::vector<int>{0};
}

void LayerStepper::embed(const Tensor& tok_embeddings) {
  x_.resize(static_cast<size_t>(nsamples_ * len_ * dim_));
  for (size_t i = 0; i < seqs_.size(); ++i)
    dequantize_rows(tok_embeddings, seqs_[i], seqs_[i] + 1, x_.data() + i * dim_);
}

void LayerStepper::run(int l, const LayerWeights& lw, bool keep_input,
                       const std::function<void(int64_t)>& done) {
  as_layer(l);
  for (int64_t s = 0; s < nsamples_; ++s) {
    float* x = x_.data() + s * len_ * dim_;
    if (keep_input) {
      tmp_.assign(x, x + len_ * dim_);
      x = tmp_.data();
    }
    tf_->forward_layer(0, lw, x, static_cast<int>(len_), 0);
    if (done) done(s);
  }
}

double LayerStepper::observe(int l, const LayerWeights& lw, LayerStats* out,
                             const std::array<bool, kNumInputs>& xtx_inputs, bool keep_input,
                             const std::function<void(int64_t)>& done) {
  as_layer(l);
  LayerAccumulator acc(c_, l, out, xtx_inputs);  // shapes and messages of layer l
  tf_->set_observer(&acc);
  run(l, lw, keep_input, done);
  tf_->set_observer(nullptr);
  acc.finish();
  return acc.seconds();
}

void LayerStepper::clear() {
  x_.clear();
  x_.shrink_to_fit();
}

void calibrate_layers(const Weights& w, const std::vector<int>& tokens, int64_t nsamples,
                      int64_t seqlen, CalibDraw draw, int bos_token, bool need_xtx,
                      const std::function<void(int, LayerStats&)>& sink,
                      const std::function<void(int64_t, int64_t)>& progress, bool all_experts) {
  const Config& c = w.config;
  if (static_cast<int>(w.layers.size()) != c.n_layers)
    throw std::invalid_argument("calibrate: the model has " + std::to_string(w.layers.size()) +
                                " layers, its config " + std::to_string(c.n_layers));
  std::vector<int> seqs =
      calibration_sequences(tokens, nsamples, seqlen, draw, bos_token, c.max_seq_len);
  check_calibration_memory(c, nsamples, seqlen, need_xtx, true, 1);
  LayerStepper st(c, std::move(seqs), nsamples, seqlen, all_experts);
  st.embed(w.tok_embeddings);
  const int64_t total = int64_t{c.n_layers} * nsamples;
  if (progress) progress(0, total);  // the stage starts: its clock too
  for (int l = 0; l < c.n_layers; ++l) {
    LayerStats L;
    st.observe(l, w.layers[static_cast<size_t>(l)], &L, {need_xtx, need_xtx, need_xtx, need_xtx},
               false, [&](int64_t s) {
                 if (progress) progress(int64_t{l} * nsamples + s + 1, total);
               });
    sink(l, L);
  }
}

void check_calib_stats(const CalibStats& s, const Config& c) {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("calibration statistics do not match the model: " + what);
  };
  if (static_cast<int>(s.layers.size()) != c.n_layers)
    bad(std::to_string(s.layers.size()) + " layers, the model has " + std::to_string(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = s.layers[l];
    const auto check = [&](const InputStats& in, int64_t d, const std::string& what) {
      if (in.dim != d || static_cast<int64_t>(in.xdiag.size()) != d ||
          (in.has_xtx() && static_cast<int64_t>(in.xtx.size()) != d * d))
        bad("layer " + std::to_string(l) + " " + what + " has dim " + std::to_string(in.dim) +
            ", expected " + std::to_string(d));
    };
    for (int i = 0; i < kNumInputs; ++i)
      check(L.inputs[i], input_dim(c, static_cast<InputId>(i), l),
            "input " + std::string(input_name(static_cast<InputId>(i))));
    const size_t experts = c.moe_layer(l) ? static_cast<size_t>(c.n_experts) : 0;
    if (L.experts.size() != experts)
      bad("layer " + std::to_string(l) + " has statistics of " + std::to_string(L.experts.size()) +
          " experts, the model " + std::to_string(experts));
    for (size_t e = 0; e < L.experts.size(); ++e) {
      check(L.experts[e].in, c.dim, "expert " + std::to_string(e) + " input mlp_in");
      check(L.experts[e].mid, c.moe_hidden_dim, "expert " + std::to_string(e) + " input mlp_out");
    }
    if (L.q_sqnorm.size() != static_cast<size_t>(c.n_heads) * c.head_dim ||
        L.k_sqnorm.size() != static_cast<size_t>(c.n_kv_heads) * c.head_dim ||
        L.v_sqnorm.size() != static_cast<size_t>(c.n_kv_heads) * c.head_dim)
      bad("layer " + std::to_string(l) + " q/k/v channel norms have the wrong length");
  }
}

}  // namespace scalesweep::model

// Calibration statistics (include/scalesweep/model/calib.h).
#include "scalesweep/model/calib.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include "scalesweep/model/transformer.h"

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

std::string_view linear_name(LinearId l) {
  switch (l) {
    case LinearId::kQ:
      return "q_proj";
    case LinearId::kK:
      return "k_proj";
    case LinearId::kV:
      return "v_proj";
    case LinearId::kO:
      return "o_proj";
    case LinearId::kGate:
      return "gate_proj";
    case LinearId::kUp:
      return "up_proj";
    case LinearId::kDown:
      return "down_proj";
  }
  return "?";
}

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

class Accumulator : public Observer {
 public:
  explicit Accumulator(const Config& c) {
    stats_.layers.resize(c.n_layers);
    for (auto& L : stats_.layers) {
      for (int i = 0; i < kNumInputs; ++i) {
        auto& in = L.inputs[i];
        in.dim = input_dim(c, static_cast<InputId>(i));
        in.xtx.assign(static_cast<size_t>(in.dim * in.dim), 0.0);
      }
      L.q_sqnorm.assign(static_cast<size_t>(c.n_heads) * c.head_dim, 0.0);
      L.k_sqnorm.assign(static_cast<size_t>(c.n_kv_heads) * c.head_dim, 0.0);
      L.v_sqnorm.assign(static_cast<size_t>(c.n_kv_heads) * c.head_dim, 0.0);
    }
  }
  void on_input(int layer, InputId which, const float* x, int rows, int cols) override {
    InputStats& s = stats_.layers[layer].input(which);
    xd_.resize(static_cast<size_t>(rows) * cols);
    float amax = s.amax;
    for (size_t i = 0; i < xd_.size(); ++i) {
      xd_[i] = x[i];
      amax = std::max(amax, std::fabs(x[i]));
    }
    s.amax = amax;
    s.tokens += rows;
    // Upper triangle of xtx += Xᵀ X (mirrored in finish()).
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, cols, rows, 1.0, xd_.data(), cols, 1.0,
                s.xtx.data(), cols);
  }
  void on_qkv(int layer, const float* q, const float* k, const float* v, int rows) override {
    LayerStats& L = stats_.layers[layer];
    auto acc = [&](const float* m, std::vector<double>& sq, float& amax) {
      const size_t w = sq.size();
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
  }
  CalibStats finish() {
    for (auto& L : stats_.layers)
      for (auto& in : L.inputs)
        for (int64_t a = 0; a < in.dim; ++a)
          for (int64_t b = 0; b < a; ++b) in.xtx[a * in.dim + b] = in.xtx[b * in.dim + a];
    return std::move(stats_);
  }

 private:
  CalibStats stats_;
  std::vector<double> xd_;
};

}  // namespace

std::vector<int> calibration_sequences(const std::vector<int>& tokens, int64_t nsamples,
                                       int64_t seqlen, uint64_t seed, int bos_token,
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
  uint64_t state = seed;
  const uint64_t starts = static_cast<uint64_t>(n - body + 1);
  std::vector<int> out(static_cast<size_t>(nsamples * seqlen));
  for (int64_t s = 0; s < nsamples; ++s) {
    const int64_t start = static_cast<int64_t>(splitmix64(state) % starts);
    int* seq = out.data() + s * seqlen;
    if (with_bos) seq[0] = bos_token;
    std::copy(tokens.begin() + start, tokens.begin() + start + body, seq + (with_bos ? 1 : 0));
  }
  return out;
}

CalibStats calibrate(const Weights& w, const std::vector<int>& tokens, int64_t nsamples,
                     int64_t seqlen, uint64_t seed, int bos_token,
                     const std::function<void(int64_t, int64_t)>& progress) {
  const Config& c = w.config;
  const std::vector<int> seqs =
      calibration_sequences(tokens, nsamples, seqlen, seed, bos_token, c.max_seq_len);
  // A non-owning view of w for the runtime.
  std::shared_ptr<const Weights> view(&w, [](const Weights*) {});
  Transformer tf(view, static_cast<int>(seqlen));
  Accumulator acc(c);
  tf.set_observer(&acc);
  for (int64_t s = 0; s < nsamples; ++s) {
    tf.forward_hidden(seqs.data() + s * seqlen, static_cast<int>(seqlen), 0);
    if (progress) progress(s + 1, nsamples);
  }
  CalibStats out = acc.finish();
  out.nsamples = nsamples;
  out.seqlen = seqlen;
  out.seed = seed;
  return out;
}

void check_calib_stats(const CalibStats& s, const Config& c) {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("calibration statistics do not match the model: " + what);
  };
  if (static_cast<int>(s.layers.size()) != c.n_layers)
    bad(std::to_string(s.layers.size()) + " layers, the model has " + std::to_string(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = s.layers[l];
    for (int i = 0; i < kNumInputs; ++i) {
      const auto& in = L.inputs[i];
      const int64_t d = input_dim(c, static_cast<InputId>(i));
      if (in.dim != d || static_cast<int64_t>(in.xtx.size()) != d * d)
        bad("layer " + std::to_string(l) + " input " +
            std::string(input_name(static_cast<InputId>(i))) + " has dim " +
            std::to_string(in.dim) + ", expected " + std::to_string(d));
    }
    if (L.q_sqnorm.size() != static_cast<size_t>(c.n_heads) * c.head_dim ||
        L.k_sqnorm.size() != static_cast<size_t>(c.n_kv_heads) * c.head_dim ||
        L.v_sqnorm.size() != static_cast<size_t>(c.n_kv_heads) * c.head_dim)
      bad("layer " + std::to_string(l) + " q/k/v channel norms have the wrong length");
  }
}

}  // namespace scalesweep::model

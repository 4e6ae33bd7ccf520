// Test helpers for layer `model`: random synthetic models and a naive reference forward pass
// (double precision, straight loops, no cache) to check the runtime against.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::model::testing {

// a and b have the same length and the same bits at every index (the first difference named).
inline void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b,
                              const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0)
        << what << " index " << i << ": " << a[i] << " vs " << b[i];
}

// A deterministic token stream over [0, vocab) with no short period.
inline std::vector<int> token_stream(int n, int vocab) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + i / 5) % vocab;
  return t;
}

inline Weights random_model(const Config& c, uint64_t seed) {
  Weights w;
  w.config = c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](Tensor& t, std::vector<int64_t> shape, float scale, float offset = 0) {
    float* p = w.alloc(t, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = offset + scale * nd(rng);
  };
  const int64_t D = c.dim, H = c.hidden_dim, hd = c.head_dim, qd = c.n_heads * hd,
                kv = c.n_kv_heads * hd, V = c.vocab_size;
  fill(w.tok_embeddings, {V, D}, 1.0f);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    fill(L.attn_norm, {D}, 0.1f, 1.0f);
    fill(L.wq, {qd, D}, 1.0f / std::sqrt(static_cast<float>(D)));
    fill(L.wk, {kv, D}, 1.0f / std::sqrt(static_cast<float>(D)));
    fill(L.wv, {kv, D}, 1.0f / std::sqrt(static_cast<float>(D)));
    fill(L.wo, {D, qd}, 1.0f / std::sqrt(static_cast<float>(qd)));
    if (c.qkv_bias) {
      fill(L.bq, {qd}, 0.1f);
      fill(L.bk, {kv}, 0.1f);
      fill(L.bv, {kv}, 0.1f);
    }
    if (c.qk_norm) {
      fill(L.q_norm, {hd}, 0.1f, 1.0f);
      fill(L.k_norm, {hd}, 0.1f, 1.0f);
    }
    fill(L.ffn_norm, {D}, 0.1f, 1.0f);
    if (c.moe_layer(l)) {  // a router of unit-scale logits, experts of width moe_hidden_dim
      const int64_t I = c.moe_hidden_dim;
      fill(L.router, {c.n_experts, D}, 1.0f / std::sqrt(static_cast<float>(D)));
      L.experts.resize(static_cast<size_t>(c.n_experts));
      for (auto& e : L.experts) {
        fill(e.w1, {I, D}, 1.0f / std::sqrt(static_cast<float>(D)));
        fill(e.w3, {I, D}, 1.0f / std::sqrt(static_cast<float>(D)));
        fill(e.w2, {D, I}, 1.0f / std::sqrt(static_cast<float>(I)));
      }
      continue;
    }
    fill(L.w1, {H, D}, 1.0f / std::sqrt(static_cast<float>(D)));
    fill(L.w3, {H, D}, 1.0f / std::sqrt(static_cast<float>(D)));
    fill(L.w2, {D, H}, 1.0f / std::sqrt(static_cast<float>(H)));
  }
  fill(w.final_norm, {D}, 0.1f, 1.0f);
  if (c.tied_embeddings)
    w.lm_head = w.tok_embeddings;
  else
    fill(w.lm_head, {V, D}, 1.0f / std::sqrt(static_cast<float>(D)));
  return w;
}

// A dense Llama config of the given shape (the fields the tests vary; the others default).
inline Config shaped_config(int dim, int hidden_dim, int n_layers, int n_heads, int n_kv_heads,
                            int head_dim, int vocab_size, int max_seq_len) {
  return Config{.dim = dim,
                .hidden_dim = hidden_dim,
                .n_layers = n_layers,
                .n_heads = n_heads,
                .n_kv_heads = n_kv_heads,
                .head_dim = head_dim,
                .vocab_size = vocab_size,
                .max_seq_len = max_seq_len};
}

// dim 48, hidden 100, 2 layers, 6 q / 2 kv heads of 8, vocab 37, 64 positions.
inline Config small_config() { return shaped_config(48, 100, 2, 6, 2, 8, 37, 64); }

// small_config() shrunk further (dim 32, 4 q / 2 kv heads, vocab 40), tied or not.
inline Config tiny_config(bool tied) {
  Config c = shaped_config(32, 48, 2, 4, 2, 8, 40, 64);
  c.tied_embeddings = tied;
  return c;
}

// c with n_experts experts of width moe_hidden_dim in its MoE layers, experts_per_tok of them
// routed to per token (their probabilities renormalised when norm_topk_prob).
inline Config with_experts(Config c, int n_experts, int experts_per_tok, int moe_hidden_dim,
                           bool norm_topk_prob) {
  c.n_experts = n_experts;
  c.experts_per_tok = experts_per_tok;
  c.moe_hidden_dim = moe_hidden_dim;
  c.norm_topk_prob = norm_topk_prob;
  return c;
}

// The largest |decode logit - prefill logit| when tf decodes toks[0..n) one at a time from
// position 0; prefill: the logits [n, vocab] of a forward pass over the same tokens.
inline double max_decode_diff(Transformer& tf, const std::vector<int>& toks, int n,
                              const std::vector<float>& prefill) {
  const int vocab = tf.config().vocab_size;
  double m = 0;
  for (int t = 0; t < n; ++t) {
    const float* lg = tf.decode(toks[t], t);
    for (int j = 0; j < vocab; ++j)
      m = std::max(m, static_cast<double>(std::fabs(lg[j] - prefill[t * vocab + j])));
  }
  return m;
}

// The message of the E that fn() throws; when it throws none, a test failure `what` and "".
template <class E = std::invalid_argument, class Fn>
std::string error_message(Fn&& fn, const std::string& what) {
  const std::string none = "\x01(nothing thrown)";
  const std::string m = scalesweep::testing::error_of<E>(std::forward<Fn>(fn), none);
  if (m != none) return m;
  ADD_FAILURE() << what;
  return "";
}

// A fresh directory for the running test, removed with the object: PREFIX + the random seed
// + the test's name under the system temp directory.
using scalesweep::testing::randn;
using scalesweep::testing::slurp;
using scalesweep::testing::TempDir;

// The parts of reference_forward, in double precision.
namespace ref {

// y[d] = RMSNorm(x) * g.
inline void rms(const double* x, const float* g, int d, float eps, double* y) {
  double ss = 0;
  for (int j = 0; j < d; ++j) ss += x[j] * x[j];
  const double r = 1.0 / std::sqrt(ss / d + eps);
  for (int j = 0; j < d; ++j) y[j] = x[j] * r * g[j];
}

// y = W x (+ b when b has data).
inline void lin(const double* x, const Tensor& W, const Tensor& b, double* y) {
  const int64_t out = W.shape[0], in = W.shape[1];
  for (int64_t o = 0; o < out; ++o) {
    double s = b.data ? b.data[o] : 0.0;
    for (int64_t j = 0; j < in; ++j) s += W.data[o * in + j] * x[j];
    y[o] = s;
  }
}

// RoPE of one head v[hd] at position pos: rotate-half, or llama2.c's pairs (2i, 2i+1).
inline void rope(const Config& c, const std::vector<float>& inv, bool interleaved, double* v,
                 int pos) {
  const int hd = c.head_dim;
  for (int i = 0; i < hd / 2; ++i) {
    const double ang = static_cast<double>(static_cast<float>(pos) * inv[i]);
    const double m = c.rope_scaling.attention_factor;
    const double cs = std::cos(ang) * m, sn = std::sin(ang) * m;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + hd / 2;
    const double x0 = v[a], x1 = v[b];
    v[a] = x0 * cs - x1 * sn;
    v[b] = x1 * cs + x0 * sn;
  }
}

// SwiGLU of h into out (dim): w2 (silu(w1 h) * w3 h), width I.
inline void swiglu(const Tensor& w1, const Tensor& w3, const Tensor& w2, int I, const double* h,
                   double* out) {
  std::vector<double> g(I), u(I);
  lin(h, w1, Tensor{}, g.data());
  lin(h, w3, Tensor{}, u.data());
  for (int j = 0; j < I; ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
  lin(g.data(), w2, Tensor{}, out);
}

// A MoE feed-forward on h into out (D): every expert's SwiGLU, then the sum over the top
// experts_per_tok of softmax(h Rᵀ) (highest first, lowest index among equals), weighted by
// their probabilities (renormalised to sum 1 when norm_topk_prob).
inline void moe(const Config& c, const LayerWeights& L, const double* hin, double* out) {
  const int E = c.n_experts, I = c.moe_hidden_dim, D = c.dim;
  std::vector<double> p(E), y(D);
  lin(hin, L.router, Tensor{}, p.data());
  const double mx = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (auto& e : p) sum += (e = std::exp(e - mx));
  for (auto& e : p) e /= sum;
  std::vector<int> order(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  order.resize(c.experts_per_tok);
  double top = 0;
  for (int e : order) top += p[e];
  std::fill(out, out + D, 0.0);
  for (int e : order) {
    const auto& ex = L.experts[static_cast<size_t>(e)];
    swiglu(ex.w1, ex.w3, ex.w2, I, hin, y.data());
    const double wt = c.norm_topk_prob ? p[e] / top : p[e];
    for (int j = 0; j < D; ++j) out[j] += wt * y[j];
  }
}

// Causal attention of token t over tokens 0..t into o [n_heads * head_dim]; q [n, qd] and
// k, v [n, kvd] row-major.
inline void attention(const Config& c, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, int t, double* o) {
  const int hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  const int group = c.n_heads / c.n_kv_heads;
  for (int hh = 0; hh < c.n_heads; ++hh) {
    const int g = hh / group;
    std::vector<double> s(t + 1);
    double mx = -1e300;
    for (int j = 0; j <= t; ++j) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += q[t * qd + hh * hd + i] * k[j * kvd + g * hd + i];
      s[j] = d / std::sqrt(static_cast<double>(hd));
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (auto& e : s) sum += (e = std::exp(e - mx));
    for (int i = 0; i < hd; ++i) {
      double acc = 0;
      for (int j = 0; j <= t; ++j) acc += s[j] / sum * v[j * kvd + g * hd + i];
      o[hh * hd + i] = acc;
    }
  }
}

}  // namespace ref

// Naive forward: logits [n, vocab] for tokens at positions 0..n-1. `interleaved` applies
// llama2.c's RoPE on pairs (2i, 2i+1) instead of HF rotate-half.
inline std::vector<double> reference_forward(const Weights& w, const std::vector<int>& toks,
                                             bool interleaved = false) {
  const Config& c = w.config;
  const int n = static_cast<int>(toks.size()), D = c.dim, hd = c.head_dim, H = c.hidden_dim;
  const int qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  const std::vector<float> inv = rope_inv_freq(c);
  std::vector<double> x(static_cast<size_t>(n) * D);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < D; ++j) x[t * D + j] = w.tok_embeddings.data[toks[t] * D + j];
  std::vector<double> h(D), q(static_cast<size_t>(n) * qd), k(static_cast<size_t>(n) * kvd),
      v(static_cast<size_t>(n) * kvd), o(qd), tmp(std::max(D, qd));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    for (int t = 0; t < n; ++t) {
      ref::rms(&x[t * D], L.attn_norm.data, D, c.norm_eps, h.data());
      ref::lin(h.data(), L.wq, L.bq, &q[t * qd]);
      ref::lin(h.data(), L.wk, L.bk, &k[t * kvd]);
      ref::lin(h.data(), L.wv, L.bv, &v[t * kvd]);
      if (c.qk_norm) {
        for (int hh = 0; hh < c.n_heads; ++hh)
          ref::rms(&q[t * qd + hh * hd], L.q_norm.data, hd, c.norm_eps, &q[t * qd + hh * hd]);
        for (int hh = 0; hh < c.n_kv_heads; ++hh)
          ref::rms(&k[t * kvd + hh * hd], L.k_norm.data, hd, c.norm_eps, &k[t * kvd + hh * hd]);
      }
      for (int hh = 0; hh < c.n_heads; ++hh)
        ref::rope(c, inv, interleaved, &q[t * qd + hh * hd], t);
      for (int hh = 0; hh < c.n_kv_heads; ++hh)
        ref::rope(c, inv, interleaved, &k[t * kvd + hh * hd], t);
    }
    for (int t = 0; t < n; ++t) {
      ref::attention(c, q, k, v, t, o.data());
      ref::lin(o.data(), L.wo, Tensor{}, tmp.data());
      for (int j = 0; j < D; ++j) x[t * D + j] += tmp[j];
      ref::rms(&x[t * D], L.ffn_norm.data, D, c.norm_eps, h.data());
      if (c.moe_layer(l))
        ref::moe(c, L, h.data(), tmp.data());
      else
        ref::swiglu(L.w1, L.w3, L.w2, H, h.data(), tmp.data());
      for (int j = 0; j < D; ++j) x[t * D + j] += tmp[j];
    }
  }
  std::vector<double> logits(static_cast<size_t>(n) * c.vocab_size);
  for (int t = 0; t < n; ++t) {
    ref::rms(&x[t * D], w.final_norm.data, D, c.norm_eps, h.data());
    ref::lin(h.data(), w.lm_head, Tensor{}, &logits[t * c.vocab_size]);
  }
  return logits;
}

// Calls fn(x, y, name) for every tensor pair of two models with the same layer count
// (embedding, final norm, lm_head, then each layer's tensors, absent ones included: those have
// data == nullptr). The caller checks the layer counts first.
template <class Fn>
void for_each_tensor_pair(const Weights& a, const Weights& b, Fn&& fn) {
  fn(a.tok_embeddings, b.tok_embeddings, "embed");
  fn(a.final_norm, b.final_norm, "norm");
  fn(a.lm_head, b.lm_head, "lm_head");
  for (size_t l = 0; l < a.layers.size() && l < b.layers.size(); ++l) {
    const LayerWeights &x = a.layers[l], &y = b.layers[l];
    fn(x.attn_norm, y.attn_norm, "attn_norm");
    fn(x.wq, y.wq, "wq");
    fn(x.wk, y.wk, "wk");
    fn(x.wv, y.wv, "wv");
    fn(x.wo, y.wo, "wo");
    fn(x.bq, y.bq, "bq");
    fn(x.bk, y.bk, "bk");
    fn(x.bv, y.bv, "bv");
    fn(x.q_norm, y.q_norm, "q_norm");
    fn(x.k_norm, y.k_norm, "k_norm");
    fn(x.ffn_norm, y.ffn_norm, "ffn_norm");
    fn(x.w1, y.w1, "w1");
    fn(x.w2, y.w2, "w2");
    fn(x.w3, y.w3, "w3");
  }
}

}  // namespace scalesweep::model::testing

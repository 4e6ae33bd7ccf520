// Llama-family CPU runtime (include/scalesweep/model/transformer.h).
#include "scalesweep/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <stdexcept>
#include <string>

#include "model/bf16_gemm.h"
#include "model/f32_gemm.h"
#include "model/vec_math.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/model/moe.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::model {

// transformers' ROPE_INIT_FUNCTIONS (modeling_rope_utils.py) for one rope_type, in float32
// where torch computes in float32.
std::vector<float> rope_inv_freq(const Config& c, int seq_len) {
  const int hd = c.head_dim, half = hd / 2;
  const auto& rs = c.rope_scaling;
  if (rs.type == RopeType::kDefault && rs.factor != 0)
    throw std::invalid_argument("rope_scaling.factor " + std::to_string(rs.factor) +
                                " is set with rope type 'default' (name the rope type)");
  if (rs.type != RopeType::kDefault && !(rs.factor > 0))
    throw std::invalid_argument(std::string("rope type '") +
                                std::string(kRopeTypeNames.name(rs.type)) + "' needs factor > 0");
  double base = c.rope_theta;
  if (rs.type == RopeType::kDynamic) {
    // Dynamic NTK: the base grows with the sequence length once it passes
    // max_position_embeddings (seq_len = max(seq_len, max_position_embeddings)).
    const double len = std::max(seq_len, c.max_seq_len), mp = c.max_seq_len;
    base *= std::pow(rs.factor * len / mp - (rs.factor - 1), static_cast<double>(hd) / (hd - 2));
  }
  std::vector<float> f(static_cast<size_t>(half));
  const float basef = static_cast<float>(base);
  for (int i = 0; i < half; ++i)
    f[i] = 1.0f / std::pow(basef, static_cast<float>(2 * i) / static_cast<float>(hd));
  switch (rs.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:
      break;
    case RopeType::kLinear:
      for (auto& fr : f) fr /= rs.factor;
      break;
    case RopeType::kLlama3: {
      const double old_len = rs.original_max_position_embeddings;
      const double low_wl = old_len / rs.low_freq_factor, high_wl = old_len / rs.high_freq_factor;
      for (auto& fr : f) {
        const double wl = 2 * std::numbers::pi / fr;
        if (wl < high_wl) continue;
        if (wl > low_wl) {
          fr = static_cast<float>(fr / rs.factor);
        } else {
          double smooth =
              (old_len / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
          fr = static_cast<float>((1 - smooth) * fr / rs.factor + smooth * fr);
        }
      }
      break;
    }
    case RopeType::kYarn: {
      // Correction range: the dims whose wavelength makes beta_fast .. beta_slow rotations over
      // the original context are blended from extrapolation (original frequency) to
      // interpolation (frequency / factor).
      const double dim = hd, lb = 2 * std::log(base), omax = rs.original_max_position_embeddings;
      auto corr = [&](double rot) {
        return dim * std::log(omax / (rot * 2 * std::numbers::pi)) / lb;
      };
      double low = corr(rs.beta_fast), high = corr(rs.beta_slow);
      if (rs.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1);
      if (low == high) high += 0.001;
      for (int i = 0; i < half; ++i) {
        const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
        const float extra = 1 - ramp;  // weight of the unscaled frequency
        const float pos_freq = std::pow(basef, static_cast<float>(2 * i) / static_cast<float>(hd));
        const float interp = 1.0f / (rs.factor * pos_freq);
        f[i] = interp * (1 - extra) + (1.0f / pos_freq) * extra;
      }
      break;
    }
  }
  return f;
}

bool compute_available(Compute c) { return c == Compute::kF32 || bf16_gemm_available(); }

std::unique_ptr<Transformer> Transformer::fresh(int max_ctx) const {
  return with_weights(w_, max_ctx);
}

std::unique_ptr<Transformer> Transformer::with_weights(std::shared_ptr<const Weights> w,
                                                       int max_ctx) const {
  auto t = std::make_unique<Transformer>(std::move(w), max_ctx);
  t->rq_ = rq_;
  t->compute_ = compute_;
  return t;
}

void Transformer::set_compute(Compute c) {
  if (!compute_available(c))
    throw std::runtime_error(
        "compute mode " + std::string(kComputeNames.name(c)) +
        " is not available: this build has no oneDNN (install libdnnl-dev, e.g. with "
        "scripts/setup.sh, and configure again)");
  compute_ = c;
}

Transformer::Transformer(std::shared_ptr<const Weights> w, int max_ctx) : w_(std::move(w)) {
  const Config& c = w_->config;
  if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.head_dim % 2 != 0 || c.n_heads % c.n_kv_heads != 0 || c.vocab_size <= 0 ||
      c.max_seq_len <= 0 || static_cast<int>(w_->layers.size()) != c.n_layers)
    throw std::invalid_argument("Transformer: inconsistent model config");
  if (c.moe() && (c.experts_per_tok < 1 || c.experts_per_tok > c.n_experts ||
                  c.moe_hidden_dim <= 0 || c.moe_sparse_step < 1))
    throw std::invalid_argument("Transformer: inconsistent mixture-of-experts config (" +
                                std::to_string(c.n_experts) + " experts, " +
                                std::to_string(c.experts_per_tok) + " per token, width " +
                                std::to_string(c.moe_hidden_dim) + ", sparse step " +
                                std::to_string(c.moe_sparse_step) + ")");
  inv_freq_ = rope_inv_freq(c, 0);
  rope_scale_ = c.rope_scaling.attention_factor;
  if (!(rope_scale_ > 0) || !std::isfinite(rope_scale_))
    throw std::invalid_argument("Transformer: rope attention_factor must be positive");
  kcache_.resize(c.n_layers);
  vcache_.resize(c.n_layers);
  ensure_capacity(max_ctx > 0 ? std::min(max_ctx, c.max_seq_len) : std::min(c.max_seq_len, 256));
}

void Transformer::ensure_capacity(int positions) {
  const Config& c = w_->config;
  if (positions > c.max_seq_len)
    throw std::out_of_range("position " + std::to_string(positions - 1) +
                            " is beyond the model's max_seq_len " + std::to_string(c.max_seq_len));
  if (positions <= cap_) return;
  int cap = std::max(positions, std::min(c.max_seq_len, std::max(2 * cap_, 64)));
  const size_t kv = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    // Keys are channel-major [kv_dim, cap]: move each channel's row to its new stride.
    std::vector<float> k(static_cast<size_t>(cap) * kv, 0.0f);
    for (size_t ch = 0; ch < kv && cap_ > 0; ++ch)
      std::memcpy(&k[ch * cap], &kcache_[l][ch * cap_], sizeof(float) * cap_);
    kcache_[l].swap(k);
    vcache_[l].resize(static_cast<size_t>(cap) * kv);
  }
  cap_ = cap;
}

void Transformer::ensure_scratch(int n) {
  if (n <= scratch_n_) return;
  const Config& c = w_->config;
  const size_t N = static_cast<size_t>(n);
  const size_t qd = static_cast<size_t>(c.n_heads) * c.head_dim;
  const size_t kv = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  x_.resize(N * c.dim);
  xb_.resize(N * std::max<size_t>(c.dim, qd));
  q_.resize(N * qd);
  k_.resize(N * kv);
  v_.resize(N * kv);
  att_.resize(N * qd);
  // The dense feed-forward's hidden states, or a MoE layer's expert's.
  const size_t hidden = static_cast<size_t>(std::max(c.hidden_dim, c.moe_hidden_dim));
  hb_.resize(N * hidden);
  hb2_.resize(N * hidden);
  if (c.moe()) {
    route_p_.resize(N * c.n_experts);
    route_e_.resize(N * c.experts_per_tok);
    route_w_.resize(N * c.experts_per_tok);
    moe_rows_.resize(N);
    moe_x_.resize(N * c.dim);
    moe_y_.resize(N * c.dim);
    moe_out_.resize(N * c.dim);
  }
  rope_cos_.resize(N * c.head_dim / 2);
  rope_sin_.resize(N * c.head_dim / 2);
  scratch_n_ = n;
}

namespace {

// s[j] += a * row[j] for j < n (decode attention scores over a channel-major key cache).
__attribute__((target_clones("avx512f", "avx2", "default"))) void axpy(float* s, const float* row,
                                                                       float a, int n) {
  for (int j = 0; j < n; ++j) s[j] += a * row[j];
}

// o_q[i] = sum_j p_q[j] v[j * ld + i] for i < hd and the g query heads q of one KV head
// (decode attention output; o_q = o + q * hd, p_q = p + q * pstride): each value row is read
// once for the group, every o_q summed in j order as for one head alone.
__attribute__((target_clones("avx512f", "avx2", "default"))) void weighted_rows(
    float* o, const float* v, int ld, const float* p, size_t pstride, int n, int hd, int g) {
  for (int i = 0; i < g * hd; ++i) o[i] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float* vj = v + static_cast<size_t>(j) * ld;
    for (int q = 0; q < g; ++q) {
      const float pj = p[q * pstride + j];
      float* oq = o + q * hd;
      for (int i = 0; i < hd; ++i) oq[i] += pj * vj[i];
    }
  }
}

// Decode matrix-vector products use gemv_rows (no BLAS call overhead, no spinning BLAS
// threads); matrices of at least kThreadedGemv elements are split by rows over the runtime's
// persistent workers (a WorkerPool of all cores, started at the first such product); so is
// the dequantization of a prefill weight tile.
constexpr int64_t kThreadedGemv = 1 << 16;
constexpr int kTile = 64;  // prefill attention: query rows per tile

}  // namespace

int64_t runtime_working_bytes(const Config& c, int64_t positions, int64_t rows) {
  const int64_t qd = int64_t{c.n_heads} * c.head_dim, kv = int64_t{c.n_kv_heads} * c.head_dim;
  const int64_t cache = 2 * int64_t{c.n_layers} * positions * kv;
  // ensure_scratch's buffers, then a kTile x positions score tile per worker.
  const int64_t act = rows * (c.dim + std::max<int64_t>(c.dim, qd) + 2 * qd + 2 * kv +
                              2 * std::max(c.hidden_dim, c.moe_hidden_dim) + c.head_dim);
  // MoE layers: router probabilities, the routes (index and weight, 4 bytes each), an
  // expert's row list (8 bytes a row), its inputs and outputs and the layer's output.
  const int64_t moe =
      c.moe() ? rows * (c.n_experts + 2 * int64_t{c.experts_per_tok} + 2 + 3 * c.dim) : 0;
  const int64_t scores = int64_t{kTile} * positions * hardware_threads();
  const int64_t in = std::max<int64_t>({c.dim, c.hidden_dim, c.moe_hidden_dim});
  const int64_t wtile = prefill_tile_rows(in) * in;
  return 4 * (cache + act + moe + scores + wtile);
}

// y[n, out] = x[n, in] Wᵀ (+ b). Weights not stored as fp32 are read in their storage
// precision: decode runs the fused kernels of gemv_rows (bf16 in place, other dtypes a
// dequantized tile of rows at a time); prefill dequantizes a tile of rows into a scratch
// buffer and runs sgemm on it (fp32 weights: one sgemm on the whole matrix, as before).
void Transformer::linear(const float* x, int n, const Tensor& w, const Tensor& b, float* y) const {
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]);
  if (n == 1) {
    const auto rows = [&](int64_t o0, int64_t o1, int) {
      gemv_rows(w, x, static_cast<int>(o0), static_cast<int>(o1), y + o0);
    };
    if (static_cast<int64_t>(out) * in < kThreadedGemv)
      rows(0, out, 0);
    else
      decode_pool().run(out, rows);
  } else if (compute_ == Compute::kBF16) {
    xbf_.resize(static_cast<size_t>(n) * in);
    f32_to_bf16(x, static_cast<int64_t>(n) * in, xbf_.data());
    if (w.dtype == WeightDType::kBF16) {
      bf16_gemm(xbf_.data(), static_cast<const uint16_t*>(w.raw), n, out, in, y, out);
    } else {
      const int tile = static_cast<int>(std::min<int64_t>(out, prefill_tile_rows(in)));
      wtile_.resize(static_cast<size_t>(tile) * in);
      wtile_bf_.resize(static_cast<size_t>(tile) * in);
      for (int o0 = 0; o0 < out; o0 += tile) {
        const int rows = std::min(out, o0 + tile) - o0;
        dequantize_tile(w, o0, rows);
        f32_to_bf16(wtile_.data(), static_cast<int64_t>(rows) * in, wtile_bf_.data());
        bf16_gemm(xbf_.data(), wtile_bf_.data(), n, rows, in, y + o0, out);
      }
    }
  } else if (w.dtype == WeightDType::kF32) {
    f32_gemm(x, w.data, n, out, in, y, out);
  } else {
    const int tile = static_cast<int>(std::min<int64_t>(out, prefill_tile_rows(in)));
    wtile_.resize(static_cast<size_t>(tile) * in);
    for (int o0 = 0; o0 < out; o0 += tile) {
      const int rows = std::min(out, o0 + tile) - o0;
      dequantize_tile(w, o0, rows);
      f32_gemm(x, wtile_.data(), n, rows, in, y + o0, out);
    }
  }
  if (b.present()) {
    const float* bd = b.f32("bias");
    for (int r = 0; r < n; ++r)
      for (int o = 0; o < out; ++o) y[static_cast<size_t>(r) * out + o] += bd[o];
  }
}

// Rows [o0, o0 + rows) of w into wtile_ as fp32, split over the workers (each row's values
// are its own: the same bits on any worker).
void Transformer::dequantize_tile(const Tensor& w, int o0, int rows) const {
  const int64_t in = w.cols();
  float* dst = wtile_.data();
  const auto part = [&](int64_t r0, int64_t r1, int) {
    dequantize_rows(w, o0 + r0, o0 + r1, dst + r0 * in);
  };
  if (int64_t{rows} * in < kThreadedGemv)
    part(0, rows, 0);
  else
    decode_pool().run(rows, part);
}

WorkerPool& Transformer::decode_pool() const {
  if (!decode_pool_) decode_pool_ = std::make_unique<WorkerPool>(0);
  return *decode_pool_;
}

void Transformer::rmsnorm(const float* x, const float* w, int n, int dim, float* y) const {
  const float eps = w_->config.norm_eps;
  for (int r = 0; r < n; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* yr = y + static_cast<size_t>(r) * dim;
    float ss = 0.0f;
    for (int j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    ss = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int j = 0; j < dim; ++j) yr[j] = w[j] * (ss * xr[j]);
  }
}

void Transformer::fake_quant_rows(float* x, int rows, int cols, float gs,
                                  const std::vector<float>& imp, const std::string& name,
                                  const std::vector<double>* hess) const {
  QuantConfig cfg = rq_->cfg;
  if (cfg.format == TensorFormat::kNvfp4) cfg.global_scale = gs;  // MXFP4 has no global scale
  cfg.threads = 1;
  Importance im;
  std::vector<double> diag_hess;
  if (method_uses_hessian(cfg.selector.method)) {
    if (!hess || hess->empty()) {  // attention states: the diagonal blocks of their importance
      if (static_cast<int64_t>(imp.size()) != cols)
        throw std::invalid_argument(name + ": no importance for a block-Hessian method");
      diag_hess = diagonal_block_hessians(imp.data(), cols, cfg.block);
      hess = &diag_hess;
    }
    im = {ImportanceKind::kBlockHessian, nullptr, hess->data(), cfg.block};
  } else if (!imp.empty() && method_is_weighted(cfg.selector.method)) {
    im.kind = ImportanceKind::kPerColumn;
    im.data = imp.data();
  }
  std::vector<float> y = fake_quantize(x, rows, cols, im, cfg, name);
  std::memcpy(x, y.data(), sizeof(float) * y.size());
}

// Attention states [rows, n_heads*hd]: blocks along the flattened head axis when head_dim is
// below the block size or a multiple of it (the same blocks as per head), else per head
// (partial last block of each head).
void Transformer::fake_quant_heads(float* x, int rows, int n_heads, float gs,
                                   const std::vector<float>& imp, const std::string& name) const {
  const int hd = w_->config.head_dim, block = rq_->cfg.block, width = n_heads * hd;
  if (hd < block || hd % block == 0) {
    fake_quant_rows(x, rows, width, gs, imp, name);
    return;
  }
  std::vector<float> tmp(static_cast<size_t>(rows) * hd);
  std::vector<float> himp;
  for (int h = 0; h < n_heads; ++h) {
    for (int r = 0; r < rows; ++r)
      std::memcpy(&tmp[static_cast<size_t>(r) * hd], x + static_cast<size_t>(r) * width + h * hd,
                  sizeof(float) * hd);
    if (!imp.empty()) himp.assign(imp.begin() + h * hd, imp.begin() + (h + 1) * hd);
    fake_quant_rows(tmp.data(), rows, hd, gs, himp, name + ".head" + std::to_string(h));
    for (int r = 0; r < rows; ++r)
      std::memcpy(x + static_cast<size_t>(r) * width + h * hd, &tmp[static_cast<size_t>(r) * hd],
                  sizeof(float) * hd);
  }
}

const float* Transformer::forward_hidden(const int* tokens, int n, int pos) {
  branch_start_.clear();
  return run_rows(tokens, n, pos);
}

const float* Transformer::forward_branches(const int* tokens, const int* lens, int n_branches,
                                           int pos) {
  if (n_branches <= 0) throw std::invalid_argument("forward_branches: no branch");
  branch_start_.clear();
  for (int b = 0, start = 0; b < n_branches; ++b) {
    if (lens[b] <= 0) throw std::invalid_argument("forward_branches: empty branch");
    for (int i = 0; i < lens[b]; ++i) branch_start_.push_back(start);
    start += lens[b];
  }
  const int n = static_cast<int>(branch_start_.size());
  try {
    const float* h = run_rows(tokens, n, pos);
    branch_start_.clear();
    return h;
  } catch (...) {
    branch_start_.clear();
    throw;
  }
}

const float* Transformer::run_rows(const int* tokens, int n, int pos) {
  const Config& c = w_->config;
  if (n <= 0) throw std::invalid_argument("forward: no tokens");
  if (pos < 0) throw std::invalid_argument("forward: negative position");
  ensure_capacity(pos + n);
  ensure_scratch(n);
  const int D = c.dim;
  float* x = x_.data();

  for (int t = 0; t < n; ++t) {
    const int tok = tokens[t];
    if (tok < 0 || tok >= c.vocab_size)
      throw std::out_of_range("token id " + std::to_string(tok) + " at index " + std::to_string(t) +
                              " outside the vocabulary of " + std::to_string(c.vocab_size));
    dequantize_rows(w_->tok_embeddings, tok, tok + 1, x + static_cast<size_t>(t) * D);
  }
  set_rope(n, pos);
  for (int l = 0; l < c.n_layers; ++l) run_layer(l, w_->layers[l], x, n, pos);
  rmsnorm(x, w_->final_norm.f32("final norm"), n, D, x);
  return x;
}

void Transformer::set_rope(int n, int pos) {
  const int half = w_->config.head_dim / 2;
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < half; ++i) {
      // Branch rows: the position within their own branch.
      const int at = pos + t - (branch_start_.empty() ? 0 : branch_start_[t]);
      const float val = static_cast<float>(at) * inv_freq_[i];
      rope_cos_[static_cast<size_t>(t) * half + i] = std::cos(val) * rope_scale_;
      rope_sin_[static_cast<size_t>(t) * half + i] = std::sin(val) * rope_scale_;
    }
}

void Transformer::forward_layer(int l, const LayerWeights& lw, float* x, int n, int pos) {
  const Config& c = w_->config;
  if (n <= 0) throw std::invalid_argument("forward_layer: no tokens");
  if (pos < 0) throw std::invalid_argument("forward_layer: negative position");
  if (l < 0 || l >= c.n_layers)
    throw std::invalid_argument("forward_layer: no layer " + std::to_string(l));
  ensure_capacity(pos + n);
  ensure_scratch(n);
  set_rope(n, pos);
  run_layer(l, lw, x, n, pos);
}

void Transformer::run_layer(int l, const LayerWeights& lw, float* x, int n, int pos) {
  const Config& c = w_->config;
  const int D = c.dim, hd = c.head_dim, half = hd / 2, H = c.hidden_dim;
  const int qd = c.n_heads * hd, kvd = c.n_kv_heads * hd, group = c.n_heads / c.n_kv_heads;
  const bool act_q = rq_ && rq_->acts, kv_q = rq_ && rq_->kv, q_q = rq_ && rq_->query;
  auto rope = [&](float* m, int heads) {  // rotate-half, [n, heads*hd]
    for (int t = 0; t < n; ++t) {
      const float* cs = &rope_cos_[static_cast<size_t>(t) * half];
      const float* sn = &rope_sin_[static_cast<size_t>(t) * half];
      for (int h = 0; h < heads; ++h) {
        float* v = m + static_cast<size_t>(t) * heads * hd + h * hd;
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[i] - b * sn[i];
          v[i + half] = b * cs[i] + a * sn[i];
        }
      }
    }
  };
  auto head_norm = [&](float* m, int heads, const Tensor& w) {  // Qwen3 per-head RMSNorm
    rmsnorm(m, w.f32("q/k norm"), n * heads, hd, m);
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int T = pos + n;  // keys visible to the last query
  scores_.resize(static_cast<size_t>(std::min(n, kTile)) * T);

  {
    const RuntimeQuant::Layer* rl = rq_ ? &rq_->layers[l] : nullptr;
    const std::string lname = rq_ ? "layers." + std::to_string(l) : std::string();
    // A Linear input [n, cols]: shown to the observer (calibration), then fake-quantized in
    // place where activation quantization covers it.
    const auto linear_input = [&](InputId id, float* m, int cols) {
      if (observer_) observer_->on_input(l, id, m, n, cols);
      const auto i = static_cast<size_t>(id);
      if (act_q && rl->input_on[i])
        fake_quant_rows(m, n, cols, rl->input_gs[i], rl->input_imp[i],
                        lname + "." + std::string(input_name(id)), &rl->input_hess[i]);
    };
    // ---- attention ----
    rmsnorm(x, lw.attn_norm.f32("attention norm"), n, D, xb_.data());
    linear_input(InputId::kAttnIn, xb_.data(), D);
    linear(xb_.data(), n, lw.wq, lw.bq, q_.data());
    linear(xb_.data(), n, lw.wk, lw.bk, k_.data());
    linear(xb_.data(), n, lw.wv, lw.bv, v_.data());
    if (c.qk_norm) {
      head_norm(q_.data(), c.n_heads, lw.q_norm);
      head_norm(k_.data(), c.n_kv_heads, lw.k_norm);
    }
    rope(q_.data(), c.n_heads);
    rope(k_.data(), c.n_kv_heads);
    if (observer_) observer_->on_qkv(l, q_.data(), k_.data(), v_.data(), n);
    if (kv_q) {
      fake_quant_heads(k_.data(), n, c.n_kv_heads, rl->k_gs, rl->k_imp, lname + ".k");
      fake_quant_heads(v_.data(), n, c.n_kv_heads, rl->v_gs, rl->v_imp, lname + ".v");
    }
    if (q_q) fake_quant_heads(q_.data(), n, c.n_heads, rl->q_gs, rl->q_imp, lname + ".q");
    float* kc = kcache_[l].data();
    float* vc = vcache_[l].data();
    for (int t = 0; t < n; ++t)
      for (int ch = 0; ch < kvd; ++ch)
        kc[static_cast<size_t>(ch) * cap_ + pos + t] = k_[static_cast<size_t>(t) * kvd + ch];
    std::memcpy(vc + static_cast<size_t>(pos) * kvd, v_.data(), sizeof(float) * n * kvd);

    if (n == 1) {
      // Per KV head, its `group` query heads together, so that each key and value row is read
      // once for the group (each head's scores and output are summed as for one head alone);
      // KV heads over the decode workers once the cache is long enough (a head's result is its
      // own: the same bits on any worker).
      const size_t per = static_cast<size_t>(group) * T;
      const auto kv_heads = [&](int64_t g0, int64_t g1, int w) {
        float* s = scores_.data() + per * w;
        for (int64_t kvh = g0; kvh < g1; ++kvh) {
          const float* qg = q_.data() + kvh * group * hd;
          std::fill(s, s + per, 0.0f);
          for (int i = 0; i < hd; ++i) {
            const float* row = kc + static_cast<size_t>(kvh * hd + i) * cap_;
            for (int q = 0; q < group; ++q) axpy(s + q * T, row, qg[q * hd + i] * scale, T);
          }
          for (int q = 0; q < group; ++q) softmax_inplace(s + q * T, T);
          weighted_rows(att_.data() + kvh * group * hd, vc + kvh * hd, kvd, s, T, T, hd, group);
        }
      };
      if (int64_t{T} * qd < kThreadedGemv) {
        scores_.resize(per);
        kv_heads(0, c.n_kv_heads, 0);
      } else {
        WorkerPool& pool = decode_pool();
        scores_.resize(per * pool.threads());
        pool.run(c.n_kv_heads, kv_heads);
      }
    } else {
      // Query tiles of kTile rows; tile rows [t0, t1) see keys [0, pos + t1).
      auto head = [&](int h, float* s) {
        const int kvh = h / group;
        for (int t0 = 0; t0 < n; t0 += kTile) {
          const int t1 = std::min(n, t0 + kTile), rows = t1 - t0, keys = pos + t1;
          // S[rows, keys] = scale * Q_h K_hᵀ
          f32_gemm_nn(rows, keys, hd, scale, q_.data() + static_cast<size_t>(t0) * qd + h * hd, qd,
                      kc + static_cast<size_t>(kvh) * hd * cap_, cap_, s, keys);
          for (int t = t0; t < t1; ++t) {
            float* st = s + static_cast<size_t>(t - t0) * keys;
            const int vis = pos + t + 1;
            // Branch rows do not see the earlier branches' keys (slots pos .. pos+start).
            const int hide = branch_start_.empty() ? 0 : branch_start_[t];
            std::fill(st + pos, st + pos + hide, -1e30f);
            softmax_inplace(st, vis);
            std::fill(st + pos, st + pos + hide, 0.0f);
            std::fill(st + vis, st + keys, 0.0f);
          }
          // O_h[rows, hd] = P V_h
          f32_gemm_nn(rows, hd, keys, 1.0f, s, keys, vc + kvh * hd, kvd,
                      att_.data() + static_cast<size_t>(t0) * qd + h * hd, qd);
        }
      };
      if (compute_ == Compute::kF32) {
        for (int h = 0; h < c.n_heads; ++h) head(h, scores_.data());
      } else {
        // bf16 compute: heads over all cores (parallel_for), each product on its worker's
        // thread. OpenBLAS's thread count is one global: set to 1 here, before the workers,
        // so that the OpenBLAS fallback of f32_gemm_nn never races on it.
        const size_t per = static_cast<size_t>(std::min(n, kTile)) * T;
        const int workers = std::min(hardware_threads(), c.n_heads);
        scores_.resize(per * static_cast<size_t>(workers));
        const OneBlasThread one_blas;
        parallel_for(c.n_heads, workers, [&](int64_t h0, int64_t h1, int w) {
          for (int64_t h = h0; h < h1; ++h) head(static_cast<int>(h), scores_.data() + per * w);
        });
      }
    }
    linear_input(InputId::kAttnOut, att_.data(), qd);
    linear(att_.data(), n, lw.wo, Tensor{}, xb_.data());
    for (size_t i = 0; i < static_cast<size_t>(n) * D; ++i) x[i] += xb_[i];

    // ---- feed-forward: SwiGLU, or a mixture of SwiGLU experts ----
    rmsnorm(x, lw.ffn_norm.f32("ffn norm"), n, D, xb_.data());
    if (c.moe_layer(l)) {
      moe(l, lw, xb_.data(), n, moe_out_.data());
      for (size_t i = 0; i < static_cast<size_t>(n) * D; ++i) x[i] += moe_out_[i];
      return;
    }
    linear_input(InputId::kMlpIn, xb_.data(), D);
    linear(xb_.data(), n, lw.w1, Tensor{}, hb_.data());
    linear(xb_.data(), n, lw.w3, Tensor{}, hb2_.data());
    silu_mul(hb_.data(), hb2_.data(), static_cast<size_t>(n) * H);
    linear_input(InputId::kMlpOut, hb_.data(), H);
    linear(hb_.data(), n, lw.w2, Tensor{}, xb_.data());
    for (size_t i = 0; i < static_cast<size_t>(n) * D; ++i) x[i] += xb_[i];
  }
}

// A mixture-of-experts feed-forward (transformers' Qwen3MoeSparseMoeBlock,
// MixtralSparseMoeBlock) on the normed hidden states h [n, dim], into out [n, dim]:
//   1. route: logits = h Rᵀ [n, n_experts] (fp32 router); per row, the experts_per_tok experts
//      of softmax(logits) that torch.topk picks and their weights (route_token, model/moe.h).
//   2. experts in ascending index order: expert e gathers the rows routed to it (in row order),
//      runs its SwiGLU on them, one matrix product per Linear (a single row: the decode GEMV),
//      and adds output * weight to each of those rows of `out`. Each row's sum therefore runs
//      over its experts in ascending index order, from zero, as transformers' expert loop
//      (index_add_) adds them. An expert no row chose is not run.
void Transformer::moe(int l, const LayerWeights& lw, const float* h, int n, float* out) {
  const Config& c = w_->config;
  const int D = c.dim, I = c.moe_hidden_dim, E = c.n_experts, K = c.experts_per_tok;
  const std::string where = "layer " + std::to_string(l) + ": ";
  const std::vector<std::array<float, 2>>* act_gs = nullptr;  // per expert, under rq_->acts
  if (rq_ && rq_->acts) {
    act_gs = &rq_->layers[static_cast<size_t>(l)].expert_input_gs;
    if (static_cast<int>(act_gs->size()) != E)
      throw std::invalid_argument(where +
                                  "activation quantization of a mixture-of-experts "
                                  "layer needs the input global scales of its " +
                                  std::to_string(E) + " experts (has " +
                                  std::to_string(act_gs->size()) + ")");
  }
  const auto shaped = [](const Tensor& t, int64_t rows, int64_t cols) {
    return t.present() && t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == cols;
  };
  if (!shaped(lw.router, E, D) || static_cast<int>(lw.experts.size()) != E)
    throw std::invalid_argument(where + "a mixture-of-experts layer needs a router [" +
                                std::to_string(E) + ", " + std::to_string(D) + "] and " +
                                std::to_string(E) + " experts (has " +
                                std::to_string(lw.experts.size()) + ")");
  for (int e = 0; e < E; ++e) {
    const LayerWeights::Expert& ex = lw.experts[static_cast<size_t>(e)];
    if (!shaped(ex.w1, I, D) || !shaped(ex.w3, I, D) || !shaped(ex.w2, D, I))
      throw std::invalid_argument(where + "expert " + std::to_string(e) + " needs gate/up [" +
                                  std::to_string(I) + ", " + std::to_string(D) + "] and down [" +
                                  std::to_string(D) + ", " + std::to_string(I) + "]");
  }
  float* probs = route_p_.data();
  int* chosen = route_e_.data();
  float* weight = route_w_.data();
  linear(h, n, lw.router, Tensor{}, probs);
  for (size_t t = 0; t < static_cast<size_t>(n); ++t)
    route_token(probs + t * E, E, K, c.norm_topk_prob, chosen + t * K, weight + t * K);
  // Calibration: the router's input is every token; the experts' statistics below.
  const bool all = observer_ && calib_all_experts_;
  if (observer_) {
    observer_->on_input(l, InputId::kMlpIn, h, n, D);
    observer_->on_routes(l, chosen, n, K);
  }

  std::fill(out, out + static_cast<size_t>(n) * D, 0.0f);
  for (int e = 0; e < E; ++e) {
    const LayerWeights::Expert& ex = lw.experts[static_cast<size_t>(e)];
    if (all) {  // every token through expert e, for the statistics only
      observer_->on_expert_input(l, e, InputId::kMlpIn, h, n, D);
      linear(h, n, ex.w1, Tensor{}, hb_.data());
      linear(h, n, ex.w3, Tensor{}, hb2_.data());
      silu_mul(hb_.data(), hb2_.data(), static_cast<size_t>(n) * I);
      observer_->on_expert_input(l, e, InputId::kMlpOut, hb_.data(), n, I);
    }
    int m = 0;  // rows routed to e: (row, weight)
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < K; ++j)
        if (chosen[static_cast<size_t>(t) * K + j] == e)
          moe_rows_[static_cast<size_t>(m++)] = {t, weight[static_cast<size_t>(t) * K + j]};
    if (m == 0) continue;
    for (int i = 0; i < m; ++i)
      std::memcpy(&moe_x_[static_cast<size_t>(i) * D],
                  h + static_cast<size_t>(moe_rows_[i].first) * D, sizeof(float) * D);
    if (observer_ && !all) observer_->on_expert_input(l, e, InputId::kMlpIn, moe_x_.data(), m, D);
    const std::array<float, 2> gs =
        act_gs ? (*act_gs)[static_cast<size_t>(e)] : std::array<float, 2>{};
    const std::string ename =
        act_gs ? "layers." + std::to_string(l) + ".experts." + std::to_string(e) : std::string();
    if (gs[0] > 0) fake_quant_rows(moe_x_.data(), m, D, gs[0], {}, ename + ".mlp_in");
    linear(moe_x_.data(), m, ex.w1, Tensor{}, hb_.data());
    linear(moe_x_.data(), m, ex.w3, Tensor{}, hb2_.data());
    silu_mul(hb_.data(), hb2_.data(), static_cast<size_t>(m) * I);
    if (observer_ && !all) observer_->on_expert_input(l, e, InputId::kMlpOut, hb_.data(), m, I);
    if (gs[1] > 0) fake_quant_rows(hb_.data(), m, I, gs[1], {}, ename + ".mlp_out");
    linear(hb_.data(), m, ex.w2, Tensor{}, moe_y_.data());
    for (int i = 0; i < m; ++i) {
      const auto [t, wt] = moe_rows_[static_cast<size_t>(i)];
      float* o = out + static_cast<size_t>(t) * D;
      const float* y = &moe_y_[static_cast<size_t>(i) * D];
      for (int j = 0; j < D; ++j) o[j] += y[j] * wt;
    }
  }
}

void Transformer::logits(const float* hidden, int rows, float* out) const {
  linear(hidden, rows, w_->lm_head, Tensor{}, out);
}

void Transformer::final_logits(float* x, int rows, float* out) const {
  rmsnorm(x, w_->final_norm.f32("final norm"), rows, w_->config.dim, x);
  logits(x, rows, out);
}

std::vector<float> Transformer::forward(const int* tokens, int n, int pos) {
  const float* h = forward_hidden(tokens, n, pos);
  std::vector<float> out(static_cast<size_t>(n) * w_->config.vocab_size);
  logits(h, n, out.data());
  return out;
}

const float* Transformer::decode(int token, int pos) {
  const float* h = forward_hidden(&token, 1, pos);
  logits_.resize(static_cast<size_t>(w_->config.vocab_size));
  logits(h, 1, logits_.data());
  return logits_.data();
}

}  // namespace scalesweep::model

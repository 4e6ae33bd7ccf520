// Tests of GPTQ/LDLQ with fixed block scales against a plain sequential double-precision
// implementation of the same algorithm (no blocking, no BLAS, no LAPACK), written here.
#include "scalesweep/gptq/gptq.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "scalesweep/format/minifloat.h"

namespace scalesweep::gptq {
namespace {

struct Problem {
  int64_t rows, cols, tokens;
  std::vector<float> w;
  std::vector<float> x;     // [tokens, cols]
  std::vector<double> xtx;  // [cols, cols]
};

// Correlated inputs: x = z * A + per-channel scale (some channels much larger), heavy tails.
Problem make_problem(int64_t rows, int64_t cols, int64_t tokens, uint32_t seed,
                     const std::vector<int64_t>& dead = {}) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::student_t_distribution<float> td(4.f);
  Problem p{rows, cols, tokens, {}, {}, {}};
  p.w.resize(rows * cols);
  for (auto& v : p.w) v = 0.05f * td(rng);
  std::vector<float> a(cols * cols), chs(cols);
  for (auto& v : a) v = nd(rng) / std::sqrt(static_cast<float>(cols));
  for (int64_t j = 0; j < cols; ++j) a[j * cols + j] += 1.0f;
  for (int64_t j = 0; j < cols; ++j) chs[j] = std::exp(1.2f * nd(rng));
  p.x.assign(tokens * cols, 0.f);
  std::vector<float> z(cols);
  for (int64_t t = 0; t < tokens; ++t) {
    for (auto& v : z) v = nd(rng);
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t i = 0; i < cols; ++i) s += z[i] * a[i * cols + j];
      p.x[t * cols + j] = static_cast<float>(s) * chs[j];
    }
  }
  for (int64_t d : dead)
    for (int64_t t = 0; t < tokens; ++t) p.x[t * cols + d] = 0.f;
  p.xtx.assign(cols * cols, 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j)
        p.xtx[i * cols + j] += static_cast<double>(p.x[t * cols + i]) * p.x[t * cols + j];
  return p;
}

uint8_t nib(const QuantizedTensor& q, int64_t r, int64_t c) {
  const uint8_t b = q.codes[r * q.packed_cols() + c / 2];
  return (c & 1) ? (b >> 4) : (b & 15);
}

// Plain sequential reference: H, dead columns, same selector scales (scalesweep::quantize),
// damping, descending-diag order, Cholesky by hand, column-by-column full updates. Dynamic
// timing: each block's scales chosen by select_block_scale from the fully updated values when
// the first of its columns is reached.
QuantizedTensor reference_gptq(const Problem& p, const GptqConfig& cfg) {
  const int64_t n = p.rows, k = p.cols;
  std::vector<double> h(k * k);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      h[i * k + j] = 2.0 / p.tokens * p.xtx[std::min(i, j) * k + std::max(i, j)];
  std::vector<float> w0 = p.w;
  for (int64_t j = 0; j < k; ++j)
    if (h[j * k + j] == 0) {
      h[j * k + j] = 1;
      for (int64_t r = 0; r < n; ++r) w0[r * k + j] = 0;
    }
  std::vector<float> imp(k);
  double mean = 0;
  for (int64_t j = 0; j < k; ++j) {
    imp[j] = static_cast<float>(h[j * k + j]);
    mean += h[j * k + j];
  }
  mean /= k;
  Importance im;
  if (method_is_weighted(cfg.quant.selector.method)) im = {ImportanceKind::kPerColumn, imp.data()};
  QuantizedTensor q = quantize(w0.data(), n, k, im, cfg.quant, "ref");
  std::fill(q.codes.begin(), q.codes.end(), 0);
  std::vector<int64_t> perm(k);
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<double> d0(k);
  for (int64_t j = 0; j < k; ++j) d0[j] = h[j * k + j];
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return d0[a] > d0[b]; });
  std::vector<double> hp(k * k);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) hp[i * k + j] = h[perm[i] * k + perm[j]];
  for (int64_t i = 0; i < k; ++i) hp[i * k + i] += cfg.damp * mean;
  auto chol = [k](const std::vector<double>& a) {  // lower L, a = L L^T
    std::vector<double> l(k * k, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      double s = a[j * k + j];
      for (int64_t m = 0; m < j; ++m) s -= l[j * k + m] * l[j * k + m];
      if (!(s > 0)) throw std::runtime_error("reference: not positive definite");
      l[j * k + j] = std::sqrt(s);
      for (int64_t i = j + 1; i < k; ++i) {
        double t = a[i * k + j];
        for (int64_t m = 0; m < j; ++m) t -= l[i * k + m] * l[j * k + m];
        l[i * k + j] = t / l[j * k + j];
      }
    }
    return l;
  };
  const std::vector<double> l = chol(hp);
  std::vector<double> li(k * k, 0.0);  // L^-1, lower
  for (int64_t j = 0; j < k; ++j) {
    li[j * k + j] = 1.0 / l[j * k + j];
    for (int64_t i = j + 1; i < k; ++i) {
      double s = 0;
      for (int64_t m = j; m < i; ++m) s += l[i * k + m] * li[m * k + j];
      li[i * k + j] = -s / l[i * k + i];
    }
  }
  std::vector<double> hinv(k * k, 0.0);  // L^-T L^-1
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t m = std::max(i, j); m < k; ++m) s += li[m * k + i] * li[m * k + j];
      hinv[i * k + j] = s;
    }
  const std::vector<double> l2 = chol(hinv);  // U = L2^T
  auto U = [&](int64_t i, int64_t j) { return l2[j * k + i]; };
  std::vector<double> wp(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) wp[r * k + i] = w0[r * k + perm[i]];
  const int64_t bpr = q.blocks_per_row();
  const ScaleFormat sf = scale_format_of(q.format);
  const bool dynamic = cfg.scale_timing == ScaleTiming::kDynamic;
  std::vector<float> dimp(imp);  // dynamic importance
  if (dynamic && cfg.importance == DynamicImportance::kObs)
    for (int64_t i = 0; i < k; ++i) dimp[perm[i]] = static_cast<float>(1.0 / (U(i, i) * U(i, i)));
  std::vector<int64_t> pos(k);
  for (int64_t i = 0; i < k; ++i) pos[perm[i]] = i;
  std::vector<bool> chosen(bpr, false);
  SelectorConfig sel = cfg.quant.selector;
  sel.scale_format = sf;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t c = perm[i];
    const int64_t blk = c / q.block;
    if (dynamic && !chosen[blk]) {
      chosen[blk] = true;
      const int64_t c0 = blk * q.block;
      const int nb = static_cast<int>(std::min<int64_t>(q.block, k - c0));
      for (int64_t r = 0; r < n; ++r) {
        float y[64];
        for (int t = 0; t < nb; ++t)
          y[t] = static_cast<float>(wp[r * k + pos[c0 + t]]) * q.global_scale;
        q.scales[r * bpr + blk] =
            select_block_scale(y, method_is_weighted(sel.method) ? dimp.data() + c0 : nullptr, nb,
                               sel)
                .pattern;
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      const float s = scale_value(q.scales[r * bpr + blk], sf);
      const float y = static_cast<float>(wp[r * k + i]) * q.global_scale;
      const uint8_t code = fp4_code(y, s);
      const float deq = (format::kFp4Values.v[code] * s) / q.global_scale;
      uint8_t& b = q.codes[r * q.packed_cols() + c / 2];
      b = (c & 1) ? static_cast<uint8_t>((b & 15) | (code << 4))
                  : static_cast<uint8_t>((b & 0xF0) | code);
      const double e = (wp[r * k + i] - deq) / U(i, i);
      for (int64_t j = i + 1; j < k; ++j) wp[r * k + j] -= e * U(i, j);
    }
  }
  return q;
}

// ||X W^T - X W_hat^T||^2 computed directly from the inputs.
double output_error(const Problem& p, const std::vector<float>& wh) {
  double tot = 0;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t r = 0; r < p.rows; ++r) {
      double s = 0;
      for (int64_t j = 0; j < p.cols; ++j)
        s += static_cast<double>(p.x[t * p.cols + j]) * (p.w[r * p.cols + j] - wh[r * p.cols + j]);
      tot += s * s;
    }
  return tot;
}

GptqConfig make_cfg(Method m) {
  GptqConfig c;
  c.quant.selector.method = m;
  c.quant.threads = 1;
  return c;
}

int64_t count_mismatch(const QuantizedTensor& a, const QuantizedTensor& b) {
  int64_t mm = 0;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) mm += nib(a, r, c) != nib(b, r, c);
  return mm;
}

TEST(Gptq, MatchesSequentialReference) {
  int64_t total = 0, mism = 0;
  for (Method m : {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse}) {
    for (auto [rows, cols, seed] : {std::tuple<int64_t, int64_t, uint32_t>{24, 64, 1},
                                    {17, 72, 2},    // partial last block (72 = 4*16 + 8)
                                    {9, 37, 3}}) {  // odd K: packed padding nibble
      const Problem p = make_problem(rows, cols, 3 * cols, seed, {5});
      for (int bsz : {128, 16, 5, 0}) {
        GptqConfig cfg = make_cfg(m);
        cfg.block_size = bsz;
        GptqStats st;
        cfg.compute_losses = true;
        const QuantizedTensor got =
            gptq_quantize(p.w.data(), rows, cols, p.xtx.data(), p.tokens, cfg, "w", &st);
        const QuantizedTensor ref = reference_gptq(p, cfg);
        ASSERT_EQ(got.scales, ref.scales);
        ASSERT_EQ(got.global_scale, ref.global_scale);
        const int64_t mm = count_mismatch(got, ref);
        total += rows * cols;
        mism += mm;
        if (mm) {  // rounding-order differences may flip an exact tie: losses must agree
          const auto a = dequantize(got), b = dequantize(ref);
          const double la = hessian_loss(p.w.data(), a.data(), rows, cols, p.xtx.data(), p.tokens);
          const double lb = hessian_loss(p.w.data(), b.data(), rows, cols, p.xtx.data(), p.tokens);
          EXPECT_NEAR(la, lb, 1e-9 * lb) << kMethodNames.name(m) << " bs=" << bsz;
        }
        EXPECT_EQ(st.dead_columns, 1);
        // the padding nibble of an odd K stays 0
        if (cols & 1) {
          for (int64_t r = 0; r < rows; ++r) {
            EXPECT_EQ(got.codes[r * got.packed_cols() + cols / 2] >> 4, 0);
          }
        }
      }
    }
  }
  EXPECT_LE(mism, total / 10000) << "codes differ from the sequential reference";
  std::printf("sequential reference: %lld of %lld codes differ\n", (long long)mism,
              (long long)total);
}

TEST(Gptq, ScalesAreTheRtnScales) {
  const Problem p = make_problem(32, 96, 300, 7);
  GptqConfig cfg = make_cfg(Method::kSweepWmse);
  const QuantizedTensor g = gptq_quantize(p.w.data(), 32, 96, p.xtx.data(), p.tokens, cfg, "w");
  std::vector<float> imp(96);
  for (int j = 0; j < 96; ++j) imp[j] = static_cast<float>(2.0 / p.tokens * p.xtx[j * 96 + j]);
  const QuantizedTensor r =
      quantize(p.w.data(), 32, 96, {ImportanceKind::kPerColumn, imp.data()}, cfg.quant, "w");
  EXPECT_EQ(g.scales, r.scales);
  EXPECT_EQ(g.global_scale, r.global_scale);
  EXPECT_NE(g.codes, r.codes);  // GPTQ moved some codes
}

TEST(Gptq, LowersLayerOutputErrorVsRtnForEverySelector) {
  const Problem p = make_problem(48, 128, 512, 11);
  for (Method m :
       {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
        Method::kExhaustiveMse, Method::kExhaustiveWmse, Method::kOptFp8Mse, Method::kOptFp8Wmse}) {
    GptqConfig cfg = make_cfg(m);
    cfg.compute_losses = true;
    GptqStats st;
    const QuantizedTensor g =
        gptq_quantize(p.w.data(), p.rows, p.cols, p.xtx.data(), p.tokens, cfg, "w", &st);
    std::vector<float> imp(p.cols);
    for (int64_t j = 0; j < p.cols; ++j)
      imp[j] = static_cast<float>(2.0 / p.tokens * p.xtx[j * p.cols + j]);
    Importance im;
    if (method_is_weighted(m)) im = {ImportanceKind::kPerColumn, imp.data()};
    const QuantizedTensor r = quantize(p.w.data(), p.rows, p.cols, im, cfg.quant, "w");
    const double eg = output_error(p, dequantize(g)), er = output_error(p, dequantize(r));
    EXPECT_LT(eg, 0.9 * er) << kMethodNames.name(m);
    // The proxy loss is the same quantity up to the factor 2/n.
    EXPECT_NEAR(st.loss_gptq, 2.0 / p.tokens * eg, 1e-6 * st.loss_gptq) << kMethodNames.name(m);
    EXPECT_NEAR(st.loss_rtn, 2.0 / p.tokens * er, 1e-6 * st.loss_rtn) << kMethodNames.name(m);
    std::printf("%-16s ||XW-XW^||^2  RTN %.4e  GPTQ %.4e  (%.1f%%)\n",
                std::string(kMethodNames.name(m)).c_str(), er, eg, 100.0 * eg / er);
  }
}

TEST(Gptq, BlockedEqualsUnblocked) {
  const Problem p = make_problem(40, 200, 400, 5);
  GptqConfig a = make_cfg(Method::kSweepMse), b = a;
  b.block_size = 0;
  const auto qa = gptq_quantize(p.w.data(), 40, 200, p.xtx.data(), p.tokens, a, "w");
  const auto qb = gptq_quantize(p.w.data(), 40, 200, p.xtx.data(), p.tokens, b, "w");
  EXPECT_LE(count_mismatch(qa, qb), 1);
}

TEST(Gptq, NoActOrderStillValid) {
  const Problem p = make_problem(16, 64, 200, 9);
  GptqConfig cfg = make_cfg(Method::kSweepMse);
  cfg.act_order = false;
  cfg.compute_losses = true;
  GptqStats st;
  gptq_quantize(p.w.data(), 16, 64, p.xtx.data(), p.tokens, cfg, "w", &st);
  EXPECT_LT(st.loss_gptq, st.loss_rtn);
}

TEST(Gptq, DeadColumnsAreZero) {
  const Problem p = make_problem(8, 32, 100, 4, {0, 17, 31});
  GptqConfig cfg = make_cfg(Method::kSweepMse);
  GptqStats st;
  const auto q = gptq_quantize(p.w.data(), 8, 32, p.xtx.data(), p.tokens, cfg, "w", &st);
  EXPECT_EQ(st.dead_columns, 3);
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c : {0, 17, 31}) EXPECT_EQ(nib(q, r, c) & 7, 0) << r << "," << c;
}

// Hazards: all-zero activations (every column dead: H = 0), all-zero weights, and weights with
// amax near FLT_MAX (error feedback pushes values past the first amax). Outputs stay finite.
// An all-zero Hessian (every column dead) and all-zero weights quantize to zeros under cfg.
void expect_dead_and_zero_inputs_give_zeros(const Problem& p, const GptqConfig& cfg) {
  GptqStats st;
  const std::vector<double> h0(32 * 32, 0.0);
  const auto q0 = gptq_quantize(p.w.data(), 8, 32, h0.data(), p.tokens, cfg, "w", &st);
  EXPECT_EQ(st.dead_columns, 32);
  EXPECT_TRUE(std::isfinite(q0.global_scale) && q0.global_scale > 0);
  for (float v : dequantize(q0)) EXPECT_EQ(v, 0.0f);
  const std::vector<float> wz(8 * 32, 0.0f);
  const auto qz = gptq_quantize(wz.data(), 8, 32, p.xtx.data(), p.tokens, cfg, "w");
  EXPECT_EQ(qz.global_scale, 1.0f);
  for (float v : dequantize(qz)) EXPECT_EQ(v, 0.0f);
}

// p's weights scaled to a largest magnitude of 3e38 quantize under cfg to a finite positive
// global scale, no NaN value (dequantize saturates the rest) and no NaN scale pattern.
void expect_finite_near_flt_max(const Problem& p, const GptqConfig& cfg, const std::string& what) {
  std::vector<float> big = p.w;
  float a = 0;
  for (float v : big) a = std::max(a, std::fabs(v));
  for (float& v : big) v = v / a * 3.0e38f;
  const auto qb = gptq_quantize(big.data(), 8, 32, p.xtx.data(), p.tokens, cfg, "w");
  EXPECT_TRUE(std::isfinite(qb.global_scale) && qb.global_scale > 0) << what;
  int bad = 0;
  for (float v : dequantize(qb)) bad += !std::isfinite(v);
  EXPECT_EQ(bad, 0) << what;
  const bool nv = cfg.quant.format == TensorFormat::kNvfp4;
  for (uint8_t sb : qb.scales) EXPECT_NE(nv ? (sb & 0x7F) : sb, nv ? 0x7F : 0xFF) << what;
}

TEST(Gptq, HazardsGiveFiniteOutputs) {
  const Problem p = make_problem(8, 32, 100, 5);
  expect_dead_and_zero_inputs_give_zeros(p, make_cfg(Method::kSweepMse));
  for (const Method m : {Method::kAbsMax, Method::kSweepMse, Method::kExhaustiveMse})
    expect_finite_near_flt_max(p, make_cfg(m), std::string(kMethodNames.name(m)));
}

TEST(Gptq, Mxfp4) {
  const Problem p = make_problem(16, 64, 200, 12);
  GptqConfig cfg = make_cfg(Method::kSweepMse);
  cfg.quant.format = TensorFormat::kMxfp4;
  cfg.quant.block = 32;
  cfg.quant.selector.scale_format = ScaleFormat::kUE8M0;
  cfg.compute_losses = true;
  GptqStats st;
  const auto q = gptq_quantize(p.w.data(), 16, 64, p.xtx.data(), p.tokens, cfg, "w", &st);
  EXPECT_EQ(q.global_scale, 1.0f);
  EXPECT_LT(st.loss_gptq, st.loss_rtn);
}

TEST(Gptq, BadInputs) {
  Problem p = make_problem(4, 16, 40, 3);
  GptqConfig cfg = make_cfg(Method::kSweepMse);
  auto call = [&](const Problem& q, int64_t n) {
    return gptq_quantize(q.w.data(), q.rows, q.cols, q.xtx.data(), n, cfg, "layers.0.wq");
  };
  EXPECT_THROW(call(p, 0), std::invalid_argument);
  Problem bad = p;
  bad.w[2 * 16 + 3] = NAN;
  try {
    call(bad, bad.tokens);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.wq"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
  bad = p;
  bad.xtx[1 * 16 + 4] = INFINITY;
  EXPECT_THROW(call(bad, bad.tokens), std::invalid_argument);
  bad = p;
  bad.xtx[3 * 16 + 3] = -1;
  EXPECT_THROW(call(bad, bad.tokens), std::invalid_argument);
  // Indefinite: [[1, 2], [2, 1]] has eigenvalue -1; 1% damping does not fix it.
  std::vector<float> w2 = {0.1f, -0.2f, 0.3f, 0.4f};
  std::vector<double> h2 = {1, 2, 2, 1};
  EXPECT_THROW(gptq_quantize(w2.data(), 2, 2, h2.data(), 2, cfg, "x"), std::runtime_error);
  GptqConfig c2 = cfg;
  c2.damp = 0;
  EXPECT_THROW(gptq_quantize(p.w.data(), 4, 16, p.xtx.data(), p.tokens, c2, "x"),
               std::invalid_argument);
  c2 = cfg;
  c2.quant.selector.method = Method::kOptFp32;
  EXPECT_THROW(gptq_quantize(p.w.data(), 4, 16, p.xtx.data(), p.tokens, c2, "x"),
               std::invalid_argument);
}

TEST(Gptq, BlockHessianMethodsTakeTheirScalesFromHsDiagonalBlocks) {
  // Static scales for sweep-hessian / exhaustive-hessian: quantize() of the dead-zeroed weight
  // with H's diagonal 16x16 blocks (H = 2/n XtX); GPTQ then lowers the proxy loss.
  Problem p = make_problem(24, 48, 256, 21, {5});
  for (Method m : {Method::kSweepHessian, Method::kExhaustiveHessian}) {
    GptqConfig cfg;
    cfg.quant.selector.method = m;
    cfg.compute_losses = true;
    GptqStats st;
    const QuantizedTensor q =
        gptq_quantize(p.w.data(), p.rows, p.cols, p.xtx.data(), p.tokens, cfg, "w", &st);
    std::vector<double> h(p.cols * p.cols);
    for (int64_t i = 0; i < p.cols; ++i)
      for (int64_t j = 0; j < p.cols; ++j)
        h[i * p.cols + j] = 2.0 / p.tokens * p.xtx[std::min(i, j) * p.cols + std::max(i, j)];
    h[5 * p.cols + 5] = 1.0;  // the dead column, as GPTQ fixes it
    std::vector<float> w0 = p.w;
    for (int64_t r = 0; r < p.rows; ++r) w0[r * p.cols + 5] = 0.0f;
    const std::vector<double> hb = block_hessians(h.data(), p.cols, 16);
    const QuantizedTensor rtn =
        quantize(w0.data(), p.rows, p.cols, {ImportanceKind::kBlockHessian, nullptr, hb.data(), 16},
                 cfg.quant, "w");
    EXPECT_EQ(q.scales, rtn.scales) << kMethodNames.name(m);
    EXPECT_EQ(q.global_scale, rtn.global_scale);
    EXPECT_LT(st.loss_gptq, st.loss_rtn) << kMethodNames.name(m);
  }
}

// ---- dynamic scales (ScaleTiming::kDynamic) ----

GptqConfig make_dyn(Method m, DynamicImportance di, TensorFormat f = TensorFormat::kNvfp4) {
  GptqConfig c = make_cfg(m);
  c.scale_timing = ScaleTiming::kDynamic;
  c.importance = di;
  c.quant.format = f;
  c.quant.block = f == TensorFormat::kMxfp4 ? 32 : 16;
  return c;
}

int64_t count_scale_mismatch(const QuantizedTensor& a, const QuantizedTensor& b) {
  int64_t mm = 0;
  for (size_t i = 0; i < a.scales.size(); ++i) mm += a.scales[i] != b.scales[i];
  return mm;
}

std::string label(const GptqConfig& c) {
  return std::string(kTensorFormatNames.name(c.quant.format)) + " " +
         std::string(kMethodNames.name(c.quant.selector.method)) + " " +
         std::string(kScaleTimingNames.name(c.scale_timing)) + " " +
         std::string(kDynamicImportanceNames.name(c.importance)) +
         (c.act_order ? " act-order" : " natural") + " bs=" + std::to_string(c.block_size);
}

TEST(GptqDynamic, NameTables) {
  EXPECT_EQ(kScaleTimingNames.values(),
            (std::vector<ScaleTiming>{ScaleTiming::kStatic, ScaleTiming::kDynamic}));
  EXPECT_EQ(kScaleTimingNames.name(ScaleTiming::kStatic), "static");
  EXPECT_EQ(kScaleTimingNames.parse("dynamic"), ScaleTiming::kDynamic);
  EXPECT_EQ(
      kDynamicImportanceNames.values(),
      (std::vector<DynamicImportance>{DynamicImportance::kHessianDiag, DynamicImportance::kObs}));
  EXPECT_EQ(kDynamicImportanceNames.name(DynamicImportance::kHessianDiag), "hdiag");
  EXPECT_EQ(kDynamicImportanceNames.parse("obs"), DynamicImportance::kObs);
  try {
    kScaleTimingNames.parse("late");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown GPTQ scale timing 'late' (accepted: static, dynamic)");
  }
  try {
    kDynamicImportanceNames.parse("HDIAG");  // case matters
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown GPTQ importance 'HDIAG' (accepted: hdiag, obs)");
  }
}

// Against the plain sequential reference (act-order), every selector, both importances.
TEST(GptqDynamic, MatchesSequentialReference) {
  int64_t total = 0, mism = 0, blocks = 0, smism = 0;
  for (Method m :
       {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
        Method::kExhaustiveMse, Method::kExhaustiveWmse, Method::kOptFp8Mse, Method::kOptFp8Wmse})
    for (DynamicImportance di : {DynamicImportance::kHessianDiag, DynamicImportance::kObs}) {
      if (!method_is_weighted(m) && di == DynamicImportance::kObs) continue;  // unused
      for (auto [rows, cols, seed] : {std::tuple<int64_t, int64_t, uint32_t>{24, 64, 1},
                                      {17, 72, 2},    // partial last block (72 = 4*16 + 8)
                                      {9, 37, 3}}) {  // odd K: packed padding nibble
        const Problem p = make_problem(rows, cols, 3 * cols, seed, {5});
        for (int bsz : {128, 16, 5, 0}) {
          GptqConfig cfg = make_dyn(m, di);
          cfg.block_size = bsz;
          const QuantizedTensor got =
              gptq_quantize(p.w.data(), rows, cols, p.xtx.data(), p.tokens, cfg, "w");
          const QuantizedTensor ref = reference_gptq(p, cfg);
          ASSERT_EQ(got.global_scale, ref.global_scale);
          const int64_t mm = count_mismatch(got, ref), sm = count_scale_mismatch(got, ref);
          total += rows * cols;
          mism += mm;
          blocks += static_cast<int64_t>(got.scales.size());
          smism += sm;
          if (mm || sm) {  // a rounding-order difference may flip an exact tie
            const auto a = dequantize(got), b = dequantize(ref);
            const double la =
                hessian_loss(p.w.data(), a.data(), rows, cols, p.xtx.data(), p.tokens);
            const double lb =
                hessian_loss(p.w.data(), b.data(), rows, cols, p.xtx.data(), p.tokens);
            EXPECT_NEAR(la, lb, 1e-9 * lb) << label(cfg);
          }
          if (cols & 1) {
            for (int64_t r = 0; r < rows; ++r)
              EXPECT_EQ(got.codes[r * got.packed_cols() + cols / 2] >> 4, 0);
          }
        }
      }
    }
  EXPECT_LE(mism, total / 10000) << "codes differ from the sequential reference";
  EXPECT_LE(smism, blocks / 10000) << "scales differ from the sequential reference";
  std::printf("dynamic, sequential reference: %lld of %lld codes, %lld of %lld scales differ\n",
              (long long)mism, (long long)total, (long long)smism, (long long)blocks);
}

// The lazy-batch path against the unblocked reference path (block_size = 0), dynamic scales:
// NVFP4 and MXFP4, act-order and natural order, K = 200 (a partial last block for 16 and 32),
// dead columns, batch sizes that split scale blocks. As the static BlockedEqualsUnblocked:
// the scales are identical and at most one code differs per pair (the GEMM sums in another
// order than the rank-1 updates; an exact FP4 tie may flip).
TEST(GptqDynamic, BlockedEqualsUnblocked) {
  const Problem p = make_problem(40, 200, 400, 5, {3, 77, 199});
  int64_t pairs = 0, differing = 0;
  for (TensorFormat f : {TensorFormat::kNvfp4, TensorFormat::kMxfp4})
    for (Method m : {Method::kSweepMse, Method::kSweepWmse})
      for (DynamicImportance di : {DynamicImportance::kHessianDiag, DynamicImportance::kObs})
        for (bool act : {true, false}) {
          GptqConfig b = make_dyn(m, di, f);
          b.act_order = act;
          b.block_size = 0;
          const auto qb = gptq_quantize(p.w.data(), 40, 200, p.xtx.data(), p.tokens, b, "w");
          for (int bsz : {128, 16, 5, 37}) {
            GptqConfig a = b;
            a.block_size = bsz;
            const auto qa = gptq_quantize(p.w.data(), 40, 200, p.xtx.data(), p.tokens, a, "w");
            EXPECT_EQ(qa.global_scale, qb.global_scale) << label(a);
            EXPECT_EQ(qa.scales, qb.scales) << label(a);
            const int64_t mm = count_mismatch(qa, qb);
            EXPECT_LE(mm, 1) << label(a);
            ++pairs;
            differing += mm > 0;
          }
        }
  std::printf("dynamic blocked vs unblocked: %lld of %lld pairs differ in a code\n",
              (long long)differing, (long long)pairs);
}

// XtX diagonal: uncorrelated inputs, U diagonal, no cross-column update, so GPTQ cannot move
// a weight and dynamic scales see the original weights: the result is quantize()'s (RTN) with
// the same importance, byte for byte (hdiag: H_jj; obs: 1 / U_jj^2 = H_jj + damping).
TEST(GptqDynamic, DiagonalHessianGivesTheRtnResult) {
  Problem p = make_problem(24, 72, 300, 21, {4, 40});
  const int64_t k = p.cols;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      if (i != j) p.xtx[i * k + j] = 0.0;
  std::vector<float> w0 = p.w;
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t d : {4, 40}) w0[r * k + d] = 0.0f;
  int64_t weights_matter = 0;
  for (TensorFormat f : {TensorFormat::kNvfp4, TensorFormat::kMxfp4})
    for (Method m :
         {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
          Method::kExhaustiveMse, Method::kExhaustiveWmse, Method::kOptFp8Mse, Method::kOptFp8Wmse})
      for (bool act : {true, false}) {
        QuantizedTensor by_imp[2];
        for (DynamicImportance di : {DynamicImportance::kHessianDiag, DynamicImportance::kObs}) {
          GptqConfig cfg = make_dyn(m, di, f);
          cfg.act_order = act;
          cfg.damp = 0.3;  // large, so that obs and hdiag weigh the columns differently
          GptqStats st;
          const QuantizedTensor got =
              gptq_quantize(p.w.data(), p.rows, k, p.xtx.data(), p.tokens, cfg, "w", &st);
          std::vector<float> imp(k);
          for (int64_t j = 0; j < k; ++j) {
            double h = 2.0 / static_cast<double>(p.tokens) * p.xtx[j * k + j];
            if (h == 0.0) h = 1.0;
            imp[j] = static_cast<float>(di == DynamicImportance::kObs ? h + st.damp_abs : h);
          }
          Importance im;
          if (method_is_weighted(m)) im = {ImportanceKind::kPerColumn, imp.data()};
          const QuantizedTensor rtn = quantize(w0.data(), p.rows, k, im, cfg.quant, "w");
          EXPECT_EQ(got.global_scale, rtn.global_scale) << label(cfg);
          EXPECT_EQ(got.scales, rtn.scales) << label(cfg);
          EXPECT_EQ(got.codes, rtn.codes) << label(cfg);
          by_imp[di == DynamicImportance::kObs] = got;
        }
        if (method_is_weighted(m))
          weights_matter += by_imp[0].scales != by_imp[1].scales;
        else
          EXPECT_EQ(by_imp[0].codes, by_imp[1].codes);  // the importance is not read
      }
  // The two importances chose different scales somewhere (else the check above would not
  // tell them apart).
  EXPECT_GT(weights_matter, 0);
}

// The block-Hessian methods choose dynamic scales with H's undamped diagonal blocks: with XtX
// diagonal (no cross-column update) that is quantize() with those blocks, byte for byte; with
// correlated inputs the dynamic result differs from the static one and lowers the proxy loss.
TEST(GptqDynamic, BlockHessianMethodsUseHsDiagonalBlocks) {
  Problem p = make_problem(24, 72, 300, 23, {7});
  const int64_t k = p.cols;
  Problem d = p;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      if (i != j) d.xtx[i * k + j] = 0.0;
  std::vector<double> h(k * k, 0.0);
  for (int64_t j = 0; j < k; ++j)
    h[j * k + j] = d.xtx[j * k + j] == 0.0 ? 1.0 : 2.0 / d.tokens * d.xtx[j * k + j];
  const std::vector<double> hb = block_hessians(h.data(), k, 16);
  std::vector<float> w0 = p.w;
  for (int64_t r = 0; r < p.rows; ++r) w0[r * k + 7] = 0.0f;
  for (Method m : {Method::kSweepHessian, Method::kExhaustiveHessian}) {
    GptqConfig cfg = make_dyn(m, DynamicImportance::kObs);
    const QuantizedTensor got =
        gptq_quantize(p.w.data(), p.rows, k, d.xtx.data(), p.tokens, cfg, "w");
    const QuantizedTensor rtn =
        quantize(w0.data(), p.rows, k, {ImportanceKind::kBlockHessian, nullptr, hb.data(), 16},
                 cfg.quant, "w");
    EXPECT_EQ(got.scales, rtn.scales) << kMethodNames.name(m);
    EXPECT_EQ(got.codes, rtn.codes) << kMethodNames.name(m);
    GptqStats sd, ss;
    cfg.compute_losses = true;
    const QuantizedTensor dyn =
        gptq_quantize(p.w.data(), p.rows, k, p.xtx.data(), p.tokens, cfg, "w", &sd);
    GptqConfig cs = cfg;
    cs.scale_timing = ScaleTiming::kStatic;
    const QuantizedTensor stat =
        gptq_quantize(p.w.data(), p.rows, k, p.xtx.data(), p.tokens, cs, "w", &ss);
    EXPECT_NE(dyn.scales, stat.scales) << kMethodNames.name(m);
    EXPECT_LT(sd.loss_gptq, ss.loss_gptq) << kMethodNames.name(m);
  }
}

// Every selector works with dynamic scales and beats RTN on the layer output; opt-fp32 stays
// refused.
TEST(GptqDynamic, EverySelectorLowersLayerOutputErrorVsRtn) {
  const Problem p = make_problem(48, 128, 512, 11);
  for (Method m :
       {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
        Method::kExhaustiveMse, Method::kExhaustiveWmse, Method::kOptFp8Mse, Method::kOptFp8Wmse})
    for (DynamicImportance di : {DynamicImportance::kHessianDiag, DynamicImportance::kObs}) {
      GptqConfig cfg = make_dyn(m, di);
      cfg.compute_losses = true;
      GptqStats st;
      const QuantizedTensor g =
          gptq_quantize(p.w.data(), p.rows, p.cols, p.xtx.data(), p.tokens, cfg, "w", &st);
      const double eg = output_error(p, dequantize(g));
      EXPECT_NEAR(st.loss_gptq, 2.0 / p.tokens * eg, 1e-6 * st.loss_gptq) << label(cfg);
      EXPECT_LT(st.loss_gptq, 0.9 * st.loss_rtn) << label(cfg);
    }
  GptqConfig bad = make_dyn(Method::kOptFp32, DynamicImportance::kObs);
  EXPECT_THROW(gptq_quantize(p.w.data(), p.rows, p.cols, p.xtx.data(), p.tokens, bad, "w"),
               std::invalid_argument);
}

// The point of dynamic scales: on correlated inputs the proxy loss tr(D H D^T) is lower than
// with static scales, on average over seeds (geometric mean of dynamic/static over 8
// problems below 1 - margin; single problems may go either way).
TEST(GptqDynamic, LowersProxyLossVsStaticOnAverage) {
  constexpr int kSeeds = 8;
  for (Method m : {Method::kSweepMse, Method::kSweepWmse})
    for (DynamicImportance di : {DynamicImportance::kHessianDiag, DynamicImportance::kObs}) {
      if (!method_is_weighted(m) && di == DynamicImportance::kObs) continue;
      double log_sum = 0;
      int wins = 0;
      for (int seed = 0; seed < kSeeds; ++seed) {
        const Problem p = make_problem(64, 256, 768, 100 + static_cast<uint32_t>(seed));
        GptqConfig st = make_cfg(m), dy = make_dyn(m, di);
        st.compute_losses = dy.compute_losses = true;
        GptqStats ss, sd;
        gptq_quantize(p.w.data(), p.rows, p.cols, p.xtx.data(), p.tokens, st, "w", &ss);
        gptq_quantize(p.w.data(), p.rows, p.cols, p.xtx.data(), p.tokens, dy, "w", &sd);
        log_sum += std::log(sd.loss_gptq / ss.loss_gptq);
        wins += sd.loss_gptq < ss.loss_gptq;
      }
      const double ratio = std::exp(log_sum / kSeeds);
      std::printf("%-10s %-5s dynamic/static proxy loss: geometric mean %.4f, lower in %d of %d\n",
                  std::string(kMethodNames.name(m)).c_str(),
                  std::string(kDynamicImportanceNames.name(di)).c_str(), ratio, wins, kSeeds);
      EXPECT_LT(ratio, 0.98) << kMethodNames.name(m) << " " << kDynamicImportanceNames.name(di);
    }
}

// The static hazards with dynamic scales: every column dead, all-zero weights, and weights
// near FLT_MAX, whose error-compensated values pass the float range (the selection saturates
// them). Outputs stay finite.
TEST(GptqDynamic, HazardsGiveFiniteOutputs) {
  const Problem p = make_problem(8, 32, 100, 5);
  for (TensorFormat f : {TensorFormat::kNvfp4, TensorFormat::kMxfp4}) {
    expect_dead_and_zero_inputs_give_zeros(
        p, make_dyn(Method::kSweepWmse, DynamicImportance::kObs, f));
    for (const Method m :
         {Method::kAbsMax, Method::kSweepMse, Method::kSweepWmse, Method::kExhaustiveMse}) {
      const GptqConfig cfg = make_dyn(m, DynamicImportance::kObs, f);
      expect_finite_near_flt_max(p, cfg, label(cfg));
    }
  }
}

}  // namespace
}  // namespace scalesweep::gptq

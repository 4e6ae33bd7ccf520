// Tensor quantization: packing, partial blocks, global scale, dtypes, threads, validation,
// metrics, opt-fp32 and the SPEC reference figures.
#include "scalesweep/quant/quantize.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "quant/row_job.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/layout.h"

namespace scalesweep {
namespace {

using scalesweep::testing::randn;

QuantConfig cfg_for(Method m, int block = 16) {
  QuantConfig c;
  c.selector.method = m;
  c.block = block;
  if (m == Method::kSweep) c.selector.window = Window{-4, 4};
  return c;
}

// The importance a method reads in the sweeps over every method: for the *-hessian methods
// block Hessians (the diagonal 1 + c % 7 plus a rank-one correlation 0.3 * 1 1^T: positive
// definite), else `base` as given. Keep the returned object alive while `imp` is used.
struct MethodImportance {
  std::vector<double> h;
  Importance imp;
};
MethodImportance importance_for(Method m, const Importance& base, int64_t cols, int block) {
  MethodImportance r;
  r.imp = base;
  if (!method_uses_hessian(m)) return r;
  const int64_t nb = (cols + block - 1) / block;
  r.h.assign(static_cast<size_t>(nb * block * block), 0.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < block; ++i)
      for (int j = 0; j < block; ++j)
        r.h[(b * block + i) * block + j] =
            0.3 + (i == j ? 1.0 + static_cast<double>((b * block + i) % 7) : 0.0);
  r.imp = {ImportanceKind::kBlockHessian, nullptr, r.h.data(), block};
  return r;
}

std::string error_of(const std::function<void()>& f) {
  return scalesweep::testing::error_of<std::invalid_argument>(f, "(no exception)");
}

// Independent per-block recomputation of quantize(): y = fl(x * gs), select, fp4_code.
void expect_matches_blockwise(const std::vector<float>& x, int64_t rows, int64_t cols,
                              const QuantizedTensor& q, const QuantConfig& cfg, const float* wcol,
                              const double* hess = nullptr) {
  const ScaleFormat sf =
      cfg.format == TensorFormat::kMxfp4 ? ScaleFormat::kUE8M0 : ScaleFormat::kE4M3;
  SelectorConfig sc = cfg.selector;
  sc.scale_format = sf;
  const int64_t nb = q.blocks_per_row();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * cfg.block;
      const int n = static_cast<int>(std::min<int64_t>(cfg.block, cols - c0));
      std::vector<float> y(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) y[i] = x[r * cols + c0 + i] * q.global_scale;
      const BlockScale bs = hess ? select_block_scale_hessian(
                                       y.data(), hess + b * cfg.block * cfg.block, cfg.block, n, sc)
                                 : select_block_scale(y.data(), wcol ? wcol + c0 : nullptr, n, sc);
      ASSERT_EQ(q.scales[r * nb + b], bs.pattern) << "row " << r << " block " << b;
      const float s = scale_value(bs.pattern, sf);
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(packed_code(q.codes.data(), cols, r, c0 + i), fp4_code(y[i], s));
    }
    if (cols % 2) {
      ASSERT_EQ(q.codes[r * q.packed_cols() + cols / 2] >> 4, 0) << "padding";
    }
  }
}

TEST(Quantize, MatchesBlockwiseSelectionForEveryMethodWithPartialBlocks) {
  const int64_t rows = 7, cols = 61;  // odd K, partial last block for every block size
  std::vector<float> x = randn(rows * cols, 1);
  x[5] = 40.0f;  // an outlier
  std::vector<float> wcol(cols);
  for (int64_t c = 0; c < cols; ++c) wcol[c] = 0.1f + float(c % 7);
  const Importance imp{ImportanceKind::kPerColumn, wcol.data()};
  for (int block : {8, 16, 32, 64}) {
    for (Method m : kMethodNames.values()) {
      if (m == Method::kOptFp32) continue;
      const QuantConfig c = cfg_for(m, block);
      const MethodImportance mi = importance_for(m, imp, cols, block);
      const QuantizedTensor q = quantize(x.data(), rows, cols, mi.imp, c);
      EXPECT_EQ(q.rows, rows);
      EXPECT_EQ(q.cols, cols);
      EXPECT_EQ(q.codes.size(), size_t(rows * 31));
      EXPECT_EQ(q.scales.size(), size_t(rows * ((cols + block - 1) / block)));
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      EXPECT_EQ(q.global_scale, 6.0f * default_max_block_scale(m) / amax);
      const bool weighted = m == Method::kSweepWmse || m == Method::kExhaustiveWmse ||
                            m == Method::kOptFp8Wmse || m == Method::kSweep;
      expect_matches_blockwise(x, rows, cols, q, c, weighted ? wcol.data() : nullptr,
                               method_uses_hessian(m) ? mi.h.data() : nullptr);
    }
  }
}

TEST(Quantize, PartialBlockUsesItsRealLength) {
  // K = 20, b = 16: the last block has 4 elements {0.1, 0.2, 0.3, 0.4}; its scale must be the
  // one chosen for those 4 values alone (not padded with anything that changes amax/loss).
  std::vector<float> x(20, 0.0f);
  for (int i = 0; i < 16; ++i) x[i] = 10.0f * (i % 3 - 1);
  x[16] = 0.1f, x[17] = 0.2f, x[18] = 0.3f, x[19] = -0.4f;
  QuantConfig c = cfg_for(Method::kSweepMse);
  const QuantizedTensor q = quantize(x.data(), 1, 20, {}, c);
  float y[4];
  for (int i = 0; i < 4; ++i) y[i] = x[16 + i] * q.global_scale;
  EXPECT_EQ(q.scales[1], select_block_scale(y, nullptr, 4, c.selector).pattern);
  // Dequantized values of the partial block are close to the inputs.
  const std::vector<float> d = dequantize(q);
  for (int i = 16; i < 20; ++i) EXPECT_NEAR(d[i], x[i], 0.06) << i;
}

TEST(Quantize, NibbleOrderAndDequantizeFormula) {
  // One row [0.5, -1, 6, 3, 0] with gs from C = 256: a = 6 -> gs = 1536/6 = 256.
  const float x[5] = {0.5f, -1.0f, 6.0f, 3.0f, 0.0f};
  QuantConfig c = cfg_for(Method::kAbsMax);
  c.max_block_scale = 256.0f;
  const QuantizedTensor q = quantize(x, 1, 5, {}, c);
  EXPECT_EQ(q.global_scale, 256.0f);
  // y = {128, -256, 1536, 768, 0}; absmax s = rn(1536/6) = 256 (E4M3 pattern of 256).
  EXPECT_EQ(q.scales[0], format::E4M3::encode_rne(256.0f));
  // codes 0.5 -> 1, -1 -> 0xA, 6 -> 7, 3 -> 5, 0 -> 0; element 2i in the low nibble.
  ASSERT_EQ(q.codes.size(), 3u);
  EXPECT_EQ(q.codes[0], 0xA1);
  EXPECT_EQ(q.codes[1], 0x57);
  EXPECT_EQ(q.codes[2], 0x00);
  const std::vector<float> d = dequantize(q);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(d[i], x[i]);
  // x_hat = fl(q * s / gs): check one inexact case explicitly.
  const float xi[2] = {1.0f, 0.3f};
  const QuantizedTensor q2 = quantize(xi, 1, 2, {}, cfg_for(Method::kSweepMse));
  const std::vector<float> d2 = dequantize(q2);
  const float s = scale_value(q2.scales[0], ScaleFormat::kE4M3);
  const float qv = format::kFp4Values.v[q2.codes[0] >> 4];
  EXPECT_EQ(d2[1], (qv * s) / q2.global_scale);
}

TEST(Quantize, GlobalScaleRules) {
  EXPECT_EQ(default_max_block_scale(Method::kAbsMax), 448.0f);
  EXPECT_EQ(default_max_block_scale(Method::kSweepMse), 256.0f);
  EXPECT_EQ(global_scale_for_amax(3.0f, 256.0f), 512.0f);
  EXPECT_EQ(global_scale_for_amax(0.0f, 256.0f), 1.0f);
  EXPECT_EQ(global_scale_for_amax(1e-44f, 448.0f), FLT_MAX);  // tiny amax: clamped, no inf
  EXPECT_EQ(global_scale_for_amax(-0.0f, 448.0f), 1.0f);
  // Huge amax: 6C/amax stays a positive normal float.
  EXPECT_EQ(global_scale_for_amax(FLT_MAX, 448.0f), 2688.0f / FLT_MAX);
  EXPECT_GE(global_scale_for_amax(FLT_MAX, 448.0f), FLT_MIN);
  // Hazard: an Inf amax gave gs = 0 and a NaN amax gs = 1, silently. Refused, naming the value.
  for (const float bad : {INFINITY, -INFINITY, std::nanf(""), -1.0f}) {
    try {
      (void)global_scale_for_amax(bad, 448.0f);
      ADD_FAILURE() << "amax " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("is not a finite value >= 0"), std::string::npos)
          << e.what();
    }
  }
  const float amax = 0.7f;
  EXPECT_EQ(global_scale_for_amax(amax, 448.0f), (6.0f * 448.0f) / amax);
  std::vector<float> x = randn(64, 3);
  QuantConfig c = cfg_for(Method::kSweepMse);
  c.global_scale = 100.0f;  // explicit
  EXPECT_EQ(quantize(x.data(), 2, 32, {}, c).global_scale, 100.0f);
  EXPECT_EQ(resolve_global_scale(x.data(), DType::kF32, 2, 32, c), 100.0f);
  c.global_scale.reset();
  c.max_block_scale = 300.0f;
  float a = 0;
  for (float v : x) a = std::max(a, std::fabs(v));
  EXPECT_EQ(quantize(x.data(), 2, 32, {}, c).global_scale, (6.0f * 300.0f) / a);
}

TEST(Quantize, AllZeroTensorAndBlocks) {
  std::vector<float> z(3 * 40, 0.0f);
  z[7] = -0.0f;
  for (Method m : kMethodNames.values()) {
    QuantConfig c = cfg_for(m);
    if (m == Method::kOptFp32) {
      const std::vector<float> d = fake_quantize(z.data(), 3, 40, {}, c);
      for (float v : d) EXPECT_EQ(v, 0.0f);
      continue;
    }
    const MethodImportance mi = importance_for(m, {}, 40, 16);
    const QuantizedTensor q = quantize(z.data(), 3, 40, mi.imp, c);
    EXPECT_EQ(q.global_scale, 1.0f);
    for (uint8_t s : q.scales) EXPECT_EQ(s, 0);
    for (size_t i = 0; i < q.codes.size(); ++i)
      EXPECT_EQ(q.codes[i], i == 3 ? 0x80 : 0x00) << i;  // -0.0 keeps its sign (element 7)
    const std::vector<float> d = dequantize(q);
    for (float v : d) EXPECT_EQ(v, 0.0f);
    const ErrorMetrics e = error_metrics(z.data(), d.data(), 3, 40, {});
    EXPECT_EQ(e.nmse, 0.0);
  }
  // A zero block inside a non-zero tensor.
  std::vector<float> x = randn(48, 5);
  for (int i = 16; i < 32; ++i) x[i] = 0.0f;
  const QuantizedTensor q = quantize(x.data(), 1, 48, {}, cfg_for(Method::kSweepMse));
  EXPECT_EQ(q.scales[1], 0);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(q.codes[i], 0);
}

TEST(Quantize, ThreadCountAndFastPathDoNotChangeBytes) {
  const int64_t rows = 67, cols = 200;
  std::vector<float> x = randn(rows * cols, 9);
  std::vector<float> w = randn(rows * cols, 10);
  for (float& v : w) v = std::fabs(v);
  const Importance imp{ImportanceKind::kPerElement, w.data()};
  for (Method m : kMethodNames.values()) {
    if (m == Method::kOptFp32) continue;
    QuantConfig c = cfg_for(m);
    c.threads = 1;
    c.reference_only = true;
    const MethodImportance mi = importance_for(m, imp, cols, 16);
    const QuantizedTensor ref = quantize(x.data(), rows, cols, mi.imp, c);
    for (int t : {0, 1, 2, 3, 8}) {
      for (bool ro : {false, true}) {
        c.threads = t;
        c.reference_only = ro;
        const QuantizedTensor q = quantize(x.data(), rows, cols, mi.imp, c);
        EXPECT_EQ(q.codes, ref.codes) << kMethodNames.name(m) << " threads " << t;
        EXPECT_EQ(q.scales, ref.scales) << kMethodNames.name(m) << " threads " << t;
        EXPECT_EQ(q.global_scale, ref.global_scale);
      }
    }
  }
  QuantConfig c = cfg_for(Method::kOptFp32);
  c.threads = 1;
  const std::vector<float> a = fake_quantize(x.data(), rows, cols, imp, c);
  c.threads = 4;
  EXPECT_EQ(fake_quantize(x.data(), rows, cols, imp, c), a);
}

TEST(Quantize, Bf16AndF16InputsEqualTheirFloatValues) {
  const int64_t rows = 5, cols = 48;
  const std::vector<float> x = randn(rows * cols, 12, 3.0);
  std::vector<uint16_t> hb(x.size()), hh(x.size());
  std::vector<float> xb(x.size()), xh(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    hb[i] = format::f32_to_bf16(x[i]);
    hh[i] = format::f32_to_f16(x[i]);
    xb[i] = format::bf16_to_f32(hb[i]);
    xh[i] = format::f16_to_f32(hh[i]);
    EXPECT_EQ(load_element(hb.data(), DType::kBF16, int64_t(i)), xb[i]);
  }
  for (Method m : {Method::kAbsMax, Method::kSweepMse, Method::kExhaustiveMse}) {
    const QuantConfig c = cfg_for(m);
    const QuantizedTensor qb = quantize(hb.data(), DType::kBF16, rows, cols, {}, c);
    const QuantizedTensor qf = quantize(xb.data(), rows, cols, {}, c);
    EXPECT_EQ(qb.codes, qf.codes);
    EXPECT_EQ(qb.scales, qf.scales);
    EXPECT_EQ(qb.global_scale, qf.global_scale);
    const QuantizedTensor qh = quantize(hh.data(), DType::kF16, rows, cols, {}, c);
    const QuantizedTensor qhf = quantize(xh.data(), rows, cols, {}, c);
    EXPECT_EQ(qh.codes, qhf.codes);
    EXPECT_EQ(qh.scales, qhf.scales);
  }
  QuantConfig c = cfg_for(Method::kOptFp32);
  EXPECT_EQ(fake_quantize(hb.data(), DType::kBF16, rows, cols, {}, c),
            fake_quantize(xb.data(), rows, cols, {}, c));
  const std::vector<float> d = fake_quantize(xb.data(), rows, cols, {}, cfg_for(Method::kAbsMax));
  const ErrorMetrics e1 = error_metrics(hb.data(), DType::kBF16, d.data(), rows, cols, {});
  const ErrorMetrics e2 = error_metrics(xb.data(), d.data(), rows, cols, {});
  EXPECT_EQ(e1.nmse, e2.nmse);
  // NaN in bf16 is reported with its index.
  hb[2 * cols + 3] = 0x7FC0;
  EXPECT_NE(error_of([&] {
              quantize(hb.data(), DType::kBF16, rows, cols, {}, cfg_for(Method::kSweepMse), "w16");
            }).find("'w16': element [2, 3] is NaN"),
            std::string::npos);
}

TEST(Quantize, ImportancePerColumnEqualsRepeatedPerElement) {
  const int64_t rows = 4, cols = 64;
  const std::vector<float> x = randn(rows * cols, 13);
  std::vector<float> wc(cols), we(rows * cols);
  std::mt19937_64 rng(4);
  for (auto& v : wc) v = static_cast<float>(std::exponential_distribution<double>(0.1)(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) we[r * cols + c] = wc[c];
  for (Method m : {Method::kSweepWmse, Method::kExhaustiveWmse, Method::kOptFp8Wmse}) {
    const QuantConfig c = cfg_for(m);
    const QuantizedTensor a =
        quantize(x.data(), rows, cols, {ImportanceKind::kPerColumn, wc.data()}, c);
    const QuantizedTensor b =
        quantize(x.data(), rows, cols, {ImportanceKind::kPerElement, we.data()}, c);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.codes, b.codes);
  }
  // MSE methods ignore importance.
  const QuantConfig c = cfg_for(Method::kSweepMse);
  EXPECT_EQ(quantize(x.data(), rows, cols, {ImportanceKind::kPerColumn, wc.data()}, c).scales,
            quantize(x.data(), rows, cols, {}, c).scales);
}

TEST(Quantize, ValidationMessages) {
  std::vector<float> x = randn(3 * 20, 14);
  const QuantConfig ok = cfg_for(Method::kSweepMse);
  auto q = [&](const std::vector<float>& v, int64_t r, int64_t c, const Importance& imp,
               const QuantConfig& cfg) {
    return error_of([&] { quantize(v.data(), r, c, imp, cfg, "blk.0.w"); });
  };
  std::vector<float> bad = x;
  bad[1 * 20 + 7] = NAN;
  EXPECT_NE(q(bad, 3, 20, {}, ok).find("tensor 'blk.0.w': element [1, 7] is NaN"),
            std::string::npos);
  bad[1 * 20 + 7] = 1;
  bad[2 * 20 + 19] = -INFINITY;
  EXPECT_NE(q(bad, 3, 20, {}, ok).find("element [2, 19] is infinite"), std::string::npos);
  EXPECT_NE(q(x, 0, 20, {}, ok).find("empty"), std::string::npos);
  std::vector<float> w(20, 1.0f);
  w[4] = -1.0f;
  const QuantConfig wm = cfg_for(Method::kSweepWmse);
  EXPECT_NE(q(x, 3, 20, {ImportanceKind::kPerColumn, w.data()}, wm)
                .find("importance of 'blk.0.w': element [4] is negative"),
            std::string::npos);
  std::vector<float> we(60, 1.0f);
  we[25] = NAN;
  EXPECT_NE(q(x, 3, 20, {ImportanceKind::kPerElement, we.data()}, wm).find("element [1, 5] is NaN"),
            std::string::npos);
  EXPECT_NE(q(x, 3, 20, {ImportanceKind::kPerColumn, nullptr}, wm).find("no data"),
            std::string::npos);
  QuantConfig c = ok;
  c.block = 12;
  EXPECT_NE(q(x, 3, 20, {}, c).find("block size 12"), std::string::npos);
  c = ok;
  c.format = TensorFormat::kMxfp4;
  c.block = 16;
  EXPECT_NE(q(x, 3, 20, {}, c).find("MXFP4 requires block 32"), std::string::npos);
  c.block = 32;
  c.global_scale = 2.0f;
  EXPECT_NE(q(x, 3, 20, {}, c).find("no global scale"), std::string::npos);
  c = cfg_for(Method::kSweep);
  c.selector.window = Window{3, -2};
  EXPECT_NE(q(x, 3, 20, {}, c).find("lo (3) > hi (-2)"), std::string::npos);
  c.selector.window.reset();
  EXPECT_NE(q(x, 3, 20, {}, c).find("needs a window"), std::string::npos);
  c = cfg_for(Method::kAbsMax);
  c.selector.window = Window{-1, 1};
  EXPECT_NE(q(x, 3, 20, {}, c).find("applies only to sweep"), std::string::npos);
  c = ok;
  c.max_block_scale = 500.0f;
  EXPECT_NE(q(x, 3, 20, {}, c).find("0 < C <= 448"), std::string::npos);
  c.max_block_scale = NAN;
  EXPECT_NE(q(x, 3, 20, {}, c).find("C must satisfy"), std::string::npos);
  c = ok;
  c.global_scale = -1.0f;
  EXPECT_NE(q(x, 3, 20, {}, c).find("must be a finite value > 0"), std::string::npos);
  c.global_scale = 1e30f;
  EXPECT_NE(q(x, 3, 20, {}, c).find("exceeds 2^48"), std::string::npos);
  c = ok;
  c.threads = -2;
  EXPECT_NE(q(x, 3, 20, {}, c).find("threads"), std::string::npos);
  EXPECT_NE(q(x, 3, 20, {}, cfg_for(Method::kOptFp32)).find("opt-fp32"), std::string::npos);
}

TEST(Metrics, HandValuesAndGap) {
  const float x[4] = {1, 2, 0, -2};
  const float xh[4] = {1, 1, 0, -2};
  const ErrorMetrics e = error_metrics(x, xh, 2, 2, {});
  EXPECT_DOUBLE_EQ(e.nmse, 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(e.nwmse, 1.0 / 9.0);
  const float wc[2] = {3, 1};  // per column: w = {3, 1, 3, 1}
  const ErrorMetrics ew = error_metrics(x, xh, 2, 2, {ImportanceKind::kPerColumn, wc});
  EXPECT_DOUBLE_EQ(ew.nwmse, 1.0 / (3 + 4 + 0 + 4));
  EXPECT_DOUBLE_EQ(gap_percent(1.1, 1.0), 10.000000000000009);
  EXPECT_EQ(gap_percent(0, 0), 0.0);
  EXPECT_TRUE(std::isinf(gap_percent(1, 0)));
}

TEST(OptFp32, LowerBoundOfEveryMethod) {
  const int64_t rows = 32, cols = 256;
  std::vector<float> x = randn(rows * cols, 15);
  std::vector<float> wc(cols);
  std::mt19937_64 rng(6);
  for (auto& v : wc) v = static_cast<float>(std::exponential_distribution<double>(1.0)(rng));
  const Importance imp{ImportanceKind::kPerColumn, wc.data()};
  const std::vector<float> o = fake_quantize(x.data(), rows, cols, {}, cfg_for(Method::kOptFp32));
  const std::vector<float> ow = fake_quantize(x.data(), rows, cols, imp, cfg_for(Method::kOptFp32));
  const double opt = error_metrics(x.data(), o.data(), rows, cols, imp).nmse;
  const double optw = error_metrics(x.data(), ow.data(), rows, cols, imp).nwmse;
  for (Method m : kMethodNames.values()) {
    if (m == Method::kOptFp32) continue;
    const MethodImportance mi = importance_for(m, imp, cols, 16);
    const std::vector<float> d = fake_quantize(x.data(), rows, cols, mi.imp, cfg_for(m));
    const ErrorMetrics e = error_metrics(x.data(), d.data(), rows, cols, imp);
    EXPECT_GE(e.nmse, opt * (1 - 1e-6)) << kMethodNames.name(m);
    EXPECT_GE(e.nwmse, optw * (1 - 1e-6)) << kMethodNames.name(m);
  }
}

// Hazard: amax near FLT_MAX. A search method may pick a block scale above the one the global
// scale was sized for (C = 256 < 448) and an element rounds up to a larger FP4 level, so
// q * s / gs ran past FLT_MAX: the dequantized tensor held Inf (NVFP4 and MXFP4, and the
// opt-fp32 reconstruction). Every dequantized value must stay finite.
TEST(Hazards, AmaxNearFltMaxDequantizesFinite) {
  const int64_t rows = 8, cols = 64;
  std::vector<float> x = randn(rows * cols, 21);
  float a = 0;
  for (int64_t i = 0; i < rows * cols; i += 16) x[i] = 10.0f;  // the amax of every block
  for (int64_t i = 1; i < rows * cols; i += 16) x[i] *= 0.5f;
  for (float v : x) a = std::max(a, std::fabs(v));
  for (float& v : x) v = v / a * FLT_MAX;
  for (const TensorFormat f : {TensorFormat::kNvfp4, TensorFormat::kMxfp4}) {
    for (const Method m : {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse,
                           Method::kExhaustiveMse, Method::kOptFp8Mse, Method::kOptFp32}) {
      QuantConfig c = cfg_for(m, f == TensorFormat::kMxfp4 ? 32 : 16);
      c.format = f;
      const std::vector<float> d = m == Method::kOptFp32
                                       ? fake_quantize(x.data(), rows, cols, {}, c)
                                       : dequantize(quantize(x.data(), rows, cols, {}, c));
      int bad = 0;
      for (float v : d) bad += !std::isfinite(v);
      EXPECT_EQ(bad, 0) << kMethodNames.name(m) << " " << kTensorFormatNames.name(f);
      if (f == TensorFormat::kNvfp4 && m != Method::kOptFp32) {
        const float gs = quantize(x.data(), rows, cols, {}, c).global_scale;
        EXPECT_TRUE(std::isfinite(6.0f * 448.0f / gs)) << gs;  // any code and scale decode
      }
    }
  }
}

TEST(Mxfp4, TensorQuantization) {
  const int64_t rows = 6, cols = 70;  // partial last block of 6
  std::vector<float> x = randn(rows * cols, 16, 1e-3);
  x[100] = 5e4f;  // wide dynamic range: no global scale in MX
  QuantConfig c = cfg_for(Method::kAbsMax, 32);
  c.format = TensorFormat::kMxfp4;
  const QuantizedTensor qa = quantize(x.data(), rows, cols, {}, c);
  EXPECT_EQ(qa.global_scale, 1.0f);
  EXPECT_EQ(qa.scales.size(), size_t(rows * 3));
  expect_matches_blockwise(x, rows, cols, qa, c, nullptr);
  c.selector.method = Method::kSweepMse;
  const QuantizedTensor qs = quantize(x.data(), rows, cols, {}, c);
  expect_matches_blockwise(x, rows, cols, qs, c, nullptr);
  c.selector.method = Method::kExhaustiveMse;
  const QuantizedTensor qe = quantize(x.data(), rows, cols, {}, c);
  EXPECT_EQ(qs.scales, qe.scales);
  EXPECT_EQ(qs.codes, qe.codes);
  const std::vector<float> da = dequantize(qa), ds = dequantize(qs);
  const double ea = error_metrics(x.data(), da.data(), rows, cols, {}).nmse;
  const double es = error_metrics(x.data(), ds.data(), rows, cols, {}).nmse;
  EXPECT_LT(es, ea);
  // Dequantized MX value = q * 2^(e - 127) exactly.
  const int64_t nb = qs.blocks_per_row();
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int64_t r = i / cols, col = i % cols;
    const float q = format::kFp4Values.v[packed_code(qs.codes.data(), cols, r, col)];
    EXPECT_EQ(ds[i], q * std::ldexp(1.0f, qs.scales[r * nb + col / 32] - 127));
  }
}

// SPEC reference figures: b = 16, S = amax/1536, 2^20 elements per distribution.
TEST(ReferenceFigures, GapsToOptFp32NearSpec) {
  const int64_t rows = 1024, cols = 1024;
  const char* names[3] = {"gaussian", "laplace", "student-t3"};
  // SPEC: AbsMax 49/37/28, 4/6 24/21/18, sweep-mse = exhaustive 8.4/8.6/8.7 (%).
  const double want_abs[3] = {49, 37, 28}, want_46[3] = {24, 21, 18}, want_sw[3] = {8.4, 8.6, 8.7};
  for (int k = 0; k < 3; ++k) {
    std::mt19937_64 rng(20260 + k);
    std::normal_distribution<double> nd;
    std::exponential_distribution<double> ed;
    std::student_t_distribution<double> td(3.0);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (auto& v : x) {
      if (k == 0)
        v = static_cast<float>(nd(rng));
      else if (k == 1)
        v = static_cast<float>((rng() & 1 ? 1 : -1) * ed(rng));
      else
        v = static_cast<float>(td(rng));
    }
    auto nmse = [&](Method m, float C) {
      QuantConfig c = cfg_for(m);
      c.max_block_scale = C;
      const std::vector<float> d = fake_quantize(x.data(), rows, cols, {}, c);
      return error_metrics(x.data(), d.data(), rows, cols, {}).nmse;
    };
    const double opt = nmse(Method::kOptFp32, 256);
    const double g_abs = gap_percent(nmse(Method::kAbsMax, 256), opt);
    const double g_abs448 = gap_percent(nmse(Method::kAbsMax, 448), opt);
    const double g_46 = gap_percent(nmse(Method::kFourOverSix, 256), opt);
    const double sw = nmse(Method::kSweepMse, 256), ex = nmse(Method::kExhaustiveMse, 256);
    const double g_sw = gap_percent(sw, opt);
    const double g_f8 = gap_percent(nmse(Method::kOptFp8Mse, 256), opt);
    std::printf(
        "[reference figures] %-10s opt-fp32 NMSE %.5f | gap %%: absmax %.1f (C=448: "
        "%.1f), 4over6 %.1f, sweep-mse %.2f, exhaustive-mse %.2f, opt-fp8-mse %.2f\n",
        names[k], opt, g_abs, g_abs448, g_46, g_sw, gap_percent(ex, opt), g_f8);
    EXPECT_EQ(sw, ex);
    EXPECT_NEAR(g_abs, want_abs[k], 3.0) << names[k];
    EXPECT_NEAR(g_abs448, want_abs[k], 3.0) << names[k];
    EXPECT_NEAR(g_46, want_46[k], 3.0) << names[k];
    EXPECT_NEAR(g_sw, want_sw[k], 1.0) << names[k];
    EXPECT_LT(g_sw, g_f8);
  }
}

}  // namespace
}  // namespace scalesweep

namespace scalesweep {
namespace {

// More threads than the process may create (here: an address-space limit smaller than their
// stacks; in practice a container's pids limit, or --threads 2000): the rows the missing
// threads would have taken run on the calling thread, same bytes. Was: std::system_error from
// std::thread left joinable threads behind, "terminate called without an active exception".
TEST(Threads, CreationFailureFallsBackToFewerThreads) {
  const int64_t rows = 1024, cols = 4096;  // 4M elements: every thread count up to 512 used
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = g(rng);
  x[static_cast<size_t>(700 * cols + 5)] = NAN;  // the error must still name the first bad one
  x[static_cast<size_t>(900 * cols + 7)] = NAN;
  QuantConfig cfg;
  cfg.threads = 1;
  std::vector<float> ok = x;
  ok[static_cast<size_t>(700 * cols + 5)] = 1.0f;
  ok[static_cast<size_t>(900 * cols + 7)] = 2.0f;
  const QuantizedTensor ref = quantize(ok.data(), rows, cols, Importance{}, cfg);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // 512 threads need 4 GiB of stack address space; allow ~512 MiB more than in use now.
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t now = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    struct rlimit rl {
      now + (rlim_t{512} << 20), now + (rlim_t{512} << 20)
    };
    if (pages == 0 || ::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(3);
    QuantConfig c = cfg;
    c.threads = 512;
    const QuantizedTensor q = quantize(ok.data(), rows, cols, Importance{}, c);
    if (q.codes != ref.codes || q.scales != ref.scales || q.global_scale != ref.global_scale)
      ::_exit(4);
    c.global_scale = ref.global_scale;  // the row kernels find the NaN: first one reported
    try {
      (void)quantize(x.data(), rows, cols, Importance{}, c);
      ::_exit(5);
    } catch (const std::invalid_argument& e) {
      if (std::string(e.what()).find("[700, 5]") == std::string::npos) ::_exit(6);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Quantize, BlockHessianImportanceIsCheckedAndExtracted) {
  // block_hessians: the diagonal blocks of a symmetric matrix given by its upper triangle.
  const int64_t k = 20;
  std::vector<double> full(k * k, -99.0);  // lower triangle never read
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = i; j < k; ++j) full[i * k + j] = static_cast<double>(i * 100 + j);
  const std::vector<double> hb = block_hessians(full.data(), k, 16, 0.5);
  ASSERT_EQ(hb.size(), 2u * 16 * 16);
  EXPECT_EQ(hb[3 * 16 + 5], 0.5 * 305);
  EXPECT_EQ(hb[5 * 16 + 3], 0.5 * 305);
  EXPECT_EQ(hb[256 + 1 * 16 + 2], 0.5 * (17 * 100 + 18));  // block 1: columns 16..19
  EXPECT_EQ(hb[256 + 4 * 16 + 4], 0.0);                    // beyond the partial block: zero
  const float wd[3] = {2.0f, 3.0f, 5.0f};
  const std::vector<double> dh = diagonal_block_hessians(wd, 3, 2);  // blocks of 2: [2, 3], [5]
  EXPECT_EQ(dh, (std::vector<double>{2, 0, 0, 3, 5, 0, 0, 0}));

  std::vector<float> x = randn(3 * 20, 4);
  QuantConfig c = cfg_for(Method::kSweepHessian);
  EXPECT_NE(error_of([&] {
              quantize(x.data(), 3, 20, {}, c, "w");
            }).find("tensor 'w': method 'sweep-hessian' needs the block Hessians"),
            std::string::npos);
  std::vector<double> h(2 * 256, 0.0);
  for (int i = 0; i < 16; ++i) h[i * 17] = h[256 + i * 17] = 1.0;
  Importance imp{ImportanceKind::kBlockHessian, nullptr, h.data(), 16};
  EXPECT_NO_THROW(quantize(x.data(), 3, 20, imp, c, "w"));
  h[256 + 2 * 16 + 2] = -1.0;
  EXPECT_NE(error_of([&] {
              quantize(x.data(), 3, 20, imp, c, "w");
            }).find("block Hessian of 'w': block [1] element [2, 2] is negative on the diagonal"),
            std::string::npos);
  h[256 + 2 * 16 + 2] = 1.0;
  h[7] = std::nan("");
  EXPECT_NE(error_of([&] {
              quantize(x.data(), 3, 20, imp, c, "w");
            }).find("block [0] element [0, 7] is not finite"),
            std::string::npos);
  h[7] = 0.0;
  imp.block = 32;
  EXPECT_NE(error_of([&] {
              quantize(x.data(), 3, 20, imp, c, "w");
            }).find("built for blocks of 32, the quantization uses 16"),
            std::string::npos);
  imp.block = 16;
  c.selector.method = Method::kSweepWmse;
  EXPECT_NE(error_of([&] {
              quantize(x.data(), 3, 20, imp, c, "w");
            }).find("read by the *-hessian methods only, not by 'sweep-wmse'"),
            std::string::npos);
}

TEST(Quantize, BlockHessianMetricIsTheQuadraticForm) {
  // nwmse with block Hessians: sum d^T H_b d / sum x^T H_b x, recomputed by hand.
  const int64_t rows = 2, cols = 24;
  const std::vector<float> x = randn(rows * cols, 8), xh = randn(rows * cols, 9, 0.1);
  std::vector<float> xhat(x.size());
  for (size_t i = 0; i < x.size(); ++i) xhat[i] = x[i] + xh[i];
  const MethodImportance mi = importance_for(Method::kSweepHessian, {}, cols, 8);
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < 3; ++b)
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) {
          const int64_t ci = r * cols + b * 8 + i, cj = r * cols + b * 8 + j;
          const double hij = mi.h[(b * 8 + i) * 8 + j];
          num += (double(x[ci]) - xhat[ci]) * hij * (double(x[cj]) - xhat[cj]);
          den += double(x[ci]) * hij * x[cj];
        }
  const ErrorMetrics e = error_metrics(x.data(), xhat.data(), rows, cols, mi.imp);
  EXPECT_NEAR(e.nwmse, num / den, 1e-12 * num / den);
}

}  // namespace
}  // namespace scalesweep

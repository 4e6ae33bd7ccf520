// The evaluation API against a plain double-precision recomputation: metrics, dequantized
// values, per-block losses, opt-fp32 references and gaps, on random and adversarial tensors
// (all-zero blocks, one huge outlier, subnormals, a partial last block), NVFP4 and MXFP4,
// every method.
#include "scalesweep/quant/evaluate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "scalesweep/format/minifloat.h"

namespace scalesweep {
namespace {

struct Case {
  std::string name;
  int64_t rows, cols;
  std::vector<float> x;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  auto gauss = [&](int64_t rows, int64_t cols, double scale) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = static_cast<float>(nd(rng) * scale);
    return v;
  };
  out.push_back({"random", 6, 64, gauss(6, 64, 1.0)});
  {
    Case c{"zero blocks", 5, 96, gauss(5, 96, 0.5)};
    for (int64_t col = 0; col < 32; ++col) c.x[static_cast<size_t>(1 * 96 + col)] = 0.0f;
    for (int64_t col = 64; col < 96; ++col) c.x[static_cast<size_t>(3 * 96 + col)] = 0.0f;
    for (int64_t col = 0; col < 96; ++col) c.x[static_cast<size_t>(4 * 96 + col)] = 0.0f;
    out.push_back(std::move(c));
  }
  {
    Case c{"huge outlier", 4, 64, gauss(4, 64, 1.0)};
    c.x[77] = 3.0e6f;
    out.push_back(std::move(c));
  }
  {
    Case c{"subnormals", 3, 64, gauss(3, 64, 1e-39)};
    c.x[5] = 1.0f;  // one normal value sets the global scale; the rest are tiny
    out.push_back(std::move(c));
  }
  out.push_back({"partial last block", 4, 45, gauss(4, 45, 2.0)});
  return out;
}

std::vector<float> importance_for(int64_t cols) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.0, 3.0);
  std::vector<float> w(static_cast<size_t>(cols));
  for (auto& v : w) v = static_cast<float>(u(rng));
  w[0] = 0.0f;  // a zero weight
  return w;
}

ScaleFormat scale_format(TensorFormat f) {
  return f == TensorFormat::kMxfp4 ? ScaleFormat::kUE8M0 : ScaleFormat::kE4M3;
}

double weight(const Importance& imp, int64_t cols, int64_t i) {
  if (imp.kind == ImportanceKind::kPerColumn) return imp.data[i % cols];
  if (imp.kind == ImportanceKind::kPerElement) return imp.data[i];
  return 1.0;
}

// sum (x - xh)^2 / sum x^2 and the weighted one, in double.
ErrorMetrics plain_metrics(const std::vector<float>& x, const std::vector<double>& xh,
                           const Importance& imp, int64_t cols) {
  double n = 0, d = 0, wn = 0, wd = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = static_cast<double>(x[i]) - xh[i];
    const double w = weight(imp, cols, static_cast<int64_t>(i));
    n += e * e;
    d += static_cast<double>(x[i]) * x[i];
    wn += w * e * e;
    wd += w * x[i] * x[i];
  }
  return {d > 0 ? n / d : 0.0, wd > 0 ? wn / wd : 0.0};
}

// Element (r, c) of a QuantizedTensor decoded by hand: FP4 value * scale / gs.
double decode(const QuantizedTensor& q, int64_t r, int64_t c) {
  const uint8_t byte = q.codes[static_cast<size_t>(r * q.packed_cols() + c / 2)];
  const int code = (c & 1) ? byte >> 4 : byte & 15;
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double v = (code & 8 ? -1.0 : 1.0) * kMag[code & 7];
  const double s = scale_value(q.scales[static_cast<size_t>(r * q.blocks_per_row() + c / q.block)],
                               scale_format(q.format));
  return v * s / q.global_scale;
}

// E2M1 magnitude of |y| / s, round to nearest, ties to the even code, saturating at 6.
double fp4_round(double a) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double d = std::fabs(a - kMag[i]), db = std::fabs(a - kMag[best]);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return kMag[best];
}

// Block loss sum w (|y| - q s)^2 in double (y = fl(x gs)).
double plain_block_loss(const float* y, const float* w, int n, double s) {
  double l = 0;
  for (int i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(y[i]));
    const double q = s > 0 ? fp4_round(a / s) : 0.0;
    const double e = a - q * s;
    l += (w ? w[i] : 1.0) * e * e;
  }
  return l;
}

bool uses_weights(Method m) {
  return m == Method::kSweepWmse || m == Method::kExhaustiveWmse || m == Method::kOptFp8Wmse ||
         m == Method::kSweep || m == Method::kOptFp32;
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want) + 1e-300)
      << what << ": " << got << " vs " << want;
}

struct FormatSetup {
  TensorFormat format;
  int block;
};

// Block b of row r of case c: its first column, its length, its values scaled by gs and their
// weights under imp.
struct BlockOf {
  int64_t c0;
  int n;
  std::vector<float> y, w;
};
BlockOf block_of(const Case& c, int64_t r, int64_t b, int block, float gs, const Importance& imp) {
  BlockOf o;
  o.c0 = b * block;
  o.n = static_cast<int>(std::min<int64_t>(block, c.cols - o.c0));
  for (int i = 0; i < o.n; ++i) {
    o.y.push_back(c.x[static_cast<size_t>(r * c.cols + o.c0 + i)] * gs);
    o.w.push_back(static_cast<float>(weight(imp, c.cols, r * c.cols + o.c0 + i)));
  }
  return o;
}

class EvaluateTest : public ::testing::TestWithParam<FormatSetup> {};

TEST_P(EvaluateTest, MatchesPlainRecomputation) {
  const FormatSetup su = GetParam();
  for (const Case& c : cases()) {
    const std::vector<float> wv = importance_for(c.cols);
    const TensorRef x = tensor_ref(c.x.data(), c.rows, c.cols);
    for (bool weighted : {false, true}) {
      const Importance imp =
          weighted ? Importance{ImportanceKind::kPerColumn, wv.data()} : Importance{};
      QuantConfig base;
      base.format = su.format;
      base.block = su.block;
      const OptFp32Refs opt = opt_fp32_refs(x, imp, base, c.name);
      // The references recomputed: per-block optimum scales, elements rounded by hand.
      for (bool wref : {false, true}) {
        const Importance use = wref ? imp : Importance{};
        const std::vector<double> s = opt_fp32_block_scales(x, use, base, c.name);
        QuantConfig oc = base;
        oc.selector.method = Method::kOptFp32;
        const double gs = resolve_global_scale(c.x.data(), DType::kF32, c.rows, c.cols, oc);
        const int64_t nb = (c.cols + su.block - 1) / su.block;
        ASSERT_EQ(s.size(), static_cast<size_t>(c.rows * nb));
        std::vector<double> xh(c.x.size());
        for (int64_t r = 0; r < c.rows; ++r) {
          for (int64_t b = 0; b < nb; ++b) {
            const auto [c0, n, y, w] = block_of(c, r, b, su.block, static_cast<float>(gs), use);
            const double sb = s[static_cast<size_t>(r * nb + b)];
            bool all_zero = true;
            for (float v : y) all_zero = all_zero && v == 0.0f;
            if (all_zero) {
              EXPECT_EQ(sb, 0.0) << c.name;
            }
            // The optimum is no worse than any FP8 scale of the format.
            const double lopt = plain_block_loss(y.data(), w.data(), n, sb);
            const ScaleFormat sf = scale_format(su.format);
            for (int p = min_scale_pattern(sf); p <= max_scale_pattern(sf); ++p) {
              const double lp = plain_block_loss(y.data(), w.data(), n, scale_value(p, sf));
              EXPECT_LE(lopt, lp * (1 + 1e-9) + 1e-300)
                  << c.name << " block " << r << "," << b << " pattern " << p;
            }
            for (int i = 0; i < n; ++i) {
              const double a = sb > 0 ? fp4_round(std::fabs(static_cast<double>(y[i])) / sb) : 0;
              const double v = a * sb / gs;
              xh[static_cast<size_t>(r * c.cols + c0 + i)] =
                  static_cast<float>(std::signbit(y[i]) ? -v : v);
            }
          }
        }
        const ErrorMetrics want = plain_metrics(c.x, xh, imp, c.cols);
        const MethodRun& run = wref ? opt.weighted : opt.plain;
        expect_rel(run.err.nmse, want.nmse, 1e-12, c.name + " opt nmse");
        expect_rel(run.err.nwmse, want.nwmse, 1e-12, c.name + " opt nwmse");
      }
      for (Method m : kMethodNames.values()) {
        if (su.format == TensorFormat::kMxfp4 && m == Method::kSweep) continue;
        if (method_uses_hessian(m)) continue;  // block Hessians: quantize_test's sweeps
        QuantConfig cfg = base;
        cfg.selector.method = m;
        if (m == Method::kSweep) cfg.selector.window = Window{-2, 3};
        const std::string what =
            c.name + " " + std::string(kMethodNames.name(m)) + (weighted ? " weighted" : "");
        const MethodRun run = run_method(x, imp, cfg, c.name);
        ASSERT_EQ(run.xhat.size(), c.x.size());
        std::vector<double> xh(run.xhat.begin(), run.xhat.end());
        if (m != Method::kOptFp32) {
          ASSERT_TRUE(run.q.has_value()) << what;
          const QuantizedTensor& q = *run.q;
          EXPECT_EQ(run.global_scale, q.global_scale);
          for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t col = 0; col < c.cols; ++col)
              ASSERT_EQ(run.xhat[static_cast<size_t>(r * c.cols + col)],
                        static_cast<float>(decode(q, r, col)))
                  << what << " [" << r << ", " << col << "]";
          // Per-block losses: the selector's own loss, and a double recomputation.
          const std::vector<double> L = block_losses(x, imp, m, q);
          const int64_t nb = q.blocks_per_row();
          ASSERT_EQ(L.size(), static_cast<size_t>(c.rows * nb));
          SelectorConfig sel = cfg.selector;
          sel.scale_format = scale_format(su.format);
          for (int64_t r = 0; r < c.rows; ++r) {
            for (int64_t b = 0; b < nb; ++b) {
              const auto [c0, n, y, w] = block_of(c, r, b, su.block, q.global_scale, imp);
              const float* wp = uses_weights(m) && weighted ? w.data() : nullptr;
              const double got = L[static_cast<size_t>(r * nb + b)];
              const BlockScale bs = select_block_scale(y.data(), wp, n, sel);
              EXPECT_EQ(bs.pattern, q.scales[static_cast<size_t>(r * nb + b)]) << what;
              EXPECT_EQ(static_cast<float>(got), bs.loss) << what << " block " << r << "," << b;
              const double plain =
                  plain_block_loss(y.data(), wp, n, scale_value(bs.pattern, sel.scale_format));
              EXPECT_LE(std::fabs(got - plain), 1e-5 * plain + 1e-30)
                  << what << " block " << r << "," << b;
            }
          }
        } else {
          EXPECT_FALSE(run.q.has_value());
        }
        const ErrorMetrics want = plain_metrics(c.x, xh, imp, c.cols);
        expect_rel(run.err.nmse, want.nmse, 1e-12, what + " nmse");
        expect_rel(run.err.nwmse, want.nwmse, 1e-12, what + " nwmse");
        // Gaps: the formula on the recomputed figures.
        const Gaps g = gaps_to_opt(run.err, opt, m, weighted);
        auto gap = [](double e, double o) {
          return o == 0 ? (e == 0 ? 0.0 : INFINITY) : 100.0 * (e - o) / o;
        };
        EXPECT_EQ(g.nmse_pct, gap(run.err.nmse, opt.plain.err.nmse)) << what;
        EXPECT_EQ(g.nwmse_pct, gap(run.err.nwmse, opt.weighted.err.nwmse)) << what;
        const bool own_weighted =
            weighted && (m == Method::kSweepWmse || m == Method::kExhaustiveWmse ||
                         m == Method::kOptFp8Wmse || m == Method::kSweep);
        EXPECT_EQ(g.own_pct, own_weighted ? g.nwmse_pct : g.nmse_pct) << what;
        // evaluate() is run_method + opt_fp32_refs + gaps_to_opt.
        const Evaluation ev = evaluate(x, imp, cfg, c.name);
        EXPECT_EQ(ev.run.err.nmse, run.err.nmse) << what;
        EXPECT_EQ(ev.run.err.nwmse, run.err.nwmse) << what;
        EXPECT_EQ(ev.opt.nmse(), opt.nmse()) << what;
        EXPECT_EQ(ev.opt.nwmse(), opt.nwmse()) << what;
        EXPECT_EQ(ev.gaps.own_pct, g.own_pct) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, EvaluateTest,
    ::testing::Values(FormatSetup{TensorFormat::kNvfp4, 16}, FormatSetup{TensorFormat::kNvfp4, 8},
                      FormatSetup{TensorFormat::kMxfp4, 32}),
    [](const auto& info) {
      return std::string(info.param.format == TensorFormat::kNvfp4 ? "nvfp4_b" : "mxfp4_b") +
             std::to_string(info.param.block);
    });

TEST(Evaluate, OptFp32IsALowerBoundAtTheSameGlobalScale) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd;
  std::vector<float> x(8 * 128);
  for (auto& v : x) v = static_cast<float>(nd(rng));
  const TensorRef t = tensor_ref(x.data(), 8, 128);
  QuantConfig cfg;
  cfg.max_block_scale = 256.0f;  // every method at one global scale
  const OptFp32Refs opt = opt_fp32_refs(t, Importance{}, cfg);
  for (Method m : {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kExhaustiveMse,
                   Method::kOptFp8Mse}) {
    cfg.selector.method = m;
    const MethodRun r = run_method(t, Importance{}, cfg);
    EXPECT_GE(r.err.nmse, opt.nmse() * (1 - 1e-6)) << kMethodNames.name(m);
    EXPECT_GT(gaps_to_opt(r.err, opt, m, false).nmse_pct, -1e-4) << kMethodNames.name(m);
  }
}

TEST(Evaluate, BlockLossesRejectAShapeMismatch) {
  std::vector<float> x(2 * 32, 1.0f);
  QuantConfig cfg;
  const QuantizedTensor q = quantize(x.data(), 2, 32, Importance{}, cfg);
  std::vector<float> other(2 * 48, 1.0f);
  EXPECT_THROW(block_losses(tensor_ref(other.data(), 2, 48), Importance{}, Method::kSweepMse, q),
               std::invalid_argument);
}

TEST(GlobalScaleSearch, PicksTheBruteForceArgminOverTheSameCandidates) {
  // Three members sharing one scale (q/k/v-like), heavy tails; per method the chosen candidate
  // is the argmin of an independent weight-domain error sum over dequantized tensors.
  std::mt19937 rng(17);
  std::student_t_distribution<float> td(3.f);
  std::vector<std::vector<float>> xs(3);
  const int64_t cols = 48;
  const int64_t rows[3] = {16, 8, 8};
  for (int i = 0; i < 3; ++i) {
    xs[i].resize(static_cast<size_t>(rows[i] * cols));
    for (auto& v : xs[i]) v = 0.02f * td(rng);
  }
  std::vector<float> wcol(cols);
  for (auto& v : wcol) v = std::exp(std::normal_distribution<float>(0.f, 1.f)(rng));
  std::vector<double> hb(3 * 256, 0.0);
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        hb[(b * 16 + i) * 16 + j] = (i == j ? wcol[b * 16 + i] : 0.0) + 0.2;
  for (Method m : {Method::kAbsMax, Method::kSweepMse, Method::kSweepWmse, Method::kSweepHessian}) {
    QuantConfig cfg;
    cfg.selector.method = m;
    Importance imp;
    if (method_is_weighted(m)) imp = {ImportanceKind::kPerColumn, wcol.data()};
    if (method_uses_hessian(m)) imp = {ImportanceKind::kBlockHessian, nullptr, hb.data(), 16};
    std::vector<GlobalScaleMember> ms;
    for (int i = 0; i < 3; ++i) ms.push_back({tensor_ref(xs[i].data(), rows[i], cols), imp, "m"});
    const GlobalScaleSearch r = search_global_scale(ms, cfg, 16);
    ASSERT_EQ(r.candidates.size(), r.objective.size());
    ASSERT_GE(r.candidates.size(), 16u);
    // The rule's scale is the first candidate: the search never ends above it.
    float amax = 0;
    for (auto& x : xs)
      for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(r.candidates[0], global_scale_for_amax(amax, default_max_block_scale(m)));
    EXPECT_LE(r.objective[static_cast<size_t>(r.best)], r.objective[0]);
    int brute_best = 0;
    std::vector<double> brute;
    for (float gs : r.candidates) {
      QuantConfig qc = cfg;
      qc.global_scale = gs;
      double total = 0;
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> xh =
            dequantize(quantize(xs[i].data(), rows[i], cols, imp, qc, "m"));
        for (int64_t r0 = 0; r0 < rows[i]; ++r0)
          for (int64_t b = 0; b < cols / 16; ++b)
            for (int a = 0; a < 16; ++a)
              for (int c = 0; c < 16; ++c) {
                const size_t ia = static_cast<size_t>(r0 * cols + b * 16 + a);
                const size_t ic = static_cast<size_t>(r0 * cols + b * 16 + c);
                double h = a == c ? 1.0 : 0.0;
                if (method_is_weighted(m)) h = a == c ? wcol[b * 16 + a] : 0.0;
                if (method_uses_hessian(m)) h = hb[(b * 16 + a) * 16 + c];
                total += (double(xs[i][ia]) - xh[ia]) * h * (double(xs[i][ic]) - xh[ic]);
              }
      }
      brute.push_back(total);
      if (total < brute[static_cast<size_t>(brute_best)])
        brute_best = static_cast<int>(brute.size()) - 1;
    }
    for (size_t c = 0; c < brute.size(); ++c)
      EXPECT_NEAR(r.objective[c], brute[c], 2e-5 * brute[c]) << kMethodNames.name(m) << " " << c;
    if (r.best != brute_best) {
      EXPECT_LE(brute[static_cast<size_t>(r.best)] - brute[static_cast<size_t>(brute_best)],
                4e-5 * brute[static_cast<size_t>(brute_best)])
          << kMethodNames.name(m);
    }
  }
  QuantConfig mx;
  mx.format = TensorFormat::kMxfp4;
  mx.block = 32;
  EXPECT_THROW(search_global_scale({{tensor_ref(xs[0].data(), 16, 48), {}, "m"}}, mx, 4),
               std::invalid_argument);
  EXPECT_THROW(global_scale_candidates(1.0f, QuantConfig{}, 0), std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep

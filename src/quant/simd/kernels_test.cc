// The SIMD kernels against the scalar reference, on every dispatch target this CPU can run
// (AVX-512, AVX2, SSE4, SSSE3, scalar emulation): exhaustive inputs where the domain is small
// (all 16-bit patterns, all 127 scale patterns, every FP4 midpoint and its neighbours),
// random and adversarial blocks, and whole tensors through quantize() (reference_only vs
// fast: identical codes and scales for every method, dtype, block size and thread count).
#include "quant/simd/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "quant/simd/tables.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/quantize.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep {
namespace {

using format::E4M3;

float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, 0.0f); }

// Runs fn once per dispatch target (reported in the failure message).
void for_each_target(const std::function<void(const std::string&)>& fn) {
  const std::vector<int64_t> targets = simd::dispatch_targets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    simd::force_target(t);
    const std::string name = simd::target_name(t);
    SCOPED_TRACE("target " + name);
    fn(name);
  }
  simd::force_target(0);
}

TEST(SimdKernels, TargetsIncludeScalarFallback) {
  const std::vector<int64_t> targets = simd::dispatch_targets();
  std::string names;
  for (int64_t t : targets) names += std::string(simd::target_name(t)) + " ";
  std::printf("dispatch targets on this CPU: %s\n", names.c_str());
  // the portable fallback is always compiled and supported; on x86 so is SSE4 or better
  EXPECT_GE(targets.size(), 2u);
}

TEST(SimdKernels, LoadScaledAll16BitPatterns) {
  std::vector<uint16_t> h(65536);
  for (int i = 0; i < 65536; ++i) h[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  const float gss[] = {1.0f, 3.7e-3f, 1536.25f, 1e30f};
  for_each_target([&](const std::string&) {
    std::vector<float> y(65536);
    for (float gs : gss) {
      simd::load_scaled(h.data(), DType::kBF16, 65536, gs, y.data());
      for (int i = 0; i < 65536; ++i) {
        const float want = format::bf16_to_f32(h[static_cast<size_t>(i)]) * gs;
        if (!std::isfinite(format::bf16_to_f32(h[static_cast<size_t>(i)]))) continue;
        ASSERT_EQ(std::memcmp(&want, &y[static_cast<size_t>(i)], 4), 0) << "bf16 " << i;
      }
      simd::load_scaled(h.data(), DType::kF16, 65536, gs, y.data());
      for (int i = 0; i < 65536; ++i) {
        const float want = format::f16_to_f32(h[static_cast<size_t>(i)]) * gs;
        if (!std::isfinite(format::f16_to_f32(h[static_cast<size_t>(i)]))) continue;  // rejected
        ASSERT_EQ(std::memcmp(&want, &y[static_cast<size_t>(i)], 4), 0) << "f16 " << i;
      }
    }
    std::mt19937 rng(1);
    std::vector<float> x(1001);
    for (auto& v : x) {
      uint32_t u = rng() & 0x807FFFFFu;
      u |= (rng() % 255u) << 23;  // any finite exponent, subnormals included
      std::memcpy(&v, &u, 4);
    }
    std::vector<float> yf(x.size());
    simd::load_scaled(x.data(), DType::kF32, static_cast<int64_t>(x.size()), 0.3f, yf.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = x[i] * 0.3f;
      ASSERT_EQ(std::memcmp(&want, &yf[i], 4), 0) << i;
    }
  });
}

TEST(SimdKernels, Fp8RoundingMatchesCodec) {
  std::vector<float> v;
  for (uint32_t p = 1; p <= 126; ++p) {
    const float s = E4M3::decode_f(p);
    const float s1 = p < 126 ? E4M3::decode_f(p + 1) : 480.0f;
    const float mid = (s + s1) / 2;  // exact
    for (float f : {s, next_up(s), next_down(s), mid, next_up(mid), next_down(mid)}) v.push_back(f);
  }
  for (float f : {448.0f, 463.99f, 464.0f, 464.01f, 479.0f, 480.0f, 1e6f, 3e38f, 1e-30f, 1e-40f,
                  std::numeric_limits<float>::denorm_min(), 0.0009765625f, 0.00097656f, 0.0009766f})
    v.push_back(f);
  std::mt19937 rng(2);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng() & 0x7FFFFFu;
    u |= (90u + rng() % 50u) << 23;  // 2^-37 .. 2^12
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  // fl(a/6) of the values the selectors actually see
  const size_t base = v.size();
  for (size_t i = 0; i < base; i += 3) v.push_back(v[i] / 6.0f);
  for_each_target([&](const std::string&) {
    std::vector<uint8_t> pf(v.size()), pr(v.size());
    simd::fp8_round(v.data(), static_cast<int64_t>(v.size()), true, pf.data());
    simd::fp8_round(v.data(), static_cast<int64_t>(v.size()), false, pr.data());
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(pf[i], E4M3::encode(v[i], format::Round::kFloor)) << "floor " << v[i];
      ASSERT_EQ(pr[i], E4M3::encode(v[i], format::Round::kNearestEven)) << "rne " << v[i];
    }
  });
}

TEST(SimdKernels, Fp4CodesEveryScaleMidpointsAndNeighbours) {
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  std::mt19937 rng(3);
  for_each_target([&](const std::string&) {
    for (int p = 0; p <= 126; ++p) {
      const float s = scale_value(p, ScaleFormat::kE4M3);
      std::vector<float> y = {0.0f,    -0.0f, std::numeric_limits<float>::denorm_min(),
                              -1e-42f, 1e30f, -1e30f};
      for (float m : mids) {
        const float t = s * m;
        for (float f : {t, next_up(t), next_down(t)}) {
          y.push_back(f);
          y.push_back(-f);
        }
      }
      for (int k = 0; k < 16; ++k) y.push_back(format::kFp4Values.v[k] * s);  // every code
      for (int k = 0; k < 33; ++k) {
        std::normal_distribution<float> g(0.0f, 3.0f * (s > 0 ? s : 1e-3f));
        y.push_back(g(rng));
      }
      std::vector<uint8_t> c(y.size());
      simd::fp4_codes(y.data(), static_cast<int64_t>(y.size()), p, c.data());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(c[i], fp4_code(y[i], s)) << "pattern " << p << " y " << y[i];
    }
  });
}

TEST(SimdKernels, PackNibblesAndBlockAmax) {
  std::mt19937 rng(4);
  for_each_target([&](const std::string&) {
    for (int n : {1, 2, 15, 16, 17, 63, 64, 65, 200, 1001}) {
      std::vector<uint8_t> c(static_cast<size_t>(n) + 64);
      for (auto& v : c) v = static_cast<uint8_t>(rng() & 15);
      std::vector<uint8_t> out(static_cast<size_t>((n + 1) / 2));
      simd::pack_nibbles(c.data(), n, out.data());
      for (int j = 0; j < (n + 1) / 2; ++j) {
        const int hi = 2 * j + 1 < n ? c[static_cast<size_t>(2 * j + 1)] : 0;
        ASSERT_EQ(out[static_cast<size_t>(j)], c[static_cast<size_t>(2 * j)] | (hi << 4)) << n;
      }
      std::vector<float> y(static_cast<size_t>(n));
      std::normal_distribution<float> g;
      for (auto& v : y) v = g(rng);
      for (int block : {8, 16, 32, 64}) {
        const int nb = (n + block - 1) / block;
        std::vector<float> a(static_cast<size_t>(nb));
        simd::block_amax(y.data(), n, block, a.data());
        for (int b = 0; b < nb; ++b) {
          float want = 0;
          for (int i = b * block; i < std::min(n, (b + 1) * block); ++i)
            want = std::max(want, std::fabs(y[static_cast<size_t>(i)]));
          ASSERT_EQ(a[static_cast<size_t>(b)], want);
        }
      }
    }
  });
}

// Random and adversarial blocks: Gaussian / heavy-tailed values, elements exactly on FP4
// midpoints of some candidate scale (ties), subnormal values, zeros, duplicated amax.
std::vector<float> adversarial_block(std::mt19937& rng, int n, int kind) {
  std::vector<float> y(static_cast<size_t>(n));
  std::normal_distribution<float> g;
  std::student_t_distribution<float> st(3.0f);
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.0f, 6.0f};
  const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 12);
  for (auto& v : y) {
    switch (kind) {
      case 0:
        v = g(rng) * scale;
        break;
      case 1:
        v = st(rng) * scale;
        break;
      case 2: {  // exact midpoints / levels of a random E4M3 scale
        const float s = scale_value(1 + static_cast<int>(rng() % 126), ScaleFormat::kE4M3);
        v = s * mids[rng() % 10] * ((rng() & 1) ? -1.0f : 1.0f);
        break;
      }
      case 3:  // tiny: subnormal FP8 bases and subnormal floats
        v = g(rng) * std::ldexp(1.0f, -(static_cast<int>(rng() % 40) + 8));
        break;
      default:
        v = (rng() % 3 == 0) ? 0.0f : g(rng) * scale;
    }
  }
  if (kind == 4 && n > 1) y[static_cast<size_t>(n - 1)] = -y[0];  // duplicated amax
  return y;
}

TEST(SimdKernels, CandidateLossesMatchBlockLoss) {
  std::mt19937 rng(5);
  std::vector<std::vector<float>> blocks, weights;
  for (int t = 0; t < 120; ++t) {
    const int n = 1 + static_cast<int>(rng() % 64);
    blocks.push_back(adversarial_block(rng, n, t % 5));
    std::vector<float> w(static_cast<size_t>(n));
    std::exponential_distribution<float> e(1.0f);
    for (auto& v : w) v = (rng() % 5 == 0) ? 0.0f : e(rng);
    weights.push_back(w);
  }
  for_each_target([&](const std::string&) {
    for (size_t t = 0; t < blocks.size(); ++t) {
      const auto& y = blocks[t];
      const int n = static_cast<int>(y.size());
      for (int weighted = 0; weighted < 2; ++weighted) {
        const float* w = weighted ? weights[t].data() : nullptr;
        for (int lo = 1; lo <= 126; lo += 1 + static_cast<int>(t % 3)) {
          for (int count : {1, 3, 11, 16}) {
            if (lo + count - 1 > 126) continue;
            float got[16];
            simd::candidate_losses(y.data(), w, n, lo, count, got);
            for (int j = 0; j < count; ++j) {
              const float want =
                  block_loss(y.data(), w, n, scale_value(lo + j, ScaleFormat::kE4M3));
              ASSERT_EQ(std::memcmp(&want, &got[j], 4), 0) << "block " << t << " pattern " << lo + j
                                                           << " want " << want << " got " << got[j];
            }
          }
        }
      }
    }
  });
}

// The split-half candidate kernel's preconditions (docs/NUMERICS.md, "Fast CPU path"), checked
// against the reference FP4 rounding (fp4_code: RNE of the exact quotient): for every column
// start c >= 8 and every magnitude on, just above or just below a rounding threshold of any
// scale (plus random ones), the index over the low half (patterns c .. c+7) stays in
// [k_lo, k_lo + 2], k_lo = its index at c+7, over the high half (c+8 .. c+15, copies of 126
// past it) in [k_hi, k_hi + 2], and d = k_lo - k_hi is 0, 1 or 2; and split_tables() holds
// the scale tables' rows in exactly that layout. Fails if the ratio argument or the table
// layout were wrong.
TEST(SimdKernels, SplitHalfIndexRangesAndTables) {
  const auto& T = simd::kScaleTables;
  auto index = [](float a, int p) {
    return fp4_code(a, scale_value(std::min(p, 126), ScaleFormat::kE4M3)) & 7;
  };
  std::vector<float> vals = {0.0f, 1e-30f};
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int p = 1; p <= 126; ++p) {
    const float s = scale_value(p, ScaleFormat::kE4M3);
    for (float m : mids) {
      const float t = s * m;  // exact
      vals.insert(vals.end(), {t, next_up(t), next_down(t)});
    }
    vals.push_back(6.5f * s);
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> lg(-12.0f, 12.0f);
  for (int i = 0; i < 2000; ++i) vals.push_back(std::exp2(lg(rng)));
  int by_d[3] = {0, 0, 0};
  for (int c = 8; c <= 126; ++c) {
    for (float a : vals) {
      const int khi = index(a, c + 15), klo = index(a, c + 7), d = klo - khi;
      ASSERT_GE(d, 0) << "c " << c << " |y| " << a;
      ASSERT_LE(d, 2) << "c " << c << " |y| " << a;
      ++by_d[d];
      for (int j = 0; j < 16; ++j) {
        const int k = index(a, c + j), k0 = j < 8 ? klo : khi;
        ASSERT_GE(k, k0) << "c " << c << " lane " << j << " |y| " << a;
        ASSERT_LE(k, k0 + 2) << "c " << c << " lane " << j << " |y| " << a;
      }
    }
  }
  EXPECT_GT(by_d[0], 0);  // every variant is reached
  EXPECT_GT(by_d[1], 0);
  EXPECT_GT(by_d[2], 0);
  const simd::SplitTable* S = simd::split_tables();
  for (int c = 0; c <= 126; ++c)
    for (int d = 0; d < simd::kSplitVariants; ++d)
      for (int r = 0; r < simd::kSplitRows; ++r)
        for (int j = 0; j < 16; ++j) {
          const int row = j < 8 ? r + d : r, col = c + j;
          const auto& st = S[simd::kSplitVariants * c + d];
          ASSERT_EQ(std::memcmp(&st.thr[r][j], &T.thr[row][col], 4), 0)
              << c << " " << d << " " << r;
          ASSERT_EQ(std::memcmp(&st.lvl[r][j], &T.lvl[row][col], 4), 0)
              << c << " " << d << " " << r;
        }
}

// ---------------------------------------------------------------------------------------
// Tensor level: quantize(reference_only) vs quantize(fast), bytes equal.

struct TensorCase {
  std::string name;
  int64_t rows, cols;
  std::vector<float> x;
};

std::vector<TensorCase> tensor_cases() {
  std::mt19937 rng(6);
  std::vector<TensorCase> cs;
  auto make = [&](std::string name, int64_t rows, int64_t cols, auto gen) {
    TensorCase c{std::move(name), rows, cols, std::vector<float>(static_cast<size_t>(rows * cols))};
    for (int64_t i = 0; i < rows * cols; ++i) c.x[static_cast<size_t>(i)] = gen(i);
    cs.push_back(std::move(c));
  };
  std::normal_distribution<float> g;
  std::student_t_distribution<float> st(3.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  make("gauss", 37, 160, [&](int64_t) { return g(rng); });
  make("student-t odd K", 23, 203, [&](int64_t) { return st(rng); });
  make("laplace-ish K=7", 11, 7,
       [&](int64_t) { return u(rng) * std::log(1e-9f + std::fabs(u(rng))); });
  // tiny blocks next to a large amax: subnormal FP8 bases; zero blocks and -0.0
  make("tiny blocks + zeros", 19, 130, [&](int64_t i) {
    const int64_t blk = i / 16;
    if (i == 5) return 1000.0f;
    if (blk % 5 == 1) return 0.0f;
    if (blk % 5 == 2) return -0.0f;
    if (blk % 5 == 3) return g(rng) * 1e-4f;
    if (blk % 5 == 4) return g(rng) * 1e-7f;
    return g(rng);
  });
  // values exactly on FP4 midpoints of E4M3 scales (ties between scales s and 2s)
  make("ties", 17, 96, [&](int64_t) {
    const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 1.0f, 3.0f, 6.0f};
    const float s = scale_value(8 + static_cast<int>(rng() % 100), ScaleFormat::kE4M3);
    return s * mids[rng() % 10] * ((rng() & 1) ? -1.0f : 1.0f);
  });
  make("constant blocks", 5, 64, [&](int64_t i) { return (i / 16) % 2 ? 0.75f : -3.0f; });
  make("single column", 40, 1, [&](int64_t) { return g(rng); });
  return cs;
}

// The methods the fast kernels run (the block-Hessian methods run the reference only; see
// SimdQuantize.LeavesHessianMethodsToTheReference).
std::vector<Method> packed_methods() {
  std::vector<Method> ms;
  for (Method m : kMethodNames.values())
    if (m != Method::kOptFp32 && !method_uses_hessian(m)) ms.push_back(m);
  return ms;
}

void expect_same(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  ASSERT_EQ(a.global_scale, b.global_scale) << what;
  ASSERT_EQ(a.scales.size(), b.scales.size()) << what;
  for (size_t i = 0; i < a.scales.size(); ++i)
    ASSERT_EQ(a.scales[i], b.scales[i]) << what << ": scale of block " << i;
  ASSERT_EQ(a.codes.size(), b.codes.size()) << what;
  for (size_t i = 0; i < a.codes.size(); ++i)
    ASSERT_EQ(a.codes[i], b.codes[i]) << what << ": code byte " << i;
}

TEST(SimdQuantize, EveryMethodBlockAndTargetMatchesReference) {
  const auto cases = tensor_cases();
  for (const auto& tc : cases) {
    std::vector<float> imp_col(static_cast<size_t>(tc.cols));
    std::vector<float> imp_el(static_cast<size_t>(tc.rows * tc.cols));
    std::mt19937 rng(7);
    std::exponential_distribution<float> e(1.0f);
    for (auto& v : imp_col) v = (rng() % 7 == 0) ? 0.0f : e(rng);
    for (auto& v : imp_el) v = (rng() % 7 == 0) ? 0.0f : e(rng) * e(rng);
    for (Method m : packed_methods()) {
      for (int block : {8, 16, 32, 64}) {
        for (int ik = 0; ik < 3; ++ik) {
          if (ik > 0 && !method_is_weighted(m) && m != Method::kSweep) continue;
          Importance imp;
          if (ik == 1) imp = {ImportanceKind::kPerColumn, imp_col.data()};
          if (ik == 2) imp = {ImportanceKind::kPerElement, imp_el.data()};
          QuantConfig cfg;
          cfg.block = block;
          cfg.selector.method = m;
          if (m == Method::kSweep) cfg.selector.window = Window{-5, 9};
          cfg.threads = 1;
          cfg.reference_only = true;
          const QuantizedTensor ref = quantize(tc.x.data(), tc.rows, tc.cols, imp, cfg);
          cfg.reference_only = false;
          for_each_target([&](const std::string& tn) {
            const std::string what = tc.name + " / " + std::string(kMethodNames.name(m)) +
                                     " / block " + std::to_string(block) + " / imp " +
                                     std::to_string(ik) + " / " + tn;
            expect_same(ref, quantize(tc.x.data(), tc.rows, tc.cols, imp, cfg), what);
          });
        }
      }
    }
  }
}

TEST(SimdQuantize, DtypesGlobalScalesAndWindows) {
  std::mt19937 rng(8);
  std::normal_distribution<float> g;
  const int64_t rows = 13, cols = 150;
  std::vector<uint16_t> bf(static_cast<size_t>(rows * cols)), hf(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    const float v = g(rng) * ((i / 16) % 4 == 3 ? 1e-3f : 1.0f);
    bf[i] = format::f32_to_bf16(v);
    hf[i] = format::f32_to_f16(v);
  }
  struct Cfg {
    Method m;
    std::optional<Window> win;
    std::optional<float> gs, c;
  };
  const Cfg cfgs[] = {
      {Method::kSweepMse, Window{-1, 2}, {}, {}}, {Method::kSweepWmse, Window{0, 0}, {}, {}},
      {Method::kSweep, Window{-20, 30}, {}, {}},  {Method::kAbsMax, {}, 1e6f, {}},
      {Method::kSweepMse, {}, 1e-6f, {}},         {Method::kExhaustiveMse, {}, {}, 448.0f},
      {Method::kFourOverSix, {}, 1e-9f, {}},      {Method::kExhaustiveWmse, {}, 3e4f, {}},
      {Method::kSweepWmse, {}, 5e13f, {}},  // block amax beyond the fast range: per-block fallback
  };
  for (const auto& c : cfgs) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      QuantConfig cfg;
      cfg.selector.method = c.m;
      cfg.selector.window = c.win;
      cfg.global_scale = c.gs;
      cfg.max_block_scale = c.c;
      cfg.threads = 1;
      const void* x = dt == DType::kBF16 ? static_cast<const void*>(bf.data()) : hf.data();
      cfg.reference_only = true;
      const QuantizedTensor ref = quantize(x, dt, rows, cols, Importance{}, cfg);
      cfg.reference_only = false;
      for_each_target([&](const std::string& tn) {
        expect_same(ref, quantize(x, dt, rows, cols, Importance{}, cfg),
                    std::string(kMethodNames.name(c.m)) + " " + std::string(kDTypeNames.name(dt)) +
                        " " + tn);
      });
    }
  }
}

// Many random blocks per method: the pruned exhaustive search and the restricted-threshold
// kernels against the reference on >= 10^5 blocks (best target only; the per-target test
// above covers the other targets on fewer blocks).
TEST(SimdQuantize, ManyBlocksExhaustiveAndSweeps) {
  std::mt19937 rng(9);
  const int64_t rows = 1000, cols = 16 * 64;  // 64000 blocks of 16 per method
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; i += 16) {
    const auto blk = adversarial_block(rng, 16, static_cast<int>((i / 16) % 5));
    std::copy(blk.begin(), blk.end(), x.begin() + i);
  }
  std::vector<float> imp(static_cast<size_t>(rows * cols));
  std::exponential_distribution<float> e(1.0f);
  for (auto& v : imp) v = (rng() % 9 == 0) ? 0.0f : e(rng);
  for (Method m :
       {Method::kExhaustiveMse, Method::kExhaustiveWmse, Method::kSweepMse, Method::kSweepWmse}) {
    QuantConfig cfg;
    cfg.selector.method = m;
    cfg.global_scale = 1.0f;  // keep the adversarial block scales (subnormal bases included)
    const Importance im{ImportanceKind::kPerElement, imp.data()};
    cfg.reference_only = true;
    const QuantizedTensor ref = quantize(x.data(), rows, cols, im, cfg);
    cfg.reference_only = false;
    expect_same(ref, quantize(x.data(), rows, cols, im, cfg), std::string(kMethodNames.name(m)));
  }
}

// Rows longer than one kernel segment (64 blocks), with a partial last segment and block.
TEST(SimdQuantize, LongRowsSegmentsAndOddK) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g;
  const int64_t rows = 3, cols = 4096 + 1000 + 3;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = g(rng) * ((i / 16) % 7 == 3 ? 1e-5f : 1.0f);
  for (Method m : packed_methods()) {
    if (m == Method::kOptFp8Mse || m == Method::kOptFp8Wmse) continue;  // slow reference
    for (int block : {8, 16, 64}) {
      QuantConfig cfg;
      cfg.block = block;
      cfg.selector.method = m;
      if (m == Method::kSweep) cfg.selector.window = Window{-4, 4};
      cfg.threads = 1;
      cfg.reference_only = true;
      const QuantizedTensor ref = quantize(x.data(), rows, cols, Importance{}, cfg);
      cfg.reference_only = false;
      expect_same(ref, quantize(x.data(), rows, cols, Importance{}, cfg),
                  std::string(kMethodNames.name(m)) + " block " + std::to_string(block));
    }
  }
}

TEST(SimdQuantize, DeterministicForEveryThreadCount) {
  std::mt19937 rng(10);
  std::normal_distribution<float> g;
  const int64_t rows = 301, cols = 272;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = g(rng);
  for (Method m : {Method::kAbsMax, Method::kSweepMse, Method::kExhaustiveWmse}) {
    QuantConfig cfg;
    cfg.selector.method = m;
    cfg.threads = 1;
    const QuantizedTensor one = quantize(x.data(), rows, cols, Importance{}, cfg);
    for (int t : {2, 3, 7, 0}) {
      cfg.threads = t;
      expect_same(one, quantize(x.data(), rows, cols, Importance{}, cfg),
                  std::string(kMethodNames.name(m)) + " threads " + std::to_string(t));
    }
  }
}

// quantize_into: same bytes as quantize(), output capacity reused; with a given global scale
// (no separate input scan, the row kernels check the input) the same bytes as the computed
// one and the same errors as the reference path, from any thread.
TEST(SimdQuantize, QuantizeIntoGivenGlobalScaleAndErrors) {
  std::mt19937 rng(12);
  std::normal_distribution<float> g;
  const int64_t rows = 97, cols = 16 * 70 + 6;  // more than one segment, partial last block
  std::vector<uint16_t> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = format::f32_to_bf16(g(rng));
  std::vector<float> imp(static_cast<size_t>(cols));
  for (auto& w : imp) w = std::fabs(g(rng));
  const Importance im{ImportanceKind::kPerColumn, imp.data()};
  QuantizedTensor out;
  for (Method m : {Method::kAbsMax, Method::kSweepMse, Method::kSweepWmse, Method::kExhaustiveMse,
                   Method::kFourOverSix}) {
    for (int t : {1, 3}) {
      QuantConfig cfg;
      cfg.selector.method = m;
      cfg.threads = t;
      const QuantizedTensor want = quantize(x.data(), DType::kBF16, rows, cols, im, cfg);
      quantize_into(x.data(), DType::kBF16, rows, cols, im, cfg, out);
      expect_same(want, out, std::string(kMethodNames.name(m)) + " into");
      const uint8_t* p = out.codes.data();
      cfg.global_scale = resolve_global_scale(x.data(), DType::kBF16, rows, cols, cfg);
      EXPECT_EQ(cfg.global_scale, want.global_scale);
      quantize_into(x.data(), DType::kBF16, rows, cols, im, cfg, out);
      expect_same(want, out, std::string(kMethodNames.name(m)) + " given gs");
      EXPECT_EQ(out.codes.data(), p);  // no reallocation
    }
  }
  // Errors with a given global scale: the reference path's exact message, wherever the bad
  // element is (first row, a later thread's rows, partial last block).
  for (int64_t bad : {int64_t{5}, rows * cols / 2 + 17, rows * cols - 1}) {
    for (float v : {NAN, INFINITY, -INFINITY}) {
      std::vector<uint16_t> xb = x;
      xb[static_cast<size_t>(bad)] = format::f32_to_bf16(v);
      QuantConfig cfg;
      cfg.selector.method = Method::kSweepMse;
      cfg.global_scale = 100.0f;
      cfg.threads = 2;
      std::string want_msg, got_msg;
      cfg.reference_only = true;
      try {
        quantize(xb.data(), DType::kBF16, rows, cols, Importance{}, cfg, "w");
      } catch (const std::invalid_argument& e) {
        want_msg = e.what();
      }
      cfg.reference_only = false;
      try {
        quantize_into(xb.data(), DType::kBF16, rows, cols, Importance{}, cfg, out, "w");
      } catch (const std::invalid_argument& e) {
        got_msg = e.what();
      }
      EXPECT_FALSE(want_msg.empty());
      EXPECT_EQ(got_msg, want_msg);
      EXPECT_NE(got_msg.find("is " + std::string(std::isnan(v) ? "NaN" : "infinite")),
                std::string::npos)
          << got_msg;
    }
  }
  // A global scale so large that amax * gs > 2^48.
  QuantConfig cfg;
  cfg.selector.method = Method::kAbsMax;
  cfg.global_scale = 1e14f;
  EXPECT_THROW(quantize_into(x.data(), DType::kBF16, rows, cols, Importance{}, cfg, out),
               std::invalid_argument);
  // ... and just below the limit it is accepted (amax < 8, 8 * 3.5e13 < 2^48).
  cfg.global_scale = 3.5e13f;
  cfg.reference_only = true;
  const QuantizedTensor ref = quantize(x.data(), DType::kBF16, rows, cols, Importance{}, cfg);
  cfg.reference_only = false;
  quantize_into(x.data(), DType::kBF16, rows, cols, Importance{}, cfg, out);
  expect_same(ref, out, "gs 3.5e13");
}

TEST(SimdQuantize, LeavesHessianMethodsToTheReference) {
  // The fast kernels decline the block-Hessian methods (quantize() then runs the reference),
  // on every target: a kernel that took them would choose by another objective.
  std::vector<float> x(4 * 32, 0.5f);
  std::vector<double> h(2 * 256, 0.0);
  std::vector<uint8_t> codes(4 * 16), scales(4 * 2);
  detail::RowJob j;
  j.x = x.data();
  j.rows = 4;
  j.cols = 32;
  j.gs = 1.0f;
  j.imp_kind = ImportanceKind::kBlockHessian;
  j.hessian = h.data();
  j.codes = codes.data();
  j.scales = scales.data();
  for (Method m : {Method::kSweepHessian, Method::kExhaustiveHessian}) {
    j.selector.method = m;
    bool bad = false;
    EXPECT_FALSE(simd::quantize_rows(j, 0, 4)) << kMethodNames.name(m);
    EXPECT_FALSE(simd::quantize_rows_checked(j, 0, 4, &bad)) << kMethodNames.name(m);
  }
}

}  // namespace
}  // namespace scalesweep

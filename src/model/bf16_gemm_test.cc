#include "model/bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::model {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);             // subnormal tie -> even
  const uint16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));  // sNaN stays NaN
  for (uint32_t h = 0; h < 0x10000u; ++h) {  // every finite bf16 survives the round trip
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isfinite(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
  EXPECT_EQ(bits(bf16_to_f32(0x4049)), 0x40490000u);
}

TEST(Bf16Gemm, ReferenceIsPlainLoop) {
  // 2x3 · (2x3)ᵀ by hand.
  const float af[] = {1, 2, 3, -1, 0.5f, 4}, wf[] = {1, 0, -2, 0.25f, 8, 1};
  uint16_t a[6], w[6];
  f32_to_bf16(af, 6, a);
  f32_to_bf16(wf, 6, w);
  float c[2 * 3] = {};
  bf16_gemm_reference(a, w, 2, 2, 3, c, 3);
  EXPECT_EQ(c[0], 1 - 6);
  EXPECT_EQ(c[1], 0.25f + 16 + 3);
  EXPECT_EQ(c[3], -1 - 8);
  EXPECT_EQ(c[4], -0.25f + 4 + 4);
  EXPECT_EQ(c[2], 0.0f);  // beyond n: untouched (ldc 3)
}

enum class Kind { kNormal, kHuge, kTiny, kSubnormal, kZeros, kMixed, kCancel };

float draw(Kind kind, std::mt19937& rng) {
  std::normal_distribution<float> g;
  std::uniform_int_distribution<int> e(-20, 20);
  switch (kind) {
    case Kind::kNormal:
      return g(rng);
    case Kind::kHuge:
      return g(rng) * 1e17f;  // products up to ~1e35, sums of <= 600 of them stay finite
    case Kind::kTiny:
      return g(rng) * 1e-20f;  // products ~1e-40: subnormal or zero in fp32
    case Kind::kSubnormal:
      return g(rng) * 1e-39f;  // subnormal bf16 operands
    case Kind::kZeros:
      return rng() % 3 == 0 ? g(rng) : 0.0f;
    case Kind::kMixed:
      return g(rng) * std::exp2(static_cast<float>(e(rng)));
    case Kind::kCancel:
      return (rng() % 2 ? 1.0f : -1.0f) * (1.0f + static_cast<float>(rng() % 8) / 8.0f);
  }
  return 0;
}

// bf16_gemm against the reference within bf16_gemm_tolerance (bf16_gemm.h) per element.
void compare(int m, int n, int k, Kind ka, Kind kw, uint32_t seed, int64_t ldc_extra = 0) {
  SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
               " kinds=" + std::to_string(static_cast<int>(ka)) + "," +
               std::to_string(static_cast<int>(kw)));
  std::mt19937 rng(seed);
  std::vector<uint16_t> a(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k);
  for (auto& v : a) v = f32_to_bf16(draw(ka, rng));
  for (auto& v : w) v = f32_to_bf16(draw(kw, rng));
  const int64_t ldc = n + ldc_extra;
  std::vector<float> ref(static_cast<size_t>(m * ldc), -7.0f), got(ref);
  bf16_gemm_reference(a.data(), w.data(), m, n, k, ref.data(), ldc);
  bf16_gemm(a.data(), w.data(), m, n, k, got.data(), ldc);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double prod = 0, ops = 0;
      for (int p = 0; p < k; ++p) {
        const double x = bf16_to_f32(a[static_cast<size_t>(i) * k + p]);
        const double y = bf16_to_f32(w[static_cast<size_t>(j) * k + p]);
        prod += std::fabs(x * y);
        ops += std::fabs(x) + std::fabs(y);
      }
      const float r = ref[static_cast<size_t>(i * ldc + j)];
      const float f = got[static_cast<size_t>(i * ldc + j)];
      ASSERT_TRUE(std::isfinite(r) && std::isfinite(f)) << i << "," << j;
      ASSERT_LE(std::fabs(static_cast<double>(f) - r), bf16_gemm_tolerance(prod, ops, k))
          << "element " << i << "," << j << ": fast " << f << " reference " << r;
    }
  for (int i = 0; i < m; ++i)  // the padding of each output row is left alone
    for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(got[static_cast<size_t>(i * ldc + j)], -7.0f);
}

TEST(Bf16Gemm, MatchesReference) {
  if (!bf16_gemm_available()) GTEST_SKIP() << "built without oneDNN: no fast bf16 GEMM";
  uint32_t seed = 1;
  for (int m : {1, 2, 3, 7, 17, 64})
    for (int n : {1, 3, 16, 17, 33})
      for (int k : {1, 2, 3, 15, 31, 32, 33, 64, 100, 577})
        compare(m, n, k, Kind::kNormal, Kind::kNormal, seed++);
  compare(130, 200, 576, Kind::kNormal, Kind::kNormal, 99, 5);  // model-like, ldc > n
  compare(5, 7, 33, Kind::kNormal, Kind::kNormal, 98, 3);
}

TEST(Bf16Gemm, AdversarialInputs) {
  if (!bf16_gemm_available()) GTEST_SKIP() << "built without oneDNN: no fast bf16 GEMM";
  const Kind kinds[] = {Kind::kNormal, Kind::kHuge,  Kind::kTiny,  Kind::kSubnormal,
                        Kind::kZeros,  Kind::kMixed, Kind::kCancel};
  uint32_t seed = 1000;
  for (Kind ka : kinds)
    for (Kind kw : kinds) {
      if ((ka == Kind::kHuge) && (kw == Kind::kHuge)) continue;  // would overflow fp32
      for (int k : {1, 5, 32, 67, 600}) compare(3, 5, k, ka, kw, seed++);
    }
  // All zeros: exactly zero.
  std::vector<uint16_t> z(64 * 64, 0);
  std::vector<float> c(64 * 64, 1.0f);
  bf16_gemm(z.data(), z.data(), 64, 64, 64, c.data(), 64);
  for (float v : c) ASSERT_EQ(v, 0.0f);
}

TEST(Bf16Gemm, RefusesBadSizes) {
  if (!bf16_gemm_available()) {
    uint16_t a = 0;
    float c = 0;
    EXPECT_THROW(bf16_gemm(&a, &a, 1, 1, 1, &c, 1), std::runtime_error);
    GTEST_SKIP() << "built without oneDNN: bf16_gemm refuses (checked)";
  }
  uint16_t a[4] = {};
  float c[4] = {};
  EXPECT_THROW(bf16_gemm(a, a, 0, 1, 1, c, 1), std::invalid_argument);
  EXPECT_THROW(bf16_gemm(a, a, 1, 2, 1, c, 1), std::invalid_argument);  // ldc < n
}

// Converts the Linear weights of w to stored bf16 (rounded), in place.
void store_bf16(Weights& w, Tensor& t) {
  auto buf = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(t.numel()));
  f32_to_bf16(t.data, t.numel(), buf->data());
  w.storage.push_back(buf);
  t.raw = buf->data();
  t.data = nullptr;
  t.dtype = WeightDType::kBF16;
}

TEST(ComputeBf16, TransformerPrefill) {
  Config c = testing::small_config();
  c.vocab_size = 300;
  Weights w32 = testing::random_model(c, 21);
  const std::vector<int> toks = testing::token_stream(40, c.vocab_size);
  if (!compute_available(Compute::kBF16)) {
    Transformer tf(std::make_shared<const Weights>(w32));
    EXPECT_THROW(tf.set_compute(Compute::kBF16), std::runtime_error);
    GTEST_SKIP() << "built without oneDNN: --compute bf16 refused (checked)";
  }
  // The same model with bf16-stored Linear weights (the values fp32 weights round to).
  Weights wb = testing::random_model(c, 21);
  for (auto& L : wb.layers)
    for (Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w2, &L.w3}) store_bf16(wb, *t);
  auto p32 = std::make_shared<const Weights>(std::move(w32));
  auto pb = std::make_shared<const Weights>(std::move(wb));
  const std::vector<double> ref = testing::reference_forward(*p32, toks);

  Transformer f32(p32), b32(p32), bb(pb);
  b32.set_compute(Compute::kBF16);
  bb.set_compute(Compute::kBF16);
  EXPECT_EQ(b32.compute(), Compute::kBF16);
  const std::vector<float> lf = f32.forward(toks.data(), 40, 0);
  const std::vector<float> lb = b32.forward(toks.data(), 40, 0);
  const std::vector<float> lbb = bb.forward(toks.data(), 40, 0);
  double worst_f = 0, worst_b = 0, worst_bb = 0, diff = 0;
  for (size_t i = 0; i < lf.size(); ++i) {
    worst_f = std::max(worst_f, std::fabs(lf[i] - ref[i]));
    worst_b = std::max(worst_b, std::fabs(lb[i] - ref[i]));
    worst_bb = std::max(worst_bb, std::fabs(lbb[i] - static_cast<double>(lb[i])));
    diff += lb[i] != lf[i];
  }
  EXPECT_LT(worst_f, 2e-4);  // the default stays the fp32 reference
  // bf16 activations and weights: relative error ~2^-8 per rounding, logits of size ~10.
  EXPECT_LT(worst_b, 0.5) << "bf16 compute far from the fp32 reference";
  EXPECT_GT(diff, 0) << "bf16 compute gave the fp32 bits: the mode is not in effect";
  // fp32 weights rounded per tile and bf16 weights read in place: the same bf16 operands.
  EXPECT_LT(worst_bb, 1e-4);
  // Decode (one row) stays fp32 in both modes: identical bits.
  Transformer d32(p32), db(p32);
  db.set_compute(Compute::kBF16);
  for (int t = 0; t < 5; ++t) {
    const float* x = d32.decode(toks[static_cast<size_t>(t)], t);
    const std::vector<float> xs(x, x + c.vocab_size);
    const float* y = db.decode(toks[static_cast<size_t>(t)], t);
    for (int v = 0; v < c.vocab_size; ++v) ASSERT_EQ(bits(xs[static_cast<size_t>(v)]), bits(y[v]));
  }
}

TEST(ComputeBf16, Names) {
  EXPECT_EQ(kComputeNames.parse("bf16"), Compute::kBF16);
  EXPECT_EQ(kComputeNames.parse("fp32"), Compute::kF32);
  EXPECT_EQ(kComputeNames.name(Compute::kBF16), "bf16");
  EXPECT_THROW(kComputeNames.parse("fp16"), std::invalid_argument);
  EXPECT_TRUE(compute_available(Compute::kF32));
}

}  // namespace
}  // namespace scalesweep::model

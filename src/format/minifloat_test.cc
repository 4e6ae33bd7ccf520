#include "scalesweep/format/minifloat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace scalesweep::format {
namespace {

TEST(E2M1, AllSixteenCodes) {
  const float expect[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 16; ++c) {
    const float v = E2M1::decode_f(c);
    EXPECT_EQ(std::fabs(v), expect[c & 7]) << c;
    EXPECT_EQ(std::signbit(v), c >= 8) << c;
    EXPECT_EQ(kFp4Values.v[c], v);
    // Every value encodes back to its own code.
    EXPECT_EQ(E2M1::encode_rne(v), c) << c;
  }
  EXPECT_EQ(E2M1::kMaxValue, 6.0);
}

TEST(E2M1, TiesToEvenAtEveryMidpoint) {
  // SPEC: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float to[7] = {0, 1, 1, 2, 2, 4, 4};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(E2M1::decode_f(E2M1::encode_rne(mid[i])), to[i]) << mid[i];
    EXPECT_EQ(E2M1::decode_f(E2M1::encode_rne(-mid[i])), -to[i]) << mid[i];
    // Just off the midpoint goes to the nearer neighbour.
    const float up = std::nextafter(mid[i], 10.0f), dn = std::nextafter(mid[i], 0.0f);
    EXPECT_GT(E2M1::decode_f(E2M1::encode_rne(up)), mid[i]);
    EXPECT_LT(E2M1::decode_f(E2M1::encode_rne(dn)), mid[i]);
  }
  EXPECT_EQ(E2M1::decode_f(E2M1::encode_rne(7.0f)), 6.0f);  // saturates
  EXPECT_EQ(E2M1::decode_f(E2M1::encode_rne(1e30f)), 6.0f);
  EXPECT_EQ(E2M1::decode_f(E2M1::encode_rne(-std::numeric_limits<float>::infinity())), -6.0f);
  EXPECT_EQ(E2M1::encode_rne(-0.1f), 0x8u);  // keeps the sign of zero, as cvt does
}

TEST(E4M3, All256Patterns) {
  int finite = 0;
  for (uint32_t p = 0; p < 256; ++p) {
    const double v = E4M3::decode(p);
    if ((p & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << p;
      continue;
    }
    ++finite;
    // Exact against the OCP definition.
    const int a = (p >> 3) & 15, b = p & 7;
    const double ref =
        (a == 0 ? b / 8.0 * std::ldexp(1.0, -6) : (1 + b / 8.0) * std::ldexp(1.0, a - 7));
    EXPECT_EQ(std::fabs(v), ref) << p;
    EXPECT_EQ(static_cast<double>(E4M3::decode_f(p)), v) << p;  // exactly a float
    EXPECT_EQ(E4M3::encode_rne(static_cast<float>(v)), p) << p;
    EXPECT_EQ(E4M3::encode_floor(static_cast<float>(v)), p) << p;
    EXPECT_EQ(E4M3::encode_ceil(static_cast<float>(v)), p) << p;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(E4M3::kMaxValue, 448.0);
  EXPECT_EQ(E4M3::kMaxPattern, 126u);
  EXPECT_EQ(E4M3::decode(1), std::ldexp(1.0, -9));
  // Monotone on the positive patterns.
  for (uint32_t p = 1; p <= 126; ++p) EXPECT_LT(E4M3::decode(p - 1), E4M3::decode(p));
}

TEST(E4M3, MidpointsFloorCeilAndSaturation) {
  for (uint32_t p = 0; p < 126; ++p) {
    const double lo = E4M3::decode(p), hi = E4M3::decode(p + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: 5 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint32_t even = (p % 2 == 0) ? p : p + 1;
    EXPECT_EQ(E4M3::encode_rne(mid), even) << p;
    EXPECT_EQ(E4M3::encode_rne(-mid), even | 0x80) << p;
    EXPECT_EQ(E4M3::encode_rne(std::nextafter(mid, 0.0f)), p);
    EXPECT_EQ(E4M3::encode_rne(std::nextafter(mid, 1e9f)), p + 1);
    EXPECT_EQ(E4M3::encode_floor(mid), p);
    EXPECT_EQ(E4M3::encode_ceil(mid), p + 1);
    EXPECT_EQ(E4M3::encode_floor(-mid), (p + 1) | 0x80);
    EXPECT_EQ(E4M3::encode_ceil(-mid), p | 0x80);
    EXPECT_EQ(E4M3::encode(mid, Round::kTowardZero), p);
    EXPECT_EQ(E4M3::next_up(p), p + 1);
    EXPECT_EQ(E4M3::next_down(p + 1), p);
  }
  EXPECT_EQ(E4M3::encode_rne(464.0f), 126u);  // above the last midpoint: still saturates
  EXPECT_EQ(E4M3::encode_rne(1e20f), 126u);
  EXPECT_EQ(E4M3::encode_ceil(449.0f), 126u);
  EXPECT_EQ(E4M3::encode_rne(std::numeric_limits<float>::infinity()), 126u);
  EXPECT_EQ(E4M3::encode_rne(std::nanf("")), 0x7Fu);
  EXPECT_EQ(E4M3::encode_rne(std::ldexp(1.0f, -11)), 0u);    // half of min subnormal: even
  EXPECT_EQ(E4M3::encode_ceil(std::ldexp(1.0f, -100)), 1u);  // tiny: ceil to min subnormal
  EXPECT_EQ(E4M3::encode_floor(std::ldexp(1.0f, -100)), 0u);
  EXPECT_EQ(E4M3::encode_rne(1e-45f), 0u);  // float subnormal input
  EXPECT_EQ(E4M3::next_up(126), 126u);
  EXPECT_EQ(E4M3::next_down(0), 0u);
}

TEST(E4M3, RandomAgainstBruteForceNearest) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> lg(-14.0f, 10.0f);
  for (int it = 0; it < 200000; ++it) {
    const float x = std::exp2(lg(rng)) * (rng() & 1 ? 1.0f : 1.0f);
    // Brute force: nearest finite value, ties to the even pattern; saturation above 448.
    uint32_t best = 0;
    double bd = 1e300;
    for (uint32_t p = 0; p <= 126; ++p) {
      const double d = std::fabs(E4M3::decode(p) - x);
      if (d < bd || (d == bd && (p % 2 == 0))) {
        bd = d;
        best = p;
      }
    }
    ASSERT_EQ(E4M3::encode_rne(x), best) << x;
    const uint32_t f = E4M3::encode_floor(x), c = E4M3::encode_ceil(x);
    ASSERT_LE(E4M3::decode(f), x);
    if (x <= 448) {
      ASSERT_GE(E4M3::decode(c), x);
      ASSERT_LE(c - f, 1u);
    }
  }
}

TEST(UE8M0, PowersOfTwoAndNan) {
  for (uint32_t p = 0; p < 255; ++p) {
    EXPECT_EQ(UE8M0::decode(p), std::ldexp(1.0, static_cast<int>(p) - 127)) << p;
    EXPECT_EQ(UE8M0::encode_rne(UE8M0::decode_f(p)), p) << p;
  }
  EXPECT_TRUE(std::isnan(UE8M0::decode(255)));
  // 3 is the midpoint of 2 and 4. With no mantissa bits the significand 1.1b rounds to the
  // even significand 10b, i.e. up: 4 (pattern 129). MX scale selection uses floor/ceil anyway.
  EXPECT_EQ(UE8M0::encode_rne(3.0f), 129u);
  EXPECT_EQ(UE8M0::encode_floor(3.0f), 128u);
  EXPECT_EQ(UE8M0::encode_ceil(3.0f), 129u);
  EXPECT_EQ(UE8M0::encode_rne(2.9f), 128u);
  EXPECT_EQ(UE8M0::encode_rne(3.1f), 129u);
  EXPECT_EQ(UE8M0::encode_rne(-1.0f), 255u);  // negative: NaN in an unsigned format
}

TEST(Generic, OtherFormatsRoundTrip) {
  auto check = [](auto fmt, double maxv) {
    using F = decltype(fmt);
    EXPECT_EQ(F::kMaxValue, maxv);
    for (uint32_t p = 0; p < F::kNumPatterns; ++p) {
      if (F::is_nan(p) || F::is_inf(p)) continue;
      EXPECT_EQ(F::encode_rne(F::decode_f(p)), p) << p;
    }
  };
  check(E3M2{}, 28.0);
  check(E2M3{}, 7.5);
  check(E5M2{}, 57344.0);
  EXPECT_TRUE(E5M2::is_inf(0x7C));
  EXPECT_EQ(E5M2::encode_rne(1e9f), 0x7Cu);  // IEEE-style: overflow to Inf
}

}  // namespace
}  // namespace scalesweep::format

namespace scalesweep::format {
namespace {
TEST(Half, Bf16AndF16WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double b = BF16::decode(h), f = F16::decode(h);
    const float fb = bf16_to_f32(static_cast<uint16_t>(h)),
                ff = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(fb));
    } else {
      ASSERT_EQ(static_cast<double>(fb), b) << h;
      ASSERT_EQ(f32_to_bf16(fb), h) << h;
    }
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(ff));
    } else {
      ASSERT_EQ(static_cast<double>(ff), f) << h;
      if (!std::isinf(f)) {
        ASSERT_EQ(f32_to_f16(ff), h) << h;
      }
    }
  }
}
}  // namespace
}  // namespace scalesweep::format

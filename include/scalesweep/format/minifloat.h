// One generic minifloat codec (paper Appendix A; SPEC "Formats").
//
// A format is  [sign] exponent(E bits) mantissa(M bits), with bias, an optional subnormal
// range and a NaN/Inf policy as template parameters. Everything is constexpr and usable from
// host and CUDA device code; no dependencies.
//
// Patterns are unsigned integers whose low E+M bits are exponent|mantissa and whose next
// bit (for signed formats) is the sign. For non-negative values the pattern is monotone in
// the value (SPEC: I(v) is monotone), which the sweeps rely on.
#pragma once

#include <cstdint>

#include "scalesweep/base/names.h"

#if defined(__CUDACC__)
#define SS_HD __host__ __device__
#else
#define SS_HD
#endif

namespace scalesweep::format {

enum class NanPolicy {
  kFiniteOnly,  // every pattern is a finite number (FP4 E2M1)
  kAllOnesNan,  // exponent and mantissa all ones is NaN, no Inf (FP8 E4M3 "fn", UE8M0)
  kIeee,        // max exponent: mantissa 0 is Inf, otherwise NaN (E5M2, FP16)
};

enum class Round {
  kNearestEven,  // round to nearest, ties to even, saturate to the max finite
  kFloor,        // largest representable <= x (saturates at -max)
  kCeil,         // smallest representable >= x (saturates at +max)
  kTowardZero,
};

inline constexpr auto kNanPolicyNames =
    make_names<NanPolicy>("NaN policy", {{NanPolicy::kFiniteOnly, "finite-only"},
                                         {NanPolicy::kAllOnesNan, "all-ones-nan"},
                                         {NanPolicy::kIeee, "ieee"}});
// "nearest-even" and "trunc" are accepted for rne and toward-zero.
inline constexpr auto kRoundNames =
    make_names<Round>("rounding", {{Round::kNearestEven, "rne"},
                                   {Round::kFloor, "floor"},
                                   {Round::kCeil, "ceil"},
                                   {Round::kTowardZero, "toward-zero"},
                                   {Round::kNearestEven, "nearest-even"},
                                   {Round::kTowardZero, "trunc"}});

namespace detail {
SS_HD constexpr uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
SS_HD constexpr float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
SS_HD constexpr double f64_from_bits(uint64_t u) { return __builtin_bit_cast(double, u); }
// 2^e exactly, for -1074 <= e <= 1023.
SS_HD constexpr double exp2i(int e) {
  if (e >= -1022) return f64_from_bits(static_cast<uint64_t>(e + 1023) << 52);
  return f64_from_bits(uint64_t{1} << (e + 1074));
}
SS_HD constexpr int clz32(uint32_t x) {
  int n = 0;
  if (x == 0) return 32;
  while (!(x & 0x80000000u)) {
    x <<= 1;
    ++n;
  }
  return n;
}
}  // namespace detail

template <int E, int M, bool Signed, int Bias, NanPolicy Policy, bool Subnormals = true>
struct Minifloat {
  static_assert(E >= 1 && E <= 8 && M >= 0 && M <= 10);
  static constexpr int kExpBits = E;
  static constexpr int kManBits = M;
  static constexpr int kBias = Bias;
  static constexpr bool kSigned = Signed;
  static constexpr bool kSubnormals = Subnormals;
  static constexpr NanPolicy kPolicy = Policy;
  static constexpr int kBits = E + M + (Signed ? 1 : 0);
  static constexpr uint32_t kNumPatterns = 1u << kBits;
  static constexpr uint32_t kMagMask = (1u << (E + M)) - 1;
  static constexpr uint32_t kSignBit = Signed ? (1u << (E + M)) : 0u;
  static constexpr uint32_t kManMask = (1u << M) - 1;
  static constexpr uint32_t kMaxExpField = (1u << E) - 1;
  // Exponent of the smallest normal binade (exponent field 1, or 0 without subnormals).
  static constexpr int kEmin = Subnormals ? 1 - Bias : -Bias;

  // Largest finite positive pattern.
  static constexpr uint32_t kMaxPattern = Policy == NanPolicy::kFiniteOnly ? kMagMask
                                          : Policy == NanPolicy::kAllOnesNan
                                              ? kMagMask - 1
                                              : (kMaxExpField << M) - 1;
  // Canonical positive NaN pattern (0 when the format has none).
  static constexpr uint32_t kNanPattern = Policy == NanPolicy::kFiniteOnly   ? 0u
                                          : Policy == NanPolicy::kAllOnesNan ? kMagMask
                                                                             : kMagMask;

  SS_HD static constexpr bool is_nan(uint32_t p) {
    const uint32_t mag = p & kMagMask;
    if constexpr (Policy == NanPolicy::kFiniteOnly) return false;
    if constexpr (Policy == NanPolicy::kAllOnesNan) return mag == kMagMask;
    return (mag >> M) == kMaxExpField && (mag & kManMask) != 0;
  }
  SS_HD static constexpr bool is_inf(uint32_t p) {
    if constexpr (Policy != NanPolicy::kIeee) return false;
    return (p & kMagMask) == (kMaxExpField << M);
  }
  SS_HD static constexpr bool is_negative(uint32_t p) { return (p & kSignBit) != 0; }

  // Exact value of a pattern as double (NaN for NaN patterns, +-Inf for Inf patterns).
  SS_HD static constexpr double decode(uint32_t p) {
    p &= kNumPatterns - 1;
    const double sign = (p & kSignBit) ? -1.0 : 1.0;
    if (is_nan(p)) return __builtin_nan("");
    if (is_inf(p)) return sign * __builtin_inf();
    const uint32_t mag = p & kMagMask;
    const int a = static_cast<int>(mag >> M);
    const int b = static_cast<int>(mag & kManMask);
    if (Subnormals && a == 0) return sign * b * detail::exp2i(kEmin - M);
    return sign * ((1 << M) + b) * detail::exp2i(a - Bias - M);
  }
  // Every finite value of these formats is exactly a float (checked by the tests).
  SS_HD static constexpr float decode_f(uint32_t p) { return static_cast<float>(decode(p)); }

  static constexpr double kMaxValue = decode(kMaxPattern);

  // Encode a float with the given rounding. Finite results saturate to +-max finite
  // ("satfinite"); NaN gives the NaN pattern, or, for a format without NaN, +max
  // (documented choice; the tensor layer rejects NaN before it gets here).
  // Unsigned formats map negative inputs to NaN (or 0 if the format has no NaN).
  SS_HD static constexpr uint32_t encode(float x, Round mode = Round::kNearestEven) {
    uint32_t fb = detail::f32_bits(x);
    const bool neg = (fb >> 31) != 0;
    fb &= 0x7FFFFFFFu;
    if (fb > 0x7F800000u) return Policy == NanPolicy::kFiniteOnly ? kMaxPattern : kNanPattern;
    if (neg && !Signed) {
      if (fb == 0) return 0;
      return Policy == NanPolicy::kFiniteOnly ? 0u : kNanPattern;
    }
    // Directed rounding of a negative number is the opposite rounding of its magnitude.
    Round mag_mode = mode;
    if (neg && mode == Round::kFloor)
      mag_mode = Round::kCeil;
    else if (neg && mode == Round::kCeil)
      mag_mode = Round::kFloor;
    const uint32_t mag = encode_magnitude(fb, mag_mode);
    return mag | (neg ? kSignBit : 0u);
  }

  SS_HD static constexpr uint32_t encode_rne(float x) { return encode(x, Round::kNearestEven); }
  SS_HD static constexpr uint32_t encode_floor(float x) { return encode(x, Round::kFloor); }
  SS_HD static constexpr uint32_t encode_ceil(float x) { return encode(x, Round::kCeil); }

  // Neighbouring finite patterns in value order, on the non-negative patterns
  // (0 .. kMaxPattern); they stop at the ends.
  SS_HD static constexpr uint32_t next_up(uint32_t p) { return p < kMaxPattern ? p + 1 : p; }
  SS_HD static constexpr uint32_t next_down(uint32_t p) { return p > 0 ? p - 1 : p; }

 private:
  // |x| given as its float32 bit pattern (finite or Inf), positive result pattern.
  SS_HD static constexpr uint32_t encode_magnitude(uint32_t fb, Round mode) {
    if (fb == 0x7F800000u) {  // Inf
      if constexpr (Policy == NanPolicy::kIeee) {
        if (mode == Round::kNearestEven || mode == Round::kCeil) return kMaxExpField << M;
      }
      return kMaxPattern;
    }
    if (fb == 0) return 0;  // zero, or the smallest value of a format without zero
    // |x| = sig * 2^ex with sig a 24-bit integer.
    const uint32_t fexp = fb >> 23;
    uint64_t sig = fb & 0x7FFFFFu;
    int ex;
    int k;  // floor(log2 |x|)
    if (fexp == 0) {
      ex = -149;
      k = -149 + (31 - detail::clz32(static_cast<uint32_t>(sig)));
    } else {
      sig |= 0x800000u;
      ex = static_cast<int>(fexp) - 150;
      k = static_cast<int>(fexp) - 127;
    }
    // Saturate early (also keeps the shifts below in range).
    const int kMaxExp = static_cast<int>(kMaxPattern >> M) - Bias;
    if (k > kMaxExp + 1) return saturate_high(mode);
    const int te = k > kEmin ? k : kEmin;  // binade of the result
    const int qe = te - M;                 // exponent of one unit in the last place
    const int shift = qe - ex;
    uint64_t n;
    if (shift <= 0) {
      n = sig << (-shift);  // exact
    } else {
      const bool all_below = shift > 40;
      const uint64_t q = all_below ? 0 : (sig >> shift);
      const uint64_t rem = all_below ? sig : (sig & ((uint64_t{1} << shift) - 1));
      const uint64_t half = all_below ? (uint64_t{1} << 62) : (uint64_t{1} << (shift - 1));
      n = q;
      switch (mode) {
        case Round::kNearestEven:
          if (rem > half || (rem == half && (q & 1))) ++n;
          break;
        case Round::kCeil:
          if (rem != 0) ++n;
          break;
        case Round::kFloor:
        case Round::kTowardZero:
          break;
      }
    }
    // Result value n * 2^qe. With subnormals the pattern of the lowest binade is n itself,
    // and a carry out of the mantissa moves into the exponent field by plain addition.
    uint64_t pattern;
    if constexpr (Subnormals) {
      pattern = (static_cast<uint64_t>(te - kEmin) << M) + n;
    } else {
      if (n < (uint64_t{1} << M)) {  // below the smallest value (no zero in the format)
        return 0;
      }
      pattern = (static_cast<uint64_t>(te - kEmin) << M) + (n - (uint64_t{1} << M));
    }
    if (pattern > kMaxPattern) return saturate_high(mode);
    return static_cast<uint32_t>(pattern);
  }
  SS_HD static constexpr uint32_t saturate_high(Round mode) {
    if constexpr (Policy == NanPolicy::kIeee) {
      if (mode == Round::kNearestEven || mode == Round::kCeil) return kMaxExpField << M;  // Inf
    }
    (void)mode;
    return kMaxPattern;
  }
};

// The formats of NVFP4 / MXFP4 (OCP MX spec, SPEC "Formats").
using E2M1 = Minifloat<2, 1, true, 1, NanPolicy::kFiniteOnly>;  // FP4 values
using E4M3 = Minifloat<4, 3, true, 7, NanPolicy::kAllOnesNan>;  // FP8 e4m3fn (NVFP4 scales)
using UE8M0 = Minifloat<8, 0, false, 127, NanPolicy::kAllOnesNan, false>;  // MX scales
// Further element formats used by the bounds derivation (MXFP6/MXFP8).
using E3M2 = Minifloat<3, 2, true, 3, NanPolicy::kFiniteOnly>;
using E2M3 = Minifloat<2, 3, true, 1, NanPolicy::kFiniteOnly>;
using E5M2 = Minifloat<5, 2, true, 15, NanPolicy::kIeee>;
// 16-bit input formats of checkpoints and activations.
using F16 = Minifloat<5, 10, true, 15, NanPolicy::kIeee>;
using BF16 = Minifloat<8, 7, true, 127, NanPolicy::kIeee>;

// Fast exact widening of the 16-bit formats (bf16 is the top half of a float).
SS_HD constexpr float bf16_to_f32(uint16_t h) {
  return detail::f32_from_bits(static_cast<uint32_t>(h) << 16);
}
SS_HD constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return detail::f32_from_bits(sign | 0x7F800000u | (m << 13));  // Inf/NaN
  if (e != 0) return detail::f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
  // zero / subnormal: m * 2^-24, exact in float
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}
// Round-to-nearest-even narrowing (NaN stays NaN, overflow goes to Inf as IEEE does).
SS_HD constexpr uint16_t f32_to_bf16(float f) {
  uint32_t u = detail::f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
SS_HD constexpr uint16_t f32_to_f16(float f) { return static_cast<uint16_t>(F16::encode_rne(f)); }

// Fast exact tables.
struct Fp4Table {
  float v[16];
};
SS_HD constexpr Fp4Table make_fp4_table() {
  Fp4Table t{};
  for (uint32_t i = 0; i < 16; ++i) t.v[i] = E2M1::decode_f(i);
  return t;
}
inline constexpr Fp4Table kFp4Values = make_fp4_table();

}  // namespace scalesweep::format

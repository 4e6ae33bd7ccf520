// The half2 candidate loss of the CUDA operator's Numerics::kHalf2 sweeps, host+device (SS_HD):
// the GPU kernels run it in packed fp16x2 arithmetic (two elements per instruction), the CPU
// emulation runs the same code on a software fp16 whose every operation is the IEEE binary16
// operation with one rounding to nearest even (h_round), so the two give the same bytes
// (gpu_test.cc CudaGpuHalf2), and the CPU tests check the selections against the exhaustive
// optimum (host_test.cc CudaHalf2).
//
// Per block, the |y| values are scaled by f = 2^-E (E = the exponent of the block maximum a, so
// a f in [1, 2); exact in float) and rounded to fp16 pairs ah; each candidate scale s (an E4M3
// value) becomes sh = fp16(s f), exact (4 significant bits, and s f lies in [1/24, 2/3] for the
// windows of bases P >= 16), and ih = fp16(fl(1/s) / f). Per element pair, as fast_quant.h but
// in fp16x2:
//     r = RN(ah * ih)                      clamped to 6 for the candidates s <= a/6 only
//     M = 2^floor(log2(max(r, 1)))         the exponent field of max(r, 1), per half
//     t = RN(M 2^9 + r),  q = RN(t - M 2^9) RNE of r onto the E2M1 grid: in fp16 the binades
//                                          [2^9, 2^10), [2^10, 2^11), [2^11, 2^12) have ulps
//                                          .5, 1, 2, the E2M1 steps (fast_quant.h's argument
//                                          with 2^9 for 2^22); q is exact
//     e = RN(ah - q sh)                    q sh is exact (at most 5 significant bits); e itself
//                                          is exact for q > 0 (Sterbenz: ah / (q sh) lies in
//                                          [1/2, 2] when q is ah/sh's nearest level)
//     L = RN(e e + L)  (weighted: RN(RN(e wh) e + L), wh = fp16(w g), g = 2^-E_w of the block's
//                       largest weight)
// then the two halves' sums are added in float. The estimate differs from the contract loss
// (times f^2, or f^2 g) by: ah's rounding (|ah - ay f| <= 2^-11 ay f: the same perturbation of
// the block for every candidate), r's two roundings (an element within ~2^-10 of a level
// threshold can take the other neighbour: at most 28 * 2^-10 of that element's own term, as
// fast_quant.h's argument), the rounding of e e and of the 8-term fp16 sums (2^-11 each), and the
// flush of terms below 2^-24 f^-2. The selection is the first minimum of the estimates in
// pattern order, so it can pick another scale only where two candidates' contract losses lie
// within about 1e-2 of each other (relative); host_test.cc and gpu_test.cc measure how far the
// chosen scale's contract loss is from the optimum (docs/CUDA.md "half2 numerics").
// Bases P < 16 (E4M3-subnormal scales, blocks far below the tensor's maximum) take the fp32 fast
// path (fast_scan): there the window's scales span more than fp16's range after scaling.
#pragma once

#include <cstdint>

#include "kernels/cuda/fast_quant.h"
#include "scalesweep/cuda/layout.h"
#include "scalesweep/format/minifloat.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace scalesweep::cuda::kern {

// ---- fp16x2 in a uint32 (element 2q in the low half, 2q + 1 in the high half)

// fp16 bits -> float (exact; the device's cvt, not the format code's branches).
SS_HD inline float h_to_f32(uint32_t h16) {
#if defined(__CUDA_ARCH__)
  float f;
  const unsigned short u = static_cast<unsigned short>(h16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(u));
  return f;
#else
  return format::f16_to_f32(static_cast<uint16_t>(h16));
#endif
}

#if !defined(__CUDA_ARCH__)
// Host: v (a double) rounded to the nearest fp16, ties to even; `tail` != 0 says the exact
// value is v + tail with |tail| far below v's fp16 ulp (TwoSum remainder), which decides a v
// that lies exactly halfway between two fp16 values. Overflow gives infinity.
inline uint16_t h_round(double v, double tail = 0.0) {
  const uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
  double m = std::fabs(v);
  if (m == 0.0) return sign;  // an exact zero sum (TwoSum's tail is then 0 too)
  int ex = 0;
  (void)std::frexp(m, &ex);  // m = f 2^ex, f in [.5, 1): exponent of m is ex - 1
  const int e = ex - 1 < -14 ? -14 : ex - 1;
  const double quantum = std::ldexp(1.0, e - 10);
  const double units = m / quantum;  // exact (power-of-two scaling)
  double fl = std::floor(units);
  const double frac = units - fl;
  const double t = sign ? -tail : tail;  // the tail in |v|'s direction
  bool up;
  if (frac > 0.5)
    up = true;
  else if (frac < 0.5)
    up = false;
  else if (t != 0.0)
    up = t > 0;
  else
    up = std::fmod(fl, 2.0) != 0.0;
  if (up) fl += 1.0;
  const double r = fl * quantum;
  if (r >= 65536.0) return sign | 0x7C00u;
  return sign | format::f32_to_f16(static_cast<float>(r));  // exact value: exact encoding
}
inline double h_val(uint32_t h16) { return static_cast<double>(h_to_f32(h16)); }
template <typename F>
inline uint32_t h2_map(uint32_t a, uint32_t b, uint32_t c, F f) {
  return f(a & 0xFFFFu, b & 0xFFFFu, c & 0xFFFFu) |
         (static_cast<uint32_t>(f(a >> 16, b >> 16, c >> 16)) << 16);
}
#endif

// Per half: RN(a * b).
SS_HD inline uint32_t h2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return h2_map(a, b, 0u, [](uint32_t x, uint32_t y, uint32_t) -> uint32_t {
    return h_round(h_val(x) * h_val(y));  // exact product in double
  });
#endif
}
// Per half: RN(a * b + c), one rounding.
SS_HD inline uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return h2_map(a, b, c, [](uint32_t x, uint32_t y, uint32_t z) -> uint32_t {
    const double p = h_val(x) * h_val(y), q = h_val(z);  // p exact
    const double s = p + q, bb = s - p;
    const double err = (p - (s - bb)) + (q - bb);  // TwoSum: s + err == p + q exactly
    return h_round(s, err);
  });
#endif
}
// Per half: min / max of non-NaN values.
SS_HD inline uint32_t h2_min(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("min.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return h2_map(a, b, 0u, [](uint32_t x, uint32_t y, uint32_t) -> uint32_t {
    return h_val(y) < h_val(x) ? y : x;
  });
#endif
}
SS_HD inline uint32_t h2_max(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return h2_map(a, b, 0u, [](uint32_t x, uint32_t y, uint32_t) -> uint32_t {
    return h_val(y) > h_val(x) ? y : x;
  });
#endif
}
// (fp16(lo), fp16(hi)) rounded to nearest even from floats.
SS_HD inline uint32_t h2_from_f32(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return format::f32_to_f16(lo) | (static_cast<uint32_t>(format::f32_to_f16(hi)) << 16);
#endif
}
// fp16x2 constant with both halves = v (an exact fp16 value).
constexpr uint32_t kH2(float v) {
  return static_cast<uint32_t>(format::f32_to_f16(v)) |
         (static_cast<uint32_t>(format::f32_to_f16(v)) << 16);
}

// 2^-E for the exponent E of a finite x >= 0 (for a normal x,
// x 2^-E in [1, 2)); exact, a power of two in float's normal range. A zero or subnormal x
// counts as exponent -126.
SS_HD inline uint32_t biased_exponent(float x) {
  const uint32_t e = (format::detail::f32_bits(x) >> 23) & 0xFFu;
  return e == 0u ? 1u : e;
}
SS_HD inline float pow2_inv_exponent(float x) {
  return format::detail::f32_from_bits((254u - biased_exponent(x)) << 23);
}

// The block in fp16 pairs: ah (|y| f), wh (w g) for the weighted loss.
struct Half2Block {
  uint32_t ah[kBlock / 2];
  uint32_t wh[kBlock / 2];
  float f;         // 2^-E(a)
  float finv;      // 2^E(a)
  uint32_t amax2;  // fp16(a f) in both halves (the block maximum's ah)
  uint32_t wa2;    // fp16(w_a g) in both halves (the block maximum's wh; weighted only)
};
template <bool kWeighted>
SS_HD inline Half2Block half2_block(const float (&ay)[kBlock], const float (&w)[kBlock], float a) {
  Half2Block b;
  b.f = pow2_inv_exponent(a);
  b.finv = format::detail::f32_from_bits(biased_exponent(a) << 23);
  b.amax2 = h2_from_f32(a * b.f, a * b.f);
  float wmax = 0.0f;
  if constexpr (kWeighted) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kBlock; ++i) wmax = fast_max(wmax, w[i]);
  }
  const float g = kWeighted && wmax > 0.0f ? pow2_inv_exponent(wmax) : 1.0f;
  const float w_a = kWeighted ? weight_of_max(ay, w, a) : 0.0f;
  b.wa2 = h2_from_f32(w_a * g, w_a * g);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < kBlock / 2; ++q) {
    b.ah[q] = h2_from_f32(ay[2 * q] * b.f, ay[2 * q + 1] * b.f);  // exact products
    if constexpr (kWeighted)
      b.wh[q] = h2_from_f32(w[2 * q] * g, w[2 * q + 1] * g);
    else
      b.wh[q] = 0u;
  }
  return b;
}

// The half2 loss estimate of the candidate with scale fp16x2 sh2 (both halves s f) and
// reciprocal ih2 (both halves fp16(fl(1/s) / f)); kClamp: s <= a/6 (see fast_quant.h).
template <bool kWeighted, bool kClamp>
SS_HD inline float half2_candidate_loss(const Half2Block& b, uint32_t nsh2, uint32_t ih2) {
  uint32_t L = 0u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < kBlock / 2; ++q) {
    uint32_t r = h2_mul(b.ah[q], ih2);
    if constexpr (kClamp) r = h2_min(r, kH2(6.0f));
    const uint32_t M = h2_max(r, kH2(1.0f)) & 0x7C007C00u;
    const uint32_t t = h2_fma(M, kH2(512.0f), r);
    const uint32_t lev = h2_fma(M, kH2(-512.0f), t);
    const uint32_t e = h2_fma(lev, nsh2, b.ah[q]);  // ah - q s
    if constexpr (kWeighted)
      L = h2_fma(h2_mul(e, b.wh[q]), e, L);
    else
      L = h2_fma(e, e, L);
  }
  return h_to_f32(L & 0xFFFFu) + h_to_f32(L >> 16);
}

// The selection contract of kHalf2 (tested on the CPU and on >= 10^8 blocks on the GPU): the
// chosen scale's contract loss lf exceeds the reference optimum lo by at most
//     2^-9 a sqrt(w_a) (sqrt(lf) + sqrt(lo)) + 2^-5 (lf + lo) + 2^-16 a^2 w_a
// (a: the block maximum |y|; w_a: the block's largest weight, 1 unweighted). Derivation: per
// candidate, |estimate - loss| <= 2 sqrt(L) |delta| + (level flips) + (fp16 roundings), with
// delta the fp16 rounding of |y| (|delta| <= 2^-12 |ay| <= 2^-12 4a over 16 elements, weighted by
// sqrt(w)), level flips <= 28 2^-10 of an element's term (fast_quant.h's argument with r's two
// fp16 roundings), the rounding of the squares, weights and 8-term sums <= ~2^-8 L, and terms
// flushed below fp16's subnormals (2^-24 of a^2 each); a wrong choice needs both candidates'
// estimates off by the sum.
SS_HD inline double half2_excess_bound(double a, double w_a, double lf, double lo) {
#if defined(__CUDA_ARCH__)
  const double r = sqrt(lf) + sqrt(lo), sw = sqrt(w_a);
#else
  const double r = std::sqrt(lf) + std::sqrt(lo), sw = std::sqrt(w_a);
#endif
  return 0x1p-9 * a * sw * r + 0x1p-5 * (lf + lo) + 0x1p-16 * a * a * w_a;
}

// -s f and fl(1/s)/f as fp16x2 splats of the candidate with table entries s, inv.
struct Half2Cand {
  uint32_t nsh2, ih2;
};
SS_HD inline Half2Cand half2_cand(const Half2Block& b, float s, float inv) {
  const float ns = -(s * b.f), ih = inv * b.finv;  // exact: powers of two
  return {h2_from_f32(ns, ns), h2_from_f32(ih, ih)};
}
// The block maximum's term RN(RN(ah_max - 6 s f)^2) (weighted: RN(RN(e wh_a) e)), low half: for
// s <= a/6 its level in the estimate is 6 (ah_max ih >= 6 (1 - 3 2^-11) > 5 rounds to 6), so the
// estimate, a sum of non-negative fp16 terms rounded monotonically, is >= this term, and the
// term grows as s falls (6 s f <= a f (1 - 1/17) < ah_max below P): the pruned walk's bound in
// the estimate's own arithmetic.
template <bool kWeighted>
SS_HD inline float half2_amax_term(const Half2Block& b, uint32_t nsh2) {
  const uint32_t e = h2_fma(kH2(6.0f), nsh2, b.amax2);
  const uint32_t t = kWeighted ? h2_mul(h2_mul(e, b.wa2), e) : h2_mul(e, e);
  return h_to_f32(t & 0xFFFFu);
}

}  // namespace scalesweep::cuda::kern

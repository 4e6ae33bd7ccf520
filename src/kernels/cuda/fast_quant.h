// The fast (non-bit-exact) candidate loss of the CUDA operator's Numerics::kFast sweeps,
// host+device (SS_HD): the GPU kernels and the CPU emulation run this same code, and the CPU
// tests check its selections against the exhaustive optimum (host_test.cc).
//
// What is exact and what is not. The loss of candidate scale s (an FP8 E4M3 value > 0) of a
// block of |y| values is estimated as
//     r  = fl(ay * fl(1/s))                            the quotient, two roundings
//          (clamped to 6 for the candidates s <= a/6 only: above them every r < 7, below)
//     M  = 2^floor(log2(max(r, 1)))                    the exponent field of max(r, 1)
//     t  = fma(M, 2^22, r),  q = fma(-M, 2^22, t)      RNE of r onto the E2M1 grid (below)
//     e  = fma(-q, s, ay)                              = fl(ay - q*s): q*s is exact, one rounding
//     L  = fma(e, e, L)   (weighted: fma(fl(e * w), e, L))
// Rounding by the magic add: for r in [0, 2) M * 2^22 = 2^22 and r + 2^22 lies in [2^22, 2^23),
// whose ulp is 0.5; for r in [2, 4) it is 2^23 + r, ulp 1; for r in [4, 8) 2^24 + r, ulp 2. So
// t rounds r to the grid step of its E2M1 binade {0, .5, 1, 1.5, 2 | 3, 4 | 6} with ties to
// the even multiple of the step, and the parity of that multiple is the parity of the E2M1
// index (index = multiple in [0, 2) (0..4), 2 + multiple in [2, 4) (2..4 -> 4..6), 4 +
// multiple in [4, 8) (2..3 -> 6..7)). The ties .25 .75 1.25 1.75 2.5 3.5 5 thus go to levels
// 0, 1, 1, 2, 2, 4, 4: the contract's RNE_E2M1. r in [6, 7) gives 6 (saturation without the
// clamp: a candidate s > a/6, i.e. above P = floor_fp8(a/6), has ay/s < 6 and r < 6(1 + 2u));
// r >= 7 would give 8, so candidates s <= a/6 clamp r to 6 first. q = t - M 2^22 is exact.
// Hence q is exactly the contract's level of the quotient r, and e is the contract's e for
// that level. Two things differ from the contract (docs/NUMERICS.md):
//   1. r is fl(ay * fl(1/s)), not the exact ay/s: |r - ay/s| <= 2u ay/s (u = 2^-24). Where
//      ay/s lies within that of a threshold t (half step h between grid values g1 < g2, t =
//      g1 + h), r can fall on the other side. At an exact tie both neighbours have the same
//      |e|, so nothing changes; at relative distance d from t the squared error of the other
//      neighbour differs by (g2 - g1)|2x - g1 - g2| s^2 = 4 h |x - t| s^2 <= 4 h t d s^2
//      (x = ay/s). Relative to that element's own term e^2 ~ (h s)^2 this is <= 4 (t/h) d,
//      at most 28 d (t/h = 7 at 1.75 and 3.5) = 56u = 3.3e-6 of the element's term, hence of
//      the block loss, for the rare elements within 2 ulps of a threshold.
//   2. The sum uses FMA and no separate rounding of e*e: its relative difference from the
//      contract's in-order float sum is <= ~2 * 16u on 16 non-negative terms (both are within
//      16u of the real sum), typically a few u.
// The selection (first minimum of the estimates) therefore picks a scale whose contract loss
// exceeds the window's minimum only when two candidates' losses lie within those errors;
// the kernel's contract (checked on >= 10^8 blocks on the GPU and on every test kind on the
// CPU) is that the chosen scale's contract loss is within a relative 1e-6 of the exhaustive
// optimum's. The codes of the chosen scale and its reported loss are the exact ones
// (block_codes, candidate_loss), so only the choice of the scale is approximate.
#pragma once

#include <cstdint>

#include "scalesweep/cuda/layout.h"
#include "scalesweep/format/minifloat.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace scalesweep::cuda::kern {

// IEEE 1/s (round to nearest even); the device's __frcp_rn is the same operation.
SS_HD inline float fast_rcp(float s) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(s);
#else
  return 1.0f / s;
#endif
}
// fma(a, b, c) with one rounding on both sides (host std::fma is the IEEE operation). Also the
// exact codes' saturated decisions use it (block_quant.h, SatSearch).
SS_HD inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
SS_HD inline float fast_min(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return b < a ? b : a;
#endif
}
SS_HD inline float fast_max(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return b > a ? b : a;
#endif
}

// The weight of (the last element equal to) the block maximum a: the weight of the term that
// bounds the pruned walks (amax_term, the estimates' bounds).
SS_HD inline float weight_of_max(const float (&ay)[kBlock], const float (&w)[kBlock], float a) {
  float w_a = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) w_a = ay[i] == a ? w[i] : w_a;
  return w_a;
}

// RNE of r (0 <= r < 7, finite; [6, 7) gives 6) onto the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}
// (see above): two FMAs around the exponent of max(r, 1).
SS_HD inline float fast_e2m1_round(float r) {
  const float M =
      format::detail::f32_from_bits(format::detail::f32_bits(fast_max(r, 1.0f)) & 0x7F800000u);
  const float t = fma_rn(M, 0x1p22f, r);  // r rounded to the step of its binade, + M 2^22
  return fma_rn(-M, 0x1p22f, t);          // exact
}

// The fast loss estimate of scale s > 0 on a block of |y| values ay (zero padded; padding adds
// fma(0, 0, L) = L), weights w when kWeighted. kClamp: s <= a/6 (pattern <= P), where some
// quotients exceed 6; without it the caller guarantees s > a/6.
// inv = fast_rcp(s) (passed in: the kernels read it from a table).
template <bool kWeighted, bool kClamp>
SS_HD inline float fast_candidate_loss(const float (&ay)[kBlock], const float (&w)[kBlock], float s,
                                       float inv) {
  float L = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) {
#if defined(__CUDA_ARCH__)
    float r = __fmul_rn(ay[i], inv);
#else
    float r = ay[i] * inv;
#endif
    if constexpr (kClamp) r = fast_min(r, 6.0f);
    const float q = fast_e2m1_round(r);
    const float e = fma_rn(-q, s, ay[i]);
    if constexpr (kWeighted) {
#if defined(__CUDA_ARCH__)
      L = fma_rn(__fmul_rn(e, w[i]), e, L);
#else
      L = fma_rn(e * w[i], e, L);
#endif
    } else {
      L = fma_rn(e, e, L);
    }
  }
  return L;
}

}  // namespace scalesweep::cuda::kern

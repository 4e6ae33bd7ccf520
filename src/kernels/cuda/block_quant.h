// The per-block NVFP4 core of the CUDA operator, host+device (SS_HD). The GPU kernels
// (quantize.cu) and the CPU emulation (host_api.cc, tested in CI without a GPU) run this same
// code, which reproduces the scalar reference (src/scale/selector.cc, src/quant/quantize.cc)
// bit for bit under the arithmetic contract of docs/NUMERICS.md:
//   - every float operation is one IEEE binary32 operation, round to nearest even, no FMA
//     contraction (device: __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn, built with -fmad=false
//     -ftz=false -prec-div=true; host: -ffp-contract=off);
//   - FP4 rounding of y/s by exact threshold compares |y| vs s*{.25,.75,1.25,1.75,2.5,3.5,5}
//     (exact products) on every arch; inside the candidate losses the compares run on bf16
//     pairs, exactly (see candidate_loss). The native cvt.rn.satfinite.e2m1x2.f32 of the IEEE
//     quotient fl(y/s) (sm_100a/sm_120a) gives the same codes but needs a division per
//     element; it is only run by the device self check (block_codes<true>);
//   - the loss of a candidate summed over the block in index order in float.
#pragma once

#include <cstdint>

#include "kernels/cuda/fast_quant.h"
#include "kernels/cuda/half2_quant.h"
#include "scalesweep/cuda/layout.h"
#include "scalesweep/cuda/quantize.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/scale/selector.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

// Native conversions: e4m3x2 from sm_89, e2m1x2 on the arch-specific Blackwell targets.
// SS_CUDA_EMULATE_CVT=1 forces the shared format code everywhere.
#ifndef SS_CUDA_EMULATE_CVT
#define SS_CUDA_EMULATE_CVT 0
#endif
#if defined(__CUDA_ARCH__) && !SS_CUDA_EMULATE_CVT && __CUDA_ARCH__ >= 890
#define SS_NATIVE_E4M3 1
#else
#define SS_NATIVE_E4M3 0
#endif
#if defined(__CUDA_ARCH__) && !SS_CUDA_EMULATE_CVT && __CUDA_ARCH__ >= 1000 &&     \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) || \
     defined(__CUDA_ARCH_FEAT_SM103_ALL) || defined(__CUDA_ARCH_FEAT_SM110_ALL) || \
     defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) || \
     defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__))
#define SS_NATIVE_E2M1 1
#else
#define SS_NATIVE_E2M1 0
#endif

namespace scalesweep::cuda::kern {

// The kernels are templates on scalesweep::Method (the methods kmethod() accepts),
// scalesweep::DType (format/dtype.h) and the numerics (kFast: fast_quant.h, kHalf2:
// half2_quant.h).

// The methods that read the importance vector.
template <Method M>
inline constexpr bool kWeightedMethod = M == Method::kSweepWmse || M == Method::kExhaustiveWmse;

// ---- single IEEE operations (never contracted)
SS_HD inline float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SS_HD inline float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SS_HD inline float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SS_HD inline float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
SS_HD inline uint32_t bits(float f) { return format::detail::f32_bits(f); }
SS_HD inline float from_bits(uint32_t u) { return format::detail::f32_from_bits(u); }
SS_HD inline float fabs_(float f) { return from_bits(bits(f) & 0x7FFFFFFFu); }
SS_HD inline bool is_finite(float f) { return (bits(f) & 0x7F800000u) != 0x7F800000u; }
// The CPU path's input limit (src/quant/quantize.cc): |y| = |fl(x * gs)| <= 2^48 (false for
// NaN and Inf). Keeps the contract loss finite and the bf16 ceil of |y| from overflowing.
SS_HD inline bool in_range(float y) { return fabs_(y) <= 0x1p48f; }

// ---- element loads (exact widening)
template <DType T>
SS_HD inline float load_elem(const void* x, int64_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(x)[i];
  } else if constexpr (T == DType::kBF16) {
    return format::bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
  } else {
    return format::f16_to_f32(static_cast<const uint16_t*>(x)[i]);
  }
}
template <DType T>
SS_HD inline void store_elem(void* out, int64_t i, float v) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (T == DType::kBF16) {
    static_cast<uint16_t*>(out)[i] = format::f32_to_bf16(v);
  } else {
    static_cast<uint16_t*>(out)[i] = format::f32_to_f16(v);
  }
}

// ---- FP8 E4M3 scales (positive patterns 0..126)
// Exact value of pattern p (p <= 126): subnormals m/8 * 2^-6, normals (1 + m/8) 2^(e-7).
SS_HD inline float e4m3_value(uint32_t p) {
  const uint32_t e = p >> 3, m = p & 7u;
  if (e == 0) return fmul(static_cast<float>(m), 0x1p-9f);
  return from_bits(((e + 120u) << 23) | (m << 20));
}
// Round to nearest even, saturating at 448 (x >= 0; NaN gives 0x7F).
SS_HD inline uint32_t e4m3_rne(float x) {
#if SS_NATIVE_E4M3
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint32_t>(r) & 0xFFu;
#else
  return format::E4M3::encode_rne(x);
#endif
}
// Largest E4M3 value <= x (x >= 0), saturating at 448: RNE, one step down when above x.
SS_HD inline uint32_t e4m3_floor(float x) {
  uint32_t p = e4m3_rne(x);
  if (p != 0 && p <= 126u && e4m3_value(p) > x) --p;
  return p;
}

// ---- FP4 E2M1
// Magnitude of E2M1 index 0..7 {0, .5, 1, 1.5, 2, 3, 4, 6}.
SS_HD inline float fp4_mag(uint32_t idx) {
  if (idx <= 4u) return fmul(static_cast<float>(idx), 0.5f);
  return idx == 5u ? 3.0f : idx == 6u ? 4.0f : 6.0f;
}

// The 7 exact threshold products of a scale s and the grid products g*s.
struct Thresholds {
  float t0, t1, t2, t3, t4, t5, t6;  // s * {.25, .75, 1.25, 1.75, 2.5, 3.5, 5}
  float h, s1, s15, s2, s3, s4, s6;  // s * {.5, 1, 1.5, 2, 3, 4, 6}
  SS_HD explicit Thresholds(float s)
      : t0(fmul(s, 0.25f)),
        t1(fmul(s, 0.75f)),
        t2(fmul(s, 1.25f)),
        t3(fmul(s, 1.75f)),
        t4(fmul(s, 2.5f)),
        t5(fmul(s, 3.5f)),
        t6(fmul(s, 5.0f)),
        h(fmul(s, 0.5f)),
        s1(s),
        s15(fmul(s, 1.5f)),
        s2(fmul(s, 2.0f)),
        s3(fmul(s, 3.0f)),
        s4(fmul(s, 4.0f)),
        s6(fmul(s, 6.0f)) {}
  // RNE_E2M1(ay / s) * s (exact), ties to the even index: strict '>' below even indices.
  // Written as ascending overwrites (compare + select each, no branches): the thresholds
  // ascend, so the last true predicate decides.
  SS_HD float rounded(float ay) const {
    float p = 0.0f;
    p = ay > t0 ? h : p;
    p = ay >= t1 ? s1 : p;
    p = ay > t2 ? s15 : p;
    p = ay >= t3 ? s2 : p;
    p = ay > t4 ? s3 : p;
    p = ay >= t5 ? s4 : p;
    p = ay > t6 ? s6 : p;
    return p;
  }
  // The same index by binary search (3 compares): '>=' at .75 / 1.75 / 3.5 (odd indices go up
  // on a tie), '>' at .25 / 1.25 / 2.5 / 5.
  SS_HD uint32_t index(float ay) const {
    const bool b2 = ay >= t3;
    const bool b1 = ay >= (b2 ? t5 : t1);
    const bool b0 = ay > (b2 ? (b1 ? t6 : t4) : (b1 ? t2 : t0));
    return (b2 ? 4u : 0u) | (b1 ? 2u : 0u) | (b0 ? 1u : 0u);
  }
};

// ---- FP4 index by saturated fused multiply-adds (the codes of every kernel)
// The RNE index of ay/s counts the thresholds ay passes ('>' at s*{.25, 1.25, 2.5, 5}, '>=' at
// s*{.75, 1.75, 3.5}). Compares and selects run on Hopper's ALU pipe, which issues at half rate
// and bounded the absmax kernel (ncu: ALU 88 % busy, docs/CUDA.md); here each decision is one
// FFMA.SAT on the FMA pipe:
//   sat(fl(ay * K - U)) = [ay > T]  and  sat(fl(U - ay * K)) = [ay < T],   K = 2^40, U = T K,
// exactly 1.0 or 0.0: the fused product-difference is K (ay - T) rounded once, so its sign is
// exact. T >= s/4 >= 2^-11 (s >= 2^-9), so when ay and T differ by a nonzero amount while both
// are above 2^-12 the difference is a multiple of 2^-35 and the scaled value (>= 32) saturates
// to 1, and when ay < 2^-12 the difference exceeds 2^-12; no overflow (ay <= 2^48, T <= 5 * 448).
SS_HD inline float sat01(float r) {  // clamp to [0, 1], NaN -> 0 (the SAT modifier)
#if defined(__CUDA_ARCH__)
  return __saturatef(r);
#else
  return r >= 1.0f ? 1.0f : r > 0.0f ? r : 0.0f;
#endif
}

// A binary search of three saturated decisions, the next threshold chosen by exact FMAs instead
// of selects (10 FMA-pipe instructions per element; deciding all 7 thresholds took 14).
struct SatSearch {
  float u3, u5, d15, u6, d26, d46, dd;
  SS_HD explicit SatSearch(const Thresholds& th)
      : u3(fmul(th.t3, 0x1p40f)),
        u5(fmul(th.t5, 0x1p40f)),
        d15(fmul(fsub(th.t1, th.t5), 0x1p40f)),
        u6(fmul(th.t6, 0x1p40f)),
        d26(fmul(fsub(th.t2, th.t6), 0x1p40f)),
        d46(fmul(fsub(th.t4, th.t6), 0x1p40f)),
        dd(fmul(fsub(fsub(th.t0, th.t2), fsub(th.t4, th.t6)), 0x1p40f)) {}
  // acc + place * index(ay) - 6 * place (the caller adds 6 * place up front).
  SS_HD float add_index(float ay, float place, float acc) const {
    const float v2 = sat01(fma_rn(ay, -0x1p40f, u3));
    const float v1 = sat01(fma_rn(ay, -0x1p40f, fma_rn(v2, d15, u5)));
    const float ua = fma_rn(v2, d26, u6), dl = fma_rn(v2, dd, d46);
    const float b0 = sat01(fma_rn(ay, 0x1p40f, -fma_rn(v1, dl, ua)));
    acc = fma_rn(v2, fmul(place, -4.0f), acc);
    acc = fma_rn(v1, fmul(place, -2.0f), acc);
    return fma_rn(b0, place, acc);
  }
  SS_HD uint32_t index(float ay) const {
    return bits(add_index(ay, 1.0f, fadd(0x1p23f, 6.0f))) & 7u;
  }
};

// Contract loss of scale s on a block of |y| values ay[0..15] (zero padded): sum in index
// order of fl(fl(e*e) * w), e = fl(|y| - RNE(|y|/s) s). s == 0 gives sum of y^2 (all thresholds
// and products 0), as the reference. Zero padding adds +0 terms, which leaves the sum as is.
// This version rounds with the float compare/select chain (reference for the packed one).
template <bool kWeighted>
SS_HD inline float candidate_loss_chain(const float (&ay)[kBlock], const float (&w)[kBlock],
                                        float s) {
  const Thresholds th(s);
  float L = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) {
    const float e = fsub(ay[i], th.rounded(ay[i]));
    float t = fmul(e, e);
    if constexpr (kWeighted) t = fmul(t, w[i]);
    L = fadd(L, t);
  }
  return L;
}

// ---- Packed bf16x2 rounding: two elements per compare, exactly.
// Every threshold s*mid has at most 7 significant bits (s: 4, mid: 3) and every product g*s
// at most 6, so both are exact bf16 values (8 significant bits, float's exponent range). For
// such a T and ay >= 0:  ay >= T  <=>  floor_bf16(ay) >= T   and   ay > T  <=>  ceil_bf16(ay) > T.
// So the FP4 rounding RNE(ay/s)*s = sum of grid steps {.5,.5,.5,.5,1,1,2}*s over the passed
// thresholds is computed on bf16 pairs (compare -> 1.0/0.0, fma accumulates exact values),
// then widened to float for the contract arithmetic (e, e*e, w, sum) which stays per element
// in float, in index order. Subnormal handling cannot matter: T >= 2^-11 or T == 0 with zero
// steps.
struct PairedAbs {
  uint32_t floor2[kBlock / 2];  // bf16 pairs (element 2q low half, 2q+1 high half)
  uint32_t ceil2[kBlock / 2];
};
SS_HD inline uint32_t bf16_floor_bits(float ay) { return bits(ay) >> 16; }  // ay >= 0
SS_HD inline uint32_t bf16_ceil_bits(float ay) { return (bits(ay) + 0xFFFFu) >> 16; }
SS_HD inline PairedAbs pair_abs(const float (&ay)[kBlock]) {
  PairedAbs p;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < kBlock / 2; ++q) {
    p.floor2[q] = bf16_floor_bits(ay[2 * q]) | (bf16_floor_bits(ay[2 * q + 1]) << 16);
    p.ceil2[q] = bf16_ceil_bits(ay[2 * q]) | (bf16_ceil_bits(ay[2 * q + 1]) << 16);
  }
  return p;
}
// Both halves = v, which must be an exact bf16 value.
SS_HD inline uint32_t splat2(float v) {
  const uint32_t b = bits(v) >> 16;
  return b | (b << 16);
}
SS_HD inline float lo_half(uint32_t u) { return from_bits(u << 16); }
SS_HD inline float hi_half(uint32_t u) { return from_bits(u & 0xFFFF0000u); }

#if defined(__CUDA_ARCH__)
SS_HD inline __nv_bfloat162 as_bf2(uint32_t u) {
  __nv_bfloat162 r;
  __builtin_memcpy(&r, &u, 4);
  return r;
}
SS_HD inline uint32_t as_u32(__nv_bfloat162 v) {
  uint32_t r;
  __builtin_memcpy(&r, &v, 4);
  return r;
}
#endif
// Per half: 1.0 where a > b (a >= b), else 0.0.
SS_HD inline uint32_t bf2_gt(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return as_u32(__hgt2(as_bf2(a), as_bf2(b)));
#else
  return (lo_half(a) > lo_half(b) ? 0x3F80u : 0u) | (hi_half(a) > hi_half(b) ? 0x3F800000u : 0u);
#endif
}
SS_HD inline uint32_t bf2_ge(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return as_u32(__hge2(as_bf2(a), as_bf2(b)));
#else
  return (lo_half(a) >= lo_half(b) ? 0x3F80u : 0u) | (hi_half(a) >= hi_half(b) ? 0x3F800000u : 0u);
#endif
}
// Per half: RN(a * b) (exact for the values used here).
SS_HD inline uint32_t bf2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return as_u32(__hmul2(as_bf2(a), as_bf2(b)));
#else
  return format::f32_to_bf16(fmul(lo_half(a), lo_half(b))) |
         (static_cast<uint32_t>(format::f32_to_bf16(fmul(hi_half(a), hi_half(b)))) << 16);
#endif
}
// bf16x2 constant with both halves = v (v an exact bf16 value).
constexpr uint32_t kSplat(float v) {
  return (format::detail::f32_bits(v) >> 16) | ((format::detail::f32_bits(v) >> 16) << 16);
}
// Per half: RN(a * b + c) (exact for the values used here).
SS_HD inline uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return as_u32(__hfma2(as_bf2(a), as_bf2(b), as_bf2(c)));
#else
  const uint32_t lo = format::f32_to_bf16(fadd(fmul(lo_half(a), lo_half(b)), lo_half(c)));
  const uint32_t hi = format::f32_to_bf16(fadd(fmul(hi_half(a), hi_half(b)), hi_half(c)));
  return lo | (hi << 16);
#endif
}

// The contract loss as candidate_loss_chain, rounding two elements per bf16x2 operation.
template <bool kWeighted>
SS_HD inline float candidate_loss(const float (&ay)[kBlock], const float (&w)[kBlock],
                                  const PairedAbs& pa, float s) {
  // Thresholds and steps straight in bf16x2: s * {.25, .75, 1.25, 1.75, 2.5, 3.5, 5} and
  // s * {.5, 1, 2}, exact products (at most 7 significant bits).
  const uint32_t S1 = splat2(s);
  const uint32_t T0 = bf2_mul(S1, kSplat(0.25f)), T1 = bf2_mul(S1, kSplat(0.75f)),
                 T2 = bf2_mul(S1, kSplat(1.25f)), T3 = bf2_mul(S1, kSplat(1.75f)),
                 T4 = bf2_mul(S1, kSplat(2.5f)), T5 = bf2_mul(S1, kSplat(3.5f)),
                 T6 = bf2_mul(S1, kSplat(5.0f));
  const uint32_t H = bf2_mul(S1, kSplat(0.5f)), S2 = bf2_mul(S1, kSplat(2.0f));
  float L = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < kBlock / 2; ++q) {
    const uint32_t c = pa.ceil2[q], f = pa.floor2[q];
    uint32_t p = bf2_fma(bf2_gt(c, T0), H, 0u);  // ties: '>' below even indices
    p = bf2_fma(bf2_ge(f, T1), H, p);
    p = bf2_fma(bf2_gt(c, T2), H, p);
    p = bf2_fma(bf2_ge(f, T3), H, p);
    p = bf2_fma(bf2_gt(c, T4), S1, p);
    p = bf2_fma(bf2_ge(f, T5), S1, p);
    p = bf2_fma(bf2_gt(c, T6), S2, p);
    const float e0 = fsub(ay[2 * q], lo_half(p));
    float t0 = fmul(e0, e0);
    if constexpr (kWeighted) t0 = fmul(t0, w[2 * q]);
    L = fadd(L, t0);
    const float e1 = fsub(ay[2 * q + 1], hi_half(p));
    float t1 = fmul(e1, e1);
    if constexpr (kWeighted) t1 = fmul(t1, w[2 * q + 1]);
    L = fadd(L, t1);
  }
  return L;
}

// Sweep window (inclusive patterns) of sweep-mse / sweep-wmse around P = I(floor_fp8(a/6)),
// as src/scale/selector.cc sweep_patterns(). sweep-mse: the per-base window proven by
// src/scale/bounds (`proven` = [127][2] offsets {lo, hi} for this block length, lo > hi = none
// proven; filled on the host from bounds::proven_window), else [P-3, P+7] where the paper's
// proof holds (P >= 16 and (11/7) base <= 448), [P-7, P+7] for other normal bases.
// sweep-wmse: [P-8, P+7]. Both: [1, max(P+7, 15)] for P < 16; clipped to [1, 126].
// The range is scalesweep::PatternRange (scale/selector.h): absolute patterns, inclusive.
inline constexpr int kPatterns = 127;  // base patterns 0..126
SS_HD inline PatternRange clip_window(int lo, int hi) {
  lo = lo < 1 ? 1 : lo > 126 ? 126 : lo;
  hi = hi < 1 ? 1 : hi > 126 ? 126 : hi;
  if (hi < lo) hi = lo;
  return {lo, hi};
}
SS_HD inline PatternRange sweep_window(uint32_t P_, bool wmse, const int8_t* proven) {
  const int P = static_cast<int>(P_);
  if (!wmse && proven && P_ < static_cast<uint32_t>(kPatterns)) {
    const int lo = proven[2 * P], hi = proven[2 * P + 1];
    if (lo <= hi) return clip_window(P + lo, P + hi);
  }
  const bool normal = P >= 16;
  const int hi = normal ? P + 7 : (P + 7 > 15 ? P + 7 : 15);
  int lo;
  if (!wmse) {
    const bool paper =
        normal && (11.0 / 7.0) * static_cast<double>(e4m3_value(P_ > 126u ? 126u : P_)) <= 448.0;
    lo = paper ? P - 3 : normal ? P - 7 : 1;
  } else {
    lo = normal ? P - 8 : 1;
  }
  return clip_window(lo, hi);
}

struct Selected {
  uint32_t pattern;
  float loss;
};

// Lower bound of the loss of every scale s <= a/6 from the block maximum alone: its level is 6
// (a/s >= 6 saturates), so its term is T(s) = fl(fl(fl(a - 6s)^2) * w_a) (6s exact), which
// grows as s falls; an in-order float sum of non-negative terms is >= each of its terms
// (fl(L + t) >= L and rounding is monotone). w_a: the weight of one element equal to a.
template <bool kWeighted>
SS_HD inline float amax_term(float a, float w_a, float s) {
  const float e = fsub(a, fmul(s, 6.0f));
  float t = fmul(e, e);
  if constexpr (kWeighted) t = fmul(t, w_a);
  return t;
}

// The sweep over the window, exact but pruned (docs/CUDA.md, docs/NUMERICS.md "Exhaustive
// search, pruned but exact"): the candidates [c, hi] with c = clamp(P, lo, hi) are evaluated
// ascending (a strictly lower loss replaces the best: ties keep the smaller pattern), then the
// walk goes down c-1, c-2, ..., lo. Every pattern below c is below P, so its scale is
// < floor_fp8(a/6) <= a/6 and amax_term bounds its loss from below; the first pattern whose
// bound exceeds the best so far (strictly: lower patterns win ties) ends the walk, since every
// lower pattern has a larger bound. A lower candidate with loss <= best replaces it (it is the
// smaller pattern). Same first minimum in pattern order as the full ascending scan.
// evals (host statistics, may be null): incremented once per evaluated candidate.
//
// kZeroStop (exhaustive search): the ascending part also stops after the first pattern p with
// a <= s_p/4 (exact product). There every |y| <= a <= s_p * .25 rounds to level 0 (the tie at
// .25 goes to the even index 0), so the loss is the in-order sum of fl(fl(y*y) * w), the same
// float for p and for every larger pattern (larger scale, same level 0); an equal loss never
// replaces the best in the ascending scan, so no pattern above p can be chosen.
template <bool kW, bool kZeroStop = false>
SS_HD inline Selected sweep_pruned(const float (&ay)[kBlock], const float (&w)[kBlock], float a,
                                   uint32_t P, PatternRange win, int* evals) {
  const float w_a = kW ? weight_of_max(ay, w, a) : 0.0f;
  const int Pi = static_cast<int>(P);
  const int c = Pi < win.lo ? win.lo : Pi > win.hi ? win.hi : Pi;
  const PairedAbs pa = pair_abs(ay);
  Selected best{static_cast<uint32_t>(c),
                candidate_loss<kW>(ay, w, pa, e4m3_value(static_cast<uint32_t>(c)))};
  int n = 1;
  bool more = !kZeroStop || a > fmul(e4m3_value(static_cast<uint32_t>(c)), 0.25f);
  for (int p = c + 1; more && p <= win.hi; ++p) {
    const float s = e4m3_value(static_cast<uint32_t>(p));
    const float l = candidate_loss<kW>(ay, w, pa, s);
    ++n;
    if (l < best.loss) best = {static_cast<uint32_t>(p), l};  // ties: the smaller pattern
    if constexpr (kZeroStop) more = a > fmul(s, 0.25f);
  }
  for (int p = c - 1; p >= win.lo; --p) {
    const float s = e4m3_value(static_cast<uint32_t>(p));
    if (amax_term<kW>(a, w_a, s) > best.loss) break;  // no pattern <= p can reach best
    const float l = candidate_loss<kW>(ay, w, pa, s);
    ++n;
    if (l <= best.loss) best = {static_cast<uint32_t>(p), l};  // ties: the smaller pattern
  }
  if (evals) *evals += n;
  return best;
}

// The window's first minimum by a plain ascending scan (a strictly lower loss wins).
template <bool kW>
SS_HD inline Selected sweep_scan(const float (&ay)[kBlock], const float (&w)[kBlock],
                                 PatternRange win, int* evals) {
  const PairedAbs pa = pair_abs(ay);
  Selected best{static_cast<uint32_t>(win.lo),
                candidate_loss<kW>(ay, w, pa, e4m3_value(static_cast<uint32_t>(win.lo)))};
  for (int p = win.lo + 1; p <= win.hi; ++p) {
    const float l = candidate_loss<kW>(ay, w, pa, e4m3_value(static_cast<uint32_t>(p)));
    if (l < best.loss) best = {static_cast<uint32_t>(p), l};  // ties: the first wins
  }
  if (evals) *evals += win.hi - win.lo + 1;
  return best;
}

// Numerics::kFast: the first minimum of the fast loss estimate (fast_quant.h) over the window,
// in the order of the exact scans. Candidates above P = floor_fp8(a/6) need no clamp of the
// quotient (kClamp = false), those at or below it do. The chosen pattern's reported loss is its
// exact contract loss (recomputed once, only when want_loss), so outputs stay meaningful.
// tab: the scale values s[0..126] and their IEEE reciprocals inv[0..126] (tab + kPatterns), a
// shared-memory table on the GPU, or nullptr (computed per candidate: the same values).
//
// Both sweeps take the pruned walk of sweep_pruned on the estimates (estimate_walk): c =
// clamp(P), ascending c+1..hi (a strictly lower estimate wins), then descending c-1..lo (an
// estimate <= the best wins) until the block maximum's term exceeds the best. The bound holds
// for the estimate: below P the block maximum's quotient is >= 6(1 - 2u) > 5, so its level is 6
// and its e is fma(-6, s, a) = fl(a - 6s); its term fma(e, e, 0) (weighted: fma(fl(e w_a), e,
// 0)) is <= the FMA sum, which never decreases, and grows as s falls. So the walk returns the
// first minimum of the estimates in pattern order, as the plain scan would. For sweep-wmse
// the walk saves 26-31 % of a warp's loop steps on real weights and nothing on the bench's
// synthetic importance (docs/CANDIDATE_STATS.md).
// (Device: the kernels always stage the table, and a null test on the shared-memory pointer
// would keep both paths in the loop.)
SS_HD inline float fast_scale(const float* tab, int p) {
#if defined(__CUDA_ARCH__)
  return tab[p];
#else
  return tab ? tab[p] : e4m3_value(static_cast<uint32_t>(p));
#endif
}
SS_HD inline float fast_inv(const float* tab, int p, float s) {
#if defined(__CUDA_ARCH__)
  (void)s;
  return tab[kPatterns + p];
#else
  return tab ? tab[kPatterns + p] : fast_rcp(s);
#endif
}
// The pruned walk of sweep_pruned over any estimate: c = clamp(P, lo, hi) (with the clamp),
// ascending c+1..hi (no clamp: every quotient < 7; a strictly lower estimate wins), then
// descending c-1..lo (with the clamp; an estimate <= the best wins) until bound(p) > best, so
// it returns the first minimum of the estimates in pattern order whenever bound(p) is a lower
// bound of the estimate of p and of every lower pattern. loss(p, clamp) and bound(p): callables.
template <class Loss, class Bound>
SS_HD inline Selected estimate_walk(uint32_t P, PatternRange win, const Loss& loss,
                                    const Bound& bound) {
  const int Pi = static_cast<int>(P);
  const int c = Pi < win.lo ? win.lo : Pi > win.hi ? win.hi : Pi;
  Selected best{static_cast<uint32_t>(c), loss(c, true)};
  for (int p = c + 1; p <= win.hi; ++p) {  // p > c >= min(P, ...): every quotient < 7
    const float l = loss(p, false);
    if (l < best.loss) best = {static_cast<uint32_t>(p), l};  // ties: the smaller pattern
  }
  for (int p = c - 1; p >= win.lo; --p) {  // p < c <= P
    if (bound(p) > best.loss) break;       // no pattern <= p can reach best
    const float l = loss(p, true);
    if (l <= best.loss) best = {static_cast<uint32_t>(p), l};  // ties: the smaller pattern
  }
  return best;
}

template <bool kW>
SS_HD inline Selected fast_scan(const float (&ay)[kBlock], const float (&w)[kBlock], float a,
                                uint32_t P, PatternRange win, bool want_loss, const float* tab) {
  const float w_a = kW ? weight_of_max(ay, w, a) : 0.0f;
  const auto loss = [&](int p, bool clamp) {
    const float s = fast_scale(tab, p), inv = fast_inv(tab, p, s);
    return clamp ? fast_candidate_loss<kW, true>(ay, w, s, inv)
                 : fast_candidate_loss<kW, false>(ay, w, s, inv);
  };
  // The block maximum's term of the estimate: e = fma(-6, s, a), then fma(e, e, 0) or
  // fma(fl(e w_a), e, 0) (fast_candidate_loss's arithmetic).
  const auto bound = [&](int p) {
    const float e = fma_rn(-6.0f, fast_scale(tab, p), a);
    if constexpr (kW) {
#if defined(__CUDA_ARCH__)
      return fma_rn(__fmul_rn(e, w_a), e, 0.0f);
#else
      return fma_rn(e * w_a, e, 0.0f);
#endif
    } else {
      return fma_rn(e, e, 0.0f);
    }
  };
  Selected best = estimate_walk(P, win, loss, bound);
  if (want_loss) best.loss = candidate_loss<kW>(ay, w, pair_abs(ay), e4m3_value(best.pattern));
  return best;
}

// Numerics::kHalf2: the same walk on the half2 estimate (half2_quant.h), for blocks with base
// P >= 16; below that (E4M3-subnormal scales) fast_scan. The walk stops on half2_amax_term, the
// block maximum's term in the estimate's own arithmetic.
template <bool kW>
SS_HD inline Selected half2_scan(const float (&ay)[kBlock], const float (&w)[kBlock], float a,
                                 uint32_t P, PatternRange win, bool want_loss, const float* tab) {
  if (P < 16u) return fast_scan<kW>(ay, w, a, P, win, want_loss, tab);
  const Half2Block b = half2_block<kW>(ay, w, a);
  const auto loss = [&](int p, bool clamp) {
    const float s = fast_scale(tab, p);
    const Half2Cand h = half2_cand(b, s, fast_inv(tab, p, s));
    return clamp ? half2_candidate_loss<kW, true>(b, h.nsh2, h.ih2)
                 : half2_candidate_loss<kW, false>(b, h.nsh2, h.ih2);
  };
  const auto bound = [&](int p) {
    const float s = fast_scale(tab, p);
    return half2_amax_term<kW>(b, half2_cand(b, s, 0.0f).nsh2);
  };
  Selected best = estimate_walk(P, win, loss, bound);
  if (want_loss) best.loss = candidate_loss<kW>(ay, w, pair_abs(ay), e4m3_value(best.pattern));
  return best;
}

// The fast table (see fast_scan): s[p] and fl(1/s[p]) for p = 0..126 (s[0] = 0 is never a
// candidate; its reciprocal is left 0).
SS_HD inline void fill_fast_table(float* tab, int i) {
  const float s = e4m3_value(static_cast<uint32_t>(i));
  tab[i] = s;
  tab[kPatterns + i] = i == 0 ? 0.0f : fast_rcp(s);
}

// The exhaustive search (exhaustive-mse / exhaustive-wmse): the first minimum over every
// positive finite pattern 1..126, as the reference's best_in_range, by the pruned walk from
// clamp(P, 1, 126) (sweep_pruned with the zero stop). Tested against a plain scan of 1..126.
inline constexpr PatternRange kAllPatterns{1, 126};

// Chooses the scale pattern of a block with |y| values ay (zero padded) and amax a.
// want_loss: compute the loss for absmax too (it has no objective otherwise).
// kNu (sweep methods only for kFast / kHalf2): the window is scanned with the fast loss estimate
// (fast_scan) or the half2 one (half2_scan).
// fast_tab: their table of scales and reciprocals (nullptr: computed per candidate).
template <Method M, bool kWeighted, Numerics kNu = Numerics::kExact>
SS_HD inline Selected select_scale(const float (&ay)[kBlock], const float (&w)[kBlock], float a,
                                   bool want_loss, const int8_t* proven, int* evals = nullptr,
                                   const float* fast_tab = nullptr) {
  (void)evals;
  static_assert(kNu == Numerics::kExact || M == Method::kSweepMse || M == Method::kSweepWmse,
                "fast and half2 numerics exist for sweep-mse and sweep-wmse only");
  if (a == 0.0f) return {0u, 0.0f};
  if constexpr (M == Method::kAbsMax) {
    const uint32_t p = e4m3_rne(fdiv(a, 6.0f));
    return {p, want_loss ? candidate_loss_chain<false>(ay, w, e4m3_value(p)) : 0.0f};
  } else if constexpr (M == Method::kFourOverSix) {
    const PairedAbs pa = pair_abs(ay);
    const uint32_t p6 = e4m3_rne(fdiv(a, 6.0f));
    const uint32_t p4 = e4m3_rne(fdiv(a, 4.0f));
    const float l6 = candidate_loss<false>(ay, w, pa, e4m3_value(p6));
    if (p4 == p6) return {p6, l6};
    const float l4 = candidate_loss<false>(ay, w, pa, e4m3_value(p4));
    return l4 < l6 ? Selected{p4, l4} : Selected{p6, l6};
  } else if constexpr (M == Method::kExhaustiveMse || M == Method::kExhaustiveWmse) {
    constexpr bool kW = M == Method::kExhaustiveWmse && kWeighted;
    const uint32_t P = e4m3_floor(fdiv(a, 6.0f));
    return sweep_pruned<kW, true>(ay, w, a, P, kAllPatterns, evals);
  } else {
    constexpr bool kWmse = M == Method::kSweepWmse;
    const uint32_t P = e4m3_floor(fdiv(a, 6.0f));
    const PatternRange win = sweep_window(P, kWmse, proven);
    constexpr bool kW = kWmse && kWeighted;
    if constexpr (kNu == Numerics::kFast)
      return fast_scan<kW>(ay, w, a, P, win, want_loss, fast_tab);
    if constexpr (kNu == Numerics::kHalf2)
      return half2_scan<kW>(ay, w, a, P, win, want_loss, fast_tab);
    // Both sweeps walk. For sweep-wmse the weighted bound prunes no warp step on the bench's
    // synthetic importance (2^+-8 per column: some lane always needs all 16), but 26-31 % of
    // them on real weights with their activations' importance (docs/CANDIDATE_STATS.md).
    return sweep_pruned<kW>(ay, w, a, P, win, evals);
  }
}

// Codes of a block for the chosen scale s: sign << 3 | RNE index (sign of zero kept; s == 0
// gives the sign only, as fp4_code). The kernels decide the exact thresholds with saturated
// FMAs (SatSearch: 10 FMA-pipe instructions per element); kNativeCvt
// (sm_100a/sm_120a only) uses the IEEE quotient fl(|y|/s) and cvt.rn.satfinite.e2m1x2.f32 instead,
// which gives the same codes but costs a division per element (slower: scripts/sass_count.py), so
// only the conversion self check (quantize.cu, conversion_check) uses it, to verify that claim on
// the device. Elements [n, 16) get code 0. Returns the 16 codes packed as nibbles (element i at
// bits 4i).
template <bool kNativeCvt = false>
SS_HD inline uint64_t block_codes(const float (&y)[kBlock], const float (&ay)[kBlock], float s,
                                  int n) {
  uint64_t packed = 0;
#if SS_CUDA_SASS_PROBE
  if (false) {  // scripts/sass_count.py: count the common path only (s > 0)
#else
  if (s == 0.0f) {
#endif
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kBlock; ++i) {
      const uint64_t c = (i < n && (bits(y[i]) >> 31)) ? 8u : 0u;
      packed |= c << (4 * i);
    }
    return packed;
  }
#if SS_NATIVE_E2M1
  if constexpr (kNativeCvt) {
#pragma unroll
    for (int i = 0; i < kBlock; i += 2) {
      const float q0 = fdiv(ay[i], s), q1 = fdiv(ay[i + 1], s);
      unsigned short r;
      asm("{\n\t.reg .b8 t;\n\tcvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\tcvt.u16.u8 %0, t;\n\t}"
          : "=h"(r)
          : "f"(q1), "f"(q0));
      const uint64_t c0 = i < n ? ((r & 7u) | ((bits(y[i]) >> 31) << 3)) : 0u;
      const uint64_t c1 = i + 1 < n ? (((r >> 4) & 7u) | ((bits(y[i + 1]) >> 31) << 3)) : 0u;
      packed |= (c0 << (4 * i)) | (c1 << (4 * i + 4));
    }
    return packed;
  }
#endif
  // The indices of 4 elements are summed into one float as idx_0 + 16 idx_1 + 256 idx_2 +
  // 4096 idx_3 on top of 2^23 (exact: integers below 2^23 + 2^15), so its low 16 bits are their
  // 4 nibbles; two such words make 8 codes, then the sign bits (bit 3 of each nibble) join.
  const SatSearch th{Thresholds(s)};
  uint32_t word[2];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int h = 0; h < 2; ++h) {
    uint32_t quad[2];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int g = 0; g < 2; ++g) {
      float acc = 0x1p23f + 6.0f * (1 + 16 + 256 + 4096);  // exact: add_index's offsets
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int j = 0; j < 4; ++j) {
        const int i = 8 * h + 4 * g + j;
        if (i >= n) break;
        const float place = static_cast<float>(1u << (4 * j));
        acc = th.add_index(ay[i], place, acc);
      }
      // elements past n (partial block) added nothing: take their 6 * place back out
      for (int j = 0; j < 4; ++j)
        if (8 * h + 4 * g + j >= n) acc = fsub(acc, 6.0f * static_cast<float>(1u << (4 * j)));
      quad[g] = bits(acc) & 0xFFFFu;
    }
    uint32_t signs = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < 8; ++j) {
      const int i = 8 * h + j;
      if (i < n) signs |= (bits(y[i]) >> 31) << (4 * j + 3);
    }
    word[h] = quad[0] | (quad[1] << 16) | signs;
  }
  packed = static_cast<uint64_t>(word[0]) | (static_cast<uint64_t>(word[1]) << 32);
  return packed;
}

// x_hat = fl(+-mag / gs) (mag = |q| s exact), as dequantize(); gs == 1 skips the division.
SS_HD inline float dequant_value(float y, float mag, float gs) {
  const float v = (bits(y) >> 31) ? -mag : mag;
  return gs == 1.0f ? v : fdiv(v, gs);
}

// Row m and block kb of flat block index b = m * nb + kb without a 64-bit integer division
// (emulated on the GPU, about a hundred instructions: a launch with one block per thread paid
// two of them per block). inv_nb = fl(1 / nb) in double: for b < 2^52 the truncated double
// quotient is within one of floor(b / nb), and one correction step makes it exact
// (host_test.cc CudaLayout.RowBlockWithoutDivision).
struct RowBlock {
  int64_t m, kb;
};
SS_HD inline RowBlock row_block(int64_t b, int64_t nb, double inv_nb) {
  int64_t m = static_cast<int64_t>(static_cast<double>(b) * inv_nb);
  int64_t kb = b - m * nb;
  if (kb < 0) {
    --m;
    kb += nb;
  } else if (kb >= nb) {
    ++m;
    kb -= nb;
  }
  return {m, kb};
}

// Everything one launch needs (plain data, passed by value to the kernels).
struct Params {
  const void* x;
  int64_t rows, cols, nb, pc;
  double inv_nb;  // 1.0 / nb (row_block)
  float gs;
  const float* imp;  // [cols] or nullptr
  uint8_t* codes;
  uint8_t* scales;
  uint8_t* scales_sw;
  float* loss;
  void* deq;
  int deq_type;  // DType
  unsigned long long* first_bad;
  // sweep-mse proven windows (see sweep_window) for full blocks and for the partial last
  // block of a row (cols % 16 elements; equal to win_full when there is none).
  int8_t win_full[kPatterns][2];
  int8_t win_part[kPatterns][2];
};

// Records a non-finite element (smallest flat index wins).
SS_HD inline void report_bad(unsigned long long* slot, int64_t i) {
  if (!slot) return;
#if defined(__CUDA_ARCH__)
  atomicMin(slot, static_cast<unsigned long long>(i));
#else
  if (static_cast<unsigned long long>(i) < *slot) *slot = static_cast<unsigned long long>(i);
#endif
}

// Selection, codes and every requested output of block (m, kb) whose y values are loaded.
// `proven`: the [127][2] window table for this block's length (P.win_full / P.win_part, or a
// shared-memory copy of it).
// kNu: the numerics (kFast / kHalf2: the sweeps, with the table fast_tab).
// kDeq = false: the caller guarantees P.deq == nullptr, so the fused dequantize path is compiled
// out (the codes-and-scales kernels then need a third of the registers: more resident CTAs).
template <Method M, Numerics kNu = Numerics::kExact, bool kDeq = true>
SS_HD inline void finish_block(const Params& P, int64_t m, int64_t kb, int n,
                               const float (&y)[kBlock], const float (&w)[kBlock],
                               const int8_t* proven, uint64_t* packed_out,
                               const float* fast_tab = nullptr) {
  float ay[kBlock];
  float a = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) {
#if defined(__CUDA_ARCH__)
    // FMNMX with an |.| operand: the same value for non-NaN y (a NaN input is reported and
    // fails the call, its outputs are unspecified), one instruction instead of compare+select.
    ay[i] = fabsf(y[i]);
    a = fmaxf(a, ay[i]);
#else
    ay[i] = fabs_(y[i]);
    a = ay[i] > a ? ay[i] : a;
#endif
  }
  const bool weighted = kWeightedMethod<M> && P.imp != nullptr;
  const Selected sel =
      weighted
          ? select_scale<M, true, kNu>(ay, w, a, P.loss != nullptr, proven, nullptr, fast_tab)
          : select_scale<M, false, kNu>(ay, w, a, P.loss != nullptr, proven, nullptr, fast_tab);
  const int64_t b = m * P.nb + kb;
  if (P.scales) P.scales[b] = static_cast<uint8_t>(sel.pattern);
  if (P.scales_sw) P.scales_sw[swizzled_offset(m, kb, P.nb)] = static_cast<uint8_t>(sel.pattern);
  if (P.loss) P.loss[b] = sel.loss;
  if (!P.codes && !(kDeq && P.deq)) return;
  const float s = e4m3_value(sel.pattern);
  const uint64_t packed = block_codes(y, ay, s, n);
  *packed_out = packed;
  if (kDeq && P.deq) {
    const int64_t base = m * P.cols + kb * kBlock;
    // Unrolled with a guard (not `i < n`): a runtime-indexed y[] would live in local memory.
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kBlock; ++i) {
      if (i >= n) break;
      const float mag = fmul(fp4_mag(static_cast<uint32_t>(packed >> (4 * i)) & 7u), s);
      const float v = dequant_value(y[i], mag, P.gs);
      if (P.deq_type == static_cast<int>(DType::kF32))
        store_elem<DType::kF32>(P.deq, base + i, v);
      else if (P.deq_type == static_cast<int>(DType::kBF16))
        store_elem<DType::kBF16>(P.deq, base + i, v);
      else
        store_elem<DType::kF16>(P.deq, base + i, v);
    }
  }
}

// The generic (any alignment, any cols) path for block (m, kb): element loads with zero
// padding of a partial block, byte stores of the codes.
// win_full / win_part: the window tables (P's own, or shared-memory copies on the GPU).
template <DType T, Method M, Numerics kNu = Numerics::kExact>
SS_HD inline void process_block(const Params& P, int64_t m, int64_t kb, const int8_t* win_full,
                                const int8_t* win_part, const float* fast_tab = nullptr) {
  const int64_t c0 = kb * kBlock;
  const int n = static_cast<int>(P.cols - c0 < kBlock ? P.cols - c0 : kBlock);
  const int64_t base = m * P.cols + c0;
  float y[kBlock], w[kBlock];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) {
    float x = 0.0f, wi = 0.0f;
    if (i < n) {
      x = load_elem<T>(P.x, base + i);
      if (kWeightedMethod<M> && P.imp) wi = P.imp[c0 + i];
    }
    y[i] = fmul(x, P.gs);
    // Non-finite input, or |x * gs| beyond 2^48 (or overflowing): reported, the call fails.
    if (!in_range(y[i])) report_bad(P.first_bad, base + i);
    w[i] = wi;
  }
  uint64_t packed = 0;
  finish_block<M, kNu>(P, m, kb, n, y, w, n == kBlock ? win_full : win_part, &packed, fast_tab);
  if (P.codes) {
    uint8_t* crow = P.codes + m * P.pc + c0 / 2;
    for (int i = 0; i < n; i += 2) crow[i / 2] = static_cast<uint8_t>(packed >> (4 * i));
  }
}

}  // namespace scalesweep::cuda::kern

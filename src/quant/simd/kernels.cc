// Highway kernels for NVFP4 quantization, compiled once per SIMD target (foreach_target) and
// dispatched at run time. Bit-identical to the scalar reference on every target; the exactness
// arguments are in docs/NUMERICS.md ("Fast CPU path").
//
// Layout of the work for one block of n elements (y = fl(x * gs), a = max |y|):
//  * scale rounding (floor/RNE E4M3 of fl(a/6), fl(a/4)) is vectorized across blocks;
//  * the candidate losses are vectorized across candidate scales: lane j holds the running
//    float loss of pattern lo + j, and the elements are added in index order, so every lane
//    performs exactly the reference's sequence of float operations;
//  * candidates go 16 normal patterns at a time as two halves of 8 (scale ratio < 2), where
//    an element's FP4 index takes <= 3 values: 2 threshold compares per element, with the
//    rows of both halves in one split-table row (tables.h);
//  * exhaustive search skips candidates that provably cannot win (Lemma 4.1 halving and a
//    monotone lower bound from the block's amax element), keeping the first-minimum rule.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/simd/kernels.cc"
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE  // every x86 target, so tests can check each one
#endif
#include "quant/simd/kernels.h"

#include <hwy/aligned_allocator.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "quant/simd/tables.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/scale/bounds.h"
#include "scalesweep/scale/selector.h"

#ifndef SS_SIMD_KERNELS_ONCE
#define SS_SIMD_KERNELS_ONCE
namespace scalesweep::simd {
namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
// Blocks whose amax exceeds this (only with a huge explicit global scale) run the scalar
// reference: far beyond 448 * 6 every scale saturates, and near float overflow e^2 could be
// inf (inf * 0 weight = NaN), which the candidate kernel does not model.
constexpr float kMaxFastAmax = 1e12f;
constexpr int kMaxBlock = 64;
constexpr int64_t kSegBlocks = 64;  // blocks per row segment (1024 columns of 16)
}  // namespace
}  // namespace scalesweep::simd
#endif

HWY_BEFORE_NAMESPACE();
namespace scalesweep::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;  // lanes = candidate scales / blocks

// ---------------------------------------------------------------------------------------
// Loading: y = fl(x * gs), exact widening of bf16 / f16.
template <class D>
HWY_INLINE hn::Vec<D> LoadX(D d, const void* x, DType dtype, int64_t i) {
  if (dtype == DType::kF32) return hn::LoadU(d, static_cast<const float*>(x) + i);
  if (dtype == DType::kBF16) {
    const hn::RebindToUnsigned<D> du;
    const hn::Rebind<uint16_t, D> d16;
    const auto h = hn::LoadU(d16, static_cast<const uint16_t*>(x) + i);
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, h)));
  }
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(x) + i));
}

HWY_INLINE float LoadScalar(const void* x, DType dtype, int64_t i) {
  if (dtype == DType::kF32) return static_cast<const float*>(x)[i];
  if (dtype == DType::kBF16) return format::bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
  return format::f16_to_f32(static_cast<const uint16_t*>(x)[i]);
}

void LoadScaledImpl(const void* x, DType dtype, int64_t n, float gs, float* y) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vgs = hn::Set(d, gs);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(LoadX(d, x, dtype, i), vgs), d, y + i);
  for (; i < n; ++i) y[i] = LoadScalar(x, dtype, i) * gs;
}

// ---------------------------------------------------------------------------------------
// E4M3 rounding of positive finite floats (vector): RNE (saturating at 448) or floor.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Fp8Pattern(D d, hn::Vec<D> v, bool floor_mode) {
  const hn::RebindToSigned<D> di;
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  // Normal E4M3 range (v >= 2^-6): keep 3 mantissa bits, rounding at bit 20 (a carry moves
  // into the exponent); pattern = (bits >> 20) - (120 << 3).
  auto ur = u;
  if (!floor_mode) {
    const auto odd = hn::And(hn::ShiftRight<20>(u), hn::Set(du, 1u));
    ur = hn::Add(u, hn::Add(hn::Set(du, 0x7FFFFu), odd));
  }
  auto pn = hn::Sub(hn::BitCast(di, hn::ShiftRight<20>(ur)), hn::Set(di, 960));
  pn = hn::Min(pn, hn::Set(di, 126));
  // Subnormal range: v * 2^9 < 8 exactly, rounded to an integer (RNE by the 2^23 trick).
  const auto m = hn::Mul(v, hn::Set(d, 512.0f));
  const auto big = hn::Set(d, 8388608.0f);
  const auto mr = floor_mode ? m : hn::Sub(hn::Add(m, big), big);
  const auto ps = hn::ConvertTo(di, mr);  // exact integer (truncation of a non-negative value)
  const auto is_sub = hn::RebindMask(di, v < hn::Set(d, 0.015625f));
  return hn::IfThenElse(is_sub, ps, pn);
}

void Fp8RoundImpl(const float* v, int64_t n, bool floor_mode, uint8_t* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN int32_t tmp[hn::MaxLanes(d)];
  for (int64_t i = 0; i < n; i += N) {
    const int64_t cnt = std::min(N, n - i);
    HWY_ALIGN float buf[hn::MaxLanes(d)] = {};
    for (int64_t j = 0; j < cnt; ++j) buf[j] = v[i + j];
    hn::Store(Fp8Pattern(d, hn::Load(d, buf), floor_mode), hn::RebindToSigned<DF>(), tmp);
    for (int64_t j = 0; j < cnt; ++j) out[i + j] = static_cast<uint8_t>(tmp[j]);
  }
}

// ---------------------------------------------------------------------------------------
// FP4 index of |y| for one scale pattern: number of thresholds crossed (ties as the
// reference: the table thresholds of even midpoints are bumped to the next float).
template <class D>
struct Thresholds {
  hn::Vec<D> t[7];
  HWY_INLINE Thresholds(D d, int pattern) {
    for (int b = 0; b < 7; ++b) t[b] = hn::Set(d, kScaleTables.thr[b][pattern]);
  }
};

template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Fp4Index(D /*d*/, const Thresholds<D>& th,
                                                   hn::Vec<D> ay) {
  const hn::RebindToSigned<D> di;
  // The thresholds are sorted, so the index (number of thresholds <= |y|) is found by a
  // 3-step binary search: bit 2 from t3, bit 1 from t5 / t1, bit 0 from t6 / t4 / t2 / t0.
  const auto m2 = ay >= th.t[3];
  const auto m1 = ay >= hn::IfThenElse(m2, th.t[5], th.t[1]);
  const auto t_hi = hn::IfThenElse(m1, th.t[6], th.t[4]);
  const auto t_lo = hn::IfThenElse(m1, th.t[2], th.t[0]);
  const auto m0 = ay >= hn::IfThenElse(m2, t_hi, t_lo);
  auto idx = hn::IfThenElseZero(hn::RebindMask(di, m2), hn::Set(di, 4));
  idx = hn::Or(idx, hn::IfThenElseZero(hn::RebindMask(di, m1), hn::Set(di, 2)));
  return hn::Or(idx, hn::IfThenElseZero(hn::RebindMask(di, m0), hn::Set(di, 1)));
}

// As Fp4Index, the thresholds read straight from the table (no Thresholds object).
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Fp4IndexAt(D d, int p, hn::Vec<D> ay) {
  const hn::RebindToSigned<D> di;
  const auto t = [&](int b) { return hn::Set(d, kScaleTables.thr[b][p]); };
  const auto m2 = ay >= t(3);
  const auto m1 = ay >= hn::IfThenElse(m2, t(5), t(1));
  const auto m0 =
      ay >= hn::IfThenElse(m2, hn::IfThenElse(m1, t(6), t(4)), hn::IfThenElse(m1, t(2), t(0)));
  auto idx = hn::IfThenElseZero(hn::RebindMask(di, m2), hn::Set(di, 4));
  idx = hn::Or(idx, hn::IfThenElseZero(hn::RebindMask(di, m1), hn::Set(di, 2)));
  return hn::Or(idx, hn::IfThenElseZero(hn::RebindMask(di, m0), hn::Set(di, 1)));
}

template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Fp4Code(D d, const Thresholds<D>& th, hn::Vec<D> y) {
  const hn::RebindToSigned<D> di;
  const hn::RebindToUnsigned<D> du;
  const auto idx = Fp4Index(d, th, hn::Abs(y));
  const auto sign =
      hn::BitCast(di, hn::And(hn::ShiftRight<28>(hn::BitCast(du, y)), hn::Set(du, 8u)));
  return hn::Or(idx, sign);
}

// Codes of y[0..n) (n a multiple of Lanes(d)) as bytes.
template <class D>
HWY_INLINE void CodesBlock(D d, const float* y, size_t n, int pattern, uint8_t* out) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint8_t, decltype(di)> d8;
  const Thresholds<D> th(d, pattern);
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i < n; i += N)
    hn::StoreU(hn::DemoteTo(d8, Fp4Code(d, th, hn::LoadU(d, y + i))), d8, out + i);
}

// Codes of y[0..n) (n a multiple of Lanes(d)) packed into nibbles, n / 2 bytes: byte j =
// code[2j] | code[2j + 1] << 4. Lanes are paired in 64-bit halves and truncated to bytes
// (one vpmovqb on AVX-512), with no byte-per-code intermediate.
template <class D>
HWY_INLINE void PackedCodesBlock(D d, const float* y, size_t n, int pattern, uint8_t* out) {
#if HWY_TARGET == HWY_SCALAR
  HWY_ALIGN uint8_t cb[kMaxBlock];  // one lane: codes as bytes, then pairs
  CodesBlock(d, y, n, pattern, cb);
  for (size_t j = 0; j < n / 2; ++j)
    out[j] = static_cast<uint8_t>(cb[2 * j] | (cb[2 * j + 1] << 4));
#else
  const hn::RebindToSigned<D> di;
  const hn::Repartition<uint64_t, decltype(di)> d64;
  const hn::Rebind<uint8_t, decltype(d64)> d8;
  const Thresholds<D> th(d, pattern);
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i < n; i += N) {
    const auto c = hn::BitCast(d64, Fp4Code(d, th, hn::LoadU(d, y + i)));  // lo | hi << 32
    const auto v = hn::Or(c, hn::ShiftRight<28>(c));  // low byte: lo | hi << 4 (codes < 16)
    hn::StoreU(hn::TruncateTo(d8, v), d8, out + i / 2);
  }
#endif
}

void Fp4CodesImpl(const float* y, int64_t n, int pattern, uint8_t* codes) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN float buf[hn::MaxLanes(d)];
  HWY_ALIGN uint8_t cb[hn::MaxLanes(d)];
  for (int64_t i = 0; i < n; i += N) {
    const int64_t cnt = std::min(N, n - i);
    for (int64_t j = 0; j < N; ++j) buf[j] = j < cnt ? y[i + j] : 0.0f;
    CodesBlock(d, buf, static_cast<size_t>(N), pattern, cb);
    std::memcpy(codes + i, cb, static_cast<size_t>(cnt));
  }
}

void PackNibblesImpl(const uint8_t* c, int64_t n, uint8_t* out) {
  const hn::ScalableTag<uint16_t> d16;
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<uint8_t, decltype(d16)> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d16));
  const int64_t pairs = n / 2;
  int64_t j = 0;
  for (; j + N <= pairs; j += N) {
    // little-endian u16 = c[2j] | c[2j+1] << 8  ->  low byte of (x | x >> 4)
    const auto x = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(c + 2 * j));
    const auto v = hn::And(hn::Or(x, hn::ShiftRight<4>(x)), hn::Set(d16, 0xFF));
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di16, v)), d8, out + j);
  }
  for (; j < pairs; ++j) out[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
  if (n & 1) out[pairs] = c[n - 1];
}

// ---------------------------------------------------------------------------------------
// Candidate-loss kernels: lanes = candidate scales, one element at a time in index order, so
// every lane performs exactly the reference's sequence of float operations for its scale.
//
// (1) Unrestricted (any patterns, used below pattern 8 and for pattern lists): lanes = table
// columns col .. col + N - 1, all 7 thresholds compared. Tables are addressed from one base:
// thresholds at base, level products at base + kLvlOff.
template <bool kWeighted, size_t kStride, size_t kLvlOff>
HWY_INLINE void ElemStep7(DF d, hn::Vec<DF>& L, float ay, float w, const char* base) {
  const auto a = hn::Set(d, ay);
  constexpr size_t R = kStride * sizeof(float);
  auto p = hn::LoadU(d, reinterpret_cast<const float*>(base + kLvlOff));
  for (int j = 0; j < 7; ++j)
    p = hn::IfThenElse(a >= hn::LoadU(d, reinterpret_cast<const float*>(base + j * R)),
                       hn::LoadU(d, reinterpret_cast<const float*>(base + kLvlOff + (j + 1) * R)),
                       p);
  const auto e = hn::Sub(a, p);  // fl(|y| - p) = |fl(y - sign * p)|
  auto t = hn::Mul(e, e);
  if (kWeighted) t = hn::Mul(t, hn::Set(d, w));
  L = hn::Add(L, t);
}

template <bool kWeighted, size_t kStride, size_t kLvlOff>
HWY_INLINE hn::Vec<DF> ChunkLoss7(DF d, const float* ay, const float* w, int n, const char* base) {
  auto L = hn::Zero(d);
  for (int i = 0; i < n; ++i)
    ElemStep7<kWeighted, kStride, kLvlOff>(d, L, ay[i], kWeighted ? w[i] : 0.0f, base);
  return L;
}

// Per-block scratch (one per row kernel call).
struct BlockCtx {
  const float* ay = nullptr;          // |y|, padded with zeros to a multiple of the block vectors
  const float* w = nullptr;           // weights or nullptr
  int n = 0;                          // real block length
  int n_pad = 0;                      // multiple of the element-vector lanes
  int32_t* rows = nullptr;            // scratch: per-element split-table row offsets, >= n_pad
  const SplitTable* split = nullptr;  // split_tables(), fetched once per kernel call
};

template <size_t kStride, size_t kLvlOff>
HWY_INLINE hn::Vec<DF> ChunkLoss7W(DF d, const BlockCtx& b, const char* base) {
  if (b.w) return ChunkLoss7<true, kStride, kLvlOff>(d, b.ay, b.w, b.n, base);
  return ChunkLoss7<false, kStride, kLvlOff>(d, b.ay, nullptr, b.n, base);
}

struct Best {
  int pattern;
  float loss;
};

// Byte distance from kScaleTables.thr to kScaleTables.lvl.
constexpr size_t kTabLvlOff = sizeof(float) * kTabRows * kTabStride;
static_assert(offsetof(ScaleTables, thr) == 0 && offsetof(ScaleTables, lvl) == kTabLvlOff);

// (2) Split-half kernel for 16 consecutive normal patterns c .. c + 15 (c >= 8), the sweeps'
// and exhaustive search's workhorse. Within each half (8 consecutive normal patterns, scale
// ratio < 2) an element's FP4 index takes at most 3 values [k, k + 2], k = its index at the
// half's largest scale, so 2 threshold compares and 3 level rows suffice; the two halves'
// rows differ by d = k_lo - k_hi in {0, 1, 2} (the halves' top scales differ by a factor <= 2),
// so one 16-lane row of split_tables()[3c + d] serves both (tables.h; docs/NUMERICS.md).
using DC = hn::CappedTag<float, 16>;  // candidate vectors: 16 lanes = NC vectors of Lanes(DC)
constexpr size_t kSplitRowBytes = 16 * sizeof(float);
constexpr size_t kSplitLvlOff = kSplitRows * kSplitRowBytes;
static_assert(offsetof(SplitTable, lvl) == kSplitLvlOff && sizeof(SplitTable) % 64 == 0);
constexpr size_t kNC = 16 / hn::MaxLanes(DC());
static_assert(kNC * hn::MaxLanes(DC()) == 16, "candidate vectors tile 16 lanes");

struct Loss16 {
  hn::Vec<DC> v[kNC];
};

// Row addresses of the elements of b for the split table of columns c .. c + 15: element i
// uses split_tables()[3c + d_i].thr[k_hi_i] (as an integer, read back through memory).
template <class DE>
HWY_INLINE void SplitRows(DE de, const BlockCtx& b, int c) {
  const hn::RebindToSigned<DE> di;
  const int p_hi = std::min(c + 15, 126), p_lo = std::min(c + 7, 126);
  const size_t NE = hn::Lanes(de);
  const auto row = hn::Set(di, static_cast<int32_t>(kSplitRowBytes));
  const auto var = hn::Set(di, static_cast<int32_t>(sizeof(SplitTable)));
  // byte offset of split_tables()[3c] (< 2^31: 381 tables of 1280 bytes)
  const auto col = hn::Set(di, static_cast<int32_t>(sizeof(SplitTable) * kSplitVariants * c));
  for (size_t i = 0; i < static_cast<size_t>(b.n_pad); i += NE) {
    const auto ay = hn::LoadU(de, b.ay + i);
    const auto khi = Fp4IndexAt(de, p_hi, ay);
    const auto klo = Fp4IndexAt(de, p_lo, ay);
    const auto off = hn::Add(hn::Mul(hn::Sub(klo, khi), var), hn::Mul(khi, row));
    hn::StoreU(hn::Add(off, col), di, b.rows + i);
  }
  // The inner loops read each offset back from memory (one load, then base + index
  // addressing) instead of extracting it from a vector register (two shuffle-port uops).
  asm volatile("" : : "r"(b.rows) : "memory");
}

template <bool kWeighted>
HWY_INLINE void SplitStep(Loss16& L, float ay, float w, const char* base, int32_t row) {
  const DC dc;
  const auto a = hn::Set(dc, ay);
  const char* t0 = base + row;
  for (size_t k = 0; k < kNC; ++k) {
    const char* t = t0 + k * hn::Lanes(dc) * sizeof(float);
    auto p = hn::Load(dc, reinterpret_cast<const float*>(t + kSplitLvlOff));
    p = hn::IfThenElse(
        a >= hn::Load(dc, reinterpret_cast<const float*>(t)),
        hn::Load(dc, reinterpret_cast<const float*>(t + kSplitLvlOff + kSplitRowBytes)), p);
    p = hn::IfThenElse(
        a >= hn::Load(dc, reinterpret_cast<const float*>(t + kSplitRowBytes)),
        hn::Load(dc, reinterpret_cast<const float*>(t + kSplitLvlOff + 2 * kSplitRowBytes)), p);
    const auto e = hn::Sub(a, p);  // fl(|y| - p) = |fl(y - sign * p)|
    auto tt = hn::Mul(e, e);
    if (kWeighted) tt = hn::Mul(tt, hn::Set(dc, w));
    L.v[k] = hn::Add(L.v[k], tt);
  }
}

template <bool kWeighted>
HWY_INLINE void SplitLoss(const BlockCtx& b, Loss16& L) {
  const char* base = reinterpret_cast<const char*>(b.split);
  for (size_t k = 0; k < kNC; ++k) L.v[k] = hn::Zero(DC());
  if (b.n == 16) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      SplitStep<kWeighted>(L, b.ay[i], kWeighted ? b.w[i] : 0.0f, base, b.rows[i]);
  } else {
    for (int i = 0; i < b.n; ++i)
      SplitStep<kWeighted>(L, b.ay[i], kWeighted ? b.w[i] : 0.0f, base, b.rows[i]);
  }
}

HWY_INLINE void StoreLoss16(const Loss16& L, float* out) {
  const DC dc;
  for (size_t k = 0; k < kNC; ++k) hn::Store(L.v[k], dc, out + k * hn::Lanes(dc));
}

// First minimum of the losses of patterns c .. c + cnt - 1 (lanes past cnt ignored): lowest
// loss, first lane on ties; an all-inf range gives {c, inf}.
HWY_INLINE Best FirstMin16(Loss16& L, int c, int cnt) {
  const DC dc;
  const size_t N = hn::Lanes(dc);
  const auto inf = hn::Set(dc, kInf);
  auto m = inf;
  for (size_t k = 0; k < kNC; ++k) {
    const int valid = std::clamp(cnt - static_cast<int>(k * N), 0, static_cast<int>(N));
    L.v[k] = hn::IfThenElse(hn::FirstN(dc, static_cast<size_t>(valid)), L.v[k], inf);
    m = hn::Min(m, L.v[k]);
  }
  // All-inf losses (huge weights) give lane 0, i.e. {c, inf}, as the reference keeps its first
  // candidate: the lanes past cnt are +inf too.
  const float mn = hn::GetLane(hn::MinOfLanes(dc, m));
  const auto vm = hn::Set(dc, mn);
  for (size_t k = 0; k < kNC; ++k) {
    const intptr_t j = hn::FindFirstTrue(dc, L.v[k] == vm);
    if (j >= 0) return {c + static_cast<int>(k * N) + static_cast<int>(j), mn};
  }
  return {c, kInf};  // not reached
}

// Losses of the consecutive patterns [c, c + cnt) (cnt <= 16) into L (lanes past cnt: any
// finite value or +inf, ignored by FirstMin16).
template <class DE>
HWY_INLINE void RangeLosses(DE de, const BlockCtx& b, int c, int cnt, Loss16& L) {
  if (c >= 8) {
    SplitRows(de, b, c);
    if (b.w)
      SplitLoss<true>(b, L);
    else
      SplitLoss<false>(b, L);
    return;
  }
  // subnormal scales (patterns 1..7, ratio up to 8 across a chunk): every threshold
  const DF d;
  HWY_ALIGN float tmp[16] = {};  // lanes past cnt: 0, ignored by FirstMin16
  const int N = static_cast<int>(hn::Lanes(d));
  for (int j = 0; j < cnt; j += N) {
    const char* base = reinterpret_cast<const char*>(&kScaleTables) + sizeof(float) * (c + j);
    hn::Store(ChunkLoss7W<kTabStride, kTabLvlOff>(d, b, base), d, tmp + j);
  }
  for (size_t k = 0; k < kNC; ++k) L.v[k] = hn::Load(DC(), tmp + k * hn::Lanes(DC()));
}

// Two full blocks of 16 at once, each with a window of <= 16 normal patterns: the two loss
// chains are independent, so interleaving them hides the add latency (each lane still adds
// its block's terms in index order). First-minimum pattern of each, exactly as EvalRange.
template <class DE, bool kWeighted>
HWY_INLINE void EvalPair16(DE de, const BlockCtx& b1, int lo1, int hi1, const BlockCtx& b2, int lo2,
                           int hi2, int* pat1, int* pat2) {
  SplitRows(de, b1, lo1);
  SplitRows(de, b2, lo2);
  const char* base = reinterpret_cast<const char*>(b1.split);  // b2.split is the same
  Loss16 L1, L2;
  for (size_t k = 0; k < kNC; ++k) L1.v[k] = L2.v[k] = hn::Zero(DC());
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    SplitStep<kWeighted>(L1, b1.ay[i], kWeighted ? b1.w[i] : 0.0f, base, b1.rows[i]);
    SplitStep<kWeighted>(L2, b2.ay[i], kWeighted ? b2.w[i] : 0.0f, base, b2.rows[i]);
  }
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kNC == 1) {
    // Both first minima in one reduction: halves of the two (masked) loss vectors side by
    // side, then 3 in-block steps; lanes 0-7 end as block 1's minimum, 8-15 as block 2's.
    // Lanes past the windows are +inf; all-inf losses give lane 0 (as FirstMin16).
    const __m512 inf = _mm512_set1_ps(kInf);
    const __m512 x1 =
        _mm512_mask_blend_ps(_cvtu32_mask16((1u << (hi1 - lo1 + 1)) - 1u), inf, L1.v[0].raw);
    const __m512 x2 =
        _mm512_mask_blend_ps(_cvtu32_mask16((1u << (hi2 - lo2 + 1)) - 1u), inf, L2.v[0].raw);
    __m512 m =
        _mm512_min_ps(_mm512_shuffle_f32x4(x1, x2, 0x44), _mm512_shuffle_f32x4(x1, x2, 0xEE));
    m = _mm512_min_ps(m, _mm512_shuffle_f32x4(m, m, 0xB1));
    m = _mm512_min_ps(m, _mm512_permute_ps(m, 0x4E));
    m = _mm512_min_ps(m, _mm512_permute_ps(m, 0xB1));
    const unsigned e1 =
        _cvtmask16_u32(_mm512_cmp_ps_mask(x1, _mm512_shuffle_f32x4(m, m, 0x00), _CMP_EQ_OQ));
    const unsigned e2 =
        _cvtmask16_u32(_mm512_cmp_ps_mask(x2, _mm512_shuffle_f32x4(m, m, 0xAA), _CMP_EQ_OQ));
    *pat1 = lo1 + static_cast<int>(hwy::Num0BitsBelowLS1Bit_Nonzero32(e1));
    *pat2 = lo2 + static_cast<int>(hwy::Num0BitsBelowLS1Bit_Nonzero32(e2));
    return;
  }
#endif
  *pat1 = FirstMin16(L1, lo1, hi1 - lo1 + 1).pattern;
  *pat2 = FirstMin16(L2, lo2, hi2 - lo2 + 1).pattern;
}

// First minimum over the consecutive patterns [lo, hi] (sweep order = ascending pattern).
template <class DE>
HWY_INLINE Best EvalRange(DE de, const BlockCtx& b, int lo, int hi) {
  // The reference starts with the first candidate and replaces it only on a strictly lower
  // loss; lanes past the range are +inf, so an all-inf range keeps `lo` as well.
  Best best{lo, kInf};
  for (int c = lo; c <= hi;) {
    // chunks of 16, but never mixing subnormal (c < 8) and normal patterns in one chunk
    const int cnt = c < 8 ? std::min(8, hi + 1) - c : std::min(16, hi - c + 1);
    Loss16 L;
    RangeLosses(de, b, c, cnt, L);
    const Best m = FirstMin16(L, c, cnt);
    if (m.loss < best.loss) best = m;
    c += cnt;
  }
  return best;
}

// Losses of an arbitrary list of patterns (0..126, 0 = scale 0), cnt <= 16.
HWY_INLINE void EvalList(const BlockCtx& b, const int* pats, int cnt, float* out) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  constexpr int kCols = 32;
  struct Local {
    float thr[8][kCols];
    float lvl[8][kCols];
  };
  HWY_ALIGN Local t;
  for (int j = 0; j < kCols; ++j) {
    const int p = pats[std::min(j, cnt - 1)];
    for (int r = 0; r < 8; ++r) t.thr[r][j] = kScaleTables.thr[r][p];
    for (int r = 0; r < 8; ++r) t.lvl[r][j] = kScaleTables.lvl[r][p];
  }
  constexpr size_t kOff = sizeof(float) * 8 * kCols;
  static_assert(offsetof(Local, lvl) == kOff);
  for (int c = 0; c < cnt; c += N) {
    HWY_ALIGN float tmp[hn::MaxLanes(d)];
    const char* base = reinterpret_cast<const char*>(&t) + sizeof(float) * c;
    hn::Store(ChunkLoss7W<kCols, kOff>(d, b, base), d, tmp);
    for (int j = 0; j < N && c + j < cnt; ++j) out[c + j] = tmp[j];
  }
}

// Losses of two patterns p[0] <= p[1] (4over6: RNE of a/6 and a/4; opt-fp8: floor and ceil):
// one chunk of the consecutive range [p0, p1] when it spans <= 16 patterns (the candidate
// losses do not depend on the other lanes), else the two-column list kernel.
template <class DE>
HWY_INLINE void TwoLosses(DE de, const BlockCtx& b, const int* p, float* l) {
  const int span = p[1] - p[0];
  if (span >= 0 && span < 16) {
    Loss16 L;
    RangeLosses(de, b, p[0], span + 1, L);
    HWY_ALIGN float tmp[16];
    StoreLoss16(L, tmp);
    l[0] = tmp[0];
    l[1] = tmp[span];
  } else {
    EvalList(b, p, 2, l);
  }
}

// Term of the amax element for a saturating scale s (a / s >= 6): fl(fl(a - 6s)^2) [* w].
HWY_INLINE float SatTerm(float a, float s, float wa) {
  const float e = a - 6.0f * s;  // 6s exact
  float t = e * e;
  return t * wa;
}

// Exhaustive search over patterns 1..126 with exact pruning (docs/NUMERICS.md):
//  * a pattern p >= 16 whose scale exceeds a/3.5 is weakly dominated by p - 8 (its exact
//    half; Lemma 4.1 term by term, also in float) and comes later, so it never wins;
//  * below the base, every scale saturates the amax element, whose float term is a lower
//    bound of the float loss and grows as the scale decreases, so once it exceeds the best
//    loss found, no lower pattern can win (not even by a tie).
template <class DE>
HWY_INLINE Best Exhaustive(DE de, const BlockCtx& b, float a, int P, int amax_idx) {
  const auto& T = kScaleTables;
  // Highest pattern with 3.5 s <= a (exact compare), at least 15.
  // (Start at P + 16, whose scale is >= 4 s_P > a / 3.5 since a < 6 s_{P+1}.)
  int hx = std::min(126, P + 16);
  while (hx > 15 && 3.5f * T.scale[hx] > a) --hx;
  const int clo = std::clamp(P - 3, 1, hx);
  Best best = EvalRange(de, b, clo, hx);
  if (clo > 1) {
    const float wa = b.w ? b.w[amax_idx] : 1.0f;
    int p = clo - 1;
    while (p >= 1 && !(SatTerm(a, T.scale[p], wa) > best.loss)) --p;
    if (p + 1 <= clo - 1) {
      const Best low = EvalRange(de, b, p + 1, clo - 1);
      if (low.loss <= best.loss) best = low;  // earlier in sweep order: wins ties
    }
  }
  return best;
}

// Sweep window of a block (same as sweep_patterns in src/scale/selector.cc).
HWY_INLINE void SweepWindow(const SelectorConfig& cfg, int P, int n, int* lo_out, int* hi_out) {
  int lo, hi;
  if (cfg.method == Method::kSweep || cfg.window) {
    lo = P + cfg.window->lo;
    hi = P + cfg.window->hi;
  } else if (const auto pw =
                 cfg.method == Method::kSweepMse
                     ? bounds::proven_window(bounds::ElemFormat::kE2M1, ScaleFormat::kE4M3, n, P)
                     : std::nullopt) {
    // per-base window proven in exact arithmetic (src/scale/bounds), as the reference
    lo = P + pw->lo;
    hi = P + pw->hi;
  } else {
    const bool normal = P >= 16;
    hi = normal ? P + 7 : std::max(P + 7, 15);
    if (cfg.method == Method::kSweepMse) {
      const bool paper =
          normal && n <= 16 && (11.0 / 7.0) * static_cast<double>(kScaleTables.scale[P]) <= 448.0;
      lo = paper ? P - 3 : normal ? P - 7 : 1;
    } else {
      lo = normal ? P - 8 : 1;
    }
  }
  lo = std::clamp(lo, 1, 126);
  hi = std::clamp(hi, 1, 126);
  *lo_out = lo;
  *hi_out = std::max(lo, hi);
}

// ---------------------------------------------------------------------------------------
// y = fl(x * gs) and |y| of x[0..len), zero from len to `end` (a multiple of Lanes(d)).
// check: returns false when some |y| > 2^48 or is NaN.
template <DType kDt>
HWY_INLINE bool LoadSegment(DF d, const void* x, int64_t len, int64_t end, float gs, bool check,
                            float* HWY_RESTRICT y, float* HWY_RESTRICT ay) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vgs = hn::Set(d, gs);
  const auto lim = hn::Set(d, 0x1p48f);
  auto ok = hn::FirstN(d, static_cast<size_t>(N));
  int64_t i = 0;
  for (; i + N <= len; i += N) {
    const auto v = hn::Mul(LoadX(d, x, kDt, i), vgs);
    const auto a = hn::Abs(v);
    if (check) ok = hn::And(ok, a <= lim);  // NaN fails the compare
    hn::Store(v, d, y + i);
    hn::Store(a, d, ay + i);
  }
  bool good = !check || hn::AllTrue(d, ok);
  for (; i < len; ++i) {
    y[i] = LoadScalar(x, kDt, i) * gs;
    ay[i] = std::fabs(y[i]);
    if (check && !(ay[i] <= 0x1p48f)) good = false;
  }
  for (; i < end; ++i) y[i] = ay[i] = 0.0f;
  return good;
}

// ---------------------------------------------------------------------------------------
// Row kernel. DE: tag for the element vectors of one block (Lanes(de) divides the block).
// check: also verify every |y| <= 2^48 (false for NaN / Inf); on the first violation set *bad
// and return (the rows are then incomplete; the caller reports the error).
// kSearch: instantiation for the sweeps and exhaustive search (their candidate code stays out
// of the other methods' loops, whose register allocation it would otherwise degrade).
template <class DE, bool kSearch>
bool RowsT(DE de, const detail::RowJob& job, int64_t r0, int64_t r1, bool check, bool* bad) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int B = job.block;
  const int64_t cols = job.cols, nb = job.blocks_per_row(), pc = job.packed_cols();
  // Rows are processed in segments of up to kSegBlocks blocks so that the scratch rows stay in
  // L1 (a whole 8192-column row of y, |y| and codes would not).
  const int64_t SB = std::min<int64_t>(nb, kSegBlocks);
  const int64_t padded = SB * B + 2 * N + kMaxBlock;
  const Method m = job.selector.method;
  auto yb = hwy::AllocateAligned<float>(static_cast<size_t>(padded));
  auto ayb = hwy::AllocateAligned<float>(static_cast<size_t>(padded));
  auto cb = hwy::AllocateAligned<uint8_t>(static_cast<size_t>(padded));
  auto amax = hwy::AllocateAligned<float>(static_cast<size_t>(SB + N));
  auto pf = hwy::AllocateAligned<uint8_t>(static_cast<size_t>(SB + N));
  auto pr = hwy::AllocateAligned<uint8_t>(static_cast<size_t>(SB + N));
  auto pr4 = hwy::AllocateAligned<uint8_t>(static_cast<size_t>(SB + N));
  auto rows = hwy::AllocateAligned<int32_t>(static_cast<size_t>(kMaxBlock + 2 * N));
  const SplitTable* split = split_tables();
  auto rows2 = hwy::AllocateAligned<int32_t>(static_cast<size_t>(kMaxBlock + 2 * N));
  auto pre = hwy::AllocateAligned<int16_t>(static_cast<size_t>(SB + N));  // paired results
  const bool sweep = m == Method::kSweepMse || m == Method::kSweepWmse || m == Method::kSweep;
  float* y = yb.get();
  float* ay = ayb.get();
  std::fill(y, y + padded, 0.0f);
  std::fill(ay, ay + padded, 0.0f);
  const size_t NE = hn::Lanes(de);
  const bool need_floor = m != Method::kAbsMax && m != Method::kFourOverSix;
  const bool need_rn = m == Method::kAbsMax || m == Method::kFourOverSix;
  // Sweep windows of full blocks, per base pattern (partial blocks compute theirs).
  int win_lo[127], win_hi[127];
  for (int P = 0; P <= 126; ++P) SweepWindow(job.selector, P, B, &win_lo[P], &win_hi[P]);
  // Importance of a block (as detail::block_weights, inlined).
  const float* imp = job.imp_kind == ImportanceKind::kNone ? nullptr : job.imp;
  const bool imp_per_el = job.imp_kind == ImportanceKind::kPerElement;

  const size_t esize = job.dtype == DType::kF32 ? 4 : 2;
  for (int64_t r = r0; r < r1; ++r) {
    uint8_t* srow = job.scales + r * nb;
    for (int64_t sb = 0; sb < nb; sb += SB) {
      const int64_t nbs = std::min(SB, nb - sb);  // blocks in this segment
      const int64_t seg0 = sb * B;                // first column
      const int64_t len = std::min(nbs * B, cols - seg0);
      // y = fl(x * gs), |y|, per-block amax (zero padding changes neither amax nor losses)
      // y = fl(x * gs) and |y| in one pass (zero padding up to the segment's vectors)
      const void* xs =
          static_cast<const char*>(job.x) + (r * cols + seg0) * static_cast<int64_t>(esize);
      bool ok;
      if (job.dtype == DType::kBF16)
        ok = LoadSegment<DType::kBF16>(d, xs, len, nbs * B + N, job.gs, check, y, ay);
      else if (job.dtype == DType::kF16)
        ok = LoadSegment<DType::kF16>(d, xs, len, nbs * B + N, job.gs, check, y, ay);
      else
        ok = LoadSegment<DType::kF32>(d, xs, len, nbs * B + N, job.gs, check, y, ay);
      if (!ok) {
        *bad = true;
        return true;
      }
      int64_t bi0 = 0;
#if HWY_TARGET <= HWY_AVX3
      // 16 blocks of 16 in 16-lane vectors: a transposing max tree (15 x (2 shuffles + max)
      // for 16 blocks instead of a full lane reduction per block); max is exact in any order.
      if (B == 16 && N == 16) {
        for (; bi0 + 16 <= nbs; bi0 += 16) {
          const float* a0 = ay + bi0 * 16;
          hn::Vec<DF> v[16];
          for (int k = 0; k < 16; k += 2) {  // [blk k lo-hi max | blk k+1 lo-hi max]
            const auto x = hn::Load(d, a0 + k * 16), y2 = hn::Load(d, a0 + (k + 1) * 16);
            v[k / 2] = hn::Max(hn::ConcatLowerLower(d, y2, x), hn::ConcatUpperUpper(d, y2, x));
          }
          for (int cnt = 8; cnt > 1; cnt /= 2)  // halve the values per block, keep block order
            for (int k = 0; k < cnt; k += 2)
              v[k / 2] =
                  hn::Max(hn::ConcatEven(d, v[k + 1], v[k]), hn::ConcatOdd(d, v[k + 1], v[k]));
          hn::Store(v[0], d, amax.get() + bi0);
        }
      }
#endif
      for (int64_t bi = bi0; bi < nbs; ++bi) {
        const float* ab = ay + bi * B;
        auto mx = hn::Load(de, ab);
        for (size_t i = NE; i < static_cast<size_t>(B); i += NE)
          mx = hn::Max(mx, hn::Load(de, ab + i));
        amax[bi] = hn::GetLane(hn::MaxOfLanes(de, mx));
      }
      for (int64_t bi = nbs; bi < nbs + N; ++bi) amax[bi] = 0.0f;
      // scale rounding across blocks: fl(a/6) (IEEE division) then floor / RNE onto E4M3
      for (int64_t bi = 0; bi < nbs; bi += N) {
        const auto a = hn::Load(d, amax.get() + bi);
        const auto a6 = hn::Div(a, hn::Set(d, 6.0f));
        HWY_ALIGN int32_t t[hn::MaxLanes(d)];
        const hn::RebindToSigned<DF> di;
        if (need_floor) {
          hn::Store(Fp8Pattern(d, a6, true), di, t);
          for (int64_t j = 0; j < N; ++j) pf[bi + j] = static_cast<uint8_t>(t[j]);
        }
        if (need_rn) {
          hn::Store(Fp8Pattern(d, a6, false), di, t);
          for (int64_t j = 0; j < N; ++j) pr[bi + j] = static_cast<uint8_t>(t[j]);
          if (m == Method::kFourOverSix) {
            hn::Store(Fp8Pattern(d, hn::Mul(a, hn::Set(d, 0.25f)), false), di, t);
            for (int64_t j = 0; j < N; ++j) pr4[bi + j] = static_cast<uint8_t>(t[j]);
          }
        }
      }
      // Sweeps: pairs of simple blocks (full, 16 elements, fast range, a window of <= 16
      // normal patterns: one split-kernel chunk) are evaluated together; the others
      // (pre = -1) below, one at a time.
      if (kSearch && sweep) {
        auto simple = [&](int64_t bi, int* lo, int* hi) {
          const int64_t c0 = seg0 + bi * B;
          if (B != 16 || cols - c0 < B) return false;
          const float a = amax[bi];
          if (a == 0.0f || !(a <= kMaxFastAmax)) return false;
          *lo = win_lo[pf[bi]];
          *hi = win_hi[pf[bi]];
          return *lo >= 8 && *hi - *lo + 1 <= 16;
        };
        int64_t pend = -1;  // a simple block waiting for a partner
        int plo = 0, phi = 0;
        for (int64_t bi = 0; bi < nbs; ++bi) {
          pre[bi] = -1;
          int lo, hi;
          if (!simple(bi, &lo, &hi)) continue;
          if (pend < 0) {
            pend = bi;
            plo = lo;
            phi = hi;
            continue;
          }
          BlockCtx b1, b2;
          const float* wrow =
              imp && m != Method::kSweepMse ? imp + (imp_per_el ? r * cols : 0) + seg0 : nullptr;
          b1.ay = ay + pend * B;
          b2.ay = ay + bi * B;
          b1.w = wrow ? wrow + pend * B : nullptr;
          b2.w = wrow ? wrow + bi * B : nullptr;
          b1.n = b2.n = B;
          b1.n_pad = b2.n_pad = B;
          b1.split = b2.split = split;
          b1.rows = rows.get();
          b2.rows = rows2.get();
          int p1, p2;
          if (wrow)
            EvalPair16<DE, true>(de, b1, plo, phi, b2, lo, hi, &p1, &p2);
          else
            EvalPair16<DE, false>(de, b1, plo, phi, b2, lo, hi, &p1, &p2);
          pre[pend] = static_cast<int16_t>(p1);
          pre[bi] = static_cast<int16_t>(p2);
          pend = -1;
        }
      }
      for (int64_t bi = 0; bi < nbs; ++bi) {
        const int64_t c0l = bi * B;     // column in the segment buffers
        const int64_t c0 = seg0 + c0l;  // column in the tensor
        const int n = static_cast<int>(std::min<int64_t>(B, cols - c0));
        const float a = amax[bi];
        int pat = 0;
        if (a == 0.0f) {
          pat = 0;
        } else if (!(a <= kMaxFastAmax)) {
          // pathological range: scalar reference for this block
          float yr[kMaxBlock];
          std::memcpy(yr, y + c0l, sizeof(float) * static_cast<size_t>(n));
          pat = select_block_scale(yr, detail::block_weights(job, r, c0), n, job.selector).pattern;
        } else {
          BlockCtx b;
          b.ay = ay + c0l;
          b.w = imp ? imp + (imp_per_el ? r * cols : 0) + c0 : nullptr;
          b.n = n;
          b.n_pad = static_cast<int>((static_cast<size_t>(n) + NE - 1) / NE * NE);
          b.split = split;
          b.rows = rows.get();
          switch (m) {
            case Method::kAbsMax:
              pat = pr[bi];
              break;
            case Method::kFourOverSix: {
              const int pats[2] = {pr[bi], pr4[bi]};
              float l[2];
              b.w = nullptr;
              TwoLosses(de, b, pats, l);
              pat = l[1] < l[0] ? pats[1] : pats[0];
              break;
            }
            case Method::kSweepMse:
            case Method::kSweepWmse:
            case Method::kSweep: {
              if constexpr (!kSearch) return false;  // not reached (dispatch by method)
              if (pre[bi] >= 0) {
                pat = pre[bi];
                break;
              }
              if (m == Method::kSweepMse) b.w = nullptr;
              int lo, hi;
              if (n == B) {
                lo = win_lo[pf[bi]];
                hi = win_hi[pf[bi]];
              } else {
                SweepWindow(job.selector, pf[bi], n, &lo, &hi);
              }
              pat = EvalRange(de, b, lo, hi).pattern;
              break;
            }
            case Method::kExhaustiveMse:
            case Method::kExhaustiveWmse: {
              if constexpr (!kSearch) return false;  // not reached (dispatch by method)
              if (m == Method::kExhaustiveMse) b.w = nullptr;
              int ia = 0;
              while (ay[c0l + ia] != a) ++ia;
              pat = Exhaustive(de, b, a, pf[bi], ia).pattern;
              break;
            }
            case Method::kOptFp8Mse:
            case Method::kOptFp8Wmse: {
              if (m == Method::kOptFp8Mse) b.w = nullptr;
              // continuous optimum: the scalar reference (double; stays scalar)
              const double s = opt_fp32_scale(y + c0l, b.w, n);
              auto below = [](double v) {
                float f = static_cast<float>(v);
                if (static_cast<double>(f) > v) f = std::nextafter(f, 0.0f);
                return f;
              };
              auto above = [](double v) {
                float f = static_cast<float>(v);
                if (static_cast<double>(f) < v) f = std::nextafter(f, kInf);
                return f;
              };
              int lo = static_cast<int>(format::E4M3::encode(below(s), format::Round::kFloor));
              int hi = static_cast<int>(format::E4M3::encode(above(s), format::Round::kCeil));
              lo = std::clamp(lo, 1, 126);
              hi = std::clamp(hi, lo, 126);
              if (hi == lo) {
                pat = lo;
              } else {
                const int pats[2] = {lo, hi};
                float l[2];
                TwoLosses(de, b, pats, l);
                pat = l[1] < l[0] ? hi : lo;
              }
              break;
            }
            case Method::kOptFp32:
            case Method::kSweepHessian:
            case Method::kExhaustiveHessian:
              return false;  // not reached (QuantizeRowsImpl leaves them to the reference)
          }
        }
        srow[sb + bi] = static_cast<uint8_t>(pat);
        uint8_t* dst = job.codes + r * pc + (seg0 + c0l) / 2;  // seg0 and c0l are even
        if (n == B) {
          PackedCodesBlock(de, y + c0l, static_cast<size_t>(B), pat, dst);
        } else {  // partial last block: only (n + 1) / 2 bytes belong to this row
          PackedCodesBlock(de, y + c0l, static_cast<size_t>(B), pat, cb.get());
          std::memcpy(dst, cb.get(), static_cast<size_t>((n + 1) / 2));
          if (n & 1) dst[n / 2] &= 0x0F;  // odd tail padded with code 0
        }
      }
    }
  }
  return true;
}

bool QuantizeRowsImpl(const detail::RowJob& job, int64_t r0, int64_t r1, bool check, bool* bad) {
  if (job.format != TensorFormat::kNvfp4 || job.selector.scale_format != ScaleFormat::kE4M3)
    return false;
  const Method m = job.selector.method;
  if (m == Method::kOptFp32 || method_uses_hessian(m)) return false;  // the reference runs them
  if (m == Method::kSweep && !job.selector.window) return false;      // reference reports it
  if (job.block > kMaxBlock || job.block % 8 != 0) return false;
  if (r0 >= r1) return true;
  const bool search = m == Method::kSweepMse || m == Method::kSweepWmse || m == Method::kSweep ||
                      m == Method::kExhaustiveMse || m == Method::kExhaustiveWmse;
  const hn::CappedTag<float, 16> d16;
  const hn::CappedTag<float, 8> d8;
  if (job.block % static_cast<int>(hn::Lanes(d16)) == 0)
    return search ? RowsT<decltype(d16), true>(d16, job, r0, r1, check, bad)
                  : RowsT<decltype(d16), false>(d16, job, r0, r1, check, bad);
  return search ? RowsT<decltype(d8), true>(d8, job, r0, r1, check, bad)
                : RowsT<decltype(d8), false>(d8, job, r0, r1, check, bad);
}

void BlockAmaxImpl(const float* y, int64_t n, int block, float* out) {
  const int64_t nb = (n + block - 1) / block;
  for (int64_t b = 0; b < nb; ++b) {
    const hn::CappedTag<float, 8> d;
    HWY_ALIGN float buf[kMaxBlock] = {};
    const int64_t len = std::min<int64_t>(block, n - b * block);
    for (int64_t i = 0; i < len; ++i) buf[i] = y[b * block + i];
    auto mx = hn::Zero(d);
    for (int i = 0; i < block; i += static_cast<int>(hn::Lanes(d)))
      mx = hn::Max(mx, hn::Abs(hn::Load(d, buf + i)));
    out[b] = hn::GetLane(hn::MaxOfLanes(d, mx));
  }
}

void CandidateLossesImpl(const float* y, const float* w, int n, int lo, int count, float* loss) {
  const hn::CappedTag<float, 8> de;
  HWY_ALIGN float ay[kMaxBlock + 16] = {};
  HWY_ALIGN int32_t rows[kMaxBlock + 16];
  for (int i = 0; i < n; ++i) ay[i] = std::fabs(y[i]);
  BlockCtx b;
  b.ay = ay;
  b.w = w;
  b.n = n;
  b.n_pad = (n + 7) / 8 * 8;
  b.rows = rows;
  b.split = split_tables();
  const int hi = lo + count - 1;
  for (int c = lo; c <= hi; c += 16) {
    const int cnt = std::min(16, hi - c + 1);
    Loss16 L;
    RangeLosses(de, b, c, cnt, L);
    HWY_ALIGN float tmp[16];
    StoreLoss16(L, tmp);
    for (int j = 0; j < cnt; ++j) loss[c - lo + j] = tmp[j];
  }
}

void ScanRangeImpl(const void* x, DType dtype, int64_t i0, int64_t i1, float* amax_out,
                   int* bad_out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto mx = hn::Zero(d);
  auto ok = hn::Set(d, 1.0f);
  const auto fmax = hn::Set(d, std::numeric_limits<float>::max());
  int64_t i = i0;
  for (; i + N <= i1; i += N) {
    const auto v = hn::Abs(LoadX(d, x, dtype, i));
    mx = hn::Max(mx, v);
    ok = hn::IfThenElseZero(v <= fmax, ok);  // NaN and Inf fail the compare
  }
  float a = hn::GetLane(hn::MaxOfLanes(d, mx));
  bool bad = hn::GetLane(hn::MinOfLanes(d, ok)) != 1.0f;
  for (; i < i1; ++i) {
    const float v = std::fabs(LoadScalar(x, dtype, i));
    if (!(v <= std::numeric_limits<float>::max())) bad = true;
    a = std::max(a, v);
  }
  *amax_out = a;
  *bad_out = bad ? 1 : 0;
}

void CopyBaselineImpl(const void* x, DType dtype, int64_t rows, int64_t cols, int block,
                      uint8_t* codes, uint8_t* scales, int64_t r0, int64_t r1) {
  // One nibble per element (the top 4 bits of its 16-bit pattern, or of the float's upper
  // half), one byte per block: the bytes of the packed output, with no arithmetic.
  const hn::ScalableTag<uint32_t> du32;
  const hn::Rebind<uint16_t, decltype(du32)> d16;
  const hn::Rebind<uint8_t, decltype(du32)> d8;
  const hn::RebindToSigned<decltype(du32)> di32;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du32));
  const int64_t pc = packed_cols(cols), nb = (cols + block - 1) / block;
  (void)rows;
  auto tmp = hwy::AllocateAligned<uint8_t>(static_cast<size_t>(cols + N + 1));
  for (int64_t r = r0; r < r1; ++r) {
    int64_t c = 0;
    if (dtype == DType::kF32) {
      const uint32_t* xr = static_cast<const uint32_t*>(x) + r * cols;
      for (; c + N <= cols; c += N) {
        const auto v = hn::ShiftRight<28>(hn::LoadU(du32, xr + c));
        hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di32, v)), d8, tmp.get() + c);
      }
      for (; c < cols; ++c) tmp[c] = static_cast<uint8_t>(xr[c] >> 28);
    } else {
      const uint16_t* xr = static_cast<const uint16_t*>(x) + r * cols;
      for (; c + N <= cols; c += N) {
        const auto v = hn::ShiftRight<12>(hn::PromoteTo(du32, hn::LoadU(d16, xr + c)));
        hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di32, v)), d8, tmp.get() + c);
      }
      for (; c < cols; ++c) tmp[c] = static_cast<uint8_t>(xr[c] >> 12);
    }
    tmp[cols] = 0;
    PackNibblesImpl(tmp.get(), cols, codes + r * pc);
    for (int64_t b = 0; b < nb; ++b) scales[r * nb + b] = tmp[b * block];
  }
}

}  // namespace scalesweep::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace scalesweep::simd {

HWY_EXPORT(LoadScaledImpl);
HWY_EXPORT(Fp8RoundImpl);
HWY_EXPORT(Fp4CodesImpl);
HWY_EXPORT(PackNibblesImpl);
HWY_EXPORT(QuantizeRowsImpl);
HWY_EXPORT(BlockAmaxImpl);
HWY_EXPORT(CandidateLossesImpl);
HWY_EXPORT(ScanRangeImpl);
HWY_EXPORT(CopyBaselineImpl);

std::vector<int64_t> dispatch_targets() {
  std::vector<int64_t> t = hwy::SupportedAndGeneratedTargets();
  std::sort(t.begin(), t.end());  // lower bit = better target on x86
  return t;
}

const char* target_name(int64_t target) { return hwy::TargetName(target); }

void force_target(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

const char* active_target_name() {
  const std::vector<int64_t> t = dispatch_targets();
  return t.empty() ? "none" : hwy::TargetName(t.front());
}

void load_scaled(const void* x, DType dtype, int64_t n, float gs, float* y) {
  HWY_DYNAMIC_DISPATCH(LoadScaledImpl)(x, dtype, n, gs, y);
}
void block_amax(const float* y, int64_t n, int block, float* amax) {
  HWY_DYNAMIC_DISPATCH(BlockAmaxImpl)(y, n, block, amax);
}
void fp8_round(const float* v, int64_t n, bool floor_mode, uint8_t* pattern) {
  HWY_DYNAMIC_DISPATCH(Fp8RoundImpl)(v, n, floor_mode, pattern);
}
void fp4_codes(const float* y, int64_t n, int pattern, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(Fp4CodesImpl)(y, n, pattern, codes);
}
void pack_nibbles(const uint8_t* c, int64_t n, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(PackNibblesImpl)(c, n, out);
}
void candidate_losses(const float* y, const float* w, int n, int lo, int count, float* loss) {
  HWY_DYNAMIC_DISPATCH(CandidateLossesImpl)(y, w, n, lo, count, loss);
}
bool quantize_rows(const detail::RowJob& job, int64_t r0, int64_t r1) {
  bool bad = false;
  return HWY_DYNAMIC_DISPATCH(QuantizeRowsImpl)(job, r0, r1, false, &bad);
}
bool quantize_rows_checked(const detail::RowJob& job, int64_t r0, int64_t r1, bool* bad) {
  *bad = false;
  return HWY_DYNAMIC_DISPATCH(QuantizeRowsImpl)(job, r0, r1, true, bad);
}

bool scan_finite_amax(const void* x, DType dtype, int64_t n, int threads, float* amax) {
  threads = std::max(1, threads);
  if (n < (int64_t{1} << 20)) threads = 1;
  std::vector<float> a(static_cast<size_t>(threads), 0.0f);
  std::vector<int> bad(static_cast<size_t>(threads), 0);
  parallel_for(n, threads, [&](int64_t i0, int64_t i1, int t) {
    HWY_DYNAMIC_DISPATCH(ScanRangeImpl)
    (x, dtype, i0, i1, &a[static_cast<size_t>(t)], &bad[static_cast<size_t>(t)]);
  });
  float m = 0;
  for (int t = 0; t < threads; ++t) {
    if (bad[static_cast<size_t>(t)]) return false;
    m = std::max(m, a[static_cast<size_t>(t)]);
  }
  *amax = m;
  return true;
}

void copy_baseline(const void* x, DType dtype, int64_t rows, int64_t cols, int block,
                   uint8_t* codes, uint8_t* scales, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(CopyBaselineImpl)(x, dtype, rows, cols, block, codes, scales, r0, r1);
}

}  // namespace scalesweep::simd
#endif  // HWY_ONCE

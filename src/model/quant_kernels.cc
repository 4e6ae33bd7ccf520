// Fused kernels over weights kept as stored (src/model/quant_kernels.h).
//
// Every decoder below returns the 16 weights of chunk c (columns 16c .. 16c+15) of a row with
// the arithmetic of its scalar reference (format/ggml.cc's dequantizers, weights.cc's NVFP4
// one); the build has -ffp-contract=off, so no product and sum are fused into one rounding.
#include "model/quant_kernels.h"

// GCC 12's AVX-512 headers start some conversions from _mm512_undefined_*(), which its
// -Wmaybe-uninitialized reports at every use (a false positive; the values are all written).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>
#include <optional>
#include <vector>

#include "scalesweep/format/ggml.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/layout_index.h"

namespace scalesweep::model::detail {

namespace {

using format::GgmlType;

bool cpu_has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return ok;
}

inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The 256 halved NVFP4 block scales of the ggml type, and the 256 MXFP4 ones.
struct ScaleTables {
  float ue4m3[256], e8m0[256];
  ScaleTables() {
    for (int i = 0; i < 256; ++i) {
      ue4m3[i] = format::ggml_ue4m3_half(static_cast<uint8_t>(i));
      e8m0[i] = format::ggml_e8m0_half(static_cast<uint8_t>(i));
    }
  }
};
const ScaleTables& scale_tables() {
  static const ScaleTables t;
  return t;
}

// The doubled E2M1 values, copied into each FP4 decoder (loaded once per kernel call).
struct KValues {
  float kv[16];
  KValues() { std::memcpy(kv, format::ggml_kvalues(), sizeof kv); }
};

#define SS_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c")))

// fp16 -> fp32 with the F16C instruction: exact for every finite half (subnormals included),
// so the bits of format::ggml_half_to_float for the finite scales the loader admits.
SS_AVX512 inline float half(const uint8_t* p) { return _cvtsh_ss(rd16(p)); }

// 16 bytes -> 16 floats (unsigned).
SS_AVX512 inline __m512 u8_to_ps(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
// Low nibbles of 16 bytes, and their high nibbles.
SS_AVX512 inline __m128i lo_nibbles(__m128i b) { return _mm_and_si128(b, _mm_set1_epi8(15)); }
SS_AVX512 inline __m128i hi_nibbles(__m128i b) {
  return _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
}
// The 4-bit codes in the 16 bytes at p: their low nibbles for an even c, their high nibbles for
// an odd one (ggml's 4-bit blocks keep two chunks in the two nibbles of the same bytes).
SS_AVX512 inline __m128i chunk_nibbles(const uint8_t* p, int64_t c) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (c & 1) ? hi_nibbles(q) : lo_nibbles(q);
}

// Lane layout of the FP4 gemv. The 16 four-bit codes of a chunk are 64 bits; broadcast to every
// 64-bit lane of a register and shifted right per 32-bit lane (vpsrlvd), lane L holds in its
// low four bits a code that lies in the low half of the 64 bits when L is even and in the high
// half when L is odd. So lane L decodes column lane_column[L] (even lanes take the columns
// whose codes lie in bits 0..31, in column order; odd lanes the others), with one shuffle per
// chunk (the table lookup) instead of three. The gemv loads x in the same lane order, and
// puts the 16 partial sums back in column order before its tree, so the sums are those of the
// column-ordered kernel, bit for bit. `bit(k)` is the position of column k's code.
struct FourBitLanes {
  int lane_column[16];  // permutexvar index that brings x into lane order
  int column_lane[16];  // ... and the partial sums back into column order
  int shift[16];        // per 32-bit lane
  template <typename Bit>
  constexpr explicit FourBitLanes(Bit bit) : lane_column(), column_lane(), shift() {
    int even = 0, odd = 1;
    for (int k = 0; k < 16; ++k) {
      const int b = bit(k), L = b < 32 ? even : odd;
      (b < 32 ? even : odd) += 2;
      lane_column[L] = k;
      column_lane[k] = L;
      shift[L] = b % 32;
    }
  }
};
// ggml NVFP4 sub-block: column k < 8 is the low nibble of byte k, k >= 8 the high nibble of
// byte k - 8. Compressed-tensors NVFP4: column k is nibble k (byte k/2, low nibble first).
constexpr FourBitLanes kGgmlNvfpLanes([](int k) { return k < 8 ? 8 * k : 8 * (k - 8) + 4; });
constexpr FourBitLanes kPackedNvfpLanes([](int k) { return 4 * k; });

SS_AVX512 inline __m512i load_lanes(const int* v) {
  return _mm512_loadu_si512(reinterpret_cast<const void*>(v));
}
// The codes of one chunk (8 bytes at p) in lane order.
SS_AVX512 inline __m512i fp4_lane_codes(const uint8_t* p, __m512i shifts) {
  int64_t q;
  std::memcpy(&q, p, 8);
  return _mm512_srlv_epi32(_mm512_set1_epi64(q), shifts);
}

// A thread's table of the 16 values of each of the 256 scale bytes of an FP4 decoder `D`
// (value(s, k) for scale byte s and code k), made again only when its per-tensor parameter
// changes (the parameter's bits are the key; one table per decoder type and thread).
template <typename D, typename Value>
const float* fp4_table(float param, Value value) {
  thread_local float tab[256 * 16];
  thread_local std::optional<uint32_t> have;
  uint32_t bits;
  std::memcpy(&bits, &param, 4);
  if (have != bits) {
    for (int s = 0; s < 256; ++s)
      for (int k = 0; k < 16; ++k) tab[16 * s + k] = value(s, k);
    have = bits;
  }
  return tab;
}

// The row pointer of HF row r of a kGgml tensor.
struct GgmlRows {
  const uint8_t* base;
  int64_t row_bytes;
  const Tensor* t;
  using Row = const uint8_t*;
  explicit GgmlRows(const Tensor& w)
      : base(static_cast<const uint8_t*>(w.raw)), row_bytes(ggml_row_bytes(w)), t(&w) {}
  const uint8_t* row(int64_t r) const { return base + ggml_stored_row(*t, r) * row_bytes; }
};

// ggml NVFP4: blocks of 64 (4 scale bytes, then 4 x 8 code bytes); sub-block j holds the low
// nibbles of its 8 code bytes, then their high nibbles; value fl(d * kvalue), times the
// per-tensor scale when there is one: both from a table of the 16 values of each of the 256
// scale bytes (made once per thread and per-tensor scale).
struct NvfpGgml : GgmlRows {
  const float* tab;
  explicit NvfpGgml(const Tensor& w) : GgmlRows(w), tab(table(w.ggml_scale)) {}
  static const float* table(float scale) {
    const float* kv = format::ggml_kvalues();
    const float* d = scale_tables().ue4m3;
    return fp4_table<NvfpGgml>(scale, [&](int s, int k) {
      const float v = d[s] * kv[k];
      return scale != 1.0f ? v * scale : v;
    });
  }
  SS_AVX512 __m512 chunk(const uint8_t* row, int64_t c) const {
    const uint8_t* b = row + (c >> 2) * 36;
    const int j = static_cast<int>(c & 3);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 4 + 8 * j));
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(q, _mm_srli_epi16(q, 4)));
    return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(tab + 16 * b[j]));
  }
  // The same 16 values in the lane order of kGgmlNvfpLanes.
  static constexpr const FourBitLanes* kLanes = &kGgmlNvfpLanes;
  SS_AVX512 __m512 lanes(const uint8_t* row, int64_t c, __m512i shifts) const {
    const uint8_t* b = row + (c >> 2) * 36;
    const int j = static_cast<int>(c & 3);
    return _mm512_permutexvar_ps(fp4_lane_codes(b + 4 + 8 * j, shifts),
                                 _mm512_loadu_ps(tab + 16 * b[j]));
  }
};

// MXFP4: blocks of 32 (a UE8M0 byte, 16 code bytes: low nibbles first, then high).
struct MxfpGgml : GgmlRows {
  using GgmlRows::GgmlRows;
  SS_AVX512 __m512 chunk(const uint8_t* row, int64_t c) const {
    const uint8_t* b = row + (c >> 1) * 17;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1));
    const __m512i idx = _mm512_cvtepu8_epi32((c & 1) ? _mm_srli_epi16(q, 4) : q);
    const __m512 kv = _mm512_loadu_ps(format::ggml_kvalues());
    return _mm512_mul_ps(_mm512_set1_ps(scale_tables().e8m0[b[0]]), _mm512_permutexvar_ps(idx, kv));
  }
};

// Q8_0: blocks of 32 (fp16 d, 32 int8); value q * d.
struct Q8_0 : GgmlRows {
  using GgmlRows::GgmlRows;
  SS_AVX512 __m512 chunk(const uint8_t* row, int64_t c) const {
    const uint8_t* b = row + (c >> 1) * 34;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * (c & 1)));
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
    return _mm512_mul_ps(v, _mm512_set1_ps(half(b)));
  }
  // The gemv's form: the block's d once, then its two chunks.
  static constexpr int kChunksPerBlock = 2;
  struct Block {
    const uint8_t* q;
    __m512 d;
  };
  SS_AVX512 Block block(const uint8_t* row, int64_t b) const {
    const uint8_t* p = row + b * 34;
    return {p + 2, _mm512_set1_ps(half(p))};
  }
  SS_AVX512 __m512 chunk_in(const Block& k, int cc) const {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.q + 16 * cc));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), k.d);
  }
};

// Q4_0: blocks of 32 (fp16 d, 16 code bytes: low nibbles then high); value d * (q - 8).
struct Q4_0 : GgmlRows {
  using GgmlRows::GgmlRows;
  SS_AVX512 __m512 chunk(const uint8_t* row, int64_t c) const {
    const uint8_t* b = row + (c >> 1) * 18;
    const __m512i n = _mm512_cvtepu8_epi32(chunk_nibbles(b + 2, c));
    const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(n, _mm512_set1_epi32(8)));
    return _mm512_mul_ps(_mm512_set1_ps(half(b)), v);
  }
};

// Q4_1: blocks of 32 (fp16 d, fp16 m, 16 code bytes); value d * q + m.
struct Q4_1 : GgmlRows {
  using GgmlRows::GgmlRows;
  SS_AVX512 __m512 chunk(const uint8_t* row, int64_t c) const {
    const uint8_t* b = row + (c >> 1) * 20;
    const __m512 v = u8_to_ps(chunk_nibbles(b + 4, c));
    const __m512 d = _mm512_set1_ps(half(b));
    const __m512 m = _mm512_set1_ps(half(b + 2));
    return _mm512_add_ps(_mm512_mul_ps(d, v), m);
  }
};

// The k-quants (super-blocks of 256 values, 16 chunks): Derived decodes a super-block's scales
// once into its Block (the gemv's form), then reads its chunks from it (Derived::chunk_in).
template <class Derived>
struct SuperBlockRows : GgmlRows {
  using GgmlRows::GgmlRows;
  static constexpr int kChunksPerBlock = 16;
  SS_AVX512 __m512 chunk(const uint8_t* row, int64_t c) const {
    const Derived& d = static_cast<const Derived&>(*this);
    return d.chunk_in(d.block(row, c >> 4), static_cast<int>(c & 15));
  }
};

// Q4_K: super-blocks of 256 (fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 code
// bytes); sub-block j of 32 uses code bytes 32*(j/2).. (nibble j%2), value
// (d*sc) * q - (dmin*mn). The Block: the eight (d*sc, dmin*mn) pairs.
struct Q4_K : SuperBlockRows<Q4_K> {
  using SuperBlockRows::SuperBlockRows;
  struct Block {
    const uint8_t* qs;
    float dl[8], ml[8];
  };
  SS_AVX512 Block block(const uint8_t* row, int64_t sb) const {
    const uint8_t* b = row + sb * 144;
    const uint8_t* s = b + 4;
    const float d = half(b), dmin = half(b + 2);
    Block k;
    k.qs = b + 16;
    for (int j = 0; j < 8; ++j) {
      uint32_t sc, mn;
      if (j < 4) {
        sc = s[j] & 0x3Fu;
        mn = s[j + 4] & 0x3Fu;
      } else {
        sc = (s[j + 4] & 0x0Fu) | ((s[j - 4] >> 2) & 0x30u);
        mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30u);
      }
      k.dl[j] = d * static_cast<float>(sc);
      k.ml[j] = dmin * static_cast<float>(mn);
    }
    return k;
  }
  SS_AVX512 __m512 chunk_in(const Block& k, int cc) const {
    const int j = cc >> 1;
    const __m512 v = u8_to_ps(chunk_nibbles(k.qs + 32 * (j >> 1) + 16 * (cc & 1), j));
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(k.dl[j]), v), _mm512_set1_ps(k.ml[j]));
  }
};

// Q6_K: super-blocks of 256 (128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16
// d); element e = 128h + w: low nibble of ql[64h + w%64] (shift 4*(w/64)), high bits of
// qh[32h + w%32] (shift 2*(w/32)); value (d * scale[e/16]) * (q - 32). The Block: the 16
// d * scale.
struct Q6_K : SuperBlockRows<Q6_K> {
  using SuperBlockRows::SuperBlockRows;
  struct Block {
    const uint8_t* b;
    float dl[16];
  };
  SS_AVX512 Block block(const uint8_t* row, int64_t sb) const {
    Block k;
    k.b = row + sb * 210;
    const float d = half(k.b + 208);
    for (int i = 0; i < 16; ++i)
      k.dl[i] = d * static_cast<float>(static_cast<int8_t>(k.b[192 + i]));
    return k;
  }
  SS_AVX512 __m512 chunk_in(const Block& k, int cc) const {
    const int h = cc >> 3, w0 = 16 * (cc & 7);
    const __m128i ql = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.b + 64 * h + (w0 & 63)));
    const __m128i qh =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.b + 128 + 32 * h + (w0 & 31)));
    const __m128i lo = (w0 >> 6) ? hi_nibbles(ql) : lo_nibbles(ql);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(qh, 2 * (w0 >> 5)), _mm_set1_epi8(3));
    const __m128i q6 = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
    const __m512 v =
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(q6), _mm512_set1_epi32(32)));
    return _mm512_mul_ps(_mm512_set1_ps(k.dl[cc]), v);
  }
};

// A ggml decoder with the tensor's per-tensor scale applied (fl(v * scale)).
template <typename D>
struct Scaled : D {
  float scale;
  explicit Scaled(const Tensor& t) : D(t), scale(t.ggml_scale) {}
  SS_AVX512 __m512 chunk(typename D::Row row, int64_t c) const {
    return _mm512_mul_ps(D::chunk(row, c), _mm512_set1_ps(scale));
  }
  template <typename B>
  SS_AVX512 __m512 chunk_in(const B& k, int cc) const {
    return _mm512_mul_ps(D::chunk_in(k, cc), _mm512_set1_ps(scale));
  }
};

// Compressed-tensors NVFP4 (cols a multiple of 16): codes [rows, cols/2] (element 2i the low
// nibble), E4M3 scales [rows, cols/16]; value fl(fl(fp4 * s) / gs), from a table of the 16
// values of each of the 256 scale bytes for this tensor's gs (made once per thread and gs).
struct NvfpPacked {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t pc, bpr;
  const float* tab;
  explicit NvfpPacked(const Tensor& t)
      : codes(static_cast<const uint8_t*>(t.raw)),
        scales(t.nvfp4_scales),
        pc(packed_cols(t.cols())),
        bpr(t.cols() / 16),
        tab(table(t.nvfp4_global_scale)) {}
  static const float* table(float gs) {
    return fp4_table<NvfpPacked>(gs, [gs](int s, int k) {
      return (format::kFp4Values.v[k] * format::E4M3::decode_f(static_cast<uint32_t>(s))) / gs;
    });
  }
  struct Row {
    const uint8_t* codes;
    const uint8_t* scales;
  };
  Row row(int64_t r) const { return {codes + r * pc, scales + r * bpr}; }
  SS_AVX512 __m512 chunk(Row row, int64_t c) const {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.codes + 8 * c));
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(q, _mm_srli_epi16(q, 4)));
    return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(tab + 16 * row.scales[c]));
  }
  static constexpr const FourBitLanes* kLanes = &kPackedNvfpLanes;
  SS_AVX512 __m512 lanes(Row row, int64_t c, __m512i shifts) const {
    return _mm512_permutexvar_ps(fp4_lane_codes(row.codes + 8 * c, shifts),
                                 _mm512_loadu_ps(tab + 16 * row.scales[c]));
  }
};

// The pairwise tree of weight.h's gemv over the 16 partial sums: a[k] += a[k + w] for
// w = 8, 4, 2, 1.
SS_AVX512 inline float tree_sum(__m512 a) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

template <typename D>
constexpr bool kHasLanes = requires {
  D::kLanes;
};

// Decoded chunk c of a row in the kernel's lane order (column order unless D has kLanes).
template <typename D>
SS_AVX512 inline __m512 decode_for_gemv(const D& d, typename D::Row row, int64_t c,
                                        __m512i shifts) {
  if constexpr (kHasLanes<D>)
    return d.lanes(row, c, shifts);
  else
    return d.chunk(row, c);
}

// The row's dot product from its 16 partial sums in lane order.
template <typename D>
SS_AVX512 inline float lane_sum(__m512 a, __m512i back) {
  if constexpr (kHasLanes<D>) a = _mm512_permutexvar_ps(back, a);
  return tree_sum(a);
}

template <typename D>
constexpr bool kHasBlocks = requires {
  D::kChunksPerBlock;
};

// The gemv of decoders with a per-block form (K-quants): each row's block parameters are
// decoded once per block, then its chunks; the same products and sums in the same order.
template <typename D>
SS_AVX512 void gemv_blocked(const D& d, int64_t chunks, const float* x, int64_t o0, int64_t o1,
                            float* y) {
  constexpr int kC = D::kChunksPerBlock;
  const int64_t blocks = chunks / kC;
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) {
    const auto r0 = d.row(o), r1 = d.row(o + 1), r2 = d.row(o + 2), r3 = d.row(o + 3);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t sb = 0; sb < blocks; ++sb) {
      const auto k0 = d.block(r0, sb), k1 = d.block(r1, sb), k2 = d.block(r2, sb),
                 k3 = d.block(r3, sb);
      const float* xs = x + 16 * kC * sb;
      for (int cc = 0; cc < kC; ++cc) {
        const __m512 xv = _mm512_loadu_ps(xs + 16 * cc);
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(d.chunk_in(k0, cc), xv));
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(d.chunk_in(k1, cc), xv));
        a2 = _mm512_add_ps(a2, _mm512_mul_ps(d.chunk_in(k2, cc), xv));
        a3 = _mm512_add_ps(a3, _mm512_mul_ps(d.chunk_in(k3, cc), xv));
      }
    }
    y[o - o0] = tree_sum(a0);
    y[o + 1 - o0] = tree_sum(a1);
    y[o + 2 - o0] = tree_sum(a2);
    y[o + 3 - o0] = tree_sum(a3);
  }
  for (; o < o1; ++o) {
    const auto r = d.row(o);
    __m512 a = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < blocks; ++sb) {
      const auto k = d.block(r, sb);
      for (int cc = 0; cc < kC; ++cc)
        a = _mm512_add_ps(
            a, _mm512_mul_ps(d.chunk_in(k, cc), _mm512_loadu_ps(x + 16 * (kC * sb + cc))));
    }
    y[o - o0] = tree_sum(a);
  }
}

template <typename D>
SS_AVX512 void gemv(const D& d, int64_t chunks, const float* x, int64_t o0, int64_t o1, float* y) {
  if constexpr (kHasBlocks<D>) {
    gemv_blocked(d, chunks, x, o0, o1, y);
    return;
  }
  // x in the lane order of the decoder, and the permutation that restores column order.
  __m512i shifts = _mm512_setzero_si512(), back = _mm512_setzero_si512();
  thread_local std::vector<float> xl;
  if constexpr (kHasLanes<D>) {
    shifts = load_lanes(D::kLanes->shift);
    back = load_lanes(D::kLanes->column_lane);
    const __m512i to = load_lanes(D::kLanes->lane_column);
    xl.resize(static_cast<size_t>(chunks * 16));
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_storeu_ps(xl.data() + 16 * c, _mm512_permutexvar_ps(to, _mm512_loadu_ps(x + 16 * c)));
    x = xl.data();
  }
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) {  // four rows at a time share the loads of x
    const auto r0 = d.row(o), r1 = d.row(o + 1), r2 = d.row(o + 2), r3 = d.row(o + 3);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512 xv = _mm512_loadu_ps(x + 16 * c);
      a0 = _mm512_add_ps(a0, _mm512_mul_ps(decode_for_gemv(d, r0, c, shifts), xv));
      a1 = _mm512_add_ps(a1, _mm512_mul_ps(decode_for_gemv(d, r1, c, shifts), xv));
      a2 = _mm512_add_ps(a2, _mm512_mul_ps(decode_for_gemv(d, r2, c, shifts), xv));
      a3 = _mm512_add_ps(a3, _mm512_mul_ps(decode_for_gemv(d, r3, c, shifts), xv));
    }
    y[o - o0] = lane_sum<D>(a0, back);
    y[o + 1 - o0] = lane_sum<D>(a1, back);
    y[o + 2 - o0] = lane_sum<D>(a2, back);
    y[o + 3 - o0] = lane_sum<D>(a3, back);
  }
  for (; o < o1; ++o) {
    const auto r = d.row(o);
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c)
      a = _mm512_add_ps(
          a, _mm512_mul_ps(decode_for_gemv(d, r, c, shifts), _mm512_loadu_ps(x + 16 * c)));
    y[o - o0] = lane_sum<D>(a, back);
  }
}

template <typename D>
SS_AVX512 void dequantize(const D& d, int64_t chunks, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto row = d.row(r);
    float* o = out + (r - r0) * chunks * 16;
    if constexpr (kHasBlocks<D>) {  // each block's parameters decoded once
      constexpr int kC = D::kChunksPerBlock;
      for (int64_t b = 0; b < chunks / kC; ++b) {
        const auto k = d.block(row, b);
        for (int cc = 0; cc < kC; ++cc) _mm512_storeu_ps(o + 16 * (kC * b + cc), d.chunk_in(k, cc));
      }
    } else {
      for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(o + 16 * c, d.chunk(row, c));
    }
  }
}

// Runs op(decoder) with the decoder of t's type (scaled when t has a per-tensor scale).
template <typename Op>
void with_decoder(const Tensor& t, Op op) {
  if (t.dtype == WeightDType::kNvfp4) return op(NvfpPacked(t));
  const bool scaled = t.ggml_scale != 1.0f;
  const auto pick = [&](auto tag) {
    using D = decltype(tag);
    if (scaled)
      op(Scaled<D>(t));
    else
      op(D(t));
  };
  switch (static_cast<GgmlType>(t.ggml_type)) {
    case GgmlType::kNVFP4:
      return op(NvfpGgml(t));  // the table holds the per-tensor scale
    case GgmlType::kMXFP4:
      return pick(MxfpGgml(t));
    case GgmlType::kQ8_0:
      return pick(Q8_0(t));
    case GgmlType::kQ4_0:
      return pick(Q4_0(t));
    case GgmlType::kQ4_1:
      return pick(Q4_1(t));
    case GgmlType::kQ4_K:
      return pick(Q4_K(t));
    case GgmlType::kQ6_K:
      return pick(Q6_K(t));
    default:
      return;
  }
}

}  // namespace

int64_t ggml_stored_row(const Tensor& t, int64_t r) {
  const int64_t hd = t.ggml_permute_head_dim;
  if (hd == 0) return r;
  const int64_t h = r / hd, j = r % hd, half = hd / 2;
  return h * hd + 2 * (j % half) + j / half;
}

int64_t ggml_row_bytes(const Tensor& t) {
  const auto tr = format::ggml_type_traits(t.ggml_type);
  return tr ? t.cols() / tr->block_elems * tr->block_bytes : 0;
}

bool quant_kernel_available(const Tensor& t) {
  if (!cpu_has_avx512()) return false;
  if (t.dtype == WeightDType::kNvfp4) return t.cols() % 16 == 0;
  if (t.dtype != WeightDType::kGgml) return false;
  switch (static_cast<GgmlType>(t.ggml_type)) {
    case GgmlType::kNVFP4:
    case GgmlType::kMXFP4:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void quant_dequantize_rows(const Tensor& t, int64_t r0, int64_t r1, float* out) {
  with_decoder(t, [&](const auto& d) { dequantize(d, t.cols() / 16, r0, r1, out); });
}

void quant_gemv_rows(const Tensor& t, const float* x, int64_t o0, int64_t o1, float* y) {
  with_decoder(t, [&](const auto& d) { gemv(d, t.cols() / 16, x, o0, o1, y); });
}

}  // namespace scalesweep::model::detail

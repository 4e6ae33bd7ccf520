// The ggml tensor types of llama.cpp's GGUF files (see the header).
#include "scalesweep/format/ggml.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "scalesweep/format/minifloat.h"

namespace scalesweep::format {

namespace {

struct TypeEntry {
  uint32_t id;
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
  bool dequantizable;
};
constexpr int64_t kQK_K = 256;
// Every GGMLQuantizationType of gguf-py 0.19.0 with its GGML_QUANT_SIZES entry.
constexpr TypeEntry kTypes[] = {
    {0, "F32", 1, 4, true},
    {1, "F16", 1, 2, true},
    {2, "Q4_0", 32, 2 + 16, true},
    {3, "Q4_1", 32, 2 + 2 + 16, true},
    {6, "Q5_0", 32, 2 + 4 + 16, true},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {8, "Q8_0", 32, 2 + 32, true},
    {9, "Q8_1", 32, 4 + 4 + 32, false},
    {10, "Q2_K", 256, 2 + 2 + kQK_K / 16 + kQK_K / 4, false},
    {11, "Q3_K", 256, 2 + kQK_K / 4 + kQK_K / 8 + 12, false},
    {12, "Q4_K", 256, 2 + 2 + kQK_K / 2 + 12, true},
    {13, "Q5_K", 256, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12, true},
    {14, "Q6_K", 256, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16, true},
    {15, "Q8_K", 256, 4 + kQK_K + kQK_K / 8, false},
    {16, "IQ2_XXS", 256, 2 + kQK_K / 4, false},
    {17, "IQ2_XS", 256, 2 + kQK_K / 4 + kQK_K / 32, false},
    {18, "IQ3_XXS", 256, 2 + kQK_K / 4 + kQK_K / 8, false},
    {19, "IQ1_S", 256, 2 + kQK_K / 8 + kQK_K / 16, false},
    {20, "IQ4_NL", 32, 2 + 16, false},
    {21, "IQ3_S", 256, 2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4, false},
    {22, "IQ2_S", 256, 2 + kQK_K / 4 + kQK_K / 16, false},
    {23, "IQ4_XS", 256, 2 + 2 + kQK_K / 2 + kQK_K / 64, false},
    {24, "I8", 1, 1, false},
    {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},
    {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},
    {29, "IQ1_M", 256, kQK_K / 8 + kQK_K / 16 + kQK_K / 32, false},
    {30, "BF16", 1, 2, true},
    {34, "TQ1_0", 256, 2 + 4 * 13, false},
    {35, "TQ2_0", 256, 2 + 64, false},
    {39, "MXFP4", 32, 1 + 16, true},
    {40, "NVFP4", 64, 4 + 32, true},
    {41, "Q1_0", 128, 2 + 16, false},
};

const TypeEntry* type_entry(uint32_t id) {
  for (const auto& e : kTypes) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

// --------------------------------------------------------------------- dequantizers (scalar)
// Each follows the float arithmetic of gguf-py 0.19.0's numpy dequantize_blocks: every operation
// is one IEEE float32 operation in the same order (the build has -ffp-contract=off, so a*b+c is
// not fused).

inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float f32_from_bits(uint32_t u) { return format::detail::f32_from_bits(u); }

// IEEE half to float by bits, as numpy's astype(float32) does (NaN payload and sign kept).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return f32_from_bits(sign);
  // Subnormal: man * 2^-24, exact in float (format::F16 decodes the same value).
  const float mag = static_cast<float>(format::F16::decode(man));
  return sign ? -mag : mag;
}

// E2M1 values doubled (gguf-py's int8 kvalues for MXFP4/NVFP4), from the format layer's codec;
// code 8 (E2M1's -0) is +0 there, as the int8 table has no negative zero.
struct KValues {
  float v[16];
  constexpr KValues() : v() {
    for (uint32_t i = 0; i < 16; ++i) {
      const float x = 2.0f * format::E2M1::decode_f(i);
      v[i] = x == 0.0f ? 0.0f : x;
    }
  }
};
constexpr KValues kKValues{};

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = half_to_float(rd16(b));
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(static_cast<int>(qs[i] & 0x0F) - 8);
    y[i + 16] = d * static_cast<float>(static_cast<int>(qs[i] >> 4) - 8);
  }
}

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = half_to_float(rd16(b));
  const float m = half_to_float(rd16(b + 2));
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(qs[i] & 0x0F) + m;
    y[i + 16] = d * static_cast<float>(qs[i] >> 4) + m;
  }
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = half_to_float(rd16(b));
  const uint32_t qh = rd32(b + 2);
  const uint8_t* qs = b + 6;
  for (int i = 0; i < 32; ++i) {
    const uint32_t lo = i < 16 ? (qs[i] & 0x0Fu) : (qs[i - 16] >> 4);
    const uint32_t q = lo | (((qh >> i) & 1u) << 4);
    y[i] = d * static_cast<float>(static_cast<int>(q) - 16);
  }
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = half_to_float(rd16(b));
  const float m = half_to_float(rd16(b + 2));
  const uint32_t qh = rd32(b + 4);
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 32; ++i) {
    const uint32_t lo = i < 16 ? (qs[i] & 0x0Fu) : (qs[i - 16] >> 4);
    const uint32_t q = lo | (((qh >> i) & 1u) << 4);
    y[i] = d * static_cast<float>(q) + m;
  }
}

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = half_to_float(rd16(b));
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

// The 6-bit scales and mins of Q4_K/Q5_K (gguf-py Q4_K.get_scale_min).
void k_scale_min(const uint8_t* s, int j, uint32_t* sc, uint32_t* mn) {
  if (j < 4) {
    *sc = s[j] & 0x3Fu;
    *mn = s[j + 4] & 0x3Fu;
  } else {
    *sc = (s[j + 4] & 0x0Fu) | ((s[j - 4] >> 2) & 0x30u);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30u);
  }
}

// Q4_K and Q5_K: eight sub-blocks of 32 values with 6-bit scales and mins; value l of sub-block
// j is the nibble j%2 of byte 32*(j/2)+l, and Q5_K adds a fifth bit, bit j of qh[l].
template <bool kFifthBit>
void deq_q45_k(const uint8_t* b, float* y) {
  const float d = half_to_float(rd16(b));
  const float dmin = half_to_float(rd16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;  // Q5_K only
  const uint8_t* qs = b + (kFifthBit ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    uint32_t sc, mn;
    k_scale_min(scales, j, &sc, &mn);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      uint32_t v = (q[l] >> shift) & 0x0Fu;
      if constexpr (kFifthBit) v |= ((qh[l] >> j) & 1u) << 4;
      y[32 * j + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(rd16(b + 208));
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, w = e % 128;
    const uint32_t lo = (ql[64 * h + w % 64] >> (4 * (w / 64))) & 0x0Fu;
    const uint32_t hi = (qh[32 * h + w % 32] >> (2 * (w / 32))) & 0x03u;
    const int q = static_cast<int>(lo | (hi << 4)) - 32;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>(q);
  }
}

// ggml_e8m0_to_fp32_half: 2^(e-128) (half the UE8M0 scale, the kvalues being doubled).
float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return f32_from_bits(bits);
}

void deq_mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_half(b[0]);
  const uint8_t* qs = b + 1;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * kKValues.v[qs[i] & 0x0F];
    y[i + 16] = d * kKValues.v[qs[i] >> 4];
  }
}

// gguf-py NVFP4.ue4m3_to_fp32: bits 3..6 the exponent (bias 7), bits 0..2 the mantissa, the top
// bit ignored, 0x7F read as 0 (so 0xFF is 480), then halved (the kvalues being doubled). For
// the patterns that are finite E4M3 magnitudes this is the format layer's E4M3 decode.
float ue4m3_half(uint8_t x) {
  if (x == 0x7F) return 0.0f;
  const uint32_t mag = x & 0x7Fu;
  const float raw = mag == 0x7F ? 480.0f : format::E4M3::decode_f(mag);
  return raw * 0.5f;
}

void deq_nvfp4(const uint8_t* b, float* y) {
  for (int j = 0; j < 4; ++j) {  // four sub-blocks of 16: scale byte j, code bytes 4+8j..
    const float d = ue4m3_half(b[j]);
    const uint8_t* qs = b + 4 + 8 * j;
    for (int i = 0; i < 8; ++i) {
      y[16 * j + i] = d * kKValues.v[qs[i] & 0x0F];
      y[16 * j + 8 + i] = d * kKValues.v[qs[i] >> 4];
    }
  }
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  if (const TypeEntry* e = type_entry(type)) return e->name;
  return "type " + std::to_string(type);
}

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  const TypeEntry* e = type_entry(type);
  if (!e) return std::nullopt;
  return GgmlTypeTraits{e->block_elems, e->block_bytes, e->dequantizable};
}

void ggml_dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const TypeEntry* e = type_entry(type);
  if (!e) throw std::invalid_argument("cannot dequantize unknown ggml " + ggml_type_name(type));
  if (!e->dequantizable) {
    throw std::invalid_argument(
        std::string("cannot dequantize ggml type ") + e->name +
        " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, "
        "MXFP4, NVFP4)");
  }
  if (n < 0 || n % e->block_elems != 0) {
    throw std::invalid_argument(std::string("cannot dequantize ") + std::to_string(n) +
                                " elements of " + e->name + ": not a whole number of " +
                                std::to_string(e->block_elems) + "-element blocks");
  }
  const int64_t nb = n / e->block_elems;
  const auto bs = e->block_bytes;
  const auto be = e->block_elems;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(rd16(src + 2 * i));
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = f32_from_bits(static_cast<uint32_t>(rd16(src + 2 * i)) << 16);
      }
      return;
    default:
      break;
  }
  // The block dequantizers, one per block type.
  using BlockFn = void (*)(const uint8_t*, float*);
  static constexpr std::pair<GgmlType, BlockFn> kBlockFns[] = {
      {GgmlType::kQ4_0, deq_q4_0},        {GgmlType::kQ4_1, deq_q4_1},
      {GgmlType::kQ5_0, deq_q5_0},        {GgmlType::kQ5_1, deq_q5_1},
      {GgmlType::kQ8_0, deq_q8_0},        {GgmlType::kQ4_K, deq_q45_k<false>},
      {GgmlType::kQ5_K, deq_q45_k<true>}, {GgmlType::kQ6_K, deq_q6_k},
      {GgmlType::kMXFP4, deq_mxfp4},      {GgmlType::kNVFP4, deq_nvfp4}};
  BlockFn fn = nullptr;
  for (const auto& [t, f] : kBlockFns)
    if (static_cast<uint32_t>(t) == type) fn = f;
  if (!fn) throw std::invalid_argument("internal: no dequantizer for " + ggml_type_name(type));
  for (int64_t i = 0; i < nb; ++i) fn(src + i * bs, dst + i * be);
}

float ggml_half_to_float(uint16_t h) { return half_to_float(h); }
float ggml_ue4m3_half(uint8_t x) { return ue4m3_half(x); }
float ggml_e8m0_half(uint8_t e) { return e8m0_half(e); }
const float* ggml_kvalues() { return kKValues.v; }

}  // namespace scalesweep::format

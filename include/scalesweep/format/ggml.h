// llama.cpp's ggml tensor types (the element types of GGUF files): their on-disk ids, names and
// block sizes (gguf-py 0.19.0's GGMLQuantizationType and GGML_QUANT_SIZES), and scalar fp32
// dequantizers of the block types that match gguf-py's numpy dequantizers (gguf/quants.py) bit
// for bit. The reader (io/gguf.h) and the runtime's fused kernels (model/weight.h) share them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace scalesweep::format {

// ggml tensor types by their on-disk id (gguf 0.19.0 GGMLQuantizationType values).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

// "Q4_K", or "type 77" for unknown ids.
std::string ggml_type_name(uint32_t type);
struct GgmlTypeTraits {
  int64_t block_elems;  // elements per block (1 for F32/F16/BF16/I*)
  int64_t block_bytes;  // bytes per block
  bool dequantizable;   // ggml_dequantize handles it
};
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type);  // nullopt: unknown id

// Dequantizes n elements (n a multiple of the type's block) of raw ggml data; matches gguf-py's
// numpy dequantizers bit for bit. Throws std::invalid_argument naming the type for a type it
// cannot dequantize or an n that is not a whole number of blocks.
void ggml_dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst);

// IEEE half to float by bits, as numpy's astype(float32) does (the ggml blocks' fp16 scales).
float ggml_half_to_float(uint16_t h);
// The pieces of the FP4 block types, for kernels that decode them their own way: the NVFP4
// block scale halved (gguf-py's ue4m3_to_fp32 / 2), the MXFP4 one (2^(e-128)), and the 16
// E2M1 values doubled (gguf-py's kvalues; code 8 is +0). A block's value is scale * kvalue.
float ggml_ue4m3_half(uint8_t x);
float ggml_e8m0_half(uint8_t e);
const float* ggml_kvalues();

}  // namespace scalesweep::format

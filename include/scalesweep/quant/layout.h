// Packing and the vLLM / FlashInfer swizzled block-scale layout (SPEC "Ecosystem layouts").
// Layer `quant`.
#pragma once

#include <cstdint>
#include <vector>

#include "scalesweep/quant/layout_index.h"

namespace scalesweep {

// ---- FP4 nibble packing: element 2i in the low nibble, 2i+1 in the high nibble; an odd last
// column is padded with code 0. Packed rows are packed_cols(cols) = ceil(cols / 2) bytes
// (quant/layout_index.h).
// codes: [rows, cols] one 4-bit code per byte (values 0..15; higher bits must be 0).
std::vector<uint8_t> pack_fp4(const uint8_t* codes, int64_t rows, int64_t cols);
// Inverse of pack_fp4: [rows, cols] codes, one per byte.
std::vector<uint8_t> unpack_fp4(const uint8_t* packed, int64_t rows, int64_t cols);
// Code of element (r, c) of a packed [rows, cols] tensor.
inline uint8_t packed_code(const uint8_t* packed, int64_t cols, int64_t r, int64_t c) {
  const uint8_t b = packed[r * packed_cols(cols) + c / 2];
  return static_cast<uint8_t>((c & 1) ? (b >> 4) : (b & 15));
}

// ---- vLLM kernel scale layout ("128x4" swizzle). For a scale matrix [rows, nblocks] (one
// byte per block) the buffer is [roundup(rows, 128), roundup(nblocks, 4)] bytes (vLLM views it
// as int32 [roundup(rows,128), roundup(nblocks,4)/4]); the scale of row m, block k sits at
//   ((m >> 7) * nKT + (k >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (k & 3),
// nKT = ceil(nblocks / 4) (= ceil(K / 64) for block 16). Padding bytes are 0.
struct SwizzledShape {
  int64_t rows = 0, nblocks = 0;
  int64_t padded_rows() const { return (rows + 127) / 128 * 128; }
  int64_t padded_blocks() const { return (nblocks + 3) / 4 * 4; }
  int64_t bytes() const { return padded_rows() * padded_blocks(); }
};
// swizzled_offset(m, k, nblocks): quant/layout_index.h (shared with the CUDA operator).
// Row-major scales [rows, nblocks] -> swizzled buffer of SwizzledShape{rows, nblocks}.bytes().
std::vector<uint8_t> swizzle_scales(const uint8_t* scales, int64_t rows, int64_t nblocks);
// Inverse: swizzled buffer (exactly bytes() long, else std::invalid_argument) -> row-major.
std::vector<uint8_t> unswizzle_scales(const uint8_t* swizzled, int64_t size, int64_t rows,
                                      int64_t nblocks);

}  // namespace scalesweep

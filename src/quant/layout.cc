#include "scalesweep/quant/layout.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace scalesweep {

std::vector<uint8_t> pack_fp4(const uint8_t* codes, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("pack_fp4: negative shape");
  const int64_t pc = packed_cols(cols);
  std::vector<uint8_t> out(static_cast<size_t>(rows * pc), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t v = codes[r * cols + c];
      if (v > 15)
        throw std::invalid_argument("pack_fp4: code " + std::to_string(v) + " at [" +
                                    std::to_string(r) + ", " + std::to_string(c) +
                                    "] is not a 4-bit code");
      out[r * pc + c / 2] |= static_cast<uint8_t>((c & 1) ? (v << 4) : v);
    }
  }
  return out;
}

std::vector<uint8_t> unpack_fp4(const uint8_t* packed, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("unpack_fp4: negative shape");
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = packed_code(packed, cols, r, c);
  return out;
}

namespace {

// SwizzledShape{rows, nblocks}.bytes(), refusing shapes whose padded size overflows int64.
int64_t checked_swizzled_bytes(const char* fn, int64_t rows, int64_t nblocks) {
  if (rows < 0 || nblocks < 0) throw std::invalid_argument(std::string(fn) + ": negative shape");
  int64_t bytes = 0;
  if (rows > INT64_MAX - 127 || nblocks > INT64_MAX - 3 ||
      __builtin_mul_overflow(SwizzledShape{rows, nblocks}.padded_rows(),
                             SwizzledShape{rows, nblocks}.padded_blocks(), &bytes))
    throw std::invalid_argument(std::string(fn) + ": [" + std::to_string(rows) + ", " +
                                std::to_string(nblocks) + "] scales are too large to address");
  return bytes;
}

}  // namespace

std::vector<uint8_t> swizzle_scales(const uint8_t* scales, int64_t rows, int64_t nblocks) {
  const int64_t bytes = checked_swizzled_bytes("swizzle_scales", rows, nblocks);
  std::vector<uint8_t> out(static_cast<size_t>(bytes), 0);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < nblocks; ++k)
      out[static_cast<size_t>(swizzled_offset(m, k, nblocks))] = scales[m * nblocks + k];
  return out;
}

std::vector<uint8_t> unswizzle_scales(const uint8_t* swizzled, int64_t size, int64_t rows,
                                      int64_t nblocks) {
  const int64_t bytes = checked_swizzled_bytes("unswizzle_scales", rows, nblocks);
  const SwizzledShape sh{rows, nblocks};
  if (size != bytes)
    throw std::invalid_argument("unswizzle_scales: buffer has " + std::to_string(size) +
                                " bytes, expected " + std::to_string(sh.bytes()) + " for [" +
                                std::to_string(rows) + ", " + std::to_string(nblocks) +
                                "] scales (padded to [" + std::to_string(sh.padded_rows()) + ", " +
                                std::to_string(sh.padded_blocks()) + "])");
  std::vector<uint8_t> out(static_cast<size_t>(rows * nblocks));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < nblocks; ++k)
      out[m * nblocks + k] = swizzled[swizzled_offset(m, k, nblocks)];
  return out;
}

}  // namespace scalesweep

// Index math of the CUDA operator's outputs, host+device (SS_HD), no CUDA headers needed.
// Same layouts as the CPU path (SPEC "Ecosystem layouts", include/scalesweep/quant/layout.h):
//   codes  [rows, ceil(cols/2)] bytes, element 2i low nibble, 2i+1 high nibble, odd tail 0;
//   scales [rows, ceil(cols/16)] E4M3 bit patterns, row-major;
//   swizzled scales, vLLM 128x4: [roundup(rows,128), roundup(nb,4)] bytes, scale (m, k) at
//     ((m >> 7) * nKT + (k >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (k & 3),
//     nKT = ceil(nb / 4); padding bytes are 0.
#pragma once

#include <cstdint>

#include "scalesweep/format/minifloat.h"    // SS_HD
#include "scalesweep/quant/layout_index.h"  // packed_cols, swizzled_offset (one formula)

namespace scalesweep::cuda {

inline constexpr int kBlock = 16;  // NVFP4 block size of the CUDA operator

SS_HD constexpr int64_t blocks_per_row(int64_t cols) { return (cols + kBlock - 1) / kBlock; }
SS_HD constexpr int64_t swizzled_rows(int64_t rows) { return (rows + 127) / 128 * 128; }
SS_HD constexpr int64_t swizzled_blocks(int64_t nb) { return (nb + 3) / 4 * 4; }
SS_HD constexpr int64_t swizzled_bytes(int64_t rows, int64_t cols) {
  return swizzled_rows(rows) * swizzled_blocks(blocks_per_row(cols));
}
// True when the swizzled buffer has padding bytes (which the operator sets to 0).
SS_HD constexpr bool swizzled_has_padding(int64_t rows, int64_t cols) {
  return rows % 128 != 0 || blocks_per_row(cols) % 4 != 0;
}
// packed_cols(cols) and swizzled_offset(m, k, nb): scalesweep:: (quant/layout_index.h).
using scalesweep::packed_cols;
using scalesweep::swizzled_offset;

}  // namespace scalesweep::cuda

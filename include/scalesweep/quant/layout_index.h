// The index math of the packed layouts, host+device (SS_HD), no CUDA or standard-library
// headers: included by the CPU layouts (quant/layout.h, QuantizedTensor) and the CUDA
// operator (cuda/layout.h), so both use one formula. Layer `quant`.
#pragma once

#include <cstdint>

#include "scalesweep/format/minifloat.h"  // SS_HD

namespace scalesweep {

// Bytes per packed FP4 row: element 2i in the low nibble, 2i+1 in the high one, odd tail 0.
SS_HD constexpr int64_t packed_cols(int64_t cols) { return (cols + 1) / 2; }

// vLLM / FlashInfer "128x4" scale swizzle: byte offset of the scale of row m, block k in the
// buffer of a [rows, nblocks] scale matrix, nKT = ceil(nblocks / 4).
SS_HD constexpr int64_t swizzled_offset(int64_t m, int64_t k, int64_t nblocks) {
  const int64_t nkt = (nblocks + 3) / 4;
  return ((m >> 7) * nkt + (k >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (k & 3);
}

}  // namespace scalesweep

// Internal hook between the tensor quantizer (src/quant/quantize.cc, scalar reference) and
// the fast CPU kernels (src/quant/simd/). The job struct is defined by quantize.cc's owner in
// src/quant/row_job.h; the fast path returns false when it does not handle a job, and the
// reference then runs. Output must be bit-identical either way (docs/NUMERICS.md).
#pragma once

#include <cstdint>

namespace scalesweep::detail {
struct RowJob;
bool quantize_rows_fast(const RowJob& job, int64_t r0, int64_t r1);
}  // namespace scalesweep::detail

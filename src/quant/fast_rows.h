// Internal hook between the tensor quantizer (src/quant/quantize.cc, scalar reference) and
// the fast CPU kernels (src/quant/simd/). The job struct is defined by quantize.cc's owner in
// src/quant/row_job.h; the fast path returns false when it does not handle a job, and the
// reference then runs. Output must be bit-identical either way (docs/NUMERICS.md).
#pragma once

#include <cstdint>

#include "scalesweep/quant/quantize.h"

namespace scalesweep::detail {
struct RowJob;
bool quantize_rows_fast(const RowJob& job, int64_t r0, int64_t r1);
// As quantize_rows_fast, also checking every y = fl(x * gs): *bad is set (rows left incomplete)
// when some |y| > 2^48 or is NaN, i.e. exactly when the input scan + global-scale check of
// quantize() would throw. Used with a given global scale instead of the separate input scan.
bool quantize_rows_fast_checked(const RowJob& job, int64_t r0, int64_t r1, bool* bad);
// Finite check and amax of x[0..n) (SIMD, `threads` threads); false when some element is NaN
// or Inf (the caller then finds and reports the first bad index itself).
bool scan_input_fast(const void* x, DType dtype, int64_t n, int threads, float* amax);
}  // namespace scalesweep::detail

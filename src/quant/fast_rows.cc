// The fast CPU path of quantize(): Highway kernels with runtime dispatch (src/quant/simd/).
// quantize() already splits the rows over threads; each call handles one contiguous range.
#include "quant/fast_rows.h"

#include "quant/row_job.h"
#include "quant/simd/kernels.h"

namespace scalesweep::detail {
bool quantize_rows_fast(const RowJob& job, int64_t r0, int64_t r1) {
  return simd::quantize_rows(job, r0, r1);
}
bool quantize_rows_fast_checked(const RowJob& job, int64_t r0, int64_t r1, bool* bad) {
  return simd::quantize_rows_checked(job, r0, r1, bad);
}
}  // namespace scalesweep::detail

namespace scalesweep::detail {
bool scan_input_fast(const void* x, DType dtype, int64_t n, int threads, float* amax) {
  return simd::scan_finite_amax(x, dtype, n, threads, amax);
}
}  // namespace scalesweep::detail

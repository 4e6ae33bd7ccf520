#include "quant/fast_rows.h"

namespace scalesweep::detail {
// Owned by the fast-kernel work (src/quant/simd/): dispatches to the Highway kernels.
bool quantize_rows_fast(const RowJob&, int64_t, int64_t) { return false; }
}  // namespace scalesweep::detail

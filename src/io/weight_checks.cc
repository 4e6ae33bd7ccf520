// Loader checks (src/io/weight_checks.h).
#include "io/weight_checks.h"

#include <cmath>
#include <stdexcept>

#include "scalesweep/format/minifloat.h"

namespace scalesweep::io {

namespace {

[[noreturn]] void non_finite(const std::string& file, const std::string& tensor, float v,
                             int64_t i) {
  throw std::runtime_error(file + ": tensor '" + tensor + "' has a non-finite value (" +
                           std::to_string(v) + ") at flat index " + std::to_string(i));
}

}  // namespace

void check_finite_f32(const float* x, int64_t n, const std::string& file, const std::string& tensor,
                      int64_t first_index) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) non_finite(file, tensor, x[i], first_index + i);
}

void check_finite_16bit(const uint16_t* h, int64_t n, bool bf16, const std::string& file,
                        const std::string& tensor) {
  const uint16_t exp_mask = bf16 ? 0x7F80 : 0x7C00;
  for (int64_t i = 0; i < n; ++i)
    if ((h[i] & exp_mask) == exp_mask)
      non_finite(file, tensor, bf16 ? format::bf16_to_f32(h[i]) : format::f16_to_f32(h[i]), i);
}

}  // namespace scalesweep::io

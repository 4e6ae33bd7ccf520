// "[a, b]": a 2-D index or shape for error messages. Layer `quant` (header-only), so every
// layer above (gptq, io, ...) names elements the same way.
#pragma once

#include <cstdint>
#include <string>

namespace scalesweep {

// Built with += (string concatenation trips GCC 12's -Wrestrict false positive).
inline std::string index_string(int64_t a, int64_t b) {
  std::string s(1, '[');
  s += std::to_string(a);
  s += ", ";
  s += std::to_string(b);
  s += ']';
  return s;
}

}  // namespace scalesweep

// An invalid value of one parameter of a configuration or a request (layer `base`). The library
// names the parameter by its field ("max_block_scale", "block", "window", "calib_seqlen"), and
// what() is the library's one message for it, without the field: the CLI prefixes the option
// the user typed ("--max-block-scale: C must satisfy 0 < C <= 448 (the largest FP8 E4M3
// value)", tools/options.h: option_of), the Python module passes the message as it is.
#pragma once

#include <stdexcept>
#include <string>

namespace scalesweep {

class OptionError : public std::invalid_argument {
 public:
  OptionError(std::string field, const std::string& message)
      : std::invalid_argument(message), field_(std::move(field)) {}
  // The parameter's field name (snake_case, as the request or config spells it).
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

// The one check of a thread count (base/parallel.h: 0 = all cores): OptionError for "threads".
inline void check_threads(int threads) {
  if (threads < 0) throw OptionError("threads", "must be >= 0 (0 = all cores)");
}

}  // namespace scalesweep

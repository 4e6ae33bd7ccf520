// An invalid value of one parameter of a configuration or a request (layer `base`). The library
// names the parameter by its field ("max_block_scale", "block", "window", "calib_seqlen"), and
// what() is the library's one message for it, without the field: the CLI prefixes the option
// the user typed ("--max-block-scale: C must satisfy 0 < C <= 448 (the largest FP8 E4M3
// value)", tools/options.h: option_of), the Python module passes the message as it is.
//
// A message that tells the user to give another parameter names it by its field too, through
// option_ref ("pass " + option_ref("calib") + " TEXT"), never by a command-line spelling: each
// front end renders the references (render_option_refs) as its user types them (the CLI: the
// current command's option, "--calib-nsamples" or its alias "--nsamples" as typed; Python: the
// keyword).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

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

// A reference to parameter `field` inside a message, rendered by the front end.
// Marked by the ASCII record and unit separators (0x1E field 0x1F), which no message text
// (paths, templates, JSON) carries.
inline std::string option_ref(std::string_view field) {
  std::string r(1, '\x1e');
  r.append(field);
  r += '\x1f';
  return r;
}

// `message` with every option_ref replaced by name(field); text that is no reference stays.
std::string render_option_refs(std::string_view message,
                               const std::function<std::string(std::string_view)>& name);

}  // namespace scalesweep

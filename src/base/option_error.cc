#include "scalesweep/base/option_error.h"

#include <cctype>

namespace scalesweep {

std::string render_option_refs(std::string_view message,
                               const std::function<std::string(std::string_view)>& name) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const size_t open = message.find('\x1e', i);
    if (open == std::string_view::npos) break;
    const size_t close = message.find('\x1f', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view field = message.substr(open + 1, close - open - 1);
    bool is_field = !field.empty();
    for (const char c : field)
      is_field = is_field && (std::islower(static_cast<unsigned char>(c)) ||
                              std::isdigit(static_cast<unsigned char>(c)) || c == '_');
    out.append(message.substr(i, open - i));
    if (is_field) {
      out += name(field);
      i = close + 1;
    } else {  // no reference: the separator kept, scanning on after it
      out += '\x1e';
      i = open + 1;
    }
  }
  out.append(message.substr(i));
  return out;
}

}  // namespace scalesweep

#include "tools/calib_cli.h"

#include <cstdio>

namespace scalesweep::tools {

void print_note(const std::string& text) {
  std::fprintf(stderr, "note: %s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace scalesweep::tools

// Output-path checks shared by the subcommands that write one file next to the files they read.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace scalesweep::tools {

// Throws std::invalid_argument when `output` (given with option `opt`) is the same file as one
// of `inputs` (empty entries are skipped): writing it would replace the data being read.
inline void check_output_is_not_an_input(const std::string& output, const std::string& opt,
                                         const std::vector<std::string>& inputs) {
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (!in.empty() && std::filesystem::equivalent(output, in, ec) && !ec)
      throw std::invalid_argument(opt + " " + output + ": is the input file " + in +
                                  "; write the output elsewhere");
  }
}

}  // namespace scalesweep::tools

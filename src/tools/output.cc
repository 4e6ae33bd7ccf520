#include "tools/output.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "tools/paths.h"

namespace scalesweep::tools {

CLI::Option* add_force_flag(CLI::App& sub, bool& force) {
  return sub.add_flag("--force", force, "replace an existing output file");
}

void check_output_file(const std::string& path, const std::string& opt, bool force,
                       const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  if (path.empty()) throw std::invalid_argument(opt + ": empty output path");
  check_output_is_not_an_input(path, opt, inputs);
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (ec || !fs::exists(st)) return;  // nothing there (or not reachable: the write reports it)
  if (fs::is_directory(fs::status(path, ec)))
    throw std::invalid_argument(opt + " " + path + ": is a directory; give a file path");
  if (!force)
    throw std::invalid_argument(opt + " " + path + ": already exists; pass --force to replace it");
}

void check_output_dir(const std::string& path, const std::string& opt, bool force,
                      const std::vector<std::string>& inputs, const std::string& force_flag) {
  namespace fs = std::filesystem;
  if (path.empty()) throw std::invalid_argument(opt + ": empty output path");
  check_output_is_not_an_input(path, opt, inputs);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec)) || ec) return;
  const fs::path dir = fs::weakly_canonical(path, ec);
  if (!ec && fs::is_directory(dir, ec)) {
    for (const std::string& in : inputs) {
      if (in.empty()) continue;
      std::error_code e2;
      const fs::path p = fs::weakly_canonical(in, e2);
      if (e2) continue;
      const auto [d_end, p_it] = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
      if (d_end == dir.end())
        throw std::invalid_argument(opt + " " + path + ": contains the input " + in +
                                    "; replacing it would delete the input, write the output "
                                    "elsewhere");
    }
  }
  if (!force)
    throw std::invalid_argument(opt + " " + path + ": already exists; pass " + force_flag +
                                " to replace it");
}

}  // namespace scalesweep::tools

#include "tools/output.h"

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

}  // namespace scalesweep::tools

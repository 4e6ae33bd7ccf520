// Team policy for commands that write one output file (tensor -o, cast -o, calibrate -o,
// experiment --report-dir's files, ...): an existing file is never replaced unless the user
// passes --force; an output that is one of the command's inputs is refused even with --force.
// Directory outputs (convert, quantize) have their own --force/--overwrite with the same rule.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace scalesweep::tools {

// Adds the shared `--force` flag ("replace an existing output file").
CLI::Option* add_force_flag(CLI::App& sub, bool& force);

// Throws std::invalid_argument (naming `opt` and `path`) when `path`
//  - is the same file as one of `inputs` (empty entries skipped), even with `force`;
//  - is an existing directory;
//  - exists (file, link or anything else) and `force` is false:
//      "-o out.npy: already exists; pass --force to replace it".
// Call it before any long work so a refusal costs nothing; the command still writes through a
// temp file + rename, so a failed run leaves an existing file untouched.
void check_output_file(const std::string& path, const std::string& opt, bool force,
                       const std::vector<std::string>& inputs = {});

// The same rule for a command whose output is a directory it replaces as a whole (convert -o,
// quantize -o): throws when `path` is one of `inputs` or contains one of them (replacing it
// would delete the data being read), even with `force`; when it exists and `force` is false:
//   "-o DIR: already exists; pass --force to replace it" (`force_flag` names the flag).
void check_output_dir(const std::string& path, const std::string& opt, bool force,
                      const std::vector<std::string>& inputs = {},
                      const std::string& force_flag = "--force");

}  // namespace scalesweep::tools

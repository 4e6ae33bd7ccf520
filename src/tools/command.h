// Subcommand registry for the `scalesweep` CLI. Each src/tools/cmd_*.cc file registers its
// subcommand with a static SS_COMMAND(...) object; main.cc only dispatches. Tools do argument
// parsing plus library calls, nothing else.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace scalesweep::tools {

// setup adds the subcommand's options to `sub` and returns the function that runs it
// (returning the process exit code). Errors are reported by throwing std::exception; main
// prints "scalesweep <cmd>: error: <what>" and exits 1.
using CommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandInfo>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string help, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace scalesweep::tools

#define SS_CONCAT_INNER(a, b) a##b
#define SS_CONCAT(a, b) SS_CONCAT_INNER(a, b)
#define SS_COMMAND(name, help, setup) \
  static ::scalesweep::tools::CommandRegistrar SS_CONCAT(ss_command_, __LINE__)(name, help, setup)

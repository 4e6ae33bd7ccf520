// scalesweep: NVFP4 post-training quantization with ScaleSweep block scales.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <new>

#include "tools/command.h"
#include "tools/options.h"

namespace scalesweep::tools {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}
}  // namespace scalesweep::tools

int main(int argc, char** argv) {
  using namespace scalesweep::tools;
  CLI::App app{"scalesweep: accurate NVFP4 post-training quantization (ScaleSweep)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "scalesweep " SS_VERSION);
  // Every option of every subcommand shows its default in --help from the variable it binds:
  // help strings never type a default by hand (tools/options.h).
  show_defaults_in_help(app);
  set_command_args(argc, argv);
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runners) {
    if (!sub->parsed()) continue;
    set_current_command(sub);
    try {
      return run();
    } catch (const std::bad_alloc&) {
      std::fflush(stdout);
      std::fprintf(stderr, "scalesweep %s: error: out of memory; nothing was written\n",
                   sub->get_name().c_str());
      return 1;
    } catch (const scalesweep::OptionError& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "scalesweep %s: error: %s\n", sub->get_name().c_str(),
                   option_message(e).c_str());
      return 1;
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "scalesweep %s: error: %s\n", sub->get_name().c_str(),
                   cli_message(e.what()).c_str());
      return 1;
    }
  }
  return 1;
}

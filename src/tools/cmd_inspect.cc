// scalesweep inspect PATH: a compressed-tensors NVFP4 checkpoint directory read back (any
// producer's; pipeline::inspect_checkpoint), or a GGUF file listed (tools/inspect_gguf.h),
// dispatched on pipeline::inspect_kind.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/pipeline/inspect.h"
#include "tools/command.h"
#include "tools/inspect_gguf.h"
#include "tools/options.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

struct InspectArgs {
  std::string path, dump;
  std::vector<std::string> tensors;  // --tensor (GGUF files only)
  OutputOptions out;                 // --force (for --dump-dequant), --json
};

void render_checkpoint(const pipeline::CheckpointInspection& r, const InspectArgs& a) {
  if (a.out.json) {
    json lin = json::array();
    for (const auto& l : r.linears)
      lin.push_back({{"name", l.name},
                     {"rows", l.rows},
                     {"cols", l.cols},
                     {"weight_global_scale", l.weight_global_scale},
                     {"input_global_scale",
                      l.input_global_scale ? json(*l.input_global_scale) : json(nullptr)}});
    std::vector<std::string> dense;
    for (const auto& d : r.dense) dense.push_back(d.name);
    json j{{"dir", r.dir},   {"format", r.format}, {"w4a4", r.w4a4}, {"ignore", r.ignore},
           {"dense", dense}, {"files", r.files},   {"linears", lin}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  Table t({"linear", "shape", "weight global scale", "input global scale", "mean |w|"});
  for (const auto& l : r.linears)
    t.add_row({l.name, strf("%lldx%lld", (long long)l.rows, (long long)l.cols),
               strf("%.6g", l.weight_global_scale),
               l.input_global_scale ? strf("%.6g", *l.input_global_scale) : "-",
               strf("%.5g", l.mean_abs)});
  for (const auto& d : r.dense)
    t.add_row({d.name, strf("%lldx%lld", (long long)d.rows, (long long)d.cols), "dense " + d.dtype,
               "-", "-"});
  t.print();
  std::printf("%s: compressed-tensors %s, %s, %zu quantized linears, %zu dense, %zu file%s%s\n",
              r.dir.c_str(), r.format.c_str(), r.w4a4 ? "W4A4" : "W4A16", r.linears.size(),
              r.dense.size(), r.files.size(), r.files.size() == 1 ? "" : "s",
              a.dump.empty() ? "" : (", dequantized weights written to " + a.dump).c_str());
}

int run_inspect(const InspectArgs& a) {
  if (pipeline::inspect_kind(a.path) == pipeline::InspectKind::kGguf)
    return run_inspect_gguf({a.path, a.dump, a.tensors, a.out.json, a.out.force});
  if (!a.tensors.empty())
    throw std::invalid_argument("--tensor applies to a GGUF file; " + a.path + " is not one");
  // Never one of the checkpoint's own files, even with --force.
  if (!a.dump.empty())
    check_output_file(a.dump, "--dump-dequant", a.out.force, pipeline::checkpoint_files(a.path));
  render_checkpoint(pipeline::inspect_checkpoint(a.path, a.dump), a);
  return 0;
}

}  // namespace

SS_COMMAND("inspect",
           "Read a compressed-tensors NVFP4 checkpoint back (any producer), or list a GGUF file",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<InspectArgs>();
             sub.add_option("dir", a->path, "checkpoint directory, or a .gguf file")->required();
             sub.add_option("--dump-dequant", a->dump,
                            "write the dequantized fp32 weights (PREFIX.weight; for a GGUF "
                            "file every tensor under its GGUF name) to this .safetensors file");
             sub.add_option("--tensor", a->tensors,
                            "GGUF file: dump only this tensor (repeatable)");
             add_output_options(
                 sub, a->out,
                 force_and_json("replace an existing --dump-dequant file", "print JSON"));
             return [a] { return run_inspect(*a); };
           });

}  // namespace scalesweep::tools

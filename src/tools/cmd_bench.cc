// scalesweep bench: CPU quantization throughput of every packed method vs absmax and vs a
// plain copy (pipeline::run_kernel_bench measures; this file parses and renders).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/pipeline/bench.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

struct BenchArgs {
  pipeline::BenchRequest req;  // rows, cols, threads, repeat, block, reference
  std::string dtype = "bf16";  // echoed as given
  std::string global_scale = "computed";
  std::vector<std::string> methods;
  bool json_out = false;
};

// The request with the names parsed (validated by run_kernel_bench).
pipeline::BenchRequest request_of(const BenchArgs& a) {
  pipeline::BenchRequest req = a.req;
  req.dtype = parse_named(kDTypeNames, "--dtype", a.dtype);
  req.global_scale = parse_named(pipeline::kGlobalScaleModeNames, "--global-scale", a.global_scale);
  for (const std::string& m : a.methods)
    req.methods.push_back(parse_named(kMethodNames, "--methods", m));
  return req;
}

void print_json(const pipeline::BenchResult& b, const std::string& dtype) {
  json j;
  j["rows"] = b.rows;
  j["cols"] = b.cols;
  j["dtype"] = dtype;
  j["block"] = b.block;
  j["simd_target"] = b.simd_target;
  j["repeat"] = b.repeat;
  j["global_scale"] = pipeline::kGlobalScaleModeNames.name(b.global_scale);
  json res = json::array();
  for (const auto& r : b.results) {
    json o;
    o["method"] = r.method;
    o["threads"] = r.threads;
    o["elements_per_s"] = r.elements_per_s;
    o["global_scale"] = r.given_gs ? "given" : "computed";
    o["time_vs_absmax"] = r.time_vs_absmax;
    o["time_vs_copy"] = r.time_vs_copy;
    o["seconds"] = r.seconds;
    if (r.reference) o["reference"] = true;
    if (r.speedup_vs_1_thread) o["speedup_vs_1_thread"] = *r.speedup_vs_1_thread;
    res.push_back(o);
  }
  j["results"] = res;
  j["copy_elements_per_s"] = b.copy_elements_per_s;
  json cj = json::array();
  for (const auto& c : b.copy) {
    json o = {{"threads", c.threads}, {"elements_per_s", c.elements_per_s}, {"seconds", c.seconds}};
    if (c.absmax_time_vs_copy) o["absmax_time_vs_copy"] = *c.absmax_time_vs_copy;
    if (c.absmax_given_gs_time_vs_copy)
      o["absmax_given_gs_time_vs_copy"] = *c.absmax_given_gs_time_vs_copy;
    if (c.speedup_vs_1_thread) o["speedup_vs_1_thread"] = *c.speedup_vs_1_thread;
    cj.push_back(o);
  }
  j["copy"] = cj;
  std::printf("%s\n", j.dump(2).c_str());
}

int run_bench(const BenchArgs& a) {
  StageBars bars;
  const pipeline::BenchResult b = pipeline::run_kernel_bench(request_of(a), cli_events(bars));
  bars.finish();
  if (a.json_out) {
    print_json(b, a.dtype);
    return 0;
  }
  std::printf(
      "scalesweep bench: [%lld, %lld] %s, block %d, SIMD target %s, min of %d runs, global "
      "scale %s\n",
      static_cast<long long>(b.rows), static_cast<long long>(b.cols), a.dtype.c_str(), b.block,
      b.simd_target.c_str(), b.repeat, pipeline::kGlobalScaleModeNames.name(b.global_scale).data());
  auto speedup = [](const std::optional<double>& s) { return s ? strf("%.2fx", *s) : ""; };
  Table tab({"method", "threads", "Melem/s", "time vs absmax", "time vs copy", "speedup vs 1T"});
  for (const auto& c : b.copy)
    tab.add_row({"copy (baseline)", std::to_string(c.threads), strf("%.1f", c.elements_per_s / 1e6),
                 "", "1.00", speedup(c.speedup_vs_1_thread)});
  tab.add_separator();
  for (const auto& r : b.results)
    tab.add_row(
        {r.method + (r.reference ? " (scalar ref)" : "") + (r.given_gs ? " (gs given)" : ""),
         std::to_string(r.threads), strf("%.1f", r.elements_per_s / 1e6),
         strf("%.2f", r.time_vs_absmax), strf("%.2f", r.time_vs_copy),
         speedup(r.speedup_vs_1_thread)});
  tab.print();
  return 0;
}

SS_COMMAND("bench",
           "CPU quantization throughput of every method (1 thread and all threads) vs absmax "
           "and vs a plain copy",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<BenchArgs>();
             sub.add_option("--rows", a->req.rows, "rows N");
             sub.add_option("--cols", a->req.cols, "columns K");
             sub.add_option("--dtype", a->dtype, "input dtype: bf16, fp32, f16");
             sub.add_option("--threads", a->req.threads,
                            "the 'all threads' count (0 = all cores); 1 thread is always "
                            "measured too");
             sub.add_option("--repeat", a->req.repeat, "runs per measurement, minimum kept");
             sub.add_option("--block", a->req.block, "block size");
             sub.add_option("--methods", a->methods,
                            "methods to run; empty: every packed method (absmax is always "
                            "included)");
             sub.add_flag("--reference", a->req.reference,
                          "also time the scalar reference path (1 thread, one run each)");
             sub.add_option("--global-scale", a->global_scale,
                            "computed (each call scans the input for its amax), given "
                            "(a static global scale, as activations calibrated offline: no "
                            "scan), or both");
             sub.add_flag("--json", a->json_out, "print one JSON object instead of a table");
             return [a] { return run_bench(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools

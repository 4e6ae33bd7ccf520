// scalesweep demo: the main job on a built-in default (pipeline::run_demo), printed as the
// paper's Figure-1 table: NMSE and NWMSE with the gap to the exact continuous optimum
// (opt-fp32), per distribution and block size.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "scalesweep/pipeline/demo.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;
using pipeline::kDemoDistributions;

struct DemoArgs {
  bool json_out = false;
  pipeline::DemoRequest req;
};

void print_json(const pipeline::DemoRequest& a, const pipeline::DemoResult& r) {
  json j;
  j["config"] = {{"rows", a.rows},
                 {"cols", a.cols},
                 {"seed", a.seed},
                 {"max_block_scale", a.max_block_scale},
                 {"importance", "per column, w_j = exp(z_j), z ~ N(0,1)"},
                 {"threads", a.threads}};
  json res = json::array();
  for (const pipeline::DemoRun& c : r.runs) {
    std::string mname(kMethodNames.name(c.method));
    if (c.method == Method::kOptFp32) mname += c.weighted ? " (weighted)" : "";
    res.push_back({{"distribution", kDemoDistributions[c.dist]},
                   {"block", c.block},
                   {"method", mname},
                   {"nmse", c.nmse},
                   {"nwmse", c.nwmse},
                   {"gap_nmse_pct", c.gap_nmse_pct},
                   {"gap_nwmse_pct", c.gap_nwmse_pct},
                   {"seconds", c.seconds}});
  }
  j["results"] = res;
  json eqj = json::array();
  for (const auto& v : r.sweep_match) {
    eqj.push_back({{"distribution", kDemoDistributions[v.dist]},
                   {"block", v.block},
                   {"equal_blocks", v.equal},
                   {"blocks", v.blocks}});
  }
  j["sweep_mse_equals_exhaustive_mse"] = eqj;
  j["seconds_total"] = r.seconds_total;
  std::printf("%s\n", j.dump().c_str());
}

void print_tables(const pipeline::DemoRequest& a, const pipeline::DemoResult& r) {
  std::printf(
      "scalesweep demo: [%lld, %lld] tensors (%lld elements), seed %llu, "
      "S = amax/(6*%g) for every method\n",
      static_cast<long long>(a.rows), static_cast<long long>(a.cols),
      static_cast<long long>(a.rows * a.cols), static_cast<unsigned long long>(a.seed),
      a.max_block_scale);
  for (int weighted = 0; weighted < 2; ++weighted) {
    const auto& rows = weighted ? pipeline::kDemoWmseRows : pipeline::kDemoMseRows;
    std::printf("\n%s, gap = 100 (err - err_opt) / err_opt to opt-fp32%s\n",
                weighted ? "NWMSE (per-column importance w_j = exp(z_j))" : "NMSE",
                weighted ? " (weighted optimum)" : "");
    std::vector<std::string> hdr = {"b", "method"};
    for (const char* d : kDemoDistributions) {
      hdr.push_back(std::string(d) + (weighted ? " NWMSE" : " NMSE"));
      hdr.push_back("gap");
    }
    Table t(hdr);
    bool first = true;
    for (int b : pipeline::kDemoBlocks) {
      if (!first) t.add_separator();
      first = false;
      for (Method m : rows) {
        std::vector<std::string> row = {std::to_string(b), std::string(kMethodNames.name(m))};
        for (size_t d = 0; d < std::size(kDemoDistributions); ++d) {
          const pipeline::DemoRun& c = r.run(d, b, m, weighted);
          row.push_back(strf("%.4e", weighted ? c.nwmse : c.nmse));
          row.push_back(strf("%.1f%%", weighted ? c.gap_nwmse_pct : c.gap_nmse_pct));
        }
        t.add_row(row);
      }
    }
    t.print();
  }
  std::printf("\nsweep-mse picks the exhaustive-mse scale on:");
  int64_t eq = 0, tot = 0;
  for (const auto& v : r.sweep_match) {
    eq += v.equal;
    tot += v.blocks;
    if (v.block != 16) continue;
    std::printf(" %s %lld/%lld;", kDemoDistributions[v.dist], static_cast<long long>(v.equal),
                static_cast<long long>(v.blocks));
  }
  std::printf(" all block sizes %lld/%lld blocks\n", static_cast<long long>(eq),
              static_cast<long long>(tot));
  std::printf(
      "SPEC reference (b=16, S=amax/1536, NMSE gap, Gaussian/Laplace/Student-t): "
      "absmax ~49/37/28%%, 4over6 ~24/21/18%%, sweep-mse = exhaustive ~8.4/8.6/8.7%%\n");
  std::printf("%zu runs in %.1f s\n", r.runs.size(), r.seconds_total);
}

int run_demo(const DemoArgs& a) {
  StageBars bars;
  const pipeline::DemoResult r = pipeline::run_demo(a.req, cli_events(bars));
  bars.finish();
  if (a.json_out) {
    print_json(a.req, r);
  } else {
    print_tables(a.req, r);
  }
  return 0;
}

SS_COMMAND("demo",
           "Main job: every method on Gaussian/Laplace/Student-t(3) tensors, b = 8..64 "
           "(the paper's Figure 1 table)",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<DemoArgs>();
             sub.add_flag("--json", a->json_out, "print one JSON object instead of tables");
             sub.add_option("--threads", a->req.threads, "threads (0 = all cores)");
             sub.add_option("--seed", a->req.seed, "random seed");
             sub.add_option("--max-block-scale", a->req.max_block_scale,
                            "C in S = amax/(6C) for every method");
             sub.add_option("--rows", a->req.rows, "rows of each tensor");
             sub.add_option("--cols", a->req.cols, "columns of each tensor");
             return [a] { return run_demo(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools

// scalesweep bench-gpu: latency of the CUDA NVFP4 quantize operator (absmax, 4over6,
// sweep-mse, sweep-wmse, exhaustive-mse[, exhaustive-wmse]; the sweeps with exact, fast and
// half2 numerics) on X[M, K] for M = 128 .. 32768, against a device-to-device copy of the same
// input bytes measured in the same run (the paper's Table 7 layout, plus details).
//   scalesweep bench-gpu [--k 8192] [--m 4096 ...] [--methods absmax,sweep-mse]
//                        [--numerics all|both|exact,fast,half2] [--dtype bf16|fp16|fp32] [--runs
//                        100]
//                        [--warmup 10] [--json]
// A row is a (method, numerics) pair: "sweep-mse (fast)"; fast and half2 exist for the sweeps
// only, so --numerics fast leaves the other methods exact (absmax stays the reference).
// Compiled into every build; without the CUDA kernels (SS_HAVE_CUDA unset) it is an error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/scale/selector.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/ui.h"
#ifdef SS_HAVE_CUDA
#include "scalesweep/cuda/quantize.h"
#endif

namespace scalesweep::tools {
namespace {

struct BenchGpuArgs {
  int64_t k = 8192;
  std::vector<int64_t> m;
  std::string methods = "absmax,4over6,sweep-mse,sweep-wmse,exhaustive-mse";
  std::string numerics = "all";
  std::string dtype = "bf16";
  int runs = 100, warmup = 10;
  bool json = false;
};

#ifdef SS_HAVE_CUDA
void progress_cb(int64_t done, int64_t, void* ctx) { static_cast<ProgressBar*>(ctx)->update(done); }

// The comma list `list` parsed with `parse`, empty items skipped.
template <class F>
void for_each_item(const std::string& list, F parse) {
  std::stringstream ss(list);
  for (std::string tok; std::getline(ss, tok, ',');)
    if (!tok.empty()) parse(tok);
}

// The command line as the CUDA benchmark's config, checked before the device is touched.
// *exact_rows: exact was asked for (else it is added for the methods that need it, and the
// rows it adds are dropped afterwards).
cuda::BenchConfig bench_config(const BenchGpuArgs& a, bool* exact_rows) {
  cuda::BenchConfig cfg;
  cfg.cols = a.k;
  cfg.rows = a.m;
  cfg.runs = a.runs;
  cfg.warmup = a.warmup;
  cfg.dtype = parse_named(kDTypeNames, "--dtype", a.dtype);
  for_each_item(a.methods, [&](const std::string& tok) {
    const Method m = kMethodNames.parse(tok);
    if (!cuda::method_supported(m))
      throw std::invalid_argument("method '" + tok +
                                  "' is not implemented on CUDA; use absmax, 4over6, sweep-mse, "
                                  "sweep-wmse, exhaustive-mse or exhaustive-wmse");
    cfg.methods.push_back(m);
  });
  if (cfg.methods.empty()) throw std::invalid_argument("--methods is empty");
  // --numerics: a comma list of kNumericsNames, or both (exact,fast) or all (every numerics).
  const std::string nlist = a.numerics == "all"    ? "exact,fast,half2"
                            : a.numerics == "both" ? "exact,fast"
                                                   : a.numerics;
  for_each_item(nlist, [&](const std::string& tok) {
    const cuda::Numerics nu = parse_named(cuda::kNumericsNames, "--numerics", tok);
    if (std::find(cfg.numerics.begin(), cfg.numerics.end(), nu) == cfg.numerics.end())
      cfg.numerics.push_back(nu);
  });
  if (cfg.numerics.empty()) throw std::invalid_argument("--numerics is empty");
  // Without exact in the list, the methods that lack the numerics asked for (absmax: the
  // reference) still run exact; the exact rows of the sweeps are dropped afterwards.
  *exact_rows = std::find(cfg.numerics.begin(), cfg.numerics.end(), cuda::Numerics::kExact) !=
                cfg.numerics.end();
  if (!*exact_rows) cfg.numerics.insert(cfg.numerics.begin(), cuda::Numerics::kExact);
  if (cfg.rows.empty())
    for (int64_t m = 128; m <= 32768; m *= 2) cfg.rows.push_back(m);
  if (a.k % 16 != 0)  // checked before the device so that bad options fail the same everywhere
    throw std::invalid_argument("--k " + std::to_string(a.k) + " is not a multiple of 16");
  for (int64_t m : cfg.rows)
    if (m <= 0) throw std::invalid_argument("--m " + std::to_string(m) + " must be > 0");
  return cfg;
}

// Exact not asked for: drops the exact rows of methods that have one of the numerics asked for.
void drop_exact_rows(const cuda::BenchConfig& cfg, std::vector<cuda::BenchRow>& rows) {
  std::vector<cuda::BenchRow> kept;
  for (const auto& r : rows) {
    bool other = false;
    for (cuda::Numerics nu : cfg.numerics)
      other = other || (nu != cuda::Numerics::kExact && cuda::numerics_supported(r.method, nu));
    if (r.numerics != cuda::Numerics::kExact || !other) kept.push_back(r);
  }
  rows.swap(kept);
}

// The measured rows as the reports read them: absmax's latency per M (the ratios' reference)
// and the (method, numerics) series in measurement order.
struct GpuRows {
  std::vector<cuda::BenchRow> rows;
  std::map<int64_t, double> absmax_ms;
  std::vector<std::pair<Method, cuda::Numerics>> series;

  explicit GpuRows(std::vector<cuda::BenchRow> r) : rows(std::move(r)) {
    for (const auto& x : rows)
      if (x.method == Method::kAbsMax) absmax_ms[x.rows] = x.median_ms;
    for (const auto& x : rows) {
      const std::pair<Method, cuda::Numerics> k{x.method, x.numerics};
      if (std::find(series.begin(), series.end(), k) == series.end()) series.push_back(k);
    }
  }
  // Latency relative to absmax at the same M (0 without an absmax row).
  double rel(const cuda::BenchRow& r) const {
    auto it = absmax_ms.find(r.rows);
    return it == absmax_ms.end() ? 0.0 : r.median_ms / it->second;
  }
  const cuda::BenchRow* find(Method me, cuda::Numerics nu, int64_t m) const {
    for (const auto& r : rows)
      if (r.method == me && r.numerics == nu && r.rows == m) return &r;
    return nullptr;
  }
};

// Row label: "sweep-mse" (exact), "sweep-mse (fast)", "sweep-mse (half2)".
std::string label(Method me, cuda::Numerics nu) {
  std::string s(kMethodNames.name(me));
  if (nu != cuda::Numerics::kExact) s += " (" + std::string(cuda::kNumericsNames.name(nu)) + ")";
  return s;
}

// The measured fields of a row, as the JSON names them.
constexpr std::pair<const char*, double cuda::BenchRow::*> kMeasured[] = {
    {"median_ms", &cuda::BenchRow::median_ms}, {"min_ms", &cuda::BenchRow::min_ms},
    {"bytes", &cuda::BenchRow::bytes},         {"gbps", &cuda::BenchRow::gbps},
    {"copy_ms", &cuda::BenchRow::copy_ms},     {"copy_gbps", &cuda::BenchRow::copy_gbps}};

void print_json(const BenchGpuArgs& a, const std::string& dev, const GpuRows& g) {
  nlohmann::json j;
  j["device"] = dev;
  j["k"] = a.k;
  j["dtype"] = a.dtype;
  j["runs"] = a.runs;
  j["warmup"] = a.warmup;
  j["rows"] = nlohmann::json::array();
  for (const auto& r : g.rows) {
    nlohmann::json o;
    o["m"] = r.rows;
    o["method"] = std::string(kMethodNames.name(r.method));
    o["numerics"] = std::string(cuda::kNumericsNames.name(r.numerics));
    for (const auto& [key, field] : kMeasured) o[key] = r.*field;
    o["rel_absmax"] = g.absmax_ms.count(r.rows) ? nlohmann::json(g.rel(r)) : nlohmann::json();
    o["rel_copy_latency"] = r.median_ms / r.copy_ms;
    o["bw_fraction_of_copy"] = r.gbps / r.copy_gbps;
    j["rows"].push_back(o);
  }
  std::printf("%s\n", j.dump(2).c_str());
}

// Paper Table 7 layout: methods x metrics as rows, M as columns.
void print_table7(const cuda::BenchConfig& cfg, const GpuRows& g) {
  std::vector<std::string> head = {"method", "metric"};
  for (int64_t m : cfg.rows) head.push_back(std::to_string(m));
  Table t7(head);
  {
    std::vector<std::string> row = {"d2d copy", "latency (ms)"};
    for (int64_t m : cfg.rows)
      row.push_back(strf("%.4f", g.find(g.series[0].first, g.series[0].second, m)->copy_ms));
    t7.add_row(row);
  }
  for (const auto& [me, nu] : g.series) {
    std::vector<std::string> lat = {label(me, nu), "latency (ms)"};
    std::vector<std::string> rl = {label(me, nu), "rel. absmax"};
    std::vector<std::string> bw = {label(me, nu), "% of copy BW"};
    for (int64_t m : cfg.rows) {
      const cuda::BenchRow* r = g.find(me, nu, m);
      lat.push_back(strf("%.4f", r->median_ms));
      rl.push_back(g.absmax_ms.count(m) ? strf("%.2fx", g.rel(*r)) : "-");
      bw.push_back(strf("%.0f%%", 100.0 * r->gbps / r->copy_gbps));
    }
    t7.add_separator();
    t7.add_row(lat);
    if (g.absmax_ms.size() && me != Method::kAbsMax) t7.add_row(rl);
    t7.add_row(bw);
  }
  t7.print();
}

// Every row in detail, in measurement order.
void print_details(const GpuRows& g) {
  Table d({"M", "method", "median ms", "min ms", "MB moved", "GB/s", "copy GB/s", "x absmax",
           "x copy latency"});
  for (const auto& r : g.rows) {
    d.add_row({std::to_string(r.rows), label(r.method, r.numerics), strf("%.4f", r.median_ms),
               strf("%.4f", r.min_ms), strf("%.1f", r.bytes / 1e6), strf("%.0f", r.gbps),
               strf("%.0f", r.copy_gbps), g.absmax_ms.count(r.rows) ? strf("%.3f", g.rel(r)) : "-",
               strf("%.2f", r.median_ms / r.copy_ms)});
  }
  d.print();
}

int run_bench_gpu(const BenchGpuArgs& a) {
  bool exact_rows = true;
  const cuda::BenchConfig cfg = bench_config(a, &exact_rows);
  const std::string dev = cuda::device_name();  // "no CUDA device: ..." when there is none
  std::vector<cuda::BenchRow> rows;
  {
    ProgressBar bar("bench-gpu", static_cast<int64_t>(cfg.rows.size() * cfg.methods.size()), "cfg");
    rows = cuda::bench(cfg, progress_cb, &bar);
    bar.finish();
  }
  if (!exact_rows) drop_exact_rows(cfg, rows);
  const GpuRows g(std::move(rows));
  if (a.json) {
    print_json(a, dev, g);
    return 0;
  }
  std::printf("NVFP4 quantize operator, K = %lld, %s input, %s\n", static_cast<long long>(a.k),
              a.dtype.c_str(), dev.c_str());
  std::printf("median of %d runs after %d warm-up runs, L2 flushed before each run\n\n", a.runs,
              a.warmup);
  print_table7(cfg, g);
  std::printf("\n");
  print_details(g);
  return 0;
}
#else
int run_bench_gpu(const BenchGpuArgs&) {
  throw std::runtime_error(
      "built without CUDA: this scalesweep binary has no GPU kernels (configure with nvcc "
      "available and -DSS_CUDA=AUTO or ON to build them; see README section 'cuda')");
}
#endif

SS_COMMAND("bench-gpu", "Benchmark the CUDA NVFP4 quantize operator (latency vs absmax and copy)",
           [](CLI::App& sub) {
             auto a = std::make_shared<BenchGpuArgs>();
             sub.add_option("--k", a->k, "hidden size K (columns), multiple of 16")
                 ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
             sub.add_option("--m", a->m, "rows M to measure; empty: 128 .. 32768, powers of 2");
             sub.add_option("--methods", a->methods, "comma-separated methods");
             sub.add_option("--numerics", a->numerics,
                            "the sweeps' loss numerics: a comma list of exact, fast, half2, or "
                            "both (exact,fast) or all (include/scalesweep/cuda/quantize.h)");
             sub.add_option("--dtype", a->dtype, "input dtype: bf16, fp16, fp32");
             sub.add_option("--runs", a->runs, "timed runs per configuration")
                 ->check(CLI::Range(1, 1 << 30));
             sub.add_option("--warmup", a->warmup, "warm-up runs")->check(CLI::Range(0, 1 << 30));
             sub.add_flag("--json", a->json, "print JSON instead of tables");
             return [a] { return run_bench_gpu(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools

// scalesweep bench: CPU quantization throughput of every packed method on one fixed-seed
// Gaussian tensor, for 1 thread and all threads, measured in one run on the same data:
// elements/s, time relative to absmax, and absmax relative to a plain copy of the same bytes
// (read the input, write packed-output-sized bytes: one nibble per element, one byte per
// block). Every side writes into preallocated, pre-faulted output buffers (quantize_into()
// reusing one QuantizedTensor per method; the copy into its own two buffers), so the times
// are end to end quantize_into() calls (validation, input scan for the global scale unless
// --global-scale given, rows) against one streaming pass of the copy; the minimum over
// --repeat rounds (round-robin over the methods).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant/simd/kernels.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/quantize.h"
#include "tools/command.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  int64_t rows = 8192, cols = 8192;
  std::string dtype = "bf16";
  int threads = 0;  // "all threads" (0 = all cores)
  int repeat = 3;
  int block = 16;
  std::vector<std::string> methods;
  bool reference = false;
  bool json_out = false;
  std::string global_scale = "computed";  // computed | given | both
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Copy baseline with the same row split as quantize(), into preallocated (pre-faulted)
// buffers of the packed output's sizes.
double time_copy(const void* x, DType dt, int64_t rows, int64_t cols, int block, int threads,
                 std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
  const auto t0 = Clock::now();
  parallel_for(rows, threads, [&](int64_t r0, int64_t r1, int) {
    simd::copy_baseline(x, dt, rows, cols, block, codes.data(), scales.data(), r0, r1);
  });
  return seconds_since(t0);
}

struct Row {
  std::string method;
  int threads;
  double seconds;
  bool reference;
  bool given_gs = false;
};

int run_bench(const BenchArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) throw std::invalid_argument("--rows and --cols must be positive");
  if (a.repeat < 1) throw std::invalid_argument("--repeat must be >= 1");
  if (a.global_scale != "computed" && a.global_scale != "given" && a.global_scale != "both")
    throw std::invalid_argument("--global-scale must be computed, given or both (got '" +
                                a.global_scale + "')");
  std::vector<bool> gs_modes;  // false = computed by the call, true = given (precomputed)
  if (a.global_scale != "given") gs_modes.push_back(false);
  if (a.global_scale != "computed") gs_modes.push_back(true);
  DType dt;
  if (a.dtype == "bf16")
    dt = DType::kBF16;
  else if (a.dtype == "fp32" || a.dtype == "f32")
    dt = DType::kF32;
  else if (a.dtype == "f16" || a.dtype == "fp16")
    dt = DType::kF16;
  else
    throw std::invalid_argument("--dtype must be bf16, fp32 or f16 (got '" + a.dtype + "')");
  std::vector<Method> methods;
  if (a.methods.empty()) {
    for (Method m : kMethodNames.values())
      if (m != Method::kOptFp32) methods.push_back(m);  // no packed form (fake_quantize only)
  } else {
    for (const auto& n : a.methods) methods.push_back(kMethodNames.parse(n));
    if (std::find(methods.begin(), methods.end(), Method::kOptFp32) != methods.end())
      throw std::invalid_argument("opt-fp32 has no packed output; it cannot be benchmarked here");
  }
  if (std::find(methods.begin(), methods.end(), Method::kAbsMax) == methods.end())
    methods.insert(methods.begin(), Method::kAbsMax);  // the reference of the ratios

  const int all = resolve_threads(a.threads, "--threads");
  std::vector<int> tcounts = {1};
  if (all > 1) tcounts.push_back(all);

  // Data: fixed-seed Gaussian, per-column importance exp(N(0,1)).
  const int64_t n = a.rows * a.cols;
  std::vector<float> xf(static_cast<size_t>(n));
  std::mt19937_64 g(20250101);
  for (int64_t i = 0; i < n; i += 2) {
    const double u = (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
    const double v = (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u));
    xf[static_cast<size_t>(i)] = static_cast<float>(r * std::cos(2.0 * M_PI * v));
    if (i + 1 < n)
      xf[static_cast<size_t>(i + 1)] = static_cast<float>(r * std::sin(2.0 * M_PI * v));
  }
  std::vector<uint16_t> x16;
  const void* x = xf.data();
  if (dt != DType::kF32) {
    x16.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      x16[static_cast<size_t>(i)] = dt == DType::kBF16
                                        ? format::f32_to_bf16(xf[static_cast<size_t>(i)])
                                        : format::f32_to_f16(xf[static_cast<size_t>(i)]);
    std::vector<float>().swap(xf);
    x = x16.data();
  }
  std::vector<float> imp(static_cast<size_t>(a.cols));
  for (auto& w : imp) {
    const double u = (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
    const double v = (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
    w = static_cast<float>(std::exp(std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v)));
  }
  const Importance importance{ImportanceKind::kPerColumn, imp.data()};

  const int total =
      static_cast<int>(tcounts.size() * (methods.size() * gs_modes.size() + 1) * a.repeat) +
      (a.reference ? static_cast<int>(methods.size()) : 0);
  ProgressBar bar("bench", total, "runs");
  int done = 0;
  std::vector<Row> rows;
  std::vector<std::pair<int, double>> copy;
  // Preallocated outputs (pre-faulted by zeroing / by one untimed call per method).
  const int64_t pc = (a.cols + 1) / 2, nbk = (a.cols + a.block - 1) / a.block;
  std::vector<uint8_t> copy_codes(static_cast<size_t>(a.rows * pc)),
      copy_scales(static_cast<size_t>(a.rows * nbk));
  struct Variant {
    Method m;
    bool given;
    QuantConfig cfg;
    QuantizedTensor out;
  };
  std::vector<Variant> vars;
  for (bool given : gs_modes) {
    for (Method m : methods) {
      Variant v{m, given, {}, {}};
      v.cfg.block = a.block;
      v.cfg.selector.method = m;
      if (m == Method::kSweep) v.cfg.selector.window = Window{-3, 7};
      if (given)  // static global scale, e.g. from calibration: the same value the call computes
        v.cfg.global_scale = resolve_global_scale(x, dt, a.rows, a.cols, v.cfg, "bench");
      v.out.codes.assign(copy_codes.size(), 0);
      v.out.scales.assign(copy_scales.size(), 0);
      vars.push_back(std::move(v));
    }
  }
  // Round-robin over the repeats (copy, then every method, then again), keeping each one's
  // minimum: on a shared machine every method then samples the same load conditions.
  for (int t : tcounts) {
    double best_copy = 1e300;
    std::vector<double> best(vars.size(), 1e300);
    for (int r = 0; r < a.repeat; ++r) {
      best_copy = std::min(best_copy,
                           time_copy(x, dt, a.rows, a.cols, a.block, t, copy_codes, copy_scales));
      bar.update(++done);
      for (size_t vi = 0; vi < vars.size(); ++vi) {
        Variant& v = vars[vi];
        v.cfg.threads = t;
        const auto t0 = Clock::now();
        quantize_into(x, dt, a.rows, a.cols, importance, v.cfg, v.out, "bench");
        best[vi] = std::min(best[vi], seconds_since(t0));
        if (v.out.codes.empty()) throw std::runtime_error("empty output");
        bar.update(++done);
      }
    }
    copy.push_back({t, best_copy});
    for (size_t vi = 0; vi < vars.size(); ++vi)
      rows.push_back(
          {std::string(kMethodNames.name(vars[vi].m)), t, best[vi], false, vars[vi].given});
  }
  if (a.reference) {
    for (Method m : methods) {
      QuantConfig cfg;
      cfg.block = a.block;
      cfg.selector.method = m;
      if (m == Method::kSweep) cfg.selector.window = Window{-3, 7};
      cfg.threads = 1;
      cfg.reference_only = true;
      const auto t0 = Clock::now();
      quantize(x, dt, a.rows, a.cols, importance, cfg, "bench");
      rows.push_back({std::string(kMethodNames.name(m)), 1, seconds_since(t0), true});
      bar.update(++done);
    }
  }
  bar.finish();

  auto absmax_time = [&](int t, bool ref, bool given = false) {
    for (const auto& r : rows)
      if (r.method == "absmax" && r.threads == t && r.reference == ref && r.given_gs == given)
        return r.seconds;
    return 0.0;
  };
  auto fast_time = [&](const std::string& m, int t, bool given) {
    for (const auto& r : rows)
      if (r.method == m && r.threads == t && !r.reference && r.given_gs == given) return r.seconds;
    return 0.0;
  };
  auto copy_time = [&](int t) {
    for (const auto& [ct, s] : copy)
      if (ct == t) return s;
    return copy.front().second;
  };
  const double el = static_cast<double>(n);
  if (a.json_out) {
    json j;
    j["rows"] = a.rows;
    j["cols"] = a.cols;
    j["dtype"] = a.dtype;
    j["block"] = a.block;
    j["simd_target"] = simd::active_target_name();
    j["repeat"] = a.repeat;
    j["global_scale"] = a.global_scale;
    json res = json::array();
    for (const auto& r : rows) {
      json o;
      o["method"] = r.method;
      o["threads"] = r.threads;
      o["elements_per_s"] = el / r.seconds;
      o["global_scale"] = r.given_gs ? "given" : "computed";
      o["time_vs_absmax"] = r.seconds / absmax_time(r.threads, r.reference, r.given_gs);
      o["time_vs_copy"] = r.seconds / copy_time(r.threads);
      o["seconds"] = r.seconds;
      if (r.reference) o["reference"] = true;
      if (!r.reference && tcounts.size() > 1 && r.threads == tcounts.back())
        o["speedup_vs_1_thread"] = fast_time(r.method, 1, r.given_gs) / r.seconds;
      res.push_back(o);
    }
    j["results"] = res;
    j["copy_elements_per_s"] = el / copy.front().second;  // 1 thread
    json cj = json::array();
    for (const auto& [t, s] : copy) {
      json c = {{"threads", t}, {"elements_per_s", el / s}, {"seconds", s}};
      for (bool given : gs_modes)
        c[given ? "absmax_given_gs_time_vs_copy" : "absmax_time_vs_copy"] =
            absmax_time(t, false, given) / s;
      if (tcounts.size() > 1 && t == tcounts.back()) c["speedup_vs_1_thread"] = copy_time(1) / s;
      cj.push_back(c);
    }
    j["copy"] = cj;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "scalesweep bench: [%lld, %lld] %s, block %d, SIMD target %s, min of %d runs, global "
      "scale %s\n",
      static_cast<long long>(a.rows), static_cast<long long>(a.cols), a.dtype.c_str(), a.block,
      simd::active_target_name(), a.repeat, a.global_scale.c_str());
  Table tab({"method", "threads", "Melem/s", "time vs absmax", "time vs copy", "speedup vs 1T"});
  for (const auto& [t, s] : copy) {
    std::string sp;
    if (tcounts.size() > 1 && t == tcounts.back()) sp = strf("%.2fx", copy_time(1) / s);
    tab.add_row({"copy (baseline)", std::to_string(t), strf("%.1f", el / s / 1e6), "", "1.00", sp});
  }
  tab.add_separator();
  for (const auto& r : rows) {
    std::string sp;
    if (!r.reference && tcounts.size() > 1 && r.threads == tcounts.back())
      sp = strf("%.2fx", fast_time(r.method, 1, r.given_gs) / r.seconds);
    tab.add_row(
        {r.method + (r.reference ? " (scalar ref)" : "") + (r.given_gs ? " (gs given)" : ""),
         std::to_string(r.threads), strf("%.1f", el / r.seconds / 1e6),
         strf("%.2f", r.seconds / absmax_time(r.threads, r.reference, r.given_gs)),
         strf("%.2f", r.seconds / copy_time(r.threads)), sp});
  }
  tab.print();
  return 0;
}

SS_COMMAND("bench",
           "CPU quantization throughput of every method (1 thread and all threads) vs absmax "
           "and vs a plain copy",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<BenchArgs>();
             sub.add_option("--rows", a->rows, "rows N");
             sub.add_option("--cols", a->cols, "columns K");
             sub.add_option("--dtype", a->dtype, "input dtype: bf16, fp32, f16");
             sub.add_option("--threads", a->threads,
                            "the 'all threads' count (0 = all cores); 1 thread is always "
                            "measured too");
             sub.add_option("--repeat", a->repeat, "runs per measurement, minimum kept");
             sub.add_option("--block", a->block, "block size");
             sub.add_option("--methods", a->methods,
                            "methods to run; empty: every packed method (absmax is always "
                            "included)");
             sub.add_flag("--reference", a->reference,
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

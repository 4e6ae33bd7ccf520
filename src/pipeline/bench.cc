#include "scalesweep/pipeline/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "quant/simd/kernels.h"
#include "scalesweep/base/clock.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

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

// The ratios of every row and copy entry, from the measured seconds.
void fill_ratios(BenchResult& res, const std::vector<bool>& gs_modes) {
  const std::vector<int>& tcounts = res.thread_counts;
  auto absmax_time = [&](int t, bool ref, bool given = false) {
    for (const auto& r : res.results)
      if (r.method == "absmax" && r.threads == t && r.reference == ref && r.given_gs == given)
        return r.seconds;
    return 0.0;
  };
  auto fast_time = [&](const std::string& m, int t, bool given) {
    for (const auto& r : res.results)
      if (r.method == m && r.threads == t && !r.reference && r.given_gs == given) return r.seconds;
    return 0.0;
  };
  auto copy_time = [&](int t) {
    for (const auto& c : res.copy)
      if (c.threads == t) return c.seconds;
    return res.copy.front().seconds;
  };
  const double el = static_cast<double>(res.rows * res.cols);
  for (auto& r : res.results) {
    r.elements_per_s = el / r.seconds;
    r.time_vs_absmax = r.seconds / absmax_time(r.threads, r.reference, r.given_gs);
    r.time_vs_copy = r.seconds / copy_time(r.threads);
    if (!r.reference && tcounts.size() > 1 && r.threads == tcounts.back())
      r.speedup_vs_1_thread = fast_time(r.method, 1, r.given_gs) / r.seconds;
  }
  res.copy_elements_per_s = el / res.copy.front().seconds;  // 1 thread
  for (auto& c : res.copy) {
    c.elements_per_s = el / c.seconds;
    for (bool given : gs_modes)
      (given ? c.absmax_given_gs_time_vs_copy : c.absmax_time_vs_copy) =
          absmax_time(c.threads, false, given) / c.seconds;
    if (tcounts.size() > 1 && c.threads == tcounts.back())
      c.speedup_vs_1_thread = copy_time(1) / c.seconds;
  }
}

// A standard normal pair (Box-Muller) from two 53-bit uniforms of `g`.
std::pair<double, double> normal_pair(std::mt19937_64& g) {
  const double u = (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
  const double v = (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u));
  return {r * std::cos(2.0 * M_PI * v), r * std::sin(2.0 * M_PI * v)};
}

// The benchmark's input: fixed-seed Gaussian X[rows, cols] in the request's dtype, per-column
// importance exp(N(0,1)).
struct BenchData {
  std::vector<float> xf;
  std::vector<uint16_t> x16;  // bf16/f16 inputs
  std::vector<float> imp;
  const void* x = nullptr;
};

BenchData bench_data(const BenchRequest& a) {
  BenchData d;
  const int64_t n = a.rows * a.cols;
  d.xf.resize(static_cast<size_t>(n));
  std::mt19937_64 g(20250101);
  for (int64_t i = 0; i < n; i += 2) {
    const auto [c, s] = normal_pair(g);
    d.xf[static_cast<size_t>(i)] = static_cast<float>(c);
    if (i + 1 < n) d.xf[static_cast<size_t>(i + 1)] = static_cast<float>(s);
  }
  d.x = d.xf.data();
  if (a.dtype != DType::kF32) {
    d.x16.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      d.x16[static_cast<size_t>(i)] = a.dtype == DType::kBF16
                                          ? format::f32_to_bf16(d.xf[static_cast<size_t>(i)])
                                          : format::f32_to_f16(d.xf[static_cast<size_t>(i)]);
    std::vector<float>().swap(d.xf);
    d.x = d.x16.data();
  }
  d.imp.resize(static_cast<size_t>(a.cols));
  for (auto& w : d.imp) w = static_cast<float>(std::exp(normal_pair(g).first));
  return d;
}

// The methods to time (all that have a packed form by default), absmax first when not given:
// the reference of the ratios.
std::vector<Method> bench_methods(const BenchRequest& a) {
  std::vector<Method> methods = a.methods;
  if (methods.empty()) {
    for (Method m : kMethodNames.values())
      // opt-fp32: no packed form; the block-Hessian methods: no Hessian on random tensors.
      if (m != Method::kOptFp32 && !method_uses_hessian(m)) methods.push_back(m);
  } else if (std::find(methods.begin(), methods.end(), Method::kOptFp32) != methods.end()) {
    throw OptionError("methods", "opt-fp32 has no packed output; it cannot be benchmarked here");
  }
  if (std::find(methods.begin(), methods.end(), Method::kAbsMax) == methods.end())
    methods.insert(methods.begin(), Method::kAbsMax);  // the reference of the ratios
  return methods;
}

// A method's config as the benchmark runs it (sweep: the window -3..7).
QuantConfig bench_config(Method m, int block) {
  QuantConfig cfg;
  cfg.block = block;
  cfg.selector.method = m;
  if (m == Method::kSweep) cfg.selector.window = Window{-3, 7};
  return cfg;
}

// One timed configuration and its preallocated output.
struct Variant {
  Method m;
  bool given;
  QuantConfig cfg;
  QuantizedTensor out;
};

// What the timing loops share: the request, the input and the progress counter.
struct BenchRun {
  const BenchRequest& a;
  const BenchData& d;
  const JobEvents& events;
  int64_t done = 0, total = 0;

  void step() {
    ++done;
    events.step("bench", "runs", done, total);
  }
  Importance importance() const { return {ImportanceKind::kPerColumn, d.imp.data()}; }
};

// Round-robin over the repeats at `t` threads (copy, then every method, then again), keeping
// each one's minimum: on a shared machine every method then samples the same load conditions.
void time_threads(BenchRun& run, int t, std::vector<Variant>& vars,
                  std::vector<uint8_t>& copy_codes, std::vector<uint8_t>& copy_scales,
                  BenchResult& res) {
  const BenchRequest& a = run.a;
  double best_copy = 1e300;
  std::vector<double> best(vars.size(), 1e300);
  for (int r = 0; r < a.repeat; ++r) {
    best_copy = std::min(best_copy, time_copy(run.d.x, a.dtype, a.rows, a.cols, a.block, t,
                                              copy_codes, copy_scales));
    run.step();
    for (size_t vi = 0; vi < vars.size(); ++vi) {
      Variant& v = vars[vi];
      v.cfg.threads = t;
      const auto t0 = Clock::now();
      quantize_into(run.d.x, a.dtype, a.rows, a.cols, run.importance(), v.cfg, v.out, "bench");
      best[vi] = std::min(best[vi], seconds_since(t0));
      if (v.out.codes.empty()) throw std::runtime_error("empty output");
      run.step();
    }
  }
  BenchCopy c;
  c.threads = t;
  c.seconds = best_copy;
  res.copy.push_back(c);
  for (size_t vi = 0; vi < vars.size(); ++vi) {
    BenchRow row;
    row.method = std::string(kMethodNames.name(vars[vi].m));
    row.threads = t;
    row.seconds = best[vi];
    row.given_gs = vars[vi].given;
    res.results.push_back(row);
  }
}

// The scalar reference of every method, once, on one thread.
void time_reference(BenchRun& run, const std::vector<Method>& methods, BenchResult& res) {
  const BenchRequest& a = run.a;
  for (Method m : methods) {
    QuantConfig cfg = bench_config(m, a.block);
    cfg.threads = 1;
    cfg.reference_only = true;
    const auto t0 = Clock::now();
    quantize(run.d.x, a.dtype, a.rows, a.cols, run.importance(), cfg, "bench");
    BenchRow row;
    row.method = std::string(kMethodNames.name(m));
    row.seconds = seconds_since(t0);
    row.reference = true;
    res.results.push_back(row);
    run.step();
  }
}

}  // namespace

BenchResult run_kernel_bench(const BenchRequest& a, const JobEvents& events) {
  for (const auto& [field, n] : {std::pair{"rows", a.rows}, std::pair{"cols", a.cols}})
    if (n <= 0) throw OptionError(field, "must be positive");
  if (a.repeat < 1) throw OptionError("repeat", "must be >= 1");
  check_threads(a.threads);
  std::vector<bool> gs_modes;  // false = computed by the call, true = given (precomputed)
  if (a.global_scale != GlobalScaleMode::kGiven) gs_modes.push_back(false);
  if (a.global_scale != GlobalScaleMode::kComputed) gs_modes.push_back(true);
  const std::vector<Method> methods = bench_methods(a);
  const int all = resolve_threads(a.threads);
  std::vector<int> tcounts = {1};
  if (all > 1) tcounts.push_back(all);
  const BenchData d = bench_data(a);
  BenchRun run{a, d, events};
  run.total =
      static_cast<int64_t>(tcounts.size() * (methods.size() * gs_modes.size() + 1) * a.repeat) +
      (a.reference ? static_cast<int64_t>(methods.size()) : 0);
  events.step("bench", "runs", 0, run.total);  // the job starts: its clock too
  BenchResult res;
  res.rows = a.rows;
  res.cols = a.cols;
  res.dtype = a.dtype;
  res.block = a.block;
  res.simd_target = simd::active_target_name();
  res.repeat = a.repeat;
  res.global_scale = a.global_scale;
  res.thread_counts = tcounts;
  // Preallocated outputs (pre-faulted by zeroing / by one untimed call per method).
  const int64_t pc = (a.cols + 1) / 2, nbk = (a.cols + a.block - 1) / a.block;
  std::vector<uint8_t> copy_codes(static_cast<size_t>(a.rows * pc)),
      copy_scales(static_cast<size_t>(a.rows * nbk));
  std::vector<Variant> vars;
  for (bool given : gs_modes) {
    for (Method m : methods) {
      Variant v{m, given, bench_config(m, a.block), {}};
      if (given)  // static global scale, e.g. from calibration: the same value the call computes
        v.cfg.global_scale = resolve_global_scale(d.x, a.dtype, a.rows, a.cols, v.cfg, "bench");
      v.out.codes.assign(copy_codes.size(), 0);
      v.out.scales.assign(copy_scales.size(), 0);
      vars.push_back(std::move(v));
    }
  }
  for (int t : tcounts) time_threads(run, t, vars, copy_codes, copy_scales, res);
  if (a.reference) time_reference(run, methods, res);
  fill_ratios(res, gs_modes);
  return res;
}

}  // namespace scalesweep::pipeline

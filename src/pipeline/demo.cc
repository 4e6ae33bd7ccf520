#include "scalesweep/pipeline/demo.h"

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>

#include "scalesweep/base/option_error.h"
#include "scalesweep/quant/evaluate.h"

namespace scalesweep::pipeline {

const char* const kDemoDistributions[3] = {"Gaussian", "Laplace", "Student-t(3)"};
const int kDemoBlocks[4] = {8, 16, 32, 64};
const std::vector<Method> kDemoMseRows = {Method::kAbsMax,    Method::kFourOverSix,
                                          Method::kSweepMse,  Method::kExhaustiveMse,
                                          Method::kOptFp8Mse, Method::kOptFp32};
const std::vector<Method> kDemoWmseRows = {Method::kAbsMax,     Method::kFourOverSix,
                                           Method::kSweepWmse,  Method::kExhaustiveWmse,
                                           Method::kOptFp8Wmse, Method::kOptFp32};

namespace {

// Portable fixed-seed samplers (std::*_distribution differ between standard libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() {  // (0, 1)
    return (static_cast<double>(g_() >> 11) + 0.5) * 0x1.0p-53;
  }
  double normal() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    const double u = uniform(), v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    spare_ = r * std::sin(2.0 * M_PI * v);
    have_ = true;
    return r * std::cos(2.0 * M_PI * v);
  }
  double laplace() {  // scale 1
    const double u = uniform() - 0.5;
    return u < 0 ? std::log(1.0 + 2.0 * u) : -std::log(1.0 - 2.0 * u);
  }
  double student_t3() {
    const double z = normal();
    double chi2 = 0;
    for (int i = 0; i < 3; ++i) {
      const double n = normal();
      chi2 += n * n;
    }
    return z / std::sqrt(chi2 / 3.0);
  }

 private:
  std::mt19937_64 g_;
  bool have_ = false;
  double spare_ = 0;
};

constexpr double (Rng::*kSamplers[])() = {&Rng::normal, &Rng::laplace, &Rng::student_t3};

}  // namespace

const DemoRun& DemoResult::run(size_t dist, int block, Method m, bool weighted) const {
  const bool w = m == Method::kOptFp32 && weighted;
  for (const DemoRun& r : runs) {
    if (r.dist == dist && r.block == block && r.method == m && r.weighted == w) return r;
  }
  throw std::out_of_range("demo: no such run");
}

DemoResult run_demo(const DemoRequest& a, const JobEvents& events) {
  check_max_block_scale(a.max_block_scale);
  check_threads(a.threads);
  for (const auto& [field, n] : {std::pair{"rows", a.rows}, std::pair{"cols", a.cols}})
    if (n <= 0 || n > (1 << 16)) throw OptionError(field, "must lie in 1..65536");
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t n = a.rows * a.cols;
  constexpr size_t kNumDists = std::size(kDemoDistributions);

  // Data: one tensor per distribution, one shared per-column importance.
  std::vector<std::vector<float>> data;
  for (size_t d = 0; d < kNumDists; ++d) {
    Rng rng(a.seed + 1000003 * d);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = static_cast<float>((rng.*kSamplers[d])());
    data.push_back(std::move(x));
  }
  std::vector<float> imp_data(static_cast<size_t>(a.cols));
  {
    Rng rng(a.seed + 77);
    for (auto& w : imp_data) w = static_cast<float>(std::exp(rng.normal()));
  }
  const Importance imp{ImportanceKind::kPerColumn, imp_data.data()};

  // The runs: every (distribution, block, method); opt-fp32 twice (unweighted, weighted).
  DemoResult res;
  for (size_t d = 0; d < kNumDists; ++d) {
    for (int b : kDemoBlocks) {
      for (Method m : kMethodNames.values()) {
        if (m == Method::kSweep) continue;     // custom window: not part of the figure
        if (method_uses_hessian(m)) continue;  // needs a calibrated Hessian
        res.runs.push_back({.dist = d, .block = b, .method = m});
        if (m == Method::kOptFp32)
          res.runs.push_back({.dist = d, .block = b, .method = m, .weighted = true});
      }
    }
  }
  std::map<std::pair<size_t, int>, std::vector<uint8_t>> exh_scales, sweep_scales;
  const auto total = static_cast<int64_t>(res.runs.size());
  int64_t done = 0;
  events.step("demo", "runs", 0, total);  // the job starts: its clock too
  for (DemoRun& k : res.runs) {
    QuantConfig cfg;
    cfg.block = k.block;
    cfg.selector.method = k.method;
    cfg.max_block_scale = a.max_block_scale;
    cfg.threads = a.threads;
    const TensorRef x = tensor_ref(data[k.dist].data(), a.rows, a.cols);
    // MSE methods ignore the importance; opt-fp32 uses it only in its weighted run. NWMSE
    // is always measured with it.
    const Importance run_imp = (k.method == Method::kOptFp32 && !k.weighted) ? Importance{} : imp;
    const MethodRun r = run_method(x, run_imp, cfg, kDemoDistributions[k.dist], imp);
    if (k.method == Method::kExhaustiveMse) exh_scales[{k.dist, k.block}] = r.q->scales;
    if (k.method == Method::kSweepMse) sweep_scales[{k.dist, k.block}] = r.q->scales;
    k.seconds = r.seconds;
    k.nmse = r.err.nmse;
    k.nwmse = r.err.nwmse;
    events.step("demo", "runs", ++done, total);
  }
  for (auto& [key, ex] : exh_scales) {
    const auto& sw = sweep_scales.at(key);
    int64_t eq = 0;
    for (size_t i = 0; i < ex.size(); ++i) eq += ex[i] == sw[i];
    res.sweep_match.push_back({key.first, key.second, eq, static_cast<int64_t>(ex.size())});
  }
  // Gaps to the opt-fp32 references of the same (distribution, block).
  for (DemoRun& k : res.runs) {
    OptFp32Refs opt;
    opt.plain.err.nmse = res.run(k.dist, k.block, Method::kOptFp32, false).nmse;
    opt.weighted.err.nwmse = res.run(k.dist, k.block, Method::kOptFp32, true).nwmse;
    ErrorMetrics err;
    err.nmse = k.nmse;
    err.nwmse = k.nwmse;
    const Gaps g = gaps_to_opt(err, opt, k.method, true);
    k.gap_nmse_pct = g.nmse_pct;
    k.gap_nwmse_pct = g.nwmse_pct;
  }
  res.seconds_total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return res;
}

}  // namespace scalesweep::pipeline

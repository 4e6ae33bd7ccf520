// gptq_bench: times blocked GPTQ (128-column lazy batches, dgemm) against the unblocked
// reference path (rank-1 dger per column) on one synthetic layer, and counts the packed bytes
// in which the two results differ. Was the `scalesweep gptq-bench` subcommand; a benchmark
// binary now, so the CLI does not call BLAS itself. --gptq-scales dynamic times the block
// scales chosen in the column loop (gptq/gptq.h); run it beside static to compare.
//   build/bench/gptq_bench [--rows 4096 --cols 4096 --tokens 8192 --method sweep-mse]
//     [--gptq-scales static|dynamic --gptq-importance hdiag|obs] [--threads T] [--repeat N]
//     [--skip-unblocked] [--json]
// The blocked path runs --repeat times; its wall and process CPU seconds are the minima (on a
// shared machine, OPENBLAS_NUM_THREADS=1 --threads 1 makes the CPU seconds the work done).
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/gptq/gptq.h"
#include "scalesweep/quant/quantize.h"

namespace {

using namespace scalesweep;

struct BenchArgs {
  int64_t rows = 4096, cols = 4096, tokens = 8192;
  std::string method = "sweep-mse";
  std::string scales{gptq::kScaleTimingNames.name(gptq::GptqConfig{}.scale_timing)};
  std::string importance{gptq::kDynamicImportanceNames.name(gptq::GptqConfig{}.importance)};
  int threads = 0, repeat = 1;
  bool json_out = false, skip_unblocked = false;
};

int run_bench(const BenchArgs& a) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(a.rows * a.cols));
  for (auto& v : w) v = 0.02f * nd(rng);
  // Correlated inputs X = Z A (A = I + noise/sqrt(K)) with per-channel scales.
  std::vector<double> x(static_cast<size_t>(a.tokens * a.cols)), z(x.size()),
      am(static_cast<size_t>(a.cols * a.cols));
  for (auto& v : z) v = nd(rng);
  for (auto& v : am) v = 0.3 * nd(rng) / std::sqrt(static_cast<double>(a.cols));
  for (int64_t j = 0; j < a.cols; ++j) am[static_cast<size_t>(j * a.cols + j)] += 1.0;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)a.tokens, (int)a.cols, (int)a.cols,
              1.0, z.data(), (int)a.cols, am.data(), (int)a.cols, 0.0, x.data(), (int)a.cols);
  std::vector<double> xtx(static_cast<size_t>(a.cols * a.cols), 0.0);
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)a.cols, (int)a.tokens, 1.0, x.data(),
              (int)a.cols, 0.0, xtx.data(), (int)a.cols);
  gptq::GptqConfig cfg;
  cfg.quant.selector.method = kMethodNames.parse(a.method);
  cfg.quant.threads = a.threads;
  cfg.scale_timing = gptq::kScaleTimingNames.parse(a.scales);
  cfg.importance = gptq::kDynamicImportanceNames.parse(a.importance);
  const std::string timing =
      a.scales + (cfg.scale_timing == gptq::ScaleTiming::kDynamic ? " " + a.importance : "");
  double cpu = 0;  // process CPU seconds of the last time_it
  auto time_it = [&](int block, QuantizedTensor* q) {
    gptq::GptqConfig c = cfg;
    c.block_size = block;
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    *q = gptq::gptq_quantize(w.data(), a.rows, a.cols, xtx.data(), a.tokens, c, "bench");
    cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  QuantizedTensor qb, qu;
  double tb = time_it(128, &qb), tb_cpu = cpu;
  for (int r = 1; r < a.repeat; ++r) {
    tb = std::min(tb, time_it(128, &qb));
    tb_cpu = std::min(tb_cpu, cpu);
  }
  double tu = 0;
  int64_t diff = -1;
  if (!a.skip_unblocked) {
    tu = time_it(0, &qu);
    diff = 0;
    for (size_t i = 0; i < qb.codes.size(); ++i) diff += qb.codes[i] != qu.codes[i];
  }
  if (a.json_out) {
    nlohmann::json j{{"rows", a.rows},
                     {"cols", a.cols},
                     {"tokens", a.tokens},
                     {"method", a.method},
                     {"gptq_scales", a.scales},
                     {"gptq_importance", a.importance},
                     {"blocked_s", tb},
                     {"blocked_cpu_s", tb_cpu},
                     {"repeat", a.repeat},
                     {"unblocked_s", tu},
                     {"speedup", tb > 0 ? tu / tb : 0},
                     {"differing_bytes", diff}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("GPTQ %lldx%lld (%s, %s scales, H from %lld tokens)\n", (long long)a.rows,
                (long long)a.cols, a.method.c_str(), timing.c_str(), (long long)a.tokens);
    std::printf("  blocked (128-column lazy batch, dgemm): %.3f s (CPU %.3f s; best of %d)\n", tb,
                tb_cpu, a.repeat);
    if (!a.skip_unblocked) {
      std::printf("  unblocked (rank-1 dger per column):     %.3f s\n", tu);
      std::printf("  speed-up %.2fx; packed bytes that differ: %lld of %zu\n", tu / tb,
                  (long long)diff, qb.codes.size());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time blocked GPTQ against the unblocked reference on one layer"};
  app.option_defaults()->always_capture_default();
  BenchArgs a;
  // Positive, and a dense Hessian / activation matrix that an int BLAS dimension can index.
  const auto dim = CLI::Range(int64_t{1}, int64_t{1} << 20);
  app.add_option("--rows", a.rows, "output channels")->check(dim);
  app.add_option("--cols", a.cols, "input channels")->check(dim);
  app.add_option("--tokens", a.tokens, "tokens behind the Hessian")->check(dim);
  app.add_option("--method", a.method, "block-scale selector");
  app.add_option("--gptq-scales", a.scales,
                 "block scales chosen before (static) or in (dynamic) the column loop");
  app.add_option("--gptq-importance", a.importance, "dynamic importance: hdiag or obs");
  app.add_option("--threads", a.threads, "threads of the scale selection (0: all cores)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--repeat", a.repeat, "runs of the blocked path (the fastest is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--skip-unblocked", a.skip_unblocked, "time the blocked path only");
  app.add_flag("--json", a.json_out, "print JSON");
  CLI11_PARSE(app, argc, argv);
  try {
    return run_bench(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gptq_bench: error: %s\n", e.what());
    return 1;
  }
}

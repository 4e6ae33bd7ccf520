// `scalesweep demo` (layer `pipeline`): the main job on a built-in default. Fixed-seed
// Gaussian, Laplace and Student-t(3) tensors ([rows, cols], 2^20 elements by default), every
// block-scale selector but the custom-window sweep, block sizes 8/16/32/64: NMSE and NWMSE
// with the gaps to the exact continuous optimum (opt-fp32), per distribution and block size.
//
// Global scale S = amax / (6 C) with C = max_block_scale (256: the paper's and SPEC's
// reference setting S = amax/1536) for every method. The importance for NWMSE is a fixed-seed
// per-column weight w_j = exp(z_j), z ~ N(0, 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "scalesweep/pipeline/events.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::pipeline {

// The distributions (in order) and block sizes of the demo.
extern const char* const kDemoDistributions[3];
extern const int kDemoBlocks[4];
// Rows of the two tables: the paper's Figure 1 (AbsMax, 4/6, ScaleSweep, FP8-rounded
// optimum), plus the exhaustive search and the continuous optimum itself.
extern const std::vector<Method> kDemoMseRows, kDemoWmseRows;

struct DemoRequest {
  int threads = 0;
  uint64_t seed = 20250101;
  float max_block_scale = 256.0f;
  int64_t rows = 1024, cols = 1024;
};

// One run: (distribution, block, method); opt-fp32 runs twice (weighted = with importance).
struct DemoRun {
  size_t dist = 0;  // index into kDemoDistributions
  int block = 16;
  Method method = Method::kAbsMax;
  bool weighted = false;  // only distinguishes the two opt-fp32 runs
  double nmse = 0, nwmse = 0, seconds = 0;
  double gap_nmse_pct = 0;   // to the unweighted opt-fp32 run (gaps_to_opt)
  double gap_nwmse_pct = 0;  // to the weighted opt-fp32 run
};

// How many blocks sweep-mse gives the exhaustive-mse scale, per (distribution, block).
struct DemoSweepMatch {
  size_t dist = 0;
  int block = 16;
  int64_t equal = 0, blocks = 0;
};

struct DemoResult {
  std::vector<DemoRun> runs;                // in run order (distribution, block, method)
  std::vector<DemoSweepMatch> sweep_match;  // ordered by (distribution, block)
  double seconds_total = 0;
  // The run of (dist, block, m); `weighted` picks between the two opt-fp32 runs.
  const DemoRun& run(size_t dist, int block, Method m, bool weighted) const;
};

// Validates (std::invalid_argument: 0 < C <= 448, threads >= 0, rows/cols in 1..65536) and
// runs every run; progress: the stage "demo", unit "runs", after each.
DemoResult run_demo(const DemoRequest& req, const JobEvents& events = {});

}  // namespace scalesweep::pipeline

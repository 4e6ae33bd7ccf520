// `scalesweep bench` (layer `pipeline`): CPU quantization throughput of every packed method on
// one fixed-seed Gaussian tensor, for 1 thread and all threads, measured in one run on the
// same data: elements/s, time relative to absmax, and absmax relative to a plain copy of the
// same bytes (read the input, write packed-output-sized bytes: one nibble per element, one
// byte per block). Every side writes into preallocated, pre-faulted output buffers
// (quantize_into() reusing one QuantizedTensor per method; the copy into its own two buffers),
// so the times are end to end quantize_into() calls (validation, input scan for the global
// scale unless the global scale is given, rows) against one streaming pass of the copy; the
// minimum over `repeat` rounds (round-robin over the methods).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/pipeline/events.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::pipeline {

// Whether each quantize_into() call computes its global scale (a scan of the input for its
// amax) or is given one (a static global scale, as activations calibrated offline), or both.
enum class GlobalScaleMode { kComputed, kGiven, kBoth };
inline constexpr auto kGlobalScaleModeNames =
    make_names<GlobalScaleMode>("global scale mode", {{GlobalScaleMode::kComputed, "computed"},
                                                      {GlobalScaleMode::kGiven, "given"},
                                                      {GlobalScaleMode::kBoth, "both"}});

struct BenchRequest {
  int64_t rows = 8192, cols = 8192;
  DType dtype = DType::kBF16;
  int threads = 0;  // the "all threads" count (0 = all cores); 1 is always measured
  int repeat = 3;   // runs per measurement, minimum kept
  int block = 16;
  std::vector<Method> methods;  // empty: every packed method; absmax is always included
  bool reference = false;       // also time the scalar reference path (1 thread, one run)
  GlobalScaleMode global_scale = GlobalScaleMode::kComputed;
};

struct BenchRow {  // one method at one thread count (and global-scale mode)
  std::string method;
  int threads = 1;
  double seconds = 0;
  bool reference = false;  // the scalar reference path
  bool given_gs = false;   // global scale given (precomputed) rather than computed by the call
  double elements_per_s = 0, time_vs_absmax = 0, time_vs_copy = 0;
  std::optional<double> speedup_vs_1_thread;  // at the "all threads" count only (> 1 thread)
};

struct BenchCopy {  // the copy baseline at one thread count
  int threads = 1;
  double seconds = 0, elements_per_s = 0;
  std::optional<double> absmax_time_vs_copy;           // global scale computed measured
  std::optional<double> absmax_given_gs_time_vs_copy;  // global scale given measured
  std::optional<double> speedup_vs_1_thread;           // at the "all threads" count only
};

struct BenchResult {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kBF16;
  int block = 0;
  std::string simd_target;
  int repeat = 0;
  GlobalScaleMode global_scale = GlobalScaleMode::kComputed;
  std::vector<int> thread_counts;  // {1} or {1, all}
  std::vector<BenchRow> results;   // per thread count: every method per mode; then reference
  std::vector<BenchCopy> copy;     // per thread count
  double copy_elements_per_s = 0;  // 1 thread
};

// Validates `req` (OptionError naming the field: rows/cols, repeat, threads, methods with
// opt-fp32, which has no packed output),
// builds the data and times every method. Progress: the stage "bench", unit "runs" (the timed
// runs).
BenchResult run_kernel_bench(const BenchRequest& req, const JobEvents& events = {});

}  // namespace scalesweep::pipeline

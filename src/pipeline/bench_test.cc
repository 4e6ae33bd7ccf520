// pipeline::run_kernel_bench on a tiny tensor: one row per method and thread count (and
// global-scale mode), ratios positive and consistent with the times, the optional fields set
// exactly where `bench --json` writes them, progress counting every timed run, bad requests
// rejected naming the option.
#include "scalesweep/pipeline/bench.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "base/test_util.h"
#include "pipeline/test_util.h"
#include "scalesweep/base/option_error.h"

namespace scalesweep::pipeline {
namespace {

BenchRequest tiny() {
  BenchRequest r;
  r.rows = 16;
  r.cols = 64;
  r.repeat = 1;
  r.threads = 2;
  r.methods = {Method::kSweepMse, Method::kFourOverSix};
  return r;
}

TEST(RunKernelBench, OneRowPerMethodAndThreadCountRatiosPositive) {
  BenchRequest req = tiny();
  scalesweep::testing::ProgressSteps progress;
  const BenchResult b = run_kernel_bench(req, testing::one_stage_events(progress, "bench", "runs"));
  EXPECT_EQ(b.rows, 16);
  EXPECT_EQ(b.cols, 64);
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_EQ(b.block, 16);
  EXPECT_EQ(b.repeat, 1);
  EXPECT_EQ(b.global_scale, GlobalScaleMode::kComputed);
  EXPECT_FALSE(b.simd_target.empty());
  ASSERT_EQ(b.thread_counts, (std::vector<int>{1, 2}));
  // absmax is always added, first.
  ASSERT_EQ(b.results.size(), 6u);
  std::set<std::pair<std::string, int>> keys;
  for (const auto& r : b.results) {
    keys.insert({r.method, r.threads});
    EXPECT_FALSE(r.reference);
    EXPECT_FALSE(r.given_gs);
    EXPECT_GT(r.seconds, 0);
    EXPECT_GT(r.elements_per_s, 0);
    EXPECT_GT(r.time_vs_absmax, 0);
    EXPECT_GT(r.time_vs_copy, 0);
    EXPECT_DOUBLE_EQ(r.elements_per_s, 16.0 * 64 / r.seconds);
    if (r.method == "absmax") {
      EXPECT_EQ(r.time_vs_absmax, 1.0);
    }
    EXPECT_EQ(r.speedup_vs_1_thread.has_value(), r.threads == 2);
    if (r.speedup_vs_1_thread) {
      EXPECT_GT(*r.speedup_vs_1_thread, 0);
    }
  }
  EXPECT_EQ(keys, (std::set<std::pair<std::string, int>>{{"absmax", 1},
                                                         {"absmax", 2},
                                                         {"sweep-mse", 1},
                                                         {"sweep-mse", 2},
                                                         {"4over6", 1},
                                                         {"4over6", 2}}));
  ASSERT_EQ(b.copy.size(), 2u);
  EXPECT_EQ(b.copy[0].threads, 1);
  EXPECT_EQ(b.copy[1].threads, 2);
  EXPECT_EQ(b.copy_elements_per_s, b.copy[0].elements_per_s);
  for (const auto& c : b.copy) {
    EXPECT_GT(c.elements_per_s, 0);
    ASSERT_TRUE(c.absmax_time_vs_copy.has_value());
    EXPECT_GT(*c.absmax_time_vs_copy, 0);
    EXPECT_FALSE(c.absmax_given_gs_time_vs_copy.has_value());
    EXPECT_EQ(c.speedup_vs_1_thread.has_value(), c.threads == 2);
  }
  // Every timed run: (copy + 3 methods) x 2 thread counts x 1 repeat.
  EXPECT_EQ(progress.total, 8);
  EXPECT_EQ(progress.last, progress.total);
  EXPECT_EQ(progress.calls, progress.total);
}

TEST(RunKernelBench, BothGlobalScaleModesAndReference) {
  BenchRequest req = tiny();
  req.threads = 1;
  req.dtype = DType::kF32;
  req.methods = {Method::kAbsMax};
  req.global_scale = GlobalScaleMode::kBoth;
  req.reference = true;
  const BenchResult b = run_kernel_bench(req);
  ASSERT_EQ(b.thread_counts, (std::vector<int>{1}));
  EXPECT_EQ(b.dtype, DType::kF32);
  std::set<std::tuple<std::string, bool, bool>> keys;
  for (const auto& r : b.results) {
    keys.insert({r.method, r.given_gs, r.reference});
    EXPECT_EQ(r.threads, 1);
    EXPECT_GT(r.time_vs_copy, 0);
    EXPECT_EQ(r.time_vs_absmax, 1.0);  // each absmax row is its own reference
    EXPECT_FALSE(r.speedup_vs_1_thread.has_value());
  }
  EXPECT_EQ(keys, (std::set<std::tuple<std::string, bool, bool>>{
                      {"absmax", false, false}, {"absmax", true, false}, {"absmax", false, true}}));
  ASSERT_EQ(b.copy.size(), 1u);
  EXPECT_TRUE(b.copy[0].absmax_time_vs_copy.has_value());
  EXPECT_TRUE(b.copy[0].absmax_given_gs_time_vs_copy.has_value());
  EXPECT_FALSE(b.copy[0].speedup_vs_1_thread.has_value());
}

void expect_rejected(BenchRequest req, const std::string& field, const std::string& msg) {
  try {
    run_kernel_bench(req);
    ADD_FAILURE() << "no exception for " << msg;
  } catch (const OptionError& e) {
    EXPECT_EQ(e.field(), field);
    EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
  }
}

TEST(RunKernelBench, BadRequestsNameTheField) {
  BenchRequest r = tiny();
  r.cols = 0;
  expect_rejected(r, "cols", "must be positive");
  r = tiny();
  r.repeat = 0;
  expect_rejected(r, "repeat", "must be >= 1");
  r = tiny();
  r.threads = -1;
  expect_rejected(r, "threads", "must be >= 0");
  r = tiny();
  r.methods = {Method::kOptFp32};
  expect_rejected(r, "methods", "opt-fp32");
}

}  // namespace
}  // namespace scalesweep::pipeline

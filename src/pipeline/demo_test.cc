#include "scalesweep/pipeline/demo.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "base/test_util.h"
#include "pipeline/test_util.h"

namespace scalesweep::pipeline {
namespace {

DemoRequest small() {
  DemoRequest r;
  r.rows = 8;
  r.cols = 128;
  r.threads = 1;
  return r;
}

TEST(Demo, RunsEveryMethodDistributionAndBlock) {
  scalesweep::testing::ProgressSteps progress;
  const DemoResult r = run_demo(small(), testing::one_stage_events(progress, "demo", "runs"));
  // 3 distributions x 4 blocks x (every method but sweep and the two block-Hessian ones,
  // opt-fp32 twice).
  const size_t per = kMethodNames.values().size() - 2;
  EXPECT_EQ(r.runs.size(), 3 * 4 * per);
  EXPECT_EQ(progress.last, static_cast<int64_t>(r.runs.size()));
  EXPECT_EQ(progress.total, progress.last);
  ASSERT_EQ(r.sweep_match.size(), 12u);
  for (const DemoSweepMatch& m : r.sweep_match) {
    EXPECT_EQ(m.blocks, 8 * (128 / m.block));
    EXPECT_LE(m.equal, m.blocks);
  }
  for (size_t d = 0; d < 3; ++d) {
    for (int b : kDemoBlocks) {
      EXPECT_EQ(r.run(d, b, Method::kOptFp32, false).gap_nmse_pct, 0.0);
      EXPECT_EQ(r.run(d, b, Method::kOptFp32, true).gap_nwmse_pct, 0.0);
      const DemoRun& a = r.run(d, b, Method::kAbsMax, false);
      EXPECT_GT(a.gap_nmse_pct, 0.0);
      EXPECT_GE(a.gap_nmse_pct, r.run(d, b, Method::kExhaustiveMse, false).gap_nmse_pct);
      EXPECT_GE(r.run(d, b, Method::kSweepWmse, true).gap_nwmse_pct, -1e-9);
    }
  }
}

TEST(Demo, FixedSeedIsDeterministic) {
  const DemoResult a = run_demo(small()), b = run_demo(small());
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (size_t i = 0; i < a.runs.size(); ++i) {
    EXPECT_EQ(a.runs[i].nmse, b.runs[i].nmse);
    EXPECT_EQ(a.runs[i].nwmse, b.runs[i].nwmse);
  }
  DemoRequest other = small();
  other.seed = 1;
  EXPECT_NE(run_demo(other).runs[0].nmse, a.runs[0].nmse);
}

TEST(Demo, RejectsBadRequests) {
  DemoRequest r = small();
  r.max_block_scale = 500;
  EXPECT_THROW(run_demo(r), std::invalid_argument);
  r = small();
  r.threads = -1;
  EXPECT_THROW(run_demo(r), std::invalid_argument);
  r = small();
  r.rows = 0;
  EXPECT_THROW(run_demo(r), std::invalid_argument);
  EXPECT_THROW(run_demo(small()).run(0, 16, Method::kSweep, false), std::out_of_range);
}

}  // namespace
}  // namespace scalesweep::pipeline

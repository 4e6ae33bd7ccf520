// Test helpers of the pipeline layer's tests (header-only, gtest), on top of
// src/base/test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "base/test_util.h"
#include "scalesweep/pipeline/events.h"

namespace scalesweep::pipeline::testing {

// Events whose progress goes to `steps` (its order checks) and must always be the stage
// `stage` counted in `unit`.
inline JobEvents one_stage_events(scalesweep::testing::ProgressSteps& steps,
                                  const std::string& stage, const std::string& unit) {
  JobEvents ev;
  ev.progress = [f = steps.fn(), want = stage + "/" + unit](const std::string& s, const char* u,
                                                            int64_t done, int64_t total) {
    EXPECT_EQ(s + "/" + u, want);
    f(done, total);
  };
  return ev;
}

}  // namespace scalesweep::pipeline::testing

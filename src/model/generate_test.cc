// The generation options' checks and the context a run uses (the loop itself is covered end to
// end by python/tests/test_model_cli.py: the known greedy story and seeded sampling).
#include "scalesweep/model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace scalesweep::model {
namespace {

TEST(Generate, OptionChecks) {
  GenerateOptions o;
  EXPECT_NO_THROW(check_generate_options(o));
  o.temperature = 0.0f;  // greedy
  EXPECT_NO_THROW(check_generate_options(o));
  for (float t : {-0.5f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    o.temperature = t;
    EXPECT_THROW(check_generate_options(o), std::invalid_argument) << t;
  }
  o.temperature = 1.0f;
  for (float p : {0.0f, -0.1f, 1.5f, std::nanf("")}) {
    o.top_p = p;
    EXPECT_THROW(check_generate_options(o), std::invalid_argument) << p;
  }
  o.top_p = 1.0f;
  EXPECT_NO_THROW(check_generate_options(o));
}

TEST(Generate, ContextIsPromptPlusStepsCappedAtMaxSeqLen) {
  EXPECT_EQ(generation_context(5, 10, 256), 15);
  EXPECT_EQ(generation_context(200, 100, 256), 256);
  EXPECT_EQ(generation_context(3, 0, 256), 3);
  EXPECT_EQ(generation_context(1, 1 << 24, 1 << 30), 1 + (1 << 24));
}

}  // namespace
}  // namespace scalesweep::model

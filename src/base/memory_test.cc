#include "scalesweep/base/memory.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "scalesweep/base/option_error.h"

namespace scalesweep {
namespace {

// Sets SCALESWEEP_MEMORY_LIMIT for the scope of one test.
struct LimitEnv {
  explicit LimitEnv(const char* v) { setenv(kMemoryLimitEnv, v, 1); }
  ~LimitEnv() { unsetenv(kMemoryLimitEnv); }
};

TEST(Memory, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(int64_t{730} << 20), "730 MiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 29), "1.5 GiB");
}

TEST(Memory, AvailableIsKnownOnLinuxAndCappedByTheLimit) {
  unsetenv(kMemoryLimitEnv);
  const int64_t free = available_memory_bytes();
  ASSERT_GT(free, 0) << "/proc/meminfo should be readable here";
  {
    // A cap far above what is free changes nothing; a cap below the resident set leaves 0.
    LimitEnv e("1TiB");
    EXPECT_LE(available_memory_bytes(), free + (int64_t{1} << 30));
  }
  {
    LimitEnv e("1");
    EXPECT_EQ(available_memory_bytes(), 0);
  }
  {
    LimitEnv e("64GiB");
    EXPECT_GT(available_memory_bytes(), 0);
  }
  for (const char* bad : {"lots", "8X", "-1", "1GG"}) {
    LimitEnv e(bad);
    EXPECT_THROW(available_memory_bytes(), std::invalid_argument) << bad;
  }
}

TEST(Memory, CheckFitsNamesTheFieldTheEstimateAndWhatIsAvailable) {
  LimitEnv e("1");
  try {
    check_fits("ctx", "perplexity with a context of 512 tokens", int64_t{3} << 30,
               "KV cache 2 GiB");
    FAIL() << "no refusal";
  } catch (const OptionError& err) {
    EXPECT_EQ(err.field(), "ctx");
    EXPECT_EQ(std::string(err.what()),
              "perplexity with a context of 512 tokens needs about 3.0 GiB (KV cache 2 GiB) but "
              "about 0 B is available; a smaller value reduces it");
  }
  unsetenv(kMemoryLimitEnv);
  EXPECT_NO_THROW(check_fits("ctx", "x", 1024, "y"));
}

}  // namespace
}  // namespace scalesweep

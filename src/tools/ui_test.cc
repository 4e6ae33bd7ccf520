// ProgressBar on a fake clock: what it prints, when, and that its rate is count / elapsed.
#include "tools/ui.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace scalesweep::tools {
namespace {

struct Fake {
  double t = 100;  // the clock does not start at 0
  std::vector<std::string> out;
  ProgressOptions opts(bool tty, int64_t step = 0, double interval = 3) {
    ProgressOptions o;
    o.tty = tty;
    o.line_step = step;
    o.min_line_interval_s = interval;
    o.clock = [this] { return t; };
    o.write = [this](const std::string& s) { out.push_back(s); };
    return o;
  }
};

TEST(ProgressBar, LinesWithoutTerminalPerStepRateFromElapsedTime) {
  Fake f;
  {
    ProgressBar bar("quantize", 35, "linear", f.opts(false, 7, 0));
    for (int d = 1; d <= 35; ++d) {
      f.t += 0.5;  // 2 linears per second
      bar.update(d);
    }
    EXPECT_DOUBLE_EQ(bar.elapsed(), 17.5);
  }                             // the destructor prints the final line
  ASSERT_EQ(f.out.size(), 5u);  // layers 1..4, then the final one
  EXPECT_EQ(f.out[0], "quantize: 7/35 linear (20%), 2.0 linear/s, elapsed 00:04, ETA 00:14\n");
  EXPECT_EQ(f.out[3], "quantize: 28/35 linear (80%), 2.0 linear/s, elapsed 00:14, ETA 00:04\n");
  EXPECT_EQ(f.out[4], "quantize: 35/35 linear (100%), 2.0 linear/s, elapsed 00:18, done\n");
}

TEST(ProgressBar, LinesAreRateLimited) {
  Fake f;
  ProgressBar bar("ppl", 1000, "tok", f.opts(false, 0, 3));  // step: 1% = 10
  for (int d = 10; d <= 990; d += 10) {
    f.t += 0.25;  // a percent every 0.25 s: at most one line every 3 s
    bar.update(d);
  }
  // t = 100.25 .. 124.75: the first percent at once, then 103.25, 106.25, ... 124.25.
  EXPECT_EQ(f.out.size(), 9u);
  bar.finish();
  bar.finish();  // once
  EXPECT_EQ(f.out.size(), 10u);
}

TEST(ProgressBar, FirstUpdateDoesNotGuessTheRate) {
  // One window taking 4 s: the rate is count / 4 s, not count / (time since the callback).
  Fake f;
  {
    ProgressBar bar("ppl", 2000, "tok", f.opts(false, 0, 0));
    f.t += 4;
    bar.update(2000);
  }
  ASSERT_EQ(f.out.size(), 1u);
  EXPECT_EQ(f.out[0], "ppl: 2000/2000 tok (100%), 500.0 tok/s, elapsed 00:04, done\n");
}

TEST(ProgressBar, StartGivenForAStageAnnouncedLate) {
  Fake f;
  ProgressOptions o = f.opts(false, 0, 0);
  o.start = f.t;  // the stage began now; its bar is made at its first callback, 2 s later
  f.t += 2;
  ProgressBar bar("RTN absmax WA", 10, "it", o);
  bar.update(1);
  ASSERT_EQ(f.out.size(), 1u);
  EXPECT_EQ(f.out[0], "RTN absmax WA: 1/10 it (10%), 0.5 it/s, elapsed 00:02, ETA 00:18\n");
}

TEST(ProgressBar, TerminalRedrawsInPlace) {
  Fake f;
  {
    ProgressBar bar("calibrate", 4, "seq", f.opts(true));
    f.t += 1;
    bar.update(1);
    f.t += 0.05;
    bar.update(2);  // within 0.1 s of the last draw: skipped
    f.t += 1;
    bar.update(3);
    f.t += 1;
    bar.update(4);
  }
  ASSERT_EQ(f.out.size(), 4u);  // 1, 3, 4 and the final
  EXPECT_EQ(f.out[0].substr(0, 11), "\rcalibrate ");
  EXPECT_NE(f.out[0].find("1/4 seq  1.0 seq/s  ETA 00:03"), std::string::npos) << f.out[0];
  EXPECT_NE(f.out[3].find("4/4 seq  1.3 seq/s  elapsed 00:03"), std::string::npos) << f.out[3];
  EXPECT_EQ(f.out[3].back(), '\n');
}

TEST(ProgressBar, NothingPrintedWithoutUpdates) {
  Fake f;
  { ProgressBar bar("calibrate", 128, "seq", f.opts(false)); }
  { ProgressBar bar("calibrate", 128, "seq", f.opts(true)); }
  EXPECT_TRUE(f.out.empty());
}

}  // namespace
}  // namespace scalesweep::tools

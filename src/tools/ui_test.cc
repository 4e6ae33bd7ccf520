// ProgressBar on a fake clock: what it prints, when, and that its rate is count / elapsed.
#include "tools/ui.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
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
  // A bar of `total` `unit`s updated at each (seconds later, count) in turn, then destroyed
  // (the destructor prints its final line).
  void run(const std::string& label, int64_t total, const std::string& unit,
           const ProgressOptions& o, const std::vector<std::pair<double, int64_t>>& updates) {
    ProgressBar bar(label, total, unit, o);
    for (const auto& [dt, done] : updates) {
      t += dt;
      bar.update(done);
    }
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
  f.run("ppl", 2000, "tok", f.opts(false, 0, 0), {{4, 2000}});
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
  EXPECT_EQ(f.out[0], "RTN absmax WA: 1/10 it (10%), 2.0 s/it, elapsed 00:02, ETA 00:18\n");
}

TEST(ProgressBar, TerminalRedrawsInPlace) {
  Fake f;
  // The update 0.05 s after the first is within 0.1 s of the last draw: skipped.
  f.run("calibrate", 4, "seq", f.opts(true), {{1, 1}, {0.05, 2}, {1, 3}, {1, 4}});
  ASSERT_EQ(f.out.size(), 4u);  // 1, 3, 4 and the final
  EXPECT_EQ(f.out[0].substr(0, 11), "\rcalibrate ");
  EXPECT_NE(f.out[0].find("1/4 seq  1.0 seq/s  ETA 00:03"), std::string::npos) << f.out[0];
  EXPECT_NE(f.out[3].find("4/4 seq  1.3 seq/s  elapsed 00:03"), std::string::npos) << f.out[3];
  EXPECT_EQ(f.out[3].back(), '\n');
  // A slow step on a terminal: seconds per unit, not "0.0 linear/s".
  Fake g;
  g.run("quantize", 196, "linear", g.opts(true), {{22.5, 1}});
  EXPECT_NE(g.out[0].find("1/196 linear  22.5 s/linear  ETA 1:13:08"), std::string::npos)
      << g.out[0];
}

TEST(ProgressBar, AnUnfinishedCountEndsStoppedNotDone) {
  // A job that fails at 864 of 1024 (its bar finished as the stack unwinds) does not print
  // "done", on a terminal or without one.
  Fake f;
  f.run("calibrate", 1024, "seq", f.opts(false, 0, 0), {{2, 864}});
  ASSERT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.out[1], "calibrate: 864/1024 seq (84%), 432.0 seq/s, elapsed 00:02, stopped\n");
  Fake g;
  g.run("calibrate", 4, "seq", g.opts(true), {{1, 3}});
  ASSERT_EQ(g.out.size(), 2u);
  EXPECT_NE(g.out[1].find("3/4 seq  3.0 seq/s  elapsed 00:01, stopped"), std::string::npos)
      << g.out[1];
  EXPECT_EQ(g.out[1].back(), '\n');
}

TEST(ProgressBar, NoRateBeforeADuration) {
  // A bar whose first report comes within microseconds of its start (a stage announced late
  // without its start, or a very fast first unit) prints no rate and no ETA.
  Fake f;
  ProgressBar bar("demo", 120, "runs", f.opts(false, 1, 0));
  f.t += 5e-7;
  bar.update(1);
  f.t += 2;
  bar.update(2);
  ASSERT_EQ(f.out.size(), 2u);
  EXPECT_EQ(f.out[0], "demo: 1/120 runs (1%), -- runs/s, elapsed 00:00, ETA --:--\n");
  EXPECT_EQ(f.out[1], "demo: 2/120 runs (2%), 1.0 runs/s, elapsed 00:02, ETA 01:58\n");
}

TEST(StageBars, EachStageCountsFromWhereThePreviousOneEnded) {
  // The quantize job as the CLI sees it: created, then 20 s of loading, then "calibrate"
  // reports after its first sequence (4 s each), then "quantize" after its first linear (3 s
  // each). Every first line counts the unit before it, and the elapsed times add up to the
  // wall time.
  Fake f;
  const double t0 = f.t;
  ProgressOptions o = f.opts(false, 0, 0);
  {
    StageBars bars(o);
    bars.set_line_step("quantize", 7);
    f.t += 20 + 4;  // load, then the first calibration sequence
    bars.report("calibrate", "seq", 1, 2);
    f.t += 4;
    bars.report("calibrate", "seq", 2, 2);
    f.t += 3;
    bars.report("quantize", "linear", 1, 14);
    for (int d = 2; d <= 14; ++d) {
      f.t += 3;
      bars.report("quantize", "linear", d, 14);
    }
  }
  ASSERT_EQ(f.out.size(), 4u) << f.out.size();  // quantize: a line per 7 linears, then done
  EXPECT_EQ(f.out[0], "calibrate: 1/2 seq (50%), 24.0 s/seq, elapsed 00:24, ETA 00:24\n");
  EXPECT_EQ(f.out[1], "calibrate: 2/2 seq (100%), 14.0 s/seq, elapsed 00:28, done\n");
  EXPECT_EQ(f.out[2], "quantize: 7/14 linear (50%), 3.0 s/linear, elapsed 00:21, ETA 00:21\n");
  EXPECT_EQ(f.out[3], "quantize: 14/14 linear (100%), 3.0 s/linear, elapsed 00:42, done\n");
  EXPECT_DOUBLE_EQ(f.t - t0, 28 + 42);  // 00:28 + 00:42: the stages' elapsed times add up
}

TEST(ProgressBar, NothingPrintedWithoutUpdates) {
  Fake f;
  { ProgressBar bar("calibrate", 128, "seq", f.opts(false)); }
  { ProgressBar bar("calibrate", 128, "seq", f.opts(true)); }
  EXPECT_TRUE(f.out.empty());
}

}  // namespace
}  // namespace scalesweep::tools

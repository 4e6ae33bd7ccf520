// Terminal output helpers for the CLI: a progress bar (rate and ETA; in place on a terminal,
// whole lines otherwise)
// and a plain-text table whose columns line up.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace scalesweep::tools {

// Options of a ProgressBar (defaults: the real clock and stderr; tests pass a fake clock and
// a sink).
struct ProgressOptions {
  // Terminal: one line redrawn in place (\r) at most ~10 times/s. Otherwise whole lines
  // (logs, pipes): one when `done` crosses a multiple of line_step (0: 1% of the total),
  // at most one per min_line_interval_s, and the final one.
  bool tty = false;
  int64_t line_step = 0;
  double min_line_interval_s = 3;
  std::function<double()> clock;  // seconds; default progress_clock()
  // When the work began on that clock (default: construction), for a bar made after its
  // first unit of work finished (a stage announced by its first callback).
  std::optional<double> start;
  std::function<void(const std::string&)> write;  // default: stderr, flushed
};

// Rate and ETA come from wall time elapsed since construction (the bar is made where the
// work starts) and the counts given to update(): the same clock and counts a summary that
// divides the final count by elapsed() reports.
// The default clock of ProgressBar: seconds of std::chrono::steady_clock.
double progress_clock();
// The options the plain constructor uses: tty when stderr is a terminal (or `force`),
// min_line_interval_s from SCALESWEEP_PROGRESS_INTERVAL (seconds) when set.
ProgressOptions progress_options(bool force = false, int64_t line_step = 0);

class ProgressBar {
 public:
  // A terminal on stderr (or `force`) draws in place; without one, lines as above with
  // min_line_interval_s from SCALESWEEP_PROGRESS_INTERVAL (seconds) when set.
  ProgressBar(std::string label, int64_t total, std::string unit = "it", bool force = false,
              int64_t line_step = 0);
  ProgressBar(std::string label, int64_t total, std::string unit, ProgressOptions opt);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  void update(int64_t done);
  void finish();           // the final line (only after at least one update)
  double elapsed() const;  // seconds since construction, on the bar's clock

 private:
  std::string render(bool final) const;
  void emit(bool final);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool updated_ = false, finished_ = false;
  ProgressOptions opt_;
  double start_ = 0, last_emit_ = -1e300;
  int64_t last_step_ = 0;  // line mode: done / line_step at the last line
};

// The progress of a job whose stages report through pipeline::JobEvents::progress
// (tools/options.h cli_events): a stage's first report comes after its
// first unit of work, so its bar, made then, starts its clock where the previous stage last
// reported, and the first stage's where this object was made (just before the job). The first
// line's rate and elapsed therefore count every unit from the start. One bar at a time; a
// stage's bar is finished when the next stage reports or at finish().
class StageBars {
 public:
  // base: the options of every bar (its start is overwritten per stage); line_step per stage
  // name (the lines without a terminal; 0 or absent: 1 % of the total).
  explicit StageBars(ProgressOptions base = progress_options());
  ~StageBars();
  StageBars(const StageBars&) = delete;
  StageBars& operator=(const StageBars&) = delete;
  void set_line_step(const std::string& stage, int64_t step);
  void report(const std::string& stage, const char* unit, int64_t done, int64_t total);
  void finish();

 private:
  ProgressOptions base_;
  std::vector<std::pair<std::string, int64_t>> steps_;
  std::unique_ptr<ProgressBar> bar_;
  std::string stage_;
  double last_tick_ = 0;
};

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void add_separator() { rows_.push_back({}); }
  std::string render() const;  // right-aligns cells that look numeric
  void print() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// One "note: <text>" line on stderr, flushed: the one form of a pipeline note (every command
// passes it as the pipeline's note sink).
void print_note(const std::string& text);

}  // namespace scalesweep::tools

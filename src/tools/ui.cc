#include "tools/ui.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace scalesweep::tools {

double progress_clock() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProgressOptions progress_options(bool force, int64_t line_step) {
  ProgressOptions o;
  o.tty = force || isatty(STDERR_FILENO);
  o.line_step = line_step;
  if (const char* e = std::getenv("SCALESWEEP_PROGRESS_INTERVAL")) {
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    if (end != e && *end == '\0' && v >= 0) o.min_line_interval_s = v;
  }
  return o;
}

namespace {

std::string fmt_secs(double s) {
  if (s < 0 || s > 1e7) return "--:--";
  int t = static_cast<int>(s + 0.5);
  if (t >= 3600) return strf("%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  return strf("%02d:%02d", t / 60, t % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, bool force,
                         int64_t line_step)
    : ProgressBar(std::move(label), total, std::move(unit), progress_options(force, line_step)) {}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, ProgressOptions opt)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), opt_(std::move(opt)) {
  if (!opt_.clock) opt_.clock = progress_clock;
  if (!opt_.write)
    opt_.write = [](const std::string& s) {
      std::fputs(s.c_str(), stderr);
      std::fflush(stderr);
    };
  if (opt_.line_step <= 0) opt_.line_step = std::max<int64_t>(1, total_ / 100);
  start_ = opt_.start ? *opt_.start : opt_.clock();
}

ProgressBar::~ProgressBar() { finish(); }

double ProgressBar::elapsed() const { return opt_.clock() - start_; }

void ProgressBar::update(int64_t done) {
  done_ = done;
  updated_ = true;
  if (finished_) return;
  const double now = opt_.clock();
  if (opt_.tty) {
    if (now - last_emit_ < 0.1 && done_ < total_) return;
  } else {
    const int64_t step = done_ / opt_.line_step;
    if (step == last_step_ || now - last_emit_ < opt_.min_line_interval_s || done_ >= total_)
      return;  // the last line is finish()'s
    last_step_ = step;
  }
  last_emit_ = now;
  emit(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (updated_) emit(true);
}

std::string ProgressBar::render(bool final) const {
  const double el = elapsed();
  const double frac = total_ > 0 ? std::min(1.0, double(done_) / double(total_)) : 0.0;
  // No rate before a duration: under 1 ms of elapsed time (or with nothing done) the rate and
  // the ETA print as unknown rather than as a ratio of a few microseconds.
  const bool timed = el >= 0.001 && done_ > 0;
  const double rate = timed ? done_ / el : 0.0;
  const double eta = timed ? (total_ - done_) / rate : -1;
  // Slow work reads as seconds per unit, as tqdm does ("24.3 s/linear"): a rate printed with
  // one decimal would read "0.0 linear/s" for a step that takes more than 20 seconds. From
  // 0.95 up the rate prints as "1.0" or more, so it stays a rate.
  const std::string rate_s = !timed         ? "-- " + unit_ + "/s"
                             : rate >= 0.95 ? strf("%.1f %s/s", rate, unit_.c_str())
                                            : strf("%.1f s/%s", 1.0 / rate, unit_.c_str());
  const long long d = done_, t = total_;
  // A final line before the count is complete (the job failed or was interrupted, and the
  // bar is finished as it unwinds) says so instead of "done".
  const bool complete = done_ >= total_;
  if (opt_.tty) {
    const int width = 30;
    std::string bar(static_cast<size_t>(frac * width), '#');
    bar.resize(width, '.');
    return strf("\r%s [%s] %3.0f%% %lld/%lld %s  %s  %s %s%s\033[K%s", label_.c_str(), bar.c_str(),
                frac * 100, d, t, unit_.c_str(), rate_s.c_str(), final ? "elapsed" : "ETA",
                fmt_secs(final ? el : eta).c_str(), final && !complete ? ", stopped" : "",
                final ? "\n" : "");
  }
  return strf("%s: %lld/%lld %s (%.0f%%), %s, elapsed %s%s\n", label_.c_str(), d, t, unit_.c_str(),
              frac * 100, rate_s.c_str(), fmt_secs(el).c_str(),
              final ? (complete ? ", done" : ", stopped") : (", ETA " + fmt_secs(eta)).c_str());
}

void ProgressBar::emit(bool final) { opt_.write(render(final)); }

StageBars::StageBars(ProgressOptions base) : base_(std::move(base)) {
  if (!base_.clock) base_.clock = progress_clock;
  last_tick_ = base_.clock();
}

StageBars::~StageBars() { finish(); }

void StageBars::set_line_step(const std::string& stage, int64_t step) {
  steps_.emplace_back(stage, step);
}

void StageBars::report(const std::string& stage, const char* unit, int64_t done, int64_t total) {
  if (!bar_ || stage != stage_) {
    if (bar_) bar_->finish();
    ProgressOptions o = base_;
    o.start = last_tick_;
    for (const auto& [name, step] : steps_)
      if (name == stage) o.line_step = step;
    bar_ = std::make_unique<ProgressBar>(stage, total, unit, o);
    stage_ = stage;
  }
  bar_->update(done);
  if (done >= total) bar_->finish();  // the stage's final line, at its own end
  last_tick_ = base_.clock();
}

void StageBars::finish() {
  if (bar_) bar_->finish();
}

static bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end && (*end == '\0' || *end == '%' || *end == 'x');
}

std::string Table::render() const {
  std::vector<size_t> w(header_.size(), 0);
  for (size_t i = 0; i < header_.size(); ++i) w[i] = header_[i].size();
  for (auto& r : rows_)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string c = i < r.size() ? r[i] : "";
      const std::string pad(w[i] - c.size(), ' ');
      out += (i ? "  " : "") + (looks_numeric(c) ? pad + c : c + pad);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header_);
  size_t total = 0;
  for (auto x : w) total += x + 2;
  const std::string rule(total - 2, '-');
  out += rule + "\n";
  for (auto& r : rows_) out += r.empty() ? rule + "\n" : line(r);
  return out;
}

void Table::print() const { std::fputs(render().c_str(), stdout); }

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::string s;
  if (n < static_cast<int>(sizeof buf)) {
    s = buf;
  } else {
    s.resize(n + 1);
    std::vsnprintf(s.data(), n + 1, fmt, ap2);
    s.resize(n);
  }
  va_end(ap2);
  return s;
}

void print_note(const std::string& text) {
  std::fprintf(stderr, "note: %s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace scalesweep::tools

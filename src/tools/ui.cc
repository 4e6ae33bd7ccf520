#include "tools/ui.h"

#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace scalesweep::tools {

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, bool force)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(force || isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t done) {
  done_ = done;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

static std::string fmt_secs(double s) {
  if (s < 0 || s > 1e7) return "--:--";
  int t = static_cast<int>(s + 0.5);
  if (t >= 3600) return strf("%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  return strf("%02d:%02d", t / 60, t % 60);
}

void ProgressBar::draw(bool final) {
  const double el =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_ > 0 ? std::min(1.0, double(done_) / double(total_)) : 0.0;
  const int width = 30;
  const int fill = static_cast<int>(frac * width);
  std::string bar(fill, '#');
  bar.resize(width, '.');
  const double rate = el > 0 ? done_ / el : 0.0;
  const double eta = rate > 0 ? (total_ - done_) / rate : -1;
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %lld/%lld %s  %.1f %s/s  %s %s\033[K", label_.c_str(),
               bar.c_str(), frac * 100, static_cast<long long>(done_),
               static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str(),
               final ? "elapsed" : "ETA", fmt_secs(final ? el : eta).c_str());
  if (final) std::fputc('\n', stderr);
  std::fflush(stderr);
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

}  // namespace scalesweep::tools

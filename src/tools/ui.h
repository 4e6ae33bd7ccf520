// Terminal output helpers for the CLI: a progress bar (rate and ETA, only on a terminal)
// and a plain-text table whose columns line up.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace scalesweep::tools {

class ProgressBar {
 public:
  // Draws to stderr only when stderr is a terminal (or force is set), at most ~10 times/s.
  ProgressBar(std::string label, int64_t total, std::string unit = "it", bool force = false);
  ~ProgressBar();
  void update(int64_t done);
  void finish();

 private:
  void draw(bool final);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
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

}  // namespace scalesweep::tools

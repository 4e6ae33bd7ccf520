// Byte counts (include/scalesweep/base/bytes.h).
#include "scalesweep/base/bytes.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace scalesweep {

uint64_t parse_byte_size(const std::string& s, const std::string& what) {
  auto bad = [&]() {
    return std::invalid_argument(what + " '" + s +
                                 "': expected a size such as 5GB, 500MB, 2GiB or a number of "
                                 "bytes (> 0)");
  };
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  const size_t num_begin = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string num = s.substr(num_begin, i - num_begin);
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::string unit;
  for (; i < s.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) break;
    unit.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(s[i]))));
  }
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (num.find_first_of("0123456789") == std::string::npos || i != s.size() ||
      std::count(num.begin(), num.end(), '.') > 1 || num.size() > 30)
    throw bad();
  double mult = 0;
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"KB", 1e3},
                                                  {"MB", 1e6},
                                                  {"GB", 1e9},
                                                  {"TB", 1e12},
                                                  {"KIB", 1024.0},
                                                  {"MIB", 1048576.0},
                                                  {"GIB", 1073741824.0},
                                                  {"TIB", 1099511627776.0}};
  for (const auto& [u, m] : units)
    if (unit == u) mult = m;
  if (mult == 0) throw bad();
  const double v = std::stod(num) * mult;
  if (!(v >= 1) || v > 1.8e19) throw bad();
  return static_cast<uint64_t>(v);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, v < 10 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

}  // namespace scalesweep

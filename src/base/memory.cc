// Memory the process may still use (include/scalesweep/base/memory.h).
#include "scalesweep/base/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "scalesweep/base/option_error.h"

namespace scalesweep {
namespace {

// A byte count with an optional K/M/G/T suffix (powers of 1024); -1 when malformed.
int64_t parse_size(const std::string& s) {
  if (s.empty()) return -1;
  size_t used = 0;
  long double v;
  try {
    v = std::stold(s, &used);
  } catch (const std::exception&) {
    return -1;
  }
  std::string rest = s.substr(used);
  if (!rest.empty() && (rest.back() == 'B' || rest.back() == 'b')) rest.pop_back();
  if (!rest.empty() && (rest.back() == 'i')) rest.pop_back();
  long double mul = 1;
  if (rest.size() == 1) {
    const std::string units = "KMGT";
    const size_t k = units.find(static_cast<char>(std::toupper(rest[0])));
    if (k == std::string::npos) return -1;
    for (size_t i = 0; i <= k; ++i) mul *= 1024;
  } else if (!rest.empty()) {
    return -1;
  }
  const long double b = v * mul;
  if (!(b >= 0) || b > static_cast<long double>(std::numeric_limits<int64_t>::max())) return -1;
  return static_cast<int64_t>(b);
}

// A number from a one-line file ("max" and unreadable: -1).
int64_t read_number(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  return parse_size(s);
}

int64_t meminfo_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

int64_t cgroup_left() {
  const int64_t max2 = read_number("/sys/fs/cgroup/memory.max");
  if (max2 >= 0) {
    const int64_t cur = read_number("/sys/fs/cgroup/memory.current");
    return cur >= 0 ? std::max<int64_t>(0, max2 - cur) : max2;
  }
  const int64_t max1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  // v1 reports "no limit" as a huge number.
  if (max1 >= 0 && max1 < (int64_t{1} << 60)) {
    const int64_t cur = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    return cur >= 0 ? std::max<int64_t>(0, max1 - cur) : max1;
  }
  return -1;
}

int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t best = -1;
  const auto take = [&](int64_t v) {
    if (v >= 0) best = best < 0 ? v : std::min(best, v);
  };
  take(meminfo_available());
  take(cgroup_left());
  if (const char* env = std::getenv(kMemoryLimitEnv); env && *env) {
    const int64_t cap = parse_size(env);
    if (cap < 0)
      throw std::invalid_argument(std::string(kMemoryLimitEnv) + "='" + env +
                                  "' is not a byte count (e.g. 8G, 512M or 1073741824)");
    take(std::max<int64_t>(0, cap - resident_bytes()));
  }
  return best;
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

void check_fits(const std::string& field, const std::string& job, int64_t need,
                const std::string& breakdown, const std::string& reduces) {
  const int64_t avail = available_memory_bytes();
  if (avail < 0 || need <= avail) return;
  throw OptionError(field, job + " needs about " + format_bytes(need) + " (" + breakdown +
                               ") but about " + format_bytes(avail) +
                               " is available; a smaller value reduces " + reduces);
}

}  // namespace scalesweep

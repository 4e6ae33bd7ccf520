// Memory the process may still use (include/scalesweep/base/memory.h).
#include "scalesweep/base/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "scalesweep/base/option_error.h"

namespace scalesweep {
namespace {

// A byte count from a one-line file ("max", unreadable or not a number: -1).
int64_t read_number(const std::string& path) {
  std::ifstream f(path);
  int64_t v = -1;
  if (!(f >> v) || v < 0) return -1;
  return v;
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
    uint64_t cap = 0;
    try {
      cap = parse_byte_size(env, kMemoryLimitEnv);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(std::string(kMemoryLimitEnv) + "='" + env +
                                  "' is not a byte count (e.g. 8GB, 8GiB, 512MB or 1073741824)");
    }
    cap = std::min<uint64_t>(cap, std::numeric_limits<int64_t>::max());
    take(std::max<int64_t>(0, static_cast<int64_t>(cap) - resident_bytes()));
  }
  return best;
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

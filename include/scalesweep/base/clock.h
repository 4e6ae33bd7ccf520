// Wall-clock seconds for the phase timings that reports print (quantize, write, calibrate):
// the monotonic clock, never the calendar one.
#pragma once

#include <chrono>

namespace scalesweep {

// Seconds from `t0` (a std::chrono::steady_clock time point) to now.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace scalesweep

// Memory the process may still use, and the one refusal of a job that would not fit (layer
// `base`). Jobs whose working set grows with a request's size (a perplexity context, a
// calibration set) estimate it first and call check_fits, so that an impossible request is
// refused with the estimate and the option that reduces it instead of meeting the OOM killer.
#pragma once

#include <cstdint>
#include <string>

#include "scalesweep/base/bytes.h"

namespace scalesweep {

// Environment variable that caps the memory jobs plan for (a size as parse_byte_size reads it,
// e.g. "8GB" or "8GiB"): for a machine shared with other work, and for tests.
inline constexpr const char* kMemoryLimitEnv = "SCALESWEEP_MEMORY_LIMIT";

// Bytes this process may still allocate: the least of /proc/meminfo's MemAvailable, the
// cgroup (v2 memory.max - memory.current, or v1) limit left, and SCALESWEEP_MEMORY_LIMIT
// minus this process's resident set. -1 when none of them can be read (nothing is refused).
// Throws std::invalid_argument for an unreadable SCALESWEEP_MEMORY_LIMIT value.
int64_t available_memory_bytes();

// Throws OptionError(field, ...) when `need` bytes exceed available_memory_bytes(): "<job>
// needs about X (<breakdown>) but about Y is available; a smaller value reduces <reduces>".
// Nothing when the available memory is unknown.
void check_fits(const std::string& field, const std::string& job, int64_t need,
                const std::string& breakdown, const std::string& reduces = "it");

}  // namespace scalesweep

// Byte counts as people write and read them (layer `base`): the one size parser of the
// product (--max-shard-size, SCALESWEEP_MEMORY_LIMIT) and the one formatter of messages.
#pragma once

#include <cstdint>
#include <string>

namespace scalesweep {

// "5GB" (10^9), "500MB", "2GiB" (2^30), "64KiB", "1000" (bytes): huggingface_hub's
// parse_size_to_int units (case-insensitive B, KB, MB, GB, TB and KiB..TiB, a decimal
// number before them). Throws std::invalid_argument naming `what` for anything else or 0.
uint64_t parse_byte_size(const std::string& s, const std::string& what);

// "1.5 GiB", "730 MiB", "12 KiB", "100 B".
std::string format_bytes(int64_t bytes);

}  // namespace scalesweep

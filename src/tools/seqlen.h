// Team policy for sequence-length options (--seqlen, --calib-seqlen, ...): a value above the
// model's max_seq_len is capped to it, with one visible note on stderr. Used by ppl, generate,
// experiment, calibrate and quantize.
#pragma once

#include <cstdint>
#include <string>

namespace scalesweep::tools {

// Returns min(seqlen, max_seq_len). When it caps, prints exactly one stderr line
//   note: <option> <seqlen> exceeds <model>'s max_seq_len <max_seq_len>; using <max_seq_len>
// `model` is how the user named the model (its path as given on the command line).
// Throws std::invalid_argument when max_seq_len < 1 (a broken config).
int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& option = "--seqlen");

}  // namespace scalesweep::tools

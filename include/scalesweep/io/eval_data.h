// Documents of eval tasks (`scalesweep eval`): one task split as a list of JSON objects, in
// file order. The files come from scripts/get-eval-data.sh (data/eval/<task>/<split>.jsonl,
// in the schemas of the Hugging Face datasets lm-evaluation-harness 0.4.13 loads).
//
// JSONL is always read. Parquet and Arrow need a build with SS_ARROW (CMake: ON when python3
// can import pyarrow and a test link against its libraries works); elsewhere such a path is
// refused with a message that says how to get them (install pyarrow and reconfigure, or
// `scripts/eval_data.py convert IN OUT.jsonl`).
//
// Every error is an IoError whose message names the file and, where it applies, the 1-based
// line or the 0-based row ("data/eval/piqa/validation.jsonl: line 17: not a JSON object").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "scalesweep/io/file.h"  // IoError

namespace scalesweep::io {

// The documents of one task split, in file order, as JSON objects. `path` is a JSONL file
// (.jsonl/.json lines), a Parquet file (.parquet), an Arrow IPC stream file (.arrow) or a
// Hugging Face save_to_disk folder (data-*-of-*.arrow files in order, with state.json).
// JSONL: one object a line; blank lines at the end are allowed, elsewhere they are errors;
// a file with no document is an error. Arrow/Parquet: strings, integers, floats, bools,
// nulls, lists and structs (dictionary columns decoded); other column types are refused.
std::vector<nlohmann::json> read_documents(const std::string& path);

// Whether this build reads Parquet and Arrow (SS_ARROW); without it, read_documents refuses
// them with the message above.
bool reads_arrow();

}  // namespace scalesweep::io

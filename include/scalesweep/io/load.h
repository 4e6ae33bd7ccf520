// One entry point for every checkpoint format the runtime reads: a llama2.c .bin file
// (legacy or v1 "ak42") or a Hugging Face model directory.
#pragma once

#include <memory>
#include <string>

#include "scalesweep/model/config.h"
#include "scalesweep/model/tokenizer.h"

namespace scalesweep::io {

struct LoadedModel {
  model::Weights weights;
  std::unique_ptr<model::Tokenizer> tokenizer;  // null when none was found or given
  std::string format;                           // "llama2c-legacy", "llama2c-v1", "hf"
};

// `path` is a llama2.c .bin file or a HF directory. `tokenizer_path` (optional) overrides
// the tokenizer: a llama2.c tokenizer.bin (or a tokenizer.json for HF). For a llama2.c
// model without `tokenizer_path`, a `tokenizer.bin` or `tok<vocab>.bin` beside the model
// file is used when present. Throws std::runtime_error naming the file.
LoadedModel load_model(const std::string& path, const std::string& tokenizer_path = "");

}  // namespace scalesweep::io

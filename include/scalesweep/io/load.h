// One entry point for every checkpoint format the runtime reads: a llama2.c .bin file
// (legacy or v1 "ak42"), a llama.cpp .gguf file or a Hugging Face model directory. The
// format is sniffed from the content (a directory, the "GGUF" magic, a plausible llama2.c
// header), not from the file name; anything else is "unrecognised model file".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::io {

struct LoadedModel {
  model::Weights weights;
  std::unique_ptr<model::Tokenizer> tokenizer;  // null when none was found or given
  std::string format;                           // "llama2c-legacy", "llama2c-v1", "hf", "gguf"
  // What the checkpoint declares about quantization (HF compressed-tensors; default: none).
  CheckpointQuant quant;
};

// `path` is a llama2.c .bin file, a GGUF file or a HF directory. `tokenizer_path` (optional)
// overrides the tokenizer: a llama2.c tokenizer.bin (or a tokenizer.json for HF and GGUF; a
// GGUF's own tokenizer comes from its metadata). For a llama2.c
// model without `tokenizer_path`, a `tokenizer.bin` or `tok<vocab>.bin` beside the model
// file is used when present. Throws std::runtime_error naming the file.
LoadedModel load_model(const std::string& path, const std::string& tokenizer_path = "");

// The model config of `path` read without its weights: a HF directory's config.json (with the
// checks of load_model), a GGUF's metadata; nullopt for anything else (a llama2.c checkpoint
// is always a dense Llama; an unrecognised path is load_model's to report).
std::optional<model::Config> peek_model_config(const std::string& path);

// Throws std::invalid_argument "PATH: mixture-of-experts models are not yet supported by WHAT"
// when `path` is a MoE model (peek_model_config; nothing else is read). Called by every path
// that does not handle MoE models yet, before it loads weights.
void refuse_moe_model(const std::string& path, const std::string& what);

// The one tokenizer-from-path rule (a --tokenizer override): a path ending in ".bin" is a
// llama2.c tokenizer (its vocabulary read for `vocab_size` entries when > 0), anything else a
// Hugging Face tokenizer.json or the directory holding it.
std::unique_ptr<model::Tokenizer> load_tokenizer_file(const std::string& path, int vocab_size = 0);

// Whole text file (throws std::runtime_error naming the file; rejects empty files).
std::string read_text_file(const std::string& path);
// read_text_file's checks (the file opens, is not a directory, is not empty) without reading it.
void check_text_file(const std::string& path);
// The one text-to-tokens step of the jobs that read a text file (calibration, experiment
// evaluation): read_text_file, then the tokenizer's encoding, BOS first when `bos`, no EOS.
std::vector<int> text_file_tokens(const model::Tokenizer& tok, const std::string& path, bool bos);

}  // namespace scalesweep::io

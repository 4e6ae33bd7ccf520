// llama2.c checkpoint or GGUF file -> Hugging Face directory (`scalesweep convert`).
//
// The llama2.c loader already returns HF conventions (wq/wk rows permuted from interleaved
// RoPE pairs to rotate-half, see llama2c.h), so conversion = load + write: config.json
// (LlamaForCausalLM), generation_config.json, model.safetensors and, from the llama2.c
// tokenizer.bin, a SentencePiece-style tokenizer.json (BPE, byte fallback, merges ranked by
// the llama2.c scores) plus tokenizer_config.json. The directory appears atomically.
#pragma once

#include <cstdint>
#include <string>

#include "scalesweep/io/hf.h"
#include "scalesweep/model/config.h"

namespace scalesweep::io {

struct ConvertOptions {
  // llama2.c tokenizer.bin; empty: tokenizer.bin or tok<vocab>.bin beside the model, and
  // when there is none the directory gets no tokenizer files (`require_tokenizer` = error).
  std::string tokenizer;
  bool require_tokenizer = false;
  DType dtype = DType::kF32;
  uint64_t shard_bytes = 0;
  bool overwrite = false;
};

struct ConvertReport {
  std::string source_format;   // "llama2c-legacy" / "llama2c-v1" / "gguf"
  std::string tokenizer_path;  // empty when none was written
  model::Config config;
  int64_t parameters = 0;
  int tensors = 0;
  uint64_t bytes = 0;  // weights file(s) size
  int vocab = 0, merges = 0;
  double seconds = 0;
};

// A GGUF file -> Hugging Face directory: weights dequantized to fp32 (llama q/k rows in HF
// order, see gguf_model.h), config.json from the GGUF metadata, tokenizer.json +
// tokenizer_config.json from its tokenizer.ggml.* keys (`opt.tokenizer` must be empty).
ConvertReport convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir,
                                 const ConvertOptions& opt);
// Dispatches on the content: a GGUF file or a llama2.c checkpoint.
ConvertReport convert_to_hf(const std::string& path, const std::string& out_dir,
                            const ConvertOptions& opt);

ConvertReport convert_llama2c_to_hf(const std::string& llama2c_path, const std::string& out_dir,
                                    const ConvertOptions& opt);

}  // namespace scalesweep::io

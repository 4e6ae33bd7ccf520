// Lossless NVFP4 conversion between compressed-tensors checkpoints and llama.cpp GGUF files
// (`scalesweep convert`), without re-quantizing: the E2M1 codes and E4M3 block-scale bytes are
// carried over bit for bit (nibbles re-packed, llama q/k rows permuted as whole rows).
//
// Global scale direction: compressed-tensors stores the encode-direction gs (w = fl(q*s / gs));
// llama.cpp multiplies the matmul output by the per-tensor `.scale`, so the GGUF gets
// scale = fl(1 / gs), and the exact gs is recorded in io::kGgufGlobalScalesKey. Back to
// compressed-tensors, gs is that record when present (and consistent with the scales), else
// fl(1 / scale) (noted: the dequantized values may then differ in the last bit).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "scalesweep/format/dtype.h"
#include "scalesweep/io/gguf_writer.h"

namespace scalesweep::pipeline {

struct Nvfp4ConvertReport {
  std::string out;
  int nvfp4_linears = 0, dense_linears = 0;
  bool global_scales_recorded = false;  // GGUF -> CT: gs taken from the record
  uint64_t bytes = 0;
  double seconds = 0;
};

using NoteSink = std::function<void(const std::string&)>;

// True when `path` is a GGUF file with at least one NVFP4 tensor.
bool gguf_has_nvfp4(const std::string& path);
// True when `dir` is a Hugging Face directory whose config.json declares an NVFP4
// compressed-tensors quantization_config.
bool is_nvfp4_checkpoint(const std::string& dir);

// compressed-tensors NVFP4 directory (ours or another producer's, nvfp4-pack-quantized, W4A16)
// -> NVFP4 GGUF. Linears whose row length is not a multiple of 64, and those the checkpoint
// keeps dense (in any layer: ignore lists modules one by one), are stored in `dense` (noted).
// Refuses W4A4 checkpoints (llama.cpp has no input scales for decoder Linears).
Nvfp4ConvertReport convert_ct_to_gguf(const std::string& ct_dir, const std::string& out,
                                      io::GgufDense dense, bool overwrite,
                                      const NoteSink& note = {});

// NVFP4 GGUF -> compressed-tensors directory (dense tensors in `dense`; other ggml types of a
// Linear are dequantized and kept dense, per layer, noted; a fused q/k/v or gate/up group that
// is partly dense is noted: vLLM refuses it, scalesweep reads it). Refuses block-scale bytes
// compressed-tensors cannot hold as the same value (sign bit set, or 0x7F which ggml reads as 0),
// naming the tensor, row and block.
Nvfp4ConvertReport convert_gguf_to_ct(const std::string& gguf, const std::string& out_dir,
                                      DType dense, bool overwrite, const NoteSink& note = {});

}  // namespace scalesweep::pipeline

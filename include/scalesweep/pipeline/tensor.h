// `scalesweep tensor` (layer `pipeline`): NVFP4 / MXFP4 quantization of one 2-D tensor read
// from a file with one block-scale selector (quantize_tensor_file, optionally writing the
// packed tensor to a .safetensors file), or every selector on it (compare_tensor_file), each
// with its errors and gaps to the opt-fp32 references (quant/evaluate.h).
//
// The input is a 2-D .npy (float32/float16/float64) or FILE.safetensors:TENSOR
// (F32/F16/BF16/F64); the importance a .npy of shape [cols] (per column) or [rows, cols]
// (per element), finite and >= 0.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/pipeline/events.h"
#include "scalesweep/quant/evaluate.h"

namespace scalesweep::pipeline {

// One tensor file and what to do with it, typed (the CLI parses the names); invalid values
// throw OptionError naming the field (base/option_error.h).
struct TensorRequest {
  std::string input;             // FILE.npy or FILE.safetensors:TENSOR
  std::optional<Method> method;  // none for compare_tensor_file
  std::string importance;        // .npy path, or empty
  // Format, block, window (compare_tensor_file: the window of `sweep`, which runs only with
  // one), max_block_scale, global_scale and threads; selector.method is set from `method`.
  QuantConfig config;
  std::string output;    // .safetensors to write (quantize_tensor_file), or empty
  bool dequant = false;  // also store the dequantized tensor in `output`
  // Called once the request is valid and before the input is read (the caller's check of
  // `output` against existing files); may throw.
  std::function<void()> before_load;
};

struct TensorMethodResult {
  MethodRun run;    // xhat and q are dropped by compare_tensor_file
  QuantConfig cfg;  // the configuration it ran with
  Gaps gaps;        // to `opt` of the result
};

struct TensorResult {
  std::string input;  // the input spec (its label in messages and outputs)
  int64_t rows = 0, cols = 0;
  std::string importance;  // the importance path, empty without one
  bool weighted = false;   // an importance was given
  QuantConfig cfg;         // the base configuration (format, block, global scale, threads)
  OptFp32Refs opt;
  std::vector<TensorMethodResult> results;  // one per method run
};

// One method (request.method) on the input, then its opt-fp32 references; writes `output`
// (weight_packed, weight_scale, weight_global_scale for NVFP4, `dequant` with --dequant, and
// metadata) when given. Progress: the stage "tensor", unit "runs", after each run. Throws
// std::invalid_argument for an invalid request or input, io errors for unreadable files.
TensorResult quantize_tensor_file(const TensorRequest& request, const JobEvents& events = {});

// Every method (sweep only with a window) on the input, after the opt-fp32 references, in
// kMethodNames order (progress: the stage "compare", unit "runs"). Refuses a method, an
// output or dequant.
TensorResult compare_tensor_file(const TensorRequest& request, const JobEvents& events = {});

}  // namespace scalesweep::pipeline

// The Hugging Face config.json of a model, written in one place (`convert` and `quantize`
// both use it), and the one mapping between a config's torch_dtype and scalesweep::DType.
// Layer `io`.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "scalesweep/format/dtype.h"
#include "scalesweep/model/config.h"

namespace scalesweep::io {

// config.json text (indent 2, no trailing newline) for a model (Llama, Qwen2, Qwen3 HF
// conventions) whose dense tensors are stored as `dtype` (its torch_dtype), without
// quantization_config. Floats are written as their shortest decimal (rms_norm_eps 1e-05, not
// 9.999999747378752e-06); Qwen2/Qwen3 get use_sliding_window = false.
std::string hf_config_json(const model::Config& c, DType dtype);

// The dense dtype a config.json `torch_dtype` (or transformers 5's `dtype`) value names:
// float32, bfloat16, float16; float64 and "auto" are stored as float32 here. nullopt for any
// other value (not a float dtype).
std::optional<DType> dtype_of_torch_dtype(std::string_view torch_dtype);

// The dense dtype of the HF directory `dir`: its config.json's torch_dtype (or dtype);
// float32 when the field is absent or null. Throws IoError naming the file when config.json
// cannot be read, is not JSON, or names a dtype that is not a float dtype.
DType hf_dir_dtype(const std::string& dir);

}  // namespace scalesweep::io

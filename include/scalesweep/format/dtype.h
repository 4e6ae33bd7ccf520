// Element type of a dense floating-point tensor (inputs to quantization, dense checkpoint
// tensors, the CUDA operator's inputs). bf16/f16 widen exactly to float. Layer `format`.
#pragma once

#include "scalesweep/base/names.h"

namespace scalesweep {

enum class DType { kF32, kBF16, kF16 };

// Canonical names are the torch / Hugging Face spellings; f32, bf16, f16, fp32, fp16 are accepted
// too. Every option and argument naming a dense dtype parses with this table.
inline constexpr auto kDTypeNames = make_names<DType>("dtype", {{DType::kF32, "float32"},
                                                                {DType::kBF16, "bfloat16"},
                                                                {DType::kF16, "float16"},
                                                                {DType::kF32, "f32"},
                                                                {DType::kBF16, "bf16"},
                                                                {DType::kF16, "f16"},
                                                                {DType::kF32, "fp32"},
                                                                {DType::kF16, "fp16"}});

// Bytes per element.
constexpr int dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

}  // namespace scalesweep

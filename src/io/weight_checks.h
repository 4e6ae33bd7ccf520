// Checks shared by the checkpoint loaders (HF safetensors, GGUF) that keep 16-bit weights in
// place from a file mapping.
#pragma once

#include <cstdint>
#include <string>

namespace scalesweep::io {

// Throws std::runtime_error "FILE: tensor 'NAME' has a non-finite value (V) at flat index I"
// for the first bf16 (`bf16`) or IEEE f16 element of `h[0, n)` whose exponent is all ones.
// The same for fp32 elements.
// first_index: the flat index of x[0] in the tensor (for a check made a tile at a time).
void check_finite_f32(const float* x, int64_t n, const std::string& file, const std::string& tensor,
                      int64_t first_index = 0);
void check_finite_16bit(const uint16_t* h, int64_t n, bool bf16, const std::string& file,
                        const std::string& tensor);

}  // namespace scalesweep::io

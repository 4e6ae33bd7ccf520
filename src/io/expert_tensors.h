// Mixture-of-experts weights as checkpoints stack them: one tensor holding every expert
// ([n_experts, rows, cols]: transformers 5's fused experts.gate_up_proj / down_proj, llama.cpp's
// ffn_{gate,up,down}_exps), viewed one expert's rows at a time without copying.
#pragma once

#include <cstdint>

#include "scalesweep/model/weights.h"

namespace scalesweep::io {

// Rows [r0, r1) of `t` (viewed as [rows, cols]) as a tensor of shape [r1 - r0, cols] sharing
// t's storage (fp32 data, 16-bit or NVFP4 codes and scales, or ggml blocks with their per-tensor
// scale; not rows of a tensor whose q/k rows are permuted); the
// caller keeps t's storage alive. Throws std::invalid_argument for a range outside t.
model::Tensor tensor_rows(const model::Tensor& t, int64_t r0, int64_t r1);

}  // namespace scalesweep::io

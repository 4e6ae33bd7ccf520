// Row views of stacked expert tensors (src/io/expert_tensors.h).
#include "io/expert_tensors.h"

#include <memory>
#include <stdexcept>
#include <string>

#include "scalesweep/format/ggml.h"

namespace scalesweep::io {

model::Tensor tensor_rows(const model::Tensor& t, int64_t r0, int64_t r1) {
  const int64_t rows = t.rows(), cols = t.cols();
  if (r0 < 0 || r1 <= r0 || r1 > rows)
    throw std::invalid_argument("tensor_rows: rows [" + std::to_string(r0) + ", " +
                                std::to_string(r1) + ") outside [0, " + std::to_string(rows) + ")");
  model::Tensor v;
  v.shape = {r1 - r0, cols};
  v.dtype = t.dtype;
  switch (t.dtype) {
    case model::WeightDType::kF32:
      v.data = t.data + r0 * cols;
      break;
    case model::WeightDType::kBF16:
    case model::WeightDType::kF16:
      v.raw = static_cast<const uint16_t*>(t.raw) + r0 * cols;
      break;
    case model::WeightDType::kNvfp4:
      v.raw = static_cast<const uint8_t*>(t.raw) + r0 * ((cols + 1) / 2);
      v.nvfp4_scales = t.nvfp4_scales + r0 * ((cols + 15) / 16);
      v.nvfp4_global_scale = t.nvfp4_global_scale;
      break;
    case model::WeightDType::kGgml: {
      if (t.ggml_permute_head_dim != 0)
        throw std::invalid_argument("tensor_rows: rows of a tensor with permuted q/k rows");
      const auto tr = format::ggml_type_traits(t.ggml_type);
      if (!tr) throw std::invalid_argument("tensor_rows: unknown ggml type");
      v.raw = static_cast<const uint8_t*>(t.raw) + r0 * (cols / tr->block_elems * tr->block_bytes);
      v.ggml_type = t.ggml_type;
      v.ggml_scale = t.ggml_scale;
      break;
    }
  }
  if (t.mapped && t.mapped_bytes % rows == 0) {  // rows of equal bytes (every stored layout)
    const int64_t row_bytes = t.mapped_bytes / rows;
    v.mapped = t.mapped + r0 * row_bytes;
    v.mapped_bytes = (r1 - r0) * row_bytes;
  }
  return v;
}

}  // namespace scalesweep::io

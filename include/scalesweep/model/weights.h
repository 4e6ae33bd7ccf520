// The tensors of a Llama-family model (model/config.h describes its shape), shared by the
// runtime (layer `model`) and the checkpoint loaders/writers (layer `io`). Weights are
// row-major [out, in] matrices (PyTorch Linear layout) in Hugging Face conventions; the
// llama2.c loader permutes wq/wk rows from interleaved pairs when it reads a llama2.c file.
// Reading them in any storage precision: model/weight.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/model/config.h"

namespace scalesweep::model {

// Storage precision of a Tensor. Linear weights and embeddings stay in the precision of the
// checkpoint (bf16/f16 in place in the file mapping, NVFP4 packed codes + E4M3 block scales +
// global scale, a GGUF's ggml blocks in its mapping); the runtime reads them a tile of rows at
// a time or in fused kernels (include/scalesweep/model/weight.h). Norm weights and biases are
// always fp32.
enum class WeightDType { kF32, kBF16, kF16, kNvfp4, kGgml };

// A tensor owned by the model or mapped from a file (the pointers point into storage kept
// alive by Weights::storage). Viewed as [rows = shape[0], cols = numel / rows] (1-D: one row).
struct Tensor {
  std::vector<int64_t> shape;
  // fp32 elements; set only when dtype == kF32 (nullptr otherwise: read through
  // dequantize_rows / to_f32 in weight.h, or f32() which names the dtype when it is not fp32).
  const float* data = nullptr;
  WeightDType dtype = WeightDType::kF32;
  // kBF16/kF16: [rows, cols] uint16 bit patterns; kNvfp4: codes [rows, (cols + 1) / 2]
  // (element 2i low nibble, 2i+1 high).
  const void* raw = nullptr;
  const uint8_t* nvfp4_scales = nullptr;  // kNvfp4: E4M3 [rows, ceil(cols / 16)]
  float nvfp4_global_scale = 1.0f;        // kNvfp4: w = fl(fl(fp4 * scale) / global_scale)
  // kGgml: `raw` holds rows of ggml blocks of type ggml_type (format/ggml.h, cols a whole
  // number of blocks); row r is stored row r, or with ggml_permute_head_dim hd > 0 the row that
  // llama.cpp's LlamaModel.permute moved it to (HF row h*hd + a*hd/2 + i is stored row
  // h*hd + 2i + a); every value is fl(v * ggml_scale) (llama.cpp's per-tensor `.scale`; 1:
  // none, the multiplication skipped).
  uint32_t ggml_type = 0;
  float ggml_scale = 1.0f;
  int64_t ggml_permute_head_dim = 0;
  // The stored bytes when they lie in a read-only file mapping (a GGUF's blocks or 16-bit
  // matrices read in place): a streamed reader drops their pages from the resident set once it
  // has widened the tensor (io/model_parts.h). Null otherwise.
  const uint8_t* mapped = nullptr;
  int64_t mapped_bytes = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  bool present() const { return data || raw; }
  int64_t rows() const { return shape.empty() ? 0 : (shape.size() == 1 ? 1 : shape[0]); }
  int64_t cols() const { return shape.empty() ? 0 : numel() / rows(); }
  // The fp32 data; throws std::logic_error naming `what` and the dtype when the tensor is
  // stored in another precision (a caller that needs fp32 must dequantize first).
  const float* f32(const char* what = "tensor") const;
};

// As messages name the storage precision ("is stored as BF16").
inline constexpr auto kWeightDTypeNames =
    make_names<WeightDType>("weight dtype", {{WeightDType::kF32, "F32"},
                                             {WeightDType::kBF16, "BF16"},
                                             {WeightDType::kF16, "F16"},
                                             {WeightDType::kNvfp4, "NVFP4"},
                                             {WeightDType::kGgml, "ggml blocks"}});

struct LayerWeights {
  Tensor attn_norm;       // [dim]
  Tensor wq, wk, wv, wo;  // [n_heads*head_dim, dim], [kv_dim, dim] x2, [dim, n_heads*head_dim]
  Tensor bq, bk, bv;      // Qwen2 biases (empty otherwise)
  Tensor q_norm, k_norm;  // Qwen3 per-head RMSNorm [head_dim] (empty otherwise)
  Tensor ffn_norm;        // [dim]
  Tensor w1, w3, w2;      // gate [hidden, dim], up [hidden, dim], down [dim, hidden]
  // Mixture-of-experts layers (Config::moe_layer; w1/w3/w2 are then empty): the router
  // [n_experts, dim], always fp32, and n_experts experts in the checkpoint's precision.
  struct Expert {
    Tensor w1, w3, w2;  // gate [moe_hidden, dim], up [moe_hidden, dim], down [dim, moe_hidden]
  };
  Tensor router;
  std::vector<Expert> experts;
};

struct Weights {
  Config config;
  Tensor tok_embeddings;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [dim]
  Tensor lm_head;     // [vocab, dim]; aliases tok_embeddings when tied
  // Storage that keeps the tensors alive (owned vectors, file mappings).
  std::vector<std::shared_ptr<void>> storage;
  // Allocates an owned fp32 tensor of the given shape (zeroed) and returns its data.
  float* alloc(Tensor& t, std::vector<int64_t> shape);
};
}  // namespace scalesweep::model

// Llama-family model description shared by the runtime (layer `model`) and the checkpoint
// loaders/writers (layer `io`), mixture-of-experts variants (Qwen3-MoE, Mixtral) included. Weights
// are row-major [out, in] matrices (PyTorch Linear layout) in Hugging Face conventions: RoPE is
// rotate-half; the llama2.c loader permutes wq/wk rows from interleaved pairs when it reads a
// llama2.c file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scalesweep/base/names.h"

namespace scalesweep::model {

enum class Arch { kLlama, kQwen2, kQwen3, kQwen3Moe, kMixtral };
// Hugging Face model_type names (also GGUF general.architecture for llama, qwen2, qwen3; GGUF's
// own names for the mixture-of-experts models: io/gguf_model.h), and the HF architecture class.
inline constexpr auto kArchNames = make_names<Arch>("architecture", {{Arch::kLlama, "llama"},
                                                                     {Arch::kQwen2, "qwen2"},
                                                                     {Arch::kQwen3, "qwen3"},
                                                                     {Arch::kQwen3Moe, "qwen3_moe"},
                                                                     {Arch::kMixtral, "mixtral"}});
inline constexpr auto kArchClassNames =
    make_names<Arch>("architecture class", {{Arch::kLlama, "LlamaForCausalLM"},
                                            {Arch::kQwen2, "Qwen2ForCausalLM"},
                                            {Arch::kQwen3, "Qwen3ForCausalLM"},
                                            {Arch::kQwen3Moe, "Qwen3MoeForCausalLM"},
                                            {Arch::kMixtral, "MixtralForCausalLM"}});

// RoPE frequency scaling, as transformers' modeling_rope_utils.py computes it for Llama/Qwen
// ("rope_scaling" in 4.x configs, "rope_parameters" in 5.x). kDefault: plain theta^(-2i/hd).
enum class RopeType { kDefault, kLinear, kLlama3, kYarn, kDynamic };

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  float factor = 0;                                 // linear, llama3, yarn, dynamic (> 0)
  float low_freq_factor = 1, high_freq_factor = 4;  // llama3
  int original_max_position_embeddings = 0;         // llama3, yarn
  float beta_fast = 32, beta_slow = 1;              // yarn
  bool truncate = true;                             // yarn: floor/ceil the correction range
  float attention_factor = 1;  // multiplies cos and sin (yarn's mscale; 1 for the others)
};

// transformers' rope_type names.
inline constexpr auto kRopeTypeNames =
    make_names<RopeType>("rope type", {{RopeType::kDefault, "default"},
                                       {RopeType::kLinear, "linear"},
                                       {RopeType::kLlama3, "llama3"},
                                       {RopeType::kYarn, "yarn"},
                                       {RopeType::kDynamic, "dynamic"}});

struct Config {
  Arch arch = Arch::kLlama;
  int dim = 0;         // hidden_size
  int hidden_dim = 0;  // intermediate_size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // usually dim / n_heads (Qwen3 may differ)
  int vocab_size = 0;
  int max_seq_len = 0;  // max_position_embeddings
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;
  bool tied_embeddings = true;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3, Qwen3-MoE
  int bos_token_id = 1, eos_token_id = 2;

  // Mixture of experts (Qwen3-MoE, Mixtral; n_experts 0: a dense model). In a MoE layer the
  // SwiGLU feed-forward is replaced by n_experts SwiGLU experts of width moe_hidden_dim and a
  // router (model/moe.h): softmax over the experts, the top experts_per_tok, their
  // probabilities renormalised to sum 1 when norm_topk_prob (Mixtral: always).
  int n_experts = 0;            // num_experts (Qwen3-MoE), num_local_experts (Mixtral)
  int experts_per_tok = 0;      // num_experts_per_tok
  int moe_hidden_dim = 0;       // moe_intermediate_size (Mixtral: intermediate_size)
  bool norm_topk_prob = false;  // Qwen3-MoE's norm_topk_prob; true for Mixtral
  // Which layers are MoE (Qwen3-MoE): layer l is when l is not in dense_layers
  // (mlp_only_layers) and (l + 1) % moe_sparse_step == 0 (decoder_sparse_step); the others
  // keep the dense feed-forward of width hidden_dim.
  int moe_sparse_step = 1;
  std::vector<int> dense_layers;
  bool moe() const { return n_experts > 0; }
  bool moe_layer(int l) const {
    if (n_experts <= 0 || moe_sparse_step <= 0 || (l + 1) % moe_sparse_step != 0) return false;
    for (int d : dense_layers)
      if (d == l) return false;
    return true;
  }
};

// The one refusal of a path that does not handle mixture-of-experts models yet: throws
// std::invalid_argument "mixture-of-experts models are not yet supported by <what>" when
// c.moe() (a no-op for dense models).
void refuse_moe(const Config& c, const std::string& what);

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

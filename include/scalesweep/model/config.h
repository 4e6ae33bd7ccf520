// Llama-family model description shared by the runtime (layer `model`) and the checkpoint
// loaders/writers (layer `io`). Weights are held as fp32 row-major [out, in] matrices
// (PyTorch Linear layout) in Hugging Face conventions: RoPE is rotate-half; the llama2.c
// loader permutes wq/wk rows from interleaved pairs when it reads a llama2.c file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace scalesweep::model {

enum class Arch { kLlama, kQwen2, kQwen3 };

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

// "default", "linear", "llama3", "yarn", "dynamic".
const char* rope_type_name(RopeType t);

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
  bool qk_norm = false;   // Qwen3
  int bos_token_id = 1, eos_token_id = 2;
};

// A tensor owned by the model or mapped from a file (data points into `owner`'s bytes).
struct Tensor {
  std::vector<int64_t> shape;
  const float* data = nullptr;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

struct LayerWeights {
  Tensor attn_norm;       // [dim]
  Tensor wq, wk, wv, wo;  // [n_heads*head_dim, dim], [kv_dim, dim] x2, [dim, n_heads*head_dim]
  Tensor bq, bk, bv;      // Qwen2 biases (empty otherwise)
  Tensor q_norm, k_norm;  // Qwen3 per-head RMSNorm [head_dim] (empty otherwise)
  Tensor ffn_norm;        // [dim]
  Tensor w1, w3, w2;      // gate [hidden, dim], up [hidden, dim], down [dim, hidden]
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

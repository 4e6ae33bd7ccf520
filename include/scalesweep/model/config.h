// Llama-family model description shared by the runtime (layer `model`) and the checkpoint
// loaders/writers (layer `io`), mixture-of-experts variants (Qwen3-MoE, Mixtral) included, in
// Hugging Face conventions (RoPE is rotate-half). The model's tensors: model/weights.h.
#pragma once

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

// Every member has a default, so that a designated initializer may name only the ones it sets
// (GCC's -Wmissing-field-initializers warns about members without one).
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
  RopeScaling rope_scaling = {};
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
  std::vector<int> dense_layers = {};
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

}  // namespace scalesweep::model

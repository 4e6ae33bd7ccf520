// Hugging Face names of a Llama-family model's tensors, in one place: the module of each
// decoder-layer Linear (model::LinearId -> "model.layers.N.self_attn.q_proj"), its [N, K]
// shape from the model config, and its weight in model::LayerWeights. Layer `io`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::io {

// The seven Linears of a decoder layer, in HF file order (q, k, v, o, gate, up, down).
inline constexpr model::LinearId kAllLinears[7] = {
    model::LinearId::kQ,    model::LinearId::kK,  model::LinearId::kV,   model::LinearId::kO,
    model::LinearId::kGate, model::LinearId::kUp, model::LinearId::kDown};

std::string hf_layer_prefix(int layer);  // "model.layers.N."
// "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj", ...
std::string hf_module_name(int layer, model::LinearId id);
// A MoE layer's expert Linear (id kGate, kUp or kDown): Qwen3-MoE
// "model.layers.3.mlp.experts.5.gate_proj" (up_proj, down_proj), Mixtral
// "model.layers.3.block_sparse_moe.experts.5.w1" (w1 gate, w3 up, w2 down).
std::string hf_expert_module_name(const model::Config& c, int layer, int expert,
                                  model::LinearId id);
// The router of a MoE layer: "model.layers.3.mlp.gate" (Mixtral: block_sparse_moe.gate).
std::string hf_router_module_name(const model::Config& c, int layer);
// [N, K] (out, in) of a Linear of a model with config `c`.
std::pair<int64_t, int64_t> hf_linear_shape(const model::Config& c, model::LinearId id);

const model::Tensor& linear_weight(const model::LayerWeights& lw, model::LinearId id);
model::Tensor& linear_weight(model::LayerWeights& lw, model::LinearId id);

}  // namespace scalesweep::io

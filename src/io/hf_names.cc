#include "scalesweep/io/hf_names.h"

#include <stdexcept>
#include <string>

namespace scalesweep::io {
using model::LinearId;

std::string hf_layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

std::string hf_module_name(int layer, LinearId id) {
  const std::string sub = model::is_ffn_linear(id) ? "mlp." : "self_attn.";
  return hf_layer_prefix(layer) + sub + std::string(model::linear_name(id));
}

std::pair<int64_t, int64_t> hf_linear_shape(const model::Config& c, LinearId id) {
  const int64_t dim = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kvd = int64_t{c.n_kv_heads} * c.head_dim, hidden = c.hidden_dim;
  switch (id) {
    case LinearId::kQ:
      return {qd, dim};
    case LinearId::kK:
    case LinearId::kV:
      return {kvd, dim};
    case LinearId::kO:
      return {dim, qd};
    case LinearId::kGate:
    case LinearId::kUp:
      return {hidden, dim};
    case LinearId::kDown:
      return {dim, hidden};
  }
  return {0, 0};
}

const model::Tensor& linear_weight(const model::LayerWeights& lw, LinearId id) {
  // Each Linear's LayerWeights member, indexed by LinearId (q, k, v, o, gate, up, down): the
  // FFN's are llama2.c's w1 (gate), w3 (up), w2 (down).
  using LW = model::LayerWeights;
  static constexpr model::Tensor LW::*kMember[] = {&LW::wq, &LW::wk, &LW::wv, &LW::wo,
                                                   &LW::w1, &LW::w3, &LW::w2};
  // The table follows LinearId's order; a new or reordered Linear must fail here, as the
  // switch it replaced would have warned.
  static_assert(std::size(kMember) == static_cast<size_t>(LinearId::kDown) + 1 &&
                static_cast<int>(LinearId::kQ) == 0 && static_cast<int>(LinearId::kGate) == 4);
  return lw.*kMember[static_cast<size_t>(id)];
}
model::Tensor& linear_weight(model::LayerWeights& lw, LinearId id) {
  return const_cast<model::Tensor&>(linear_weight(static_cast<const model::LayerWeights&>(lw), id));
}

std::string hf_router_module_name(const model::Config& c, int layer) {
  return hf_layer_prefix(layer) +
         (c.arch == model::Arch::kMixtral ? "block_sparse_moe.gate" : "mlp.gate");
}

std::string hf_expert_module_name(const model::Config& c, int layer, int expert, LinearId id) {
  const bool mixtral = c.arch == model::Arch::kMixtral;
  std::string leaf;
  switch (id) {
    case LinearId::kGate:
      leaf = mixtral ? "w1" : "gate_proj";
      break;
    case LinearId::kUp:
      leaf = mixtral ? "w3" : "up_proj";
      break;
    case LinearId::kDown:
      leaf = mixtral ? "w2" : "down_proj";
      break;
    default:
      throw std::invalid_argument("hf_expert_module_name: " + std::string(model::linear_name(id)) +
                                  " is not an expert Linear");
  }
  return hf_layer_prefix(layer) + (mixtral ? "block_sparse_moe" : "mlp") + ".experts." +
         std::to_string(expert) + "." + leaf;
}

}  // namespace scalesweep::io

// A set of decoder-layer Linears, (layer, LinearId) pairs: which Linears a quantize run keeps
// dense (pipeline/quantize_model.h QuantizeOptions::dense) and the writers store dense
// (io/checkpoint.h, io/gguf_writer.h). A kind can be in the set for every layer
// (`--keep-dense down_proj`: any number of layers, also before the model is known) or for
// single layers (mixed precision by sensitivity, `--target-bpw`).
#pragma once

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "scalesweep/model/calib.h"

namespace scalesweep::model {

class LinearSet {
 public:
  // Linear `id` of every layer.
  void add_every_layer(LinearId id);
  // Linear `id` of layer `layer` (>= 0; throws std::invalid_argument otherwise).
  void add(int layer, LinearId id);
  // Every member of `o` (its every-layer kinds stay every-layer kinds).
  void add(const LinearSet& o);
  bool contains(int layer, LinearId id) const;
  // Whether `id` is in the set for every layer (add_every_layer).
  bool every_layer(LinearId id) const { return every_[static_cast<size_t>(id)]; }
  bool empty() const;
  // The members among layers 0 .. n_layers-1, layer by layer in io::kAllLinears order.
  std::vector<std::pair<int, LinearId>> members(int n_layers) const;
  // Whether some layer below n_layers has some member (members(n_layers) is not empty).
  bool any(int n_layers) const;
  // Members among layers 0 .. n_layers-1.
  size_t count(int n_layers) const;
  // 1 + the highest layer added by add(layer, id) (0: none), to check against a model.
  int single_layer_end() const { return static_cast<int>(layers_.size()); }
  // Equal membership in layers 0 .. n_layers-1 (every-layer kinds compare as their fill).
  bool same(const LinearSet& o, int n_layers) const;

 private:
  std::array<bool, 7> every_{};
  std::vector<std::array<bool, 7>> layers_;  // single layers; index = layer
};

}  // namespace scalesweep::model

// Sets of decoder-layer Linears (include/scalesweep/model/linear_set.h).
#include "scalesweep/model/linear_set.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace scalesweep::model {

namespace {
constexpr LinearId kOrder[7] = {LinearId::kQ,    LinearId::kK,  LinearId::kV,   LinearId::kO,
                                LinearId::kGate, LinearId::kUp, LinearId::kDown};
}  // namespace

void LinearSet::add_every_layer(LinearId id) { every_[static_cast<size_t>(id)] = true; }

void LinearSet::add(int layer, LinearId id) {
  if (layer < 0) throw std::invalid_argument("LinearSet: layer " + std::to_string(layer));
  if (static_cast<size_t>(layer) >= layers_.size())
    layers_.resize(static_cast<size_t>(layer) + 1, std::array<bool, 7>{});
  layers_[static_cast<size_t>(layer)][static_cast<size_t>(id)] = true;
}

void LinearSet::add(const LinearSet& o) {
  for (size_t i = 0; i < 7; ++i) every_[i] = every_[i] || o.every_[i];
  for (size_t l = 0; l < o.layers_.size(); ++l)
    for (LinearId id : kOrder)
      if (o.layers_[l][static_cast<size_t>(id)]) add(static_cast<int>(l), id);
}

bool LinearSet::contains(int layer, LinearId id) const {
  const size_t i = static_cast<size_t>(id);
  if (every_[i]) return true;
  return layer >= 0 && static_cast<size_t>(layer) < layers_.size() &&
         layers_[static_cast<size_t>(layer)][i];
}

bool LinearSet::empty() const {
  return std::none_of(every_.begin(), every_.end(), [](bool b) { return b; }) &&
         std::none_of(layers_.begin(), layers_.end(), [](const std::array<bool, 7>& a) {
           return std::any_of(a.begin(), a.end(), [](bool b) { return b; });
         });
}

std::vector<std::pair<int, LinearId>> LinearSet::members(int n_layers) const {
  std::vector<std::pair<int, LinearId>> out;
  for (int l = 0; l < n_layers; ++l)
    for (LinearId id : kOrder)
      if (contains(l, id)) out.emplace_back(l, id);
  return out;
}

bool LinearSet::any(int n_layers) const {
  for (int l = 0; l < n_layers; ++l)
    for (LinearId id : kOrder)
      if (contains(l, id)) return true;
  return false;
}

size_t LinearSet::count(int n_layers) const { return members(n_layers).size(); }

bool LinearSet::same(const LinearSet& o, int n_layers) const {
  for (int l = 0; l < n_layers; ++l)
    for (LinearId id : kOrder)
      if (contains(l, id) != o.contains(l, id)) return false;
  return true;
}

}  // namespace scalesweep::model

// Mixed precision by measured sensitivity (include/scalesweep/pipeline/mixed_precision.h).
#include "scalesweep/pipeline/mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/pipeline/vllm_compat.h"

namespace scalesweep::pipeline {
using io::kAllLinears;
using model::LinearId;

uint64_t nvfp4_weight_bits(int64_t rows, int64_t cols) {
  // weight_packed [rows, ceil(cols / 2)] bytes + weight_scale [rows, ceil(cols / 16)] bytes.
  const uint64_t r = static_cast<uint64_t>(rows), k = static_cast<uint64_t>(cols);
  return 8 * r * ((k + 1) / 2 + (k + 15) / 16);
}

uint64_t dense_weight_bits(int64_t rows, int64_t cols, DType dense, bool gguf, bool q8_0) {
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  if (gguf && q8_0) {
    const io::GgmlType t = io::gguf_dense_type_for(io::GgufDense::kQ8_0, cols);
    return 8 * io::ggml_tensor_bytes(static_cast<uint32_t>(t), {cols, rows}, "linear");
  }
  return n * 8 * static_cast<uint64_t>(dtype_bytes(dense));
}

std::array<LinearStorage, 7> linear_storage(const model::Config& c, DType dense, bool gguf,
                                            bool q8_0) {
  std::array<LinearStorage, 7> s{};
  for (LinearId id : kAllLinears) {
    const auto [rows, cols] = io::hf_linear_shape(c, id);
    LinearStorage& x = s[static_cast<size_t>(id)];
    x.rows = rows;
    x.cols = cols;
    x.nvfp4_bits = nvfp4_weight_bits(rows, cols);
    x.dense_bits = dense_weight_bits(rows, cols, dense, gguf, q8_0);
  }
  return s;
}

void check_target_bpw(double b) {
  if (!std::isfinite(b) || b < kNvfp4Bpw) {
    char v[64];
    std::snprintf(v, sizeof v, "%g", b);
    throw OptionError("target_bpw",
                      std::string(v) +
                          " bits per weight is below NVFP4's 4.5 (4-bit codes + an 8-bit scale "
                          "per 16 weights), the least any Linear takes; pass a value >= 4.5");
  }
}

MixedPlan plan_mixed_precision(const model::Config& c, const std::array<LinearStorage, 7>& storage,
                               const std::vector<LinearSensitivity>& sens,
                               const model::LinearSet& forced, double target_bpw,
                               bool fused_groups) {
  check_target_bpw(target_bpw);
  MixedPlan p;
  p.target_bpw = target_bpw;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears) {
      const LinearStorage& s = storage[static_cast<size_t>(id)];
      p.weights += static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.cols);
      p.base_bits += forced.contains(l, id) ? s.dense_bits : s.nvfp4_bits;
    }
  // floor(B · weights), forgiving the rounding of B itself (5.3571428571428 x 1400 is 7500).
  const double budget = target_bpw * static_cast<double>(p.weights);
  p.budget_bits = static_cast<uint64_t>(std::floor(budget * (1 + 1e-12)));
  if (p.budget_bits < p.base_bits) {
    char m[256];
    std::snprintf(m, sizeof m,
                  "%g bits per weight is below this model's least: %.4f with every Linear that "
                  "can be NVFP4 in NVFP4 (the others dense)",
                  target_bpw, p.base_bpw());
    throw OptionError("target_bpw", m);
  }
  // The units: a Linear, or (fused_groups) the members of its vLLM fused group in its layer.
  struct Unit {
    MixedStep step;
    double ratio = 0;
    int layer = 0, first = 0;
  };
  std::vector<Unit> units;
  for (const LinearSensitivity& x : sens) {
    if (forced.contains(x.layer, x.id))
      throw std::invalid_argument("plan_mixed_precision: " + io::hf_module_name(x.layer, x.id) +
                                  " has a sensitivity but is forced dense");
    const std::vector<LinearId> g =
        fused_groups ? vllm_fused_group(x.id) : std::vector<LinearId>{x.id};
    if (g.front() != x.id) continue;  // the group is made once, from its first member
    Unit u;
    u.layer = x.layer;
    u.first = static_cast<int>(x.id);
    for (LinearId m : g) {
      const auto it = std::find_if(sens.begin(), sens.end(), [&](const LinearSensitivity& y) {
        return y.layer == x.layer && y.id == m;
      });
      if (it == sens.end())
        throw std::invalid_argument("plan_mixed_precision: " + io::hf_module_name(x.layer, m) +
                                    " has no sensitivity but " + io::hf_module_name(x.layer, x.id) +
                                    " has");
      const LinearStorage& s = storage[static_cast<size_t>(m)];
      u.step.linears.emplace_back(x.layer, m);
      u.step.gain += it->score;
      u.step.extra_bits += s.dense_bits > s.nvfp4_bits ? s.dense_bits - s.nvfp4_bits : 0;
    }
    u.ratio = u.step.gain / static_cast<double>(std::max<uint64_t>(u.step.extra_bits, 1));
    units.push_back(std::move(u));
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    if (a.ratio != b.ratio) return a.ratio > b.ratio;
    return a.layer != b.layer ? a.layer < b.layer : a.first < b.first;
  });
  p.bits = p.base_bits;
  for (Unit& u : units) {
    if (!(u.step.gain > 0)) break;  // nothing to gain from the rest
    if (p.bits + u.step.extra_bits > p.budget_bits) continue;
    p.bits += u.step.extra_bits;
    u.step.bits = p.bits;
    for (const auto& [l, id] : u.step.linears) p.dense.add(l, id);
    p.steps.push_back(u.step);
  }
  return p;
}

}  // namespace scalesweep::pipeline

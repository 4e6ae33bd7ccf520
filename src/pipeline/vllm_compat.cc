// vLLM's NVFP4 loading rules (include/scalesweep/pipeline/vllm_compat.h).
#include "scalesweep/pipeline/vllm_compat.h"

#include <array>
#include <stdexcept>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/hf_names.h"

namespace scalesweep::pipeline {
using io::hf_linear_shape;
using io::kAllLinears;
using model::LinearId;

void check_tp(int tp) {
  if (tp < 1 || tp > kMaxTp)
    throw OptionError("tp", "tensor-parallel size " + std::to_string(tp) + " is not in 1.." +
                                std::to_string(kMaxTp));
}

bool vllm_row_parallel(LinearId id) { return id == LinearId::kO || id == LinearId::kDown; }

std::vector<LinearId> vllm_fused_group(LinearId id) {
  switch (id) {
    case LinearId::kQ:
    case LinearId::kK:
    case LinearId::kV:
      return {LinearId::kQ, LinearId::kK, LinearId::kV};
    case LinearId::kGate:
    case LinearId::kUp:
      return {LinearId::kGate, LinearId::kUp};
    case LinearId::kO:
    case LinearId::kDown:
      break;
  }
  return {id};
}

std::string_view vllm_fused_name(LinearId id) {
  switch (id) {
    case LinearId::kQ:
    case LinearId::kK:
    case LinearId::kV:
      return "qkv_proj";
    case LinearId::kGate:
    case LinearId::kUp:
      return "gate_up_proj";
    case LinearId::kO:
    case LinearId::kDown:
      break;
  }
  return model::linear_name(id);
}

std::string vllm_mixed_fused_note(const model::Config& c, const model::LinearSet& dense) {
  std::string where;
  int n = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : {LinearId::kQ, LinearId::kGate}) {
      int d = 0;
      const std::vector<LinearId> g = vllm_fused_group(id);
      for (LinearId m : g) d += dense.contains(l, m);
      if (d == 0 || d == static_cast<int>(g.size())) continue;
      if (n++ < 3)
        where += (where.empty() ? "" : ", ") + std::string("layer ") + std::to_string(l) + " " +
                 std::string(vllm_fused_name(id));
    }
  if (n == 0) return {};
  return "a fused group is partly dense (" + where + (n > 3 ? ", ..." : "") +
         "): vLLM needs one scheme per fused layer and refuses this checkpoint; scalesweep "
         "reads it";
}

std::vector<UnsupportedLinear> vllm_unsupported_linears(const model::Config& c, int tp) {
  check_tp(tp);
  std::array<std::string, 7> why;
  for (LinearId id : kAllLinears) {
    const int64_t k = hf_linear_shape(c, id).second;
    if (k % 16 != 0) {
      why[static_cast<size_t>(id)] =
          "K = " + std::to_string(k) +
          " is not a multiple of 16 (vLLM's NVFP4 layers hold weight_scale [N, K // 16] and "
          "whole 16-element blocks only)";
    } else if (tp > 1 && vllm_row_parallel(id)) {
      // vLLM (vllm/model_executor/layers/linear.py, RowParallelLinear.__init__):
      //   self.input_size_per_partition = divide(input_size, self.tp_size)
      // where divide() (vllm/distributed/utils.py) asserts input_size % tp_size == 0, then
      // quant_method.create_weights(input_size_per_partition=...); for compressed-tensors NVFP4
      // (compressed_tensors_w4a4_nvfp4.py, CompressedTensorsW4A4Fp4.create_weights; W4A16Fp4
      // alike) that allocates weight_packed [N, input_size_per_partition // 2] and
      // weight_scale [N, input_size_per_partition // group_size] with group_size 16: each
      // rank's K slice must be whole 16-element blocks.
      const std::string kt = "K = " + std::to_string(k);
      if (k % tp != 0)
        why[static_cast<size_t>(id)] =
            kt + " is not divisible by tp = " + std::to_string(tp) +
            " (vLLM's RowParallelLinear splits K across the tensor-parallel ranks)";
      else if ((k / tp) % 16 != 0)
        why[static_cast<size_t>(id)] =
            kt + " split over tp = " + std::to_string(tp) +
            " ranks gives K / tp = " + std::to_string(k / tp) +
            " per rank, not a multiple of 16 (vLLM's RowParallelLinear holds weight_scale "
            "[N, (K / tp) // 16] per rank)";
    }
  }
  // Fused in vLLM: one scheme per fused layer.
  for (LinearId head : {LinearId::kQ, LinearId::kGate}) {
    const std::vector<LinearId> members = vllm_fused_group(head);
    const std::string fname(vllm_fused_name(head));
    std::string cause;
    for (LinearId m : members)
      if (!why[static_cast<size_t>(m)].empty() && cause.empty())
        cause = std::string(model::linear_name(m)) + " cannot be quantized (" +
                why[static_cast<size_t>(m)] + ")";
    if (cause.empty()) continue;
    for (LinearId m : members)
      if (why[static_cast<size_t>(m)].empty())
        why[static_cast<size_t>(m)] = "fused into " + std::string(fname) +
                                      " in vLLM (one scheme per fused layer) and " + cause;
  }
  std::vector<UnsupportedLinear> out;
  for (LinearId id : kAllLinears)
    if (!why[static_cast<size_t>(id)].empty()) out.push_back({id, why[static_cast<size_t>(id)]});
  return out;
}

std::string vllm_tp_refusal(const model::Config& c, int tp) {
  check_tp(tp);
  for (LinearId id : kAllLinears) {
    if (vllm_row_parallel(id)) continue;
    const int64_t n = hf_linear_shape(c, id).first;
    if (n % tp != 0)
      return "vLLM will refuse tensor_parallel_size = " + std::to_string(tp) +
             " for this model: " + std::string(model::linear_name(id)) +
             " has N = " + std::to_string(n) + " output rows, not divisible by " +
             std::to_string(tp) + " (vLLM's column-parallel Linears split N across the ranks)";
  }
  return {};
}

std::vector<std::string> vllm_dense_notes(const model::Config& c, int tp, PartialBlocks pb,
                                          DType dense) {
  std::vector<std::string> out;
  if (const std::string r = vllm_tp_refusal(c, tp); !r.empty()) out.push_back(r);
  if (pb != PartialBlocks::kDense) return out;
  // The short spelling, as --dense-dtype takes it (f32, bf16, f16).
  const char* d = dense == DType::kF32 ? "f32" : dense == DType::kBF16 ? "bf16" : "f16";
  for (const UnsupportedLinear& u : vllm_unsupported_linears(c, tp))
    for (int l = 0; l < c.n_layers; ++l)
      out.push_back(io::hf_module_name(l, u.id) + " stays dense (" + d +
                    ", listed in quantization_config.ignore): " + u.reason + "; " +
                    option_ref("partial_blocks") +
                    " quantize stores it as NVFP4 for scalesweep's runtime only");
  return out;
}

}  // namespace scalesweep::pipeline

// vLLM's rules for loading a compressed-tensors NVFP4 checkpoint, in one file: which Linears
// its NVFP4 schemes cannot take (K not whole 16-element blocks, per tensor-parallel rank for
// the row-parallel o_proj/down_proj, and their fused partners), and when it refuses a
// tensor_parallel_size outright. Layer `pipeline`: these are rules of one consumer of the
// format, not of the format (compressed-tensors stores a partial last block, and scalesweep
// reads it), so they belong to the job that decides what to quantize.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/linear_set.h"

namespace scalesweep::pipeline {

// What the checkpoint writer does with Linears that vLLM's compressed-tensors NVFP4 path
// cannot load (see vllm_unsupported_linears).
enum class PartialBlocks {
  kDense,     // leave them (and their fused group) dense, listed in quantization_config.ignore
  kQuantize,  // quantize them anyway, partial last block (loadable by scalesweep only)
};
inline constexpr auto kPartialBlocksNames = make_names<PartialBlocks>(
    "partial-blocks policy",
    {{PartialBlocks::kDense, "dense"}, {PartialBlocks::kQuantize, "quantize"}});

// The Linears of a model with config `c` that vLLM's compressed-tensors NVFP4 schemes
// (CompressedTensorsW4A4Fp4 / W4A16Fp4) cannot take, with the reason, in kAllLinears order:
//  - K % 16 != 0: vLLM allocates weight_scale [N, K // 16] and weight_packed [N, K // 2]
//    (create_weights), so a partial last block has no place, and its FP4 GEMMs (CUTLASS,
//    FlashInfer, Marlin) work on whole 16-element groups. N has no constraint (vLLM pads N
//    to 32 for CUTLASS, to 64 for Marlin).
//  - a member of a fused group (q/k/v -> qkv_proj, gate/up -> gate_up_proj) whose partner
//    cannot be quantized: vLLM requires one scheme per fused layer (should_ignore_layer
//    raises "Found a different quantization schemes"), so the whole group stays dense.
//  - under tensor parallelism `tp` (vLLM's tensor_parallel_size), the row-parallel Linears
//    o_proj and down_proj (RowParallelLinear) split K: each rank holds K / tp input columns
//    (vLLM refuses K % tp != 0) and weight_scale [N, (K / tp) // 16], so they also need
//    (K / tp) % 16 == 0. Column-parallel Linears (q/k/v, gate/up) split N, which NVFP4 does
//    not constrain (see vllm_tp_refusal for vLLM's own divisibility requirement).
// Throws std::invalid_argument unless 1 <= tp <= kMaxTp.
inline constexpr int kMaxTp = 1024;
// Throws std::invalid_argument unless 1 <= tp <= kMaxTp.
void check_tp(int tp);
struct UnsupportedLinear {
  model::LinearId id;
  std::string reason;
};
std::vector<UnsupportedLinear> vllm_unsupported_linears(const model::Config& c, int tp = 1);
// Whether a Linear is row-parallel in vLLM (o_proj, down_proj: K split across ranks).
bool vllm_row_parallel(model::LinearId id);
// The Linears vLLM fuses with `id` into one layer with one quantization scheme, `id` included,
// in kAllLinears order: q/k/v (qkv_proj), gate/up (gate_up_proj); o_proj and down_proj alone.
std::vector<model::LinearId> vllm_fused_group(model::LinearId id);
// vLLM's name of the fused layer of `id` ("qkv_proj", "gate_up_proj"; o_proj/down_proj: their
// own name).
std::string_view vllm_fused_name(model::LinearId id);
// A note when some layer keeps part of a fused group dense (`dense`) and quantizes the rest:
// vLLM refuses such a checkpoint ("different quantization schemes"); "" when none does.
std::string vllm_mixed_fused_note(const model::Config& c, const model::LinearSet& dense);
// A note for the user when vLLM itself will refuse tensor_parallel_size = tp for this model
// (a column-parallel Linear whose N is not a multiple of tp: vLLM divides N by tp); empty
// when it will not (as far as these shapes tell; vLLM also checks head counts).
std::string vllm_tp_refusal(const model::Config& c, int tp);

// The stderr notes of a quantize run about these rules: vLLM's refusal of `tp` (if any) and,
// with PartialBlocks::kDense, one line per Linear that stays dense in `dense` dtype.
std::vector<std::string> vllm_dense_notes(const model::Config& c, int tp, PartialBlocks pb,
                                          DType dense);

}  // namespace scalesweep::pipeline

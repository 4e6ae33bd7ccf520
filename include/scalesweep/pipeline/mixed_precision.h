// Mixed precision by measured sensitivity (`scalesweep quantize --target-bpw B`): which Linears
// stay dense (Q8_0 in a GGUF with --dense-dtype q8_0, the dense dtype otherwise) so that the
// Linear weights take at most B bits per weight and the Linears whose quantization costs most
// are the ones kept. Layer `pipeline`; the writers store the choice (model::LinearSet).
//
// What counts (the budget and every bits-per-weight number here): the bytes of the Linears'
// weight tensors as written, over the decoder Linears of every layer, divided by their number
// of weights. NVFP4 = the E2M1 codes (4 bits) + one E4M3 block scale per 16 elements = 4.5
// bits (compressed-tensors weight_packed + weight_scale; ggml's 36-byte blocks of 64); Q8_0 =
// 34 bytes per 32 = 8.5 bits; bf16/f16 16; f32 32. The per-tensor F32 scalars (a
// compressed-tensors global or input global scale, a GGUF `.scale`: 4 bytes per NVFP4 Linear)
// are not counted; neither are embeddings, norms, biases or lm_head.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/linear_set.h"

namespace scalesweep::pipeline {

// NVFP4's cost: the least --target-bpw there is.
inline constexpr double kNvfp4Bpw = 4.5;

// How the cost of quantizing one Linear is measured (`--sensitivity`).
enum class Sensitivity {
  kOutput,    // tr(D H Dᵀ): the Linear's output squared error on the calibration tokens
  kRelative,  // tr(D H Dᵀ) / tr(W H Wᵀ): that error over the output's energy
  kKl,        // measured: the model's mean KL(dense || only this Linear quantized) per token
  kNll,       // measured: the increase of the mean NLL per token when only it is quantized
};
inline constexpr auto kSensitivityNames =
    make_names<Sensitivity>("sensitivity", {{Sensitivity::kOutput, "output"},
                                            {Sensitivity::kRelative, "relative"},
                                            {Sensitivity::kKl, "kl"},
                                            {Sensitivity::kNll, "nll"}});
// Whether `s` runs the model once per Linear (kKl, kNll) rather than reading the statistics.
inline bool sensitivity_is_measured(Sensitivity s) {
  return s == Sensitivity::kKl || s == Sensitivity::kNll;
}

// Bits of one Linear's weight tensor [rows, cols] as NVFP4 (block 16; a partial last block
// takes a whole scale byte and whole code bytes, as compressed-tensors stores it).
uint64_t nvfp4_weight_bits(int64_t rows, int64_t cols);
// Bits of one Linear's weight stored dense: `dense` (f32, bf16, f16) for a compressed-tensors
// checkpoint; for a GGUF (`gguf`) q8_0 when `q8_0` (F16 where the row is no whole number of 32),
// else `dense`.
uint64_t dense_weight_bits(int64_t rows, int64_t cols, DType dense, bool gguf, bool q8_0);

// The storage of each Linear kind of a model (indexed by model::LinearId).
struct LinearStorage {
  int64_t rows = 0, cols = 0;
  uint64_t nvfp4_bits = 0, dense_bits = 0;
};
std::array<LinearStorage, 7> linear_storage(const model::Config& c, DType dense, bool gguf,
                                            bool q8_0);

// One Linear's measured cost of quantization.
struct LinearSensitivity {
  int layer = 0;
  model::LinearId id = model::LinearId::kQ;
  // tr(D H Dᵀ), D = W − Ŵ for its RTN NVFP4 Ŵ with the run's selector and its fused group's
  // global scale, H = 2/n ΣxxT of its calibration input (n tokens): twice the mean squared
  // error of its output per token.
  double loss = 0;
  double energy = 0;  // tr(W H Wᵀ): the same for W (twice the mean output energy per token)
  // Measured (kKl, kNll): the mean KL divergence per token of the model's next-token
  // distribution with only this Linear quantized from the dense model's, and the change of the
  // mean NLL of the calibration tokens; 0 otherwise.
  double kl = 0, dnll = 0;
  double score = 0;  // what the budget ranks by (Sensitivity)
};

// The greedy choice under a budget: units (one Linear, or a fused group of one layer where
// vLLM needs one scheme per fused layer) ranked by their summed score per extra bit (dense
// minus NVFP4), highest first (ties: layer, then file order); each unit that still fits the
// budget is kept dense, the others skipped, down the whole list.
struct MixedStep {
  std::vector<std::pair<int, model::LinearId>> linears;  // the unit
  double gain = 0;                                       // its summed score
  uint64_t extra_bits = 0;                               // dense minus NVFP4
  uint64_t bits = 0;                                     // the Linears' total after this step
};
struct MixedPlan {
  double target_bpw = 0;
  uint64_t weights = 0;      // Σ rows·cols over every decoder Linear
  uint64_t budget_bits = 0;  // floor(target_bpw · weights · (1 + 1e-12)): B's own rounding
  uint64_t base_bits = 0;    // everything NVFP4 that can be (forced dense Linears dense)
  uint64_t bits = 0;         // after the choice (<= budget_bits)
  model::LinearSet dense;    // the Linears chosen (forced ones not included)
  std::vector<MixedStep> steps;
  double bpw() const { return weights ? static_cast<double>(bits) / weights : 0; }
  double base_bpw() const { return weights ? static_cast<double>(base_bits) / weights : 0; }
};

// Refuses (OptionError "target_bpw") a target that is not a finite number >= 4.5.
void check_target_bpw(double target_bpw);

// `sens`: every quantizable Linear's sensitivity (the others are `forced` dense: ggml or vLLM
// cannot take them as NVFP4, or --keep-dense). `fused_groups`: choose q/k/v and gate/up of a
// layer together (compressed-tensors for vLLM); otherwise Linear by Linear (GGUF). Throws
// OptionError "target_bpw" when the target is below the cost with every other Linear NVFP4.
MixedPlan plan_mixed_precision(const model::Config& c, const std::array<LinearStorage, 7>& storage,
                               const std::vector<LinearSensitivity>& sens,
                               const model::LinearSet& forced, double target_bpw,
                               bool fused_groups);

}  // namespace scalesweep::pipeline

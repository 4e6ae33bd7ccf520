// Block-scale selectors over one block (SPEC "Block-scale selectors"). This is the scalar
// REFERENCE every fast kernel (SIMD, CUDA) must match bit for bit; docs/NUMERICS.md states
// the arithmetic contract. Layer `scale`: depends on `format` only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace scalesweep {

enum class Method {
  kAbsMax,          // rn_fp8(a / 6)
  kFourOverSix,     // better of rn_fp8(a/6), rn_fp8(a/4); tie -> a/6
  kSweepMse,        // window [-3, 7] around I(floor_fp8(a/6)), widened where unproven
  kSweepWmse,       // window [-8, 7], weighted loss
  kSweep,           // custom window (SelectorConfig::window), MSE or WMSE by weights
  kExhaustiveMse,   // all 126 positive finite FP8 patterns
  kExhaustiveWmse,
  kOptFp8Mse,       // better of floor/ceil FP8 of the continuous optimum; tie -> floor
  kOptFp8Wmse,
  kOptFp32,         // exact continuous optimum (no FP8 rounding): metrics/dequant only
};

// Block-scale format: NVFP4 uses E4M3 scales, MXFP4 UE8M0 (powers of two, no global scale).
enum class ScaleFormat { kE4M3, kUE8M0 };

std::string_view method_name(Method m);
// Parses the CLI names: absmax, 4over6, sweep-mse, sweep-wmse, sweep, exhaustive-mse,
// exhaustive-wmse, opt-fp8-mse, opt-fp8-wmse, opt-fp32. Throws std::invalid_argument
// listing the valid names.
Method parse_method(std::string_view name);
std::vector<Method> all_methods();
bool method_is_weighted(Method m);  // uses importance weights in its objective

struct Window {
  int lo = -3, hi = 7;  // offsets in scale bit-pattern space, inclusive
};

struct SelectorConfig {
  Method method = Method::kSweepMse;
  ScaleFormat scale_format = ScaleFormat::kE4M3;
  // For kSweep (and to override the default window of kSweepMse/kSweepWmse).
  std::optional<Window> window;
};

// Result for one block.
struct BlockScale {
  uint8_t pattern = 0;  // scale bit pattern (E4M3 or UE8M0); 0 for an all-zero NVFP4 block
  float loss = 0;       // contract loss (docs/NUMERICS.md) of the chosen scale, y domain
};

// Chooses the scale of one block of n elements, given in the normalized domain
// y_i = fl(x_i * gs) (gs = encode-direction global scale; 1 for MXFP4). `w` are the
// per-element importance weights (nullptr = all ones). For kOptFp32 the returned pattern
// is meaningless; use opt_fp32_scale().
BlockScale select_block_scale(const float* y, const float* w, int n, const SelectorConfig& cfg);

// Contract loss of scale value s on the block: sum_i fl(w_i * fl(e_i^2)), e_i = y_i - q_i s,
// q_i = RNE_fp4(y_i / s), accumulated in float in index order (docs/NUMERICS.md).
// s == 0 gives codes 0, i.e. sum of w_i y_i^2.
float block_loss(const float* y, const float* w, int n, float s);

// The FP4 code (sign<<3 | index) of y for scale s (exact RNE of the real quotient y/s,
// saturating at 6; s == 0 gives code 0 with the sign of y).
uint8_t fp4_code(float y, float s);

// Sweep window actually used for a block with amax a (y domain), as inclusive pattern
// range [lo, hi] within 1..126, after widening for unproven bases (docs/NUMERICS.md).
struct PatternRange {
  int lo, hi;
};
PatternRange sweep_patterns(float a, const SelectorConfig& cfg);

// Exact continuous optimum (double) of the weighted loss over real s > 0 (paper App. C).
// Returns 0 for an all-zero block.
double opt_fp32_scale(const float* y, const float* w, int n);
// Loss in double for a real scale s (used for the opt-fp32 metrics).
double block_loss_f64(const float* y, const float* w, int n, double s);

}  // namespace scalesweep

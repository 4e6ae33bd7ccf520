// Block-scale selectors over one block (SPEC "Block-scale selectors"). This is the scalar
// REFERENCE every fast kernel (SIMD, CUDA) must match bit for bit; docs/NUMERICS.md states
// the arithmetic contract. Layer `scale`: depends on `format` only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/base/names.h"

namespace scalesweep {

enum class Method {
  kAbsMax,         // rn_fp8(a / 6)
  kFourOverSix,    // better of rn_fp8(a/6), rn_fp8(a/4); tie -> a/6
  kSweepMse,       // window [-3, 7] around I(floor_fp8(a/6)), widened where unproven
  kSweepWmse,      // window [-8, 7], weighted loss
  kSweep,          // custom window (SelectorConfig::window), MSE or WMSE by weights
  kExhaustiveMse,  // all 126 positive finite FP8 patterns
  kExhaustiveWmse,
  kOptFp8Mse,  // better of floor/ceil FP8 of the continuous optimum; tie -> floor
  kOptFp8Wmse,
  kOptFp32,  // exact continuous optimum (no FP8 rounding): metrics/dequant only
  // Block-Hessian objective e^T H_b e (H_b: the block's diagonal block of the input Hessian,
  // select_block_scale_hessian); windows not proven: sweep [-8, 24] (E4M3), or all 126.
  kSweepHessian,
  kExhaustiveHessian,
};

// Block-scale format: NVFP4 uses E4M3 scales, MXFP4 UE8M0 (powers of two, no global scale).
enum class ScaleFormat { kE4M3, kUE8M0 };

// The CLI / Python / JSON names, in the order of every listing (--compare, METHODS).
inline constexpr auto kMethodNames =
    make_names<Method>("method", {
                                     {Method::kAbsMax, "absmax"},
                                     {Method::kFourOverSix, "4over6"},
                                     {Method::kSweepMse, "sweep-mse"},
                                     {Method::kSweepWmse, "sweep-wmse"},
                                     {Method::kSweep, "sweep"},
                                     {Method::kExhaustiveMse, "exhaustive-mse"},
                                     {Method::kExhaustiveWmse, "exhaustive-wmse"},
                                     {Method::kOptFp8Mse, "opt-fp8-mse"},
                                     {Method::kOptFp8Wmse, "opt-fp8-wmse"},
                                     {Method::kOptFp32, "opt-fp32"},
                                     {Method::kSweepHessian, "sweep-hessian"},
                                     {Method::kExhaustiveHessian, "exhaustive-hessian"},
                                 });
inline constexpr auto kScaleFormatNames = make_names<ScaleFormat>(
    "scale format", {{ScaleFormat::kE4M3, "e4m3"}, {ScaleFormat::kUE8M0, "ue8m0"}});

// True when the method reads importance weights: the *-wmse methods, sweep (WMSE when given
// weights) and opt-fp32 (the weighted optimum when given weights).
bool method_uses_weights(Method m);
// True when the method's objective is the weighted loss by definition (the *-wmse methods):
// the methods that a weighted calibration serves.
bool method_is_weighted(Method m);
// True for the block-Hessian methods (sweep-hessian, exhaustive-hessian): they read a
// [block, block] matrix per block (select_block_scale_hessian), not per-element weights.
bool method_uses_hessian(Method m);
// True when the method needs calibration data: the weighted and the block-Hessian methods.
bool method_needs_calibration(Method m);

// A sweep window: offsets in scale bit-pattern space relative to a block's base pattern,
// inclusive (the selectors' custom window, and the proven windows of scale/bounds.h).
struct Window {
  int lo = -3, hi = 7;
};

struct SelectorConfig {
  Method method = Method::kSweepMse;
  ScaleFormat scale_format = ScaleFormat::kE4M3;
  // Required for kSweep; for kSweepMse/kSweepWmse it overrides the default window and is then
  // used as given (no widening, docs/NUMERICS.md). Must satisfy lo <= hi.
  std::optional<Window> window;
};

// Default offset window of a sweep method in a scale format (kSweepMse/kSweepWmse/
// kSweepHessian; E4M3: [-3,7] / [-8,7] / [-8,24]; UE8M0: [0,1] / [-1,1] / [-1,3]). Throws for
// methods without a default window.
Window default_window(Method m, ScaleFormat f);

// The widest meaningful window offset in a scale format: max_scale_pattern -
// min_scale_pattern (E4M3 125, UE8M0 254); wider offsets only clip.
int max_window_offset(ScaleFormat f);
// Throws std::invalid_argument "<what> (lo, hi): ..." unless lo <= hi and both lie in
// [-max_window_offset(f), max_window_offset(f)].
void check_window(const Window& w, ScaleFormat f, std::string_view what = "window");
// Parses "L,R" (two integers, e.g. "-3,7") and checks it as check_window does; messages name
// `what` and the text ("--window 'a,b': expected L,R ...").
Window parse_window(std::string_view s, ScaleFormat f, std::string_view what = "window");

// Scale patterns of a format: E4M3 positive finite 1..126 (pattern 0 = scale 0), UE8M0
// 0..254 (pattern e = 2^(e-127), never zero).
int min_scale_pattern(ScaleFormat f);  // 1 (E4M3) or 0 (UE8M0)
int max_scale_pattern(ScaleFormat f);  // 126 (E4M3) or 254 (UE8M0)
// Exact value of a scale pattern as float (E4M3 pattern 0 is 0).
float scale_value(int pattern, ScaleFormat f);

// Result for one block.
struct BlockScale {
  uint8_t pattern = 0;  // scale bit pattern (E4M3 or UE8M0); 0 for an all-zero block
  float loss = 0;       // contract loss (docs/NUMERICS.md) of the chosen scale, y domain
                        // (UE8M0: the binary64 loss rounded to float),
                        // weighted with w for the methods that use weights, else unweighted
};

// Chooses the scale of one block of n >= 1 elements, given in the normalized domain
// y_i = fl(x_i * gs) (gs = encode-direction global scale; 1 for MXFP4). `w` are the
// per-element importance weights (nullptr = all ones); they are used by the *-wmse methods,
// by kSweep (WMSE when w != nullptr) and ignored by absmax, 4over6 and the *-mse methods.
// Throws std::invalid_argument for kOptFp32 (no FP8 pattern; use opt_fp32_scale()) and for
// kSweep without a window.
BlockScale select_block_scale(const float* y, const float* w, int n, const SelectorConfig& cfg);

// The block-Hessian selectors (kSweepHessian, kExhaustiveHessian): the pattern minimising
// L(s) = sum_i e_i t_i, t_i = sum_j h[j * ld + i] e_j (j ascending, then i ascending, all in
// double), over the signed errors e_i = sgn(y_i) fl(|y_i| - q_i s) of round-to-nearest codes
// q_i = RNE_fp4(|y_i| / s) (E4M3: e_i in float as in block_loss; UE8M0: in double); h is the
// block's [n, n] Hessian with leading dimension ld >= n (symmetric positive semi-definite
// in use; only finiteness is assumed). Ties -> the smaller pattern; an all-zero block gives
// pattern 0. The candidates: kExhaustiveHessian every positive finite pattern; kSweepHessian
// sweep_patterns(): [P-8, P+24] for E4M3 with sweep-wmse's widening below normal bases (not
// proven for a full H_b: the per-element dominance arguments of docs/BOUNDS.md need a
// separable loss; the upper end from the optima measured on SmolLM2, docs/NUMERICS.md). Throws
// std::invalid_argument for any other method.
BlockScale select_block_scale_hessian(const float* y, const double* h, int ld, int n,
                                      const SelectorConfig& cfg);
// The block-Hessian loss of one scale pattern, as select_block_scale_hessian computes it.
double hessian_loss(const float* y, const double* h, int ld, int n, int pattern, ScaleFormat f);

// Contract loss of an E4M3 scale value s on the block: sum_i fl(fl(e_i^2) * w_i),
// e_i = fl(|y_i| - q_i s), q_i = RNE_fp4(|y_i| / s), accumulated in float in index order
// (docs/NUMERICS.md). s == 0 gives codes 0, i.e. sum of w_i y_i^2.
float block_loss(const float* y, const float* w, int n, float s);
// The selectors' objective for a scale pattern: block_loss for E4M3; for UE8M0 (whose raw MX
// blocks span the whole float range) the same formula in binary64, block_loss_f64.
double contract_loss(const float* y, const float* w, int n, int pattern, ScaleFormat f);

// The FP4 code (sign<<3 | index) of y for scale s (exact RNE of the real quotient y/s,
// saturating at 6; s == 0 gives magnitude 0; the sign of y is always kept, so -0.0 and tiny
// negatives give code 8).
uint8_t fp4_code(float y, float s);
// E2M1 magnitude index 0..7 of a non-negative quotient q (RNE, ties to even index, saturating).
int fp4_index(float q);

// Pattern range [lo, hi] (inclusive, within min..max_scale_pattern) that the sweep methods
// (kSweepMse, kSweepWmse, kSweep) search for a block of n elements with amax a (y domain),
// after the widening of docs/NUMERICS.md where the paper's window is not proven.
struct PatternRange {
  int lo, hi;
};
PatternRange sweep_patterns(float a, int n, const SelectorConfig& cfg);
// I(floor_fmt(a/6)): the base pattern of the sweeps (E4M3 0 when a/6 < 2^-9; UE8M0 0 when
// a/6 < 2^-126).
int base_pattern(float a, ScaleFormat f);

// Exact continuous optimum (double) of the weighted loss over real s > 0 (paper App. C).
// Returns 0 for an all-zero block.
double opt_fp32_scale(const float* y, const float* w, int n);
// The same formula with every operation in double for a real scale s: e = |y| - q s,
// t = e * e, t = t * w, L = L + t in index order, q = RNE_fp4(fl64(|y| / s)) (opt-fp32, and
// the UE8M0 contract loss, where s is a power of two and the quotient is exact).
double block_loss_f64(const float* y, const float* w, int n, double s);

}  // namespace scalesweep

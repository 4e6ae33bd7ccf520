// Exact per-pattern tables for the NVFP4 fast kernels (E4M3 block scales), built at compile
// time from the generic minifloat codec. Layout is "transposed" (row = threshold or grid level,
// column = scale pattern) so that a vector load at column `lo` gives the values of the
// consecutive candidate patterns lo, lo+1, ... (docs/NUMERICS.md, "Fast CPU path").
#pragma once

#include <cstdint>

#include "scalesweep/format/minifloat.h"

namespace scalesweep::simd {

// Columns: patterns 0..126, then copies of pattern 126 so that a full vector (<= 16 lanes)
// loaded at any pattern <= 126 stays inside the row and finite.
inline constexpr int kTabStride = 128 + 16;
// Rows: 7 thresholds (then +inf padding) and 8 grid levels (then level 7 padding), so a kernel
// may start at any level k0 <= 7 and look up to 4 thresholds past it.
inline constexpr int kTabRows = 12;

struct ScaleTables {
  // thr[b][p]: the exact product s_p * mid_b, bumped to the next float for even b, so that
  // "index > b" is always |y| >= thr[b][p] (ties: even b stays, odd b goes up). Pattern 0
  // (scale 0) has +inf thresholds, so every code is 0 (sign kept).
  float thr[kTabRows][kTabStride];
  // lvl[k][p]: the exact product v_k * s_p (v = 0, .5, 1, 1.5, 2, 3, 4, 6).
  float lvl[kTabRows][kTabStride];
  float scale[kTabStride];  // s_p
};

constexpr ScaleTables make_scale_tables() {
  ScaleTables t{};
  constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  constexpr float kLvl[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  constexpr float kInf = __builtin_inff();
  for (int c = 0; c < kTabStride; ++c) {
    const int p = c <= 126 ? c : 126;
    const float s = format::E4M3::decode_f(static_cast<uint32_t>(p));
    t.scale[c] = s;
    for (int b = 0; b < kTabRows; ++b) {
      float th = kInf;
      if (b < 7 && p != 0) {
        th = s * kMid[b];  // exact: <= 4 + 3 significant bits, no underflow (s >= 2^-9)
        if (b % 2 == 0)
          th = format::detail::f32_from_bits(format::detail::f32_bits(th) + 1u);  // next up
      }
      t.thr[b][c] = th;
      t.lvl[b][c] = kLvl[b < 8 ? b : 7] * s;  // exact
    }
  }
  return t;
}

inline constexpr ScaleTables kScaleTables = make_scale_tables();

// Split-half tables for 16 consecutive candidate patterns c .. c + 15 (c >= 8: normal scales),
// docs/NUMERICS.md ("Fast CPU path"). Lanes 0-7 hold columns c .. c+7 and lanes 8-15 columns
// c+8 .. c+15 of kScaleTables (copies of pattern 126 past it); in variant d, row r holds row
// r + d of the table in lanes 0-7 and row r in lanes 8-15. For an element with index k_hi at
// column c+15 and k_lo = k_hi + d at column c+7, rows k_hi, k_hi+1 (thresholds) and k_hi ..
// k_hi+2 (levels) are that element's rows k_lo.. in the low half and k_hi.. in the high one.
inline constexpr int kSplitRows = 10;     // k_hi + 2 <= 9
inline constexpr int kSplitVariants = 3;  // d = k_lo - k_hi in {0, 1, 2}
struct alignas(64) SplitTable {
  float thr[kSplitRows][16];
  float lvl[kSplitRows][16];
};
// Entry 3 * c + d for c = 0 .. 126 (built once, on first use; thread-safe).
const SplitTable* split_tables();

}  // namespace scalesweep::simd

// Provable sweep windows, derived in exact arithmetic (docs/BOUNDS.md).
//
// For an element format (E2M1, E3M2, E2M3, E4M3, E5M2), a scale format (E4M3, UE8M0) and a
// block size n, this derives which scale bit patterns can be the exhaustive MSE optimum of a
// block, relative to the base pattern P = I(floor_S(amax / gmax)):
//   - the paper's Table 1 (upper bound from the half-scale dominance lemma, any format),
//   - the paper's Tables 2/3 (lower bound: exclusion of small ratios by doubling, and convex
//     certificates for the remaining ratios, found automatically and checked exactly),
//   - a per-base-pattern window for every base pattern, including the subnormal scale bases
//     where the paper's argument does not apply, such that the exhaustive optimum of the
//     selectors' contract loss (float32 for E4M3 scales, float64 for UE8M0; tie -> smaller
//     pattern) lies inside [P + lo, P + hi] for every block of at most n elements.
// Layer `scale`: depends on `format` only.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/scale/rational.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::bounds {

enum class ElemFormat { kE2M1, kE3M2, kE2M3, kE4M3, kE5M2 };

inline constexpr auto kElemFormatNames =
    make_names<ElemFormat>("element format", {{ElemFormat::kE2M1, "e2m1"},
                                              {ElemFormat::kE3M2, "e3m2"},
                                              {ElemFormat::kE2M3, "e2m3"},
                                              {ElemFormat::kE4M3, "e4m3"},
                                              {ElemFormat::kE5M2, "e5m2"}});
// Scale formats: kScaleFormatNames (scale/selector.h).

// Non-negative finite values of the element format, ascending, starting with 0.
std::vector<Rat> element_grid(ElemFormat e);

// Positive finite scale patterns used by the selectors' sweeps: E4M3 1..126, UE8M0 0..254.
int scale_min_pattern(ScaleFormat f);
int scale_max_pattern(ScaleFormat f);
double scale_value_f64(ScaleFormat f, int pattern);
// v(q) / v(p) exactly; throws RatOverflow when it does not fit (only for far-apart UE8M0).
Rat scale_ratio(ScaleFormat f, int q, int p);

// d_r(y) = min_{g in grid} (y - r g)^2 for y >= 0: a piecewise quadratic whose pieces are
// centred at r*g_k and change at the exact midpoints r*(g_k + g_{k+1})/2.
class ElementLoss {
 public:
  ElementLoss(const std::vector<Rat>& grid, const Rat& r);
  Rat operator()(const Rat& y) const;
  double eval(double y) const;
  const Rat& ratio() const { return r_; }
  const std::vector<Rat>& breakpoints() const { return bp_; }
  const std::vector<Rat>& centers() const { return c_; }
  // max of d_r over [lo, hi] (convex pieces: attained at an end or a breakpoint).
  Rat sup(const Rat& lo, const Rat& hi) const;

 private:
  Rat r_;
  std::vector<Rat> c_, bp_;
  std::vector<double> cd_, bpd_;
};

// Arithmetic of the selectors' loss; certificates must survive its rounding.
enum class LossArith { kFloat32, kFloat64 };

// The normalized block (units of the base scale): the maximal coordinate lies in
// [ymax_lo, yhi], every other one in [0, yhi]; yhi absent = unbounded.
struct Domain {
  Rat ymax_lo;
  std::optional<Rat> yhi;
  int n = 16;
  LossArith arith = LossArith::kFloat32;
};

// A convex certificate excluding ratio r: sum_j lambda_j d_{u_j}(y) - d_r(y) =: Delta(y),
// A = sup Delta on the max-coordinate range, B = sup Delta on [0, yhi], margin = A + (n-1)B.
// margin < 0 proves sum_j lambda_j L(u_j) < L(r) for every block, hence some u_j beats r.
struct Certificate {
  Rat r;
  int q = -1;  // scale pattern of r (-1 when not tied to a pattern)
  int m = 0;   // base mantissa (class tables), or base pattern (per-base)
  std::vector<Rat> u;
  std::vector<int> u_patterns;
  std::vector<Rat> lambda;
  bool bounded = true;  // false: Delta grows without bound (no certificate)
  Rat A, B, margin;
  // Rounding allowance of the contract loss: margin + allowance < 0 is required.
  Rat allowance;
  bool exact_ok = false;  // margin < 0
  bool valid = false;     // margin + allowance < 0
};

// Relative error bound of the contract loss of n elements: (n + 3) u >= (n+2)u / (1-(n+2)u),
// u = 2^-24 (float32) or 2^-53 (binary64).
Rat rounding_gamma(int n, LossArith arith);

Certificate evaluate_certificate(const std::vector<Rat>& grid, const Rat& r,
                                 const std::vector<Rat>& u, const std::vector<Rat>& lambda,
                                 const Domain& dom);

struct PoolEntry {
  Rat u;
  int pattern = -1;
};
enum class SearchMode {
  kAny,   // smallest support first, first valid certificate
  kBest,  // weights on a 1/4 grid, then 1/8, 1/16; within a grid the most negative margin
};
// Searches supports of 1..3 pool entries with weights on a dyadic grid (double prefilter,
// then exact verification). nullopt when none is valid.
std::optional<Certificate> find_certificate(const std::vector<Rat>& grid, const Rat& r,
                                            const std::vector<PoolEntry>& pool, const Domain& dom,
                                            SearchMode mode);

// ---- Paper-style tables for normal, unsaturated bases ----
struct UpperRow {
  int b = 0;            // mantissa bits of the base
  int carry = 0;        // exponent step of sup relative to the base
  int sup_mant = 0;     // mantissa bits of sup = floor_S(alpha * next(base)) (paper Table 1)
  int paper_delta = 0;  // I(sup) - I(base), as the paper tabulates it
  int delta = 0;        // I(largest scale < alpha * next(base)) - I(base): what is proven
};
struct UpperTable {
  Rat half_g;     // largest grid value whose whole prefix is closed under doubling
  Rat threshold;  // t: |y| < t*s rounds into that prefix (E2M1: 3.5)
  Rat alpha;      // gmax / t (E2M1: 12/7)
  std::vector<UpperRow> rows;
  int hi = 0;
};
struct LowerRow {
  int b = 0;
  int borrow = 0;        // exponent step down of inf relative to the base
  int inf_mant = 0;      // mantissa bits of inf = smallest scale >= ell * base
  int delta = 0;         // I(base) - I(inf)
  Rat first_unexcluded;  // smallest ratio >= r0 that no certificate excludes for this b
};
struct LowerTable {
  Rat beta;      // sup_z d_2(z) - d_1(z): the doubling penalty on one element, in r^2 units
  Rat g_double;  // grid value used for the maximal coordinate under 2r
  Rat r0;        // every ratio r < r0 loses to 2r (analytic, exact)
  Rat ell;       // largest lower ratio: every legal ratio below it is excluded
  std::vector<LowerRow> rows;
  int lo = 0;
  std::vector<LowerRow> paper_rows;  // rows for the paper's ell = 4/5 (E2M1/E4M3 only)
};

// Offsets relative to the base pattern, inclusive: the selectors' Window (scale/selector.h).
using PatternWindow = Window;
struct BaseWindow {
  int pattern = 0;
  std::optional<PatternWindow> window;
  std::string note;
};

struct Derivation {
  ElemFormat elem = ElemFormat::kE2M1;
  ScaleFormat scale = ScaleFormat::kE4M3;
  int block = 16;
  LossArith arith = LossArith::kFloat32;
  UpperTable upper;
  LowerTable lower;
  std::vector<Certificate> certificates;  // class level: legal ratios in [r0, ell)
  std::vector<Certificate> paper_checks;  // the paper's own Table 3, rechecked (E2M1/E4M3)
  Rat max_u;                              // largest dominating ratio used (saturation cond.)
  PatternWindow window;                   // class-level window for normal bases
  std::vector<BaseWindow> per_base;       // every base pattern 0..pmax
};

// Full derivation (tables, certificates, per-base windows). block in 1..1024.
Derivation derive(ElemFormat elem, ScaleFormat scale, int block);

// The derivation `scalesweep bounds` shows, the formats given by name (kElemFormatNames,
// kScaleFormatNames; std::invalid_argument for an unknown one) and the block checked to be in
// 1..1024 (std::invalid_argument "--block must be in 1..1024").
Derivation derive_named(const std::string& elem, const std::string& scale, int block);

// How the tables show patterns: the mantissa bits of a scale pattern (3 for E4M3, 0 for
// UE8M0), the low `width` bits of v, most significant first ("-" for width 0), and the value of
// a base pattern (0 for E4M3 pattern 0, else scale_value_f64).
int scale_mantissa_bits(ScaleFormat f);
std::string bit_string(int v, int width);
double base_value(ScaleFormat f, int pattern);

// Per-base window only (what the selectors need). Cached; thread-safe; the first call for a
// (elem, scale, block) key computes the table (well under a second for E2M1). Blocks of any
// length n <= block are covered, so callers may round n up. nullopt: nothing proven for this
// base (use the exhaustive sweep).
std::optional<PatternWindow> proven_window(ElemFormat elem, ScaleFormat scale, int block,
                                           int base_pattern);
// Block size whose table covers a block of n elements (next power of two >= 8), 0 if n > 1024.
int covering_block(int n);

// ---- Adversarial search ----
struct AttackConfig {
  ElemFormat elem = ElemFormat::kE2M1;
  ScaleFormat scale = ScaleFormat::kE4M3;
  int block = 16;
  std::optional<PatternWindow> window;  // fixed offsets; absent = the per-base proven windows
  long blocks = 2000;                   // random restarts
  int steps = 200;                      // local-search steps per restart
  unsigned long long seed = 1;
  std::vector<int> bases;  // base patterns to target (empty = all reachable ones)
};
struct AttackHit {
  std::vector<float> y;
  int base = 0, best = 0;  // base pattern and exhaustive optimum pattern
  int offset = 0;          // best - base
  double loss_best = 0, loss_window = 0;
};
struct AttackResult {
  long restarts = 0, evaluations = 0;
  int max_offset = -1000, min_offset = 1000;    // extreme optimum offsets seen
  std::map<int, std::pair<int, int>> per_base;  // base -> (min, max) optimum offset seen
  std::vector<AttackHit> hits;                  // counterexamples (optimum outside the window)
};
// progress(done, total) is called now and then (may be empty).
AttackResult attack(const AttackConfig& cfg,
                    const std::function<void(long, long)>& progress = nullptr);
// The exhaustive optimum of one block under the selectors' loss (E2M1: the contract loss of
// selector.h; other element formats: the same formula in binary64 on their grid).
int exhaustive_best(ElemFormat elem, ScaleFormat scale, const float* y, int n, double* loss);
int base_of(ElemFormat elem, ScaleFormat scale, float amax);

}  // namespace scalesweep::bounds

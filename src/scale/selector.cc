// Scalar reference of the block-scale selectors (SPEC "Block-scale selectors",
// docs/NUMERICS.md). Every fast path must reproduce these bytes.
//
// Why fl(a/6) followed by a directed rounding onto the scale grid is exact: every scale value
// v is a float, and v <= a/6 (real) <=> v <= fl(a/6) because rounding is monotone and v is
// representable. The same holds for ceil and, for RNE, the grid midpoints are floats too
// (E4M3 midpoints have 5 significant bits; UE8M0 midpoints 1.5*2^k), so fl(a/6) lies on the
// same side of every midpoint as a/6, and on a midpoint only when a/6 is on it.
#include "scalesweep/scale/selector.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/scale/bounds.h"

namespace scalesweep {
namespace {

using format::E2M1;
using format::E4M3;
using format::Round;
using format::UE8M0;

constexpr float kFp4Mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
constexpr double kFp4MagD[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
// Grid midpoints; ties go to the even index: strict '>' before even indices 2,4,6 ... see
// fp4_index.
constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

int encode_scale(float v, ScaleFormat f, Round r) {
  if (f == ScaleFormat::kE4M3) return static_cast<int>(E4M3::encode(v, r));
  return static_cast<int>(UE8M0::encode(v, r));
}

// Largest float <= d and smallest float >= d (d >= 0, finite).
float float_below(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) > d) f = std::nextafter(f, 0.0f);
  return f;
}
float float_above(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) < d) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

float block_amax(const float* y, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(y[i]));
  return a;
}

bool uses_weights(Method m) {
  return m == Method::kSweepWmse || m == Method::kExhaustiveWmse || m == Method::kOptFp8Wmse ||
         m == Method::kSweep || m == Method::kOptFp32;
}

BlockScale result(int p, double loss) {
  return {static_cast<uint8_t>(p), static_cast<float>(loss)};
}

// Best pattern of an ascending candidate range; ties -> the first.
BlockScale best_in_range(const float* y, const float* w, int n, int lo, int hi, ScaleFormat f) {
  int bp = lo;
  double bl = contract_loss(y, w, n, lo, f);
  for (int p = lo + 1; p <= hi; ++p) {
    const double l = contract_loss(y, w, n, p, f);
    if (l < bl) bp = p, bl = l;
  }
  return result(bp, bl);
}

}  // namespace

bool method_uses_weights(Method m) {
  return method_is_weighted(m) || m == Method::kSweep || m == Method::kOptFp32;
}

bool method_is_weighted(Method m) {
  return m == Method::kSweepWmse || m == Method::kExhaustiveWmse || m == Method::kOptFp8Wmse;
}

bool method_uses_hessian(Method m) {
  return m == Method::kSweepHessian || m == Method::kExhaustiveHessian;
}

bool method_needs_calibration(Method m) { return method_is_weighted(m) || method_uses_hessian(m); }

Window default_window(Method m, ScaleFormat f) {
  const bool e4 = f == ScaleFormat::kE4M3;
  if (m == Method::kSweepMse) return e4 ? Window{-3, 7} : Window{0, 1};
  if (m == Method::kSweepWmse) return e4 ? Window{-8, 7} : Window{-1, 1};
  if (m == Method::kSweepHessian) return e4 ? Window{-8, 24} : Window{-1, 3};
  throw std::invalid_argument("method '" + std::string(kMethodNames.name(m)) +
                              "' has no default sweep window");
}

int max_window_offset(ScaleFormat f) { return max_scale_pattern(f) - min_scale_pattern(f); }

void check_window(const Window& w, ScaleFormat f, std::string_view what) {
  const std::string where =
      std::string(what) + " (" + std::to_string(w.lo) + ", " + std::to_string(w.hi) + ")";
  if (w.lo > w.hi)
    throw std::invalid_argument(where + ": lo (" + std::to_string(w.lo) + ") > hi (" +
                                std::to_string(w.hi) + "); expected L,R with L <= R");
  const int m = max_window_offset(f);
  if (w.lo < -m || w.hi > m)
    throw std::invalid_argument(where + ": offsets must lie in [" + std::to_string(-m) + ", " +
                                std::to_string(m) + "] for " +
                                std::string(kScaleFormatNames.name(f)) + " scales");
}

Window parse_window(std::string_view s, ScaleFormat f, std::string_view what) {
  const std::string text(s);
  const std::string where = std::string(what) + " '" + text + "'";
  Window w;
  const size_t c = text.find(',');
  bool ok = c != std::string::npos;
  if (ok) {
    try {
      size_t p1 = 0, p2 = 0;
      w.lo = std::stoi(text.substr(0, c), &p1);
      w.hi = std::stoi(text.substr(c + 1), &p2);
      ok = p1 == c && p2 == text.size() - c - 1 && p1 > 0 && p2 > 0;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok) throw std::invalid_argument(where + ": expected L,R (two integers, e.g. -3,7)");
  try {
    check_window(w, f, what);
  } catch (const std::invalid_argument& e) {
    // Name the text as given.
    const std::string m = e.what();
    throw std::invalid_argument(where + m.substr(m.find(':')));
  }
  return w;
}

int min_scale_pattern(ScaleFormat f) { return f == ScaleFormat::kE4M3 ? 1 : 0; }
int max_scale_pattern(ScaleFormat f) {
  return f == ScaleFormat::kE4M3 ? static_cast<int>(E4M3::kMaxPattern)
                                 : static_cast<int>(UE8M0::kMaxPattern);
}

float scale_value(int pattern, ScaleFormat f) {
  if (f == ScaleFormat::kE4M3) return E4M3::decode_f(static_cast<uint32_t>(pattern));
  return UE8M0::decode_f(static_cast<uint32_t>(pattern));
}

int fp4_index(float q) {
  return (q > kMid[0]) + (q >= kMid[1]) + (q > kMid[2]) + (q >= kMid[3]) + (q > kMid[4]) +
         (q >= kMid[5]) + (q > kMid[6]);
}

uint8_t fp4_code(float y, float s) {
  const uint8_t sign = std::signbit(y) ? 8 : 0;
  if (s == 0.0f) return sign;
  // fl(|y| / s) then RNE onto the grid equals RNE of the real quotient (docs/NUMERICS.md);
  // an overflowing quotient (inf) saturates to 6.
  return static_cast<uint8_t>(sign | fp4_index(std::fabs(y) / s));
}

float block_loss(const float* y, const float* w, int n, float s) {
  float L = 0;
  if (s == 0.0f) {
    for (int i = 0; i < n; ++i) {
      float t = y[i] * y[i];
      if (w) t = t * w[i];
      L = L + t;
    }
    return L;
  }
  // Exact threshold products s*mid (scale values have <= 4 significant bits, midpoints <= 3,
  // so the products are exact unless they overflow to inf, which compares correctly).
  float th[7];
  for (int k = 0; k < 7; ++k) th[k] = s * kMid[k];
  for (int i = 0; i < n; ++i) {
    const float ay = std::fabs(y[i]);
    const int idx = (ay > th[0]) + (ay >= th[1]) + (ay > th[2]) + (ay >= th[3]) + (ay > th[4]) +
                    (ay >= th[5]) + (ay > th[6]);
    const float p = kFp4Mag[idx] * s;  // exact (|y| >= p*... finite for finite inputs)
    const float e = ay - p;            // |fl(y - sign*p)| == fl(|y| - p)
    float t = e * e;
    if (w) t = t * w[i];
    L = L + t;
  }
  return L;
}

double block_loss_f64(const float* y, const float* w, int n, double s) {
  double L = 0;
  for (int i = 0; i < n; ++i) {
    const double ay = std::fabs(static_cast<double>(y[i]));
    double p = 0;
    if (s > 0) {
      const double q = ay / s;
      const int idx =
          (q > 0.25) + (q >= 0.75) + (q > 1.25) + (q >= 1.75) + (q > 2.5) + (q >= 3.5) + (q > 5.0);
      p = kFp4MagD[idx] * s;
    }
    const double e = ay - p;
    double t = e * e;
    if (w) t = t * static_cast<double>(w[i]);
    L = L + t;
  }
  return L;
}

double contract_loss(const float* y, const float* w, int n, int pattern, ScaleFormat f) {
  if (f == ScaleFormat::kE4M3) return block_loss(y, w, n, scale_value(pattern, f));
  // UE8M0: s is a power of two, so |y|/s in double is the exact real quotient.
  return block_loss_f64(y, w, n, std::ldexp(1.0, pattern - 127));
}

int base_pattern(float a, ScaleFormat f) { return encode_scale(a / 6.0f, f, Round::kFloor); }

PatternRange sweep_patterns(float a, int n, const SelectorConfig& cfg) {
  const ScaleFormat f = cfg.scale_format;
  const int pmin = min_scale_pattern(f), pmax = max_scale_pattern(f);
  const int P = base_pattern(a, f);
  auto clip = [&](int lo, int hi) {
    lo = std::clamp(lo, pmin, pmax);
    hi = std::clamp(hi, pmin, pmax);
    return PatternRange{lo, std::max(lo, hi)};
  };
  if (cfg.method == Method::kSweep || cfg.window) {
    if (!cfg.window) throw std::invalid_argument("method 'sweep' needs a window [lo, hi]");
    const Window win = *cfg.window;
    if (win.lo > win.hi)
      throw std::invalid_argument("sweep window lo (" + std::to_string(win.lo) + ") > hi (" +
                                  std::to_string(win.hi) + ")");
    return clip(P + win.lo, P + win.hi);
  }
  const Window win = default_window(cfg.method, f);
  if (cfg.method == Method::kSweepMse) {
    // Per-base window proven in exact arithmetic (src/scale/bounds, docs/BOUNDS.md); where
    // nothing is proven (top pattern, n > 1024) the widening below applies.
    if (const auto pw = bounds::proven_window(bounds::ElemFormat::kE2M1, f, n, P))
      return clip(P + pw->lo, P + pw->hi);
  }
  if (f == ScaleFormat::kUE8M0) {
    // Powers of two: the scale above 2*base exceeds a/3.5 and is weakly dominated by its half
    // (Lemma 4.1, exact halving for patterns >= 1), and for n <= 64 every scale <= base/2 is
    // strictly dominated by its double (docs/NUMERICS.md), so [P, P+1] holds the MSE optimum.
    return clip(P + win.lo, P + win.hi);
  }
  // E4M3. Upper end: P+7 is proven when P >= 16 (Lemma 4.1 + 4.2); below, patterns 8..15 have
  // inexact halves and are kept.
  const bool normal = P >= 16;
  // sweep-hessian reaches higher (scales above a/3.5 can win under a full H_b: NUMERICS.md).
  const int up = cfg.method == Method::kSweepHessian ? win.hi : 7;
  const int hi = normal ? P + up : std::max(P + up, 15);
  int lo;
  if (cfg.method == Method::kSweepMse) {
    const bool paper = normal && n <= 16 && (11.0 / 7.0) * scale_value(P, f) <= 448.0;
    if (paper)
      lo = P + win.lo;  // Lemma 4.3 (n = 16; blocks of n < 16 are zero-padded ones)
    else if (normal)
      lo = P - 7;  // every scale <= base/2 loses to its double for n <= 64
    else
      lo = pmin;
  } else {  // kSweepWmse, kSweepHessian: heuristic lower end, widened to the bottom below normal
    lo = normal ? P + win.lo : pmin;
  }
  return clip(lo, hi);
}

double opt_fp32_scale(const float* y, const float* w, int n) {
  // Elements that matter: |y| > 0 and weight > 0.
  struct El {
    double v, w;
  };
  std::vector<El> el;
  el.reserve(static_cast<size_t>(n));
  double amax = 0;
  for (int i = 0; i < n; ++i) {
    const double v = std::fabs(static_cast<double>(y[i]));
    const double wi = w ? static_cast<double>(w[i]) : 1.0;
    amax = std::max(amax, v);
    if (v > 0 && wi > 0) el.push_back({v, wi});
  }
  if (amax == 0) return 0;
  if (el.empty()) return amax / 6;  // every scale has loss 0
  // Breakpoints: element i moves from grid level k to k+1 when s falls below v/mid[k].
  struct Bp {
    double s;
    int i, k;
  };
  std::vector<Bp> bps;
  bps.reserve(el.size() * 7);
  for (int i = 0; i < static_cast<int>(el.size()); ++i)
    for (int k = 0; k < 7; ++k) bps.push_back({el[i].v / static_cast<double>(kMid[k]), i, k});
  std::sort(bps.begin(), bps.end(), [](const Bp& a, const Bp& b) { return a.s > b.s; });
  // L(s) = A - 2 B s + C s^2 within a segment (g_i fixed).
  double A = 0, B = 0, C = 0;
  for (const auto& e : el) A += e.w * e.v * e.v;
  struct Cand {
    double s, val;
  };
  std::vector<Cand> cands;
  cands.reserve(bps.size() + 1);
  auto segment = [&](double lo, double hi) {  // s in [lo, hi]
    double s = C > 0 ? B / C : hi;
    s = std::clamp(s, lo, hi);
    cands.push_back({s, A - 2 * B * s + C * s * s});
  };
  size_t j = 0;
  while (j < bps.size()) {
    const double hi = bps[j].s;
    // apply all breakpoints at this s
    while (j < bps.size() && bps[j].s == hi) {
      const El& e = el[bps[j].i];
      const double g0 = kFp4MagD[bps[j].k], g1 = kFp4MagD[bps[j].k + 1];
      B += e.w * e.v * (g1 - g0);
      C += e.w * (g1 * g1 - g0 * g0);
      ++j;
    }
    const double lo = j < bps.size() ? bps[j].s : 0.0;
    if (lo > 0)
      segment(lo, hi);
    else {
      // last segment (0, hi]: every element at level 6; minimizer B/C > 0
      double s = std::min(B / C, hi);
      cands.push_back({s, A - 2 * B * s + C * s * s});
    }
  }
  // Pick by the quadratic values, then re-evaluate the near-best exactly (cancellation in
  // A - 2Bs + Cs^2 when the loss is small compared with A).
  double best_val = cands[0].val;
  for (const auto& c : cands) best_val = std::min(best_val, c.val);
  const double slack = 1e-9 * A + 1e-300;
  double best_s = 0, best_exact = std::numeric_limits<double>::infinity();
  for (const auto& c : cands) {
    if (c.val > best_val + slack || c.s <= 0) continue;
    const double l = block_loss_f64(y, w, n, c.s);
    if (l < best_exact) {
      best_exact = l;
      best_s = c.s;
    }
  }
  return best_s;
}

double hessian_loss(const float* y, const double* h, int ld, int n, int pattern, ScaleFormat f) {
  // Signed errors of the round-to-nearest codes (the bytes fp4_code writes for this scale).
  double e[64];
  const bool e4 = f == ScaleFormat::kE4M3;
  const float s = e4 ? scale_value(pattern, f) : 0.0f;
  const double sd = e4 ? static_cast<double>(s) : std::ldexp(1.0, pattern - 127);
  for (int i = 0; i < n; ++i) {
    const float ay = std::fabs(y[i]);
    double err;
    if (e4) {
      float ef = ay;
      if (s != 0.0f) ef = ay - kFp4Mag[fp4_index(ay / s)] * s;  // fl(|y| - q s), q s exact
      err = static_cast<double>(ef);
    } else {
      const double ayd = static_cast<double>(ay), q = ayd / sd;
      const int idx =
          (q > 0.25) + (q >= 0.75) + (q > 1.25) + (q >= 1.75) + (q > 2.5) + (q >= 3.5) + (q > 5.0);
      err = ayd - kFp4MagD[idx] * sd;
    }
    e[i] = std::signbit(y[i]) ? -err : err;
  }
  // t = H^T e by columns (each t_i sums j ascending), then L = e . t in index order.
  double t[64] = {};
  for (int j = 0; j < n; ++j) {
    const double ej = e[j];
    const double* hj = h + static_cast<ptrdiff_t>(j) * ld;
    for (int i = 0; i < n; ++i) t[i] = t[i] + hj[i] * ej;
  }
  double L = 0;
  for (int i = 0; i < n; ++i) L = L + e[i] * t[i];
  return L;
}

BlockScale select_block_scale_hessian(const float* y, const double* h, int ld, int n,
                                      const SelectorConfig& cfg) {
  const Method m = cfg.method;
  if (!method_uses_hessian(m))
    throw std::invalid_argument("select_block_scale_hessian: method '" +
                                std::string(kMethodNames.name(m)) +
                                "' is not a block-Hessian method");
  if (n < 1 || n > 64 || ld < n)
    throw std::invalid_argument("select_block_scale_hessian: block of " + std::to_string(n) +
                                " elements (1..64) with leading dimension " + std::to_string(ld));
  const ScaleFormat f = cfg.scale_format;
  const float a = block_amax(y, n);
  if (a == 0.0f) return {0, 0.0f};
  int lo = min_scale_pattern(f), hi = max_scale_pattern(f);
  if (m == Method::kSweepHessian) {
    const PatternRange r = sweep_patterns(a, n, cfg);
    lo = r.lo;
    hi = r.hi;
  }
  int bp = lo;
  double bl = hessian_loss(y, h, ld, n, lo, f);
  for (int p = lo + 1; p <= hi; ++p) {
    const double l = hessian_loss(y, h, ld, n, p, f);
    if (l < bl) bp = p, bl = l;
  }
  return result(bp, bl);
}

BlockScale select_block_scale(const float* y, const float* w, int n, const SelectorConfig& cfg) {
  const ScaleFormat f = cfg.scale_format;
  const Method m = cfg.method;
  if (m == Method::kOptFp32)
    throw std::invalid_argument(
        "opt-fp32 has no FP8 block scale (it is a continuous lower bound): use fake_quantize or "
        "opt_fp32_scale");
  if (method_uses_hessian(m))
    throw std::invalid_argument("method '" + std::string(kMethodNames.name(m)) +
                                "' needs the block's Hessian: use select_block_scale_hessian");
  if (!uses_weights(m)) w = nullptr;
  const float a = block_amax(y, n);
  if (a == 0.0f) {
    // All-zero block: pattern 0 (E4M3 scale 0 / UE8M0 2^-127), codes 0, loss 0.
    if (m == Method::kSweep && !cfg.window)
      throw std::invalid_argument("method 'sweep' needs a window [lo, hi]");
    return {0, 0.0f};
  }
  switch (m) {
    case Method::kAbsMax: {
      int p;
      if (f == ScaleFormat::kE4M3) {
        p = encode_scale(a / 6.0f, f, Round::kNearestEven);
      } else {  // OCP MX: 2^(floor(log2 a) - 2)
        p = std::clamp(std::ilogb(a) - 2 + 127, 0, max_scale_pattern(f));
      }
      return result(p, contract_loss(y, w, n, p, f));
    }
    case Method::kFourOverSix: {
      const int p6 = encode_scale(a / 6.0f, f, Round::kNearestEven);
      const int p4 = encode_scale(a / 4.0f, f, Round::kNearestEven);
      const double l6 = contract_loss(y, w, n, p6, f);
      const double l4 = contract_loss(y, w, n, p4, f);
      return l4 < l6 ? result(p4, l4) : result(p6, l6);
    }
    case Method::kSweepMse:
    case Method::kSweepWmse:
    case Method::kSweep: {
      const PatternRange r = sweep_patterns(a, n, cfg);
      return best_in_range(y, w, n, r.lo, r.hi, f);
    }
    case Method::kExhaustiveMse:
    case Method::kExhaustiveWmse:
      return best_in_range(y, w, n, min_scale_pattern(f), max_scale_pattern(f), f);
    case Method::kOptFp8Mse:
    case Method::kOptFp8Wmse: {
      const double s = opt_fp32_scale(y, w, n);
      int lo = encode_scale(float_below(s), f, Round::kFloor);
      int hi = encode_scale(float_above(s), f, Round::kCeil);
      lo = std::clamp(lo, min_scale_pattern(f), max_scale_pattern(f));
      hi = std::clamp(hi, lo, max_scale_pattern(f));
      const double l_lo = contract_loss(y, w, n, lo, f);
      if (hi == lo) return result(lo, l_lo);
      const double l_hi = contract_loss(y, w, n, hi, f);
      return l_hi < l_lo ? result(hi, l_hi) : result(lo, l_lo);
    }
    case Method::kOptFp32:
    case Method::kSweepHessian:
    case Method::kExhaustiveHessian:
      break;
  }
  throw std::invalid_argument("unknown method");
}

}  // namespace scalesweep

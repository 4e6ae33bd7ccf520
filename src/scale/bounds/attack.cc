// Adversarial search for blocks whose exhaustive MSE optimum lies outside a sweep window
// (random restarts + hill climbing on the block values). docs/BOUNDS.md "Attack".
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "scalesweep/scale/bounds.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::bounds {
namespace {

struct LossModel {
  ElemFormat elem;
  ScaleFormat scale;
  std::vector<double> g, mid;  // grid values and midpoints (doubles, exact)
  double gmax;
  int pmin, pmax;

  LossModel(ElemFormat e, ScaleFormat f) : elem(e), scale(f) {
    for (const Rat& r : element_grid(e)) g.push_back(r.to_double());
    for (size_t k = 0; k + 1 < g.size(); ++k) mid.push_back((g[k] + g[k + 1]) / 2);
    gmax = g.back();
    pmin = scale_min_pattern(f);
    pmax = scale_max_pattern(f);
  }
  // The selectors' objective for E2M1; the binary64 formula on the grid otherwise
  // (|y| compared with the exact products s*mid; a tie has the same squared error either way).
  double loss(const float* y, int n, int p) const {
    if (elem == ElemFormat::kE2M1) return contract_loss(y, nullptr, n, p, scale);
    const double s = scale_value_f64(scale, p);
    double L = 0;
    for (int i = 0; i < n; ++i) {
      const double ay = std::fabs(static_cast<double>(y[i]));
      const size_t k =
          static_cast<size_t>(std::upper_bound(mid.begin(), mid.end(), ay,
                                               [&](double v, double m) { return v < m * s; }) -
                              mid.begin());
      const double e = ay - g[k] * s;
      L = L + e * e;
    }
    return L;
  }
  int base(float a) const {
    if (elem == ElemFormat::kE2M1) return base_pattern(a, scale);
    // Largest pattern with v * gmax <= a (exact products), 0 below the smallest.
    int P = 0;
    for (int p = pmin; p <= pmax; ++p)
      if (scale_value_f64(scale, p) * gmax <= static_cast<double>(a)) P = p;
    return P;
  }
};

float block_amax(const std::vector<float>& y) {
  float a = 0;
  for (float v : y) a = std::max(a, std::fabs(v));
  return a;
}

}  // namespace

int exhaustive_best(ElemFormat elem, ScaleFormat scale, const float* y, int n, double* loss) {
  const LossModel m(elem, scale);
  int best = m.pmin;
  double bl = m.loss(y, n, m.pmin);
  for (int p = m.pmin + 1; p <= m.pmax; ++p) {
    const double l = m.loss(y, n, p);
    if (l < bl) bl = l, best = p;
  }
  if (loss) *loss = bl;
  return best;
}

int base_of(ElemFormat elem, ScaleFormat scale, float amax) {
  return LossModel(elem, scale).base(amax);
}

AttackResult attack(const AttackConfig& cfg, const std::function<void(long, long)>& progress) {
  if (cfg.block < 1 || cfg.block > 1024) throw std::invalid_argument("attack: block in 1..1024");
  if (cfg.blocks < 1) throw std::invalid_argument("attack: --blocks must be >= 1");
  if (cfg.window && cfg.window->lo > cfg.window->hi)
    throw std::invalid_argument("attack: window lo > hi");
  const LossModel m(cfg.elem, cfg.scale);
  const int n = cfg.block;
  std::vector<int> bases = cfg.bases;
  if (bases.empty()) {
    if (cfg.scale == ScaleFormat::kE4M3) {
      for (int p = 0; p < m.pmax; ++p) bases.push_back(p);
    } else {
      // Scale invariance makes the middle bases alike; the ends and a spread in between.
      for (int p : {0, 1, 2, 3, 8, 40, 100, 120, 125, 127, 130, 160, 200, 240, 250})
        bases.push_back(p);
    }
  }
  for (int p : bases)
    if (p < 0 || p >= m.pmax) throw std::invalid_argument("attack: base pattern out of range");
  // Element formats whose values overflow float at the top scales: keep the reachable bases.
  std::vector<int> usable;
  for (int p : bases) {
    const double hi_amax = m.gmax * scale_value_f64(cfg.scale, p + 1);
    if (hi_amax < 3.0e38) usable.push_back(p);
  }
  bases = usable;
  if (bases.empty()) throw std::invalid_argument("attack: no reachable base pattern");

  std::mt19937_64 rng(cfg.seed);
  std::uniform_real_distribution<double> U01(0.0, 1.0);
  AttackResult res;
  // Window of a base: fixed offsets, or the proven one (nullopt: every pattern, no hit).
  auto window_of = [&](int P) -> std::optional<PatternWindow> {
    if (cfg.window) return cfg.window;
    return proven_window(cfg.elem, cfg.scale, n, P);
  };
  // Scored pattern range around the base (the rest is far and never near the optimum;
  // hits are confirmed with the exhaustive search over every pattern).
  constexpr int kSpan = 24;
  std::vector<double> L(static_cast<size_t>(m.pmax + 1));
  long evals = 0;
  auto score = [&](const std::vector<float>& y, int P, const PatternWindow& w, int side) {
    const int lo = std::max(m.pmin, P - kSpan), hi = std::min(m.pmax, P + kSpan);
    double in_best = std::numeric_limits<double>::infinity();
    double out_best = in_best;
    for (int p = lo; p <= hi; ++p) {
      const double l = m.loss(y.data(), n, p);
      const bool inside = p >= P + w.lo && p <= P + w.hi;
      if (inside)
        in_best = std::min(in_best, l);
      else if ((side < 0 && p < P + w.lo) || (side > 0 && p > P + w.hi) || side == 0)
        out_best = std::min(out_best, l);
    }
    ++evals;
    return in_best - out_best;  // > 0 (or = 0 with the outside pattern first): a hit
  };

  for (long it = 0; it < cfg.blocks; ++it) {
    if (progress && (it % 64 == 0)) progress(it, cfg.blocks);
    const int P = bases[static_cast<size_t>(it % static_cast<long>(bases.size()))];
    const std::optional<PatternWindow> wopt = window_of(P);
    if (!wopt) continue;  // nothing claimed for this base
    const PatternWindow w = *wopt;
    const int side = (it / static_cast<long>(bases.size())) % 2 == 0 ? -1 : 1;
    // amax range of this base: [gmax v(P), gmax v(P+1)) (below v(pmin) for E4M3 pattern 0).
    const double a_lo = (P >= m.pmin) ? m.gmax * scale_value_f64(cfg.scale, P) : 0.0;
    const double a_hi = m.gmax * scale_value_f64(cfg.scale, P + 1);
    auto draw_amax = [&]() {
      for (int k = 0; k < 64; ++k) {
        const double a = a_lo + (a_hi - a_lo) * U01(rng);
        const float f = static_cast<float>(a);
        if (f > 0 && m.base(f) == P) return f;
      }
      return static_cast<float>(a_lo > 0 ? a_lo : a_hi / 2);
    };
    // Candidate grid points around the base, for structured values.
    // Target pattern just outside the window on this restart's side: its grid points are
    // exact for it and (mostly) off the grids of the window's scales.
    const int target = std::clamp(side < 0 ? P + w.lo - 1 - static_cast<int>(U01(rng) * 2)
                                           : P + w.hi + 1 + static_cast<int>(U01(rng) * 2),
                                  m.pmin, m.pmax);
    const bool targeted = (it / (2 * static_cast<long>(bases.size()))) % 2 == 1;
    auto structured = [&](float a) {
      int q = std::clamp(P + static_cast<int>(std::floor(U01(rng) * 17)) - 6, m.pmin, m.pmax);
      if (targeted && U01(rng) < 0.7) q = target;
      const double s = scale_value_f64(cfg.scale, q);
      const size_t k =
          std::min(static_cast<size_t>(U01(rng) * static_cast<double>(m.g.size())), m.g.size() - 1);
      double v = m.g[k] * s;
      if (!targeted && U01(rng) < 0.5 && k + 1 < m.g.size()) v = (m.g[k] + m.g[k + 1]) / 2 * s;
      v *= 1.0 + (U01(rng) - 0.5) * (targeted ? 1e-6 : 1e-3);
      return static_cast<float>(std::min(v, static_cast<double>(a)));
    };
    std::vector<float> y(static_cast<size_t>(n));
    const float a0 = (targeted && side < 0 && a_lo > 0) ? static_cast<float>(a_lo) : draw_amax();
    const int imax = static_cast<int>(U01(rng) * n) % n;
    for (int i = 0; i < n; ++i)
      y[static_cast<size_t>(i)] =
          i == imax ? a0
                    : (U01(rng) < (targeted ? 0.9 : 0.5) ? structured(a0)
                                                         : static_cast<float>(a0 * U01(rng)));
    double cur = score(y, P, w, side);
    for (int step = 0; step < cfg.steps; ++step) {
      std::vector<float> z = y;
      const int i = static_cast<int>(U01(rng) * n) % n;
      const float a = block_amax(y);
      const double mv = U01(rng);
      if (i == imax) {
        // The amax: anywhere in its range, or at / just above the bottom of the range
        // (a = gmax * base favours the smaller scales).
        if (U01(rng) < 0.5 || a_lo <= 0) {
          z[static_cast<size_t>(i)] = draw_amax();
        } else {
          const float f = static_cast<float>(a_lo * (1.0 + U01(rng) * U01(rng) * 0.02));
          z[static_cast<size_t>(i)] = m.base(f) == P ? f : static_cast<float>(a_lo);
        }
      } else if (mv < 0.35) {
        z[static_cast<size_t>(i)] = structured(a);
      } else if (mv < 0.6) {
        z[static_cast<size_t>(i)] = static_cast<float>(a * U01(rng));
      } else if (mv < 0.8) {
        z[static_cast<size_t>(i)] =
            static_cast<float>(z[static_cast<size_t>(i)] * (1.0 + (U01(rng) - 0.5) * 0.02));
      } else {
        z[static_cast<size_t>(i)] = 0.0f;
      }
      if (i != imax) z[static_cast<size_t>(i)] = std::min(std::fabs(z[static_cast<size_t>(i)]), a);
      if (U01(rng) < 0.5) z[static_cast<size_t>(i)] = -z[static_cast<size_t>(i)];
      if (m.base(block_amax(z)) != P) continue;
      const double sc = score(z, P, w, side);
      if (sc >= cur) {
        cur = sc;
        y.swap(z);
      }
    }
    ++res.restarts;
    double lb = 0;
    const int best = exhaustive_best(cfg.elem, cfg.scale, y.data(), n, &lb);
    const int off = best - P;
    res.max_offset = std::max(res.max_offset, off);
    res.min_offset = std::min(res.min_offset, off);
    auto& seen = res.per_base.try_emplace(P, 1000, -1000).first->second;
    seen.first = std::min(seen.first, off);
    seen.second = std::max(seen.second, off);
    if (off < w.lo || off > w.hi) {
      AttackHit h;
      h.y = y;
      h.base = P;
      h.best = best;
      h.offset = off;
      h.loss_best = lb;
      h.loss_window = std::numeric_limits<double>::infinity();
      for (int p = std::max(m.pmin, P + w.lo); p <= std::min(m.pmax, P + w.hi); ++p)
        h.loss_window = std::min(h.loss_window, m.loss(y.data(), n, p));
      res.hits.push_back(std::move(h));
    }
  }
  res.evaluations = evals;
  if (progress) progress(cfg.blocks, cfg.blocks);
  return res;
}

}  // namespace scalesweep::bounds

// Formats as exact rationals, the per-element loss d_r(y), and convex certificates
// (evaluation in exact arithmetic, search with a double prefilter). docs/BOUNDS.md.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/scale/bounds.h"

namespace scalesweep::bounds {
namespace {

// A finite double as an exact rational (|exponent| small enough for 128 bits).
Rat rat_of_double(double v) {
  if (v == 0) return Rat();
  int e = 0;
  const double fr = std::frexp(v, &e);  // v = fr * 2^e, 0.5 <= |fr| < 1
  long long m = static_cast<long long>(std::ldexp(fr, 53));
  e -= 53;
  while (m % 2 == 0) {
    m /= 2;
    ++e;
  }
  return Rat(m) * Rat::pow2(e);
}

template <class F>
std::vector<Rat> grid_of() {
  std::vector<Rat> g;
  for (uint32_t p = 0; p <= F::kMaxPattern; ++p) {
    if (F::is_nan(p) || F::is_inf(p)) continue;
    g.push_back(rat_of_double(F::decode(p)));
  }
  std::sort(g.begin(), g.end());
  g.erase(std::unique(g.begin(), g.end()), g.end());
  return g;
}

}  // namespace

std::vector<Rat> element_grid(ElemFormat e) {
  switch (e) {
    case ElemFormat::kE2M1:
      return grid_of<format::E2M1>();
    case ElemFormat::kE3M2:
      return grid_of<format::E3M2>();
    case ElemFormat::kE2M3:
      return grid_of<format::E2M3>();
    case ElemFormat::kE4M3:
      return grid_of<format::E4M3>();
    case ElemFormat::kE5M2:
      return grid_of<format::E5M2>();
  }
  throw std::invalid_argument("element format");
}

int scale_min_pattern(ScaleFormat f) { return f == ScaleFormat::kE4M3 ? 1 : 0; }
int scale_max_pattern(ScaleFormat f) {
  return f == ScaleFormat::kE4M3 ? static_cast<int>(format::E4M3::kMaxPattern)
                                 : static_cast<int>(format::UE8M0::kMaxPattern);
}
double scale_value_f64(ScaleFormat f, int p) {
  return f == ScaleFormat::kE4M3 ? format::E4M3::decode(static_cast<uint32_t>(p))
                                 : format::UE8M0::decode(static_cast<uint32_t>(p));
}

Rat scale_ratio(ScaleFormat f, int q, int p) {
  const double vq = scale_value_f64(f, q), vp = scale_value_f64(f, p);
  if (!(vq > 0) || !(vp > 0)) throw std::domain_error("scale_ratio: non-positive scale");
  int eq = 0, ep = 0;
  const double fq = std::frexp(vq, &eq), fp = std::frexp(vp, &ep);
  // Both values have <= 4 significant bits: mantissas as small integers.
  const long long mq = static_cast<long long>(std::ldexp(fq, 8));
  const long long mp = static_cast<long long>(std::ldexp(fp, 8));
  return Rat::frac(mq, mp) * Rat::pow2(eq - ep);
}

// ---------------------------------------------------------------------------------------
ElementLoss::ElementLoss(const std::vector<Rat>& grid, const Rat& r) : r_(r) {
  if (grid.size() < 2 || grid.front() != Rat(0)) throw std::invalid_argument("element grid");
  for (const Rat& g : grid) c_.push_back(r * g);
  for (size_t k = 0; k + 1 < c_.size(); ++k) bp_.push_back((c_[k] + c_[k + 1]) / Rat(2));
  for (const Rat& c : c_) cd_.push_back(c.to_double());
  for (const Rat& b : bp_) bpd_.push_back(b.to_double());
}

Rat ElementLoss::operator()(const Rat& y) const {
  // Piece k: bp_{k-1} <= y <= bp_k (at a breakpoint both neighbours give the same value).
  const size_t k = static_cast<size_t>(std::lower_bound(bp_.begin(), bp_.end(), y) - bp_.begin());
  const Rat d = y - c_[k];
  return d * d;
}

double ElementLoss::eval(double y) const {
  const size_t k =
      static_cast<size_t>(std::lower_bound(bpd_.begin(), bpd_.end(), y) - bpd_.begin());
  const double d = y - cd_[k];
  return d * d;
}

Rat ElementLoss::sup(const Rat& lo, const Rat& hi) const {
  Rat s = max((*this)(lo), (*this)(hi));
  for (const Rat& b : bp_)
    if (b > lo && b < hi) s = max(s, (*this)(b));
  return s;
}

// ---------------------------------------------------------------------------------------
namespace {

// Rounding allowance of the contract loss in units of base^2 (docs/BOUNDS.md "Rounding"):
// 2*gamma_n*Lsup(r) + 2^-40 (the last term covers underflow for bases >= 2^-50).
Rat allowance_for(const ElementLoss& dr, const Domain& dom) {
  const Rat lsup = dr.sup(dom.ymax_lo, *dom.yhi) + Rat(dom.n - 1) * dr.sup(Rat(0), *dom.yhi);
  return Rat(2) * rounding_gamma(dom.n, dom.arith) * lsup + Rat::pow2(-40);
}

}  // namespace

Rat rounding_gamma(int n, LossArith arith) {
  // gamma_n = k u / (1 - k u) <= (k + 1) u for k = n + 2, u = 2^-24 or 2^-53 (dyadic, so the
  // allowance stays small in 128 bits).
  return Rat(n + 3) * Rat::pow2(arith == LossArith::kFloat32 ? -24 : -53);
}

Certificate evaluate_certificate(const std::vector<Rat>& grid, const Rat& r,
                                 const std::vector<Rat>& u, const std::vector<Rat>& lambda,
                                 const Domain& dom) {
  if (u.empty() || u.size() != lambda.size())
    throw std::invalid_argument("certificate: u and lambda must have the same non-zero size");
  Certificate c;
  c.r = r;
  c.u = u;
  c.lambda = lambda;
  Rat lsum;
  for (const Rat& l : lambda) {
    if (l.sign() < 0) throw std::invalid_argument("certificate: negative weight");
    lsum += l;
  }
  if (lsum != Rat(1)) throw std::invalid_argument("certificate: weights must sum to 1");
  const ElementLoss dr(grid, r);
  std::vector<ElementLoss> du;
  for (const Rat& x : u) du.emplace_back(grid, x);
  auto delta = [&](const Rat& y) {
    Rat s = -dr(y);
    for (size_t j = 0; j < du.size(); ++j) s += lambda[j] * du[j](y);
    return s;
  };
  // Candidate points: every breakpoint of every piece, the ends of both ranges.
  std::vector<Rat> pts = dr.breakpoints();
  for (const auto& d : du) pts.insert(pts.end(), d.breakpoints().begin(), d.breakpoints().end());
  pts.push_back(Rat(0));
  pts.push_back(dom.ymax_lo);
  if (dom.yhi) pts.push_back(*dom.yhi);
  std::sort(pts.begin(), pts.end());
  pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
  if (!dom.yhi) {
    // Beyond the last breakpoint Delta is affine with slope 2 gmax (r - sum lambda_j u_j).
    Rat ubar;
    for (size_t j = 0; j < u.size(); ++j) ubar += lambda[j] * u[j];
    if (ubar < r) {
      c.bounded = false;
      return c;
    }
  }
  bool have_a = false;
  for (const Rat& y : pts) {
    if (y.sign() < 0 || (dom.yhi && y > *dom.yhi)) continue;
    const Rat d = delta(y);
    if (y == pts.front() || d > c.B) c.B = d;
    if (y >= dom.ymax_lo && (!have_a || d > c.A)) {
      c.A = d;
      have_a = true;
    }
  }
  c.margin = c.A + Rat(dom.n - 1) * c.B;
  c.exact_ok = c.margin.sign() < 0;
  if (dom.yhi) {
    c.allowance = allowance_for(dr, dom);
    c.valid = (c.margin + c.allowance).sign() < 0;
  }
  return c;
}

// ---------------------------------------------------------------------------------------
namespace {

struct Trial {
  double margin;
  std::array<int, 3> idx;
  std::array<int, 3> w;
  int k;
};

// All compositions of D into k positive parts, in lexicographic order.
std::vector<std::array<int, 3>> compositions(int D, int k) {
  std::vector<std::array<int, 3>> out;
  if (k == 1) {
    out.push_back({D, 0, 0});
  } else if (k == 2) {
    for (int a = 1; a < D; ++a) out.push_back({a, D - a, 0});
  } else {
    for (int a = 1; a < D; ++a)
      for (int b = 1; a + b < D; ++b) out.push_back({a, b, D - a - b});
  }
  return out;
}

}  // namespace

std::optional<Certificate> find_certificate(const std::vector<Rat>& grid, const Rat& r,
                                            const std::vector<PoolEntry>& pool, const Domain& dom,
                                            SearchMode mode) {
  if (pool.empty() || !dom.yhi) return std::nullopt;
  const int P = static_cast<int>(pool.size());
  const ElementLoss dr(grid, r);
  std::vector<ElementLoss> du;
  for (const auto& e : pool) du.emplace_back(grid, e.u);
  // Evaluation points: a superset of every support's breakpoints, so that the max over
  // them is the exact sup for any support (Delta is piecewise affine between them).
  const double yhi = dom.yhi->to_double(), ylo = dom.ymax_lo.to_double();
  std::vector<double> pts = {0.0, ylo, yhi};
  auto add_bps = [&](const ElementLoss& l) {
    for (const Rat& b : l.breakpoints()) {
      const double v = b.to_double();
      if (v > 0 && v < yhi) pts.push_back(v);
    }
  };
  add_bps(dr);
  for (const auto& d : du) add_bps(d);
  std::sort(pts.begin(), pts.end());
  pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
  const int Y = static_cast<int>(pts.size());
  std::vector<double> R(static_cast<size_t>(Y)), V(static_cast<size_t>(P * Y));
  std::vector<char> inA(static_cast<size_t>(Y));
  for (int y = 0; y < Y; ++y) {
    R[static_cast<size_t>(y)] = dr.eval(pts[static_cast<size_t>(y)]);
    inA[static_cast<size_t>(y)] = pts[static_cast<size_t>(y)] >= ylo;
    for (int j = 0; j < P; ++j)
      V[static_cast<size_t>(j * Y + y)] =
          du[static_cast<size_t>(j)].eval(pts[static_cast<size_t>(y)]);
  }
  const double nm1 = dom.n - 1;
  auto margin_of = [&](const std::array<int, 3>& idx, const std::array<double, 3>& lam, int k) {
    double A = -std::numeric_limits<double>::infinity(), B = A;
    for (int y = 0; y < Y; ++y) {
      double d = -R[static_cast<size_t>(y)];
      for (int t = 0; t < k; ++t)
        d += lam[static_cast<size_t>(t)] *
             V[static_cast<size_t>(idx[static_cast<size_t>(t)] * Y + y)];
      B = std::max(B, d);
      if (inA[static_cast<size_t>(y)]) A = std::max(A, d);
    }
    return A + nm1 * B;
  };
  auto verify = [&](const Trial& t, int D) -> std::optional<Certificate> {
    std::vector<Rat> u, lam;
    std::vector<int> pats;
    for (int i = 0; i < t.k; ++i) {
      u.push_back(pool[static_cast<size_t>(t.idx[static_cast<size_t>(i)])].u);
      pats.push_back(pool[static_cast<size_t>(t.idx[static_cast<size_t>(i)])].pattern);
      lam.push_back(Rat::frac(t.w[static_cast<size_t>(i)], D));
    }
    try {
      Certificate c = evaluate_certificate(grid, r, u, lam, dom);
      c.u_patterns = pats;
      if (c.valid) return c;
    } catch (const RatOverflow&) {
      // Not provable in 128 bits: treated as no certificate.
    }
    return std::nullopt;
  };
  constexpr double kTol = -1e-12;
  for (int D : {4, 8, 16}) {
    std::vector<Trial> trials;
    for (int k = 1; k <= 3; ++k) {
      if (k == 1 && D != 4) continue;
      if (k > P) break;
      const auto comps = compositions(D, k);
      std::array<int, 3> idx{0, 0, 0};
      std::vector<Trial> level;
      auto visit = [&]() {
        for (const auto& w : comps) {
          std::array<double, 3> lam{};
          for (int t = 0; t < k; ++t)
            lam[static_cast<size_t>(t)] = static_cast<double>(w[static_cast<size_t>(t)]) / D;
          const double m = margin_of(idx, lam, k);
          if (m < kTol) level.push_back({m, idx, w, k});
        }
      };
      for (idx[0] = 0; idx[0] < P; ++idx[0]) {
        if (k == 1) {
          visit();
          continue;
        }
        for (idx[1] = idx[0] + 1; idx[1] < P; ++idx[1]) {
          if (k == 2) {
            visit();
            continue;
          }
          for (idx[2] = idx[1] + 1; idx[2] < P; ++idx[2]) visit();
        }
      }
      if (mode == SearchMode::kAny) {
        std::stable_sort(level.begin(), level.end(),
                         [](const Trial& a, const Trial& b) { return a.margin < b.margin; });
        for (size_t i = 0; i < level.size() && i < 8; ++i)
          if (auto c = verify(level[i], D)) return c;
      } else {
        trials.insert(trials.end(), level.begin(), level.end());
      }
    }
    if (mode == SearchMode::kBest) {
      std::stable_sort(trials.begin(), trials.end(),
                       [](const Trial& a, const Trial& b) { return a.margin < b.margin; });
      for (size_t i = 0; i < trials.size() && i < 16; ++i)
        if (auto c = verify(trials[i], D)) return c;
    }
  }
  return std::nullopt;
}

}  // namespace scalesweep::bounds

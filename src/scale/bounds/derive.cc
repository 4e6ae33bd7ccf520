// Derivation of the sweep windows: the paper's Tables 1-3 generalized to any element format,
// scale format and block size, and exact per-base-pattern windows (docs/BOUNDS.md).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/scale/bounds.h"

namespace scalesweep::bounds {
namespace {

constexpr int kPool = 12;  // neighbouring patterns offered to the certificate search

struct Ctx {
  ElemFormat elem;
  ScaleFormat f;
  int n;
  LossArith arith;
  std::vector<Rat> grid;
  Rat gmax, half_g, t, alpha;
  int pmin, pmax, man_bits;
  // Memo of certificate searches (the result depends only on the key's rationals).
  std::map<std::string, std::optional<Certificate>> memo;
};

LossArith arith_for(ElemFormat e, ScaleFormat f) {
  // The selectors' contract loss: float32 for NVFP4 (E2M1 + E4M3), binary64 for UE8M0;
  // the other element formats have no selector and are judged by the binary64 formula.
  return (e == ElemFormat::kE2M1 && f == ScaleFormat::kE4M3) ? LossArith::kFloat32
                                                             : LossArith::kFloat64;
}

Ctx make_ctx(ElemFormat elem, ScaleFormat f, int n) {
  if (n < 1 || n > 1024) throw std::invalid_argument("block size must be in 1..1024");
  Ctx c{elem, f,  n,  arith_for(elem, f),   element_grid(elem),   {},
        {},   {}, {}, scale_min_pattern(f), scale_max_pattern(f), f == ScaleFormat::kE4M3 ? 3 : 0,
        {}};
  c.gmax = c.grid.back();
  // Largest prefix g_0..g_k of the grid that is closed under doubling (2 g in the grid):
  // below t = (g_k + g_{k+1})/2 every element rounds into it (Lemma 4.1 generalized).
  size_t k = 0;
  auto in_grid = [&](const Rat& v) { return std::binary_search(c.grid.begin(), c.grid.end(), v); };
  while (k + 1 < c.grid.size() && in_grid(c.grid[k + 1] * Rat(2))) ++k;
  c.half_g = c.grid[k];
  c.t = (c.grid[k] + c.grid[k + 1]) / Rat(2);
  c.alpha = c.gmax / c.t;
  return c;
}

double value(const Ctx& c, int p) { return scale_value_f64(c.f, p); }

// v(q)/v(U): 0 and *out when exact, +1 / -1 when the ratio is beyond 2^+-40.
int rel(const Ctx& c, int q, int U, Rat* out) {
  const double d = value(c, q) / value(c, U);
  if (d > 0x1p40) return 1;
  if (d < 0x1p-40) return -1;
  *out = scale_ratio(c.f, q, U);
  return 0;
}

// Pattern whose value is exactly v(q)/2, or -1.
int half_pattern(const Ctx& c, int q) {
  const double h = value(c, q) / 2;
  if (c.f == ScaleFormat::kUE8M0) return q >= 1 ? q - 1 : -1;
  const int p =
      static_cast<int>(format::E4M3::encode(static_cast<float>(h), format::Round::kFloor));
  return (p >= c.pmin && value(c, p) == h) ? p : -1;
}
// Pattern whose value is exactly 2 v(q), or -1.
int double_pattern(const Ctx& c, int q) {
  const double d = value(c, q) * 2;
  if (c.f == ScaleFormat::kUE8M0) return q + 1 <= c.pmax ? q + 1 : -1;
  if (d > format::E4M3::kMaxValue) return -1;
  const int p =
      static_cast<int>(format::E4M3::encode(static_cast<float>(d), format::Round::kFloor));
  return value(c, p) == d ? p : -1;
}

std::string key_of(const Rat& r, const std::vector<PoolEntry>& pool, const Domain& dom,
                   SearchMode mode) {
  std::string k = r.str();
  k.push_back('|');
  k.append(dom.ymax_lo.str());
  k.push_back('|');
  k.append(dom.yhi ? dom.yhi->str() : std::string("inf"));
  k.push_back(mode == SearchMode::kBest ? 'b' : 'a');
  for (const auto& e : pool) {
    k.push_back('|');
    k.append(e.u.str());
  }
  return k;
}

std::optional<Certificate> search(Ctx& c, const Rat& r, const std::vector<PoolEntry>& pool,
                                  const Domain& dom, SearchMode mode) {
  const std::string key = key_of(r, pool, dom, mode);
  auto it = c.memo.find(key);
  if (it != c.memo.end()) {
    // Same ratios, possibly other patterns: re-label the patterns.
    std::optional<Certificate> res = it->second;
    if (res) {
      for (size_t j = 0; j < res->u.size(); ++j)
        for (const auto& e : pool)
          if (e.u == res->u[j]) res->u_patterns[j] = e.pattern;
    }
    return res;
  }
  std::optional<Certificate> res;
  try {
    res = find_certificate(c.grid, r, pool, dom, mode);
  } catch (const RatOverflow&) {
    res.reset();
  }
  c.memo.emplace(key, res);
  return res;
}

struct BaseGeom {
  int U;        // unit pattern (the base, or the smallest pattern below it)
  bool bottom;  // the max coordinate may be anywhere in [0, yhi]
  Domain dom;
};

BaseGeom geom(const Ctx& c, int P) {
  BaseGeom g;
  g.U = std::max(P, c.pmin);
  // E4M3 pattern 0 (a/6 below the smallest scale) and UE8M0 pattern 0 (which also holds
  // every a/6 < 2^-127): the maximal coordinate is only known to be below yhi.
  g.bottom = P < c.pmin || (c.f == ScaleFormat::kUE8M0 && P == 0);
  g.dom.n = c.n;
  g.dom.arith = c.arith;
  g.dom.ymax_lo = g.bottom ? Rat(0) : c.gmax;
  g.dom.yhi = c.gmax * scale_ratio(c.f, P + 1, g.U);
  return g;
}

std::vector<PoolEntry> lower_pool(const Ctx& c, int q, int P, int U) {
  std::vector<int> pats;
  for (int p = q + 1; p <= std::min(c.pmax, q + kPool); ++p) pats.push_back(p);
  const int d = double_pattern(c, q);
  if (d >= 0) pats.push_back(d);
  pats.push_back(P);
  std::sort(pats.begin(), pats.end());
  pats.erase(std::unique(pats.begin(), pats.end()), pats.end());
  std::vector<PoolEntry> pool;
  for (int p : pats) {
    Rat r;
    if (rel(c, p, U, &r) == 0) pool.push_back({r, p});
  }
  return pool;
}

std::vector<PoolEntry> upper_pool(const Ctx& c, int q, int U) {
  std::vector<PoolEntry> pool;
  for (int p = std::max(c.pmin, q - kPool); p < q; ++p) {
    Rat r;
    if (rel(c, p, U, &r) == 0) pool.push_back({r, p});
  }
  return pool;
}

// Analytic exclusion of every ratio <= r (r <= 1) by the base itself (docs/BOUNDS.md):
// margin <= -gmax^2 (1-r)^2 + (n-1) 2 gmax^2 rho r, rounding allowance from d_r <= y^2.
bool tiny_ratios_excluded(const Ctx& c, const BaseGeom& g, const Rat& r) {
  if (g.bottom) return false;
  const Rat rho = *g.dom.yhi / c.gmax;
  const Rat g2 = c.gmax * c.gmax;
  const Rat m = -g2 * (Rat(1) - r) * (Rat(1) - r) + Rat(c.n - 1) * Rat(2) * g2 * rho * r;
  const Rat allow =
      Rat(2) * rounding_gamma(c.n, c.arith) * Rat(c.n) * *g.dom.yhi * *g.dom.yhi + Rat::pow2(-40);
  return (m + allow).sign() < 0;
}

struct Exclusion {
  bool excluded = false;
  std::string how;  // "halving", "certificate", "tiny"
  std::optional<Certificate> cert;
};

Exclusion exclude_upper(Ctx& c, const BaseGeom& g, int q, SearchMode mode) {
  Exclusion e;
  Rat rq;
  const int fr = rel(c, q, g.U, &rq);
  if (half_pattern(c, q) >= c.pmin && (fr > 0 || (fr == 0 && rq * c.t >= *g.dom.yhi))) {
    e.excluded = true;
    e.how = "halving";
    return e;
  }
  if (fr != 0) return e;
  e.cert = search(c, rq, upper_pool(c, q, g.U), g.dom, mode);
  if (e.cert) {
    e.cert->q = q;
    e.excluded = true;
    e.how = "certificate";
  }
  return e;
}

Exclusion exclude_lower(Ctx& c, const BaseGeom& g, int q, int P, SearchMode mode) {
  Exclusion e;
  Rat rq;
  const int fr = rel(c, q, g.U, &rq);
  if (fr < 0) {
    e.excluded = tiny_ratios_excluded(c, g, Rat::pow2(-40));
    e.how = "tiny";
    return e;
  }
  if (rq <= Rat::frac(1, 64)) {
    // Small ratios: the analytic bound (cheap, and free of the large denominators that
    // make exact certificates overflow for tiny r).
    try {
      if (tiny_ratios_excluded(c, g, rq)) {
        e.excluded = true;
        e.how = "tiny";
        return e;
      }
    } catch (const RatOverflow&) {
    }
  }
  e.cert = search(c, rq, lower_pool(c, q, P, g.U), g.dom, mode);
  if (e.cert) {
    e.cert->q = q;
    e.excluded = true;
    e.how = "certificate";
  }
  return e;
}

BaseWindow derive_base(Ctx& c, int P) {
  BaseWindow bw;
  bw.pattern = P;
  if (P >= c.pmax) {
    bw.note = "top pattern: amax unbounded above, exhaustive";
    return bw;
  }
  const BaseGeom g = geom(c, P);
  int hi = P < c.pmin ? c.pmin - P : 0;
  bool halving_only = true;
  for (int q = c.pmax; q > P && q >= c.pmin; --q) {
    const Exclusion e = exclude_upper(c, g, q, SearchMode::kAny);
    if (!e.excluded) {
      hi = q - P;
      break;
    }
    if (e.how != "halving") halving_only = false;
  }
  int lo = P < c.pmin ? c.pmin - P : 0;
  for (int q = c.pmin; q < P; ++q) {
    const Exclusion e = exclude_lower(c, g, q, P, SearchMode::kAny);
    if (!e.excluded) {
      lo = q - P;
      break;
    }
  }
  if (lo > hi) lo = hi;
  bw.window = PatternWindow{lo, hi};
  bw.note = g.bottom ? "below the smallest scale" : (halving_only ? "" : "upper: certificates");
  if (c.f == ScaleFormat::kE4M3 && P >= 1 && P < 8) {
    if (!bw.note.empty()) bw.note.append("; ");
    bw.note.append("subnormal base");
  }
  return bw;
}

int exp_field(const Ctx& c, int p) { return p >> c.man_bits; }
int man_field(const Ctx& c, int p) { return p & ((1 << c.man_bits) - 1); }

// Representative base of mantissa b in a binade with room on both sides.
int rep_base(const Ctx& c, int b) { return c.f == ScaleFormat::kE4M3 ? (7 << 3) | b : 127; }

LowerRow lower_row(const Ctx& c, int b, const Rat& ell) {
  const int P = rep_base(c, b);
  int q = P;
  Rat r;
  while (q > c.pmin && rel(c, q - 1, P, &r) == 0 && r >= ell) --q;
  LowerRow row;
  row.b = b;
  row.borrow = exp_field(c, P) - exp_field(c, q);
  row.inf_mant = man_field(c, q);
  row.delta = P - q;
  return row;
}

}  // namespace

Derivation derive_impl(ElemFormat elem, ScaleFormat scale, int block);

Derivation derive(ElemFormat elem, ScaleFormat scale, int block) {
  try {
    return derive_impl(elem, scale, block);
  } catch (const RatOverflow&) {
    throw std::runtime_error("the derivation for " + std::string(kElemFormatNames.name(elem)) +
                             " elements with " + std::string(kScaleFormatNames.name(scale)) +
                             " scales exceeds 128-bit exact arithmetic (rational overflow); "
                             "not supported");
  }
}

Derivation derive_named(const std::string& elem, const std::string& scale, int block) {
  const ElemFormat e = kElemFormatNames.parse(elem);
  const ScaleFormat f = kScaleFormatNames.parse(scale);
  if (block < 1 || block > 1024) throw std::invalid_argument("--block must be in 1..1024");
  return derive(e, f, block);
}

int scale_mantissa_bits(ScaleFormat f) { return f == ScaleFormat::kE4M3 ? 3 : 0; }

std::string bit_string(int v, int width) {
  std::string s;
  for (int i = width - 1; i >= 0; --i) s.push_back(((v >> i) & 1) ? '1' : '0');
  return s.empty() ? "-" : s;
}

double base_value(ScaleFormat f, int pattern) {
  return pattern == 0 && f == ScaleFormat::kE4M3 ? 0.0 : scale_value_f64(f, pattern);
}

Derivation derive_impl(ElemFormat elem, ScaleFormat scale, int block) {
  Ctx c = make_ctx(elem, scale, block);
  Derivation d;
  d.elem = elem;
  d.scale = scale;
  d.block = block;
  d.arith = c.arith;
  const int nb = 1 << c.man_bits;

  // ---- Table 1: upper bound by halving ----
  d.upper.half_g = c.half_g;
  d.upper.threshold = c.t;
  d.upper.alpha = c.alpha;
  for (int b = 0; b < nb; ++b) {
    const int P = rep_base(c, b);
    const Rat lim = c.alpha * scale_ratio(c.f, P + 1, P);  // alpha * next(base) / base
    // Strict: s_base < next(base), so every scale >= alpha * next(base) is dominated.
    int q = P;
    while (q + 1 <= c.pmax && scale_ratio(c.f, q + 1, P) < lim) ++q;
    // The paper's Table 1 takes floor(alpha * next(base)), i.e. <=.
    int qp = q;
    while (qp + 1 <= c.pmax && scale_ratio(c.f, qp + 1, P) <= lim) ++qp;
    UpperRow row{b, exp_field(c, qp) - exp_field(c, P), man_field(c, qp), qp - P, q - P};
    d.upper.rows.push_back(row);
    d.upper.hi = std::max(d.upper.hi, row.delta);
  }

  // ---- Lower bound: doubling for r < r0, certificates above ----
  {
    Domain inf_dom;
    inf_dom.ymax_lo = Rat(0);
    inf_dom.n = 2;
    const Certificate cb = evaluate_certificate(c.grid, Rat(1), {Rat(2)}, {Rat(1)}, inf_dom);
    d.lower.beta = cb.B;
    const Rat g2 = c.gmax * c.gmax;
    for (const Rat& gp : c.grid) {
      if (!(Rat(2) * gp > c.gmax)) continue;
      const Rat num = Rat(2) * c.gmax * (Rat(2) * gp - c.gmax);
      const Rat den = Rat(4) * gp * gp - g2 + Rat(block - 1) * d.lower.beta;
      const Rat r0 = num / den;
      if (r0 > d.lower.r0) {
        d.lower.r0 = r0;
        d.lower.g_double = gp;
      }
    }
  }
  std::vector<Rat> first_fail(static_cast<size_t>(nb));
  std::vector<std::vector<Certificate>> certs(static_cast<size_t>(nb));
  d.max_u = Rat(2) * d.lower.r0;
  for (int b = 0; b < nb; ++b) {
    const int P = rep_base(c, b);
    const BaseGeom g = geom(c, P);
    first_fail[static_cast<size_t>(b)] = Rat(1);
    for (int q = c.pmin; q < P; ++q) {
      Rat r;
      if (rel(c, q, P, &r) != 0 || r < d.lower.r0) continue;
      Exclusion e = exclude_lower(c, g, q, P, SearchMode::kBest);
      if (!e.excluded) {
        first_fail[static_cast<size_t>(b)] = r;
        break;
      }
      e.cert->m = nb + b;  // significand m/2^M of the base (E4M3: 8..15)
      certs[static_cast<size_t>(b)].push_back(*e.cert);
    }
  }
  d.lower.ell = *std::min_element(first_fail.begin(), first_fail.end());
  for (int b = 0; b < nb; ++b) {
    LowerRow row = lower_row(c, b, d.lower.ell);
    row.first_unexcluded = first_fail[static_cast<size_t>(b)];
    d.lower.rows.push_back(row);
    d.lower.lo = std::max(d.lower.lo, row.delta);
    for (const Certificate& ce : certs[static_cast<size_t>(b)])
      if (ce.r < d.lower.ell) {
        d.certificates.push_back(ce);
        for (const Rat& u : ce.u) d.max_u = max(d.max_u, u);
      }
  }
  std::stable_sort(d.certificates.begin(), d.certificates.end(),
                   [](const Certificate& a, const Certificate& b) { return a.r < b.r; });
  d.window = PatternWindow{-d.lower.lo, d.upper.hi};

  // ---- The paper's own Table 3 and Table 2 (NVFP4) ----
  if (elem == ElemFormat::kE2M1 && scale == ScaleFormat::kE4M3) {
    struct PaperCert {
      int m;
      Rat r;
      std::array<Rat, 3> u;
    };
    const PaperCert pc[] = {
        {9, Rat::frac(7, 9), {Rat::frac(5, 6), Rat::frac(10, 9), Rat::frac(14, 9)}},
        {13, Rat::frac(10, 13), {Rat::frac(11, 13), Rat::frac(14, 13), Rat::frac(20, 13)}},
        {14, Rat::frac(11, 14), {Rat::frac(6, 7), Rat::frac(15, 14), Rat::frac(11, 7)}},
    };
    for (const auto& p : pc) {
      Domain dom;
      dom.n = block;
      dom.arith = c.arith;
      dom.ymax_lo = Rat(6);
      dom.yhi = Rat(6) * Rat::frac(p.m + 1, p.m);
      Certificate ce =
          evaluate_certificate(c.grid, p.r, {p.u[0], p.u[1], p.u[2]},
                               {Rat::frac(1, 4), Rat::frac(1, 4), Rat::frac(1, 2)}, dom);
      ce.m = p.m;
      d.paper_checks.push_back(ce);
    }
    for (int b = 0; b < nb; ++b) d.lower.paper_rows.push_back(lower_row(c, b, Rat::frac(4, 5)));
  }

  // ---- Per-base windows ----
  for (int P = 0; P <= c.pmax; ++P) d.per_base.push_back(derive_base(c, P));
  return d;
}

// ---------------------------------------------------------------------------------------
namespace {

struct Table {
  std::vector<std::optional<PatternWindow>> w;
};

constexpr int kElems = 5, kScales = 2, kSizes = 8;  // block sizes 8..1024 (powers of two)

std::atomic<const Table*> g_tables[kElems][kScales][kSizes];
std::mutex g_table_mutex;

int size_index(int block) {
  int i = 0;
  for (int b = 8; b < block; b *= 2) ++i;
  return i;
}

#include "scale/bounds/pinned_windows.inc"

// The E2M1 tables the selectors use, precomputed (bounds_test.cc re-derives and compares
// every entry), so that no process pays the derivation on its first block.
const Table* pinned_table(ScaleFormat scale, int block) {
  const int8_t(*w)[2] = nullptr;
  size_t count = 0;
  auto pick = [&](const auto& arr) {
    w = arr;
    count = sizeof(arr) / sizeof(arr[0]);
  };
  const bool e4 = scale == ScaleFormat::kE4M3;
  switch (block) {
    case 8:
      e4 ? pick(kE4M3_8) : pick(kUE8M0_8);
      break;
    case 16:
      e4 ? pick(kE4M3_16) : pick(kUE8M0_16);
      break;
    case 32:
      e4 ? pick(kE4M3_32) : pick(kUE8M0_32);
      break;
    case 64:
      e4 ? pick(kE4M3_64) : pick(kUE8M0_64);
      break;
    default:
      return nullptr;
  }
  auto* t = new Table;
  for (size_t i = 0; i < count; ++i) {
    if (w[i][0] <= w[i][1])
      t->w.push_back(PatternWindow{w[i][0], w[i][1]});
    else
      t->w.push_back(std::nullopt);
  }
  return t;
}

const Table* build_table(ElemFormat elem, ScaleFormat scale, int block) {
  if (elem == ElemFormat::kE2M1) {
    if (const Table* p = pinned_table(scale, block)) return p;
  }
  Ctx c = make_ctx(elem, scale, block);
  auto* t = new Table;
  for (int P = 0; P <= c.pmax; ++P) {
    std::optional<PatternWindow> w;
    try {
      w = derive_base(c, P).window;
    } catch (const RatOverflow&) {
      w.reset();  // not provable in 128 bits: exhaustive
    }
    t->w.push_back(w);
  }
  return t;
}

}  // namespace

int covering_block(int n) {
  if (n < 1 || n > 1024) return 0;
  int b = 8;
  while (b < n) b *= 2;
  return b;
}

std::optional<PatternWindow> proven_window(ElemFormat elem, ScaleFormat scale, int block,
                                           int base_pattern) {
  const int cb = covering_block(block);
  if (cb == 0 || base_pattern < 0 || base_pattern > scale_max_pattern(scale)) return std::nullopt;
  const int ei = static_cast<int>(elem), si = static_cast<int>(scale), bi = size_index(cb);
  std::atomic<const Table*>& slot = g_tables[ei][si][bi];
  const Table* t = slot.load(std::memory_order_acquire);
  if (!t) {
    std::lock_guard<std::mutex> lock(g_table_mutex);
    t = slot.load(std::memory_order_acquire);
    if (!t) {
      t = build_table(elem, scale, cb);  // lives for the whole process (a few KB)
      slot.store(t, std::memory_order_release);
    }
  }
  return t->w[static_cast<size_t>(base_pattern)];
}

}  // namespace scalesweep::bounds

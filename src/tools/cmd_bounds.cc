// scalesweep bounds: derive the provable sweep windows in exact arithmetic (docs/BOUNDS.md).
//   bounds [--elem e2m1] [--scale e4m3] [--block 16] [--json] [--per-base]
//   bounds --attack [--window L,R] [--blocks N] [--steps K] [--seed S] [--base P]...
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/scale/bounds.h"
#include "tools/command.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

namespace sb = ::scalesweep::bounds;
using nlohmann::json;

struct BoundsArgs {
  std::string elem = "e2m1", scale = "e4m3", window;
  int block = 16;
  bool json_out = false, per_base = false, attack = false, fail_on_hit = false, emit = false;
  long blocks = 2000;
  int steps = 200;
  unsigned long long seed = 1;
  std::vector<int> bases;
};

json rats(const std::vector<sb::Rat>& v) {
  json a = json::array();
  for (const auto& r : v) a.push_back(r.str());
  return a;
}

json cert_json(const sb::Certificate& c) {
  return json{{"m", c.m},
              {"r", c.r.str()},
              {"pattern", c.q},
              {"u", rats(c.u)},
              {"u_patterns", c.u_patterns},
              {"lambda", rats(c.lambda)},
              {"A", c.A.str()},
              {"B", c.B.str()},
              {"margin", c.margin.str()},
              {"allowance", c.allowance.str()},
              {"exact_ok", c.exact_ok},
              {"valid", c.valid}};
}

std::string join(const std::vector<sb::Rat>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i].str();
  return s + "}";
}

void print_certs(const char* title, const std::vector<sb::Certificate>& cs, int n) {
  std::printf("\n%s\n", title);
  Table t({"m", "r", "u_j", "lambda_j", "B", "A", strf("A+%dB", n - 1), "allowance", "valid"});
  for (const auto& c : cs)
    t.add_row({std::to_string(c.m), c.r.str(), join(c.u), join(c.lambda), c.B.str(), c.A.str(),
               c.margin.str(), strf("%.2e", c.allowance.to_double()), c.valid ? "yes" : "NO"});
  t.print();
}

// The derivation as --json shows it.
json derive_json(const sb::Derivation& d, const BoundsArgs& a) {
  const ScaleFormat f = d.scale;
  const int mb = sb::scale_mantissa_bits(f);
  json up{{"half_grid", d.upper.half_g.str()},
          {"threshold", d.upper.threshold.str()},
          {"alpha", d.upper.alpha.str()},
          {"hi", d.upper.hi},
          {"rows", json::array()}};
  for (const auto& r : d.upper.rows)
    up["rows"].push_back({{"b", sb::bit_string(r.b, mb)},
                          {"sup", std::to_string(r.carry) + " " + sb::bit_string(r.sup_mant, mb)},
                          {"paper_delta", r.paper_delta},
                          {"delta", r.delta}});
  auto lrows = [&](const std::vector<sb::LowerRow>& rows) {
    json arr = json::array();
    for (const auto& r : rows)
      arr.push_back({{"b", sb::bit_string(r.b, mb)},
                     {"inf", std::to_string(r.borrow) + " " + sb::bit_string(r.inf_mant, mb)},
                     {"delta", r.delta},
                     {"first_unexcluded", r.first_unexcluded.str()}});
    return arr;
  };
  json lo{{"beta", d.lower.beta.str()},
          {"g_double", d.lower.g_double.str()},
          {"r0", d.lower.r0.str()},
          {"ell", d.lower.ell.str()},
          {"lo", d.lower.lo},
          {"rows", lrows(d.lower.rows)},
          {"paper_rows", lrows(d.lower.paper_rows)}};
  json certs = json::array(), paper = json::array(), per = json::array();
  for (const auto& c : d.certificates) certs.push_back(cert_json(c));
  for (const auto& c : d.paper_checks) paper.push_back(cert_json(c));
  for (const auto& b : d.per_base)
    per.push_back({{"pattern", b.pattern},
                   {"value", sb::base_value(f, b.pattern)},
                   {"window", b.window ? json::array({b.window->lo, b.window->hi}) : json()},
                   {"note", b.note}});
  json out{{"elem", a.elem},
           {"scale", a.scale},
           {"block", a.block},
           {"loss", d.arith == sb::LossArith::kFloat32 ? "float32" : "float64"},
           {"upper", up},
           {"lower", lo},
           {"certificates", certs},
           {"paper_certificates", paper},
           {"max_u", d.max_u.str()},
           {"window", json::array({d.window.lo, d.window.hi})},
           {"per_base", per}};
  return out;
}

// The derivation as tables.
void print_derive(const sb::Derivation& d, const BoundsArgs& a) {
  const ScaleFormat f = d.scale;
  const int mb = sb::scale_mantissa_bits(f);
  std::printf("bounds: elements %s, scales %s, block %d (selector loss: %s)\n", a.elem.c_str(),
              a.scale.c_str(), a.block,
              d.arith == sb::LossArith::kFloat32 ? "float32 contract" : "binary64");
  std::printf(
      "\nUpper bound (half-scale dominance): the grid prefix up to %s is closed under "
      "doubling, so every |y| < t*s = %s*s rounds into it and s loses to s/2;\n"
      "alpha = gmax/t = %s. sup = floor(alpha*next(base)) as in the paper; the proven "
      "offset uses sup < alpha*next(base) (s_base < next(base) strictly).\n",
      d.upper.half_g.str().c_str(), d.upper.threshold.str().c_str(), d.upper.alpha.str().c_str());
  Table tu({"b", "sup", "delta(paper)", "delta(proven)"});
  for (const auto& r : d.upper.rows)
    tu.add_row({sb::bit_string(r.b, mb),
                std::to_string(r.carry) + " " + sb::bit_string(r.sup_mant, mb),
                std::to_string(r.paper_delta), std::to_string(r.delta)});
  tu.print();
  std::printf(
      "\nLower bound: every ratio r < r0 = %s (%.4f) loses to 2r (max coordinate on grid value "
      "%s, per-element penalty beta*r^2, beta = %s);\nconvex certificates exclude the legal "
      "ratios in [r0, ell); ell = %s (%.4f) is the first ratio no certificate excludes.\n",
      d.lower.r0.str().c_str(), d.lower.r0.to_double(), d.lower.g_double.str().c_str(),
      d.lower.beta.str().c_str(), d.lower.ell.str().c_str(), d.lower.ell.to_double());
  Table tl({"b", "inf", "delta", "first unexcluded ratio"});
  for (const auto& r : d.lower.rows)
    tl.add_row({sb::bit_string(r.b, mb),
                std::to_string(r.borrow) + " " + sb::bit_string(r.inf_mant, mb),
                std::to_string(r.delta), r.first_unexcluded.str()});
  tl.print();
  if (!d.lower.paper_rows.empty()) {
    std::printf("\nPaper Table 2 (ell = 4/5):\n");
    Table tp({"b", "inf", "delta"});
    for (const auto& r : d.lower.paper_rows)
      tp.add_row({sb::bit_string(r.b, mb),
                  std::to_string(r.borrow) + " " + sb::bit_string(r.inf_mant, mb),
                  std::to_string(r.delta)});
    tp.print();
  }
  print_certs("Certificates found (legal ratios in [r0, ell); m = significand of the base):",
              d.certificates, a.block);
  if (!d.paper_checks.empty())
    print_certs("The paper's Table 3 certificates, rechecked:", d.paper_checks, a.block);
  std::printf(
      "\nWindow for normal bases: [%d, %d] (dominating ratios up to %s: needs %s*base <= max "
      "scale; the per-base table below handles every base exactly)\n",
      d.window.lo, d.window.hi, d.max_u.str().c_str(), d.max_u.str().c_str());
  if (a.per_base || f == ScaleFormat::kE4M3) {
    std::printf("\nPer-base proven windows [lo, hi] (offsets; '-' = none, exhaustive):\n");
    const int cols = f == ScaleFormat::kE4M3 ? 8 : 16;
    std::vector<std::string> hdr = {"patterns"};
    for (int c = 0; c < cols; ++c)
      hdr.push_back(f == ScaleFormat::kE4M3 ? sb::bit_string(c, 3) : "+" + std::to_string(c));
    Table tb(hdr);
    for (size_t i = 0; i < d.per_base.size(); i += static_cast<size_t>(cols)) {
      std::vector<std::string> row = {strf("%zu..", i)};
      for (size_t j = i; j < i + static_cast<size_t>(cols) && j < d.per_base.size(); ++j) {
        const auto& w = d.per_base[j].window;
        row.push_back(w ? strf("%d..%d", w->lo, w->hi) : "-");
      }
      while (row.size() < hdr.size()) row.push_back("");
      tb.add_row(row);
    }
    tb.print();
  } else {
    std::printf("\n(per-base table: pass --per-base)\n");
  }
}

int run_derive(const BoundsArgs& a) {
  const sb::Derivation d = sb::derive_named(a.elem, a.scale, a.block);
  if (a.json_out)
    std::printf("%s\n", derive_json(d, a).dump(2).c_str());
  else
    print_derive(d, a);
  return 0;
}

// Source of src/scale/bounds/pinned_windows.inc (the E2M1 tables proven_window() serves).
int run_emit_pinned() {
  std::printf(
      "// Generated by `scalesweep bounds --emit-pinned` (bounds_test.cc checks that\n"
      "// derive() still reproduces every entry). {lo, hi} offsets; {1, 0} = none proven.\n");
  for (ScaleFormat f : {ScaleFormat::kE4M3, ScaleFormat::kUE8M0}) {
    for (int n : {8, 16, 32, 64}) {
      const sb::Derivation d = sb::derive(sb::ElemFormat::kE2M1, f, n);
      std::printf("constexpr int8_t k%s_%d[%zu][2] = {", f == ScaleFormat::kE4M3 ? "E4M3" : "UE8M0",
                  n, d.per_base.size());
      for (size_t i = 0; i < d.per_base.size(); ++i) {
        if (i % 8 == 0) std::printf("\n   ");
        const auto& w = d.per_base[i].window;
        if (w)
          std::printf(" {%d, %d},", w->lo, w->hi);
        else
          std::printf(" {1, 0},");
      }
      std::printf("\n};\n");
    }
  }
  return 0;
}

int run_attack(const BoundsArgs& a) {
  sb::AttackConfig cfg;
  cfg.elem = sb::kElemFormatNames.parse(a.elem);
  cfg.scale = kScaleFormatNames.parse(a.scale);
  cfg.block = a.block;
  cfg.blocks = a.blocks;
  cfg.steps = a.steps;
  cfg.seed = a.seed;
  cfg.bases = a.bases;
  if (!a.window.empty()) cfg.window = parse_window(a.window, cfg.scale, "--window");
  if (a.steps < 0) throw std::invalid_argument("--steps must be >= 0");
  ProgressBar bar("attack", a.blocks, "blocks");
  const sb::AttackResult r = sb::attack(cfg, [&](long done, long) { bar.update(done); });
  bar.finish();
  const std::string wdesc = cfg.window ? strf("[%d, %d]", cfg.window->lo, cfg.window->hi)
                                       : std::string("per-base proven windows");
  if (a.json_out) {
    json hits = json::array();
    for (const auto& h : r.hits)
      hits.push_back({{"base", h.base},
                      {"best", h.best},
                      {"offset", h.offset},
                      {"loss_best", h.loss_best},
                      {"loss_window", h.loss_window},
                      {"y", h.y}});
    json out{{"elem", a.elem},
             {"scale", a.scale},
             {"block", a.block},
             {"window", wdesc},
             {"restarts", r.restarts},
             {"evaluations", r.evaluations},
             {"min_offset", r.min_offset},
             {"max_offset", r.max_offset},
             {"hits", hits}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "attack: %s/%s block %d, window %s: %ld restarts, %ld loss sweeps, optimum offsets "
        "seen %d..%d, %zu counterexample(s)\n",
        a.elem.c_str(), a.scale.c_str(), a.block, wdesc.c_str(), r.restarts, r.evaluations,
        r.min_offset, r.max_offset, r.hits.size());
    if (!cfg.window) {
      // How close the attack gets to the proven edges (a proof need not be tight).
      int lo_hit = 0, hi_hit = 0, nb = 0;
      for (const auto& [P, mm] : r.per_base) {
        const auto w = sb::proven_window(cfg.elem, cfg.scale, cfg.block, P);
        if (!w) continue;
        ++nb;
        lo_hit += mm.first <= w->lo;
        hi_hit += mm.second >= w->hi;
      }
      std::printf("edges reached: lower edge on %d of %d bases, upper edge on %d of %d\n", lo_hit,
                  nb, hi_hit, nb);
    }
    if (!r.hits.empty()) {
      Table t({"base", "optimum", "offset", "loss(optimum)", "best loss in window", "block"});
      for (size_t i = 0; i < r.hits.size() && i < 10; ++i) {
        const auto& h = r.hits[i];
        std::string ys;
        for (size_t k = 0; k < h.y.size() && k < 16; ++k)
          ys += strf("%s%.9g", k ? " " : "", h.y[k]);
        if (h.y.size() > 16) ys += " ...";
        t.add_row({std::to_string(h.base), std::to_string(h.best), strf("%+d", h.offset),
                   strf("%.9g", h.loss_best), strf("%.9g", h.loss_window), ys});
      }
      t.print();
    }
  }
  return (a.fail_on_hit && !r.hits.empty()) ? 2 : 0;
}

SS_COMMAND("bounds",
           "Derive provable sweep windows in exact arithmetic (paper Tables 1-3, any format), or "
           "attack a window with an adversarial search",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<BoundsArgs>();
             sub.add_option("--elem", a->elem, "element format: e2m1 | e3m2 | e2m3 | e4m3 | e5m2");
             sub.add_option("--scale", a->scale, "scale format: e4m3 | ue8m0");
             sub.add_option("--block", a->block, "block size n");
             sub.add_flag("--json", a->json_out, "machine-readable output");
             sub.add_flag("--per-base", a->per_base,
                          "print the per-base window table for UE8M0 too");
             sub.add_flag("--attack", a->attack, "adversarial search instead of the derivation");
             sub.add_option("--window", a->window,
                            "attack: fixed offset window L,R (e.g. --window=-2,6); default: the "
                            "per-base proven windows");
             sub.add_option("--blocks", a->blocks, "attack: random restarts");
             sub.add_option("--steps", a->steps, "attack: hill-climbing steps per restart");
             sub.add_option("--seed", a->seed, "attack: random seed");
             sub.add_option("--base", a->bases,
                            "attack: base patterns to target (repeatable; default all)");
             sub.add_flag("--fail-on-hit", a->fail_on_hit,
                          "attack: exit 2 when a counterexample is found");
             sub.add_flag("--emit-pinned", a->emit,
                          "print the source of src/scale/bounds/pinned_windows.inc");
             return [a]() {
               if (a->emit) return run_emit_pinned();
               return a->attack ? run_attack(*a) : run_derive(*a);
             };
           });

}  // namespace
}  // namespace scalesweep::tools

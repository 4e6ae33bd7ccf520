// CPU tests of the CUDA operator's host-side parts (built with or without nvcc, run in CI):
// argument checks, output layout math, the format helpers the kernels use, and the kernels'
// per-block code (block_quant.h) run on the CPU against the scalar reference, byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/block_quant.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/test_data.h"
#include "scalesweep/cuda/layout.h"
#include "scalesweep/cuda/quantize.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/layout.h"
#include "scalesweep/quant/quantize.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::cuda {
namespace {

using format::E4M3;
using testing::Kind;

// ---------------------------------------------------------------- layout math

TEST(CudaLayout, SizesMatchTheQuantLayer) {
  for (int64_t rows : {1, 5, 127, 128, 129, 300, 1024}) {
    for (int64_t cols : {1, 2, 15, 16, 17, 48, 64, 65, 100, 1000, 8192}) {
      const int64_t nb = blocks_per_row(cols);
      EXPECT_EQ(nb, (cols + 15) / 16);
      EXPECT_EQ(cuda::packed_cols(cols), scalesweep::packed_cols(cols));
      const SwizzledShape sh{rows, nb};
      EXPECT_EQ(swizzled_bytes(rows, cols), sh.bytes()) << rows << "x" << cols;
      EXPECT_EQ(swizzled_has_padding(rows, cols),
                sh.padded_rows() != rows || sh.padded_blocks() != nb);
    }
  }
}

TEST(CudaLayout, RowBlockWithoutDivision) {
  // The kernels' division-free row/block split equals integer division for block counts per row
  // from 1 to 2^31 and flat indices up to 2^52, near every multiple of nb and at random.
  std::mt19937_64 rng(13);
  std::vector<int64_t> nbs = {
      1, 2, 3, 7, 257, 512, 4096, 65535, (int64_t{1} << 31) - 1, int64_t{1} << 31};
  for (int i = 0; i < 200; ++i) nbs.push_back(1 + static_cast<int64_t>(rng() % (1u << 31)));
  int64_t checked = 0;
  for (int64_t nb : nbs) {
    const double inv = 1.0 / static_cast<double>(nb);
    std::vector<int64_t> bs;
    for (int i = 0; i < 300; ++i) {
      const int64_t q = static_cast<int64_t>(rng() % ((int64_t{1} << 52) / nb));
      for (int64_t d : {int64_t{-1}, int64_t{0}, int64_t{1}}) bs.push_back(q * nb + d);
      bs.push_back(static_cast<int64_t>(rng() % (int64_t{1} << 52)));
    }
    for (int64_t b : bs) {
      if (b < 0) continue;
      const kern::RowBlock rb = kern::row_block(b, nb, inv);
      ASSERT_EQ(rb.m, b / nb) << b << " / " << nb;
      ASSERT_EQ(rb.kb, b % nb) << b << " / " << nb;
      ++checked;
    }
  }
  EXPECT_GT(checked, 200000);
}

TEST(CudaLayout, SwizzledOffsetMatchesQuantLayerAndIsABijection) {
  for (int64_t rows : {1, 31, 128, 200, 513}) {
    for (int64_t nb : {1, 3, 4, 5, 8, 13, 512}) {
      const int64_t bytes = SwizzledShape{rows, nb}.bytes();
      std::vector<int> hits(static_cast<size_t>(bytes), 0);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t k = 0; k < nb; ++k) {
          const int64_t o = cuda::swizzled_offset(m, k, nb);
          ASSERT_EQ(o, scalesweep::swizzled_offset(m, k, nb)) << m << "," << k << "," << nb;
          ASSERT_GE(o, 0);
          ASSERT_LT(o, bytes);
          ++hits[static_cast<size_t>(o)];
        }
      }
      for (int h : hits) ASSERT_LE(h, 1);
    }
  }
  // SPEC formula on a hand-checked point: m = 200 (tile 1, lane 8, sub-row 2), k = 6, nb = 8.
  EXPECT_EQ(cuda::swizzled_offset(200, 6, 8), (1 * 2 + 1) * 512 + 8 * 16 + 2 * 4 + 2);
}

// ---------------------------------------------------------------- format helpers

TEST(CudaFormat, E4m3ValueIsExact) {
  for (uint32_t p = 0; p <= 126; ++p) EXPECT_EQ(kern::e4m3_value(p), E4M3::decode_f(p)) << p;
}

TEST(CudaFormat, E4m3RoundingMatchesGenericCodec) {
  std::mt19937_64 rng(7);
  std::vector<float> xs;
  for (uint32_t p = 0; p <= 126; ++p) {  // grid points, midpoints and their neighbours
    const float v = E4M3::decode_f(p);
    const float nxt = E4M3::decode_f(p + 1 <= 126 ? p + 1 : 126);
    for (float u : {v, (v + nxt) / 2, nxt}) {
      xs.push_back(u);
      xs.push_back(std::nextafter(u, 0.0f));
      xs.push_back(std::nextafter(u, 1e30f));
    }
  }
  for (int i = 0; i < 200000; ++i)  // random bit patterns over 2^-20 .. 2^12
    xs.push_back(std::ldexp(1.0f + static_cast<float>(rng() % (1u << 23)) / (1u << 23),
                            static_cast<int>(rng() % 32) - 20));
  xs.push_back(std::numeric_limits<float>::max());
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(std::numeric_limits<float>::denorm_min());
  for (float x : xs) {
    ASSERT_EQ(kern::e4m3_rne(x), E4M3::encode_rne(x)) << x;
    ASSERT_EQ(kern::e4m3_floor(x), E4M3::encode_floor(x)) << x;
  }
}

TEST(CudaFormat, FourBitRoundingMatchesReference) {
  std::mt19937_64 rng(11);
  // s == 0 (pattern 0): every product is 0, so the reconstruction is 0 (the loss is sum y^2).
  const kern::Thresholds zero(0.0f);
  for (float y : {0.0f, 1e-30f, 1.0f, 3e38f}) EXPECT_EQ(zero.rounded(y), 0.0f);
  for (uint32_t p = 1; p <= 126; ++p) {
    const float s = kern::e4m3_value(p);
    const kern::Thresholds th(s);
    for (int i = 0; i < 2000; ++i) {
      float y = std::ldexp(static_cast<float>(rng() % (1u << 24)) / (1u << 24),
                           static_cast<int>(rng() % 16) - 12);
      if (i < 8) y = s * std::array<float, 8>{0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f}[i];
      const uint8_t ref = fp4_code(y, s);
      ASSERT_EQ(th.index(y), ref & 7u) << y << " / " << s;
      ASSERT_EQ(th.rounded(y), format::kFp4Values.v[ref & 7u] * s);
      ASSERT_EQ(kern::fp4_mag(ref & 7u), format::kFp4Values.v[ref & 7u]);
    }
  }
}

TEST(CudaFormat, SaturatedFmaIndexMatchesThresholds) {
  // The codes' index by saturated FMAs equals the threshold compares for every scale, on each
  // threshold, the floats just below and above it, the grid points, and random values from
  // float subnormals to 2^48 (the input limit).
  std::mt19937_64 rng(12);
  constexpr float kMids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  int64_t checked = 0;
  for (uint32_t p = 1; p <= 126; ++p) {
    const float s = kern::e4m3_value(p);
    const kern::Thresholds th(s);
    const kern::SatSearch search(th);
    std::vector<float> ys = {0.0f, 1e-45f, 1e-38f, 0x1p48f, s * 6.0f, s * 7.0f};
    for (float m : kMids) {
      const float t = m * s;
      ys.insert(ys.end(), {t, std::nextafter(t, 0.0f), std::nextafter(t, 1e30f)});
    }
    for (int i = 0; i < 3000; ++i)
      ys.push_back(std::ldexp(static_cast<float>(rng() % (1u << 24)) / (1u << 24),
                              static_cast<int>(rng() % 190) - 140));
    for (float y : ys) {
      ASSERT_EQ(search.index(y), th.index(y)) << y << " / " << s;
      ASSERT_EQ(search.index(y), fp4_code(y, s) & 7u) << y << " / " << s;
      ++checked;
    }
  }
  EXPECT_GT(checked, 126 * 3000);
}

TEST(CudaFormat, PackedBf16LossEqualsReferenceLoss) {
  // Thresholds and grid products of every scale are exact bf16 values (the packed rounding's
  // premise), and the packed loss equals the chain loss and block_loss bit for bit on blocks
  // full of exact ties, float subnormals and values far above/below the scale.
  for (uint32_t p = 0; p <= 126; ++p) {
    const kern::Thresholds th(kern::e4m3_value(p));
    for (float v : {th.t0, th.t1, th.t2, th.t3, th.t4, th.t5, th.t6, th.h, th.s1, th.s15, th.s2,
                    th.s3, th.s4, th.s6})
      ASSERT_EQ(kern::bits(v) & 0xFFFFu, 0u) << "pattern " << p << " value " << v;
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  int64_t checked = 0;
  for (int it = 0; it < 4000; ++it) {
    const float s0 = kern::e4m3_value(static_cast<uint32_t>(rng() % 127));
    float y[16], ay[16], w[16];
    for (int i = 0; i < 16; ++i) {
      const double u = U(rng);
      float v;
      if (u < 0.3)
        v = s0 * mids[rng() % 7];  // exact ties
      else if (u < 0.4)
        v = std::nextafter(s0 * mids[rng() % 7], u < 0.35 ? 0.0f : 1e30f);
      else if (u < 0.45)
        v = std::ldexp(static_cast<float>(U(rng)), -130);  // float subnormal
      else if (u < 0.5)
        v = 0.0f;
      else
        v = static_cast<float>(std::ldexp(U(rng), static_cast<int>(rng() % 40) - 25));
      y[i] = (rng() & 1) ? -v : v;
      ay[i] = std::fabs(y[i]);
      w[i] = static_cast<float>(U(rng) * 4);
    }
    const kern::PairedAbs pa = kern::pair_abs(ay);
    for (uint32_t p = 0; p <= 126; p += 1 + static_cast<uint32_t>(rng() % 5)) {
      const float s = kern::e4m3_value(p);
      const float ref = block_loss(y, nullptr, 16, s), refw = block_loss(y, w, 16, s);
      const float a = kern::candidate_loss<false>(ay, w, pa, s);
      const float b = kern::candidate_loss_chain<false>(ay, w, s);
      const float aw = kern::candidate_loss<true>(ay, w, pa, s);
      ASSERT_EQ(std::memcmp(&a, &ref, 4), 0) << "s=" << s << " packed " << a << " ref " << ref;
      ASSERT_EQ(std::memcmp(&b, &ref, 4), 0) << "s=" << s << " chain " << b << " ref " << ref;
      ASSERT_EQ(std::memcmp(&aw, &refw, 4), 0) << "s=" << s << " weighted";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50000);
}

TEST(CudaFormat, SweepWindowMatchesReferenceForEveryBlockLength) {
  // Every base pattern 0..126 (a = 6 * value, and just above), both sweeps, and every block
  // length n = 1..16: full blocks use win_full, a partial last block of n = cols % 16
  // elements uses win_part (the launch parameters carry both, filled from src/scale/bounds).
  for (Method m : {Method::kSweepMse, Method::kSweepWmse}) {
    SelectorConfig cfg;
    cfg.method = m;
    for (int n = 1; n <= 16; ++n) {
      float dummy = 0;
      uint8_t out = 0;
      QuantizeArgs args;
      args.x = &dummy;
      args.rows = 1;
      args.cols = 16 + (n % 16);
      args.method = m;
      args.codes = &out;
      const kern::Params prm = detail::make_params(args);
      const int8_t* tab = n == 16 ? &prm.win_full[0][0] : &prm.win_part[0][0];
      for (uint32_t P = 0; P <= 126; ++P) {
        for (float a :
             {6.0f * E4M3::decode_f(P), std::nextafter(6.0f * E4M3::decode_f(P), 1e30f)}) {
          if (a == 0.0f) continue;
          const PatternRange ref = sweep_patterns(a, n, cfg);
          const PatternRange w = kern::sweep_window(kern::e4m3_floor(kern::fdiv(a, 6.0f)),
                                                    m == Method::kSweepWmse, tab);
          ASSERT_EQ(w.lo, ref.lo) << kMethodNames.name(m) << " n=" << n << " a=" << a;
          ASSERT_EQ(w.hi, ref.hi) << kMethodNames.name(m) << " n=" << n << " a=" << a;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- pruned sweep

// The sweep's first minimum by a full ascending scan of the window (the reference order).
kern::Selected full_scan(const float (&ay)[16], const float (&w)[16], PatternRange win,
                         bool weighted) {
  kern::Selected best{0, 0};
  for (int p = win.lo; p <= win.hi; ++p) {
    const float s = kern::e4m3_value(static_cast<uint32_t>(p));
    const float l = weighted ? kern::candidate_loss_chain<true>(ay, w, s)
                             : kern::candidate_loss_chain<false>(ay, w, s);
    if (p == win.lo || l < best.loss) best = {static_cast<uint32_t>(p), l};
  }
  return best;
}

// The window table of full blocks (what the kernels get for sweep-mse).
kern::Params mse_params() {
  static float dummy = 0;
  static uint8_t out = 0;
  QuantizeArgs args;
  args.x = &dummy;
  args.rows = 1;
  args.cols = 16;
  args.method = Method::kSweepMse;
  args.codes = &out;
  return detail::make_params(args);
}

TEST(CudaSweep, PrunedScanEqualsFullScan) {
  // Random, integer-valued (many exact loss ties between scales), FP8-grid and one-hot
  // blocks; both sweeps with their default windows plus wide windows [P-12, P+7] (more
  // lower candidates, so the early exit is exercised far from P); weighted and unweighted.
  const kern::Params prm = mse_params();
  std::mt19937_64 rng(2024);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::normal_distribution<double> N(0.0, 1.0);
  int64_t blocks = 0, lower_wins = 0, lower_ties = 0, pruned = 0, full = 0;
  for (int it = 0; it < 60000; ++it) {
    float ay[16], w[16];
    const int kind = it % 4;
    const double scale = std::ldexp(1.0, static_cast<int>(rng() % 24) - 12);
    for (int i = 0; i < 16; ++i) {
      double v;
      if (kind == 0)
        v = N(rng) * scale;
      else if (kind == 1)
        v = static_cast<double>(rng() % 13);
      else if (kind == 2)
        v = E4M3::decode_f(static_cast<uint32_t>(rng() % 127)) *
            std::array<double, 8>{0, .5, 1, 1.5, 2, 3, 4, 6}[rng() % 8];
      else
        v = i == static_cast<int>(rng() % 16) ? scale * (1 + U(rng)) : 0.0;
      ay[i] = static_cast<float>(std::fabs(v));
      w[i] = kind == 1 ? static_cast<float>(1 + rng() % 3) : static_cast<float>(U(rng) * 4);
    }
    float a = 0;
    for (float v : ay) a = std::max(a, v);
    if (a == 0.0f) continue;
    const uint32_t P = kern::e4m3_floor(kern::fdiv(a, 6.0f));
    for (int variant = 0; variant < 4; ++variant) {
      const bool weighted = variant & 1;
      PatternRange win = kern::sweep_window(P, weighted, &prm.win_full[0][0]);
      if (variant >= 2) win = kern::clip_window(static_cast<int>(P) - 12, static_cast<int>(P) + 7);
      int evals = 0;
      const kern::Selected got = weighted ? kern::sweep_pruned<true>(ay, w, a, P, win, &evals)
                                          : kern::sweep_pruned<false>(ay, w, a, P, win, &evals);
      const kern::Selected ref = full_scan(ay, w, win, weighted);
      ASSERT_EQ(got.pattern, ref.pattern) << "block " << it << " variant " << variant << " window ["
                                          << win.lo << ", " << win.hi << "] P " << P;
      ASSERT_EQ(std::memcmp(&got.loss, &ref.loss, 4), 0) << "block " << it;
      const kern::Selected plain = weighted ? kern::sweep_scan<true>(ay, w, win, nullptr)
                                            : kern::sweep_scan<false>(ay, w, win, nullptr);
      ASSERT_EQ(plain.pattern, ref.pattern) << "plain scan, block " << it;
      ASSERT_EQ(std::memcmp(&plain.loss, &ref.loss, 4), 0) << "plain scan, block " << it;
      ASSERT_GE(evals, 1);
      ASSERT_LE(evals, win.hi - win.lo + 1);
      pruned += evals;
      full += win.hi - win.lo + 1;
      if (ref.pattern < P) {
        ++lower_wins;
        // A tie between the lower winner and a higher pattern (the '<=' of the walk).
        for (int p = static_cast<int>(ref.pattern) + 1; p <= win.hi; ++p) {
          const float s = kern::e4m3_value(static_cast<uint32_t>(p));
          const float l = weighted ? kern::candidate_loss_chain<true>(ay, w, s)
                                   : kern::candidate_loss_chain<false>(ay, w, s);
          if (l == ref.loss && static_cast<uint32_t>(p) >= P) {
            ++lower_ties;
            break;
          }
        }
      }
      ++blocks;
    }
  }
  // A tie exactly at the walk's bound: {6.75, 1, 4, 3, 4, 0...}, P = 57 (1.125), unit weights,
  // window [49, 64]: scale 2 (pattern 64) and scale 1 (pattern 56, where the bound
  // fl((6.75 - 6)^2) = 0.5625 is the whole loss) both lose 0.5625, and 56 must win the tie
  // (a walk stopping on bound >= best would return 64).
  {
    float ay[16] = {6.75f, 1.0f, 4.0f, 3.0f, 4.0f}, w[16];
    for (float& v : w) v = 1.0f;
    const uint32_t P = kern::e4m3_floor(kern::fdiv(6.75f, 6.0f));
    ASSERT_EQ(P, 57u);
    const PatternRange win = kern::sweep_window(P, true, nullptr);
    ASSERT_EQ(win.lo, 49);
    ASSERT_EQ(win.hi, 64);
    for (bool weighted : {false, true}) {
      const kern::Selected got = weighted
                                     ? kern::sweep_pruned<true>(ay, w, 6.75f, P, win, nullptr)
                                     : kern::sweep_pruned<false>(ay, w, 6.75f, P, win, nullptr);
      EXPECT_EQ(got.pattern, 56u) << weighted;
      EXPECT_EQ(got.loss, 0.5625f) << weighted;
      EXPECT_EQ(full_scan(ay, w, win, weighted).pattern, 56u);
    }
  }
  // The data must exercise the walk: winners below P, ties decided there, and real pruning.
  EXPECT_GT(lower_wins, 1000) << blocks;
  EXPECT_GT(lower_ties, 10) << blocks;
  EXPECT_LT(pruned, full);
  RecordProperty("evaluated_fraction", std::to_string(static_cast<double>(pruned) / full));
}

TEST(CudaSweep, PruningOnBenchLikeData) {
  // bench-gpu's activations (sum of 4 uniforms, every 97th channel x20, gs = 6*256/40): the
  // candidates evaluated per block, and the SIMT cost per warp (32 consecutive blocks of a
  // row): 1 + the most ascending steps of any lane + the most descending steps of any lane (a
  // warp runs a loop step while any of its lanes needs it), against the full windows.
  const kern::Params prm = mse_params();
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<float> U(-0.5f, 0.5f);
  const int K = 8192, rows = 8;
  const float gs = 6.0f * 256.0f / 40.0f;
  for (bool weighted : {false, true}) {
    int64_t win_sum = 0, eval_sum = 0, warp_full = 0, warp_eval = 0;
    int up_max = 0, down_max = 0, full_max = 0;
    for (int r = 0; r < rows; ++r) {
      for (int kb = 0; kb < K / 16; ++kb) {
        float ay[16], w[16];
        float a = 0;
        for (int i = 0; i < 16; ++i) {
          float x = U(rng) + U(rng) + U(rng) + U(rng);
          if ((kb * 16 + i) % 97 == 3) x *= 20.0f;
          ay[i] = std::fabs(kern::fmul(x, gs));
          w[i] = std::exp2(U(rng) * 16.0f);
          a = std::max(a, ay[i]);
        }
        const uint32_t P = kern::e4m3_floor(kern::fdiv(a, 6.0f));
        const PatternRange win = kern::sweep_window(P, weighted, &prm.win_full[0][0]);
        int evals = 0;
        if (weighted)
          kern::sweep_pruned<true>(ay, w, a, P, win, &evals);
        else
          kern::sweep_pruned<false>(ay, w, a, P, win, &evals);
        const int c = std::clamp(static_cast<int>(P), win.lo, win.hi);
        const int up = win.hi - c, down = evals - 1 - up;
        win_sum += win.hi - win.lo + 1;
        eval_sum += evals;
        up_max = std::max(up_max, up);
        down_max = std::max(down_max, down);
        full_max = std::max(full_max, win.hi - win.lo + 1);
        if (kb % 32 == 31) {
          warp_eval += 1 + up_max + down_max;
          warp_full += full_max;
          up_max = down_max = full_max = 0;
        }
      }
    }
    const std::string m = weighted ? "wmse" : "mse";
    const double nblk = rows * K / 16.0, nwarp = nblk / 32;
    std::printf(
        "sweep-%s on bench-like data: %.2f of %.2f candidates per block (%.0f %%); "
        "per warp (SIMT) %.2f steps, unpruned %.2f\n",
        m.c_str(), eval_sum / nblk, win_sum / nblk, 100.0 * eval_sum / win_sum, warp_eval / nwarp,
        warp_full / nwarp);
    RecordProperty("sweep_" + m + "_evaluated_fraction",
                   std::to_string(static_cast<double>(eval_sum) / win_sum));
    RecordProperty("sweep_" + m + "_warp_steps", std::to_string(warp_eval / nwarp));
    EXPECT_LT(eval_sum, win_sum) << m;
  }
  // exhaustive-mse on the same data: the pruned walk over 1..126 with the zero stop
  // (ascending steps counted up to and including the first pattern with a <= s/4).
  int64_t eval_sum = 0, warp_eval = 0;
  int up_max = 0, down_max = 0;
  for (int r = 0; r < rows; ++r) {
    for (int kb = 0; kb < K / 16; ++kb) {
      float ay[16], w[16] = {};
      float a = 0;
      for (int i = 0; i < 16; ++i) {
        float x = U(rng) + U(rng) + U(rng) + U(rng);
        if ((kb * 16 + i) % 97 == 3) x *= 20.0f;
        ay[i] = std::fabs(kern::fmul(x, gs));
        a = std::max(a, ay[i]);
      }
      int evals = 0;
      kern::select_scale<Method::kExhaustiveMse, false>(ay, w, a, false, nullptr, &evals);
      const int c = std::clamp(static_cast<int>(kern::e4m3_floor(kern::fdiv(a, 6.0f))), 1, 126);
      int up = 0;
      for (int p = c; p < 126 && a > kern::fmul(kern::e4m3_value(static_cast<uint32_t>(p)), 0.25f);
           ++p)
        ++up;
      const int down = evals - 1 - up;
      ASSERT_GE(down, 0);
      eval_sum += evals;
      up_max = std::max(up_max, up);
      down_max = std::max(down_max, down);
      if (kb % 32 == 31) {
        warp_eval += 1 + up_max + down_max;
        up_max = down_max = 0;
      }
    }
  }
  const double nblk = rows * K / 16.0;
  std::printf(
      "exhaustive-mse on bench-like data: %.2f of 126 candidates per block; per warp (SIMT) "
      "%.2f steps\n",
      eval_sum / nblk, warp_eval / (nblk / 32));
  RecordProperty("exhaustive_mse_warp_steps", std::to_string(warp_eval / (nblk / 32)));
  EXPECT_LT(eval_sum, static_cast<int64_t>(nblk) * 126 / 2);
}

struct Outputs {
  std::vector<uint8_t> codes, scales, swz;
  std::vector<float> loss, deq;
};

// Random |y| blocks of several shapes for the exhaustive and fast tests: normal, heavy-tailed
// (Laplace, Student-t-like), uniform, integer-valued (exact loss ties between scales), FP8-grid
// products, one-hot, and bench-like bf16 activations; magnitudes over many binades.
void random_block(std::mt19937_64& rng, int kind, float (&ay)[16], float (&w)[16]) {
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::normal_distribution<double> N(0.0, 1.0);
  const double scale = std::ldexp(1.0, static_cast<int>(rng() % 40) - 24);
  const int hot = static_cast<int>(rng() % 16);
  for (int i = 0; i < 16; ++i) {
    double v = 0;
    switch (kind) {
      case 0:
        v = N(rng) * scale;
        break;
      case 1:
        v = -std::log(1 - U(rng)) * scale;
        break;
      case 2:
        v = N(rng) / std::sqrt(std::max(1e-6, -2 * std::log(1 - U(rng)) / 3)) * scale;
        break;
      case 3:
        v = U(rng) * scale;
        break;
      case 4:
        v = static_cast<double>(rng() % 13);
        break;
      case 5:
        v = E4M3::decode_f(static_cast<uint32_t>(rng() % 127)) *
            std::array<double, 8>{0, .5, 1, 1.5, 2, 3, 4, 6}[rng() % 8];
        break;
      case 6:
        v = i == hot ? scale * (1 + U(rng)) : 0.0;
        break;
      default: {  // bench-like: sum of 4 uniforms (outlier channel x20), bf16, times gs
        double x = U(rng) + U(rng) + U(rng) + U(rng) - 2.0;
        if (i == hot && rng() % 6 == 0) x *= 20.0;
        v = kern::fmul(format::bf16_to_f32(format::f32_to_bf16(static_cast<float>(x))),
                       6.0f * 256.0f / 40.0f);
      }
    }
    ay[i] = static_cast<float>(std::fabs(v));
    w[i] = kind == 4 ? static_cast<float>(1 + rng() % 3)
                     : (U(rng) < 0.05 ? 0.0f : static_cast<float>(std::exp2(U(rng) * 16 - 8)));
  }
}
constexpr int kRandomBlockKinds = 8;

TEST(CudaExhaustive, PrunedWalkEqualsFullScanOfEveryPattern) {
  // select_scale<exhaustive> (the pruned walk with the zero stop) against a plain ascending
  // scan of patterns 1..126, bit for bit, weighted and not; and against the CPU reference
  // selector (select_block_scale, exhaustive-mse / exhaustive-wmse) on a subset.
  std::mt19937_64 rng(4242);
  int64_t blocks = 0, evals = 0, zero_stops = 0, lower_wins = 0;
  for (int it = 0; it < 40000; ++it) {
    float ay[16], w[16];
    random_block(rng, it % kRandomBlockKinds, ay, w);
    if (it % 97 == 0) ay[it % 16] = std::ldexp(1.5f, 10 + static_cast<int>(rng() % 8));  // > 6*448
    float a = 0;
    for (float v : ay) a = std::max(a, v);
    if (a == 0.0f) continue;
    for (bool weighted : {false, true}) {
      int n = 0;
      const kern::Selected got =
          weighted ? kern::select_scale<Method::kExhaustiveWmse, true>(ay, w, a, true, nullptr, &n)
                   : kern::select_scale<Method::kExhaustiveMse, false>(ay, w, a, true, nullptr, &n);
      const kern::Selected ref = full_scan(ay, w, kern::kAllPatterns, weighted);
      ASSERT_EQ(got.pattern, ref.pattern) << "block " << it << " weighted " << weighted;
      ASSERT_EQ(std::memcmp(&got.loss, &ref.loss, 4), 0) << "block " << it;
      if (it % 8 == 0) {
        SelectorConfig sc;
        sc.method = weighted ? Method::kExhaustiveWmse : Method::kExhaustiveMse;
        const BlockScale cpu = select_block_scale(ay, weighted ? w : nullptr, 16, sc);
        ASSERT_EQ(cpu.pattern, got.pattern) << "block " << it;
        ASSERT_EQ(std::memcmp(&cpu.loss, &got.loss, 4), 0) << "block " << it;
      }
      const uint32_t P = kern::e4m3_floor(kern::fdiv(a, 6.0f));
      const int c = std::clamp(static_cast<int>(P), 1, 126);
      if (c < 126 && !(a > kern::fmul(kern::e4m3_value(126), 0.25f))) ++zero_stops;
      if (static_cast<int>(got.pattern) < c) ++lower_wins;
      evals += n;
      ++blocks;
    }
  }
  EXPECT_GT(zero_stops, blocks / 2);  // the zero stop ends most ascending walks
  EXPECT_GT(lower_wins, 1000);        // and the descending walk decides many blocks
  EXPECT_LT(evals, blocks * 126 / 2);
  std::printf("exhaustive walk: %.1f of 126 candidates per block (%lld blocks)\n",
              static_cast<double>(evals) / blocks, static_cast<long long>(blocks));
}

// ---------------------------------------------------------------- fast numerics

// Checks one block of the fast sweep: the chosen pattern's exact contract loss (the CPU
// reference's contract_loss) within a relative 1e-6 of the optimum of its candidate window
// (the exact kernel's choice), and the reported loss equal to that exact loss. For sweep-mse
// the window is proven to hold the exhaustive optimum, so the reference is the CPU's
// exhaustive-mse selection (and the exact kernel must equal it); sweep-wmse's window [P-8, P+7]
// is not proven for the weighted loss (the exhaustive-wmse optimum lies outside it on some
// blocks), so its reference is the window's optimum, the exact sweep-wmse kernel's loss.
// Accumulates statistics.
struct FastStats {
  int64_t blocks = 0, differs = 0, worse = 0;
  double max_excess = 0, sum_excess = 0;
};
// kNu = kHalf2: the same within kern::half2_excess_bound (the excess statistics are then relative
// to lo + 2^-16 a^2 w_a, so near-exact optima do not divide by ~0).
template <Method M, Numerics kNu = Numerics::kFast>
void check_fast_block(const float (&ay)[16], const float (&w)[16], const int8_t* proven,
                      bool weighted, FastStats& st, const std::string& what) {
  float a = 0;
  for (float v : ay) a = std::max(a, v);
  if (a == 0.0f) return;
  const kern::Selected fast = weighted ? kern::select_scale<M, true, kNu>(ay, w, a, true, proven)
                                       : kern::select_scale<M, false, kNu>(ay, w, a, true, proven);
  const kern::Selected exact = weighted ? kern::select_scale<M, true>(ay, w, a, true, proven)
                                        : kern::select_scale<M, false>(ay, w, a, true, proven);
  const float* wr = weighted ? w : nullptr;
  BlockScale opt{static_cast<uint8_t>(exact.pattern), exact.loss};
  if constexpr (M == Method::kSweepMse) {
    SelectorConfig sc;
    sc.method = Method::kExhaustiveMse;
    opt = select_block_scale(ay, nullptr, 16, sc);
    ASSERT_EQ(opt.loss, exact.loss) << what << ": exact sweep-mse kernel is not the optimum";
  }
  const double lf = contract_loss(ay, wr, 16, static_cast<int>(fast.pattern), ScaleFormat::kE4M3);
  ASSERT_EQ(static_cast<double>(fast.loss), lf) << what << ": reported loss is not the exact one";
  const double wa = weighted ? static_cast<double>(*std::max_element(w, w + 16)) : 1.0;
  const double lo = opt.loss;
  const double floor = kNu == Numerics::kHalf2 ? 0x1p-16 * static_cast<double>(a) * a * wa : 0.0;
  const double allowed =
      kNu == Numerics::kHalf2 ? kern::half2_excess_bound(a, wa, lf, lo) : 1e-6 * lo;
  ASSERT_LE(lf - lo, allowed) << what << ": " << kNumericsNames.name(kNu) << " pattern "
                              << fast.pattern << " loss " << lf << ", exhaustive pattern "
                              << int(opt.pattern) << " loss " << opt.loss
                              << ", exact kernel pattern " << exact.pattern;
  ++st.blocks;
  if (fast.pattern != exact.pattern) ++st.differs;
  if (lf > static_cast<double>(exact.loss)) {
    ++st.worse;
    const double ex = opt.loss + floor > 0 ? (lf - opt.loss) / (opt.loss + floor) : 0.0;
    st.max_excess = std::max(st.max_excess, ex);
    st.sum_excess += ex;
  }
}

TEST(CudaFast, E2m1RoundingByMagicAddIsTheContractRounding) {
  // Every quotient class: exact grid values, the 7 ties, one ulp either side of them, random
  // values in [0, 7), and saturation in [6, 7); against fp4_index's RNE (scale/selector.h).
  std::vector<float> rs = {0.0f, 6.0f, 6.5f, std::nextafter(7.0f, 0.0f)};
  for (float t :
       {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f}) {
    rs.push_back(t);
    rs.push_back(std::nextafter(t, 0.0f));
    rs.push_back(std::nextafter(t, 10.0f));
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> U(0.0f, 7.0f);
  for (int i = 0; i < 200000; ++i) rs.push_back(U(rng));
  for (uint32_t b = 0; b < (1u << 23); b += 97) rs.push_back(std::ldexp(1.0f + b * 0x1p-23f, -3));
  const float grid[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  for (float r : rs) {
    const float q = kern::fast_e2m1_round(r);
    ASSERT_EQ(q, grid[fp4_index(r)]) << "r = " << r;
  }
}

// A pruned walk of an estimate against the plain ascending scan of the same estimate with the
// clamp on every candidate, on `n` random blocks (random_block, every shape), weighted and not:
// the same first minimum, pattern and loss bits, so the walk's bound never cut a candidate that
// could win. loss_of(ay, w, a, weighted) gives the estimate as a function of the scale;
// walks(ay, w, a, P, win, weighted) the walk's results (one per variant checked). wide: every
// third block also takes the window [P-12, P+7]; blocks of base below min_P are skipped.
template <class LossOf, class Walks>
void check_walk_against_plain_scan(uint64_t seed, int n, bool wide, uint32_t min_P,
                                   const LossOf& loss_of, const Walks& walks) {
  const kern::Params prm = mse_params();
  std::mt19937_64 rng(seed);
  int64_t lower = 0, blocks = 0;
  for (int it = 0; it < n; ++it) {
    float ay[16], w[16];
    random_block(rng, it % kRandomBlockKinds, ay, w);
    float a = 0;
    for (float v : ay) a = std::max(a, v);
    if (a == 0.0f) continue;
    const uint32_t P = kern::e4m3_floor(kern::fdiv(a, 6.0f));
    if (P < min_P) continue;
    for (bool weighted : {false, true}) {
      PatternRange win = kern::sweep_window(P, weighted, &prm.win_full[0][0]);
      if (wide && it % 3 == 0)
        win = kern::clip_window(static_cast<int>(P) - 12, static_cast<int>(P) + 7);
      const auto loss = loss_of(ay, w, a, weighted);
      kern::Selected ref{0, 0};
      for (int p = win.lo; p <= win.hi; ++p) {
        const float l = loss(kern::e4m3_value(static_cast<uint32_t>(p)));
        if (p == win.lo || l < ref.loss) ref = {static_cast<uint32_t>(p), l};
      }
      for (const kern::Selected& got : walks(ay, w, a, P, win, weighted)) {
        ASSERT_EQ(got.pattern, ref.pattern) << "block " << it << " weighted " << weighted;
        ASSERT_EQ(std::memcmp(&got.loss, &ref.loss, 4), 0) << "block " << it;
      }
      lower += ref.pattern < P;
      ++blocks;
    }
  }
  EXPECT_GT(lower, 1000) << blocks;  // the descending walk decides many blocks
}

using Block16 = float[16];

TEST(CudaFast, PrunedWalkAndTableEqualThePlainScanOfTheEstimates) {
  // fast_scan (the pruned walk of both sweeps, no clamp above P; the weighted bound for
  // sweep-wmse), with and without the scale/reciprocal table.
  float tab[2 * kern::kPatterns];
  for (int i = 0; i < kern::kPatterns; ++i) kern::fill_fast_table(tab, i);
  check_walk_against_plain_scan(
      123, 40000, true, 0,
      [](const Block16& ay, const Block16& w, float, bool weighted) {
        return [&ay, &w, weighted](float sc) {
          return weighted ? kern::fast_candidate_loss<true, true>(ay, w, sc, 1.0f / sc)
                          : kern::fast_candidate_loss<false, true>(ay, w, sc, 1.0f / sc);
        };
      },
      [&tab](const Block16& ay, const Block16& w, float a, uint32_t P, PatternRange win,
             bool weighted) {
        std::vector<kern::Selected> got;
        for (const float* t : {static_cast<const float*>(nullptr), static_cast<const float*>(tab)})
          got.push_back(weighted ? kern::fast_scan<true>(ay, w, a, P, win, false, t)
                                 : kern::fast_scan<false>(ay, w, a, P, win, false, t));
        return got;
      });
}

// The selection check of a numerics over the random blocks of every shape above and the
// adversarial kinds of the other tests (subnormal bases, exact ties, FP8-valued, ...): sweep-mse
// unweighted, sweep-wmse weighted on 3 of 4 random blocks and on every adversarial one; prints
// and records how often the choice differs from the exact kernel's and the loss excess.
template <Numerics kNu>
void check_numerics_selection(const char* label) {
  const kern::Params prm = mse_params();
  const int8_t* proven = &prm.win_full[0][0];
  std::mt19937_64 rng(99);
  FastStats mse, wmse;
  for (int it = 0; it < 60000; ++it) {
    float ay[16], w[16];
    const int kind = it % kRandomBlockKinds;
    random_block(rng, kind, ay, w);
    const std::string what = "random kind " + std::to_string(kind) + " block " + std::to_string(it);
    check_fast_block<Method::kSweepMse, kNu>(ay, w, proven, false, mse, what);
    check_fast_block<Method::kSweepWmse, kNu>(ay, w, proven, it % 4 != 0, wmse, what);
    if (::testing::Test::HasFailure()) return;
  }
  uint64_t seed = 7;
  for (Kind kind : testing::all_kinds()) {
    const testing::TestTensor t = testing::make_tensor(kind, 200, 256, seed++, DType::kF32);
    for (int64_t r = 0; r < t.rows; ++r) {
      for (int64_t k = 0; k < 16; ++k) {
        float ay[16], w[16];
        for (int i = 0; i < 16; ++i) {
          ay[i] = std::fabs(kern::fmul(t.x[static_cast<size_t>(r * 256 + k * 16 + i)], t.gs));
          w[i] = t.imp[static_cast<size_t>(k * 16 + i)];
        }
        const std::string what = std::string(testing::kind_name(kind)) + " block [" +
                                 std::to_string(r) + ", " + std::to_string(k) + "]";
        check_fast_block<Method::kSweepMse, kNu>(ay, w, proven, false, mse, what);
        check_fast_block<Method::kSweepWmse, kNu>(ay, w, proven, true, wmse, what);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  for (const auto& [name, st] : {std::pair<const char*, const FastStats&>{"sweep-mse", mse},
                                 std::pair<const char*, const FastStats&>{"sweep-wmse", wmse}}) {
    std::printf(
        "%s %s: %lld blocks, pattern differs from the exact kernel on %lld, exact loss worse "
        "on %lld (max relative excess over the reference optimum %.3g, mean over those %.3g)\n",
        label, name, static_cast<long long>(st.blocks), static_cast<long long>(st.differs),
        static_cast<long long>(st.worse), st.max_excess, st.worse ? st.sum_excess / st.worse : 0.0);
    ::testing::Test::RecordProperty(std::string(name) + "_" + label + "_differs",
                                    std::to_string(st.differs));
    ::testing::Test::RecordProperty(std::string(name) + "_" + label + "_max_excess",
                                    std::to_string(st.max_excess));
    EXPECT_GT(st.blocks, 80000) << name;
  }
}

TEST(CudaFast, ChosenLossWithinOneMillionthOfExhaustiveOptimum) {
  check_numerics_selection<Numerics::kFast>("fast");
}

// ---------------------------------------------------------------- half2 numerics

// An independent fp16 reference: every finite fp16 value, sorted; an exact value (long double
// or __float128) rounds to its nearest neighbour in this list, ties to the even bit pattern.
struct F16Table {
  std::vector<std::pair<double, uint16_t>> v;  // non-negative finite values
  F16Table() {
    for (uint32_t b = 0; b < 0x7C00u; ++b) v.push_back({kern::h_val(b), static_cast<uint16_t>(b)});
  }
  uint16_t round(__float128 x) const {
    const bool neg = x < 0 || (x == 0 && 1 / x < 0);  // -0 keeps its sign
    const __float128 m = neg ? -x : x;
    const uint16_t sign = neg ? 0x8000u : 0u;
    if (m >= static_cast<__float128>(65520.0)) return sign | 0x7C00u;  // RNE overflow
    auto it = std::lower_bound(v.begin(), v.end(), m, [](const auto& e, __float128 y) {
      return static_cast<__float128>(e.first) < y;
    });
    if (it == v.end()) return sign | 0x7BFFu;
    if (static_cast<__float128>(it->first) == m) return sign | it->second;
    const auto lo = it - 1;
    const __float128 dl = m - lo->first, dh = static_cast<__float128>(it->first) - m;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | it->second;
    return sign | ((lo->second & 1u) ? it->second : lo->second);
  }
};

TEST(CudaHalf2, SoftwareFp16IsIeeeBinary16) {
  // h2_mul, h2_fma, h2_min/max and h2_from_f32 (the host side of the f16x2 PTX operations)
  // against exact arithmetic in __float128 rounded by the table above, on random finite
  // operands (all bit patterns, operands of close exponents, and fma operands built to land on
  // or next to a rounding midpoint), both halves.
  const F16Table T;
  std::mt19937_64 rng(77);
  auto finite = [&] {
    uint32_t b;
    do b = static_cast<uint32_t>(rng() & 0xFFFFu);
    while ((b & 0x7C00u) == 0x7C00u);
    return b;
  };
  auto near = [&](int e0) {  // a value with exponent in [e0 - 2, e0 + 2]
    const int e = std::clamp(e0 + static_cast<int>(rng() % 5) - 2, 1, 30);
    return static_cast<uint32_t>((rng() & 0x8000u) | (e << 10) | (rng() & 0x3FFu));
  };
  int64_t ties = 0;
  for (int it = 0; it < 400000; ++it) {
    uint32_t a, b, c;
    if (it % 3 == 0) {
      a = finite(), b = finite(), c = finite();
    } else if (it % 3 == 1) {
      const int e0 = 8 + static_cast<int>(rng() % 14);
      a = near(e0), b = near(15), c = near(e0);
    } else {  // c = -(a b) rounded to 12 bits +- a few ulps of the 12-bit grid: sums near ties
      a = near(10 + static_cast<int>(rng() % 10)), b = near(15);
      const __float128 p = static_cast<__float128>(kern::h_val(a)) * kern::h_val(b);
      const uint16_t r = T.round(p);
      c = (r ^ 0x8000u) & 0xFFFFu;
      if ((c & 0x7C00u) == 0x7C00u) c = finite();
    }
    const __float128 A = kern::h_val(a), B = kern::h_val(b), C = kern::h_val(c);
    const uint32_t a2 = a | (b << 16), b2 = b | (c << 16), c2 = c | (a << 16);
    const uint32_t m2 = kern::h2_mul(a2, b2), f2 = kern::h2_fma(a2, b2, c2);
    ASSERT_EQ(m2 & 0xFFFFu, T.round(A * B)) << std::hex << a << " * " << b;
    ASSERT_EQ(m2 >> 16, T.round(B * C)) << std::hex << b << " * " << c;
    ASSERT_EQ(f2 & 0xFFFFu, T.round(A * B + C)) << std::hex << a << " * " << b << " + " << c;
    ASSERT_EQ(f2 >> 16, T.round(B * C + A)) << std::hex << b << " * " << c << " + " << a;
    const double sum = static_cast<double>(kern::h_val(T.round(A * B + C)));
    ties += std::fabs(static_cast<double>(A * B + C) - sum) > 0 && it % 3 == 2;
    const uint32_t mn = kern::h2_min(a2, b2), mx = kern::h2_max(a2, b2);
    ASSERT_EQ(kern::h_val(mn & 0xFFFFu), std::min(kern::h_val(a), kern::h_val(b)));
    ASSERT_EQ(kern::h_val(mx >> 16), std::max(kern::h_val(b), kern::h_val(c)));
    const float x = std::ldexp(static_cast<float>(rng() >> 40), static_cast<int>(rng() % 60) - 50);
    ASSERT_EQ(kern::h2_from_f32(x, -x) & 0xFFFFu, T.round(static_cast<__float128>(x))) << x;
    ASSERT_EQ(kern::h2_from_f32(x, -x) >> 16, T.round(-static_cast<__float128>(x))) << x;
  }
  EXPECT_GT(ties, 1000);  // the built sums were inexact, i.e. the rounding was exercised
}

TEST(CudaHalf2, E2m1RoundingByMagicAddIsTheContractRounding) {
  // Every non-negative fp16 value r below 7 (exhaustive): the four fp16x2 operations of
  // half2_candidate_loss (max with 1, exponent mask, two FMAs around M 2^9) give RNE_E2M1(r)
  // (fp4_index, saturating at 6 for r in [6, 7)); checked in both halves.
  const float grid[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  int64_t n = 0;
  for (uint32_t b = 0; b < 0x7C00u; ++b) {
    const float r = kern::h_to_f32(b);
    if (r >= 7.0f) break;
    const uint32_t r2 = b | (b << 16);
    const uint32_t M = kern::h2_max(r2, kern::kH2(1.0f)) & 0x7C007C00u;
    const uint32_t t = kern::h2_fma(M, kern::kH2(512.0f), r2);
    const uint32_t q = kern::h2_fma(M, kern::kH2(-512.0f), t);
    ASSERT_EQ(kern::h_to_f32(q & 0xFFFFu), grid[fp4_index(r)]) << "r = " << r;
    ASSERT_EQ(q >> 16, q & 0xFFFFu);
    ++n;
  }
  EXPECT_GT(n, 17000);
}

TEST(CudaHalf2, WalkEqualsThePlainScanOfTheEstimates) {
  // half2_scan (the pruned walk of both sweeps, stopped by half2_amax_term, weighted for
  // sweep-wmse); bases below 16 are fast_scan's blocks (tested above).
  float tab[2 * kern::kPatterns];
  for (int i = 0; i < kern::kPatterns; ++i) kern::fill_fast_table(tab, i);
  check_walk_against_plain_scan(
      321, 30000, false, 16,
      [](const Block16& ay, const Block16& w, float a, bool weighted) {
        const kern::Half2Block hb =
            weighted ? kern::half2_block<true>(ay, w, a) : kern::half2_block<false>(ay, w, a);
        return [hb, weighted](float sc) {
          const kern::Half2Cand h = kern::half2_cand(hb, sc, 1.0f / sc);
          return weighted ? kern::half2_candidate_loss<true, true>(hb, h.nsh2, h.ih2)
                          : kern::half2_candidate_loss<false, true>(hb, h.nsh2, h.ih2);
        };
      },
      [&tab](const Block16& ay, const Block16& w, float a, uint32_t P, PatternRange win,
             bool weighted) {
        return std::vector<kern::Selected>{
            weighted ? kern::half2_scan<true>(ay, w, a, P, win, false, tab)
                     : kern::half2_scan<false>(ay, w, a, P, win, false, tab)};
      });
}

TEST(CudaHalf2, ChosenLossWithinToleranceOfTheOptimum) {
  // As CudaFast.ChosenLoss...: the half2 choice's exact contract loss against the optimum
  // (exhaustive for sweep-mse, the window's for sweep-wmse), within kern::half2_excess_bound.
  check_numerics_selection<Numerics::kHalf2>("half2");
}

TEST(CudaFast, EmulatedLaunchKeepsExactCodesAndLossOfTheChosenScale) {
  // The whole fast and half2 launch (CPU emulation): for the pattern it chose per block, the codes,
  // the dequant output and block_loss are the exact ones (block_codes, candidate_loss_chain,
  // dequant_value), partial last blocks and bf16 input included.
  uint64_t seed = 31;
  for (Method m : {Method::kSweepMse, Method::kSweepWmse}) {
    for (const auto& [cols, nu] :
         {std::pair{int64_t{256}, Numerics::kFast}, std::pair{int64_t{37}, Numerics::kFast},
          std::pair{int64_t{256}, Numerics::kHalf2}, std::pair{int64_t{37}, Numerics::kHalf2}}) {
      const testing::TestTensor t = testing::make_tensor(Kind::kOutlier, 90, cols, seed++);
      const bool weighted = m == Method::kSweepWmse;
      const float* imp = weighted ? t.imp.data() : nullptr;
      std::vector<uint16_t> h;
      const void* xp = testing::input_as(t, DType::kBF16, h);
      Outputs o;
      const int64_t nb = blocks_per_row(cols), pc = cuda::packed_cols(cols);
      o.codes.assign(static_cast<size_t>(t.rows * pc), 0xEE);
      o.scales.assign(static_cast<size_t>(t.rows * nb), 0xEE);
      o.loss.assign(static_cast<size_t>(t.rows * nb), -1.0f);
      o.deq.assign(static_cast<size_t>(t.rows * cols), -1.0f);
      QuantizeArgs a = input_args(xp, DType::kBF16, t.rows, cols, m, t.gs, imp, nu);
      a.codes = o.codes.data();
      a.scales = o.scales.data();
      a.block_loss = o.loss.data();
      a.dequant = o.deq.data();
      detail::emulate(a);
      for (int64_t r = 0; r < t.rows; ++r) {
        for (int64_t k = 0; k < nb; ++k) {
          const int n = static_cast<int>(std::min<int64_t>(16, cols - k * 16));
          float y[16] = {}, ay[16] = {}, w[16] = {};
          for (int i = 0; i < n; ++i) {
            const float x = format::bf16_to_f32(h[static_cast<size_t>(r * cols + k * 16 + i)]);
            y[i] = kern::fmul(x, t.gs);
            ay[i] = std::fabs(y[i]);
            if (weighted) w[i] = imp[k * 16 + i];
          }
          const uint32_t p = o.scales[static_cast<size_t>(r * nb + k)];
          const float s = kern::e4m3_value(p);
          const float want_loss = weighted ? kern::candidate_loss_chain<true>(ay, w, s)
                                           : kern::candidate_loss_chain<false>(ay, w, s);
          ASSERT_EQ(o.loss[static_cast<size_t>(r * nb + k)], want_loss) << r << ", " << k;
          const uint64_t packed = kern::block_codes(y, ay, s, n);
          for (int i = 0; i < n; i += 2)
            ASSERT_EQ(o.codes[static_cast<size_t>(r * pc + k * 8 + i / 2)],
                      static_cast<uint8_t>(packed >> (4 * i)))
                << r << ", " << k << ", " << i;
          for (int i = 0; i < n; ++i) {
            const float mag =
                kern::fmul(kern::fp4_mag(static_cast<uint32_t>(packed >> (4 * i)) & 7u), s);
            ASSERT_EQ(o.deq[static_cast<size_t>(r * cols + k * 16 + i)],
                      kern::dequant_value(y[i], mag, t.gs));
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- argument checks

QuantizeArgs good_args(const float* x, uint8_t* codes) {
  QuantizeArgs a = input_args(x, DType::kF32, 4, 32, Method::kSweepMse, 1.0f);
  a.codes = codes;
  return a;
}

void expect_invalid(const QuantizeArgs& a, const std::string& needle) {
  try {
    validate(a);
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CudaValidate, AcceptsGoodArgumentsAndEveryDtypeAndMethod) {
  float x[4 * 32] = {};
  uint8_t codes[4 * 16];
  QuantizeArgs a = good_args(x, codes);
  EXPECT_NO_THROW(validate(a));
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Method m : {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
                     Method::kExhaustiveMse, Method::kExhaustiveWmse}) {
      a.dtype = t;
      a.method = m;
      a.numerics = Numerics::kExact;
      EXPECT_NO_THROW(validate(a));
      EXPECT_TRUE(method_supported(m));
      EXPECT_TRUE(numerics_supported(m, Numerics::kExact));
      const bool sweep = m == Method::kSweepMse || m == Method::kSweepWmse;
      EXPECT_EQ(numerics_supported(m, Numerics::kFast), sweep);
      a.numerics = Numerics::kFast;
      if (sweep) {
        EXPECT_NO_THROW(validate(a));
      }
      a.numerics = Numerics::kExact;
    }
  }
  a.cols = 17;  // partial last block: supported (SPEC)
  EXPECT_NO_THROW(validate(a));
}

TEST(CudaValidate, RejectsBadArgumentsWithClearMessages) {
  float x[4] = {};
  uint8_t codes[4];
  QuantizeArgs a = good_args(x, codes);
  a.rows = 0;
  expect_invalid(a, "empty or negative shape");
  a = good_args(x, codes);
  a.cols = -3;
  expect_invalid(a, "empty or negative shape");
  a = good_args(x, codes);
  a.rows = int64_t{1} << 40;
  a.cols = int64_t{1} << 20;
  expect_invalid(a, "too large");
  a = good_args(nullptr, codes);
  expect_invalid(a, "x is null");
  a = good_args(x, codes);
  a.dtype = static_cast<DType>(7);
  expect_invalid(a, "unsupported input dtype");
  for (Method m : {Method::kOptFp32, Method::kSweep, Method::kOptFp8Wmse}) {
    a = good_args(x, codes);
    a.method = m;
    expect_invalid(a, "is not implemented on CUDA");
    EXPECT_FALSE(method_supported(m));
  }
  for (float gs : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    a = good_args(x, codes);
    a.global_scale = gs;
    expect_invalid(a, "global scale");
  }
  // Fast numerics: the sweeps only, one message naming both.
  for (Method m :
       {Method::kAbsMax, Method::kFourOverSix, Method::kExhaustiveMse, Method::kExhaustiveWmse}) {
    a = good_args(x, codes);
    a.method = m;
    a.numerics = Numerics::kFast;
    expect_invalid(a, "numerics 'fast' is not implemented for method '" +
                          std::string(kMethodNames.name(m)) + "'");
  }
  a = good_args(x, codes);
  a.numerics = static_cast<Numerics>(5);
  expect_invalid(a, "unknown numerics 5");
  EXPECT_EQ(kNumericsNames.parse("fast"), Numerics::kFast);
  EXPECT_EQ(kNumericsNames.name(Numerics::kExact), "exact");
  a = good_args(x, nullptr);
  expect_invalid(a, "no output requested");
  a = good_args(x, codes);
  a.dequant = x;
  a.dequant_dtype = static_cast<DType>(9);
  expect_invalid(a, "unsupported dequant dtype");
}

// ---------------------------------------------------------------- kernel code vs reference

Outputs run_emulated(const void* x, DType t, int64_t rows, int64_t cols, Method m, float gs,
                     const float* imp) {
  Outputs o;
  o.codes.assign(static_cast<size_t>(rows * cuda::packed_cols(cols)), 0xEE);
  o.scales.assign(static_cast<size_t>(rows * blocks_per_row(cols)), 0xEE);
  o.swz.assign(static_cast<size_t>(swizzled_bytes(rows, cols)), 0xEE);
  o.loss.assign(static_cast<size_t>(rows * blocks_per_row(cols)), -1.0f);
  o.deq.assign(static_cast<size_t>(rows * cols), -1.0f);
  QuantizeArgs a = input_args(x, t, rows, cols, m, gs, imp);
  a.codes = o.codes.data();
  a.scales = o.scales.data();
  a.scales_swizzled = o.swz.data();
  a.block_loss = o.loss.data();
  a.dequant = o.deq.data();
  a.dequant_dtype = DType::kF32;
  detail::emulate(a);
  return o;
}

// Compares the emulated kernels with quantize()/select_block_scale()/dequantize() on one
// tensor; returns the number of blocks checked.
int64_t check_tensor(const testing::TestTensor& t, DType dtype, Method m, bool weighted,
                     const std::string& what) {
  const float* imp = weighted ? t.imp.data() : nullptr;
  std::vector<uint16_t> h;
  const void* xp = testing::input_as(t, dtype, h);
  const Outputs o = run_emulated(xp, dtype, t.rows, t.cols, m, t.gs, imp);

  const QuantizedTensor ref = testing::reference_quantize(t, xp, dtype, m, imp, what);
  EXPECT_EQ(ref.global_scale, t.gs);
  const int64_t nb = ref.blocks_per_row();
  // Scales and codes, reported at the first differing block.
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t k = 0; k < nb; ++k) {
      const size_t b = static_cast<size_t>(r * nb + k);
      if (o.scales[b] != ref.scales[b]) {
        ADD_FAILURE() << what << ": scale of block [" << r << ", " << k << "] is "
                      << int(o.scales[b]) << ", reference " << int(ref.scales[b]);
        return 0;
      }
    }
  }
  EXPECT_EQ(o.codes, ref.codes) << what;
  EXPECT_EQ(o.swz, swizzle_scales(ref.scales.data(), t.rows, nb)) << what;
  // Loss of every block against select_block_scale on the same y.
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t k = 0; k < nb; ++k) {
      const BlockScale bs = testing::reference_block(t, imp, r, k, m);
      const float l = o.loss[static_cast<size_t>(r * nb + k)];
      if (std::memcmp(&l, &bs.loss, sizeof l) != 0 || bs.pattern != o.scales[r * nb + k]) {
        ADD_FAILURE() << what << ": block [" << r << ", " << k << "] loss " << l << " pattern "
                      << int(o.scales[r * nb + k]) << ", reference " << bs.loss << " pattern "
                      << int(bs.pattern);
        return 0;
      }
    }
  }
  // Fused quantize-dequantize == dequantize(quantize()).
  const std::vector<float> deq = dequantize(ref);
  EXPECT_EQ(std::memcmp(deq.data(), o.deq.data(), deq.size() * sizeof(float)), 0) << what;
  return t.rows * nb;
}

class CudaEmulation : public ::testing::TestWithParam<Method> {};

TEST_P(CudaEmulation, MatchesReferenceOnEveryKind) {
  const Method m = GetParam();
  int64_t blocks = 0;
  uint64_t seed = 1;
  for (Kind kind : testing::all_kinds()) {
    for (int64_t cols : {int64_t{256}, int64_t{250}, int64_t{200}, int64_t{37}}) {
      const int64_t rows = kind == Kind::kRandom ? 600 : 130;
      const float cmax = m == Method::kAbsMax ? 448.0f : 256.0f;
      const testing::TestTensor t =
          testing::make_tensor(kind, rows, cols, seed++, DType::kF32, cmax);
      const std::string what = std::string(kMethodNames.name(m)) + "/" + testing::kind_name(kind) +
                               "/cols=" + std::to_string(cols);
      blocks += check_tensor(t, DType::kF32, m, false, what);
      if (method_is_weighted(m)) blocks += check_tensor(t, DType::kF32, m, true, what + "/w");
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(blocks, 20000);
}

TEST_P(CudaEmulation, SixteenBitInputs) {
  const Method m = GetParam();
  uint64_t seed = 100;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (Kind kind : {Kind::kRandom, Kind::kOutlier, Kind::kSubnormalBase}) {
      const testing::TestTensor t = testing::make_tensor(kind, 64, 272, seed++, dt);
      const std::string what = std::string(kMethodNames.name(m)) + "/" +
                               std::string(kDTypeNames.name(dt)) + "/" + testing::kind_name(kind);
      check_tensor(t, dt, m, method_is_weighted(m), what);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Methods, CudaEmulation,
                         ::testing::Values(Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse,
                                           Method::kSweepWmse, Method::kExhaustiveMse,
                                           Method::kExhaustiveWmse),
                         [](const auto& info) { return testing::method_test_name(info.param); });

TEST(CudaEmulation, ReportsTheFirstNonFiniteElement) {
  std::vector<float> x(8 * 40, 1.0f);
  x[5 * 40 + 33] = std::numeric_limits<float>::infinity();
  x[6 * 40 + 2] = std::nanf("");
  std::vector<uint8_t> codes(8 * 20);
  int64_t bad = 0;
  QuantizeArgs a;
  a.x = x.data();
  a.dtype = DType::kF32;
  a.rows = 8;
  a.cols = 40;
  a.codes = codes.data();
  a.first_nonfinite = &bad;
  detail::emulate(a);
  EXPECT_EQ(bad, 5 * 40 + 33);
  x[5 * 40 + 33] = 1.0f;
  x[6 * 40 + 2] = 1.0f;
  x[0] = 4.0f;
  a.global_scale = 3e38f;  // finite input, x * gs overflows at [0, 0] only
  detail::emulate(a);
  EXPECT_EQ(bad, 0);
  a.global_scale = 1.0f;
  detail::emulate(a);
  EXPECT_EQ(bad, kNoBadIndex);
  // The CPU path's limit |x * gs| <= 2^48: exactly 2^48 passes, 2^49 is reported.
  x[0] = 1.0f;
  x[2 * 40 + 5] = 256.0f;  // * 2^40 = 2^48
  a.global_scale = 0x1p40f;
  detail::emulate(a);
  EXPECT_EQ(bad, kNoBadIndex);
  x[3 * 40 + 7] = -512.0f;  // 2^49
  detail::emulate(a);
  EXPECT_EQ(bad, 3 * 40 + 7);
}

TEST(CudaFormat, BlockCodesMatchFp4Code) {
  // block_codes against fp4_code for every scale pattern 1..126 on
  // the 7 exact thresholds, their float neighbours, the grid points, zero/-0, huge (up to
  // 2^48) and tiny values, both signs, in both halves of a pair, and partial lengths n.
  std::mt19937_64 rng(3);
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                        0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 6.0f};
  int64_t checked = 0;
  for (uint32_t p = 1; p <= 126; ++p) {
    const float s = kern::e4m3_value(p);
    std::vector<float> vals = {0.0f, -0.0f, 0x1p48f, -0x1p48f, 1e-40f, 7.0f * s, 1e30f};
    for (float m : mids) {
      const float t = s * m;
      for (float v : {t, std::nextafter(t, 0.0f), std::nextafter(t, 1e30f)}) {
        vals.push_back(v);
        vals.push_back(-v);
      }
    }
    for (size_t start = 0; start < vals.size(); start += 16) {
      for (int rep = 0; rep < 2; ++rep) {
        float y[16] = {}, ay[16] = {};
        for (int i = 0; i < 16; ++i) {
          const size_t k = rep == 0 ? start + i : rng() % vals.size();
          y[i] = k < vals.size() ? vals[k] : 0.0f;
          ay[i] = std::fabs(y[i]);
        }
        for (int n : {16, 15, 1}) {
          const uint64_t got = kern::block_codes(y, ay, s, n);
          for (int i = 0; i < 16; ++i) {
            const uint32_t want = i < n ? fp4_code(y[i], s) : 0u;
            ASSERT_EQ((got >> (4 * i)) & 0xFu, want)
                << "pattern " << p << " y " << y[i] << " element " << i << " n " << n;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 60000);
}

TEST(CudaEmulation, SwizzledPaddingIsZero) {
  const testing::TestTensor t = testing::make_tensor(Kind::kRandom, 3, 40, 5);
  const Outputs o = run_emulated(t.x.data(), DType::kF32, 3, 40, Method::kAbsMax, 1.0f, nullptr);
  int64_t nonzero_pad = 0, real = 0;
  std::set<int64_t> used;
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t k = 0; k < 3; ++k) used.insert(cuda::swizzled_offset(m, k, 3));
  for (int64_t i = 0; i < static_cast<int64_t>(o.swz.size()); ++i) {
    if (used.count(i))
      ++real;
    else if (o.swz[static_cast<size_t>(i)] != 0)
      ++nonzero_pad;
  }
  EXPECT_EQ(real, 9);
  EXPECT_EQ(nonzero_pad, 0);
  EXPECT_EQ(o.swz.size(), size_t{128 * 4});
}

}  // namespace
}  // namespace scalesweep::cuda

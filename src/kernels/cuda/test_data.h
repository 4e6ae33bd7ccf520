// Test tensors for the CUDA operator's tests (CPU emulation test and GPU test): random blocks
// whose magnitudes spread over many FP8 binades, and the adversarial kinds of the core tests
// (subnormal bases, zero blocks, exact ties, outliers, FP8-valued data, constant blocks).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/quantize.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::cuda::testing {

enum class Kind { kRandom, kSubnormalBase, kZero, kTies, kOutlier, kFp8Valued, kConstant };
// Every kind, in order, with its name: the one list kind_name and all_kinds read.
inline constexpr std::pair<Kind, const char*> kKinds[] = {
    {Kind::kRandom, "random"},    {Kind::kSubnormalBase, "subnormal-base"},
    {Kind::kZero, "zero"},        {Kind::kTies, "ties"},
    {Kind::kOutlier, "outlier"},  {Kind::kFp8Valued, "fp8-valued"},
    {Kind::kConstant, "constant"}};
inline const char* kind_name(Kind k) {
  for (const auto& [kind, name] : kKinds)
    if (kind == k) return name;
  return "?";
}
inline std::vector<Kind> all_kinds() {
  std::vector<Kind> out;
  for (const auto& [kind, name] : kKinds) out.push_back(kind);
  return out;
}

struct TestTensor {
  int64_t rows = 0, cols = 0;
  std::vector<float> x;    // [rows, cols], values representable in `dtype`
  std::vector<float> imp;  // [cols], finite, >= 0 (some zeros)
  float gs = 1.0f;         // encode-direction global scale to use
};

// Rounds a float to the values of dtype (so the float tensor and the 16-bit tensor agree).
inline float to_dtype_value(float v, DType t) {
  if (t == DType::kBF16) return format::bf16_to_f32(format::f32_to_bf16(v));
  if (t == DType::kF16) return format::f16_to_f32(format::f32_to_f16(v));
  return v;
}
// The 16-bit storage of a float tensor already rounded by to_dtype_value.
inline std::vector<uint16_t> to_16bit(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    h[i] = t == DType::kBF16 ? format::f32_to_bf16(x[i]) : format::f32_to_f16(x[i]);
  return h;
}

inline TestTensor make_tensor(Kind kind, int64_t rows, int64_t cols, uint64_t seed,
                              DType dtype = DType::kF32, float c_max = 256.0f) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(kind) + 1);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::normal_distribution<double> N(0.0, 1.0);
  TestTensor t;
  t.rows = rows;
  t.cols = cols;
  t.x.assign(static_cast<size_t>(rows * cols), 0.0f);
  t.imp.resize(static_cast<size_t>(cols));
  for (auto& w : t.imp) w = U(rng) < 0.05 ? 0.0f : static_cast<float>(std::exp2(U(rng) * 20 - 10));
  auto fp8 = [&](uint32_t p) { return format::E4M3::decode_f(p); };
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  bool gs_from_amax = true;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, cols - c0));
      float* b = &t.x[static_cast<size_t>(r * cols + c0)];
      switch (kind) {
        case Kind::kRandom: {
          // Magnitudes over 2^-24 .. 2^6 so that (with gs = 1) bases range over every FP8
          // binade, subnormal ones and saturation included; heavy and light tails.
          const double scale = std::exp2(U(rng) * 30 - 24);
          const int dist = static_cast<int>(U(rng) * 3);
          for (int i = 0; i < n; ++i) {
            double v = N(rng);
            if (dist == 1) v = (U(rng) < 0.5 ? -1 : 1) * -std::log(1 - U(rng));
            if (dist == 2) v = N(rng) / std::sqrt(std::max(1e-6, -2 * std::log(1 - U(rng)) / 3));
            b[i] = static_cast<float>(v * scale);
          }
          gs_from_amax = false;
          break;
        }
        case Kind::kSubnormalBase: {
          // One huge block per row sets the global scale; the others are tiny so that a/6
          // falls into (or below) the FP8 subnormal range.
          const bool big = c0 == 0;
          const double scale = big ? 100.0 : std::exp2(-U(rng) * 14 - 4);
          for (int i = 0; i < n; ++i) b[i] = static_cast<float>(N(rng) * scale);
          break;
        }
        case Kind::kZero: {
          const double u = U(rng);
          for (int i = 0; i < n; ++i) b[i] = U(rng) < 0.5 ? -0.0f : 0.0f;
          if (u < 0.3)
            b[static_cast<int>(U(rng) * n)] = static_cast<float>(N(rng) * 1e-30);
          else if (u < 0.5)
            b[static_cast<int>(U(rng) * n)] = static_cast<float>(N(rng) * 1e-6);
          gs_from_amax = false;
          break;
        }
        case Kind::kTies: {
          // y = s * midpoint or s * grid value for a random FP8 s: FP4 rounding ties, and
          // blocks where scales s and 2s reconstruct identically (loss ties).
          const float s = fp8(1 + static_cast<uint32_t>(U(rng) * 120));
          for (int i = 0; i < n; ++i) {
            const float v = U(rng) < 0.6 ? s * mids[static_cast<int>(U(rng) * 7)]
                                         : s * grid[static_cast<int>(U(rng) * 8)];
            b[i] = U(rng) < 0.5 ? -v : v;
          }
          gs_from_amax = false;
          break;
        }
        case Kind::kOutlier: {
          for (int i = 0; i < n; ++i) b[i] = static_cast<float>(N(rng));
          b[static_cast<int>(U(rng) * n)] *= static_cast<float>(50 + 1000 * U(rng));
          break;
        }
        case Kind::kFp8Valued: {
          for (int i = 0; i < n; ++i) {
            const float v = fp8(static_cast<uint32_t>(U(rng) * 127));
            b[i] = U(rng) < 0.5 ? -v : v;
          }
          gs_from_amax = false;
          break;
        }
        case Kind::kConstant: {
          const float v = static_cast<float>(std::exp2(U(rng) * 24 - 16) * (1 + U(rng)));
          for (int i = 0; i < n; ++i) b[i] = (U(rng) < 0.2 ? -v : v);
          gs_from_amax = false;
          break;
        }
      }
      for (int i = 0; i < n; ++i) b[i] = to_dtype_value(b[i], dtype);
    }
  }
  float amax = 0;
  for (float v : t.x) amax = std::max(amax, std::fabs(v));
  t.gs = gs_from_amax ? global_scale_for_amax(amax, c_max) : 1.0f;
  return t;
}

// The tensor as input of `dtype`: t.x itself for F32, else its 16-bit storage (kept in `h16`).
inline const void* input_as(const TestTensor& t, DType dtype, std::vector<uint16_t>& h16) {
  if (dtype == DType::kF32) return t.x.data();
  h16 = to_16bit(t.x, dtype);
  return h16.data();
}

// What the kernels are checked against: the scalar CPU reference (the contract) with method m,
// global scale gs, and per-column importance `imp` (nullptr: none).
inline QuantConfig reference_config(Method m, float gs) {
  QuantConfig cfg;
  cfg.selector.method = m;
  cfg.global_scale = gs;
  cfg.reference_only = true;
  return cfg;
}
inline Importance column_importance(const float* imp) {
  return {imp ? ImportanceKind::kPerColumn : ImportanceKind::kNone, imp};
}

// The reference quantization of t's input `x` (input_as in `dtype`) with method m, t's global
// scale and per-column importance `imp` (nullptr: none); `what` names the tensor in errors.
inline QuantizedTensor reference_quantize(const TestTensor& t, const void* x, DType dtype, Method m,
                                          const float* imp, const std::string& what) {
  return quantize(x, dtype, t.rows, t.cols, column_importance(imp), reference_config(m, t.gs),
                  what);
}

// GoogleTest parameter name of a method (an identifier): "sweep_mse", "four_over_six".
inline std::string method_test_name(Method m) {
  std::string n(kMethodNames.name(m));
  for (char& c : n)
    if (c == '-') c = '_';
  return n == "4over6" ? std::string("four_over_six") : n;
}

// The scalar reference's selection for block k (16 columns) of row r: y = x * gs, importance
// `imp` (per column, nullptr: none).
inline BlockScale reference_block(const TestTensor& t, const float* imp, int64_t r, int64_t k,
                                  Method m) {
  SelectorConfig sc;
  sc.method = m;
  float y[16];
  const int n = static_cast<int>(std::min<int64_t>(16, t.cols - k * 16));
  for (int i = 0; i < n; ++i) y[i] = t.x[static_cast<size_t>(r * t.cols + k * 16 + i)] * t.gs;
  return select_block_scale(y, imp ? imp + k * 16 : nullptr, n, sc);
}

}  // namespace scalesweep::cuda::testing

// The fused kernels over stored weights (src/model/quant_kernels.h) against the scalar
// dequantizers and the fp32 gemv, bit for bit: every fused ggml type on random block bytes
// (every code and scale pattern the type can hold, fp16 scales from subnormal to large), with
// and without a per-tensor scale and llama's q/k row permutation; the ggml NVFP4 type on every
// scale byte and code; compressed-tensors NVFP4 under several global scales.
#include "model/quant_kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/format/ggml.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::model {
namespace {

using format::GgmlType;

const GgmlType kFused[] = {GgmlType::kNVFP4, GgmlType::kMXFP4, GgmlType::kQ8_0, GgmlType::kQ4_0,
                           GgmlType::kQ4_1,  GgmlType::kQ4_K,  GgmlType::kQ6_K};

using testing::expect_bits_equal;

// A finite fp16 with a random exponent in [1, 20] (2^-14 .. 2^5) or, one time in eight, a
// subnormal; random sign and mantissa.
uint16_t random_half(std::mt19937_64& rng) {
  const uint16_t man = static_cast<uint16_t>(rng() & 0x3FF), sign = (rng() & 1) ? 0x8000 : 0;
  const uint16_t exp = (rng() % 8 == 0) ? 0 : static_cast<uint16_t>(1 + rng() % 20);
  return static_cast<uint16_t>(sign | (exp << 10) | man);
}
void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Random bytes for `blocks` blocks of `type`, its fp16 fields replaced by random finite halves
// and its MXFP4 exponents kept below overflow.
std::vector<uint8_t> random_blocks(GgmlType type, int64_t blocks, std::mt19937_64& rng) {
  const format::GgmlTypeTraits tr = *format::ggml_type_traits(static_cast<uint32_t>(type));
  std::vector<uint8_t> v(static_cast<size_t>(blocks * tr.block_bytes));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = v.data() + i * tr.block_bytes;
    switch (type) {
      case GgmlType::kQ8_0:
      case GgmlType::kQ4_0:
        put16(b, random_half(rng));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ4_K:
        put16(b, random_half(rng));
        put16(b + 2, random_half(rng));
        break;
      case GgmlType::kQ6_K:
        put16(b + 208, random_half(rng));
        break;
      case GgmlType::kMXFP4:
        b[0] = static_cast<uint8_t>(rng() % 240);
        break;
      default:
        break;
    }
  }
  return v;
}

Tensor ggml_tensor(GgmlType type, int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
  Tensor t;
  t.shape = {rows, cols};
  t.dtype = WeightDType::kGgml;
  t.ggml_type = static_cast<uint32_t>(type);
  t.raw = bytes.data();
  return t;
}

// dequantize_rows (the fused decoder where available) equals the scalar reference, and
// gemv_rows on the stored blocks equals gemv_rows on their fp32 widening, over row ranges that
// exercise the four-row groups and the tail.
void check(const Tensor& t, std::mt19937_64& rng, const std::string& what) {
  const int64_t rows = t.rows(), cols = t.cols();
  std::vector<float> ref(static_cast<size_t>(rows * cols)), fast(ref.size(), -1.0f);
  dequantize_rows_reference(t, 0, rows, ref.data());
  dequantize_rows(t, 0, rows, fast.data());
  expect_bits_equal(ref, fast, what + " dequantize");
  if (rows > 2) {
    std::vector<float> part(static_cast<size_t>(cols));
    dequantize_rows(t, 1, 2, part.data());
    expect_bits_equal(std::vector<float>(ref.begin() + cols, ref.begin() + 2 * cols), part,
                      what + " row 1");
  }
  Tensor wide;
  wide.shape = t.shape;
  wide.data = ref.data();
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = nd(rng);
  for (auto [o0, o1] : {std::pair<int64_t, int64_t>{0, rows}, {rows / 3, rows}, {1, rows}}) {
    if (o0 >= o1) continue;
    std::vector<float> a(static_cast<size_t>(o1 - o0)), b(a.size(), -1.0f);
    gemv_rows(wide, x.data(), o0, o1, a.data());
    gemv_rows(t, x.data(), o0, o1, b.data());
    expect_bits_equal(a, b, what + " gemv rows " + std::to_string(o0) + ".." + std::to_string(o1));
  }
}

bool fused_here() {
  Tensor t = ggml_tensor(GgmlType::kQ8_0, 1, 32, std::vector<uint8_t>(34));
  return detail::quant_kernel_available(t);
}

TEST(QuantKernels, EveryFusedTypeOnRandomBlocks) {
  if (!fused_here()) GTEST_SKIP() << "no AVX-512 on this CPU: the fused kernels are not used";
  std::mt19937_64 rng(5);
  for (GgmlType type : kFused) {
    const auto tr = *format::ggml_type_traits(static_cast<uint32_t>(type));
    for (int64_t rows : {1, 3, 4, 5, 9, 16})
      for (int64_t nb : {1, 2, 3}) {
        const int64_t cols = nb * tr.block_elems;
        const std::vector<uint8_t> bytes = random_blocks(type, rows * nb, rng);
        Tensor t = ggml_tensor(type, rows, cols, bytes);
        ASSERT_TRUE(detail::quant_kernel_available(t)) << format::ggml_type_name(t.ggml_type);
        const std::string what = format::ggml_type_name(t.ggml_type) + " " + std::to_string(rows) +
                                 "x" + std::to_string(cols);
        check(t, rng, what);
        t.ggml_scale = 0.3f;  // llama.cpp's per-tensor .scale
        check(t, rng, what + " scaled");
      }
  }
}

// llama's q/k permutation (head_dim 8, 3 heads): row r of the tensor is stored row
// ggml_stored_row(r); the fused kernels read the same rows as the reference.
TEST(QuantKernels, PermutedRows) {
  std::mt19937_64 rng(9);
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kNVFP4, GgmlType::kQ5_K}) {
    const auto tr = *format::ggml_type_traits(static_cast<uint32_t>(type));
    const int64_t rows = 24, cols = tr.block_elems;
    const std::vector<uint8_t> bytes = random_blocks(type, rows, rng);
    Tensor plain = ggml_tensor(type, rows, cols, bytes);
    Tensor perm = plain;
    perm.ggml_permute_head_dim = 8;
    std::vector<float> a(static_cast<size_t>(rows * cols)), b(a.size());
    dequantize_rows_reference(plain, 0, rows, a.data());
    dequantize_rows(perm, 0, rows, b.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t s = detail::ggml_stored_row(perm, r);
      ASSERT_EQ(std::memcmp(&b[r * cols], &a[s * cols], 4 * cols), 0) << r;
    }
    EXPECT_EQ(detail::ggml_stored_row(perm, 1), 2);    // h 0, a 0, i 1 -> 2i + a
    EXPECT_EQ(detail::ggml_stored_row(perm, 4), 1);    // h 0, a 1, i 0
    EXPECT_EQ(detail::ggml_stored_row(perm, 13), 11);  // h 1, a 1, i 1 -> 8 + 2i + a
    check(perm, rng, format::ggml_type_name(perm.ggml_type) + " permuted");
  }
}

// Every NVFP4 scale byte (0x7F reads as 0, 0xFF as 480) with every code, in every sub-block.
TEST(QuantKernels, GgmlNvfp4EveryScaleAndCode) {
  std::vector<uint8_t> bytes;
  for (int s = 0; s < 256; ++s)
    for (int blk = 0; blk < 2; ++blk) {
      for (int j = 0; j < 4; ++j) bytes.push_back(static_cast<uint8_t>((s + 64 * j) & 0xFF));
      for (int i = 0; i < 32; ++i) bytes.push_back(static_cast<uint8_t>(17 * i + 16 * blk + s));
    }
  const Tensor t = ggml_tensor(GgmlType::kNVFP4, 256, 128, bytes);
  std::mt19937_64 rng(1);
  check(t, rng, "NVFP4 every scale");
}

// Compressed-tensors NVFP4 (cols a multiple of 16): the per-tensor table of fl(fl(fp4 * s) /
// gs) under global scales from tiny to huge, every scale byte and code, and two tensors of
// different gs in turn (the table is rebuilt).
TEST(QuantKernels, PackedNvfp4UnderGlobalScales) {
  const int64_t rows = 9, cols = 16 * 29;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols / 2)),
      scales(static_cast<size_t>(rows * cols / 16));
  std::mt19937_64 rng(4);
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(i % 127);
  for (float gs : {1.0f, 3.0e-7f, 2.5e4f, 448.0f * 6.0f, 1.0e30f}) {
    Tensor t;
    t.shape = {rows, cols};
    t.dtype = WeightDType::kNvfp4;
    t.raw = codes.data();
    t.nvfp4_scales = scales.data();
    t.nvfp4_global_scale = gs;
    EXPECT_EQ(detail::quant_kernel_available(t), fused_here());
    check(t, rng, "packed NVFP4 gs " + std::to_string(gs));
  }
}

TEST(QuantKernels, WhichTensorsTheyTake) {
  Tensor t = ggml_tensor(GgmlType::kQ5_K, 1, 256, std::vector<uint8_t>(176));
  EXPECT_FALSE(detail::quant_kernel_available(t));  // no fused Q5_K: the scalar path
  Tensor nv;
  nv.shape = {1, 24};  // not whole 16-element blocks
  nv.dtype = WeightDType::kNvfp4;
  EXPECT_FALSE(detail::quant_kernel_available(nv));
  Tensor f;
  f.shape = {1, 32};
  EXPECT_FALSE(detail::quant_kernel_available(f));  // fp32 has its own kernel
  EXPECT_EQ(detail::ggml_row_bytes(ggml_tensor(GgmlType::kQ6_K, 2, 512, {})), 420);
}

}  // namespace
}  // namespace scalesweep::model

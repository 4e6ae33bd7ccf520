// Packing (SPEC nibble order) and the vLLM 128x4 swizzled scale layout.
#include "scalesweep/quant/layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>

namespace scalesweep {
namespace {

TEST(Pack, NibbleOrderOddColumnsAndRoundTrip) {
  // Row 0: codes 1, 2, 3 -> bytes 0x21, 0x03 (element 2i low, 2i+1 high, odd tail padded 0).
  const uint8_t codes[6] = {1, 2, 3, 0xF, 0x8, 0x7};
  const std::vector<uint8_t> p = pack_fp4(codes, 2, 3);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], 0x21);
  EXPECT_EQ(p[1], 0x03);
  EXPECT_EQ(p[2], 0x8F);
  EXPECT_EQ(p[3], 0x07);
  EXPECT_EQ(packed_code(p.data(), 3, 1, 0), 0xF);
  EXPECT_EQ(packed_code(p.data(), 3, 1, 2), 0x7);
  EXPECT_EQ(unpack_fp4(p.data(), 2, 3), std::vector<uint8_t>(codes, codes + 6));
  std::mt19937_64 rng(1);
  for (int64_t cols : {1, 2, 15, 16, 33}) {
    std::vector<uint8_t> c(static_cast<size_t>(5 * cols));
    for (auto& v : c) v = static_cast<uint8_t>(rng() % 16);
    EXPECT_EQ(unpack_fp4(pack_fp4(c.data(), 5, cols).data(), 5, cols), c);
    EXPECT_EQ(packed_cols(cols), (cols + 1) / 2);
  }
  const uint8_t bad[2] = {3, 16};
  EXPECT_THROW(pack_fp4(bad, 1, 2), std::invalid_argument);
}

TEST(Swizzle, ExactFormulaOnHandComputedPositions) {
  // rows = 300, nblocks = 10 (K = 160 at block 16): nKT = 3, buffer [384, 12].
  const int64_t nb = 10;
  EXPECT_EQ((SwizzledShape{300, nb}.bytes()), 384 * 12);
  EXPECT_EQ(swizzled_offset(0, 0, nb), 0);
  EXPECT_EQ(swizzled_offset(1, 0, nb), 16);  // (m & 31) * 16
  EXPECT_EQ(swizzled_offset(31, 0, nb), 496);
  EXPECT_EQ(swizzled_offset(32, 0, nb), 4);  // ((m >> 5) & 3) * 4
  EXPECT_EQ(swizzled_offset(64, 0, nb), 8);
  EXPECT_EQ(swizzled_offset(96, 0, nb), 12);
  EXPECT_EQ(swizzled_offset(0, 1, nb), 1);  // k & 3
  EXPECT_EQ(swizzled_offset(0, 3, nb), 3);
  EXPECT_EQ(swizzled_offset(0, 4, nb), 512);  // next 4-column tile
  EXPECT_EQ(swizzled_offset(0, 8, nb), 1024);
  EXPECT_EQ(swizzled_offset(128, 0, nb), 3 * 512);  // next 128-row tile: nKT tiles further
  // m = 130, k = 5: ((1 * 3) + 1) * 512 + 2 * 16 + 0 * 4 + 1
  EXPECT_EQ(swizzled_offset(130, 5, nb), 2081);
  // m = 299, k = 9: (2 * 3 + 2) * 512 + 11 * 16 + 1 * 4 + 1
  EXPECT_EQ(swizzled_offset(299, 9, nb), 4277);
  // The last valid padded position is the last byte of the buffer.
  EXPECT_EQ(swizzled_offset(383, 11, nb), 384 * 12 - 1);
}

TEST(Swizzle, BijectionPaddingAndRoundTrip) {
  std::mt19937_64 rng(2);
  for (auto [rows, nb] :
       {std::pair<int64_t, int64_t>{1, 1}, {128, 4}, {129, 5}, {300, 10}, {257, 64}, {17, 3}}) {
    const SwizzledShape sh{rows, nb};
    // Every padded position maps to a distinct byte of the buffer.
    std::set<int64_t> seen;
    for (int64_t m = 0; m < sh.padded_rows(); ++m)
      for (int64_t k = 0; k < sh.padded_blocks(); ++k) {
        const int64_t o = swizzled_offset(m, k, nb);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, sh.bytes());
        ASSERT_TRUE(seen.insert(o).second);
      }
    std::vector<uint8_t> s(static_cast<size_t>(rows * nb));
    for (auto& v : s) v = static_cast<uint8_t>(1 + rng() % 126);  // non-zero scales
    const std::vector<uint8_t> z = swizzle_scales(s.data(), rows, nb);
    ASSERT_EQ(static_cast<int64_t>(z.size()), sh.bytes());
    int64_t nonzero = 0;
    for (uint8_t v : z) nonzero += v != 0;
    EXPECT_EQ(nonzero, rows * nb);  // padding is zero
    EXPECT_EQ(unswizzle_scales(z.data(), static_cast<int64_t>(z.size()), rows, nb), s);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t k = 0; k < nb; ++k) ASSERT_EQ(z[swizzled_offset(m, k, nb)], s[m * nb + k]);
  }
  std::vector<uint8_t> z(10);
  EXPECT_THROW(unswizzle_scales(z.data(), 10, 2, 2), std::invalid_argument);
}

TEST(Swizzle, ShapesWhosePaddedSizeOverflowAreRejected) {
  // 2^33 x 2^31 padded scales are 2^64 bytes, which wrapped to 0 and matched an empty buffer
  // (then the copy loop ran off it: a segfault from Python's unswizzle_scales).
  const uint8_t none = 0;
  EXPECT_THROW(unswizzle_scales(&none, 0, int64_t{1} << 33, int64_t{1} << 31),
               std::invalid_argument);
  EXPECT_THROW(unswizzle_scales(&none, 0, int64_t{1} << 62, 4), std::invalid_argument);
  EXPECT_THROW(unswizzle_scales(&none, 512, (int64_t{1} << 57) + 1, 4), std::invalid_argument);
  EXPECT_THROW(unswizzle_scales(&none, 0, INT64_MAX, 1), std::invalid_argument);
  EXPECT_THROW(swizzle_scales(&none, INT64_MAX, INT64_MAX), std::invalid_argument);
  EXPECT_THROW(swizzle_scales(&none, int64_t{1} << 33, int64_t{1} << 31), std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep

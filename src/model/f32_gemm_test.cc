// f32_gemm against the plain reference, and its column split: the same bits for every split.
#include "model/f32_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/test_util.h"

namespace scalesweep::model {
namespace {

using scalesweep::testing::randn;

TEST(F32Gemm, MatchesReferenceWithinFp32Rounding) {
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, {3, 70, 17}, {80, 1536, 576}, {20, 130, 1000}}) {
    const auto a = randn(static_cast<size_t>(m) * k, 1), w = randn(static_cast<size_t>(n) * k, 2);
    std::vector<float> c(static_cast<size_t>(m) * (n + 5), -7.0f), r(c.size(), -7.0f);
    f32_gemm(a.data(), w.data(), m, n, k, c.data(), n + 5);
    f32_gemm_reference(a.data(), w.data(), m, n, k, r.data(), n + 5);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n + 5; ++j) {
        const size_t x = static_cast<size_t>(i) * (n + 5) + j;
        if (j >= n) {
          EXPECT_EQ(c[x], -7.0f) << "wrote past n";
          continue;
        }
        double bound = 0;  // gamma_k * sum |a w|
        for (int p = 0; p < k; ++p)
          bound += std::fabs(static_cast<double>(a[static_cast<size_t>(i) * k + p]) *
                             w[static_cast<size_t>(j) * k + p]);
        bound *= 2.0 * k * 0x1p-24;
        ASSERT_LE(std::fabs(c[x] - r[x]), bound + 1e-30) << m << "x" << n << "x" << k;
      }
  }
}

TEST(F32Gemm, SameBitsForEveryThreadCount) {
  const int m = 33, n = 1000, k = 300;
  const auto a = randn(static_cast<size_t>(m) * k, 3), w = randn(static_cast<size_t>(n) * k, 4);
  std::vector<float> one(static_cast<size_t>(m) * n), many(one.size());
  const int prev = set_gemm_threads(1);
  f32_gemm(a.data(), w.data(), m, n, k, one.data(), n);
  for (int t : {2, 3, 7, 0}) {
    set_gemm_threads(t);
    f32_gemm(a.data(), w.data(), m, n, k, many.data(), n);
    EXPECT_EQ(one, many) << t;
  }
  set_gemm_threads(prev);
  EXPECT_THROW(set_gemm_threads(-1), std::invalid_argument);
  EXPECT_THROW(f32_gemm(a.data(), w.data(), m, n, k, many.data(), n - 1), std::invalid_argument);
}

TEST(F32Gemm, NnStridedMatchesReference) {
  // The attention shapes: strided A (queries of one head), B with a long row stride (a
  // channel-major key cache), alpha, and C with a stride; also tiny and odd sizes.
  for (auto [m, n, k, lda, ldb, ldc] : {std::tuple{64, 130, 64, 576, 4096, 130},
                                        {7, 64, 200, 200, 192, 576},
                                        {1, 1, 1, 1, 1, 1},
                                        {3, 17, 5, 9, 40, 20}}) {
    const auto a = randn(static_cast<size_t>(m) * lda, 5),
               b = randn(static_cast<size_t>(k) * ldb, 6);
    std::vector<float> c(static_cast<size_t>(m) * ldc, -7.0f), r(c.size(), -7.0f);
    f32_gemm_nn(m, n, k, 0.125f, a.data(), lda, b.data(), ldb, c.data(), ldc);
    f32_gemm_nn_reference(m, n, k, 0.125f, a.data(), lda, b.data(), ldb, r.data(), ldc);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < ldc; ++j) {
        const size_t x = static_cast<size_t>(i) * ldc + j;
        if (j >= n) {
          EXPECT_EQ(c[x], -7.0f) << "wrote past n";
          continue;
        }
        double bound = 0;
        for (int p = 0; p < k; ++p)
          bound += std::fabs(static_cast<double>(a[static_cast<size_t>(i) * lda + p]) *
                             b[static_cast<size_t>(p) * ldb + j]);
        bound *= 0.125 * 2.0 * k * 0x1p-24;
        ASSERT_LE(std::fabs(c[x] - r[x]), bound + 1e-30) << m << "x" << n << "x" << k;
      }
  }
  std::vector<float> z(64);
  EXPECT_THROW(f32_gemm_nn(2, 4, 3, 1.0f, z.data(), 2, z.data(), 4, z.data(), 4),
               std::invalid_argument);  // lda < k
  EXPECT_THROW(f32_gemm_nn(0, 4, 3, 1.0f, z.data(), 3, z.data(), 4, z.data(), 4),
               std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep::model

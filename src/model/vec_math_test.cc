// The runtime's vector math against its plain references (model/vec_math.h): dense sweeps,
// random rows and adversarial ones (ties, constant rows, short tails, extreme values).
#include "model/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace scalesweep::model {
namespace {

TEST(VecMath, ExpNonposWithin2Point5e7Relative) {
  // Every 97th float bit pattern of [-87, 0] (about 11 million arguments).
  const uint32_t lo = 0x80000000u, hi = 0xC2AE0000u;  // -0.0 .. -87.0
  double worst = 0;
  for (uint32_t b = lo; b <= hi; b += 97) {
    float x;
    std::memcpy(&x, &b, 4);
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_nonpos(x) - want) / want);
  }
  EXPECT_LT(worst, 2.5e-7);
  EXPECT_EQ(exp_nonpos(-1000.0f), exp_nonpos(-87.0f));  // clamped, finite, positive
  EXPECT_GT(exp_nonpos(-1000.0f), 0.0f);
  EXPECT_EQ(exp_nonpos(0.0f), 1.0f);
}

TEST(VecMath, SoftmaxMatchesDoubleReference) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int n : {1, 2, 15, 16, 17, 255, 256, 1000}) {
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    std::vector<float> y = x;
    softmax_inplace(y.data(), n);
    double mx = -INFINITY, sum = 0;
    for (float v : x) mx = std::max<double>(mx, v);
    for (float v : x) sum += std::exp(v - mx);
    for (int j = 0; j < n; ++j)
      EXPECT_NEAR(y[j], std::exp(x[j] - mx) / sum, 1e-6 * std::exp(x[j] - mx) / sum + 1e-12) << n;
  }
}

TEST(VecMath, TokenLogprobMatchesReference) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int vocab : {1, 3, 16, 17, 255, 256, 257, 4099, 49152}) {
    std::vector<float> row(vocab);
    for (auto& v : row) v = nd(rng);
    for (int token : {0, vocab / 2, vocab - 1}) {
      const TokenLogprob f = token_logprob(row.data(), vocab, token);
      const TokenLogprob r = token_logprob_reference(row.data(), vocab, token);
      EXPECT_NEAR(f.logprob, r.logprob, 1e-6) << vocab << " " << token;
      EXPECT_EQ(f.greedy, r.greedy) << vocab << " " << token;
    }
  }
}

TEST(VecMath, TokenLogprobAdversarialRows) {
  // Constant rows: every token ties; the first maximum is greedy, log p = -log(vocab).
  for (int vocab : {1, 16, 33, 49152}) {
    const std::vector<float> row(vocab, 5.5f);
    for (int token : {0, vocab - 1}) {
      const TokenLogprob f = token_logprob(row.data(), vocab, token);
      EXPECT_NEAR(f.logprob, -std::log(static_cast<double>(vocab)), 1e-6);
      EXPECT_EQ(f.greedy, token == 0);
    }
  }
  // A tie for the maximum late in the row and in the tail after the last full lane group.
  std::vector<float> row(1000, -3.0f);
  row[999] = 7.0f;
  row[998] = 7.0f;
  EXPECT_FALSE(token_logprob(row.data(), 1000, 999).greedy);
  EXPECT_TRUE(token_logprob(row.data(), 1000, 998).greedy);
  EXPECT_EQ(argmax(row.data(), 1000), 998);
  // Huge spread: entries 200 below the max underflow in both forms.
  row.assign(300, -200.0f);
  row[7] = 100.0f;
  const TokenLogprob f = token_logprob(row.data(), 300, 7);
  const TokenLogprob r = token_logprob_reference(row.data(), 300, 7);
  EXPECT_NEAR(f.logprob, r.logprob, 1e-9);
  EXPECT_NEAR(token_logprob(row.data(), 300, 3).logprob,
              token_logprob_reference(row.data(), 300, 3).logprob, 1e-4);
  // Lowest and highest finite logits.
  row.assign(40, std::numeric_limits<float>::lowest());
  row[39] = std::numeric_limits<float>::max();
  EXPECT_EQ(token_logprob(row.data(), 40, 39).logprob, 0.0);
  EXPECT_TRUE(token_logprob(row.data(), 40, 39).greedy);
}

TEST(VecMath, SiluMulMatchesReference) {
  // A dense sweep of g over [-100, 100] and a few extremes, u = 1 and random.
  std::vector<float> g, u;
  for (float x = -100.0f; x <= 100.0f; x += 0.001f) g.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -88.0f, 1e6f, -1e6f}) g.push_back(x);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int pass = 0; pass < 2; ++pass) {
    u.resize(g.size());
    for (auto& v : u) v = pass == 0 ? 1.0f : nd(rng);
    std::vector<float> f = g, r = g;
    silu_mul(f.data(), u.data(), f.size());
    silu_mul_reference(r.data(), u.data(), r.size());
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] < -87.0f) {  // exp clamped at -87: both are below 1e-35 in magnitude
        EXPECT_LT(std::fabs(f[i]), 1e-30f * std::fabs(g[i] * u[i]) + 1e-30f) << g[i];
        continue;
      }
      EXPECT_NEAR(f[i], r[i], 1e-6 * std::fabs(r[i]) + 1e-38) << g[i];
    }
  }
}

}  // namespace
}  // namespace scalesweep::model

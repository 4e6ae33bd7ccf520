#include "scalesweep/model/transformer.h"

#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::model {
namespace {

std::vector<int> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(rng() % vocab);
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// rope_inv_freq of small_config() with head_dim and rope_theta: unscaled, and with `scaling`.
std::pair<std::vector<float>, std::vector<float>> rope_freqs(int head_dim, float theta,
                                                             const RopeScaling& scaling) {
  Config c = testing::small_config();
  c.head_dim = head_dim;
  c.rope_theta = theta;
  const auto plain = rope_inv_freq(c);
  c.rope_scaling = scaling;
  return {plain, rope_inv_freq(c)};
}

void check_against_reference(const Config& c) {
  auto w = std::make_shared<const Weights>(testing::random_model(c, 7));
  const auto toks = random_tokens(20, c.vocab_size, 3);
  const auto ref = testing::reference_forward(*w, toks);
  Transformer tf(w);
  // Batched prefill.
  const auto pre = tf.forward(toks.data(), static_cast<int>(toks.size()), 0);
  EXPECT_LT(max_abs_diff(pre, ref), 2e-4);
  // Token-by-token decode with the KV cache.
  Transformer tf2(w);
  std::vector<float> dec;
  for (int t = 0; t < static_cast<int>(toks.size()); ++t) {
    const float* lg = tf2.decode(toks[t], t);
    dec.insert(dec.end(), lg, lg + c.vocab_size);
  }
  EXPECT_LT(max_abs_diff(dec, ref), 2e-4);
  // Prefill of a prefix then a batched continuation through the cache.
  Transformer tf3(w);
  tf3.forward(toks.data(), 7, 0);
  const auto rest = tf3.forward(toks.data() + 7, 13, 7);
  const std::vector<double> ref_rest(ref.begin() + 7 * c.vocab_size, ref.end());
  EXPECT_LT(max_abs_diff(rest, ref_rest), 2e-4);
}

TEST(Transformer, CacheGrowsOnDemand) {
  const Config c = testing::small_config();
  auto w = std::make_shared<const Weights>(testing::random_model(c, 8));
  const auto toks = random_tokens(40, c.vocab_size, 4);
  const auto ref = testing::reference_forward(*w, toks);
  Transformer tf(w, 3);  // grows 3 -> 64 while decoding, then a batched step on top
  std::vector<float> out;
  for (int t = 0; t < 30; ++t) {
    const float* lg = tf.decode(toks[t], t);
    out.insert(out.end(), lg, lg + c.vocab_size);
  }
  const auto rest = tf.forward(toks.data() + 30, 10, 30);
  out.insert(out.end(), rest.begin(), rest.end());
  EXPECT_LT(max_abs_diff(out, ref), 2e-4);
}

// The embeddings, forward_layer over every layer and final_logits give forward()'s logits bit
// for bit (the suffix passes of mixed precision's measured sensitivity run this way).
TEST(Transformer, LayersThenFinalLogitsIsForward) {
  const Config c = testing::small_config();
  auto w = std::make_shared<const Weights>(testing::random_model(c, 9));
  const auto toks = random_tokens(12, c.vocab_size, 5);
  Transformer a(w), b(w);
  const std::vector<float> want = a.forward(toks.data(), 12, 0);
  std::vector<float> x(static_cast<size_t>(12) * c.dim);
  for (int t = 0; t < 12; ++t)
    dequantize_rows(w->tok_embeddings, toks[t], toks[t] + 1, x.data() + t * c.dim);
  for (int l = 0; l < c.n_layers; ++l) b.forward_layer(l, w->layers[l], x.data(), 12, 0);
  std::vector<float> got(want.size());
  b.final_logits(x.data(), 12, got.data());
  EXPECT_EQ(got, want);
}

TEST(Transformer, BranchesEachSeeTheSharedPrefixAndThemselvesOnly) {
  for (bool qwen3 : {false, true}) {
    Config c = testing::small_config();
    c.qk_norm = qwen3;
    auto w = std::make_shared<const Weights>(testing::random_model(c, 21));
    const auto ctx = random_tokens(9, c.vocab_size, 5);
    const std::vector<std::vector<int>> br = {random_tokens(4, c.vocab_size, 6),
                                              random_tokens(1, c.vocab_size, 7),
                                              random_tokens(6, c.vocab_size, 8)};
    Transformer tf(w);
    tf.forward_hidden(ctx.data(), static_cast<int>(ctx.size()), 0);
    std::vector<int> toks, lens;
    for (const auto& b : br) {
      toks.insert(toks.end(), b.begin(), b.end());
      lens.push_back(static_cast<int>(b.size()));
    }
    const float* h = tf.forward_branches(toks.data(), lens.data(), 3, 9);
    std::vector<float> hb(h, h + toks.size() * c.dim);
    std::vector<float> got(toks.size() * c.vocab_size);
    tf.logits(hb.data(), static_cast<int>(toks.size()), got.data());
    // Each branch against the reference over context + branch.
    size_t row = 0;
    for (const auto& b : br) {
      std::vector<int> all = ctx;
      all.insert(all.end(), b.begin(), b.end());
      const auto ref = testing::reference_forward(*w, all);
      for (size_t i = 0; i < b.size(); ++i, ++row)
        for (int v = 0; v < c.vocab_size; ++v)
          ASSERT_NEAR(got[row * c.vocab_size + v], ref[(ctx.size() + i) * c.vocab_size + v], 2e-4)
              << qwen3 << " row " << row;
    }
    // The shared sequence stays usable: a plain continuation after the branches.
    const auto more = tf.forward(br[0].data(), 4, 9);
    std::vector<int> all = ctx;
    all.insert(all.end(), br[0].begin(), br[0].end());
    const auto ref = testing::reference_forward(*w, all);
    for (size_t i = 0; i < more.size(); ++i) ASSERT_NEAR(more[i], ref[9 * c.vocab_size + i], 2e-4);
    EXPECT_THROW(tf.forward_branches(toks.data(), lens.data(), 0, 9), std::invalid_argument);
    const int zero[] = {0};
    EXPECT_THROW(tf.forward_branches(toks.data(), zero, 1, 9), std::invalid_argument);
    const std::vector<int> big(60, 1);
    const int big_len[] = {60};
    EXPECT_THROW(tf.forward_branches(big.data(), big_len, 1, 9), std::out_of_range);  // 64 slots
  }
}

TEST(Transformer, LlamaGqaMatchesReference) { check_against_reference(testing::small_config()); }

TEST(Transformer, MultiHeadUntiedMatchesReference) {
  Config c = testing::small_config();
  c.n_kv_heads = c.n_heads;
  c.tied_embeddings = false;
  check_against_reference(c);
}

TEST(Transformer, Qwen2BiasesMatchReference) {
  Config c = testing::small_config();
  c.arch = Arch::kQwen2;
  c.qkv_bias = true;
  c.rope_theta = 1e6f;
  c.norm_eps = 1e-6f;
  check_against_reference(c);
}

TEST(Transformer, Qwen3QkNormMatchesReference) {
  Config c = testing::small_config();
  c.arch = Arch::kQwen3;
  c.qk_norm = true;
  c.head_dim = 16;  // head_dim * n_heads != dim, as Qwen3 allows
  check_against_reference(c);
}

TEST(Transformer, Llama3RopeScalingMatchesReference) {
  Config c = testing::small_config();
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = RopeType::kLlama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position_embeddings = 16;
  check_against_reference(c);
}

TEST(Transformer, YarnRopeMatchesReference) {  // attention_factor scales cos and sin
  Config c = testing::small_config();
  c.rope_scaling.type = RopeType::kYarn;
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position_embeddings = 16;
  c.rope_scaling.attention_factor = 1.1386294f;
  check_against_reference(c);
}

TEST(Transformer, LinearRopeDividesEveryFrequency) {
  const auto [plain, scaled] =
      rope_freqs(64, testing::small_config().rope_theta, {.type = RopeType::kLinear, .factor = 2});
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_FLOAT_EQ(scaled[i], plain[i] / 2);
}

TEST(Transformer, YarnRopeBlendsExtrapolationAndInterpolation) {
  const auto [plain, y] = rope_freqs(
      128, 1e6f, {.type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 32768});
  // beta_fast = 32 rotations: the highest frequencies stay; beta_slow = 1: the lowest are /4.
  EXPECT_FLOAT_EQ(y[0], plain[0]);
  EXPECT_FLOAT_EQ(y.back(), plain.back() / 4);
  int blended = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_LE(y[i], plain[i] * (1 + 1e-6f));
    EXPECT_GE(y[i], plain[i] / 4 * (1 - 1e-6f));
    blended += y[i] < plain[i] * (1 - 1e-6f) && y[i] > plain[i] / 4 * (1 + 1e-6f);
  }
  EXPECT_GT(blended, 0);
}

TEST(Transformer, DynamicRopeIsDefaultUpToMaxPositionsThenGrowsTheBase) {
  Config c = testing::small_config();
  c.head_dim = 64;
  c.max_seq_len = 128;
  const auto plain = rope_inv_freq(c);
  c.rope_scaling.type = RopeType::kDynamic;
  c.rope_scaling.factor = 2;
  EXPECT_EQ(rope_inv_freq(c, 0), plain);
  EXPECT_EQ(rope_inv_freq(c, 128), plain);
  const auto longer = rope_inv_freq(c, 256);  // base * (2*256/128 - 1)^(64/62)
  const double base = 10000.0 * std::pow(3.0, 64.0 / 62.0);
  EXPECT_NEAR(longer[1], std::pow(base, -2.0 / 64), 1e-6 * plain[1]);
}

TEST(Transformer, RopeFactorWithoutTypeIsRefused) {
  Config c = testing::small_config();
  c.rope_scaling.factor = 8;
  EXPECT_THROW(rope_inv_freq(c), std::invalid_argument);
}

TEST(Transformer, Llama3RopeScalingFrequencies) {
  const auto [plain, scaled] = rope_freqs(
      64, 500000.0f,
      {.type = RopeType::kLlama3, .factor = 8, .original_max_position_embeddings = 8192});
  // High frequencies (short wavelengths) unchanged, the lowest divided by the factor.
  EXPECT_FLOAT_EQ(scaled[0], plain[0]);
  EXPECT_NEAR(scaled.back(), plain.back() / 8, 1e-12);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LE(scaled[i], plain[i]);
}

TEST(Transformer, RejectsBadTokensAndPositions) {
  Config c = testing::small_config();
  auto w = std::make_shared<const Weights>(testing::random_model(c, 1));
  Transformer tf(w);
  int bad = c.vocab_size;
  EXPECT_THROW(tf.decode(bad, 0), std::out_of_range);
  EXPECT_THROW(tf.decode(0, c.max_seq_len), std::out_of_range);
  EXPECT_THROW(tf.forward_hidden(&bad, 0, 0), std::invalid_argument);
}

// A random model of stories260K's shape over a full 512-token window (the real checkpoint is
// checked the same way in src/io/llama2c_test.cc, where its loader lives).
// head_dim 8: decode attention on the calling thread; head_dim 32 (q width 256): from position
// 256 on, the KV heads run on the decode workers (T * q width >= 64K), and so do the products.
TEST(Transformer, PrefillEqualsDecodeFullWindow) {
  for (int hd : {8, 32}) {
    const Config c = testing::shaped_config(64, 172, 5, 8, 4, hd, 512, 512);
    auto w = std::make_shared<const Weights>(testing::random_model(c, 11));
    const auto toks = random_tokens(512, 512, 5);
    Transformer a(w), b(w);
    const auto pre = a.forward(toks.data(), 512, 0);
    EXPECT_LT(testing::max_decode_diff(b, toks, 512, pre), 1e-3) << "head_dim " << hd;
  }
}

}  // namespace
}  // namespace scalesweep::model

namespace scalesweep::model {
namespace {

// The threaded GEMV of decode when no thread can be created (a pids or address-space limit):
// the rows run on the calling thread, same logits. Was: std::system_error with a joinable
// thread in the pool -> "terminate called without an active exception".
TEST(Transformer, DecodeWithoutThreadsLeft) {
  Config c = testing::small_config();
  c.dim = 64;
  c.vocab_size = 65536;  // lm_head 65536 x 64 = 2^22 elements: the threaded GEMV
  c.n_layers = 1;
  auto w = std::make_shared<const Weights>(testing::random_model(c, 9));
  const std::vector<int> toks = {1, 2};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::vector<double> ref = testing::reference_forward(*w, toks);
    Transformer tf(w);
    // Every clone/clone3 fails with EAGAIN from here on (seccomp): std::thread cannot start.
    // (An address-space limit is not enough: after fork glibc reuses OpenBLAS's thread stacks.)
    // Was: std::system_error out of decode ("Resource temporarily unavailable"), or
    // std::terminate with more than one thread already started.
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EAGAIN & SECCOMP_RET_DATA)),
    };
    struct sock_fprog fp {
      static_cast<unsigned short>(sizeof prog / sizeof prog[0]), prog
    };
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp) != 0)
      ::_exit(3);
    double worst = 0;
    try {
      for (int t = 0; t < 2; ++t) {
        const float* lg = tf.decode(toks[static_cast<size_t>(t)], t);
        for (int v = 0; v < c.vocab_size; ++v)
          worst =
              std::max(worst, std::fabs(lg[v] - ref[static_cast<size_t>(t * c.vocab_size + v)]));
      }
    } catch (const std::exception&) {
      ::_exit(5);
    }
    ::_exit(worst < 2e-4 ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace scalesweep::model

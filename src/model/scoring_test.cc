// The evaluation engine against a plain computation: one fresh forward over context +
// continuation[:-1] per request, log softmax in double by hand.
#include "scalesweep/model/scoring.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/test_util.h"

namespace scalesweep::model {
namespace {

std::vector<int> rand_ids(int n, int vocab, std::mt19937_64& rng) {
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(rng() % vocab);
  return t;
}

// log P(cont | ctx) and greedy by one forward of a fresh Transformer.
LoglikelihoodResult plain(const std::shared_ptr<const Weights>& w, const LoglikelihoodRequest& q) {
  std::vector<int> all = q.context;
  all.insert(all.end(), q.continuation.begin(), q.continuation.end() - 1);
  Transformer tf(w);
  const auto lg = tf.forward(all.data(), static_cast<int>(all.size()), 0);
  const int V = w->config.vocab_size;
  LoglikelihoodResult r;
  r.greedy = true;
  r.tokens = static_cast<int>(q.continuation.size());
  for (size_t i = 0; i < q.continuation.size(); ++i) {
    const float* row = lg.data() + (q.context.size() - 1 + i) * V;
    double mx = row[0];
    int best = 0;
    for (int v = 1; v < V; ++v)
      if (row[v] > mx) mx = row[v], best = v;
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(row[v] - mx);
    r.logprob += row[q.continuation[i]] - mx - std::log(s);
    r.greedy = r.greedy && best == q.continuation[i];
  }
  return r;
}

struct Fixture {
  Config c = testing::small_config();
  std::shared_ptr<const Weights> w = std::make_shared<const Weights>(testing::random_model(c, 11));
  TransformerFactory make = [this] { return std::make_unique<Transformer>(w); };
};

// Documents like a multiple-choice task: one context, several continuations; and like
// WinoGrande: several contexts, one continuation.
std::vector<std::vector<LoglikelihoodRequest>> mixed_docs(int vocab, const std::vector<int>& pre,
                                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<LoglikelihoodRequest>> docs;
  for (int d = 0; d < 9; ++d) {
    std::vector<LoglikelihoodRequest> reqs;
    std::vector<int> ctx = pre;
    const auto tail = rand_ids(1 + static_cast<int>(rng() % 6), vocab, rng);
    ctx.insert(ctx.end(), tail.begin(), tail.end());
    if (d % 3 == 2) {
      const auto cont = rand_ids(2, vocab, rng);
      for (int k = 0; k < 2; ++k) {
        std::vector<int> c2 = ctx;
        c2.push_back(static_cast<int>(rng() % vocab));
        reqs.push_back({c2, cont});
      }
    } else {
      for (int k = 0; k < 4; ++k)
        reqs.push_back({ctx, rand_ids(1 + static_cast<int>(rng() % 4), vocab, rng)});
    }
    docs.push_back(std::move(reqs));
  }
  return docs;
}

void expect_plain(const Fixture& f, const std::vector<std::vector<LoglikelihoodRequest>>& docs,
                  const std::vector<std::vector<LoglikelihoodResult>>& got) {
  ASSERT_EQ(got.size(), docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ(got[d].size(), docs[d].size());
    for (size_t r = 0; r < docs[d].size(); ++r) {
      const auto ref = plain(f.w, docs[d][r]);
      EXPECT_NEAR(got[d][r].logprob, ref.logprob, 1e-4) << d << "/" << r;
      EXPECT_EQ(got[d][r].tokens, ref.tokens);
      // Greedy flags agree unless a row's top two logits are within rounding; the random
      // model's are not.
      EXPECT_EQ(got[d][r].greedy, ref.greedy) << d << "/" << r;
    }
  }
}

TEST(Scoring, MatchesAPlainForwardPerRequest) {
  Fixture f;
  const auto docs = mixed_docs(f.c.vocab_size, {}, 1);
  expect_plain(f, docs, score_loglikelihood(f.make, f.c, docs, {.threads = 1}));
}

TEST(Scoring, SharedPrefixRunsOnceAndMatches) {
  Fixture f;
  std::mt19937_64 rng(5);
  const auto pre = rand_ids(40, f.c.vocab_size, rng);  // >= the 32-token threshold
  const auto docs = mixed_docs(f.c.vocab_size, pre, 2);
  expect_plain(f, docs, score_loglikelihood(f.make, f.c, docs, {.threads = 2}));
}

TEST(Scoring, SameResultsForEveryThreadCount) {
  Fixture f;
  std::mt19937_64 rng(6);
  const auto docs = mixed_docs(f.c.vocab_size, rand_ids(35, f.c.vocab_size, rng), 3);
  const auto one = score_loglikelihood(f.make, f.c, docs, {.threads = 1});
  for (int t : {2, 3, 8}) {
    int64_t last = 0;
    const auto many =
        score_loglikelihood(f.make, f.c, docs, {.threads = t}, [&](int64_t done, int64_t total) {
          EXPECT_EQ(total, 9);
          EXPECT_EQ(done, last + 1);
          last = done;
        });
    EXPECT_EQ(last, 9);
    for (size_t d = 0; d < docs.size(); ++d)
      for (size_t r = 0; r < docs[d].size(); ++r) {
        EXPECT_EQ(many[d][r].logprob, one[d][r].logprob) << t;  // bitwise
        EXPECT_EQ(many[d][r].greedy, one[d][r].greedy);
      }
  }
}

TEST(Scoring, LongRequestsAreCutFromTheLeftAsLmEval) {
  Fixture f;  // max_seq_len 64
  std::mt19937_64 rng(7);
  const auto ctx = rand_ids(70, f.c.vocab_size, rng);
  const auto cont = rand_ids(5, f.c.vocab_size, rng);
  const auto got = score_loglikelihood(f.make, f.c, {{{ctx, cont}}}, {});
  // (ctx + cont)[-65:][:-1]: the last 60 context tokens.
  const LoglikelihoodRequest cut{std::vector<int>(ctx.end() - 60, ctx.end()), cont};
  EXPECT_NEAR(got[0][0].logprob, plain(f.w, cut).logprob, 1e-4);
  // --max-length below the model's context cuts further.
  const auto got16 = score_loglikelihood(f.make, f.c, {{{ctx, cont}}}, {.max_length = 16});
  const LoglikelihoodRequest cut16{std::vector<int>(ctx.end() - 12, ctx.end()), cont};
  EXPECT_NEAR(got16[0][0].logprob, plain(f.w, cut16).logprob, 1e-4);
}

TEST(Scoring, BadRequestsNameDocumentAndRequest) {
  Fixture f;
  auto msg = [&](std::vector<std::vector<LoglikelihoodRequest>> docs) -> std::string {
    try {
      score_loglikelihood(f.make, f.c, docs, {});
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(msg({{{{1}, {2}}}, {{{}, {2}}}}), "document 1, request 0: empty context");
  EXPECT_EQ(msg({{{{1}, {2}}, {{1}, {}}}}), "document 0, request 1: empty continuation");
  EXPECT_EQ(msg({{{{1, 99}, {2}}}}),
            "document 0, request 0: context token 1 = 99 is outside the vocabulary [0, 37)");
  EXPECT_EQ(msg({{}}), "document 0: no request");
  EXPECT_EQ(msg({{{{1}, std::vector<int>(65, 3)}}}),
            "document 0, request 0: the continuation has 65 tokens, more than the model's "
            "context of 64");
}

TEST(Scoring, AnExceptionInAWorkerReachesTheCaller) {
  Fixture f;
  int made = 0;
  TransformerFactory bad = [&]() -> std::unique_ptr<Transformer> {
    if (++made > 1) throw std::runtime_error("no memory for a worker");
    return std::make_unique<Transformer>(f.w);
  };
  const auto docs = mixed_docs(f.c.vocab_size, {}, 4);
  EXPECT_THROW(score_loglikelihood(bad, f.c, docs, {.threads = 3}), std::runtime_error);
}

TEST(Scoring, CutAtStop) {
  EXPECT_EQ(cut_at_stop("abc Question: x", {"Question:", "</s>"}),
            std::make_pair(std::string("abc "), true));
  EXPECT_EQ(cut_at_stop("a</s>b Question:", {"Question:", "</s>"}),
            std::make_pair(std::string("a"), true));
  EXPECT_EQ(cut_at_stop("abc", {"", "z"}), std::make_pair(std::string("abc"), false));
}

// A tokenizer whose token i decodes to one letter (i % 26), EOS = 2.
std::unique_ptr<Llama2cTokenizer> letters(int vocab) {
  std::vector<std::string> v;
  for (int i = 0; i < vocab; ++i) v.push_back(std::string(1, static_cast<char>('a' + i % 26)));
  return std::make_unique<Llama2cTokenizer>(v, std::vector<float>(vocab, 0.0f));
}

TEST(Scoring, GreedyGenerationMatchesDecodeLoopAndStops) {
  Fixture f;
  const auto tok = letters(f.c.vocab_size);
  std::mt19937_64 rng(9);
  std::vector<GenerationRequest> reqs;
  for (int d = 0; d < 4; ++d) reqs.push_back({rand_ids(3 + d, f.c.vocab_size, rng), {}, 12});
  const auto got = generate_until(f.make, f.c, *tok, reqs, {.threads = 2});
  for (size_t d = 0; d < reqs.size(); ++d) {
    // Reference: argmax step by step through decode().
    Transformer tf(f.w);
    const float* lg = nullptr;
    int pos = 0;
    for (int t : reqs[d].context) lg = tf.decode(t, pos++);
    std::string text;
    int n = 0;
    bool eos = false;
    while (n < 12) {
      int best = 0;
      for (int v = 1; v < f.c.vocab_size; ++v)
        if (lg[v] > lg[best]) best = v;
      if (best == tok->eos()) {
        eos = true;
        break;
      }
      text += tok->decode_token(-1, best);
      ++n;
      lg = tf.decode(best, pos++);
    }
    EXPECT_EQ(got[d].text, text) << d;
    EXPECT_EQ(got[d].tokens, n);
    EXPECT_EQ(got[d].stopped, eos);
    // A stop string: the third character (its first occurrence ends the text).
    if (text.size() >= 3) {
      GenerationRequest q = reqs[d];
      q.until = {text.substr(2, 1)};
      const auto s = generate_until(f.make, f.c, *tok, {q}, {});
      EXPECT_TRUE(s[0].stopped);
      EXPECT_EQ(s[0].text, cut_at_stop(text, q.until).first);
    }
  }
}

TEST(Scoring, GenerationContextKeepsRoomForMaxTokens) {
  Fixture f;  // max_seq_len 64
  const auto tok = letters(f.c.vocab_size);
  std::mt19937_64 rng(10);
  const auto ctx = rand_ids(80, f.c.vocab_size, rng);
  const auto a = generate_until(f.make, f.c, *tok, {{ctx, {}, 8}}, {});
  const auto b =
      generate_until(f.make, f.c, *tok, {{std::vector<int>(ctx.end() - 56, ctx.end()), {}, 8}}, {});
  EXPECT_EQ(a[0].text, b[0].text);
  EXPECT_THROW(generate_until(f.make, f.c, *tok, {{ctx, {}, 64}}, {}), std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep::model

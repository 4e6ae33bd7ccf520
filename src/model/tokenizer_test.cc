#include "scalesweep/model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

namespace scalesweep::model {
namespace {

// A small vocabulary in llama2.c layout: <unk>, <s>, </s>, 256 byte tokens, then pieces.
Llama2cTokenizer toy() {
  std::vector<std::string> v = {"<unk>", "\n<s>\n", "\n</s>\n"};
  std::vector<float> s = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.push_back(name);
    s.push_back(0);
  }
  const std::pair<const char*, float> pieces[] = {
      {" ", -1},   {"a", -2},   {"b", -3}, {"c", -4},     {"ab", -5}, {" a", -6},
      {"abc", -7}, {" ab", -8}, {"é", -9}, {"bc", -1.5f}, {"ba", -5}, {"aa", -5},
  };
  for (auto& [p, sc] : pieces) {
    v.push_back(p);
    s.push_back(sc);
  }
  return Llama2cTokenizer(v, s);
}

// llama2.c's quadratic merge loop, verbatim in structure, to check the heap implementation.
std::vector<int> naive_encode(const Llama2cTokenizer& t, const std::string& text) {
  std::vector<int> toks;
  if (!text.empty()) toks.push_back(t.lookup(" "));
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    while (j < text.size() && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80 && j - i < 4)
      ++j;
    int id = t.lookup(text.substr(i, j - i));
    if (id >= 0) {
      toks.push_back(id);
    } else {
      for (size_t k = i; k < j; ++k) toks.push_back(static_cast<unsigned char>(text[k]) + 3);
    }
    i = j;
  }
  while (true) {
    float best = -1e10f;
    int best_id = -1, best_idx = -1;
    for (size_t i = 0; i + 1 < toks.size(); ++i) {
      int id = t.lookup(t.vocab()[toks[i]] + t.vocab()[toks[i + 1]]);
      if (id != -1 && t.scores()[id] > best) {
        best = t.scores()[id];
        best_id = id;
        best_idx = static_cast<int>(i);
      }
    }
    if (best_idx == -1) break;
    toks[best_idx] = best_id;
    toks.erase(toks.begin() + best_idx + 1);
  }
  return toks;
}

TEST(Llama2cTokenizer, MergesByScoreWithDummyPrefix) {
  auto t = toy();
  const int sp = t.lookup(" "), bc = t.lookup("bc"), a = t.lookup("a"), sa = t.lookup(" a");
  ASSERT_GE(sp, 0);
  // " abc": pairs " a"(-6), "ab"(-5), "bc"(-1.5): bc first, then " a" (-6) vs "abc"(-7):
  // " a" wins; " abc" is not a token.
  EXPECT_EQ(t.encode("abc", false, false), (std::vector<int>{sa, bc}));
  EXPECT_EQ(t.encode("abc", true, true), (std::vector<int>{1, sa, bc, 2}));
  EXPECT_EQ(t.encode("", true, false), (std::vector<int>{1}));
  EXPECT_TRUE(t.encode("", false, false).empty());
  // Equal scores: leftmost pair first. "aaa" -> " a" (-6) vs "aa" (-5): "aa" at index 1 wins,
  // then " " + "aa" is not a token, so [" ", "aa", "a"]? No: pairs after merge: (" ","aa")
  // not a token, ("aa","a") -> "aaa" not a token.
  EXPECT_EQ(t.encode("aaa", false, false), (std::vector<int>{sp, t.lookup("aa"), a}));
}

TEST(Llama2cTokenizer, ByteFallbackAndDecode) {
  auto t = toy();
  // 'é' is in the vocabulary as one code point; '€' (3 bytes) is not: bytes + 3.
  auto ids = t.encode("é€", false, false);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids[1], t.lookup("é"));
  EXPECT_EQ(ids[2], 0xE2 + 3);
  EXPECT_EQ(ids[3], 0x82 + 3);
  EXPECT_EQ(ids[4], 0xAC + 3);
  EXPECT_EQ(t.decode(ids), " é€");
  // The space after BOS is dropped, as llama2.c's decode does.
  EXPECT_EQ(t.decode(t.encode("abc ab", true, false)), "abc ab");
  EXPECT_EQ(t.decode_token(1, t.lookup(" a")), "a");
  EXPECT_EQ(t.decode_token(5, t.lookup(" a")), " a");
  EXPECT_THROW(t.decode_token(0, 100000), std::out_of_range);
}

TEST(Llama2cTokenizer, RandomRoundTrips) {
  auto t = toy();
  std::mt19937 rng(1);
  const std::string alphabet[] = {"a", "b", "c", " ", "é", "\n", "x", "€", "\t", "ab"};
  for (int it = 0; it < 300; ++it) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % 10];
    EXPECT_EQ(t.decode(t.encode(s, true, false)), s) << s;
    EXPECT_EQ(t.encode(s, false, false), naive_encode(t, s)) << s;
  }
}

TEST(Llama2cTokenizer, AlwaysAddsBos) {
  const Llama2cTokenizer t({"<unk>", "<s>", "</s>", "a"}, {0, 0, 0, 0});
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.bos(), 1);
}

TEST(Llama2cTokenizer, LoadErrorsNameTheFile) {
  const std::string path = ::testing::TempDir() + "/bad_tok.bin";
  {
    std::ofstream f(path, std::ios::binary);
    int32_t max_len = 4;
    f.write(reinterpret_cast<char*>(&max_len), 4);
    float score = 0;
    int32_t len = 9;  // longer than max_token_length
    f.write(reinterpret_cast<char*>(&score), 4);
    f.write(reinterpret_cast<char*>(&len), 4);
  }
  try {
    Llama2cTokenizer::load(path);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad_tok.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Llama2cTokenizer::load(path + ".missing"), std::runtime_error);
}

TEST(Llama2cTokenizer, Stories260KKnownSequences) {
  const std::string path = std::string(SS_SHARED_DATA_DIR) + "/models/stories260K/tok512.bin";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data absent: " << path;
  auto t = Llama2cTokenizer::load(path, 512);
  EXPECT_EQ(t->vocab_size(), 512);
  EXPECT_THROW(Llama2cTokenizer::load(path, 32000), std::runtime_error);
  // Byte tokens sit at 3..258 as llama2.c assumes.
  EXPECT_EQ(t->lookup("<0x0A>"), 13);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  auto ids = t->encode(text, true, false);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(t->decode(ids), text);
  // Ids from an independent Python transcription of llama2.c's quadratic encode().
  EXPECT_EQ(ids, (std::vector<int>{1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421,
                                   395, 317, 426}));
  EXPECT_EQ(t->encode("Zoë said: «naïve»", false, false),
            (std::vector<int>{410, 469, 414, 198, 174, 336, 467, 410, 197, 174, 416, 412, 198, 178,
                              360, 197, 190}));
  for (int id : ids) EXPECT_TRUE(id >= 0 && id < 512);
  // Non-ASCII text goes through byte fallback and round-trips.
  // Heap merge == llama2.c's quadratic loop on real text.
  const std::string val = std::string(SS_SHARED_DATA_DIR) + "/text/tinystories_val.txt";
  if (std::filesystem::exists(val)) {
    std::ifstream f(val);
    std::string line;
    for (int i = 0; i < 40 && std::getline(f, line); ++i)
      EXPECT_EQ(t->encode(line, false, false), naive_encode(*t, line)) << line;
  }
  const std::string uni = "Zoë said: «naïve» — 日本";
  EXPECT_EQ(t->decode(t->encode(uni, true, false)), uni);
}

}  // namespace
}  // namespace scalesweep::model

// Tests of the tokenizer.json BPE tokenizers (byte-level and SentencePiece-style).
#include "scalesweep/model/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/hf_tokenizer_internal.h"

namespace scalesweep::model {
namespace {

namespace bd = bpe_detail;

std::vector<std::string> split(std::string_view text, bool llama3, int max_digits) {
  bd::SplitOptions o;
  o.llama3 = llama3;
  o.max_digits = max_digits;
  std::vector<std::string> out;
  for (auto [b, e] : bd::regex_split(text, o)) out.emplace_back(text.substr(b, e - b));
  return out;
}

using Pieces = std::vector<std::string>;

TEST(BpeSplit, Llama3Pattern) {
  // Worked through the regex alternatives by hand.
  EXPECT_EQ(split("Hello world's 12345 ok!!\n\n  x", true, 3),
            (Pieces{"Hello", " world", "'s", " ", "123", "45", " ok", "!!\n\n", " ", " x"}));
  EXPECT_EQ(split("I'M (test)\tgo  \n\n end ", true, 3),
            (Pieces{"I", "'M", " (", "test", ")", "\tgo", "  \n\n", " end", " "}));
  EXPECT_EQ(split("caf\xC3\xA9 \xF0\x9F\x98\x80!", true, 3),  // café 😀!
            (Pieces{"caf\xC3\xA9", " \xF0\x9F\x98\x80!"}));
  // Qwen2: one digit per piece.
  EXPECT_EQ(split("x 2024", true, 1), (Pieces{"x", " ", "2", "0", "2", "4"}));
}

TEST(BpeSplit, Gpt2Pattern) {
  EXPECT_EQ(split("Hello world's 12345 ok!!\n\n  x", false, 0),
            (Pieces{"Hello", " world", "'s", " 12345", " ok", "!!", "\n\n ", " x"}));
  // GPT-2's contractions are case-sensitive: "'M" is punctuation then a letter.
  EXPECT_EQ(split("I'M  ", false, 0), (Pieces{"I", "'", "M", "  "}));
}

TEST(BpeSplit, PiecesCoverArbitraryBytes) {
  std::mt19937 rng(7);
  for (int it = 0; it < 200; ++it) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += static_cast<char>(rng() % 256);
    for (bool l3 : {false, true}) {
      std::string joined;
      for (auto& p : split(s, l3, 3)) {
        EXPECT_FALSE(p.empty());
        joined += p;
      }
      EXPECT_EQ(joined, s);
    }
  }
}

TEST(BpeNfc, KnownStrings) {
  // Expected values from Python's unicodedata.normalize("NFC", ...).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"e\xCC\x81", "\xC3\xA9"},                                 // e + acute -> é
      {"\xE2\x84\xAB", "\xC3\x85"},                              // Angstrom sign -> Å
      {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"},  // Hangul L V T
      {"\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81"},              // LV + T
      {"a\xCC\x82\xCC\xA3", "\xE1\xBA\xAD"},                     // reordered, then ậ
      {"a\xCC\x81\xCC\x81", "\xC3\xA1\xCC\x81"},                 // second acute blocked
      {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},              // exclusion stays NFD
      {"\xE2\x84\xA6", "\xCE\xA9"},                              // Ohm -> Omega
      {"x\xCC\xA3\xCC\x87q", "\xE1\xBA\x8B\xCC\xA3q"},           // non-adjacent compose
      {"plain ascii", "plain ascii"},
      {"\xFF\xCC\x81"
       "e\xCC\x81",
       "\xFF\xCC\x81\xC3\xA9"},  // invalid byte kept
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(bd::nfc(in), want) << in;
}

// GPT-2 byte alphabet token for a byte.
std::string bchar(uint8_t b) {
  std::string s;
  bd::append_utf8(s, bd::byte_to_unicode()[b]);
  return s;
}

// A byte-level spec: ids 0..255 are the byte alphabet (id = byte), then merges.
BpeSpec byte_level_fixture() {
  BpeSpec s;
  s.flavor = BpeFlavor::kByteLevel;
  s.split = SplitRegex::kLlama3;
  s.max_digits = 3;
  for (int b = 0; b < 256; ++b) s.vocab.push_back(bchar(static_cast<uint8_t>(b)));
  const std::string G = bchar(' ');  // "Ġ"
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"},      {"h", "e"},    {"he", "ll"},     {G, "w"},          {"o", "r"},
      {G + "w", "or"}, {"hell", "o"}, {G + "wor", "l"}, {G + "worl", "d"}, {"1", "2"}};
  for (auto& m : merges) {
    s.merges.push_back(m);
    s.vocab.push_back(m.first + m.second);  // ids 256.. in merge order
  }
  HfAddedToken eot;
  eot.id = static_cast<int>(s.vocab.size());
  eot.content = "<|eot|>";
  eot.special = true;
  eot.lstrip = true;
  s.vocab.push_back(eot.content);
  s.added.push_back(eot);
  s.eos_id = eot.id;
  return s;
}

TEST(BpeByteLevel, HandCheckedMerges) {
  // Through JSON and back, as a real tokenizer.json is read.
  BpeSpec spec = parse_tokenizer_json(tokenizer_json_string(byte_level_fixture()), "fix");
  EXPECT_EQ(spec.eos_id, -1);  // no template, no usual name
  spec.eos_id = 266;
  HfBpeTokenizer t(spec);
  EXPECT_EQ(t.vocab_size(), 267);
  // "hello" -> l+l (256), h+e (257), he+ll (258), hell+o (262); " world" -> Ġw (259),
  // o+r (260), Ġw+or (261), Ġwor+l (263), Ġworl+d (264).
  EXPECT_EQ(t.encode("hello world", false, false), (std::vector<int>{262, 264}));
  // "hellx": hell (258) then x (120); "!" is byte 33; "1234" -> "123"|"4" -> 12 (265), 3, 4.
  EXPECT_EQ(t.encode("hellx!", false, false), (std::vector<int>{258, 'x', '!'}));
  EXPECT_EQ(t.encode("1234", false, false), (std::vector<int>{265, '3', '4'}));
  // Added token, lstrip eats the spaces before it; EOS appended on request.
  EXPECT_EQ(t.encode("hello  <|eot|>hello", false, true), (std::vector<int>{262, 266, 262, 266}));
  // Unicode: "é" is bytes C3 A9, each a byte-alphabet token.
  EXPECT_EQ(t.encode("\xC3\xA9", false, false), (std::vector<int>{0xC3, 0xA9}));
  EXPECT_EQ(t.decode(t.encode("hello world", false, false)), "hello world");
  EXPECT_EQ(t.decode_token(-1, 266), "");  // special token
  EXPECT_EQ(t.bos(), -1);
}

TEST(BpeByteLevel, RoundTripArbitraryBytes) {
  HfBpeTokenizer t(byte_level_fixture());
  const std::vector<std::string> fixed = {"", " ", "\xF0\x9F\x98\x80\xF0\x9F\x8E\x89 emoji",
                                          "\xFF\xFE broken \xC3", "tab\there\r\n\n end  "};
  for (const auto& s : fixed) EXPECT_EQ(t.decode(t.encode(s, false, false)), s);
  std::mt19937 rng(3);
  for (int it = 0; it < 300; ++it) {
    std::string s;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) s += static_cast<char>(rng() % 256);
    if (s.find("<|eot|>") != std::string::npos) continue;
    EXPECT_EQ(t.decode(t.encode(s, false, false)), s);
  }
}

// SentencePiece-style spec over a tiny alphabet, built from llama2.c-like pieces and scores.
std::pair<std::vector<std::string>, std::vector<float>> tiny_llama2c_vocab() {
  std::vector<std::string> p = {"<unk>", "\n<s>\n", "\n</s>\n"};
  std::vector<float> sc(3, 0.0f);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    p.push_back(buf);
    sc.push_back(0.0f);
  }
  const std::vector<std::string> pieces = {" a",   "ab", " ab", "ba", "aa", " b",
                                           "abab", "a",  "b",   " ",  "c",  "\xC3\xA9"};
  for (size_t i = 0; i < pieces.size(); ++i) {
    p.push_back(pieces[i]);
    sc.push_back(-static_cast<float>(i));
  }
  return {p, sc};
}

TEST(BpeSentencePiece, MatchesLlama2cOnRandomText) {
  auto [pieces, scores] = tiny_llama2c_vocab();
  Llama2cTokenizer ref(pieces, scores);
  const BpeSpec spec = parse_tokenizer_json(
      tokenizer_json_string(sentencepiece_spec_from_llama2c(pieces, scores)), "tiny");
  HfBpeTokenizer t(spec);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  // " ab" merges; "é" is a piece; "x" falls back to its byte <0x78> = 0x78 + 3.
  const int sp_ab = t.token_id(
      "\xE2\x96\x81"
      "ab");
  ASSERT_GE(sp_ab, 0);
  EXPECT_EQ(t.encode("ab", true, false), (std::vector<int>{1, sp_ab}));
  EXPECT_EQ(t.encode("x", false, false), (std::vector<int>{t.token_id("\xE2\x96\x81"), 0x78 + 3}));
  EXPECT_EQ(t.decode(t.encode("ab x \xC3\xA9", true, true)), "ab x \xC3\xA9");
  std::mt19937 rng(11);
  const std::vector<std::string> alphabet = {"a",        "b", " ",  "c",
                                             "\xC3\xA9", "x", "\n", "\xF0\x9F\x98\x80"};
  int same = 0;
  for (int it = 0; it < 500; ++it) {
    std::string s;
    const int n = static_cast<int>(rng() % 25);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    const auto a = ref.encode(s, true, false), b = t.encode(s, true, false);
    same += a == b;
    EXPECT_EQ(a, b) << "text '" << s << "'";
    EXPECT_EQ(t.decode(b), s);
  }
  EXPECT_EQ(same, 500);
}

TEST(BpeSentencePiece, Stories260kTokenizerMatchesLlama2c) {
  const std::string dir = SS_SHARED_DATA_DIR;
  const std::string tok = dir + "/models/stories260K/tok512.bin";
  const std::string text = dir + "/text/tinystories_val.txt";
  if (!std::filesystem::exists(tok) || !std::filesystem::exists(text))
    GTEST_SKIP() << "shared data absent (" << tok << ")";
  auto ref = Llama2cTokenizer::load(tok, 512);
  HfBpeTokenizer t(parse_tokenizer_json(
      tokenizer_json_string(sentencepiece_spec_from_llama2c(ref->vocab(), ref->scores())),
      "tok512"));
  std::ifstream f(text);
  std::string line;
  int lines = 0, same = 0, round = 0;
  while (lines < 200 && std::getline(f, line)) {
    ++lines;
    const auto a = ref->encode(line, true, false), b = t.encode(line, true, false);
    same += a == b;
    round += t.decode(b) == line;
  }
  EXPECT_EQ(lines, 200);
  EXPECT_EQ(same, lines);
  EXPECT_EQ(round, lines);
  std::printf("stories260K tokenizer.json vs tok512.bin: %d/%d lines identical\n", same, lines);
}

TEST(BpeJson, BosEosFromTemplateAndConfig) {
  // Llama-3 layout: BOS from the post-processor template, EOS overridden by
  // tokenizer_config.json; Qwen layout: bos_token null.
  const std::string tj = R"({
    "added_tokens": [
      {"id": 3, "content": "<|begin_of_text|>", "special": true},
      {"id": 4, "content": "<|end_of_text|>", "special": true},
      {"id": 5, "content": "<|eot_id|>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
    "post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [3],
                                                "tokens": ["<|begin_of_text|>"]}}}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": true, "vocab": {"a": 0, "b": 1, "ab": 2},
              "merges": [["a", "b"]]}})";
  const BpeSpec s = parse_tokenizer_json(tj, "llama3");
  EXPECT_EQ(s.split, SplitRegex::kLlama3);
  EXPECT_EQ(s.max_digits, 3);
  EXPECT_TRUE(s.ignore_merges);
  EXPECT_EQ(s.bos_id, 3);
  EXPECT_TRUE(s.add_bos);
  EXPECT_TRUE(HfBpeTokenizer(s).add_bos());  // the Tokenizer interface reports the policy
  {
    BpeSpec off = s;
    off.add_bos = false;  // tokenizer_config.json add_bos_token: false (SmolLM2)
    EXPECT_FALSE(HfBpeTokenizer(off).add_bos());
  }
  EXPECT_EQ(s.eos_id, 4);  // usual name
  HfBpeTokenizer t(s);
  EXPECT_EQ(t.encode("ab<|eot_id|>ba", true, true), (std::vector<int>{3, 2, 5, 1, 0, 4}));
  EXPECT_EQ(t.decode(t.encode("ab<|eot_id|>ba", true, true)), "abba");

  const auto dir = std::filesystem::temp_directory_path() /
                   ("ss_hf_tokenizer_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tj;
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})";
  EXPECT_EQ(load_tokenizer_json(dir.string()).eos_id, 5);
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": null, "add_bos_token": false})";
  const BpeSpec q = load_tokenizer_json((dir / "tokenizer.json").string());
  EXPECT_EQ(q.bos_id, -1);
  EXPECT_FALSE(q.add_bos);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|nope|>"})";
  EXPECT_THROW(load_tokenizer_json(dir.string()), std::runtime_error);
  // pad_token: read by name, written back by tokenizer_config_json_string; unknown names refused.
  std::ofstream(dir / "tokenizer_config.json") << R"({"pad_token": "<|eot_id|>"})";
  BpeSpec p = load_tokenizer_json(dir.string());
  EXPECT_EQ(p.pad_id, 5);
  std::ofstream(dir / "tokenizer_config.json") << tokenizer_config_json_string(p, 64);
  EXPECT_EQ(load_tokenizer_json(dir.string()).pad_id, 5);
  p.pad_id = -1;  // none: no pad_token key
  EXPECT_EQ(tokenizer_config_json_string(p, 64).find("pad_token"), std::string::npos);
  std::ofstream(dir / "tokenizer_config.json") << R"({"pad_token": "<|nope|>"})";
  try {
    load_tokenizer_json(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: pad_token '<|nope|>' is not in"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The message parse_tokenizer_json gives for the tokenizer.json text js named "bad.json"
// ("no error" when it parses).
std::string msg(const std::string& js) {
  try {
    parse_tokenizer_json(js, "bad.json");
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(BpeJson, Errors) {
  EXPECT_NE(msg("{").find("bad.json: invalid JSON"), std::string::npos);
  EXPECT_NE(msg(R"({"model":{"type":"Unigram","vocab":{}}})").find("Unigram"), std::string::npos);
  EXPECT_NE(msg(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},
                   "pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated"}})")
                .find("unsupported pre-tokenizer regex"),
            std::string::npos);
  EXPECT_NE(msg(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a"]}})").find("merge 0"),
            std::string::npos);
  EXPECT_NE(msg(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},
                   "pre_tokenizer":{"type":"Sequence","pretokenizers":[
                     {"type":"Digits","individual_digits":true},
                     {"type":"ByteLevel","add_prefix_space":true}]}})")
                .find("add_prefix_space after a Split/Digits"),
            std::string::npos);
  // A merge whose parts are not in the vocabulary is caught when the tokenizer is built.
  const BpeSpec s = parse_tokenizer_json(
      R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]},
          "pre_tokenizer":{"type":"ByteLevel"}})",
      "m.json");
  EXPECT_THROW(HfBpeTokenizer{s}, std::runtime_error);
  EXPECT_THROW(load_tokenizer_json("/nonexistent/dir/tokenizer.json"), std::runtime_error);
}

// Found by fuzz/tokenizer_json_fuzz.cc: an added token "id": 6.7e108 was converted with
// nlohmann's get<int> (undefined behaviour: UBSan aborts under scripts/sanitize.sh), and
// integer ids beyond int wrapped (2^32 read as 0). Ids are now read as integers in range.
TEST(BpeJson, TokenIdsOutOfIntRangeAreRefused) {
  const std::string model = R"("model":{"type":"BPE","vocab":{"a":0},"merges":[]},
                              "pre_tokenizer":{"type":"ByteLevel"})";
  EXPECT_NE(msg("{" + model + R"(,"added_tokens":[{"id":6.7e108,"content":"<s>"}]})")
                .find("bad.json: added token"),
            std::string::npos);
  EXPECT_NE(msg("{" + model + R"(,"added_tokens":[{"id":4294967296,"content":"<s>"}]})")
                .find("bad.json: added token"),
            std::string::npos);
  EXPECT_NE(msg(R"({"model":{"type":"BPE","vocab":{"a":4294967296},"merges":[]}})")
                .find("bad.json: vocab id 4294967296 out of range"),
            std::string::npos);
  EXPECT_NE(msg("{" + model + R"(,"post_processor":{"type":"TemplateProcessing",
                 "single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],
                 "special_tokens":{"<s>":{"ids":[1e300]}}}})")
                .find("bad.json: post_processor special token '<s>' has id 1e+300, not a token id"),
            std::string::npos)
      << msg("{" + model + R"(,"post_processor":{"type":"TemplateProcessing",
                 "single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],
                 "special_tokens":{"<s>":{"ids":[1e300]}}}})");
}

}  // namespace
}  // namespace scalesweep::model

// Tests of llama2.c -> Hugging Face conversion: same weights, same logits, same tokens.
#include "scalesweep/io/convert.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

using scalesweep::testing::TempDir;

std::vector<float> read_floats(const std::string& path, int64_t offset_floats, int64_t n,
                               int64_t header_bytes) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(header_bytes + offset_floats * 4);
  std::vector<float> v(static_cast<size_t>(n));
  f.read(reinterpret_cast<char*>(v.data()), n * 4);
  EXPECT_TRUE(f.good()) << path;
  return v;
}

// Max |a - b| of the logits of both models over `tokens` (batched prefill and decode).
double max_logit_diff(const model::Weights& a, const model::Weights& b,
                      const std::vector<int>& tokens) {
  auto wa = std::make_shared<const model::Weights>(a);
  auto wb = std::make_shared<const model::Weights>(b);
  model::Transformer ta(wa), tb(wb);
  const int n = static_cast<int>(tokens.size());
  const std::vector<float> la = ta.forward(tokens.data(), n, 0);
  const std::vector<float> lb = tb.forward(tokens.data(), n, 0);
  EXPECT_EQ(la.size(), lb.size());
  double d = 0;
  for (size_t i = 0; i < la.size(); ++i) d = std::max(d, std::fabs(double(la[i]) - lb[i]));
  model::Transformer da(wa), db(wb);
  for (int p = 0; p < std::min(n, 16); ++p) {
    const float* x = da.decode(tokens[static_cast<size_t>(p)], p);
    std::vector<float> xa(x, x + a.config.vocab_size);
    const float* y = db.decode(tokens[static_cast<size_t>(p)], p);
    for (int i = 0; i < a.config.vocab_size; ++i)
      d = std::max(d, std::fabs(double(xa[static_cast<size_t>(i)]) - y[i]));
  }
  return d;
}

// The HF q/k rows are the llama2.c rows de-interleaved per head: HF row h*hd+i is llama2.c
// row h*hd+2i and HF row h*hd+hd/2+i is llama2.c row h*hd+2i+1 (checked on the raw file).
void expect_rotate_half(const std::vector<float>& interleaved, const model::Tensor& hf, int heads,
                        int hd, int cols) {
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < hd / 2; ++i)
      for (int c = 0; c < cols; ++c) {
        const size_t r0 = static_cast<size_t>(h * hd + 2 * i), r1 = r0 + 1;
        const size_t h0 = static_cast<size_t>(h * hd + i), h1 = h0 + static_cast<size_t>(hd / 2);
        ASSERT_EQ(hf.data[h0 * cols + c], interleaved[r0 * cols + c]);
        ASSERT_EQ(hf.data[h1 * cols + c], interleaved[r1 * cols + c]);
      }
}

TEST(Convert, Stories260kSameLogitsAndTokens) {
  const std::string data = SS_SHARED_DATA_DIR;
  const std::string bin = data + "/models/stories260K/stories260K.bin";
  const std::string tok = data + "/models/stories260K/tok512.bin";
  const std::string text = data + "/text/tinystories_val.txt";
  if (!fs::exists(bin) || !fs::exists(tok) || !fs::exists(text))
    GTEST_SKIP() << "shared data absent (" << bin << ")";
  TempDir tmp;
  const std::string out = tmp.sub("stories260K-hf");
  ConvertOptions o;
  o.tokenizer = tok;
  const ConvertReport rep = convert_llama2c_to_hf(bin, out, o);
  EXPECT_EQ(rep.source_format, "llama2c-legacy");
  EXPECT_EQ(rep.parameters, 260032);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;

  LoadedModel a = load_model(bin, tok), b = load_model(out);
  EXPECT_EQ(b.format, "hf");
  ASSERT_NE(b.tokenizer, nullptr);
  const model::Config& c = a.weights.config;
  EXPECT_EQ(b.weights.config.dim, c.dim);
  EXPECT_EQ(b.weights.config.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(b.weights.config.norm_eps, c.norm_eps);
  EXPECT_EQ(b.weights.config.rope_theta, c.rope_theta);
  EXPECT_TRUE(b.weights.config.tied_embeddings);

  // q/k rows against the raw interleaved rows of the llama2.c file (header 7 int32).
  const int64_t dim = c.dim, kv = int64_t{c.n_kv_heads} * c.head_dim, L = c.n_layers;
  const int64_t wq_off = int64_t{c.vocab_size} * dim + L * dim;
  const int64_t wk_off = wq_off + L * dim * dim;
  for (int l = 0; l < c.n_layers; ++l) {
    expect_rotate_half(read_floats(bin, wq_off + l * dim * dim, dim * dim, 28),
                       b.weights.layers[static_cast<size_t>(l)].wq, c.n_heads, c.head_dim, c.dim);
    expect_rotate_half(read_floats(bin, wk_off + l * kv * dim, kv * dim, 28),
                       b.weights.layers[static_cast<size_t>(l)].wk, c.n_kv_heads, c.head_dim,
                       c.dim);
  }

  // Tokenizers agree on the first 200 lines; logits agree on the start of the text.
  std::ifstream f(text);
  std::string line, joined;
  int lines = 0, same = 0;
  while (lines < 200 && std::getline(f, line)) {
    ++lines;
    same += a.tokenizer->encode(line, true, false) == b.tokenizer->encode(line, true, false);
    if (joined.size() < 2000) joined += line + "\n";
  }
  EXPECT_EQ(same, lines);
  std::vector<int> toks = b.tokenizer->encode(joined, true, false);
  ASSERT_EQ(toks, a.tokenizer->encode(joined, true, false));
  toks.resize(std::min<size_t>(toks.size(), 256));
  const double d = max_logit_diff(a.weights, b.weights, toks);
  std::printf(
      "stories260K: tokenizer %d/%d lines identical; max |logit diff| over %zu tokens = %g\n", same,
      lines, toks.size(), d);
  EXPECT_LE(d, 1e-4);
}

void write_tokenizer_bin(const std::string& path, const std::vector<std::string>& pieces,
                         const std::vector<float>& scores) {
  std::ofstream f(path, std::ios::binary);
  int32_t max_len = 0;
  for (const auto& p : pieces) max_len = std::max<int32_t>(max_len, static_cast<int32_t>(p.size()));
  f.write(reinterpret_cast<const char*>(&max_len), 4);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int32_t len = static_cast<int32_t>(pieces[i].size());
    f.write(reinterpret_cast<const char*>(&scores[i]), 4);
    f.write(reinterpret_cast<const char*>(&len), 4);
    f.write(pieces[i].data(), len);
  }
}

// A random Llama model written as llama2.c (v1, untied) with a synthetic tokenizer.bin.
TEST(Convert, SyntheticV1UntiedBf16) {
  TempDir tmp;
  model::Weights w;
  model::Config& c = w.config;
  c.dim = 32, c.hidden_dim = 48, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8;
  c.vocab_size = 300, c.max_seq_len = 64, c.tied_embeddings = false;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  auto fill = [&](model::Tensor& t, std::vector<int64_t> s) {
    float* p = w.alloc(t, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng);
  };
  fill(w.tok_embeddings, {300, 32});
  w.layers.resize(2);
  for (auto& L : w.layers) {
    fill(L.attn_norm, {32}), fill(L.wq, {32, 32}), fill(L.wk, {16, 32}), fill(L.wv, {16, 32});
    fill(L.wo, {32, 32}), fill(L.ffn_norm, {32}), fill(L.w1, {48, 32}), fill(L.w2, {32, 48});
    fill(L.w3, {48, 32});
  }
  fill(w.final_norm, {32});
  fill(w.lm_head, {300, 32});
  const std::string bin = tmp.sub("m.bin");
  save_llama2c(w, bin, Llama2cFormat::kV1);
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    pieces.emplace_back(buf);
  }
  for (const char* p :
       {" the", "th",    "he",   " t",  "e",    "t",   "h",    " ",  "the", "a",  " a",
        "n",    " an",   "an",   "d",   " and", "nd",  "o",    "on", " on", "ce", "c",
        "nce",  " once", "once", "onc", " o",   "e ",  "s",    " s", "x",   "y",  "z",
        "i",    "in",    " in",  "g",   "ng",   "ing", " ing", "r"})
    pieces.emplace_back(p);
  ASSERT_EQ(pieces.size(), 300u);
  std::vector<float> scores(300, 0.0f);
  for (int i = 259; i < 300; ++i) scores[static_cast<size_t>(i)] = -static_cast<float>(i);
  const std::string tokbin = tmp.sub("tok.bin");
  write_tokenizer_bin(tokbin, pieces, scores);

  const std::string out = tmp.sub("hf");
  ConvertOptions o;
  o.tokenizer = tokbin;
  o.dtype = DType::kF32;
  const ConvertReport rep = convert_llama2c_to_hf(bin, out, o);
  EXPECT_EQ(rep.source_format, "llama2c-v1");
  LoadedModel a = load_model(bin, tokbin), b = load_model(out);
  EXPECT_FALSE(b.weights.config.tied_embeddings);
  EXPECT_LE(max_logit_diff(a.weights, b.weights, {1, 5, 200, 260, 299, 3, 7, 42, 280}), 1e-4);
  const std::vector<std::string> texts = {"the once and on", "Once upon a time in the ring",
                                          "x y z \xF0\x9F\x98\x80 and \t\n", "", " "};
  for (const auto& t : texts)
    EXPECT_EQ(a.tokenizer->encode(t, true, true), b.tokenizer->encode(t, true, true)) << t;

  // bf16 output: weights are the bf16 roundings; the logits stay close.
  const std::string out16 = tmp.sub("hf16");
  o.dtype = DType::kBF16;
  o.shard_bytes = 20000;
  convert_llama2c_to_hf(bin, out16, o);
  EXPECT_TRUE(fs::exists(out16 + "/model.safetensors.index.json"));
  LoadedModel b16 = load_model(out16);
  const double d16 = max_logit_diff(a.weights, b16.weights, {1, 5, 200, 260});
  EXPECT_GT(d16, 0.0);
  EXPECT_LT(d16, 0.5);
}

TEST(Convert, ErrorsLeaveNothingBehind) {
  TempDir tmp;
  EXPECT_THROW(convert_llama2c_to_hf(tmp.sub("missing.bin"), tmp.sub("o"), {}), std::exception);
  EXPECT_FALSE(fs::exists(tmp.sub("o")));
  // A tokenizer whose size does not match the model's vocabulary.
  model::Weights w;
  model::Config& c = w.config;
  c.dim = 16, c.hidden_dim = 16, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 2, c.head_dim = 8;
  c.vocab_size = 270, c.max_seq_len = 16;
  auto fill = [&](model::Tensor& t, std::vector<int64_t> s) {
    float* p = w.alloc(t, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.01f * static_cast<float>(i % 7);
  };
  fill(w.tok_embeddings, {270, 16});
  w.layers.resize(1);
  auto& L = w.layers[0];
  fill(L.attn_norm, {16}), fill(L.wq, {16, 16}), fill(L.wk, {16, 16}), fill(L.wv, {16, 16});
  fill(L.wo, {16, 16}), fill(L.ffn_norm, {16}), fill(L.w1, {16, 16}), fill(L.w2, {16, 16});
  fill(L.w3, {16, 16}), fill(w.final_norm, {16});
  w.lm_head = w.tok_embeddings;
  save_llama2c(w, tmp.sub("m.bin"), Llama2cFormat::kLegacy);
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    pieces.emplace_back(buf);
  }
  pieces.emplace_back("a");
  write_tokenizer_bin(tmp.sub("tok.bin"), pieces, std::vector<float>(pieces.size(), 0.0f));
  ConvertOptions o;
  o.tokenizer = tmp.sub("tok.bin");
  EXPECT_THROW(convert_llama2c_to_hf(tmp.sub("m.bin"), tmp.sub("o"), o), std::exception);
  EXPECT_FALSE(fs::exists(tmp.sub("o")));
  // Existing output: refused without overwrite, replaced with it.
  o.tokenizer.clear();
  convert_llama2c_to_hf(tmp.sub("m.bin"), tmp.sub("o"), o);
  EXPECT_FALSE(fs::exists(tmp.sub("o") + "/tokenizer.json"));  // none given or found
  EXPECT_THROW(convert_llama2c_to_hf(tmp.sub("m.bin"), tmp.sub("o"), o), std::exception);
  o.overwrite = true;
  EXPECT_NO_THROW(convert_llama2c_to_hf(tmp.sub("m.bin"), tmp.sub("o"), o));
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace scalesweep::io

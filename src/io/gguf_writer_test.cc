#include "scalesweep/io/gguf_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "io/test_util.h"
#include "model/test_util.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;
using model::testing::TempDir;

using scalesweep::testing::error_of;
using scalesweep::testing::throws_with;

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = nd(rng);
  return x;
}

QuantizedTensor quantized(int64_t rows, int64_t cols, uint64_t seed) {
  const std::vector<float> x = random_matrix(rows, cols, seed);
  QuantConfig cfg;
  cfg.format = TensorFormat::kNvfp4;
  cfg.block = 16;
  cfg.selector.method = Method::kSweepMse;
  return quantize(x.data(), rows, cols, {}, cfg, "w");
}

// E2M1 x E4M3 of element (r, c) straight from the compressed-tensors layout.
float ct_element(const QuantizedTensor& q, int64_t r, int64_t c) {
  const uint8_t b = q.codes[static_cast<size_t>(r * q.packed_cols() + c / 2)];
  const uint8_t code = (c & 1) ? b >> 4 : b & 0xF;
  const uint8_t s = q.scales[static_cast<size_t>(r * q.blocks_per_row() + c / 16)];
  return format::E2M1::decode_f(code) * format::E4M3::decode_f(s);
}

TEST(GgufWriter, EveryMetadataTypeRoundTrips) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("m.gguf");
  GgufWriter w;
  GgufValue u8, i8, u16, i16, i64, f64, nested;
  u8.type = GgufValueType::kU8;
  u8.scalar = uint64_t{200};
  i8.type = GgufValueType::kI8;
  i8.scalar = int64_t{-100};
  u16.type = GgufValueType::kU16;
  u16.scalar = uint64_t{60000};
  i16.type = GgufValueType::kI16;
  i16.scalar = int64_t{-30000};
  i64.type = GgufValueType::kI64;
  i64.scalar = int64_t{-(int64_t{1} << 40)};
  f64.type = GgufValueType::kF64;
  f64.scalar = 0.1;
  nested.type = GgufValueType::kArray;
  nested.elem_type = GgufValueType::kArray;
  nested.array = {gguf_value_i32_array({1, -2}), gguf_value_i32_array({})};
  w.add_kv("t.u8", u8);
  w.add_kv("t.i8", i8);
  w.add_kv("t.u16", u16);
  w.add_kv("t.i16", i16);
  w.add_kv("t.u32", gguf_value_u32(4000000000u));
  w.add_kv("t.i32", gguf_value_i32(-7));
  w.add_kv("t.f32", gguf_value_f32(0.1f));
  w.add_kv("t.bool", gguf_value_bool(true));
  w.add_kv("t.string", gguf_value_string("h\xC3\xA9llo"));
  w.add_kv("t.u64", gguf_value_u64(uint64_t{1} << 63));
  w.add_kv("t.i64", i64);
  w.add_kv("t.f64", f64);
  w.add_kv("t.strs", gguf_value_string_array({"a", "", "b c"}));
  w.add_kv("t.f32s", gguf_value_f32_array({1.5f, -2.0f}));
  w.add_kv("t.nested", nested);
  w.declare("x", GgmlType::kF32, {3});
  w.open(path);
  const float x[3] = {1, 2, 3};
  w.write("x", {reinterpret_cast<const uint8_t*>(x), sizeof x});
  w.commit();

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.find_kv("t.u8")->type, GgufValueType::kU8);
  EXPECT_EQ(f.find_kv("t.i8")->type, GgufValueType::kI8);
  testing::expect_common_scalars(f, "t.");
  EXPECT_EQ(*f.get_int("t.i32"), -7);
  EXPECT_EQ(std::get<uint64_t>(f.find_kv("t.u64")->scalar), uint64_t{1} << 63);
  EXPECT_EQ(*f.get_int("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f.get_float("t.f64"), 0.1);
  EXPECT_EQ(*f.get_string_array("t.strs"), (std::vector<std::string>{"a", "", "b c"}));
  EXPECT_EQ(*f.get_float_array("t.f32s"), (std::vector<double>{1.5, -2.0}));
  const GgufValue* n = f.find_kv("t.nested");
  ASSERT_EQ(n->array.size(), 2u);
  EXPECT_EQ(n->array[0].array.size(), 2u);
  EXPECT_EQ(std::get<int64_t>(n->array[0].array[1].scalar), -2);
  EXPECT_EQ(*f.get_int("general.alignment"), 32);  // added by open()
  EXPECT_EQ(f.dequantize(f.tensors()[0]), (std::vector<float>{1, 2, 3}));
}

TEST(GgufWriter, EveryTensorTypeRoundTrips) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("t.gguf");
  const int64_t rows = 3, cols = 128;
  const std::vector<float> x = random_matrix(rows, cols, 1);
  const QuantizedTensor q = quantized(rows, cols, 2);
  std::vector<uint8_t> f32(x.size() * 4), f16(x.size() * 2), bf16(x.size() * 2);
  std::memcpy(f32.data(), x.data(), f32.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = format::f32_to_f16(x[i]), b = format::f32_to_bf16(x[i]);
    std::memcpy(f16.data() + 2 * i, &h, 2);
    std::memcpy(bf16.data() + 2 * i, &b, 2);
  }
  const std::vector<uint8_t> q8 = encode_q8_0(x.data(), rows * cols);
  const std::vector<uint8_t> nv = encode_ggml_nvfp4(q);
  GgufWriter w(64);
  w.declare("f32", GgmlType::kF32, {cols, rows});
  w.declare("f16", GgmlType::kF16, {cols, rows});
  w.declare("bf16", GgmlType::kBF16, {cols, rows});
  w.declare("q8", GgmlType::kQ8_0, {cols, rows});
  w.declare("nv", GgmlType::kNVFP4, {cols, rows});
  w.open(path);
  w.write("f32", f32);
  w.write("f16", f16);
  w.write("bf16", bf16);
  w.write("q8", q8);
  w.write("nv", nv);
  w.commit();
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.dequantize(*f.find_tensor("f32")), x);
  const std::vector<float> h = f.dequantize(*f.find_tensor("f16"));
  const std::vector<float> b = f.dequantize(*f.find_tensor("bf16"));
  const std::vector<float> q8d = f.dequantize(*f.find_tensor("q8"));
  const std::vector<float> nvd = f.dequantize(*f.find_tensor("nv"));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      ASSERT_EQ(h[i], format::f16_to_f32(format::f32_to_f16(x[i])));
      ASSERT_EQ(b[i], format::bf16_to_f32(format::f32_to_bf16(x[i])));
      // Q8_0: d = amax/127 as f16, so the error is at most half a step (plus d's rounding).
      float amax = 0;
      for (int64_t j = c / 32 * 32; j < c / 32 * 32 + 32; ++j)
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * cols + j)]));
      ASSERT_LE(std::fabs(q8d[i] - x[i]), amax / 127 * 0.51f) << i;
      // NVFP4: the ggml decode, the plain reference and the CT layout agree exactly.
      ASSERT_EQ(nvd[i], ct_element(q, r, c)) << r << "," << c;
      ASSERT_EQ(ggml_nvfp4_element(nv.data(), cols, r, c), ct_element(q, r, c));
    }
}

// A tensor written in parts (uneven, an empty one among them) gives the file written whole,
// padding included; more than declared, or a tensor left half written, is refused by name
// and no file appears.
TEST(GgufWriter, TensorInPartsEqualsTensorWhole) {
  TempDir d("ss_gguf_writer_");
  const std::vector<float> x = random_matrix(5, 64, 3);
  std::vector<uint8_t> a(x.size() * 4), b(6 * 4, 7);
  std::memcpy(a.data(), x.data(), a.size());
  auto declare = [](GgufWriter& w) {
    w.declare("a", GgmlType::kF32, {64, 5});
    w.declare("b", GgmlType::kF32, {6});
  };
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  {
    GgufWriter whole(64), parts(64);
    declare(whole);
    declare(parts);
    whole.open(d.sub("whole.gguf"));
    parts.open(d.sub("parts.gguf"));
    whole.write("a", a);
    whole.write("b", b);
    const std::span<const uint8_t> s(a);
    parts.write_part("a", s.subspan(0, 100));
    parts.write_part("a", s.subspan(100, 0));
    parts.write_part("a", s.subspan(100));
    parts.write_part("b", b);
    EXPECT_EQ(whole.commit(), parts.commit());
  }
  EXPECT_EQ(slurp(d.sub("whole.gguf")), slurp(d.sub("parts.gguf")));
  GgufWriter bad(64);
  declare(bad);
  bad.open(d.sub("bad.gguf"));
  bad.write_part("a", std::span<const uint8_t>(a).subspan(0, 1000));
  EXPECT_TRUE(throws_with<IoError>(
      [&] { bad.write_part("a", std::span<const uint8_t>(a).subspan(0, 281)); },
      "tensor 'a' has 1281 bytes or more, declared 1280"));
  EXPECT_TRUE(
      throws_with<IoError>([&] { bad.commit(); }, "not written whole (1000 of 1280 bytes)"));
  EXPECT_FALSE(std::filesystem::exists(d.sub("bad.gguf")));
}

TEST(GgufWriter, Q8_0MatchesGgmlReference) {
  // Hand-checked block: amax 127 -> d = 1 exactly, q = round half away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  const std::vector<uint8_t> q = encode_q8_0(x.data(), 32);
  ASSERT_EQ(q.size(), 34u);
  EXPECT_EQ(q[0] | (q[1] << 8), 0x3C00);  // f16 1.0
  EXPECT_EQ(static_cast<int8_t>(q[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(q[3]), 3);
  EXPECT_EQ(static_cast<int8_t>(q[4]), -3);
  EXPECT_EQ(static_cast<int8_t>(q[5]), 0);
  const std::vector<float> z(32, 0.0f);
  const std::vector<uint8_t> qz = encode_q8_0(z.data(), 32);
  for (uint8_t v : qz) EXPECT_EQ(v, 0);
  EXPECT_TRUE(throws_with([&] { encode_q8_0(x.data(), 31); }, "not whole blocks"));
}

TEST(GgufWriter, Nvfp4EncodeDecodeIsLossless) {
  const QuantizedTensor q = quantized(5, 192, 3);
  const std::vector<uint8_t> g = encode_ggml_nvfp4(q);
  EXPECT_EQ(g.size(), 5u * 3 * 36);
  const QuantizedTensor back = decode_ggml_nvfp4(g.data(), 5, 192, q.global_scale);
  EXPECT_EQ(back.codes, q.codes);
  EXPECT_EQ(back.scales, q.scales);
  EXPECT_EQ(back.global_scale, q.global_scale);
  // The nibble layout is ggml's (j, j+8), not compressed-tensors' adjacent pairs.
  EXPECT_EQ(g[4] & 0xF, q.codes[0] & 0xF);  // element 0
  EXPECT_EQ(g[4] >> 4, q.codes[4] & 0xF);   // element 8
  EXPECT_EQ(g[0], q.scales[0]);
}

TEST(GgufWriter, QkRowOrderIsLlamaCppPermuteAndInverts) {
  const int heads = 3, hd = 8;
  const int64_t cols = 5, rows = heads * hd;
  const std::vector<float> hf = random_matrix(rows, cols, 4);
  std::vector<float> ours(hf.size()), ref(hf.size()), back(hf.size());
  const std::vector<int64_t> order = gguf_qk_row_order(heads, hd);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ours[r * cols + c] = hf[order[r] * cols + c];
  permute_rope_rows(hf.data(), ref.data(), heads, hd, cols, /*to_hf=*/false);
  EXPECT_EQ(ours, ref);
  gguf_unpermute_qk_rows(ours.data(), back.data(), heads, hd, cols);
  EXPECT_EQ(back, hf);
  const std::vector<int64_t> inv = gguf_qk_row_order_inverse(heads, hd);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(inv[order[r]], r);
  // Whole NVFP4 rows move with the permutation (codes and block scales).
  const QuantizedTensor q = quantized(rows, 64, 5);
  const std::vector<uint8_t> g = encode_ggml_nvfp4(q, order);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 64; ++c)
      ASSERT_EQ(ggml_nvfp4_element(g.data(), 64, r, c), ct_element(q, order[r], c));
}

TEST(GgufWriter, OutputLargerThanTheFreeSpaceIsRefusedAtOpen) {
  TempDir d("ss_gguf_writer_");
  GgufWriter w;
  w.declare("big", GgmlType::kF32, {int64_t{1} << 48});  // 1 PiB
  const std::string m = error_of([&] { w.open(d.sub("big.gguf")); });
  EXPECT_NE(m.find("big.gguf: the output needs about"), std::string::npos) << m;
  EXPECT_FALSE(std::filesystem::exists(d.sub("big.gguf")));
}

TEST(GgufWriter, Refusals) {
  GgufWriter w;
  w.add_kv("a", gguf_value_u32(1));
  EXPECT_TRUE(throws_with([&] { w.add_kv("a", gguf_value_u32(2)); }, "key 'a' is repeated"));
  EXPECT_TRUE(throws_with(
      [&] {
        w.declare("n", GgmlType::kNVFP4, {96, 2});
      },
      "tensor 'n': row length 96 is not a multiple of the NVFP4 block of 64"));
  EXPECT_TRUE(throws_with([&] { w.declare("z", GgmlType::kF32, {0}); }, "dimension 0 is 0"));
  EXPECT_NE(error_of([] { GgufWriter bad(24); }).find("not a power of two"), std::string::npos);
  GgufValue wrong = gguf_value_u32(1);
  wrong.scalar = std::string("x");
  TempDir d("ss_gguf_writer_");
  {
    GgufWriter w2;
    w2.add_kv("k", wrong);
    EXPECT_TRUE(throws_with([&] { w2.open(d.sub("x.gguf")); },
                            "key 'k': value does not match its type u32"));
  }
  GgufWriter w3;
  w3.declare("a", GgmlType::kF32, {2});
  w3.declare("b", GgmlType::kF32, {2});
  w3.open(d.sub("y.gguf"));
  const std::vector<uint8_t> eight(8), four(4);
  EXPECT_TRUE(throws_with([&] { w3.write("b", eight); },
                          "tensor 'b' written out of order (expected 'a', tensor 0)"));
  EXPECT_TRUE(throws_with([&] { w3.write("a", four); }, "has 4 bytes, declared 8"));
  w3.write("a", eight);
  EXPECT_TRUE(throws_with([&] { w3.commit(); }, "tensor 'b' (tensor 1) was not written"));
  QuantizedTensor q = quantized(2, 48, 6);
  EXPECT_TRUE(throws_with([&] { encode_ggml_nvfp4(q); }, "multiple of 64 (got 48)"));
}

// ---- the model writer ---------------------------------------------------------------------------

model::Config gguf_config(bool tied) {
  model::Config c = model::testing::tiny_config(tied);
  c.dim = 64;
  c.hidden_dim = 96;  // down_proj's row length 96: dense
  c.head_dim = 16;
  return c;
}

struct Written {
  model::Weights src;
  std::vector<std::vector<QuantizedTensor>> q;  // [layer][linear] (dense ones: empty)
  model::LinearSet dense;                       // the spec's dense Linears
};

GgufModelSpec model_spec(const model::Config& c, GgufDense dt,
                         GgufQwen2As qwen2_as = GgufQwen2As::kLlama) {
  GgufModelSpec s;
  s.config = c;
  s.write_lm_head = !c.tied_embeddings;
  s.qwen2_as = qwen2_as;
  for (model::LinearId id : kAllLinears)  // down_proj (96 columns), qwen2's FFN as qwen2
    if (!gguf_nvfp4_obstacle(c, id, qwen2_as).empty()) s.dense.add_every_layer(id);
  s.dense_type = dt;
  s.name = "tiny";
  s.source = "test";
  return s;
}

// `extra_dense`: Linears stored dense besides those ggml cannot store as NVFP4.
Written write_model(const std::string& path, const model::Config& c, GgufDense dt,
                    const std::optional<ChatMeta>& chat = std::nullopt,
                    const model::LinearSet& extra_dense = {},
                    GgufQwen2As qwen2_as = GgufQwen2As::kLlama) {
  Written out;
  out.src = model::testing::random_model(c, 7);
  GgufModelSpec spec = model_spec(c, dt, qwen2_as);
  spec.chat = chat;
  spec.dense.add(extra_dense);
  out.dense = spec.dense;
  GgufModelWriter w(path, spec);
  w.write_embeddings(out.src.tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    const model::LayerWeights& lw = out.src.layers[static_cast<size_t>(l)];
    std::vector<QuantizedTensor> qs(7);
    std::vector<CheckpointLinear> cl;
    for (size_t i = 0; i < 7; ++i) {
      const model::LinearId id = kAllLinears[i];
      if (out.dense.contains(l, id)) {
        cl.push_back({id, nullptr, std::nullopt});
        continue;
      }
      const model::Tensor& t = linear_weight(lw, id);
      QuantConfig cfg;
      cfg.format = TensorFormat::kNvfp4;
      cfg.block = 16;
      qs[i] = quantize(t.data, t.shape[0], t.shape[1], {}, cfg, "w");
      cl.push_back({id, &qs[i], std::nullopt});
    }
    w.write_layer(l, lw, cl);
    out.q.push_back(std::move(qs));
  }
  w.write_head(out.src.final_norm, out.src.lm_head);
  w.commit();
  return out;
}

// write_model's file (f32 dense Linears) and the file opened.
struct WrittenGguf {
  Written wr;
  GgufFile f;
};
WrittenGguf write_and_open(const std::string& path, const model::Config& c,
                           GgufQwen2As qwen2_as = GgufQwen2As::kLlama) {
  Written wr = write_model(path, c, GgufDense::kF32, std::nullopt, {}, qwen2_as);
  return {std::move(wr), GgufFile::open(path)};
}

// Our reader gives back the config and, bit for bit, every tensor the writer received: dense
// ones as written (f32), NVFP4 ones as fl(E2M1 x E4M3 x fl(1/gs)), q/k rows in HF order.
void expect_reads_back(const std::string& path, const model::Config& c, const Written& wr) {
  const model::Weights w = load_gguf(path);
  const model::Config& g = w.config;
  testing::expect_same_config(g, c);
  EXPECT_EQ(model::to_f32(w.tok_embeddings), model::to_f32(wr.src.tok_embeddings));
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = w.layers[static_cast<size_t>(l)];
    const auto& S = wr.src.layers[static_cast<size_t>(l)];
    EXPECT_EQ(model::to_f32(L.attn_norm), model::to_f32(S.attn_norm));
    for (auto [a, b] : {std::pair{&L.bq, &S.bq},
                        {&L.bk, &S.bk},
                        {&L.bv, &S.bv},
                        {&L.q_norm, &S.q_norm},
                        {&L.k_norm, &S.k_norm}}) {
      ASSERT_EQ(a->present(), b->present());
      if (a->present()) {
        EXPECT_EQ(model::to_f32(*a), model::to_f32(*b));
      }
    }
    for (size_t i = 0; i < 7; ++i) {
      const model::LinearId id = kAllLinears[i];
      if (wr.dense.contains(l, id)) {  // dense, f32
        EXPECT_EQ(model::to_f32(linear_weight(L, id)), model::to_f32(linear_weight(S, id)));
        continue;
      }
      const QuantizedTensor& q = wr.q[static_cast<size_t>(l)][i];
      const std::vector<float> got = model::to_f32(linear_weight(L, id));
      const std::vector<float> ct = dequantize(q);  // fl(q*s / gs)
      const float scale = 1.0f / q.global_scale;
      for (int64_t r = 0; r < q.rows; ++r)
        for (int64_t cc = 0; cc < q.cols; ++cc) {
          const size_t k = static_cast<size_t>(r * q.cols + cc);
          ASSERT_EQ(got[k], ct_element(q, r, cc) * scale) << l << " " << i << " " << k;
          ASSERT_NEAR(got[k], ct[k], std::fabs(ct[k]) * 2.5e-7f);
        }
    }
  }
}

TEST(GgufModelWriter, OurLoaderReadsWhatWasQuantized) {
  TempDir d("ss_gguf_writer_");
  for (bool tied : {true, false}) {
    const std::string path = d.sub(tied ? "tied.gguf" : "untied.gguf");
    const model::Config c = gguf_config(tied);
    const auto [wr, f] = write_and_open(path, c);
    EXPECT_EQ(*f.get_int("general.file_type"), 39);
    EXPECT_EQ(*f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.find_tensor("output.weight") == nullptr, tied);
    EXPECT_EQ(f.find_tensor("blk.0.ffn_down.scale"), nullptr);
    ASSERT_NE(f.find_tensor("blk.1.attn_q.scale"), nullptr);
    expect_reads_back(path, c, wr);
  }
}

TEST(GgufModelWriter, ChatMetaKeysAndOutOfVocabularyIds) {
  TempDir d("ss_gguf_writer_");
  const model::Config c = gguf_config(true);
  GgufModelSpec s = model_spec(c, GgufDense::kF32);
  ChatMeta m;
  m.chat_template = "{{ messages }}";
  m.eos_ids = {2, 3};
  m.sampling.top_k = 40;
  s.chat = m;
  const std::string path = d.sub("chat.gguf");
  write_model(path, c, GgufDense::kF32, m);
  const GgufFile f = GgufFile::open(path);
  ChatMeta want = m;
  want.bos_id = c.bos_token_id;  // the config's, added by the writer without a tokenizer
  EXPECT_EQ(chat_meta_from_gguf(f.metadata(), path), want);
  // Out-of-vocabulary ids are refused before anything is written.
  m.eos_ids = {2, c.vocab_size};
  s.chat = m;
  const std::string e = error_of([&] { GgufModelWriter w(d.sub("bad.gguf"), s); });
  EXPECT_NE(e.find("test: tokenizer.ggml.eot_token_id " + std::to_string(c.vocab_size) +
                   " (from its generation config) is outside the vocabulary"),
            std::string::npos)
      << e;
  size_t files = 0;  // chat.gguf only: no output, no temporary file left
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(d.p)) ++files;
  EXPECT_EQ(files, 1u);
}

model::Config qwen2_config() {
  model::Config c = gguf_config(false);
  c.arch = model::Arch::kQwen2;
  c.qkv_bias = true;
  c.rope_theta = 1e6f;
  return c;
}

model::Config qwen3_config() {
  model::Config c = gguf_config(true);
  c.arch = model::Arch::kQwen3;
  c.qk_norm = true;
  c.head_dim = 32;  // 4 x 32 != dim 64: key_length / value_length
  return c;
}

model::Config llama3_rope_config() {
  model::Config c = gguf_config(false);
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = model::RopeType::kLlama3;
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

// The raw NVFP4 rows of `name` in the file, as compressed-tensors codes.
QuantizedTensor raw_nvfp4(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  return decode_ggml_nvfp4(t->data, t->ne[1], t->ne[0], 1.0f);
}

const GgufTensorInfo& tensor(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) throw std::runtime_error("no tensor " + name);
  return *t;
}

TEST(GgufModelWriter, Qwen2HasBiasesUnpermutedRowsAndAnUntiedHead) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("qwen2.gguf");
  const model::Config c = qwen2_config();
  const auto [wr, f] = write_and_open(path, c, GgufQwen2As::kQwen2);
  EXPECT_EQ(*f.get_string("general.architecture"), "qwen2");
  EXPECT_EQ(*f.get_int("qwen2.block_count"), c.n_layers);
  EXPECT_EQ(*f.get_float("qwen2.rope.freq_base"), 1e6);
  EXPECT_FALSE(f.get_int("llama.block_count"));
  EXPECT_FALSE(f.get_int("qwen2.attention.key_length"));  // 4 x 16 == dim
  for (const char* b : {"attn_q", "attn_k", "attn_v"}) {
    const GgufTensorInfo& t = tensor(f, std::string("blk.1.") + b + ".bias");
    EXPECT_EQ(t.type, static_cast<uint32_t>(GgmlType::kF32));
    EXPECT_EQ(t.ne, std::vector<int64_t>{std::string(b) == "attn_q" ? 64 : 32}) << b;
  }
  EXPECT_EQ(f.find_tensor("blk.0.attn_output.bias"), nullptr);
  EXPECT_EQ(tensor(f, "output.weight").type, static_cast<uint32_t>(GgmlType::kF32));
  // No q/k permutation: the file's rows are the source's.
  const QuantizedTensor& q = wr.q[0][static_cast<size_t>(model::LinearId::kQ)];
  EXPECT_EQ(raw_nvfp4(f, "blk.0.attn_q.weight").codes, q.codes);
  EXPECT_EQ(raw_nvfp4(f, "blk.0.attn_q.weight").scales, q.scales);
  expect_reads_back(path, c, wr);
}

// Mixture-of-experts models in llama.cpp's layout: qwen3moe (q/k norms, expert width
// expert_feed_forward_length) and Mixtral as llama with expert_count (q/k rows permuted). Each
// projection's experts are one stacked NVFP4 tensor with a per-expert `.scale` {E} of 1/gs;
// the router is F32. Our reader gives back every expert's weights as fl(E2M1 x E4M3 x scale_e)
// and the router exactly, whether the experts stay as ggml blocks or are dequantized.
TEST(GgufModelWriter, MixtureOfExpertsStackedWithPerExpertScales) {
  TempDir d("ss_gguf_writer_");
  for (const model::Arch arch : {model::Arch::kQwen3Moe, model::Arch::kMixtral}) {
    model::Config c =
        testing::with_experts(gguf_config(false), arch, 4, 2, 128, /*norm_topk=*/true);
    c.qk_norm = arch == model::Arch::kQwen3Moe;
    const std::string path = d.sub(std::string(model::kArchNames.name(arch)) + ".gguf");
    const model::Weights src = model::testing::random_model(c, 11);
    GgufModelSpec spec = model_spec(c, GgufDense::kF32);
    EXPECT_TRUE(spec.dense.empty());  // every Linear NVFP4 (the experts' rows: 64 and 128)
    std::vector<std::vector<QuantizedTensor>> qs(static_cast<size_t>(c.n_layers));
    {
      GgufModelWriter w(path, spec);
      w.write_embeddings(src.tok_embeddings);
      for (int l = 0; l < c.n_layers; ++l) {
        const model::LayerWeights& lw = src.layers[static_cast<size_t>(l)];
        auto& q = qs[static_cast<size_t>(l)];
        q.resize(4 + 3 * static_cast<size_t>(c.n_experts));
        std::vector<CheckpointLinear> cl;
        QuantConfig cfg;
        cfg.format = TensorFormat::kNvfp4;
        cfg.block = 16;
        const auto add = [&](model::LinearId id, const model::Tensor& t, int e) {
          q[cl.size()] = quantize(t.data, t.shape[0], t.shape[1], {}, cfg, "w");
          cl.push_back({id, &q[cl.size()], std::nullopt, e});
        };
        for (size_t i = 0; i < 4; ++i) add(kAllLinears[i], linear_weight(lw, kAllLinears[i]), -1);
        for (int e = 0; e < c.n_experts; ++e) {
          const auto& x = lw.experts[static_cast<size_t>(e)];
          add(model::LinearId::kGate, x.w1, e);
          add(model::LinearId::kUp, x.w3, e);
          add(model::LinearId::kDown, x.w2, e);
        }
        w.write_layer(l, lw, cl);
      }
      w.write_head(src.final_norm, src.lm_head);
      w.commit();
    }
    const GgufFile f = GgufFile::open(path);
    const std::string a = arch == model::Arch::kMixtral ? "llama" : "qwen3moe";
    EXPECT_EQ(*f.get_string("general.architecture"), a);
    EXPECT_EQ(*f.get_int(a + ".expert_count"), 4);
    EXPECT_EQ(*f.get_int(a + ".expert_used_count"), 2);
    EXPECT_EQ(f.get_int(a + ".expert_feed_forward_length").has_value(),
              arch == model::Arch::kQwen3Moe);
    EXPECT_EQ(tensor(f, "blk.1.ffn_gate_exps.weight").ne, (std::vector<int64_t>{64, 128, 4}));
    EXPECT_EQ(tensor(f, "blk.1.ffn_down_exps.weight").ne, (std::vector<int64_t>{128, 64, 4}));
    EXPECT_EQ(tensor(f, "blk.1.ffn_up_exps.scale").ne, std::vector<int64_t>{4});
    EXPECT_EQ(tensor(f, "blk.0.ffn_gate_inp.weight").type, static_cast<uint32_t>(GgmlType::kF32));
    EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight"), nullptr);
    for (const bool stored : {true, false}) {  // ggml blocks in the mapping, or dequantized
      const auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
      const model::Weights w = load_gguf_weights(*file, stored ? file : nullptr);
      EXPECT_EQ(w.config.arch, arch);
      EXPECT_EQ(w.config.n_experts, 4);
      EXPECT_EQ(w.config.moe_hidden_dim, 128);
      for (int l = 0; l < c.n_layers; ++l) {
        const model::LayerWeights& L = w.layers[static_cast<size_t>(l)];
        const model::LayerWeights& S = src.layers[static_cast<size_t>(l)];
        EXPECT_EQ(model::to_f32(L.router), model::to_f32(S.router));
        for (int e = 0; e < c.n_experts; ++e) {
          const auto& x = L.experts[static_cast<size_t>(e)];
          for (const auto& [t, k] : {std::pair{&x.w1, 0}, {&x.w3, 1}, {&x.w2, 2}}) {
            const QuantizedTensor& q = qs[static_cast<size_t>(l)][4 + 3 * e + k];
            const std::vector<float> got = model::to_f32(*t);
            ASSERT_EQ(got.size(), static_cast<size_t>(q.rows * q.cols));
            const float scale = 1.0f / q.global_scale;
            for (int64_t r = 0; r < q.rows; ++r)
              for (int64_t cc = 0; cc < q.cols; ++cc)
                ASSERT_EQ(got[static_cast<size_t>(r * q.cols + cc)], ct_element(q, r, cc) * scale)
                    << a << " layer " << l << " expert " << e << " " << k << " stored " << stored;
          }
        }
      }
    }
  }
  // What llama.cpp's MoE graphs cannot run is refused before anything is written.
  model::Config c = testing::with_experts(gguf_config(false), model::Arch::kQwen3Moe, 4, 2, 96,
                                          /*norm_topk=*/true);
  c.qk_norm = true;
  EXPECT_TRUE(throws_with([&] { check_gguf_config(c, "m"); }, "expert down row length 96"));
  c.moe_hidden_dim = 128;
  c.norm_topk_prob = false;
  EXPECT_TRUE(throws_with([&] { check_gguf_config(c, "m"); }, "norm_topk_prob = false"));
  c.norm_topk_prob = true;
  c.moe_sparse_step = 2;
  EXPECT_TRUE(throws_with([&] { check_gguf_config(c, "m"); }, "layer 0 has a dense MLP"));
}

// A Qwen2 model stored as llama (the default): every Linear NVFP4 with its .scale, q/k rows and
// the q/k biases permuted as llama's, the source architecture recorded; our reader gives the
// Qwen2 model back (biases in HF order, every weight as quantized).
TEST(GgufModelWriter, Qwen2StoredAsLlama) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("qwen2-llama.gguf");
  model::Config c = qwen2_config();
  c.hidden_dim = 128;  // FFN rows of whole super-blocks
  const Written wr = write_model(path, c, GgufDense::kF32);
  EXPECT_TRUE(wr.dense.empty());
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(*f.get_string("general.architecture"), "llama");
  EXPECT_EQ(*f.get_string(kGgufSourceArchKey), "qwen2");
  EXPECT_EQ(*f.get_int("llama.block_count"), c.n_layers);
  EXPECT_EQ(*f.get_float("llama.rope.freq_base"), 1e6);
  ASSERT_NE(f.find_tensor("blk.1.ffn_down.scale"), nullptr);
  EXPECT_EQ(tensor(f, "blk.1.ffn_gate.weight").type, static_cast<uint32_t>(GgmlType::kNVFP4));
  const std::vector<int64_t> order = gguf_qk_row_order(c.n_heads, c.head_dim);
  const auto bias = [&](const char* n) {
    const GgufTensorInfo& t = tensor(f, n);
    const auto* x = reinterpret_cast<const float*>(t.data);
    return std::vector<float>(x, x + t.ne[0]);
  };
  const std::vector<float> bq = bias("blk.0.attn_q.bias"), src = model::to_f32(wr.src.layers[0].bq);
  for (size_t g = 0; g < bq.size(); ++g) EXPECT_EQ(bq[g], src[static_cast<size_t>(order[g])]) << g;
  expect_reads_back(path, c, wr);
  // An unknown source architecture is refused by name.
  GgufMetadata m = f.metadata();
  for (auto& [k, v] : m)
    if (k == kGgufSourceArchKey) v = gguf_value_string("qwen3");
  EXPECT_TRUE(throws_with(
      [&] {
        gguf_model_config(
            m, [](std::string_view) { return true; }, "x");
      },
      "'scalesweep.architecture' = 'qwen3' with general.architecture 'llama'"));
}

TEST(GgufModelWriter, LlamaRowsArePermuted) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("llama.gguf");
  const auto [wr, f] = write_and_open(path, gguf_config(true));
  const QuantizedTensor& k = wr.q[0][static_cast<size_t>(model::LinearId::kK)];
  const QuantizedTensor raw = raw_nvfp4(f, "blk.0.attn_k.weight");
  EXPECT_NE(raw.codes, k.codes);
  const std::vector<uint8_t> e = encode_ggml_nvfp4(k, gguf_qk_row_order(2, 16));
  EXPECT_EQ(raw.codes, decode_ggml_nvfp4(e.data(), k.rows, k.cols, 1.0f).codes);
}

TEST(GgufModelWriter, Qwen3HasQkNormsAndKeyLength) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("qwen3.gguf");
  const model::Config c = qwen3_config();
  const auto [wr, f] = write_and_open(path, c);
  EXPECT_EQ(*f.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(*f.get_int("qwen3.attention.key_length"), 32);
  EXPECT_EQ(*f.get_int("qwen3.attention.value_length"), 32);
  EXPECT_EQ(*f.get_int("qwen3.rope.dimension_count"), 32);
  for (const char* n : {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"}) {
    EXPECT_EQ(tensor(f, n).type, static_cast<uint32_t>(GgmlType::kF32)) << n;
    EXPECT_EQ(tensor(f, n).ne, std::vector<int64_t>{32}) << n;
  }
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.bias"), nullptr);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(tensor(f, "blk.0.attn_q.weight").ne, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(raw_nvfp4(f, "blk.0.attn_k.weight").codes,
            wr.q[0][static_cast<size_t>(model::LinearId::kK)].codes);
  expect_reads_back(path, c, wr);
}

TEST(GgufModelWriter, Llama3RopeIsTheRopeFreqsTensor) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("llama3.gguf");
  const model::Config c = llama3_rope_config();
  const auto [wr, f] = write_and_open(path, c);
  const GgufTensorInfo& t = tensor(f, "rope_freqs.weight");
  ASSERT_EQ(t.type, static_cast<uint32_t>(GgmlType::kF32));
  ASSERT_EQ(t.ne, std::vector<int64_t>{8});
  std::vector<float> got(8);
  std::memcpy(got.data(), t.data, 32);
  EXPECT_EQ(got, gguf_llama3_rope_factors(c));
  // head_dim 16, theta 5e5: wavelengths 2 pi x 5e5^(i/8): i = 0..3 below 2048 (factor 1),
  // i = 4 (4494) between, i = 5..7 above 8192 (factor 8).
  EXPECT_EQ(got[3], 1.0f);
  EXPECT_GT(got[4], 1.0f);
  EXPECT_LT(got[4], 8.0f);
  EXPECT_EQ(got[5], 8.0f);
  EXPECT_FALSE(f.get_string("llama.rope.scaling.type"));  // the converter writes no rope keys
  EXPECT_EQ(*f.get_float_array(kGgufLlama3RopeKey), (std::vector<double>{8, 1, 4, 8192}));
  expect_reads_back(path, c, wr);
}

TEST(GgufModelWriter, LinearAndYarnRopeKeys) {
  TempDir d("ss_gguf_writer_");
  model::Config c = gguf_config(true);
  c.rope_scaling.type = model::RopeType::kLinear;
  c.rope_scaling.factor = 2.0f;
  Written wr = write_model(d.sub("linear.gguf"), c, GgufDense::kF32);
  GgufFile f = GgufFile::open(d.sub("linear.gguf"));
  EXPECT_EQ(*f.get_string("llama.rope.scaling.type"), "linear");
  EXPECT_EQ(*f.get_float("llama.rope.scaling.factor"), 2.0);
  expect_reads_back(d.sub("linear.gguf"), c, wr);
  c = qwen2_config();
  c.rope_scaling.type = model::RopeType::kYarn;
  c.rope_scaling.factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.rope_scaling.beta_fast = 8.0f;
  c.rope_scaling.attention_factor = 0.1f * std::log(4.0f) + 1.0f;
  wr = write_model(d.sub("yarn.gguf"), c, GgufDense::kF32);
  f = GgufFile::open(d.sub("yarn.gguf"));
  // qwen2, stored as llama (the default): the llama.* keys.
  EXPECT_EQ(*f.get_string("llama.rope.scaling.type"), "yarn");
  EXPECT_EQ(*f.get_float("llama.rope.scaling.factor"), 4.0);
  EXPECT_EQ(*f.get_int("llama.rope.scaling.original_context_length"), 64);
  EXPECT_EQ(*f.get_float("llama.rope.scaling.yarn_beta_fast"), 8.0);
  EXPECT_EQ(*f.get_float("llama.rope.scaling.yarn_beta_slow"), 1.0);
  expect_reads_back(d.sub("yarn.gguf"), c, wr);
}

TEST(GgufModelWriter, OurLoaderRefusesABadScale) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("m.gguf");
  write_model(path, gguf_config(true), GgufDense::kF32);
  uint64_t off = 0;
  {
    const GgufFile f = GgufFile::open(path);
    off = f.data_offset() + f.find_tensor("blk.1.ffn_up.scale")->offset;
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    const float nan = std::nanf("");
    f.write(reinterpret_cast<const char*>(&nan), 4);
  }
  EXPECT_NE(
      error_of([&] { load_gguf(path); }).find("tensor 'blk.1.ffn_up.scale' = nan is not finite"),
      std::string::npos);
}

TEST(GgufModelWriter, Q8_0DenseTypeAndF32Norms) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("q8.gguf");
  write_model(path, gguf_config(false), GgufDense::kQ8_0);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->type, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(f.find_tensor("output.weight")->type, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type,
            static_cast<uint32_t>(GgmlType::kQ8_0));  // 96 % 32 == 0
  EXPECT_EQ(f.find_tensor("blk.0.attn_norm.weight")->type, static_cast<uint32_t>(GgmlType::kF32));
  EXPECT_EQ(gguf_dense_type_for(GgufDense::kQ8_0, 96), GgmlType::kQ8_0);
  EXPECT_EQ(gguf_dense_type_for(GgufDense::kQ8_0, 48), GgmlType::kF16);
  EXPECT_EQ(gguf_dense_type_for(GgufDense::kQ8_0, 172), GgmlType::kF16);
}

// A Linear dense in one layer only (mixed precision): Q8_0 there, NVFP4 + .scale in every other
// layer; the global-scale record counts the NVFP4 Linears; our loader reads every layer back.
TEST(GgufModelWriter, ADenseLinearInOneLayerOnly) {
  TempDir d("ss_gguf_writer_");
  const model::Config c = gguf_config(false);
  ASSERT_GE(c.n_layers, 2);
  model::LinearSet one;
  one.add(1, model::LinearId::kV);
  const std::string q8 = d.sub("q8.gguf");
  const Written wq = write_model(q8, c, GgufDense::kQ8_0, std::nullopt, one);
  const GgufFile f = GgufFile::open(q8);
  EXPECT_EQ(*f.get_int("general.file_type"), 39);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string v = gguf_linear_name(l, model::LinearId::kV);
    const bool dense = l == 1;
    EXPECT_EQ(f.find_tensor(v + ".weight")->type,
              static_cast<uint32_t>(dense ? GgmlType::kQ8_0 : GgmlType::kNVFP4))
        << v;
    EXPECT_EQ(f.find_tensor(v + ".scale") == nullptr, dense) << v;
    EXPECT_EQ(f.find_tensor(gguf_linear_name(l, model::LinearId::kQ) + ".weight")->type,
              static_cast<uint32_t>(GgmlType::kNVFP4));
  }
  const model::Tensor& v1 = linear_weight(wq.src.layers[1], model::LinearId::kV);
  const std::vector<uint8_t> want = encode_q8_0(v1.data, v1.numel());
  const GgufTensorInfo& t = tensor(f, "blk.1.attn_v.weight");
  ASSERT_EQ(t.nbytes, want.size());
  EXPECT_EQ(std::memcmp(t.data, want.data(), want.size()), 0);
  // In f32 the loader gives back every Linear: dense ones exactly, NVFP4 ones as quantized.
  const std::string f32 = d.sub("f32.gguf");
  expect_reads_back(f32, c, write_model(f32, c, GgufDense::kF32, std::nullopt, one));
  // The spec and the Linears given must agree layer by layer.
  GgufModelSpec s = model_spec(c, GgufDense::kF32);
  s.dense.add(1, model::LinearId::kV);
  const model::Weights src = model::testing::random_model(c, 8);
  EXPECT_TRUE(throws_with(
      [&] {
        GgufModelWriter w(d.sub("bad.gguf"), s);
        w.write_embeddings(src.tok_embeddings);
        std::vector<CheckpointLinear> cl;  // layer 0 with v_proj dense: not declared so
        for (model::LinearId id : kAllLinears) cl.push_back({id, nullptr, std::nullopt});
        w.write_layer(0, src.layers[0], cl);
      },
      "blk.0.attn_q dense/NVFP4 differs"));
}

TEST(GgufModelWriter, AThrowMidWriteLeavesNothing) {
  TempDir d("ss_gguf_writer_");
  const std::string path = d.sub("half.gguf");
  const model::Config c = gguf_config(true);
  const model::Weights src = model::testing::random_model(c, 8);
  try {
    GgufModelWriter w(path, model_spec(c, GgufDense::kF16));
    w.write_embeddings(src.tok_embeddings);
    std::vector<CheckpointLinear> cl;  // q/k/v... NVFP4 expected, none given
    for (model::LinearId id : kAllLinears) cl.push_back({id, nullptr, std::nullopt});
    w.write_layer(0, src.layers[0], cl);
    FAIL() << "write_layer accepted dense Linears the spec declares NVFP4";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q dense/NVFP4 differs"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(d.p)) << "a temp file was left behind";
}

TEST(GgufModelWriter, RefusesWhatLlamaCppCannotLoadBeforeWriting) {
  TempDir d("ss_gguf_writer_");
  const auto error = [&](const model::Config& c) {
    return error_of([&] { GgufModelWriter w(d.sub("a.gguf"), model_spec(c, GgufDense::kF32)); });
  };
  struct Case {
    model::Config c;
    std::string want;
  };
  std::vector<Case> cases;
  model::Config c = gguf_config(true);
  c.qkv_bias = true;
  cases.push_back({c, "q/k/v biases with the llama architecture"});
  c = qwen2_config();
  c.qkv_bias = false;
  cases.push_back({c, "a qwen2 model without q/k/v biases"});
  c = qwen3_config();
  c.qk_norm = false;
  cases.push_back({c, "a qwen3 model without q/k norms"});
  c = qwen2_config();
  c.qk_norm = true;
  cases.push_back({c, "q/k norms with the qwen2 architecture"});
  c = gguf_config(true);
  c.rope_scaling.type = model::RopeType::kDynamic;
  c.rope_scaling.factor = 2.0f;
  cases.push_back({c, "rope scaling 'dynamic' (dynamic NTK): llama.cpp has no such"});
  c = llama3_rope_config();
  c.arch = model::Arch::kQwen3;
  c.qk_norm = true;
  cases.push_back({c, "rope scaling 'llama3' with the qwen3 architecture"});
  c = gguf_config(true);
  c.rope_scaling.type = model::RopeType::kYarn;
  c.rope_scaling.factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.rope_scaling.attention_factor = 1.3f;
  cases.push_back({c,
                   "rope scaling 'yarn' with attention_factor 1.300000: llama.cpp applies "
                   "1.138629"});
  c.rope_scaling.attention_factor = 0.1f * std::log(4.0f) + 1.0f;
  c.rope_scaling.truncate = false;
  cases.push_back({c, "rope scaling 'yarn' with truncate = false"});
  for (const Case& k : cases) {
    const std::string e = error(k.c);
    EXPECT_NE(e.find("test: cannot be written as a GGUF for llama.cpp: " + k.want),
              std::string::npos)
        << e;
  }
  c = gguf_config(true);
  GgufModelSpec s = model_spec(c, GgufDense::kF32);
  s.dense = {};  // down_proj (96 columns) as NVFP4
  EXPECT_TRUE(throws_with([&] { GgufModelWriter w(d.sub("a.gguf"), s); },
                          "down_proj as NVFP4: row length 96 is not a multiple of ggml's "
                          "64-element NVFP4 super-block"));
  // llama.cpp's qwen2 graph ignores the FFN's .scale: stored as qwen2, those Linears must be
  // dense (stored as llama, the default, they are NVFP4).
  s = model_spec(qwen2_config(), GgufDense::kF32);
  s.qwen2_as = GgufQwen2As::kQwen2;
  s.config.hidden_dim = 128;
  s.dense = {};
  EXPECT_TRUE(throws_with([&] { GgufModelWriter w(d.sub("a.gguf"), s); },
                          "gate_proj as NVFP4: llama.cpp's qwen2 graph ignores the per-tensor "
                          ".scale of the FFN Linears"));
  const auto kQwen2 = GgufQwen2As::kQwen2, kLlama = GgufQwen2As::kLlama;
  EXPECT_EQ(gguf_nvfp4_obstacle(s.config, model::LinearId::kQ, kQwen2), "");
  EXPECT_NE(gguf_nvfp4_obstacle(s.config, model::LinearId::kDown, kQwen2), "");
  EXPECT_EQ(gguf_nvfp4_obstacle(s.config, model::LinearId::kDown, kLlama), "");
  s.config = qwen3_config();
  s.config.hidden_dim = 128;
  EXPECT_EQ(gguf_nvfp4_obstacle(s.config, model::LinearId::kDown, kQwen2), "");
  EXPECT_TRUE(fs::is_empty(d.p));
}

TEST(GgufTokenizerKv, Llama2cAndSpecRoundTripThroughOurReader) {
  // llama2.c vocabulary: <unk>, <s>, </s>, 256 bytes, then pieces.
  std::vector<std::string> v = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.emplace_back(buf);
  }
  for (const char* p : {" ", "a", "b", " a", "ab", " ab"}) v.emplace_back(p);
  std::vector<float> sc(v.size(), 0.0f);
  for (size_t i = 259; i < v.size(); ++i) sc[i] = -static_cast<float>(i);
  const model::Llama2cTokenizer t(v, sc);
  const GgufMetadata kv = gguf_tokenizer_kv_llama2c(t);
  EXPECT_EQ(*gguf_get_string(kv, "tokenizer.ggml.model", "t"), "llama");
  const auto types = *gguf_get_int_array(kv, "tokenizer.ggml.token_type", "t");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[3], 6);
  EXPECT_EQ(types[259], 1);
  EXPECT_EQ((*gguf_get_string_array(kv, "tokenizer.ggml.tokens", "t"))[262],
            "\xE2\x96\x81"
            "a");
  model::HfBpeTokenizer ours(gguf_tokenizer_spec(kv, "t"));
  EXPECT_EQ(ours.encode("ab a", true, false), t.encode("ab a", true, false));
  // A SentencePiece spec goes through as "llama" with its merges; our reader rebuilds it.
  const model::BpeSpec s = model::sentencepiece_spec_from_llama2c(v, sc);
  const GgufMetadata kv2 = gguf_tokenizer_kv_spec(s, "t");
  model::HfBpeTokenizer back(gguf_tokenizer_spec(kv2, "t"));
  model::HfBpeTokenizer orig(s);
  EXPECT_EQ(back.encode(" ab ba", true, false), orig.encode(" ab ba", true, false));
  // A byte-level spec whose split has no llama.cpp name is refused naming the choices.
  model::BpeSpec bl;
  bl.flavor = model::BpeFlavor::kByteLevel;
  bl.split = model::SplitRegex::kNone;
  bl.vocab = {"a"};
  EXPECT_TRUE(throws_with([&] { gguf_tokenizer_kv_spec(bl, "tok.json"); },
                          "tok.json: the byte-level pre-tokenizer"));
}

}  // namespace
}  // namespace scalesweep::io

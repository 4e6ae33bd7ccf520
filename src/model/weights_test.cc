// Weights in their stored precision (include/scalesweep/model/weight.h): the fast row
// dequantizer against the scalar reference, the decode kernels against the fp32 kernel on the
// widened weights, and the runtime on bf16/f16/NVFP4/ggml-block models against the same
// model widened to fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/format/ggml.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::model {
namespace {

const WeightDType kAll[] = {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF16,
                            WeightDType::kNvfp4, WeightDType::kGgml};

// Q8_0 blocks of n values (n a multiple of 32): d = amax / 127 as fp16, q = round(x / d).
std::vector<uint8_t> q8_0_blocks(const float* x, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const uint16_t dh = format::f32_to_f16(amax / 127.0f);
    const float d = format::f16_to_f32(dh);
    out.push_back(static_cast<uint8_t>(dh & 0xFF));
    out.push_back(static_cast<uint8_t>(dh >> 8));
    for (int i = 0; i < 32; ++i) {
      const float q = d == 0 ? 0.0f : std::nearbyint(x[b + i] / d);
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f))));
    }
  }
  return out;
}

// Re-encodes an fp32 [rows, cols] tensor in `d` (owned buffers appended to `keep`). kGgml:
// Q8_0 blocks where cols is a multiple of 32 (a fused kernel), else ggml F16 (the scalar
// dequantizer), as a GGUF's tensors are held.
Tensor encode(const Tensor& f, WeightDType d, std::vector<std::shared_ptr<void>>& keep) {
  const int64_t rows = f.rows(), cols = f.cols(), n = f.numel();
  Tensor t;
  t.shape = f.shape;
  t.dtype = d;
  switch (d) {
    case WeightDType::kF32: {
      auto v = std::make_shared<std::vector<float>>(f.data, f.data + n);
      t.data = v->data();
      keep.push_back(v);
      break;
    }
    case WeightDType::kBF16:
    case WeightDType::kF16: {
      auto v = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        (*v)[i] =
            d == WeightDType::kF16 ? format::f32_to_f16(f.data[i]) : format::f32_to_bf16(f.data[i]);
      keep.push_back(v);
      t.raw = v->data();
      break;
    }
    case WeightDType::kGgml: {
      std::shared_ptr<std::vector<uint8_t>> v;
      if (cols % 32 == 0) {
        v = std::make_shared<std::vector<uint8_t>>(q8_0_blocks(f.data, n));
        t.ggml_type = static_cast<uint32_t>(format::GgmlType::kQ8_0);
      } else {
        v = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(2 * n));
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = format::f32_to_f16(f.data[i]);
          std::memcpy(v->data() + 2 * i, &h, 2);
        }
        t.ggml_type = static_cast<uint32_t>(format::GgmlType::kF16);
      }
      keep.push_back(v);
      t.raw = v->data();
      break;
    }
    case WeightDType::kNvfp4: {
      QuantConfig cfg;
      auto q = std::make_shared<QuantizedTensor>(quantize(f.data, rows, cols, {}, cfg, "w"));
      t.raw = q->codes.data();
      t.nvfp4_scales = q->scales.data();
      t.nvfp4_global_scale = q->global_scale;
      keep.push_back(q);
      break;
    }
  }
  return t;
}

Tensor random_f32(int64_t rows, int64_t cols, uint64_t seed,
                  std::vector<std::shared_ptr<void>>& keep) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * cols));
  for (auto& x : *v) x = nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 9) - 4));
  keep.push_back(v);
  Tensor t;
  t.shape = {rows, cols};
  t.data = v->data();
  return t;
}

using testing::expect_bits_equal;

TEST(DequantizeRows, FastMatchesReferenceRandom) {
  std::vector<std::shared_ptr<void>> keep;
  for (int64_t cols : {1, 2, 15, 16, 17, 33, 100, 577})
    for (WeightDType d : kAll) {
      const int64_t rows = 23;
      const Tensor t = encode(random_f32(rows, cols, 7 + cols, keep), d, keep);
      for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {5, 6}, {3, 19}, {22, 23}}) {
        std::vector<float> a(static_cast<size_t>((r1 - r0) * cols), -1.f), b(a.size(), -2.f);
        dequantize_rows_reference(t, r0, r1, a.data());
        dequantize_rows(t, r0, r1, b.data());
        expect_bits_equal(a, b,
                          std::string(kWeightDTypeNames.name(d)) + " cols " + std::to_string(cols) +
                              " rows " + std::to_string(r0) + ".." + std::to_string(r1));
      }
    }
}

TEST(TensorAmax, EqualsTheMaxOfTheDequantizedTensor) {
  std::vector<std::shared_ptr<void>> keep;
  for (int64_t cols : {1, 17, 100})
    for (WeightDType d : kAll) {
      const Tensor t = encode(random_f32(9, cols, 3 + cols, keep), d, keep);
      float want = 0;
      for (float v : to_f32(t)) want = std::max(want, std::fabs(v));
      EXPECT_GT(want, 0.0f);
      EXPECT_EQ(tensor_amax(t), want) << kWeightDTypeNames.name(d) << " cols " << cols;
    }
}

// Every finite 16-bit pattern (subnormals, signed zeros, the largest values), as a tensor of
// an odd width.
TEST(DequantizeRows, AllFinite16BitPatterns) {
  for (WeightDType d : {WeightDType::kBF16, WeightDType::kF16}) {
    const uint16_t exp_mask = d == WeightDType::kBF16 ? 0x7F80 : 0x7C00;
    std::vector<uint16_t> bits;
    for (uint32_t h = 0; h < 65536; ++h)
      if ((h & exp_mask) != exp_mask) bits.push_back(static_cast<uint16_t>(h));
    const int64_t cols = 61;
    bits.resize(bits.size() / cols * cols);
    Tensor t;
    t.shape = {static_cast<int64_t>(bits.size()) / cols, cols};
    t.dtype = d;
    t.raw = bits.data();
    const std::vector<float> fast = to_f32(t);
    std::vector<float> ref(fast.size());
    dequantize_rows_reference(t, 0, t.rows(), ref.data());
    expect_bits_equal(ref, fast, std::string(kWeightDTypeNames.name(d)));
    for (size_t i = 0; i < bits.size(); ++i) {
      const float want =
          d == WeightDType::kBF16 ? format::bf16_to_f32(bits[i]) : format::f16_to_f32(bits[i]);
      ASSERT_EQ(std::memcmp(&want, &fast[i], 4), 0) << i;
      ASSERT_TRUE(std::isfinite(fast[i]));
    }
  }
}

// NVFP4: every code under every valid E4M3 scale (0x00..0x7E), extreme global scales.
TEST(DequantizeRows, Nvfp4AllScalesAndCodes) {
  const int64_t cols = 16 * 127 + 7;  // a partial last block
  std::vector<uint8_t> codes(static_cast<size_t>((cols + 1) / 2)), scales(128);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37 + 11) & 0xFF);
  codes.back() &= 0x0F;  // pad nibble
  for (int b = 0; b < 128; ++b) scales[b] = static_cast<uint8_t>(b % 127);
  for (float gs : {1.0f, 3.0e-7f, 2.5e4f, 1.0e30f}) {
    Tensor t;
    t.shape = {1, cols};
    t.dtype = WeightDType::kNvfp4;
    t.raw = codes.data();
    t.nvfp4_scales = scales.data();
    t.nvfp4_global_scale = gs;
    std::vector<float> ref(static_cast<size_t>(cols)), fast(ref.size());
    dequantize_rows_reference(t, 0, 1, ref.data());
    dequantize_rows(t, 0, 1, fast.data());
    expect_bits_equal(ref, fast, "gs " + std::to_string(gs));
  }
}

TEST(DequantizeRows, Errors) {
  std::vector<std::shared_ptr<void>> keep;
  const Tensor t = encode(random_f32(4, 8, 1, keep), WeightDType::kBF16, keep);
  std::vector<float> out(64);
  EXPECT_THROW(dequantize_rows(t, 3, 5, out.data()), std::out_of_range);
  EXPECT_THROW(dequantize_rows_reference(t, -1, 1, out.data()), std::out_of_range);
  EXPECT_THROW(dequantize_rows(Tensor{}, 0, 0, out.data()), std::invalid_argument);
  try {
    (void)t.f32("layer 3 wq");
    FAIL() << "f32() of a bf16 tensor";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 3 wq is stored as BF16"), std::string::npos)
        << e.what();
  }
}

// Decode kernels: every dtype gives the bits of the fp32 kernel on the widened weights, and
// agrees with a double-precision dot product.
TEST(GemvRows, MatchesWidenedFp32AndReference) {
  std::vector<std::shared_ptr<void>> keep;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t out : {1, 3, 4, 5, 37, 300})
    for (int64_t in : {1, 15, 16, 17, 100, 512, 2000})
      for (WeightDType d : kAll) {
        const Tensor t = encode(random_f32(out, in, out * 131 + in, keep), d, keep);
        std::vector<float> wf = to_f32(t);
        Tensor f;
        f.shape = t.shape;
        f.data = wf.data();
        std::vector<float> x(static_cast<size_t>(in));
        for (auto& v : x) v = nd(rng);
        for (auto [o0, o1] : {std::pair<int64_t, int64_t>{0, out}, {out / 3, out}}) {
          std::vector<float> a(static_cast<size_t>(o1 - o0)), b(a.size());
          gemv_rows(f, x.data(), o0, o1, a.data());
          gemv_rows(t, x.data(), o0, o1, b.data());
          const std::string what = std::string(kWeightDTypeNames.name(d)) + " " +
                                   std::to_string(out) + "x" + std::to_string(in) + " from row " +
                                   std::to_string(o0);
          expect_bits_equal(a, b, what);
          for (int64_t o = o0; o < o1; ++o) {
            double s = 0, sa = 0;
            for (int64_t j = 0; j < in; ++j) {
              s += static_cast<double>(wf[o * in + j]) * x[j];
              sa += std::fabs(static_cast<double>(wf[o * in + j]) * x[j]);
            }
            ASSERT_NEAR(b[o - o0], s, 1e-6 * sa + 1e-30) << what << " row " << o;
          }
        }
      }
}

// A model in `d` (Linear weights and embeddings re-encoded; norms stay fp32) and the same
// model with every tensor widened back to fp32.
struct Pair {
  std::shared_ptr<Weights> enc, wide;
};
Pair encoded_model(const Config& c, WeightDType d) {
  const Weights fp = testing::random_model(c, 11);
  auto enc = std::make_shared<Weights>(fp);
  auto re = [&](Tensor& t) { t = encode(t, d, enc->storage); };
  re(enc->tok_embeddings);
  for (auto& L : enc->layers)
    for (Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w3, &L.w2}) re(*t);
  if (c.tied_embeddings)
    enc->lm_head = enc->tok_embeddings;
  else
    re(enc->lm_head);
  auto wide = std::make_shared<Weights>(*enc);
  materialize_f32(*wide);
  return {enc, wide};
}

TEST(WeightDTypeRuntime, DecodeBitExactPrefillWithinRounding) {
  for (bool tied : {true, false})
    for (WeightDType d : kAll) {
      Config c = testing::small_config();
      c.vocab_size = 12000;           // lm_head rows span several prefill tiles
      if (d == WeightDType::kGgml) {  // widths of whole Q8_0 blocks: the fused kernels
        c.dim = 64;
        c.n_heads = 8;
        c.hidden_dim = 96;
      }
      c.tied_embeddings = tied;
      c.qkv_bias = !tied;
      const Pair p = encoded_model(c, d);
      if (tied) {
        EXPECT_EQ(p.wide->lm_head.data, p.wide->tok_embeddings.data);
      }
      for (const Tensor* t : {&p.wide->tok_embeddings, &p.wide->layers[0].wq, &p.wide->lm_head})
        ASSERT_EQ(t->dtype, WeightDType::kF32);
      Transformer te(p.enc), tw(p.wide);
      const std::vector<int> toks = testing::token_stream(40, c.vocab_size);
      const std::vector<float> le = te.forward(toks.data(), 40, 0);
      const std::vector<float> lw = tw.forward(toks.data(), 40, 0);
      const std::string what =
          std::string(kWeightDTypeNames.name(d)) + (tied ? " tied" : " untied");
      ASSERT_EQ(le.size(), lw.size());
      double num = 0, den = 0;
      for (size_t i = 0; i < le.size(); ++i) {
        num += (static_cast<double>(le[i]) - lw[i]) * (static_cast<double>(le[i]) - lw[i]);
        den += static_cast<double>(lw[i]) * lw[i];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-5) << what;
      // Decode reads the same values through the same kernel arithmetic: identical bits.
      for (int pos = 40; pos < 44; ++pos) {
        const float* a = te.decode(toks[pos - 40], pos);
        const std::vector<float> av(a, a + c.vocab_size);
        const float* b = tw.decode(toks[pos - 40], pos);
        expect_bits_equal(av, std::vector<float>(b, b + c.vocab_size), what + " decode");
      }
    }
}

TEST(WeightDTypeRuntime, MatchesNaiveReference) {
  const Config c = testing::small_config();
  const Pair p = encoded_model(c, WeightDType::kBF16);
  Transformer t(p.enc);
  const std::vector<int> toks = testing::token_stream(12, c.vocab_size);
  const std::vector<float> got = t.forward(toks.data(), 12, 0);
  const std::vector<double> want = testing::reference_forward(*p.wide, toks);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3) << i;
}

TEST(WeightDTypeRuntime, StorageBytes) {
  std::vector<std::shared_ptr<void>> keep;
  const Tensor f = random_f32(10, 33, 5, keep);
  EXPECT_EQ(storage_bytes(f), 10 * 33 * 4);
  EXPECT_EQ(storage_bytes(encode(f, WeightDType::kBF16, keep)), 10 * 33 * 2);
  EXPECT_EQ(storage_bytes(encode(f, WeightDType::kNvfp4, keep)), 10 * (17 + 3));
  EXPECT_EQ(storage_bytes(encode(f, WeightDType::kGgml, keep)), 10 * 33 * 2);  // ggml F16
  EXPECT_EQ(storage_bytes(encode(random_f32(10, 64, 5, keep), WeightDType::kGgml, keep)),
            10 * 2 * 34);  // Q8_0
}

}  // namespace
}  // namespace scalesweep::model

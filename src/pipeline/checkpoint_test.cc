// The whole-model checkpoint job (write_quantized_checkpoint): layout, fused global scales,
// equality with the in-memory simulation, atomic output, bad inputs, Linears vLLM cannot take,
// sharding, on a small synthetic model. The file format alone is tested in
// src/io/compressed_tensors_test.cc and src/io/checkpoint_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "base/test_util.h"
#include "io/test_util.h"
#include "model/test_util.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

using scalesweep::testing::randn;

// A small Llama-shaped model (dim 32, hidden 40: K % 16 != 0 for down_proj) with calibration.
struct Toy {
  LoadedModel m;
  model::CalibStats calib;
};

Toy make_toy() {
  Toy t;
  model::Weights& w = t.m.weights;
  model::Config& c = w.config;
  c = model::testing::tiny_config(/*tied=*/false);  // 2 layers, 4 q / 2 kv heads of 8
  c.hidden_dim = 40;
  c.vocab_size = 50;
  uint32_t seed = 1;
  auto fill = [&](model::Tensor& tt, std::vector<int64_t> shape, float s) {
    float* p = w.alloc(tt, shape);
    const auto v = randn(tt.numel(), seed++, s);
    std::copy(v.begin(), v.end(), p);
  };
  fill(w.tok_embeddings, {50, 32}, 1.f);
  fill(w.lm_head, {50, 32}, 0.1f);
  fill(w.final_norm, {32}, 1.f);
  w.layers.resize(2);
  for (auto& L : w.layers) {
    fill(L.attn_norm, {32}, 1.f);
    fill(L.ffn_norm, {32}, 1.f);
    fill(L.wq, {32, 32}, 0.1f);
    fill(L.wk, {16, 32}, 0.1f);
    fill(L.wv, {16, 32}, 0.3f);
    fill(L.wo, {32, 32}, 0.1f);
    fill(L.w1, {40, 32}, 0.1f);
    fill(L.w3, {40, 32}, 0.1f);
    fill(L.w2, {32, 40}, 0.1f);
  }
  t.m.format = "llama2c-legacy";
  t.calib.layers.resize(2);
  for (auto& ls : t.calib.layers)
    for (int i = 0; i < model::kNumInputs; ++i) {
      const int64_t dim = (i == 3) ? 40 : 32, n = 200;
      auto& in = ls.inputs[static_cast<size_t>(i)];
      in.dim = dim;
      in.tokens = n;
      const auto x = randn(n * dim, seed++, 1.f);
      in.xtx.assign(dim * dim, 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t a = 0; a < dim; ++a) {
          in.amax = std::max(in.amax, std::fabs(x[r * dim + a]));
          for (int64_t b = 0; b < dim; ++b)
            in.xtx[a * dim + b] += double(x[r * dim + a]) * x[r * dim + b];
        }
    }
  return t;
}

TEST(QuantizeModel, CheckpointLayoutFusedScalesAndAtomicity) {
  const scalesweep::testing::TempDir tmp("ss_ct_test_ckpt");
  const fs::path& d = tmp.path();
  const Toy t = make_toy();
  const std::string src = (d / "toy.bin").string();  // not read: llama2.c path for naming only
  QuantizeOptions o;
  o.method = Method::kSweepWmse;
  o.gptq = true;
  o.w4a4 = true;
  const std::string out = (d / "out").string();
  WriteOptions keep;  // down_proj (K = 40) quantized with a partial last block
  keep.partial_blocks = PartialBlocks::kQuantize;
  const QuantizeReport rep = write_quantized_checkpoint(t.m, src, &t.calib, o, out, keep);
  EXPECT_EQ(rep.linears.size(), 14u);
  const SafetensorsFile f = SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_TRUE(f.contains("lm_head.weight"));  // untied: kept in full precision
  EXPECT_TRUE(f.contains("model.embed_tokens.weight"));
  EXPECT_FALSE(f.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(f.at("model.layers.1.mlp.down_proj.weight_packed").shape,
            (std::vector<int64_t>{32, 20}));
  EXPECT_EQ(f.at("model.layers.1.mlp.down_proj.weight_scale").shape, (std::vector<int64_t>{32, 3}));
  auto scalar = [&](const std::string& n) {
    float v;
    std::memcpy(&v, f.raw(n).data(), 4);
    return v;
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const float gq = scalar(p + "self_attn.q_proj.weight_global_scale");
    EXPECT_EQ(gq, scalar(p + "self_attn.k_proj.weight_global_scale"));
    EXPECT_EQ(gq, scalar(p + "self_attn.v_proj.weight_global_scale"));
    EXPECT_EQ(scalar(p + "mlp.gate_proj.weight_global_scale"),
              scalar(p + "mlp.up_proj.weight_global_scale"));
    // shared gs = 6*256 / max amax over q/k/v (v has the largest weights here)
    float amax = 0;
    for (const auto* tt :
         {&t.m.weights.layers[l].wq, &t.m.weights.layers[l].wk, &t.m.weights.layers[l].wv})
      for (int64_t i = 0; i < tt->numel(); ++i) amax = std::max(amax, std::fabs(tt->data[i]));
    EXPECT_EQ(gq, global_scale_for_amax(amax, 256.f));
    EXPECT_EQ(scalar(p + "mlp.down_proj.input_global_scale"),
              global_scale_for_amax(t.calib.layers[l].inputs[3].amax, 256.f));
  }
  std::ifstream cf(out + "/config.json");
  const json cfg = json::parse(cf);
  EXPECT_EQ(cfg["quantization_config"]["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["intermediate_size"], 40);
  // The stored weights equal the in-memory simulation bit for bit.
  const model::Weights sim = quantized_weights(t.m.weights, &t.calib, o);
  TensorLookup lk = [&](std::string_view n) -> TensorRef {
    const TensorInfo* ti = f.find(n);
    return ti ? TensorRef{&f, ti} : TensorRef{};
  };
  for (int l = 0; l < 2; ++l)
    for (model::LinearId id : kAllLinears) {
      const model::Tensor& st = linear_weight(sim.layers[l], id);
      const auto back = read_nvfp4_weight(lk, hf_module_name(l, id), st.shape[0], st.shape[1]);
      EXPECT_EQ(std::memcmp(back.data(), st.data, back.size() * 4), 0) << hf_module_name(l, id);
    }

  // Existing output without overwrite: error, untouched.
  EXPECT_THROW(write_quantized_checkpoint(t.m, src, &t.calib, o, out, {}), std::exception);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  // Interrupted after layer 0 (the progress callback, called as each Linear is written,
  // fails once layer 0's seven are): no output directory, no temporary left behind, and
  // layer 1 was never written.
  int64_t last = 0;
  auto fail_after_layer0 = [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 14);
    if (done == 0) return;  // the start, announced before the first Linear
    EXPECT_EQ(done, last + 1) << "progress counts each Linear once, in order";
    last = done;
    if (done == 7) throw std::runtime_error("simulated interruption");
  };
  EXPECT_THROW(write_quantized_checkpoint(t.m, src, &t.calib, o, (d / "out2").string(), keep,
                                          fail_after_layer0),
               std::runtime_error);
  EXPECT_EQ(last, 7);
  EXPECT_FALSE(fs::exists(d / "out2"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename(), "out") << "left behind: " << e.path();
}

TEST(QuantizeModel, BadOptions) {
  const Toy t = make_toy();
  QuantizeOptions o;
  o.gptq = true;
  try {
    write_quantized_checkpoint(t.m, "x.bin", nullptr, o, "/tmp/never", {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("GPTQ needs calibration"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists("/tmp/never"));
  o = {};
  o.block = 32;
  EXPECT_THROW(write_quantized_checkpoint(t.m, "x.bin", nullptr, o, "/tmp/never", {}),
               std::invalid_argument);
  o = {};
  o.method = Method::kOptFp32;
  EXPECT_THROW(write_quantized_checkpoint(t.m, "x.bin", nullptr, o, "/tmp/never", {}),
               std::invalid_argument);
  o = {};
  o.method = Method::kSweepWmse;  // weighted: needs importance from calibration
  EXPECT_THROW(write_quantized_checkpoint(t.m, "x.bin", nullptr, o, "/tmp/never", {}),
               std::invalid_argument);
  // Calibration of the wrong model.
  Toy bad = make_toy();
  bad.calib.layers[1].inputs[0].dim = 40;
  o = {};
  o.gptq = true;
  EXPECT_THROW(write_quantized_checkpoint(t.m, "x.bin", &bad.calib, o, "/tmp/never", {}),
               std::invalid_argument);
  EXPECT_FALSE(fs::exists("/tmp/never"));
}

// vLLM cannot take K % 16 != 0: by default such Linears stay dense (source values, dense
// dtype) and are listed in quantization_config.ignore; the runtime loads the mixed checkpoint.
TEST(QuantizeModel, UnsupportedLinearsStayDenseAndListedInIgnore) {
  const scalesweep::testing::TempDir tmp("ss_ct_test_dense");
  const fs::path& d = tmp.path();
  const Toy t = make_toy();
  {
    const auto u = vllm_unsupported_linears(t.m.weights.config);
    ASSERT_EQ(u.size(), 1u);
    EXPECT_EQ(u[0].id, model::LinearId::kDown);
    EXPECT_NE(u[0].reason.find("K = 40"), std::string::npos) << u[0].reason;
    model::Config c = t.m.weights.config;
    c.dim = 40;  // q/k/v and gate/up (K = dim) and o (K = n_heads * head_dim = 32 stays)
    c.hidden_dim = 48;
    const auto u2 = vllm_unsupported_linears(c);
    ASSERT_EQ(u2.size(), 5u);
    for (const auto& x : u2) EXPECT_NE(x.id, model::LinearId::kO);
    c.dim = 64;
    EXPECT_TRUE(vllm_unsupported_linears(c).empty());
  }
  for (const bool gptq_wa : {false, true}) {
    QuantizeOptions o;
    o.method = gptq_wa ? Method::kSweepWmse : Method::kSweepMse;
    o.gptq = gptq_wa;
    o.w4a4 = gptq_wa;
    const std::string out = (d / (gptq_wa ? "gptq" : "rtn")).string();
    const QuantizeReport rep =
        write_quantized_checkpoint(t.m, (d / "toy.bin").string(), &t.calib, o, out, {});
    ASSERT_EQ(rep.linears.size(), 14u);
    for (const auto& r : rep.linears) EXPECT_EQ(r.dense, r.id == model::LinearId::kDown) << r.name;
    const std::vector<std::string> ignore = {"model.layers.0.mlp.down_proj",
                                             "model.layers.1.mlp.down_proj", "lm_head"};
    EXPECT_EQ(rep.ignore, ignore);
    std::ifstream cf(out + "/config.json");
    const json cfg = json::parse(cf);
    EXPECT_EQ(cfg["quantization_config"]["ignore"].get<std::vector<std::string>>(), ignore);
    EXPECT_EQ(cfg["quantization_config"]["version"], kCompressedTensorsVersion);
    const SafetensorsFile f = SafetensorsFile::open(out + "/model.safetensors");
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.down_proj";
      EXPECT_FALSE(f.contains(p + ".weight_packed"));
      EXPECT_FALSE(f.contains(p + ".input_global_scale"));
      const TensorInfo& ti = f.at(p + ".weight");
      EXPECT_EQ(ti.dtype, StDType::kF32);
      EXPECT_EQ(ti.shape, (std::vector<int64_t>{32, 40}));
      EXPECT_EQ(std::memcmp(f.raw(ti).data(), t.m.weights.layers[l].w2.data, 32 * 40 * 4), 0);
      EXPECT_TRUE(f.contains("model.layers." + std::to_string(l) + ".mlp.up_proj.weight_packed"));
      EXPECT_EQ(f.contains("model.layers." + std::to_string(l) + ".mlp.up_proj.input_global_scale"),
                gptq_wa);
    }
    // The runtime loads the mixed checkpoint: down_proj as stored, the rest dequantized
    // exactly as the simulation with down_proj excluded.
    const model::Weights back = load_hf_dir(out);
    QuantizeOptions od = o;
    od.dense.add_every_layer(model::LinearId::kDown);
    const model::Weights sim = quantized_weights(t.m.weights, &t.calib, od);
    for (int l = 0; l < 2; ++l)
      for (model::LinearId id : kAllLinears) {
        const model::Tensor& a = linear_weight(back.layers[l], id);
        const model::Tensor& b = linear_weight(sim.layers[l], id);
        ASSERT_EQ(a.shape, b.shape);
        EXPECT_EQ(model::to_f32(a), model::to_f32(b)) << hf_module_name(l, id);
      }
    EXPECT_EQ(sim.layers[1].w2.data, t.m.weights.layers[1].w2.data);  // excluded: shared
  }
}

// A checkpoint split into many shards holds the same tensors, byte for byte, as the single
// file, and loads to the same weights.
TEST(QuantizeModel, ShardedCheckpointEqualsSingleFile) {
  const scalesweep::testing::TempDir tmp("ss_ct_test_ckshard");
  const fs::path& d = tmp.path();
  const Toy t = make_toy();
  QuantizeOptions o;
  o.w4a4 = true;
  const std::string single = (d / "single").string(), sharded = (d / "sharded").string();
  WriteOptions ws;
  const QuantizeReport r1 =
      write_quantized_checkpoint(t.m, (d / "toy.bin").string(), &t.calib, o, single, ws);
  EXPECT_EQ(r1.files, std::vector<std::string>{"model.safetensors"});
  ws.max_shard_bytes = 3000;  // embeddings / lm_head (6400 bytes) get shards of their own
  const QuantizeReport r2 =
      write_quantized_checkpoint(t.m, (d / "toy.bin").string(), &t.calib, o, sharded, ws);
  ASSERT_GT(r2.files.size(), 3u);
  const SafetensorsFile one = SafetensorsFile::open(single + "/model.safetensors");
  json idx;
  ASSERT_NO_FATAL_FAILURE(io::testing::expect_shard_index(sharded, one, idx));
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards;
  for (const auto& fname : r2.files) {
    shards[fname] = std::make_unique<SafetensorsFile>(SafetensorsFile::open(sharded + "/" + fname));
    uint64_t data = 0;
    for (const auto& ti : shards[fname]->tensors()) data += ti.nbytes;
    EXPECT_TRUE(data <= 3000 || shards[fname]->tensors().size() == 1) << fname;
  }
  for (const auto& ti : one.tensors()) {
    const std::string fname = idx["weight_map"][ti.name].get<std::string>();
    const SafetensorsFile& sf = *shards.at(fname);
    const TensorInfo& tj = sf.at(ti.name);
    EXPECT_EQ(tj.dtype, ti.dtype);
    EXPECT_EQ(tj.shape, ti.shape);
    const auto a = one.raw(ti), b = sf.raw(tj);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << ti.name;
  }
  const model::Weights w1 = load_hf_dir(single), w2 = load_hf_dir(sharded);
  for (int l = 0; l < 2; ++l)
    for (model::LinearId id : kAllLinears) {
      const model::Tensor &a = linear_weight(w1.layers[l], id),
                          &b = linear_weight(w2.layers[l], id);
      EXPECT_EQ(model::to_f32(a), model::to_f32(b)) << hf_module_name(l, id);
    }
  EXPECT_EQ(model::to_f32(w1.lm_head), model::to_f32(w2.lm_head));
}

}  // namespace
}  // namespace scalesweep::pipeline

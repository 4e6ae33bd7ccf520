// compressed-tensors NVFP4 layout, streaming writer, reader validation, and the whole-model
// checkpoint writer (atomic output, bad inputs) on a small synthetic model.
#include "scalesweep/io/compressed_tensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/quantize_model.h"
#include "scalesweep/io/safetensors.h"

namespace scalesweep::io {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

fs::path fresh_dir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("ss_ct_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

struct MemFile {  // a safetensors file built in memory and opened
  fs::path path;
  std::unique_ptr<SafetensorsFile> file;
  TensorLookup lookup() const {
    return [this](std::string_view n) -> TensorRef {
      const TensorInfo* t = file->find(n);
      return t ? TensorRef{file.get(), t} : TensorRef{};
    };
  }
};

MemFile write_blobs(const fs::path& path, const std::vector<TensorBlob>& blobs) {
  SafetensorsWriter w;
  for (const auto& b : blobs) w.add(b.name, b.dtype, b.shape, std::span<const uint8_t>(b.bytes));
  w.write(path.string());
  MemFile m;
  m.path = path;
  m.file = std::make_unique<SafetensorsFile>(SafetensorsFile::open(path.string()));
  return m;
}

TEST(CompressedTensors, LayoutAndBitExactRoundTrip) {
  const fs::path d = fresh_dir("layout");
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8, 64}, {5, 172}, {3, 37}}) {
    const auto x = randn(rows * cols, 3, 0.1f);
    QuantConfig cfg;
    const QuantizedTensor q = quantize(x.data(), rows, cols, {}, cfg, "w");
    const auto blobs = nvfp4_linear_tensors("model.layers.0.mlp.down_proj", q, 123.5f);
    ASSERT_EQ(blobs.size(), 4u);
    EXPECT_EQ(blobs[0].name, "model.layers.0.mlp.down_proj.weight_packed");
    EXPECT_EQ(blobs[0].dtype, DType::kU8);
    EXPECT_EQ(blobs[0].shape, (std::vector<int64_t>{rows, (cols + 1) / 2}));
    EXPECT_EQ(blobs[1].dtype, DType::kF8E4M3);
    EXPECT_EQ(blobs[1].shape, (std::vector<int64_t>{rows, (cols + 15) / 16}));
    EXPECT_EQ(blobs[2].shape, (std::vector<int64_t>{1}));
    float g;
    std::memcpy(&g, blobs[2].bytes.data(), 4);
    EXPECT_EQ(g, q.global_scale);  // encode direction, as quantize() uses it
    EXPECT_GT(g, 1.0f);            // 6*256/amax with amax ~ 0.4
    const MemFile m = write_blobs(d / ("a" + std::to_string(cols) + ".safetensors"), blobs);
    const auto back = read_nvfp4_weight(m.lookup(), "model.layers.0.mlp.down_proj", rows, cols);
    const auto ref = dequantize(q);
    ASSERT_EQ(back.size(), ref.size());
    EXPECT_EQ(std::memcmp(back.data(), ref.data(), 4 * ref.size()), 0);
    EXPECT_EQ(*read_input_global_scale(m.lookup(), "model.layers.0.mlp.down_proj"), 123.5f);
    // Nibble order: element 0 in the low nibble of byte 0, element 1 in the high nibble.
    const QuantizedTensor rq =
        read_nvfp4_quantized(m.lookup(), "model.layers.0.mlp.down_proj", rows, cols);
    const float s0 = format::E4M3::decode_f(rq.scales[0]);
    EXPECT_EQ(format::kFp4Values.v[rq.codes[0] & 15] * s0 / rq.global_scale, ref[0]);
    EXPECT_EQ(format::kFp4Values.v[rq.codes[0] >> 4] * s0 / rq.global_scale, ref[1]);
  }
  fs::remove_all(d);
}

TEST(CompressedTensors, ReaderRejectsCorruptTensors) {
  const fs::path d = fresh_dir("corrupt");
  const int64_t rows = 4, cols = 37;
  const auto x = randn(rows * cols, 5);
  const QuantizedTensor q = quantize(x.data(), rows, cols, {}, QuantConfig{}, "w");
  auto expect_error = [&](std::vector<TensorBlob> blobs, const std::string& needle,
                          int64_t c = 37) {
    static int n = 0;
    const MemFile m = write_blobs(d / ("c" + std::to_string(n++) + ".safetensors"), blobs);
    try {
      read_nvfp4_weight(m.lookup(), "p", rows, c);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto blobs = nvfp4_linear_tensors("p", q, std::nullopt);
  auto b = blobs;
  b[1].bytes[2 * 3 + 1] = 0x7F;  // NaN scale at [2, 1]
  expect_error(b, "[2, 1] is NaN");
  b = blobs;
  b[1].bytes[5] |= 0x80;
  expect_error(b, "negative block scale");
  b = blobs;
  b[0].bytes[1 * 19 + 18] |= 0x30;  // pad nibble of row 1
  expect_error(b, "pad nibble");
  b = blobs;
  float bad = -2.f;
  std::memcpy(b[2].bytes.data(), &bad, 4);
  expect_error(b, "global scale");
  b = blobs;
  b.erase(b.begin() + 1);
  expect_error(b, "'p.weight_scale' is missing");
  expect_error(blobs, "expected U8 [4, 20]", 40);  // shape from the model config disagrees
  fs::remove_all(d);
}

TEST(CompressedTensors, QuantizationConfig) {
  const json c = nvfp4_quantization_config(true, 16, {"lm_head"});
  EXPECT_EQ(c["quant_method"], "compressed-tensors");
  EXPECT_EQ(c["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(c["ignore"], json::array({"lm_head"}));
  const json& g = c["config_groups"]["group_0"];
  EXPECT_EQ(g["targets"], json::array({"Linear"}));
  EXPECT_EQ(g["weights"]["num_bits"], 4);
  EXPECT_EQ(g["weights"]["type"], "float");
  EXPECT_EQ(g["weights"]["strategy"], "tensor_group");
  EXPECT_EQ(g["weights"]["group_size"], 16);
  EXPECT_EQ(g["weights"]["symmetric"], true);
  EXPECT_EQ(g["weights"]["dynamic"], false);
  EXPECT_EQ(g["weights"]["scale_dtype"], "torch.float8_e4m3fn");
  EXPECT_EQ(g["input_activations"]["dynamic"], "local");
  EXPECT_EQ(g["input_activations"]["strategy"], "tensor_group");
  const CtInfo info = parse_quantization_config(json{{"quantization_config", c}}, "cfg");
  EXPECT_TRUE(info.nvfp4);
  EXPECT_TRUE(info.w4a4);
  const CtInfo w4a16 = parse_quantization_config(
      json{{"quantization_config", nvfp4_quantization_config(false, 16, {"lm_head"})}}, "cfg");
  EXPECT_FALSE(w4a16.w4a4);
  EXPECT_FALSE(parse_quantization_config(json{{"hidden_size", 4}}, "cfg").present);
  json awq = json{{"quantization_config", {{"quant_method", "awq"}, {"bits", 4}}}};
  EXPECT_THROW(parse_quantization_config(awq, "cfg"), IoError);
  json g32 = json{{"quantization_config", c}};
  g32["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32;
  EXPECT_THROW(parse_quantization_config(g32, "cfg"), IoError);
}

TEST(CompressedTensors, StreamWriter) {
  const fs::path d = fresh_dir("stream");
  const std::vector<uint8_t> a = {1, 2, 3}, b(8, 7);
  {
    SafetensorsStreamWriter w;
    w.declare("a", DType::kU8, {3});
    w.declare("b", DType::kF32, {2});
    w.set_metadata("format", "pt");
    w.open((d / "x.safetensors").string());
    w.write("a", a);
    w.write("b", b);
    w.commit();
  }
  const SafetensorsFile f = SafetensorsFile::open((d / "x.safetensors").string());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.raw("a")[2], 3);
  EXPECT_EQ(f.raw("b").size(), 8u);
  {  // out of order, wrong size, missing tensor: errors, and no file appears
    SafetensorsStreamWriter w;
    w.declare("a", DType::kU8, {3});
    w.declare("b", DType::kF32, {2});
    w.open((d / "y.safetensors").string());
    EXPECT_THROW(w.write("b", b), IoError);
    EXPECT_THROW(w.write("a", b), IoError);
    w.write("a", a);
    EXPECT_THROW(w.commit(), IoError);
  }
  EXPECT_FALSE(fs::exists(d / "y.safetensors"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename(), "x.safetensors") << "left behind: " << e.path();
  fs::remove_all(d);
}

// A small Llama-shaped model (dim 32, hidden 40: K % 16 != 0 for down_proj) with calibration.
struct Toy {
  LoadedModel m;
  model::CalibStats calib;
};

Toy make_toy() {
  Toy t;
  model::Weights& w = t.m.weights;
  model::Config& c = w.config;
  c.dim = 32;
  c.hidden_dim = 40;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  c.max_seq_len = 64;
  c.tied_embeddings = false;
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
  const fs::path d = fresh_dir("ckpt");
  const Toy t = make_toy();
  const std::string src = (d / "toy.bin").string();  // not read: llama2.c path for naming only
  QuantizeOptions o;
  o.method = Method::kSweepWmse;
  o.gptq = true;
  o.w4a4 = true;
  const std::string out = (d / "out").string();
  const QuantizeReport rep = write_quantized_checkpoint(t.m, src, &t.calib, o, out, {});
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
  // Interrupted after layer 0: no output directory, no temporary left behind.
  WriteOptions wo;
  wo.after_layer = [](int l) {
    if (l == 0) throw std::runtime_error("simulated interruption");
  };
  EXPECT_THROW(write_quantized_checkpoint(t.m, src, &t.calib, o, (d / "out2").string(), wo),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(d / "out2"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename(), "out") << "left behind: " << e.path();
  fs::remove_all(d);
}

TEST(QuantizeModel, BadOptions) {
  const Toy t = make_toy();
  QuantizeOptions o;
  o.gptq = true;
  try {
    write_quantized_checkpoint(t.m, "x.bin", nullptr, o, "/tmp/never", {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--gptq needs calibration"), std::string::npos)
        << e.what();
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
  bad.calib.layers[1].inputs[3].dim = 32;
  o = {};
  o.gptq = true;
  EXPECT_THROW(write_quantized_checkpoint(t.m, "x.bin", &bad.calib, o, "/tmp/never", {}),
               std::invalid_argument);
  EXPECT_FALSE(fs::exists("/tmp/never"));
}

}  // namespace
}  // namespace scalesweep::io

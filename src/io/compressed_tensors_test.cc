// compressed-tensors NVFP4 layout (nvfp4_linear_tensors / read_nvfp4_*), reader validation,
// quantization_config, the streaming safetensors writer and its Hugging Face sharding. Inputs
// are built with quant calls only (no pipeline).
#include "scalesweep/io/compressed_tensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>

#include "base/test_util.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

using scalesweep::testing::randn;
using scalesweep::testing::throws_with;

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
  const scalesweep::testing::TempDir tmp("ss_io_ct_test_layout");
  const fs::path& d = tmp.path();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8, 64}, {5, 172}, {3, 37}}) {
    const auto x = randn(rows * cols, 3, 0.1f);
    QuantConfig cfg;
    const QuantizedTensor q = quantize(x.data(), rows, cols, {}, cfg, "w");
    const auto blobs = nvfp4_linear_tensors("model.layers.0.mlp.down_proj", q, 123.5f);
    ASSERT_EQ(blobs.size(), 4u);
    EXPECT_EQ(blobs[0].name, "model.layers.0.mlp.down_proj.weight_packed");
    EXPECT_EQ(blobs[0].dtype, StDType::kU8);
    EXPECT_EQ(blobs[0].shape, (std::vector<int64_t>{rows, (cols + 1) / 2}));
    EXPECT_EQ(blobs[1].dtype, StDType::kF8E4M3);
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
}

TEST(CompressedTensors, ReaderRejectsCorruptTensors) {
  const scalesweep::testing::TempDir tmp("ss_io_ct_test_corrupt");
  const fs::path& d = tmp.path();
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
  // What changes how the checkpoint runs is read or refused by name.
  auto message = [](const json& j) -> std::string {
    try {
      parse_quantization_config(j, "cfg");
    } catch (const IoError& e) {
      return e.what();
    }
    return "no error";
  };
  json a8 = json{{"quantization_config", c}};
  a8["quantization_config"]["config_groups"]["group_0"]["input_activations"]["num_bits"] = 8;
  EXPECT_NE(message(a8).find("cfg: quantization_config: group 'group_0' input_activations"),
            std::string::npos)
      << message(a8);
  json stat = json{{"quantization_config", c}};
  stat["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = true;
  EXPECT_NE(message(stat).find("are not NVFP4"), std::string::npos) << message(stat);
  json kv = json{{"quantization_config", c}};
  kv["quantization_config"]["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "float"}};
  EXPECT_NE(message(kv).find("kv_cache_scheme"), std::string::npos) << message(kv);
  json out = json{{"quantization_config", c}};
  out["quantization_config"]["config_groups"]["group_0"]["output_activations"] = {{"a", 1}};
  EXPECT_NE(message(out).find("output_activations"), std::string::npos) << message(out);
  json mixed = json{{"quantization_config", c}};
  mixed["quantization_config"]["config_groups"]["group_1"] =
      nvfp4_quantization_config(false, 16, {})["config_groups"]["group_0"];
  EXPECT_NE(message(mixed).find("groups differ in input_activations"), std::string::npos)
      << message(mixed);
}

// Found by fuzz/quantization_config_fuzz.cc: a field of the wrong JSON type ("format":
// ["lm_head"]) escaped as nlohmann's type_error ("type must be string, but is array", no file,
// no field); a group_size of 2^32 + 16 was read through int as 16; non-string 'ignore'
// entries were dropped silently. Each is now refused naming the field.
TEST(CompressedTensors, QuantizationConfigRefusesWrongTypesByField) {
  const json c = nvfp4_quantization_config(true, 16, {"lm_head"});
  auto message = [](const json& q) -> std::string {
    try {
      parse_quantization_config(json{{"quantization_config", q}}, "cfg");
    } catch (const IoError& e) {
      return e.what();
    }
    return "no error";
  };
  json fmt = c;
  fmt["format"] = json::array({"lm_head"});
  EXPECT_NE(message(fmt).find("cfg: quantization_config: 'format' is [\"lm_head\"], not a string"),
            std::string::npos)
      << message(fmt);
  json method = c;
  method["quant_method"] = 7;
  EXPECT_NE(message(method).find("'quant_method' is 7, not a string"), std::string::npos)
      << message(method);
  json bits = c;
  bits["config_groups"]["group_0"]["weights"]["num_bits"] = "4";
  EXPECT_NE(message(bits).find("group 'group_0' weights 'num_bits' is \"4\", not an integer"),
            std::string::npos)
      << message(bits);
  json strategy = c;
  strategy["config_groups"]["group_0"]["input_activations"]["strategy"] = json::object();
  EXPECT_NE(message(strategy).find("input_activations 'strategy' is {}, not a string"),
            std::string::npos)
      << message(strategy);
  json wrap = c;
  wrap["config_groups"]["group_0"]["weights"]["group_size"] = (uint64_t{1} << 32) + 16;
  EXPECT_NE(message(wrap).find("group_size 4294967312"), std::string::npos) << message(wrap);
  json group = c;
  group["config_groups"]["group_0"] = 3;
  EXPECT_NE(message(group).find("group 'group_0' is not an object"), std::string::npos)
      << message(group);
  json ignore = c;
  ignore["ignore"] = json::array({"lm_head", 5});
  EXPECT_NE(message(ignore).find("'ignore'[1] is 5, not a module name"), std::string::npos)
      << message(ignore);
  ignore["ignore"] = "lm_head";
  EXPECT_NE(message(ignore).find("'ignore' is \"lm_head\", not a list"), std::string::npos)
      << message(ignore);
}

TEST(CompressedTensors, StreamWriter) {
  const scalesweep::testing::TempDir tmp("ss_io_ct_test_stream");
  const fs::path& d = tmp.path();
  const std::vector<uint8_t> a = {1, 2, 3}, b(8, 7);
  {
    SafetensorsStreamWriter w;
    w.declare("a", StDType::kU8, {3});
    w.declare("b", StDType::kF32, {2});
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
    w.declare("a", StDType::kU8, {3});
    w.declare("b", StDType::kF32, {2});
    w.open((d / "y.safetensors").string());
    EXPECT_THROW(w.write("b", b), IoError);
    EXPECT_THROW(w.write("a", b), IoError);
    w.write("a", a);
    EXPECT_THROW(w.commit(), IoError);
  }
  EXPECT_FALSE(fs::exists(d / "y.safetensors"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename(), "x.safetensors") << "left behind: " << e.path();
}

TEST(CompressedTensors, StreamWriterTakesATensorInParts) {
  const scalesweep::testing::TempDir tmp("ss_io_ct_test_parts");
  const fs::path& d = tmp.path();
  std::vector<uint8_t> b(40);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 7 + 1);
  const std::vector<uint8_t> a = {9, 8, 7};
  auto declare = [&](SafetensorsStreamWriter& w) {
    w.declare("a", StDType::kU8, {3});
    w.declare("b", StDType::kF32, {10});
  };
  {  // whole, and in uneven parts (an empty one among them): the same file
    SafetensorsStreamWriter whole, parts;
    declare(whole);
    declare(parts);
    whole.open((d / "whole.safetensors").string());
    parts.open((d / "parts.safetensors").string());
    whole.write("a", a);
    whole.write("b", b);
    parts.write_part("a", a);
    const std::span<const uint8_t> s(b);
    parts.write_part("b", s.subspan(0, 13));
    parts.write_part("b", s.subspan(13, 0));
    parts.write_part("b", s.subspan(13, 20));
    parts.write_part("b", s.subspan(33));
    whole.commit();
    parts.commit();
  }
  auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(d / "whole.safetensors"), bytes(d / "parts.safetensors"));
  {  // more than declared, and a tensor left half written: errors naming it, no file
    SafetensorsStreamWriter w;
    declare(w);
    w.open((d / "bad.safetensors").string());
    w.write_part("a", a);
    w.write_part("b", std::span<const uint8_t>(b).subspan(0, 30));
    EXPECT_TRUE(
        throws_with<IoError>([&] { w.write_part("b", std::span<const uint8_t>(b).subspan(0, 11)); },
                             "tensor 'b' has 41 bytes or more, declared 40"));
    EXPECT_TRUE(throws_with<IoError>([&] { w.commit(); },
                                     "'b' (tensor 1) was not written whole (30 of 40 bytes)"));
  }
  EXPECT_FALSE(fs::exists(d / "bad.safetensors"));
  // Sharded: a tensor in parts completes its shard once its last part arrives.
  const scalesweep::testing::TempDir tmp_ds("ss_io_ct_test_parts_sharded");
  const fs::path& ds = tmp_ds.path();
  ShardedStreamWriter sw(40);
  sw.declare("a", StDType::kU8, {3});
  sw.declare("b", StDType::kF32, {10});
  sw.open(ds.string());
  ASSERT_EQ(sw.files().size(), 2u);
  sw.write_part("a", a);
  EXPECT_TRUE(fs::exists(ds / sw.files()[0]));  // shard 1 complete
  sw.write_part("b", std::span<const uint8_t>(b).subspan(0, 25));
  EXPECT_FALSE(fs::exists(ds / sw.files()[1]));
  EXPECT_THROW(sw.commit(), IoError);
  sw.write_part("b", std::span<const uint8_t>(b).subspan(25));
  EXPECT_TRUE(fs::exists(ds / sw.files()[1]));
  sw.commit();
  const SafetensorsFile f = SafetensorsFile::open((ds / sw.files()[1]).string());
  const auto rb = f.raw("b");
  EXPECT_TRUE(std::equal(rb.begin(), rb.end(), b.begin(), b.end()));
}

// An output larger than the file system's free space is refused at open(), before a byte
// is written (a 1 PB tensor): the message names the file, the size and the space free.
TEST(CompressedTensors, OutputLargerThanTheFreeSpaceIsRefusedAtOpen) {
  const scalesweep::testing::TempDir tmp("ss_io_ct_test_nospace");
  const fs::path& d = tmp.path();
  const int64_t huge = int64_t{1} << 50;
  SafetensorsStreamWriter w;
  w.declare("big", StDType::kU8, {huge});
  try {
    w.open((d / "x.safetensors").string());
    FAIL() << "opened";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("x.safetensors: the output needs about"), std::string::npos) << m;
    EXPECT_NE(m.find("free; nothing was written"), std::string::npos) << m;
  }
  ShardedStreamWriter sw(0);
  sw.declare("big", StDType::kU8, {huge});
  EXPECT_THROW(sw.open(d.string()), IoError);
  EXPECT_TRUE(fs::is_empty(d));
}

TEST(ShardedStreamWriter, SplitsAsHuggingFaceHub) {
  const scalesweep::testing::TempDir tmp("ss_io_ct_test_shards");
  const fs::path& d = tmp.path();
  // Sizes 4, 4, 10 (> max 8: a shard of its own, numbered before the one being filled),
  // 4, 4 -> [t2], [t0, t1], [t3, t4].
  ShardedStreamWriter w(8);
  const std::vector<int64_t> n = {4, 4, 10, 4, 4};
  const std::vector<std::string> names = {"t0", "t1", "t2", "t3", "t4"};
  for (size_t i = 0; i < n.size(); ++i) w.declare(names[i], StDType::kU8, {n[i]});
  w.open(d.string());
  EXPECT_EQ(w.files(), (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                 "model-00002-of-00003.safetensors",
                                                 "model-00003-of-00003.safetensors"}));
  for (size_t i = 0; i < n.size(); ++i) {
    const std::vector<uint8_t> b(static_cast<size_t>(n[i]), static_cast<uint8_t>(i + 1));
    if (i == 1) {
      EXPECT_THROW(w.write("t3", b), IoError);  // out of order
    }
    w.write(names[i], b);
  }
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));  // written by commit()
  w.commit();
  EXPECT_EQ(w.data_bytes(), 26u);
  std::ifstream in(d / "model.safetensors.index.json");
  const json idx = json::parse(in);
  EXPECT_EQ(idx["metadata"]["total_size"], 26);
  EXPECT_EQ(idx["metadata"]["total_parameters"], 26);  // U8: one element per byte
  EXPECT_EQ(idx["weight_map"]["t2"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(idx["weight_map"]["t0"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(idx["weight_map"]["t1"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(idx["weight_map"]["t4"], "model-00003-of-00003.safetensors");
  const SafetensorsFile f2 =
      SafetensorsFile::open((d / "model-00002-of-00003.safetensors").string());
  ASSERT_EQ(f2.tensors().size(), 2u);
  EXPECT_EQ(f2.raw("t1")[0], 2);
  uint64_t sz = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".safetensors") sz += fs::file_size(e.path());
  EXPECT_EQ(sz, w.file_bytes());
  // No limit, or everything fits: one model.safetensors and no index.
  const scalesweep::testing::TempDir tmp_d1("ss_io_ct_test_shards1");
  const fs::path& d1 = tmp_d1.path();
  ShardedStreamWriter one(0);
  one.declare("a", StDType::kU8, {100});
  one.open(d1.string());
  EXPECT_EQ(one.files(), std::vector<std::string>{"model.safetensors"});
  one.write("a", std::vector<uint8_t>(100));
  one.commit();
  EXPECT_TRUE(fs::exists(d1 / "model.safetensors"));
  EXPECT_FALSE(fs::exists(d1 / "model.safetensors.index.json"));
  // A tensor never written: commit fails naming it.
  ShardedStreamWriter part(8);
  part.declare("x", StDType::kU8, {4});
  part.declare("y", StDType::kU8, {4});
  part.open(d1.string());
  part.write("x", std::vector<uint8_t>(4));
  EXPECT_TRUE(throws_with<IoError>([&] { part.commit(); }, "'y' (tensor 1) was not written"));
}

}  // namespace
}  // namespace scalesweep::io

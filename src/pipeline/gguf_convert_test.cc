// NVFP4 GGUF output of the quantize job and the lossless conversion CT <-> GGUF, on a small
// synthetic llama model (row lengths multiples of 64; down_proj has 100 columns: dense in both).
#include "scalesweep/pipeline/gguf_convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/test_util.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
namespace {
namespace fs = std::filesystem;
using model::testing::TempDir;

model::Config config() {
  model::Config c = model::testing::tiny_config(false);  // 4 q / 2 kv heads, vocab 40
  c.dim = 64;
  c.hidden_dim = 100;  // down_proj: K % 16 != 0 (dense for vLLM) and K % 64 != 0 (for ggml)
  c.head_dim = 16;
  return c;
}

QuantizeReport write(const io::LoadedModel& m, const std::string& out) {
  QuantizeOptions o;
  o.method = Method::kSweepMse;
  return write_quantized_checkpoint(m, "synthetic.bin", nullptr, o, out, WriteOptions{});
}

using scalesweep::testing::slurp;

TEST(GgufConvert, CtToGgufToCtIsByteIdenticalAndEqualsDirectQuantize) {
  TempDir d("ss_gguf_convert_");
  io::LoadedModel m;
  m.weights = model::testing::random_model(config(), 11);
  write(m, d.sub("ct"));
  const QuantizeReport direct = write(m, d.sub("direct.gguf"));
  EXPECT_EQ(direct.files, std::vector<std::string>{"direct.gguf"});
  int dense = 0;
  for (const LinearResult& r : direct.linears) dense += r.dense;
  EXPECT_EQ(dense, 2);  // down_proj of each layer
  ASSERT_TRUE(is_nvfp4_checkpoint(d.sub("ct")));
  const Nvfp4ConvertReport a =
      convert_ct_to_gguf(d.sub("ct"), d.sub("x.gguf"), io::GgufDense::kF32, false);
  EXPECT_EQ(a.nvfp4_linears, 12);
  EXPECT_EQ(a.dense_linears, 2);
  ASSERT_TRUE(gguf_has_nvfp4(d.sub("x.gguf")));
  const Nvfp4ConvertReport b =
      convert_gguf_to_ct(d.sub("x.gguf"), d.sub("ct2"), DType::kF32, false);
  EXPECT_TRUE(b.global_scales_recorded);
  {  // every tensor byte for byte (the producer metadata says who wrote the file)
    const io::SafetensorsFile s = io::SafetensorsFile::open(d.sub("ct/model.safetensors"));
    const io::SafetensorsFile t = io::SafetensorsFile::open(d.sub("ct2/model.safetensors"));
    ASSERT_EQ(s.tensors().size(), t.tensors().size());
    for (const io::TensorInfo& a : s.tensors()) {
      const io::TensorInfo* b = t.find(a.name);
      ASSERT_NE(b, nullptr) << a.name;
      EXPECT_EQ(a.dtype, b->dtype) << a.name;
      EXPECT_EQ(a.shape, b->shape) << a.name;
      const auto ra = s.raw(a), rb = t.raw(*b);
      EXPECT_TRUE(std::equal(ra.begin(), ra.end(), rb.begin(), rb.end())) << a.name;
    }
  }
  EXPECT_EQ(slurp(d.sub("ct/config.json")), slurp(d.sub("ct2/config.json")));
  // The converted GGUF's tensors are those quantize wrote directly.
  const io::GgufFile x = io::GgufFile::open(d.sub("x.gguf"));
  const io::GgufFile y = io::GgufFile::open(d.sub("direct.gguf"));
  ASSERT_EQ(x.tensors().size(), y.tensors().size());
  for (size_t i = 0; i < x.tensors().size(); ++i) {
    const io::GgufTensorInfo &s = x.tensors()[i], &t = y.tensors()[i];
    EXPECT_EQ(s.name, t.name);
    ASSERT_EQ(s.nbytes, t.nbytes) << s.name;
    EXPECT_EQ(std::memcmp(s.data, t.data, s.nbytes), 0) << s.name;
  }
  EXPECT_NE(x.find_kv(io::kGgufGlobalScalesKey), nullptr);
  EXPECT_EQ(y.find_kv(io::kGgufGlobalScalesKey), nullptr);
  // Without the record: gs = fl(1/scale), noted.
  std::string note;
  const Nvfp4ConvertReport c = convert_gguf_to_ct(d.sub("direct.gguf"), d.sub("ct3"), DType::kF32,
                                                  false, [&](const std::string& s) { note += s; });
  EXPECT_FALSE(c.global_scales_recorded);
  EXPECT_NE(note.find("fl(1 / scale)"), std::string::npos);
}

TEST(GgufConvert, RefusesScaleBytesWithoutAnE4M3Equivalent) {
  TempDir d("ss_gguf_convert_");
  io::LoadedModel m;
  m.weights = model::testing::random_model(config(), 12);
  write(m, d.sub("m.gguf"));
  uint64_t off = 0;
  {
    const io::GgufFile f = io::GgufFile::open(d.sub("m.gguf"));
    const io::GgufTensorInfo* t = f.find_tensor("blk.1.ffn_up.weight");
    ASSERT_NE(t, nullptr);
    off = f.data_offset() + t->offset + 2 * 36 + 1;  // row 2, sub-block 1
  }
  {
    std::fstream f(d.sub("m.gguf"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    const char b = static_cast<char>(0x7F);
    f.write(&b, 1);
  }
  try {
    convert_gguf_to_ct(d.sub("m.gguf"), d.sub("ct"), DType::kF32, false);
    FAIL() << "accepted a 0x7F scale byte";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.1.ffn_up.weight' row 2 block 1: scale "
                                         "byte 0x7F (ggml reads it as 0, E4M3 as NaN)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(d.sub("ct")));
}

TEST(GgufConvert, RequestChecksForGgufOutputs) {
  QuantizeRequest rq;
  rq.out_dir = "x.gguf";
  rq.options.w4a4 = true;
  rq.calib.text = "t.txt";
  EXPECT_THROW(check_quantize_request(rq), std::invalid_argument);
  rq.options.w4a4 = false;
  EXPECT_NO_THROW(check_quantize_request(rq));
  rq.max_shard_bytes = 1000;
  EXPECT_THROW(check_quantize_request(rq), std::invalid_argument);
  rq = {};
  rq.out_dir = "dir";
  rq.dense_q8_0 = true;
  EXPECT_THROW(check_quantize_request(rq), std::invalid_argument);
  rq.out_dir = "m.gguf";
  EXPECT_NO_THROW(check_quantize_request(rq));
  EXPECT_TRUE(io::is_gguf_path("a/b.gguf"));
  EXPECT_FALSE(io::is_gguf_path("a/b.gguf.d"));
  const std::array<bool, 7> g = io::gguf_dense_linears(config(), io::GgufQwen2As::kLlama);
  EXPECT_TRUE(g[static_cast<size_t>(model::LinearId::kDown)]);
  EXPECT_FALSE(g[static_cast<size_t>(model::LinearId::kQ)]);
}

}  // namespace
}  // namespace scalesweep::pipeline

#include "scalesweep/io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "io/atomic_file.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  // Writes header JSON (raw) + data with an explicit (possibly lying) length.
  std::string write_raw(const std::string& name, const std::string& header,
                        const std::vector<uint8_t>& data, int64_t len = -1) {
    std::ofstream f(p(name), std::ios::binary);
    const uint64_t n = len < 0 ? header.size() : static_cast<uint64_t>(len);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    return p(name);
  }
  // Expects open() to fail with a message containing every fragment.
  void expect_open_error(const std::string& path, std::vector<std::string> fragments) {
    try {
      SafetensorsFile::open(path);
      FAIL() << "expected an error for " << path;
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
    }
  }
  // A file `name` of `header` and `data_bytes` zero bytes of data, and the fragments its
  // refusal must name.
  struct BadFile {
    std::string name, header;
    size_t data_bytes;
    std::vector<std::string> fragments;
  };
  void expect_open_errors(const std::vector<BadFile>& files) {
    for (const BadFile& b : files)
      expect_open_error(write_raw(b.name, b.header, std::vector<uint8_t>(b.data_bytes)),
                        b.fragments);
  }
  scalesweep::testing::TempDir tmp_{"ss_st_test"};
  const fs::path& dir_ = tmp_.path();
};

TEST_F(SafetensorsTest, RoundTripAllDtypes) {
  SafetensorsWriter w;
  const std::vector<float> f32 = {1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e-40f};
  w.add_f32("a.f32", {2, 3}, f32);
  std::vector<uint8_t> f16(4 * 2), bf16(4 * 2), f64(2 * 8), u8 = {0, 7, 255};
  const float src16[4] = {1.0f, -0.5f, 65504.0f, 6.103515625e-05f};
  for (int i = 0; i < 4; ++i) {
    const uint16_t h = format::f32_to_f16(src16[i]), b = format::f32_to_bf16(src16[i]);
    f16[2 * i] = h & 0xFF;
    f16[2 * i + 1] = h >> 8;
    bf16[2 * i] = b & 0xFF;
    bf16[2 * i + 1] = b >> 8;
  }
  const double d[2] = {0.1, -1e30};
  std::memcpy(f64.data(), d, 16);
  w.add("b.f16", StDType::kF16, {4}, std::span<const uint8_t>(f16));
  w.add("c.bf16", StDType::kBF16, {2, 2}, std::span<const uint8_t>(bf16));
  w.add("d.f64", StDType::kF64, {2}, std::span<const uint8_t>(f64));
  w.add("e.u8", StDType::kU8, {3}, std::span<const uint8_t>(u8));
  w.add("f.e4m3", StDType::kF8E4M3, {1, 3}, std::span<const uint8_t>(u8));
  w.add("g.i32", StDType::kI32, {1}, std::vector<uint8_t>{1, 0, 0, 0});
  w.add("h.i64", StDType::kI64, {1}, std::vector<uint8_t>{2, 0, 0, 0, 0, 0, 0, 0});
  w.add("i.i8", StDType::kI8, {2}, std::vector<uint8_t>{0xFF, 1});
  w.add("j.empty", StDType::kF32, {0, 4}, std::vector<uint8_t>{});
  w.add("k.scalar", StDType::kF32, {}, std::vector<uint8_t>{0, 0, 0x80, 0x3F});
  w.set_metadata("format", "pt");
  w.set_metadata("note", "quote\" and \\ and \xC3\xA9");
  const std::string path = p("rt.safetensors");
  w.write(path);

  // The bytes on disk are exactly serialize().
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(disk, w.serialize());
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | disk[i];
  EXPECT_EQ(hl % 8, 0u);

  const auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 11u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "quote\" and \\ and \xC3\xA9");
  EXPECT_EQ(f.read_f32("a.f32"), f32);
  EXPECT_EQ(f.at("a.f32").shape, (std::vector<int64_t>{2, 3}));
  const auto h = f.read_f32("b.f16");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h[i], src16[i]);
  const auto b = f.read_f32("c.bf16");
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -0.5f);
  EXPECT_EQ(b[2], format::bf16_to_f32(format::f32_to_bf16(65504.0f)));
  const auto dd = f.read_f32("d.f64");
  EXPECT_EQ(dd[0], 0.1f);
  EXPECT_EQ(dd[1], -1e30f);
  const auto raw = f.raw("f.e4m3");
  EXPECT_EQ(std::vector<uint8_t>(raw.begin(), raw.end()), u8);
  EXPECT_EQ(f.at("f.e4m3").dtype, StDType::kF8E4M3);
  EXPECT_EQ(f.at("g.i32").dtype, StDType::kI32);
  EXPECT_EQ(f.at("j.empty").nbytes, 0u);
  EXPECT_EQ(f.read_f32("k.scalar"), std::vector<float>{1.0f});
  EXPECT_TRUE(f.at("k.scalar").shape.empty());
  // Non-float dtypes do not silently convert.
  EXPECT_THROW(f.read_f32("e.u8"), IoError);
  // Tensors are listed in file order.
  for (size_t i = 1; i < f.tensors().size(); ++i) {
    EXPECT_LE(f.tensors()[i - 1].offset, f.tensors()[i].offset);
  }
}

TEST_F(SafetensorsTest, MissingTensorNamesFileAndTensor) {
  SafetensorsWriter w;
  w.add_f32("present", {1}, std::vector<float>{1.0f});
  w.write(p("m.safetensors"));
  const auto f = SafetensorsFile::open(p("m.safetensors"));
  try {
    f.at("absent");
    FAIL();
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("m.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("absent"), std::string::npos) << m;
    EXPECT_NE(m.find("present"), std::string::npos) << m;
  }
  EXPECT_EQ(f.find("absent"), nullptr);
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  SafetensorsWriter w;
  EXPECT_THROW(w.add("x", StDType::kF32, {2}, std::vector<uint8_t>(4)), IoError);  // size lie
  EXPECT_THROW(w.add("", StDType::kU8, {1}, std::vector<uint8_t>(1)), IoError);
  EXPECT_THROW(w.add("__metadata__", StDType::kU8, {1}, std::vector<uint8_t>(1)), IoError);
  w.add("x", StDType::kU8, {1}, std::vector<uint8_t>(1));
  EXPECT_THROW(w.add("x", StDType::kU8, {1}, std::vector<uint8_t>(1)), IoError);  // duplicate
  // Directory missing: error, nothing written.
  EXPECT_THROW(w.write(p("no/such/dir/x.safetensors")), IoError);
}

TEST_F(SafetensorsTest, TooShortFile) {
  write_raw("short.safetensors", "", {}, -1);  // 8 bytes of length 0 only
  expect_open_error(p("short.safetensors"), {"too short"});
  std::ofstream(p("tiny.safetensors")) << "abc";
  expect_open_error(p("tiny.safetensors"), {"truncated"});
  std::ofstream(p("empty.safetensors"));
  expect_open_error(p("empty.safetensors"), {"truncated"});
}

TEST_F(SafetensorsTest, TruncatedHeader) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  // The length says the full header, but the file ends in the middle of it.
  const std::string path = write_raw("t.safetensors", h.substr(0, h.size() / 2), {}, h.size());
  expect_open_error(path, {"past the end of the file"});
}

TEST_F(SafetensorsTest, LyingHeaderLength) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_open_error(write_raw("huge.safetensors", h, {0, 0, 0, 0}, int64_t{1} << 40),
                    {"exceeds the limit"});
  // Shorter than the real header: the JSON is cut.
  expect_open_error(write_raw("cut.safetensors", h, {0, 0, 0, 0}, h.size() - 5),
                    {"not valid JSON"});
}

TEST_F(SafetensorsTest, BadJson) {
  expect_open_errors({
      {"j1.safetensors", R"({"a": {"dtype": "F32",)", 0, {"not valid JSON"}},
      {"j2.safetensors", R"([1, 2, 3])", 0, {"start with '{'"}},
      {"j3.safetensors", R"({"a": 5})", 0, {"'a'", "not an object"}},
      {"j4.safetensors",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8,
       {"twice"}},
      {"j5.safetensors", R"({"a":{"dtype":"F32","shape":[1]}})", 0, {"data_offsets"}},
      {"j6.safetensors",
       R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       4,
       {"shape[0]"}},
      {"j7.safetensors",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.5]}})",
       8,
       {"data_offsets[1]"}},
      {"j8.safetensors", R"({"__metadata__":{"k":1}})", 0, {"__metadata__"}},
  });
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_open_error(
      write_raw("d.safetensors", R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}})",
                std::vector<uint8_t>(1)),
      {"'w'", "unsupported dtype", "Q4_K"});
}

// Newer dtypes of the reference implementation (huggingface/safetensors `Dtype`): the file
// opens, sizes are checked as the reference does (numel * bits / 8, a whole number of bytes),
// the F32 tensor beside them reads, and their own data is refused naming file, tensor, dtype.
TEST_F(SafetensorsTest, ForeignDtypesOpenButTheirDataIsRefused) {
  // F4 [2, 3] = 24 bits = 3 bytes, C64 [2] = 16 bytes, F6_E2M3 [4] = 3 bytes, F32 [2] = 8.
  const std::string header = R"({"q":{"dtype":"F4","shape":[2,3],"data_offsets":[8,11]},)"
                             R"("c":{"dtype":"C64","shape":[2],"data_offsets":[11,27]},)"
                             R"("s":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[27,30]},)"
                             R"("u":{"dtype":"F8_E4M3FNUZ","shape":[1],"data_offsets":[30,31]},)"
                             R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> data(31, 0x11);
  const float w[2] = {1.5f, -3.0f};
  std::memcpy(data.data(), w, 8);
  const std::string path = write_raw("f4.safetensors", header, data);
  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.at("q").dtype, StDType::kF4);
  EXPECT_EQ(f.at("q").nbytes, 3u);
  EXPECT_EQ(f.at("c").dtype, StDType::kC64);
  EXPECT_EQ(f.at("c").nbytes, 16u);
  EXPECT_EQ(f.at("s").dtype, StDType::kF6E2M3);
  EXPECT_EQ(f.at("u").dtype, StDType::kF8E4M3FNUZ);
  EXPECT_EQ(f.read_f32("w"), (std::vector<float>{1.5f, -3.0f}));
  EXPECT_EQ(f.raw("w").size(), 8u);
  for (const auto& [name, dt] : std::vector<std::pair<std::string, std::string>>{
           {"q", "F4"}, {"c", "C64"}, {"s", "F6_E2M3"}, {"u", "F8_E4M3FNUZ"}}) {
    for (int via_read_f32 = 0; via_read_f32 < 2; ++via_read_f32) {
      try {
        if (via_read_f32) {
          (void)f.read_f32(name);
        } else {
          (void)f.raw(name);
        }
        ADD_FAILURE() << "expected the data of " << name << " to be refused";
      } catch (const IoError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find("'" + name + "'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("dtype " + dt), std::string::npos) << msg;
      }
    }
  }
  EXPECT_EQ(dtype_bits(StDType::kF4), 4u);
  EXPECT_EQ(dtype_bits(StDType::kF6E3M2), 6u);
  EXPECT_EQ(dtype_size(StDType::kC64), 8u);
  EXPECT_THROW(dtype_size(StDType::kF4), IoError);
  EXPECT_EQ(parse_dtype("F8_E5M2FNUZ"), StDType::kF8E5M2FNUZ);
  EXPECT_EQ(parse_dtype("F6_E3M2"), StDType::kF6E3M2);
}

// The size checks stay strict for them: an F4 count that is not a whole number of bytes
// (the reference's MisalignedSlice), a wrong byte count, and gaps are refused.
TEST_F(SafetensorsTest, ForeignDtypesSizeChecksStayStrict) {
  expect_open_errors({
      {"odd.safetensors",
       R"({"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})",
       2,
       {"'q'", "F4 [3] is 12 bits, not a whole number of bytes"}},
      {"f6.safetensors",
       R"({"q":{"dtype":"F6_E3M2","shape":[2],"data_offsets":[0,2]}})",
       2,
       {"'q'", "12 bits"}},
      {"big.safetensors",
       R"({"q":{"dtype":"F4","shape":[4],"data_offsets":[0,4]}})",
       4,
       {"'q'", "hold 4 bytes but F4 [4] needs 2"}},
      {"c64.safetensors",
       R"({"c":{"dtype":"C64","shape":[1],"data_offsets":[0,4]}})",
       4,
       {"'c'", "needs 8"}},
      {"gap.safetensors",
       R"({"q":{"dtype":"F4","shape":[2],"data_offsets":[0,1]},)"
       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       6,
       {"'w'", "unused bytes"}},
  });
}

TEST_F(SafetensorsTest, OffsetsBeyondFile) {
  expect_open_errors({
      {"o.safetensors",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       12,
       {"'w'", "beyond the data region of 12 bytes"}},
      {"o2.safetensors",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
       12,
       {"end before begin"}},
  });
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_open_errors({
      {"ov.safetensors",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12,
       {"'a'", "'b'", "overlap"}},
  });
}

// The reference implementation (huggingface/safetensors `validate` + read_metadata) accepts
// only offsets that tile the data region: each case below is a file it rejects.
TEST_F(SafetensorsTest, GapBetweenTensors) {
  expect_open_errors({
      {"gap.safetensors",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12,
       {"gap.safetensors", "tensor 'b'", "data_offsets [8, 12)", "4 unused bytes",
        "'a' (data_offsets [0, 4))", "contiguous"}},
      // A gap before the first tensor.
      {"gap0.safetensors",
       R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
       4,
       {"tensor 'a'", "data_offsets [2, 4)", "2 unused bytes", "start of the data region"}},
  });
}

TEST_F(SafetensorsTest, OverlapNamesBothTensorsAndOffsets) {
  expect_open_errors({
      {"ov2.safetensors",
       R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]},)"
       R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
       6,
       {"ov2.safetensors", "'a' (data_offsets [0, 4))", "'b' (data_offsets [2, 6))", "overlap"}},
      // Two tensors sharing one byte range (aliases) are an overlap too.
      {"alias.safetensors",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
       4,
       {"'a'", "'b'", "overlap"}},
  });
}

TEST_F(SafetensorsTest, ShortBuffer) {
  expect_open_errors({
      // The header promises 8 bytes for 'b', the file holds 6: truncated.
      {"short2.safetensors",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
       6,
       {"short2.safetensors", "tensor 'b'", "data_offsets [4, 8)",
        "beyond the data region of 6 bytes"}},
  });
}

TEST_F(SafetensorsTest, TrailingBytes) {
  expect_open_error(
      write_raw("trail.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                std::vector<uint8_t>(7)),
      {"trail.safetensors", "holds 7 bytes", "end at 4", "'a'", "3 trailing bytes"});
  // No tensors but a data region.
  expect_open_error(write_raw("trail0.safetensors", R"({})", std::vector<uint8_t>(2)),
                    {"holds 2 bytes", "no tensors", "2 trailing bytes"});
  // The same files without the extra bytes open, zero-size tensors anywhere in the order too.
  const auto f =
      SafetensorsFile::open(write_raw("ok.safetensors",
                                      R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                      R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                      R"("e":{"dtype":"U8","shape":[0,3],"data_offsets":[4,4]}})",
                                      std::vector<uint8_t>(4)));
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(SafetensorsFile::open(write_raw("empty_ok.safetensors", R"({})", {})).tensors().size(),
            0u);
}

TEST_F(SafetensorsTest, DtypeShapeMismatch) {
  expect_open_error(
      write_raw("mm.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                std::vector<uint8_t>(12)),
      {"'w'", "12 bytes", "F32 [2, 2] needs 16"});
  expect_open_error(
      write_raw("ovf.safetensors",
                R"({"w":{"dtype":"F64","shape":[4611686018427387904,4611686018427387904],)"
                R"("data_offsets":[0,8]}})",
                std::vector<uint8_t>(8)),
      {"overflows"});
}

TEST_F(SafetensorsTest, F64OverflowNamesIndex) {
  SafetensorsWriter w;
  std::vector<uint8_t> b(16);
  const double d[2] = {1.0, 1e300};
  std::memcpy(b.data(), d, 16);
  w.add("big", StDType::kF64, {2}, std::move(b));
  w.write(p("f64.safetensors"));
  const auto f = SafetensorsFile::open(p("f64.safetensors"));
  try {
    f.read_f32("big");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("element 1"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, ReadsFilesWrittenWithHeaderPadding) {
  // Padding spaces after the JSON (as the reference writer does) are accepted.
  const std::string h = R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}     )";
  const auto f = SafetensorsFile::open(write_raw("pad.safetensors", h, {5, 6}));
  const auto r = f.raw("w");
  EXPECT_EQ(r[0], 5);
  EXPECT_EQ(r[1], 6);
}

TEST_F(SafetensorsTest, SplitTensorSpec) {
  std::string file, tensor;
  ASSERT_TRUE(split_tensor_spec("dir/m.safetensors:model.layers.0.w", &file, &tensor));
  EXPECT_EQ(file, "dir/m.safetensors");
  EXPECT_EQ(tensor, "model.layers.0.w");
  EXPECT_FALSE(split_tensor_spec("w.npy", &file, &tensor));
}

TEST_F(SafetensorsTest, AtomicFileLeavesNothingOnFailure) {
  const std::string out = p("a.bin");
  {
    AtomicFile f(out);
    f.write("abc", 3);
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_FALSE(fs::exists(out));
    // destroyed without commit
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
  write_file_atomic(out, std::string_view("hello"));
  std::ifstream in(out);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "hello");
  // Replacing an existing file is atomic too.
  write_file_atomic(out, std::string_view("world"));
  std::ifstream in2(out);
  in2 >> s;
  EXPECT_EQ(s, "world");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(SafetensorsTest, AtomicDir) {
  const std::string out = p("ckpt");
  {
    AtomicDir d(out);
    write_file_atomic(d.path() + "/x.txt", std::string_view("1"));
    EXPECT_FALSE(fs::exists(out));
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
  {
    AtomicDir d(out);
    write_file_atomic(d.path() + "/x.txt", std::string_view("1"));
    d.commit();
  }
  EXPECT_TRUE(fs::exists(out + "/x.txt"));
  EXPECT_THROW(AtomicDir{out}, IoError);  // exists, no overwrite
  {
    AtomicDir d(out, /*overwrite=*/true);
    write_file_atomic(d.path() + "/y.txt", std::string_view("2"));
    d.commit();
  }
  EXPECT_TRUE(fs::exists(out + "/y.txt"));
  EXPECT_FALSE(fs::exists(out + "/x.txt"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace scalesweep::io

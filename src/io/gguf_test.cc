#include "scalesweep/io/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "io/test_util.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/safetensors.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

// The IoError message of `fn` ("" when it throws nothing).
std::string message(const std::function<void()>& fn) {
  return scalesweep::testing::error_of<IoError>(fn);
}

// ------------------------------------------------------------------ a tiny GGUF writer
// Builds the bytes field by field, so tests can write exactly the corruption they check.
struct Bytes {
  std::string b;
  template <typename T>
  Bytes& put(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.append(c, sizeof(T));
    return *this;
  }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Bytes& raw(const std::string& s) {
    b += s;
    return *this;
  }
};

struct KV {
  std::string key;
  uint32_t type;
  std::string payload;  // encoded value (without the type)
};
struct TI {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};

// header + kvs + tensor infos + padding to `align` + data.
std::string build(uint32_t version, const std::vector<KV>& kvs, const std::vector<TI>& tis,
                  const std::string& data, uint64_t align = 32) {
  Bytes o;
  o.raw("GGUF").u32(version).u64(tis.size()).u64(kvs.size());
  for (const KV& kv : kvs) o.str(kv.key).u32(kv.type).raw(kv.payload);
  for (const TI& t : tis) {
    o.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) o.u64(d);
    o.u32(t.type).u64(t.offset);
  }
  while (o.b.size() % align) o.b.push_back('\0');
  return o.b + data;
}

template <typename T>
std::string enc(T v) {
  return Bytes().put(v).b;
}
std::string enc_str(const std::string& s) { return Bytes().str(s).b; }
std::string enc_arr(uint32_t et, const std::vector<std::string>& elems) {
  Bytes o;
  o.u32(et).u64(elems.size());
  for (const auto& e : elems) o.raw(e);
  return o.b;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

class GgufTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  // Opens `bytes` as a file and returns the error message (fails the test when it opens).
  std::string error_of(const std::string& bytes) {
    const std::string path = write("bad.gguf", bytes);
    try {
      GgufFile::open(path);
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      return msg;
    }
    ADD_FAILURE() << "opened without error";
    return "";
  }
  scalesweep::testing::TempDir tmp_{"ss_gguf_test"};
  const fs::path& dir_ = tmp_.path();
};

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// One F32 tensor of 8 elements at offset 0.
const std::string kF32Data = std::string(32, '\x01');
TI f32_tensor(const std::string& name = "w", uint64_t offset = 0) { return {name, {8}, 0, offset}; }

// ------------------------------------------------------------------------ metadata

TEST_F(GgufTest, EveryValueTypeRoundTripsInV2AndV3) {
  for (uint32_t version : {2u, 3u}) {
    std::vector<KV> kvs = {
        {"u8", 0, enc<uint8_t>(200)},
        {"i8", 1, enc<int8_t>(-100)},
        {"u16", 2, enc<uint16_t>(60000)},
        {"i16", 3, enc<int16_t>(-30000)},
        {"u32", 4, enc<uint32_t>(4000000000u)},
        {"i32", 5, enc<int32_t>(-2000000000)},
        {"f32", 6, enc<float>(0.1f)},
        {"bool", 7, enc<uint8_t>(1)},
        {"string", 8, enc_str("héllo")},
        {"u64", 10, enc<uint64_t>(18000000000000000000ull)},
        {"i64", 11, enc<int64_t>(-9000000000000000000ll)},
        {"f64", 12, enc<double>(-1e300)},
        {"arr.str", 9, enc_arr(8, {enc_str("a"), enc_str(""), enc_str("ccc")})},
        {"arr.f32", 9, enc_arr(6, {enc<float>(1.5f), enc<float>(-2.0f)})},
        {"arr.i32", 9, enc_arr(5, {enc<int32_t>(-7), enc<int32_t>(9)})},
        {"arr.u64", 9, enc_arr(10, {enc<uint64_t>(~0ull)})},
        {"arr.bool", 9, enc_arr(7, {enc<uint8_t>(0), enc<uint8_t>(1)})},
        {"arr.nested", 9,
         enc_arr(9, {enc_arr(5, {enc<int32_t>(1)}), enc_arr(8, {enc_str("x"), enc_str("y")})})},
        {"arr.empty", 9, enc_arr(4, {})},
    };
    const std::string path = write("v.gguf", build(version, kvs, {f32_tensor()}, kF32Data));
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 32u);
    ASSERT_EQ(f.metadata().size(), kvs.size());
    for (size_t i = 0; i < kvs.size(); ++i) {
      EXPECT_EQ(f.metadata()[i].first, kvs[i].key);
      EXPECT_EQ(static_cast<uint32_t>(f.metadata()[i].second.type), kvs[i].type);
    }
    io::testing::expect_common_scalars(f, "");
    EXPECT_EQ(*f.get_int("i32"), -2000000000);
    EXPECT_EQ(std::get<uint64_t>(f.find_kv("u64")->scalar), 18000000000000000000ull);
    EXPECT_EQ(*f.get_int("i64"), -9000000000000000000ll);
    EXPECT_EQ(*f.get_float("f64"), -1e300);
    EXPECT_EQ(*f.get_float("i32"), -2000000000.0);  // integers read as numbers too
    EXPECT_EQ(*f.get_string_array("arr.str"), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(*f.get_float_array("arr.f32"), (std::vector<double>{1.5, -2.0}));
    EXPECT_EQ(*f.get_int_array("arr.i32"), (std::vector<int64_t>{-7, 9}));
    EXPECT_EQ(*f.get_float_array("arr.i32"), (std::vector<double>{-7, 9}));
    const GgufValue* b = f.find_kv("arr.bool");
    ASSERT_EQ(b->array.size(), 2u);
    EXPECT_EQ(std::get<bool>(b->array[1].scalar), true);
    const GgufValue* n = f.find_kv("arr.nested");
    EXPECT_EQ(n->elem_type, GgufValueType::kArray);
    ASSERT_EQ(n->array.size(), 2u);
    EXPECT_EQ(n->array[0].elem_type, GgufValueType::kI32);
    EXPECT_EQ(std::get<int64_t>(n->array[0].array[0].scalar), 1);
    EXPECT_EQ(std::get<std::string>(n->array[1].array[1].scalar), "y");
    EXPECT_TRUE(f.get_int_array("arr.empty")->empty());
    EXPECT_EQ(f.find_kv("absent"), nullptr);
    EXPECT_FALSE(f.get_int("absent").has_value());
    EXPECT_FALSE(f.get_string_array("absent").has_value());
    // Wrong types throw naming the file and the key.
    for (const std::function<void()>& fn : std::vector<std::function<void()>>{
             [&] { f.get_string("u32"); }, [&] { f.get_int("f32"); }, [&] { f.get_int("bool"); },
             [&] { f.get_bool("u8"); }, [&] { f.get_float("string"); },
             [&] { f.get_string_array("arr.f32"); }, [&] { f.get_int_array("arr.f32"); },
             [&] { f.get_float_array("arr.str"); }}) {
      try {
        fn();
        ADD_FAILURE() << "no throw";
      } catch (const IoError& e) {
        EXPECT_TRUE(has(e.what(), path)) << e.what();
        EXPECT_TRUE(has(e.what(), "key '")) << e.what();
      }
    }
    // The messages, byte for byte (the same ones gguf_get_* give over a hand-built list).
    EXPECT_EQ(message([&] { f.get_string("u32"); }),
              path + ": key 'u32' is u32, expected a string");
    EXPECT_EQ(message([&] { f.get_float("string"); }),
              path + ": key 'string' is string, expected a number (f32, f64 or integer)");
    EXPECT_EQ(message([&] { f.get_int_array("arr.f32"); }),
              path + ": key 'arr.f32' is array of f32, expected an array of integers");
    EXPECT_EQ(message([&] { f.get_int("u64"); }),  // > INT64_MAX
              path + ": key 'u64': u64 value 18000000000000000000 exceeds the int64 range");
    EXPECT_EQ(message([&] { f.get_int_array("arr.u64"); }),
              path + ": key 'arr.u64' [0]: u64 value 18446744073709551615 exceeds the int64 range");
    EXPECT_EQ(message([&] { f.get_float("u64"); }),  // not rounded to a double either
              path + ": key 'u64': u64 value 18000000000000000000 exceeds the int64 range");
    for (const char* k : {"u32", "string", "arr.f32", "arr.u64", "arr.nested", "absent"}) {
      EXPECT_EQ(message([&] { f.get_int(k); }),
                message([&] { gguf_get_int(f.metadata(), k, path); }));
      EXPECT_EQ(message([&] { f.get_float_array(k); }),
                message([&] { gguf_get_float_array(f.metadata(), k, path); }));
    }
    // The tensor.
    ASSERT_EQ(f.tensors().size(), 1u);
    const GgufTensorInfo* t = f.find_tensor("w");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->numel(), 8);
    EXPECT_EQ(t->nbytes, 32u);
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
    EXPECT_EQ(bits(f.dequantize(*t)[7]), 0x01010101u);
    EXPECT_EQ(f.data_offset() % 32, 0u);
  }
}

TEST_F(GgufTest, SniffLooksAtTheMagic) {
  EXPECT_TRUE(GgufFile::sniff(write("a.gguf", build(3, {}, {}, ""))));
  EXPECT_FALSE(GgufFile::sniff(write("b.gguf", "GGU")));
  EXPECT_FALSE(GgufFile::sniff(write("c.gguf", "{\"a\": 1}")));
  EXPECT_FALSE(GgufFile::sniff((dir_ / "missing").string()));
}

TEST_F(GgufTest, CustomAlignmentPlacesTheDataSection) {
  const std::vector<KV> kvs = {{"general.alignment", 4, enc<uint32_t>(64)}};
  // Two tensors: 8 floats (32 bytes) at 0, 4 floats at 64 (aligned to 64).
  std::string data(128, '\0');
  const float a = 1.25f, b = -3.5f;
  std::memcpy(&data[0], &a, 4);
  std::memcpy(&data[64], &b, 4);
  const std::string path =
      write("al.gguf", build(3, kvs, {{"a", {8}, 0, 0}, {"b", {4}, 0, 64}}, data, 64));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.dequantize(*f.find_tensor("a"))[0], 1.25f);
  EXPECT_EQ(f.dequantize(*f.find_tensor("b"))[0], -3.5f);
  // An offset aligned to 32 but not to 64 is refused.
  const std::string m = error_of(build(3, kvs, {{"a", {8}, 0, 0}, {"b", {4}, 0, 32}}, data, 64));
  EXPECT_TRUE(has(m, "tensor 1 'b'") && has(m, "offset 32") && has(m, "alignment 64")) << m;
}

TEST_F(GgufTest, RejectsBadAlignment) {
  std::string m = error_of(
      build(3, {{"general.alignment", 4, enc<uint32_t>(48)}}, {f32_tensor()}, kF32Data, 16));
  EXPECT_TRUE(has(m, "'general.alignment'") && has(m, "48") && has(m, "power of two")) << m;
  m = error_of(build(3, {{"general.alignment", 4, enc<uint32_t>(0)}}, {}, ""));
  EXPECT_TRUE(has(m, "'general.alignment'") && has(m, "power of two")) << m;
  m = error_of(build(3, {{"general.alignment", 10, enc<uint64_t>(32)}}, {}, ""));
  EXPECT_TRUE(has(m, "'general.alignment'") && has(m, "u64") && has(m, "expected u32")) << m;
}

// ------------------------------------------------------------------ header errors

TEST_F(GgufTest, RejectsBadMagicAndVersions) {
  std::string m = error_of("GGML" + build(3, {}, {}, "").substr(4));
  EXPECT_TRUE(has(m, "bad magic \"GGML\"")) << m;
  m = error_of("GG");
  EXPECT_TRUE(has(m, "bad magic")) << m;
  m = error_of(std::string("\x00\x01GU", 4) + build(3, {}, {}, "").substr(4));
  EXPECT_TRUE(has(m, "\\x00\\x01GU")) << m;
  m = error_of(build(1, {}, {}, ""));
  EXPECT_TRUE(has(m, "version 1 is not supported")) << m;
  m = error_of(build(4, {}, {}, ""));
  EXPECT_TRUE(has(m, "unsupported GGUF version 4")) << m;
  m = error_of(std::string("GGUF\x03\x00", 6));
  EXPECT_TRUE(has(m, "header: version needs 4 bytes")) << m;
}

TEST_F(GgufTest, RejectsCountsThatCannotFit) {
  std::string bytes = build(3, {}, {}, "");
  std::memcpy(&bytes[16], "\xff\xff\xff\xff\xff\xff\xff\x0f", 8);  // n_kv
  std::string m = error_of(bytes);
  EXPECT_TRUE(has(m, "metadata count") && has(m, "cannot fit")) << m;
  bytes = build(3, {}, {}, "");
  std::memcpy(&bytes[8], "\x00\x00\x00\x00\x01\x00\x00\x00", 8);  // n_tensors = 2^32
  m = error_of(bytes);
  EXPECT_TRUE(has(m, "tensor count 4294967296") && has(m, "cannot fit")) << m;
  // An array whose count cannot fit.
  m = error_of(build(3, {{"k", 9, Bytes().u32(5).u64(1ull << 40).b}}, {}, ""));
  EXPECT_TRUE(has(m, "key 0 'k'") && has(m, "array of 1099511627776 i32")) << m;
}

TEST_F(GgufTest, RejectsStringsPastTheEnd) {
  std::string m = error_of(build(3, {{"k", 8, Bytes().u64(1000).raw("abc").b}}, {}, ""));
  EXPECT_TRUE(has(m, "key 0 'k'") && has(m, "string value length 1000")) << m;
  // A key whose length runs past the end: named by its index.
  Bytes o;
  o.raw("GGUF").u32(3).u64(0).u64(1).u64(500).raw("key");
  o.raw(std::string(20, 'x'));
  m = error_of(o.b);
  EXPECT_TRUE(has(m, "key 0: key length 500")) << m;
  // A tensor name past the end.
  Bytes t;
  t.raw("GGUF").u32(3).u64(1).u64(0).u64(99).raw("ab").raw(std::string(30, '\0'));
  m = error_of(t.b);
  EXPECT_TRUE(has(m, "tensor 0: name length 99")) << m;
}

TEST_F(GgufTest, RejectsBadValues) {
  std::string m =
      error_of(build(3, {{"a", 4, enc<uint32_t>(1)}, {"a", 4, enc<uint32_t>(2)}}, {}, ""));
  EXPECT_TRUE(has(m, "key 1 'a'") && has(m, "duplicate key (first at key 0)")) << m;
  m = error_of(build(3, {{"t", 13, enc<uint32_t>(1)}}, {}, ""));
  EXPECT_TRUE(has(m, "key 0 't'") && has(m, "unknown value type 13")) << m;
  m = error_of(build(3, {{"t", 9, Bytes().u32(77).u64(1).u32(0).b}}, {}, ""));
  EXPECT_TRUE(has(m, "key 0 't'") && has(m, "unknown array element type 77")) << m;
  m = error_of(build(3, {{"b", 7, enc<uint8_t>(2)}}, {}, ""));
  EXPECT_TRUE(has(m, "key 0 'b'") && has(m, "bool value 2")) << m;
  m = error_of(
      build(3, {{"ok", 4, enc<uint32_t>(1)}, {"n", 9, enc_arr(7, {enc<uint8_t>(3)})}}, {}, ""));
  EXPECT_TRUE(has(m, "key 1 'n'[0]") && has(m, "bool value 3")) << m;
  // Truncated inside a value.
  Bytes u;
  u.raw("GGUF").u32(3).u64(0).u64(1).str("u").u32(10).raw("\x01\x02");
  m = error_of(u.b);
  EXPECT_TRUE(has(m, "key 0 'u'") && has(m, "u64 value needs 8 bytes")) << m;
  // Arrays nested past the depth limit.
  std::string deep = enc_arr(4, {enc<uint32_t>(1)});
  for (int i = 0; i < 20; ++i) deep = enc_arr(9, {deep});
  m = error_of(build(3, {{"deep", 9, deep}}, {}, ""));
  EXPECT_TRUE(has(m, "key 0 'deep'") && has(m, "nested deeper")) << m;
}

// ------------------------------------------------------------------ tensor errors

TEST_F(GgufTest, RejectsBadTensorInfos) {
  auto one = [&](TI t, const std::string& data = kF32Data) {
    return error_of(build(3, {}, {f32_tensor("first"), t}, std::string(32, '\0') + data));
  };
  std::string m =
      error_of(build(3, {}, {f32_tensor("w"), f32_tensor("w", 32)}, kF32Data + kF32Data));
  EXPECT_TRUE(has(m, "tensor 1 'w'") && has(m, "duplicate tensor name (first at tensor 0)")) << m;
  m = one({"t", {}, 0, 32});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "n_dims 0 is not in 1..4")) << m;
  m = one({"t", {1, 1, 1, 1, 8}, 0, 32});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "n_dims 5")) << m;
  m = one({"t", {8, 0}, 0, 32});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "dimension 1 is 0")) << m;
  m = one({"t", {8, ~0ull}, 0, 32});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "dimension 1 is -1")) << m;
  m = one({"t", {1ull << 40, 1ull << 30}, 0, 32});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "overflows")) << m;
  m = one({"t", {1ull << 62}, 0, 32});  // numel fits, bytes (x4) overflow
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "byte size of F32") && has(m, "overflows")) << m;
  m = one({"t", {8}, 77, 32});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "unknown ggml type 77")) << m;
  m = one({"t", {16, 2}, 2, 32});  // Q4_0 rows of 16
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "row length 16") && has(m, "Q4_0 block size 32"))
      << m;
  m = one({"t", {8}, 0, 40});
  EXPECT_TRUE(has(m, "tensor 1 't'") && has(m, "offset 40") && has(m, "alignment 32")) << m;
}

TEST_F(GgufTest, RejectsDataOutOfBoundsAndOverlaps) {
  // Truncated data: the second tensor's 32 bytes are missing.
  std::string m = error_of(build(3, {}, {f32_tensor("a"), f32_tensor("b", 32)}, kF32Data));
  EXPECT_TRUE(has(m, "tensor 1 'b'") && has(m, "data [32, 64)") && has(m, "runs past the end"))
      << m;
  m = error_of(build(3, {}, {f32_tensor("a", 1ull << 62)}, kF32Data));
  EXPECT_TRUE(has(m, "tensor 0 'a'") && has(m, "runs past the end")) << m;
  // Truncated before the data section starts at all.
  std::string full = build(3, {}, {f32_tensor("a")}, kF32Data);
  m = error_of(full.substr(0, full.size() - 40));
  EXPECT_TRUE(has(m, "data section") || has(m, "tensor 0 'a'")) << m;
  // Overlap: b (64 bytes at 32) covers c at 64.
  m = error_of(build(3, {}, {{"a", {8}, 0, 0}, {"b", {16}, 0, 32}, {"c", {8}, 0, 64}},
                     std::string(96, '\0')));
  EXPECT_TRUE(has(m, "tensor 2 'c'") && has(m, "overlaps tensor 1 'b'")) << m;
  // The same data offset twice.
  m = error_of(build(3, {}, {{"a", {8}, 0, 0}, {"b", {8}, 0, 0}}, kF32Data));
  EXPECT_TRUE(has(m, "overlaps")) << m;
}

TEST_F(GgufTest, RejectsHostileNamesReadably) {
  const std::string m =
      error_of(build(3, {}, {{std::string("a\nb\x01", 4), {8}, 99, 0}}, kF32Data));
  EXPECT_TRUE(has(m, "tensor 0 'a\\nb\\u0001'") && has(m, "type 99")) << m;
}

// ------------------------------------------------------------------ types and dequantization

TEST(GgmlTypes, NamesAndTraits) {
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(ggml_type_name(40), "NVFP4");
  EXPECT_EQ(ggml_type_name(77), "type 77");
  EXPECT_FALSE(ggml_type_traits(77).has_value());
  EXPECT_FALSE(ggml_type_traits(4).has_value());  // removed Q4_2
  const auto q4k = *ggml_type_traits(12);
  EXPECT_EQ(q4k.block_elems, 256);
  EXPECT_EQ(q4k.block_bytes, 144);
  EXPECT_TRUE(q4k.dequantizable);
  EXPECT_EQ(ggml_type_traits(40)->block_bytes, 36);
  EXPECT_EQ(ggml_type_traits(39)->block_bytes, 17);
  EXPECT_EQ(ggml_type_traits(14)->block_bytes, 210);
  EXPECT_EQ(ggml_type_traits(13)->block_bytes, 176);
  EXPECT_FALSE(ggml_type_traits(9)->dequantizable);   // Q8_1
  EXPECT_FALSE(ggml_type_traits(10)->dequantizable);  // Q2_K
  EXPECT_FALSE(ggml_type_traits(11)->dequantizable);  // Q3_K
  EXPECT_EQ(gguf_value_type_name(8), "string");
  EXPECT_EQ(gguf_value_type_name(13), "type 13");
}

std::vector<float> deq(GgmlType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  ggml_dequantize(static_cast<uint32_t>(t), b.data(), n, y.data());
  return y;
}
void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) { std::memcpy(&b[at], &v, 2); }

// E2M1 values by code (sign bit 3), for the hand-computed expectations.
float e2m1(int c) {
  const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

TEST(GgmlDequant, FloatTypes) {
  std::vector<uint8_t> h(8);
  put16(h, 0, 0x3C00);  // 1
  put16(h, 2, 0x0001);  // 2^-24
  put16(h, 4, 0x7C01);  // signalling NaN: payload kept, as numpy does
  put16(h, 6, 0xFC00);  // -inf
  auto y = deq(GgmlType::kF16, h, 4);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(bits(y[2]), 0x7F802000u);
  EXPECT_EQ(bits(y[3]), 0xFF800000u);
  std::vector<uint8_t> bf(4);
  put16(bf, 0, 0x3F80);
  put16(bf, 2, 0xFFC1);
  y = deq(GgmlType::kBF16, bf, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(bits(y[1]), 0xFFC10000u);
  const float v[2] = {3.25f, -0.0f};
  std::vector<uint8_t> f(8);
  std::memcpy(f.data(), v, 8);
  y = deq(GgmlType::kF32, f, 2);
  EXPECT_EQ(y[0], 3.25f);
  EXPECT_EQ(bits(y[1]), 0x80000000u);
}

TEST(GgmlDequant, Q4_0AndQ4_1) {
  std::vector<uint8_t> b(18);
  put16(b, 0, 0x3800);  // d = 0.5
  for (int i = 0; i < 16; ++i) b[2 + i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  auto y = deq(GgmlType::kQ4_0, b, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(i - 8)) << i;
    EXPECT_EQ(y[16 + i], 0.5f * static_cast<float>(7 - i)) << i;
  }
  std::vector<uint8_t> c(20);
  put16(c, 0, 0x3400);  // d = 0.25
  put16(c, 2, 0xBC00);  // m = -1
  for (int i = 0; i < 16; ++i) c[4 + i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  y = deq(GgmlType::kQ4_1, c, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(y[i], 0.25f * static_cast<float>(i) - 1.0f) << i;
    EXPECT_EQ(y[16 + i], 0.25f * static_cast<float>(15 - i) - 1.0f) << i;
  }
}

TEST(GgmlDequant, Q5_0AndQ5_1) {
  const uint32_t qh = 0xA5F00F5Au;
  std::vector<uint8_t> b(22);
  put16(b, 0, 0x3C00);  // d = 1
  std::memcpy(&b[2], &qh, 4);
  for (int i = 0; i < 16; ++i) b[6 + i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  auto y = deq(GgmlType::kQ5_0, b, 32);
  for (int i = 0; i < 32; ++i) {
    const int lo = i < 16 ? i : 15 - (i - 16);
    const int q = lo + 16 * static_cast<int>((qh >> i) & 1);
    EXPECT_EQ(y[i], static_cast<float>(q - 16)) << i;
  }
  std::vector<uint8_t> c(24);
  put16(c, 0, 0x3800);  // d = 0.5
  put16(c, 2, 0x4000);  // m = 2
  std::memcpy(&c[4], &qh, 4);
  for (int i = 0; i < 16; ++i) c[8 + i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  y = deq(GgmlType::kQ5_1, c, 32);
  for (int i = 0; i < 32; ++i) {
    const int lo = i < 16 ? i : 15 - (i - 16);
    const int q = lo + 16 * static_cast<int>((qh >> i) & 1);
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(q) + 2.0f) << i;
  }
}

TEST(GgmlDequant, Q8_0) {
  std::vector<uint8_t> b(34 * 2);
  put16(b, 0, 0x4000);   // d = 2
  put16(b, 34, 0xB800);  // d = -0.5
  for (int i = 0; i < 32; ++i) {
    b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i * 8 - 128));
    b[36 + i] = static_cast<uint8_t>(static_cast<int8_t>(127 - i));
  }
  const auto y = deq(GgmlType::kQ8_0, b, 64);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(y[i], 2.0f * static_cast<float>(i * 8 - 128));
    EXPECT_EQ(y[32 + i], -0.5f * static_cast<float>(127 - i));
  }
}

// Packs the eight 6-bit scales and mins of a Q4_K/Q5_K block (ggml's layout).
std::vector<uint8_t> pack_k_scales(const int sc[8], const int mn[8]) {
  std::vector<uint8_t> s(12);
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  return s;
}

// A Q4_K/Q5_K block of `bytes` bytes: d and dmin (fp16 bits), then the packed scales; the
// codes are left zero.
std::vector<uint8_t> k_block(size_t bytes, uint16_t d, uint16_t dmin,
                             const std::vector<uint8_t>& scales) {
  std::vector<uint8_t> b(bytes);
  put16(b, 0, d);
  put16(b, 2, dmin);
  std::copy(scales.begin(), scales.end(), b.begin() + 4);
  return b;
}

// Checks a dequantized Q4_K/Q5_K block: y[e] = d sc[e/32] code(e) - dmin mn[e/32].
template <class Code>
void expect_k_values(const std::vector<float>& y, float d, float dmin, const int sc[8],
                     const int mn[8], Code code) {
  for (int e = 0; e < 256; ++e) {
    const float dl = d * static_cast<float>(sc[e / 32]);
    const float ml = dmin * static_cast<float>(mn[e / 32]);
    EXPECT_EQ(y[e], dl * static_cast<float>(code(e)) - ml) << e;
  }
}

TEST(GgmlDequant, Q4_KAndQ5_K) {
  const int sc[8] = {1, 2, 63, 17, 33, 48, 5, 62};
  const int mn[8] = {0, 7, 31, 63, 40, 1, 59, 16};
  const auto s = pack_k_scales(sc, mn);
  // Q4_K: d(2) dmin(2) scales(12) qs(128); sub-block j: bytes 32*(j/2).., nibble j%2.
  std::vector<uint8_t> b = k_block(144, 0x3800, 0x3400, s);  // d = 0.5, dmin = 0.25
  auto code = [](int e) { return (e * 7 + 3) % 16; };
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    b[16 + 32 * (j / 2) + l] |= static_cast<uint8_t>(code(e) << (4 * (j % 2)));
  }
  expect_k_values(deq(GgmlType::kQ4_K, b, 256), 0.5f, 0.25f, sc, mn, code);
  // Q5_K: d(2) dmin(2) scales(12) qh(32) qs(128); high bit of sub-block j in bit j of qh[l].
  std::vector<uint8_t> c = k_block(176, 0x3C00, 0x3800, s);  // d = 1, dmin = 0.5
  auto code5 = [](int e) { return (e * 11 + 5) % 32; };
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    c[48 + 32 * (j / 2) + l] |= static_cast<uint8_t>((code5(e) & 15) << (4 * (j % 2)));
    c[16 + l] |= static_cast<uint8_t>((code5(e) >> 4) << j);
  }
  expect_k_values(deq(GgmlType::kQ5_K, c, 256), 1.0f, 0.5f, sc, mn, code5);
}

TEST(GgmlDequant, Q6_K) {
  // ql(128) qh(64) scales(16 x int8) d(2). Element e: half h = e/128, w = e%128; low nibble
  // in ql[64h + w%64] (shift 4*(w/64)), high 2 bits in qh[32h + w%32] (shift 2*(w/32)).
  std::vector<uint8_t> b(210);
  auto code = [](int e) { return (e * 13 + 1) % 64; };
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, w = e % 128;
    b[64 * h + w % 64] |= static_cast<uint8_t>((code(e) & 15) << (4 * (w / 64)));
    b[128 + 32 * h + w % 32] |= static_cast<uint8_t>((code(e) >> 4) << (2 * (w / 32)));
  }
  for (int g = 0; g < 16; ++g) b[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(g * 9 - 70));
  put16(b, 208, 0x3400);  // d = 0.25
  const auto y = deq(GgmlType::kQ6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const float dl = 0.25f * static_cast<float>((e / 16) * 9 - 70);
    EXPECT_EQ(y[e], dl * static_cast<float>(code(e) - 32)) << e;
  }
}

TEST(GgmlDequant, MXFP4) {
  // e(1) qs(16): element i < 16 the low nibble of qs[i], i >= 16 the high nibble of qs[i-16];
  // value E2M1(code) * 2^(e - 127).
  for (int e : {0, 1, 2, 120, 127, 130, 252}) {
    std::vector<uint8_t> b(17);
    b[0] = static_cast<uint8_t>(e);
    for (int i = 0; i < 16; ++i) b[1 + i] = static_cast<uint8_t>(i | ((15 - i) << 4));
    const auto y = deq(GgmlType::kMXFP4, b, 32);
    for (int i = 0; i < 32; ++i) {
      const int c = i < 16 ? i : 15 - (i - 16);
      const double want = static_cast<double>(e2m1(c)) * std::ldexp(1.0, e - 127);
      EXPECT_EQ(static_cast<double>(y[i]), want) << "e " << e << " i " << i;
    }
    EXPECT_EQ(bits(y[8]), 0u) << "code 8 (-0 in E2M1) is +0, as gguf-py's int8 table";
  }
  // e = 255 is a finite 2^128 scale (no NaN): 0.5 * 2^128 = 2^127, 1.0 * 2^128 overflows.
  std::vector<uint8_t> b(17, 0);
  b[0] = 255;
  b[1] = 0x21;  // element 0: code 1 (0.5), element 16: code 2 (1.0)
  const auto y = deq(GgmlType::kMXFP4, b, 32);
  EXPECT_EQ(y[0], std::ldexp(1.0f, 127));
  EXPECT_EQ(bits(y[16]), 0x7F800000u);
}

TEST(GgmlDequant, NVFP4) {
  // Four UE4M3 scales then 4 x 8 code bytes; sub-block j: low nibbles of bytes 4+8j..4+8j+7
  // are elements 16j..16j+7, high nibbles 16j+8..16j+15. 0x7F reads as 0, 0xFF as 480.
  std::vector<uint8_t> b(72);
  const uint8_t scales[8] = {0x38, 0x7F, 0xFF, 0x01, 0x00, 0x80, 0x7E, 0x50};
  const double scale_val[8] = {1.0, 0.0, 480.0, std::ldexp(1.0, -9), 0.0, 0.0, 448.0, 8.0};
  for (int s = 0; s < 2; ++s) {
    for (int j = 0; j < 4; ++j) b[36 * s + j] = scales[4 * s + j];
    for (int i = 0; i < 32; ++i)
      b[36 * s + 4 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  }
  const auto y = deq(GgmlType::kNVFP4, b, 128);
  for (int s = 0; s < 2; ++s) {
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 16; ++k) {
        const int byte = 8 * j + (k % 8);
        const int c = k < 8 ? byte % 16 : 15 - byte % 16;
        const double want = scale_val[4 * s + j] * e2m1(c);
        EXPECT_EQ(static_cast<double>(y[64 * s + 16 * j + k]), want) << s << " " << j << " " << k;
      }
    }
  }
}

TEST(GgmlDequant, RefusesOtherTypesAndPartialBlocks) {
  std::vector<uint8_t> b(300);
  std::vector<float> y(256);
  for (uint32_t t : {9u, 10u, 11u, 15u, 24u, 28u, 77u}) {
    try {
      ggml_dequantize(t, b.data(), t == 9 ? 32 : 256, y.data());
      ADD_FAILURE() << "type " << t;
    } catch (const IoError& e) {
      EXPECT_TRUE(has(e.what(), ggml_type_name(t))) << e.what();
    }
  }
  try {
    ggml_dequantize(2, b.data(), 48, y.data());
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_TRUE(has(e.what(), "48 elements of Q4_0")) << e.what();
  }
}

TEST_F(GgufTest, DequantizeATensorAndRefuseUnsupported) {
  // t0: Q8_0 [32, 2]; t1: Q2_K [256] (recognised, not dequantized).
  std::vector<uint8_t> q8(68);
  put16(q8, 0, 0x3C00);
  put16(q8, 34, 0x4000);
  for (int i = 0; i < 32; ++i) {
    q8[2 + i] = static_cast<uint8_t>(i);
    q8[36 + i] = static_cast<uint8_t>(-i);
  }
  std::string data(reinterpret_cast<const char*>(q8.data()), q8.size());
  data.resize(96, '\0');
  data += std::string(84, '\0');
  const std::string path =
      write("q.gguf", build(3, {}, {{"t0", {32, 2}, 8, 0}, {"t1", {256}, 10, 96}}, data));
  const GgufFile f = GgufFile::open(path);
  const auto& t0 = f.tensors()[0];
  EXPECT_EQ(t0.nbytes, 68u);
  const auto y = f.dequantize(t0);
  ASSERT_EQ(y.size(), 64u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(y[i], static_cast<float>(i));
    EXPECT_EQ(y[32 + i], -2.0f * static_cast<float>(i));
  }
  try {
    f.dequantize(f.tensors()[1]);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_TRUE(has(e.what(), path) && has(e.what(), "tensor 1 't1'") && has(e.what(), "Q2_K"))
        << e.what();
  }
  // The safetensors dump refuses before writing anything.
  const std::string out = (dir_ / "o.safetensors").string();
  EXPECT_THROW(write_dequantized_safetensors(f, {}, out), IoError);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_THROW(write_dequantized_safetensors(f, {"nope"}, out), IoError);
  EXPECT_EQ(write_dequantized_safetensors(f, {"t0"}, out), 1u);
  const SafetensorsFile st = SafetensorsFile::open(out);
  EXPECT_EQ(st.at("t0").shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(st.read_f32("t0"), y);
}

// The free getters over a hand-built list (what gguf_model.cc reads): values whose scalar does
// not match their type, or array elements of another type than the array's, are refused naming
// the key and index instead of crashing; the first of duplicate keys wins.
TEST(GgufMetadataTest, HandBuiltListsAreCheckedNotTrusted) {
  using VT = GgufValueType;
  GgufMetadata m;
  m.emplace_back("n", gguf_value(VT::kI32, int64_t{-5}));
  m.emplace_back("n", gguf_value(VT::kI32, int64_t{7}));                  // duplicate: ignored
  m.emplace_back("u_as_double", gguf_value(VT::kU32, 3.0));               // type says integer
  m.emplace_back("f_as_int", gguf_value(VT::kF32, int64_t{1}));           // type says float
  m.emplace_back("b_as_str", gguf_value(VT::kBool, std::string("yes")));  // type says bool
  m.emplace_back("mixed", gguf_value_array(VT::kI32, {gguf_value(VT::kI32, int64_t{1}),
                                                      gguf_value(VT::kString, std::string("x"))}));
  m.emplace_back("strs_bad", gguf_value_array(VT::kString, {gguf_value(VT::kString, int64_t{1})}));
  m.emplace_back("nums", gguf_value_array(VT::kU64, {gguf_value(VT::kU64, uint64_t{1} << 63),
                                                     gguf_value(VT::kU64, uint64_t{2})}));
  const std::string file = "hand.gguf";
  EXPECT_EQ(*gguf_get_int(m, "n", file), -5);
  EXPECT_EQ(*gguf_get_float(m, "n", file), -5.0);
  EXPECT_EQ(gguf_find_kv(m, "n"), &m[0].second);
  EXPECT_FALSE(gguf_get_bool(m, "absent", file).has_value());
  // Each refusal: the call, and its message after "hand.gguf: key ".
  const std::pair<std::function<void()>, std::string> refusals[] = {
      {[&] { gguf_get_int(m, "u_as_double", file); }, "'u_as_double' holds no integer"},
      {[&] { gguf_get_float(m, "f_as_int", file); }, "'f_as_int' holds no number"},
      {[&] { gguf_get_bool(m, "b_as_str", file); }, "'b_as_str' holds no bool"},
      {[&] { gguf_get_bool(m, "n", file); }, "'n' is i32, expected a bool"},
      {[&] { gguf_get_int_array(m, "mixed", file); }, "'mixed' [1] is string in an array of i32"},
      {[&] { gguf_get_string_array(m, "strs_bad", file); }, "'strs_bad' [0] holds no string"},
      {[&] { gguf_get_string_array(m, "nums", file); },
       "'nums' is array of u64, expected an array of strings"},
      {[&] { gguf_get_int_array(m, "nums", file); },
       "'nums' [0]: u64 value 9223372036854775808 exceeds the int64 range"},
      {[&] { gguf_get_float_array(m, "nums", file); },
       "'nums' [0]: u64 value 9223372036854775808 exceeds the int64 range"},
  };
  for (const auto& [call, want] : refusals) EXPECT_EQ(message(call), "hand.gguf: key " + want);
  EXPECT_TRUE(gguf_is_int_type(VT::kU64) && !gguf_is_int_type(VT::kF32));
  EXPECT_TRUE(gguf_is_float_type(VT::kF64) && !gguf_is_float_type(VT::kBool));
}

}  // namespace
}  // namespace scalesweep::io

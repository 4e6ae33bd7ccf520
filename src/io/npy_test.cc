#include "scalesweep/io/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

// A .npy image as numpy writes it: version major.0, header text padded to 64 bytes.
std::vector<uint8_t> make_npy(int major, const std::string& dict, const std::vector<uint8_t>& data,
                              int64_t lie_len = -1) {
  std::string h = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  const uint64_t n = lie_len < 0 ? h.size() : static_cast<uint64_t>(lie_len);
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class NpyTest : public ::testing::Test {
 protected:
  std::string put(const std::string& name, const std::vector<uint8_t>& img) {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    return path;
  }
  void expect_error(const std::string& path, const std::string& fragment) {
    try {
      read_npy(path);
      FAIL() << "expected an error: " << fragment;
    } catch (const IoError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find(fragment), std::string::npos) << m;
    }
  }
  // A version 1.0 file `name` with header `dict` and `data_bytes` zero bytes of data.
  void expect_v1_error(const std::string& name, const std::string& dict, size_t data_bytes,
                       const std::string& fragment) {
    expect_error(put(name, make_npy(1, dict, std::vector<uint8_t>(data_bytes))), fragment);
  }
  scalesweep::testing::TempDir tmp_{"ss_npy_test"};
  const fs::path& dir_ = tmp_.path();
};

TEST_F(NpyTest, ReadsVersions123) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  for (int major : {1, 2, 3}) {
    const auto path =
        put("v" + std::to_string(major) + ".npy",
            make_npy(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                     bytes_of(v)));
    const auto a = read_npy_f32(path);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.data, v);
  }
}

TEST_F(NpyTest, ConvertsFloat16AndFloat64) {
  std::vector<uint16_t> h = {format::f32_to_f16(1.5f), format::f32_to_f16(-65504.0f),
                             format::f32_to_f16(5.9604644775390625e-8f)};
  auto a = read_npy_f32(
      put("h.npy",
          make_npy(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", bytes_of(h))));
  EXPECT_EQ(a.data, (std::vector<float>{1.5f, -65504.0f, 5.9604644775390625e-8f}));
  std::vector<double> d = {0.1, -2.0, 1e-50};
  a = read_npy_f32(put(
      "d.npy",
      make_npy(1, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (3,)}", bytes_of(d))));
  EXPECT_EQ(a.data, (std::vector<float>{0.1f, -2.0f, 0.0f}));
  d = {1.0, 1e300};
  try {
    read_npy_f32(
        put("big.npy",
            make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", bytes_of(d))));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("element 1"), std::string::npos) << e.what();
  }
}

TEST_F(NpyTest, Uint8AndScalarAndEmpty) {
  auto a = read_npy(put(
      "u.npy",
      make_npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", {1, 2, 3, 255})));
  EXPECT_EQ(a.dtype, StDType::kU8);
  EXPECT_EQ(a.data, (std::vector<uint8_t>{1, 2, 3, 255}));
  EXPECT_THROW(read_npy_f32(put("u2.npy", make_npy(1,
                                                   "{'descr': '|u1', 'fortran_order': False, "
                                                   "'shape': (1,), }",
                                                   {1}))),
               IoError);
  a = read_npy(put("s.npy", make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                                     bytes_of(std::vector<float>{7}))));
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.numel(), 1);
  a = read_npy(
      put("e.npy", make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", {})));
  EXPECT_EQ(a.numel(), 0);
}

TEST_F(NpyTest, WriteRoundTrip) {
  const std::vector<float> v = {1, -2, 3.5f, 0};
  const std::string path = (dir_ / "w.npy").string();
  write_npy_f32(path, {4, 1}, v);
  auto a = read_npy_f32(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(a.data, v);
  // The header is 64-byte aligned as numpy writes it.
  const auto img = serialize_npy(StDType::kU8, {3}, std::vector<uint8_t>{1, 2, 3});
  EXPECT_EQ((img.size() - 3) % 64, 0u);
  const auto b = parse_npy(img, "mem");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3}));
  EXPECT_THROW(serialize_npy(StDType::kU8, {4}, std::vector<uint8_t>{1, 2, 3}), IoError);
  EXPECT_THROW(write_npy_f32((dir_ / "no/dir/x.npy").string(), {1}, v), IoError);
}

TEST_F(NpyTest, RejectsBadMagic) {
  auto img = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                      std::vector<uint8_t>(4));
  img[1] = 'X';
  expect_error(put("m.npy", img), "bad magic");
  expect_error(put("short.npy", {0x93, 'N'}), "bad magic");
}

TEST_F(NpyTest, RejectsUnknownVersion) {
  auto img = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                      std::vector<uint8_t>(4));
  img[6] = 9;
  expect_error(put("v.npy", img), "version 9.0");
}

TEST_F(NpyTest, RejectsFortranOrder) {
  expect_v1_error("f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16,
                  "fortran_order");
}

TEST_F(NpyTest, RejectsBigEndian) {
  expect_v1_error("be.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4,
                  "big-endian");
}

TEST_F(NpyTest, RejectsUnsupportedDtype) {
  expect_v1_error("c.npy", "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8,
                  "'<c8' is not supported");
  expect_v1_error("o.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8,
                  "not supported");
}

TEST_F(NpyTest, RejectsTruncatedData) {
  expect_v1_error("t.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", 60,
                  "data truncated");
}

TEST_F(NpyTest, RejectsShapeLies) {
  // More data than the shape: the shape lies.
  expect_v1_error("l.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12,
                  "unexpected bytes");
  expect_v1_error("ovf.npy",
                  "{'descr': '<f4', 'fortran_order': False, 'shape': (288230376151711744, 64), }",
                  0, "overflows");
  expect_v1_error("neg.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 0,
                  "not a non-negative integer");
}

TEST_F(NpyTest, RejectsLyingHeaderLength) {
  expect_error(
      put("hl.npy", make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                             std::vector<uint8_t>(4), 60000)),
      "runs past the end");
  // Too short: the dict is cut.
  expect_error(
      put("hs.npy", make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                             std::vector<uint8_t>(4), 20)),
      "malformed .npy header");
}

TEST_F(NpyTest, RejectsMalformedHeader) {
  expect_error(put("k.npy", make_npy(1,
                                     "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "
                                     "'extra': 1}",
                                     std::vector<uint8_t>(4))),
               "unexpected key");
  expect_v1_error("n.npy", "{'descr': '<f4', 'shape': (1,)}", 4, "lacks");
  expect_v1_error("g.npy", "{'descr': '<f4', 'fortran_order': Nope, 'shape': (1,)}", 4,
                  "True or False");
}

TEST_F(NpyTest, MissingFile) { expect_error((dir_ / "absent.npy").string(), "cannot open"); }

}  // namespace
}  // namespace scalesweep::io

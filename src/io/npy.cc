#include "scalesweep/io/npy.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>

#include "io/atomic_file.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// A minimal parser of the Python dict literal of a .npy header.
class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& path) : s_(s), path_(path) {}

  void parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    parse_sequence('{', '}', "", [&] {
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        if (have_descr) fail("key 'descr' appears twice");
        *descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) fail("key 'fortran_order' appears twice");
        *fortran = parse_bool();
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) fail("key 'shape' appears twice");
        *shape = parse_shape();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
    });
    // Only spaces and the final newline may follow.
    for (; i_ < s_.size(); ++i_) {
      if (s_[i_] != ' ' && s_[i_] != '\n' && s_[i_] != '\t' && s_[i_] != '\0') {
        fail("unexpected text after the header dict");
      }
    }
    if (!have_descr || !have_fortran || !have_shape) {
      fail("header lacks one of 'descr', 'fortran_order', 'shape'");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw IoError(path_ + ": malformed .npy header at character " + std::to_string(i_) + ": " +
                  what);
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  // `open` item (',' item)* [','] `close`, item() parsing each item; `where` ends the message
  // of a missing separator.
  template <class F>
  void parse_sequence(char open, char close, const char* where, F item) {
    expect(open);
    for (;;) {
      skip_ws();
      if (peek() == close) {
        ++i_;
        break;
      }
      item();
      skip_ws();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != close) {
        fail(std::string("expected ',' or '") + close + "'" + where);
      }
    }
  }
  std::string parse_string() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail("escape sequences are not supported");
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  bool parse_bool() {
    skip_ws();
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    parse_sequence('(', ')', " in shape", [&] {
      if (!std::isdigit(static_cast<unsigned char>(peek()))) {
        fail("shape entry " + std::to_string(shape.size()) + " is not a non-negative integer");
      }
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (v > (int64_t{1} << 58))
          fail("shape entry " + std::to_string(shape.size()) + " too big");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 long suffix
      shape.push_back(v);
    });
    if (shape.size() > 32) fail("more than 32 dimensions");
    return shape;
  }

  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

// The .npy type codes (the descr without its byte-order character) of the dtypes read and
// written here: one table for both directions. One-byte types have no byte order.
struct NpyType {
  StDType dtype;
  std::string_view code;
  bool one_byte() const { return code[1] == '1'; }
};
constexpr NpyType kNpyTypes[] = {
    {StDType::kF32, "f4"}, {StDType::kF16, "f2"}, {StDType::kF64, "f8"}, {StDType::kU8, "u1"},
    {StDType::kI8, "i1"},  {StDType::kI32, "i4"}, {StDType::kI64, "i8"}, {StDType::kBool, "b1"}};

StDType descr_dtype(const std::string& d, const std::string& path) {
  auto fail = [&](const std::string& why) -> IoError {
    return IoError(path + ": dtype '" + d + "' " + why +
                   " (supported: little-endian float32, float16, float64, uint8, int8, int32, "
                   "int64)");
  };
  if (d.size() < 3) throw fail("is not supported");
  const char order = d[0];
  const std::string_view t = std::string_view(d).substr(1);
  const NpyType* type = nullptr;
  for (const NpyType& n : kNpyTypes)
    if (n.code == t) type = &n;
  if (type && type->one_byte()) return type->dtype;  // any byte-order character
  if (order == '>') throw fail("is big-endian");
  if (order != '<' && order != '=' && order != '|') throw fail("is not supported");
  if (type) return type->dtype;
  throw fail("is not supported");
}

std::string dtype_descr(StDType d) {
  for (const NpyType& n : kNpyTypes)
    if (n.dtype == d) return std::string(n.one_byte() ? "|" : "<").append(n.code);
  throw IoError("npy writer: dtype " + std::string(dtype_name(d)) + " has no .npy equivalent");
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyArray parse_npy(std::span<const uint8_t> b, const std::string& path) {
  if (b.size() < 10 || std::memcmp(b.data(), kMagic, 6) != 0) {
    throw IoError(path + ": not a .npy file (bad magic; expected \\x93NUMPY)");
  }
  const int major = b[6], minor = b[7];
  uint64_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = b[8] | (uint64_t{b[9]} << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) throw IoError(path + ": truncated .npy header");
    hlen = b[8] | (uint64_t{b[9]} << 8) | (uint64_t{b[10]} << 16) | (uint64_t{b[11]} << 24);
    hstart = 12;
  } else {
    throw IoError(path + ": unsupported .npy version " + std::to_string(major) + "." +
                  std::to_string(minor));
  }
  if (minor != 0) {
    throw IoError(path + ": unsupported .npy version " + std::to_string(major) + "." +
                  std::to_string(minor));
  }
  if (hstart + hlen > b.size()) {
    throw IoError(path + ": .npy header length " + std::to_string(hlen) +
                  " runs past the end of the file (" + std::to_string(b.size()) +
                  " bytes): truncated or corrupt");
  }
  const std::string_view header(reinterpret_cast<const char*>(b.data() + hstart), hlen);
  std::string descr;
  bool fortran = false;
  NpyArray a;
  HeaderParser(header, path).parse(&descr, &fortran, &a.shape);
  if (fortran) {
    throw IoError(path +
                  ": fortran_order arrays are not supported (save C-order: "
                  "np.ascontiguousarray)");
  }
  a.dtype = descr_dtype(descr, path);
  uint64_t need = dtype_size(a.dtype);
  for (int64_t d : a.shape) {
    if (__builtin_mul_overflow(need, static_cast<uint64_t>(d), &need)) {
      throw IoError(path + ": shape " + shape_str(a.shape) + " overflows");
    }
  }
  const uint64_t have = b.size() - hstart - hlen;
  if (have < need) {
    throw IoError(path + ": data truncated: shape " + shape_str(a.shape) + " of '" + descr +
                  "' needs " + std::to_string(need) + " bytes, the file holds " +
                  std::to_string(have));
  }
  if (have > need) {
    throw IoError(path + ": " + std::to_string(have - need) +
                  " unexpected bytes after the data of shape " + shape_str(a.shape) +
                  " (header lies about the shape?)");
  }
  const uint8_t* d = b.data() + hstart + hlen;
  a.data.assign(d, d + need);
  return a;
}

NpyArray read_npy(const std::string& path) {
  MappedFile m(path);
  return parse_npy(m.bytes(), path);
}

NpyF32 read_npy_f32(const std::string& path) {
  NpyArray a = read_npy(path);
  NpyF32 out;
  out.shape = a.shape;
  const size_t n = static_cast<size_t>(a.numel());
  out.data.resize(n);
  const uint8_t* b = a.data.data();
  switch (a.dtype) {
    case StDType::kF32:
      if (n) std::memcpy(out.data.data(), b, n * 4);
      break;
    case StDType::kF16:
      for (size_t i = 0; i < n; ++i) {
        out.data[i] = format::f16_to_f32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
      }
      break;
    case StDType::kF64:
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, b + 8 * i, 8);
        if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max()) {
          throw IoError(path + ": element " + std::to_string(i) + " = " + std::to_string(v) +
                        " overflows float32");
        }
        out.data[i] = static_cast<float>(v);
      }
      break;
    default:
      throw IoError(path + ": dtype " + std::string(dtype_name(a.dtype)) +
                    " is not a float array (need float32, float16 or float64)");
  }
  return out;
}

std::vector<uint8_t> serialize_npy(StDType dtype, const std::vector<int64_t>& shape,
                                   std::span<const uint8_t> bytes) {
  uint64_t need = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(need, static_cast<uint64_t>(d), &need)) {
      throw IoError("npy writer: bad shape " + shape_str(shape));
    }
  }
  if (need != bytes.size()) {
    throw IoError("npy writer: " + std::to_string(bytes.size()) + " bytes given but shape " +
                  shape_str(shape) + " needs " + std::to_string(need));
  }
  std::string h = "{'descr': '" + dtype_descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    h += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) h += ",";
    if (i + 1 < shape.size()) h += " ";
  }
  h += "), }";
  // Pad so that magic + len + header + '\n' is a multiple of 64.
  int major = 1;
  size_t prefix = 10;
  if (h.size() + 1 + prefix > 65535 + 10) {
    major = 2;
    prefix = 12;
  }
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::vector<uint8_t> out(kMagic, kMagic + 6);
  out.push_back(static_cast<uint8_t>(major));
  out.push_back(0);
  const uint64_t n = h.size();
  out.push_back(static_cast<uint8_t>(n));
  out.push_back(static_cast<uint8_t>(n >> 8));
  if (major == 2) {
    out.push_back(static_cast<uint8_t>(n >> 16));
    out.push_back(static_cast<uint8_t>(n >> 24));
  }
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), bytes.begin(), bytes.end());
  return out;
}

void write_npy(const std::string& path, StDType dtype, const std::vector<int64_t>& shape,
               std::span<const uint8_t> bytes) {
  const auto img = serialize_npy(dtype, shape, bytes);
  write_file_atomic(path, std::span<const uint8_t>(img));
}

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   std::span<const float> values) {
  write_npy(
      path, StDType::kF32, shape,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4));
}

}  // namespace scalesweep::io

#include "scalesweep/io/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {

namespace {

constexpr const char* kValueTypeNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
constexpr uint32_t kNumValueTypes = 13;

// Quoted, JSON-escaped, so control characters in hostile names stay readable.
std::string qname(std::string_view s) {
  using nlohmann::json;
  const std::string j = json(std::string(s)).dump(-1, ' ', true, json::error_handler_t::replace);
  std::string out(1, '\'');
  out.append(j, 1, j.size() - 2);
  out.push_back('\'');
  return out;
}

std::string shape_of(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

// Bounds-checked little-endian cursor over the mapping. `where` describes what is being read
// for the error message ("key 3 'general.name'").
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  IoError fail(const std::string& what) const { return IoError(path_ + ": " + what); }

  const uint8_t* take(uint64_t n, const std::string& where, const char* what) {
    if (n > left()) {
      throw fail(where + ": " + what + " needs " + std::to_string(n) + " bytes at offset " +
                 std::to_string(pos_) + " but the file has only " + std::to_string(left()) +
                 " left (truncated or corrupt)");
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T get(const std::string& where, const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), where, what), sizeof(T));
    return v;
  }
  std::string str(const std::string& where, const char* what) {
    const uint64_t n = get<uint64_t>(where, what);
    if (n > left()) {
      throw fail(where + ": " + what + " length " + std::to_string(n) + " at offset " +
                 std::to_string(pos_ - 8) + " runs past the end of the file (" +
                 std::to_string(left()) + " bytes left)");
    }
    const uint8_t* p = take(n, where, what);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of a type (for checking counts against the file).
uint64_t min_value_bytes(uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kString:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 1;
}

constexpr int kMaxArrayDepth = 16;

GgufValue read_value(Cursor& c, uint32_t type, const std::string& where, int depth) {
  if (type >= kNumValueTypes) {
    throw c.fail(where + ": unknown value type " + std::to_string(type));
  }
  GgufValue v;
  v.type = static_cast<GgufValueType>(type);
  switch (v.type) {
    case GgufValueType::kU8:
      v.scalar = uint64_t{c.get<uint8_t>(where, "u8 value")};
      break;
    case GgufValueType::kI8:
      v.scalar = int64_t{c.get<int8_t>(where, "i8 value")};
      break;
    case GgufValueType::kU16:
      v.scalar = uint64_t{c.get<uint16_t>(where, "u16 value")};
      break;
    case GgufValueType::kI16:
      v.scalar = int64_t{c.get<int16_t>(where, "i16 value")};
      break;
    case GgufValueType::kU32:
      v.scalar = uint64_t{c.get<uint32_t>(where, "u32 value")};
      break;
    case GgufValueType::kI32:
      v.scalar = int64_t{c.get<int32_t>(where, "i32 value")};
      break;
    case GgufValueType::kF32:
      v.scalar = double{c.get<float>(where, "f32 value")};
      break;
    case GgufValueType::kBool: {
      const uint8_t b = c.get<uint8_t>(where, "bool value");
      if (b > 1) {
        throw c.fail(where + ": bool value " + std::to_string(b) + " at offset " +
                     std::to_string(c.pos() - 1) + " is neither 0 nor 1");
      }
      v.scalar = b == 1;
      break;
    }
    case GgufValueType::kString:
      v.scalar = c.str(where, "string value");
      break;
    case GgufValueType::kU64:
      v.scalar = c.get<uint64_t>(where, "u64 value");
      break;
    case GgufValueType::kI64:
      v.scalar = c.get<int64_t>(where, "i64 value");
      break;
    case GgufValueType::kF64:
      v.scalar = c.get<double>(where, "f64 value");
      break;
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        throw c.fail(where + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      }
      const uint32_t et = c.get<uint32_t>(where, "array element type");
      if (et >= kNumValueTypes) {
        throw c.fail(where + ": unknown array element type " + std::to_string(et));
      }
      const uint64_t n = c.get<uint64_t>(where, "array length");
      if (n > c.left() / min_value_bytes(et)) {
        throw c.fail(where + ": array of " + std::to_string(n) + " " + kValueTypeNames[et] +
                     " values cannot fit in the " + std::to_string(c.left()) +
                     " bytes left in the file");
      }
      v.elem_type = static_cast<GgufValueType>(et);
      v.array.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        v.array.push_back(read_value(c, et, where + "[" + std::to_string(i) + "]", depth + 1));
      }
      break;
    }
  }
  return v;
}

}  // namespace

std::string gguf_value_type_name(uint32_t type) {
  if (type < kNumValueTypes) return kValueTypeNames[type];
  return "type " + std::to_string(type);
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

// ------------------------------------------------------------------------------ GgufFile

bool GgufFile::sniff(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char m[4] = {};
  const ssize_t got = ::read(fd, m, 4);
  ::close(fd);
  return got == 4 && std::memcmp(m, "GGUF", 4) == 0;
}

namespace {

using NameIndex = std::map<std::string, size_t, std::less<>>;

// Refuses a file that does not start with "GGUF", showing what it starts with instead.
void check_magic(const Cursor& c, std::span<const uint8_t> bytes) {
  const uint64_t fsize = bytes.size();
  if (fsize >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0) return;
  std::string got;
  for (uint64_t i = 0; i < std::min<uint64_t>(fsize, 4); ++i) {
    const uint8_t ch = bytes[i];
    if (ch >= 0x20 && ch < 0x7F) {
      got.push_back(static_cast<char>(ch));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      got += buf;
    }
  }
  throw c.fail("not a GGUF file: bad magic \"" + got + "\" (expected \"GGUF\")");
}

struct GgufHeader {
  uint32_t version = 0;
  uint64_t n_tensors = 0, n_kv = 0;
};

// The header after the magic: version and the two counts, each checked against the file.
GgufHeader read_header(Cursor& c) {
  const std::string hdr = "header";
  c.take(4, hdr, "magic");
  GgufHeader h;
  h.version = c.get<uint32_t>(hdr, "version");
  if (h.version == 1) {
    throw c.fail(
        "GGUF version 1 is not supported (it has 32-bit counts and lengths; re-convert the model "
        "with a current llama.cpp / gguf-py to get version 3)");
  }
  if (h.version != 2 && h.version != 3) {
    throw c.fail("unsupported GGUF version " + std::to_string(h.version) + " (supported: 2 and 3)");
  }
  h.n_tensors = c.get<uint64_t>(hdr, "tensor count");
  h.n_kv = c.get<uint64_t>(hdr, "metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
  // least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes.
  if (h.n_kv > c.left() / 13) {
    throw c.fail("header: metadata count " + std::to_string(h.n_kv) + " cannot fit in the " +
                 std::to_string(c.left()) + " bytes left in the file");
  }
  if (h.n_tensors > c.left() / 32) {
    throw c.fail("header: tensor count " + std::to_string(h.n_tensors) + " cannot fit in the " +
                 std::to_string(c.left()) + " bytes left in the file");
  }
  return h;
}

// The n metadata key-value pairs, keys unique and not empty.
void read_metadata(Cursor& c, uint64_t n, GgufMetadata& kv, NameIndex& index) {
  kv.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string at = "key " + std::to_string(i);
    std::string key = c.str(at, "key");
    const std::string where = at + " " + qname(key);
    if (key.empty()) throw c.fail(at + ": empty key");
    const uint32_t type = c.get<uint32_t>(where, "value type");
    GgufValue v = read_value(c, type, where, 0);
    if (!index.emplace(key, kv.size()).second) {
      throw c.fail(where + ": duplicate key (first at key " +
                   std::to_string(index.find(key)->second) + ")");
    }
    kv.emplace_back(std::move(key), std::move(v));
  }
}

// general.alignment when present (a u32 power of two), else `alignment` unchanged.
void read_alignment(const Cursor& c, const GgufValue* a, const NameIndex& index,
                    uint64_t& alignment) {
  if (!a) return;
  const std::string where =
      "key " + std::to_string(index.find("general.alignment")->second) + " 'general.alignment'";
  if (a->type != GgufValueType::kU32) {
    throw c.fail(where + ": type " + gguf_value_type_name(static_cast<uint32_t>(a->type)) +
                 ", expected u32");
  }
  const uint64_t al = std::get<uint64_t>(a->scalar);
  if (al == 0 || (al & (al - 1)) != 0) {
    throw c.fail(where + ": " + std::to_string(al) + " is not a power of two");
  }
  alignment = al;
}

// Tensor info i: name, shape, type and offset, its byte size computed without overflow.
GgufTensorInfo read_tensor_info(Cursor& c, uint64_t i, uint64_t alignment) {
  const std::string at = "tensor " + std::to_string(i);
  GgufTensorInfo t;
  t.name = c.str(at, "name");
  const std::string where = at + " " + qname(t.name);
  if (t.name.empty()) throw c.fail(at + ": empty name");
  const uint32_t n_dims = c.get<uint32_t>(where, "n_dims");
  if (n_dims < 1 || n_dims > 4) {
    throw c.fail(where + ": n_dims " + std::to_string(n_dims) + " is not in 1..4");
  }
  uint64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t ne = c.get<uint64_t>(where, "dimension");
    if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw c.fail(where + ": dimension " + std::to_string(d) + " is " +
                   (ne == 0 ? std::string("0") : std::to_string(static_cast<int64_t>(ne))) +
                   " (must be positive)");
    }
    t.ne.push_back(static_cast<int64_t>(ne));
    if (__builtin_mul_overflow(numel, ne, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw c.fail(where + ": shape " + shape_of(t.ne) + "... overflows");
    }
  }
  t.type = c.get<uint32_t>(where, "type");
  const std::optional<GgmlTypeTraits> te = ggml_type_traits(t.type);
  if (!te) {
    throw c.fail(where + ": unknown ggml " + ggml_type_name(t.type));
  }
  if (t.ne[0] % te->block_elems != 0) {
    throw c.fail(where + ": row length " + std::to_string(t.ne[0]) + " (ne[0] of " +
                 shape_of(t.ne) + ") is not a multiple of the " + ggml_type_name(t.type) +
                 " block size " + std::to_string(te->block_elems));
  }
  if (__builtin_mul_overflow(numel / static_cast<uint64_t>(te->block_elems),
                             static_cast<uint64_t>(te->block_bytes), &t.nbytes)) {
    throw c.fail(where + ": byte size of " + ggml_type_name(t.type) + " " + shape_of(t.ne) +
                 " overflows");
  }
  t.offset = c.get<uint64_t>(where, "offset");
  if (t.offset % alignment != 0) {
    throw c.fail(where + ": offset " + std::to_string(t.offset) +
                 " is not a multiple of the alignment " + std::to_string(alignment));
  }
  return t;
}

// The data section: the header end padded to the alignment. Points every tensor at its data,
// which must lie inside the section; returns the section's file offset.
uint64_t place_tensor_data(const Cursor& c, std::span<const uint8_t> bytes, uint64_t alignment,
                           std::vector<GgufTensorInfo>& tensors) {
  const uint64_t fsize = bytes.size();
  const uint64_t end = c.pos();
  const uint64_t pad = (alignment - end % alignment) % alignment;
  if (!tensors.empty() && pad > fsize - end) {
    throw c.fail("data section: header ends at " + std::to_string(end) +
                 ", the padding to the alignment " + std::to_string(alignment) +
                 " runs past the end of the file (" + std::to_string(fsize) + " bytes)");
  }
  const uint64_t data_offset = std::min(end + pad, fsize);
  const uint64_t data_size = fsize - data_offset;
  for (size_t i = 0; i < tensors.size(); ++i) {
    GgufTensorInfo& t = tensors[i];
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      throw c.fail("tensor " + std::to_string(i) + " " + qname(t.name) + ": data [" +
                   std::to_string(t.offset) + ", " + std::to_string(t.offset + t.nbytes) + ") of " +
                   ggml_type_name(t.type) + " " + shape_of(t.ne) +
                   " runs past the end of the data section (" + std::to_string(data_size) +
                   " bytes; file truncated?)");
    }
    t.data = bytes.data() + data_offset + t.offset;
  }
  return data_offset;
}

// Refuses two tensors whose data overlap (checked in offset order).
void check_no_overlap(const Cursor& c, const std::vector<GgufTensorInfo>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& p = tensors[order[k - 1]];
    const GgufTensorInfo& t = tensors[order[k]];
    if (t.offset < p.offset + p.nbytes) {
      throw c.fail("tensor " + std::to_string(order[k]) + " " + qname(t.name) + ": data [" +
                   std::to_string(t.offset) + ", " + std::to_string(t.offset + t.nbytes) +
                   ") overlaps tensor " + std::to_string(order[k - 1]) + " " + qname(p.name) +
                   " [" + std::to_string(p.offset) + ", " + std::to_string(p.offset + p.nbytes) +
                   ")");
    }
  }
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.map_ = MappedFile(path);
  const auto bytes = f.map_.bytes();
  Cursor c(f.map_.path(), bytes.data(), bytes.size());
  check_magic(c, bytes);
  const GgufHeader h = read_header(c);
  f.version_ = h.version;
  read_metadata(c, h.n_kv, f.kv_, f.kv_index_);
  read_alignment(c, f.find_kv("general.alignment"), f.kv_index_, f.alignment_);
  f.tensors_.reserve(h.n_tensors);
  for (uint64_t i = 0; i < h.n_tensors; ++i) {
    GgufTensorInfo t = read_tensor_info(c, i, f.alignment_);
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second) {
      throw c.fail("tensor " + std::to_string(i) + " " + qname(t.name) +
                   ": duplicate tensor name (first at tensor " +
                   std::to_string(f.tensor_index_.find(t.name)->second) + ")");
    }
    f.tensors_.push_back(std::move(t));
  }
  f.data_offset_ = place_tensor_data(c, bytes, f.alignment_, f.tensors_);
  check_no_overlap(c, f.tensors_);
  return f;
}

const GgufValue* GgufFile::find_kv(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

// ---- typed metadata access (the one implementation; GgufFile's getters forward here) -------

const GgufValue* gguf_find_kv(const GgufMetadata& m, std::string_view key) {
  for (const auto& [k, v] : m) {
    if (k == key) return &v;
  }
  return nullptr;
}

void gguf_set_kv(GgufMetadata& m, const std::string& key, GgufValue v) {
  for (auto& [k, old] : m)
    if (k == key) {
      old = std::move(v);
      return;
    }
  m.emplace_back(key, std::move(v));
}

void gguf_erase_kv(GgufMetadata& m, std::string_view key) {
  std::erase_if(m, [&](const auto& e) { return e.first == key; });
}

bool gguf_is_int_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

bool gguf_is_float_type(GgufValueType t) {
  return t == GgufValueType::kF32 || t == GgufValueType::kF64;
}

namespace {

bool is_number_type(GgufValueType t) { return gguf_is_int_type(t) || gguf_is_float_type(t); }

// "key 'k'" or, for an array element, "key 'k' [3]".
std::string key_at(std::string_view key, std::optional<size_t> index = std::nullopt) {
  std::string s = "key " + qname(key);
  if (index) s += " [" + std::to_string(*index) + "]";
  return s;
}

[[noreturn]] void wrong_type(const std::string& file, std::string_view key, const GgufValue& v,
                             const char* expected) {
  std::string got = gguf_value_type_name(static_cast<uint32_t>(v.type));
  if (v.type == GgufValueType::kArray) {
    got += " of " + gguf_value_type_name(static_cast<uint32_t>(v.elem_type));
  }
  throw IoError(file + ": " + key_at(key) + " is " + got + ", expected " + expected);
}

// The scalar of `v` as T, or an error when a (hand-built) value's scalar does not match its type.
template <typename T>
const T& held(const GgufValue& v, const std::string& file, std::string_view key,
              std::optional<size_t> index, const char* what) {
  if (const T* p = std::get_if<T>(&v.scalar)) return *p;
  throw IoError(file + ": " + key_at(key, index) + " holds no " + what);
}

// A value of an integer type as int64 (a u64 above INT64_MAX refused).
int64_t int_value(const GgufValue& v, const std::string& file, std::string_view key,
                  std::optional<size_t> index) {
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw IoError(file + ": " + key_at(key, index) + ": u64 value " + std::to_string(*u) +
                    " exceeds the int64 range");
    }
    return static_cast<int64_t>(*u);
  }
  return held<int64_t>(v, file, key, index, "integer");
}

// A value of a number type as double (an integer through int_value, so a u64 above INT64_MAX is
// refused here too rather than rounded).
double num_value(const GgufValue& v, const std::string& file, std::string_view key,
                 std::optional<size_t> index) {
  if (gguf_is_float_type(v.type)) return held<double>(v, file, key, index, "number");
  return static_cast<double>(int_value(v, file, key, index));
}

// The array under `key` (null when absent) after checking its type and that of every element.
const GgufValue* get_array(const GgufMetadata& m, std::string_view key, const std::string& file,
                           bool (*elem_ok)(GgufValueType), const char* expected) {
  const GgufValue* v = gguf_find_kv(m, key);
  if (!v) return nullptr;
  if (v->type != GgufValueType::kArray || !elem_ok(v->elem_type)) {
    wrong_type(file, key, *v, expected);
  }
  for (size_t i = 0; i < v->array.size(); ++i) {
    if (v->array[i].type != v->elem_type) {
      throw IoError(file + ": " + key_at(key, i) + " is " +
                    gguf_value_type_name(static_cast<uint32_t>(v->array[i].type)) +
                    " in an array of " + gguf_value_type_name(static_cast<uint32_t>(v->elem_type)));
    }
  }
  return v;
}

}  // namespace

std::optional<std::string> gguf_get_string(const GgufMetadata& m, std::string_view key,
                                           const std::string& file) {
  const GgufValue* v = gguf_find_kv(m, key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kString) wrong_type(file, key, *v, "a string");
  return held<std::string>(*v, file, key, std::nullopt, "string");
}

std::optional<int64_t> gguf_get_int(const GgufMetadata& m, std::string_view key,
                                    const std::string& file) {
  const GgufValue* v = gguf_find_kv(m, key);
  if (!v) return std::nullopt;
  if (!gguf_is_int_type(v->type)) wrong_type(file, key, *v, "an integer");
  return int_value(*v, file, key, std::nullopt);
}

std::optional<double> gguf_get_float(const GgufMetadata& m, std::string_view key,
                                     const std::string& file) {
  const GgufValue* v = gguf_find_kv(m, key);
  if (!v) return std::nullopt;
  if (!is_number_type(v->type)) wrong_type(file, key, *v, "a number (f32, f64 or integer)");
  return num_value(*v, file, key, std::nullopt);
}

std::optional<bool> gguf_get_bool(const GgufMetadata& m, std::string_view key,
                                  const std::string& file) {
  const GgufValue* v = gguf_find_kv(m, key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kBool) wrong_type(file, key, *v, "a bool");
  return held<bool>(*v, file, key, std::nullopt, "bool");
}

std::optional<std::vector<std::string>> gguf_get_string_array(const GgufMetadata& m,
                                                              std::string_view key,
                                                              const std::string& file) {
  const GgufValue* v = get_array(
      m, key, file, [](GgufValueType t) { return t == GgufValueType::kString; },
      "an array of strings");
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (size_t i = 0; i < v->array.size(); ++i) {
    out.push_back(held<std::string>(v->array[i], file, key, i, "string"));
  }
  return out;
}

std::optional<std::vector<double>> gguf_get_float_array(const GgufMetadata& m, std::string_view key,
                                                        const std::string& file) {
  const GgufValue* v = get_array(m, key, file, is_number_type, "an array of numbers");
  if (!v) return std::nullopt;
  std::vector<double> out(v->array.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = num_value(v->array[i], file, key, i);
  return out;
}

std::optional<std::vector<int64_t>> gguf_get_int_array(const GgufMetadata& m, std::string_view key,
                                                       const std::string& file) {
  const GgufValue* v = get_array(m, key, file, gguf_is_int_type, "an array of integers");
  if (!v) return std::nullopt;
  std::vector<int64_t> out(v->array.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = int_value(v->array[i], file, key, i);
  return out;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  return gguf_get_string(kv_, key, path());
}
std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  return gguf_get_int(kv_, key, path());
}
std::optional<double> GgufFile::get_float(std::string_view key) const {
  return gguf_get_float(kv_, key, path());
}
std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  return gguf_get_bool(kv_, key, path());
}
std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  return gguf_get_string_array(kv_, key, path());
}
std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  return gguf_get_float_array(kv_, key, path());
}
std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  return gguf_get_int_array(kv_, key, path());
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  const std::optional<GgmlTypeTraits> e = ggml_type_traits(t.type);
  if (!e || !e->dequantizable) {
    const auto it = tensor_index_.find(t.name);
    const std::string idx =
        it == tensor_index_.end() ? std::string() : " " + std::to_string(it->second);
    throw IoError(path() + ": tensor" + idx + " " + qname(t.name) +
                  ": cannot dequantize ggml type " + ggml_type_name(t.type) +
                  " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, "
                  "MXFP4, NVFP4)");
  }
  std::vector<float> out(static_cast<size_t>(t.numel()));
  format::ggml_dequantize(t.type, t.data, t.numel(), out.data());
  return out;
}

size_t write_dequantized_safetensors(const GgufFile& f, const std::vector<std::string>& names,
                                     const std::string& out) {
  std::vector<const GgufTensorInfo*> sel;
  if (names.empty()) {
    for (const GgufTensorInfo& t : f.tensors()) sel.push_back(&t);
  } else {
    for (const std::string& n : names) {
      const GgufTensorInfo* t = f.find_tensor(n);
      if (!t) throw IoError(f.path() + ": no tensor " + qname(n));
      sel.push_back(t);
    }
  }
  SafetensorsStreamWriter w;
  for (const GgufTensorInfo* t : sel) {
    const auto tr = ggml_type_traits(t->type);
    if (!tr || !tr->dequantizable) {
      const size_t idx = static_cast<size_t>(t - f.tensors().data());
      throw IoError(f.path() + ": tensor " + std::to_string(idx) + " " + qname(t->name) +
                    ": cannot dequantize ggml type " + ggml_type_name(t->type));
    }
    w.declare(t->name, StDType::kF32, std::vector<int64_t>(t->ne.rbegin(), t->ne.rend()));
  }
  w.set_metadata("source", f.path());
  w.open(out);
  for (const GgufTensorInfo* t : sel) {
    const std::vector<float> v = f.dequantize(*t);
    w.write(t->name, {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
  }
  w.commit();
  return sel.size();
}

void ggml_dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  try {
    format::ggml_dequantize(type, src, n, dst);
  } catch (const std::invalid_argument& e) {
    throw IoError(e.what());
  }
}

}  // namespace scalesweep::io

// GGUF reader (llama.cpp's model file format, versions 2 and 3): memory-mapped, read-only,
// validated as strictly as the safetensors reader. The ggml block types and their scalar
// dequantizers live in format/ggml.h.
//
// Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv metadata
// entries (string key, u32 value type, value), then n_tensors tensor infos (string name, u32
// n_dims, n_dims x u64 ne, u32 ggml type, u64 offset), padding to `general.alignment` (default
// 32), then the data section; tensor offsets are relative to its start and aligned. Strings are
// u64 length + bytes; arrays are u32 element type + u64 count + elements.
//
// Every error is an IoError whose message names the file and, where it applies, the key or
// the tensor with its index ("m.gguf: tensor 3 'blk.0.attn_q.weight': offset 17 is not a
// multiple of the alignment 32").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "scalesweep/format/ggml.h"
#include "scalesweep/io/file.h"  // IoError, MappedFile

namespace scalesweep::io {

// The ggml types (format/ggml.h), named here as the reader's API always named them.
using format::ggml_type_name;
using format::ggml_type_traits;
using format::GgmlType;
using format::GgmlTypeTraits;

enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kF32,
  kBool,
  kString,
  kArray,
  kU64,
  kI64,
  kF64,
};
// "u8", "string", "array", ... ; "type 99" for unknown ids.
std::string gguf_value_type_name(uint32_t type);

// One metadata value. `scalar` holds uint64_t for the unsigned types, int64_t for the signed
// ones, double for f32/f64 (an f32 exactly), bool, or std::string; arrays leave it at its
// default and fill elem_type + array (nested arrays nest).
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string> scalar;
  GgufValueType elem_type = GgufValueType::kU8;  // arrays
  std::vector<GgufValue> array;                  // arrays
};

// The metadata of a file: (key, value) in file order. GgufFile::metadata() holds one; tests and
// callers may build one by hand.
using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

// Typed metadata access over a GgufMetadata: the one implementation of these rules (GgufFile's
// getters forward here). `file` prefixes every message. Each returns nullopt when the key is
// absent and throws IoError naming the file and key on a wrong type ("m.gguf: key 'k' is u32,
// expected a string"), on a value its type cannot hold (a hand-built value whose scalar does
// not match its type) or on an out-of-range value (naming the array index). A key that occurs
// more than once (possible only in a hand-built list) reads as its first occurrence.
const GgufValue* gguf_find_kv(const GgufMetadata& m, std::string_view key);  // null when absent
// Replaces the value of `key` where it stands (its first occurrence), else appends the pair.
void gguf_set_kv(GgufMetadata& m, const std::string& key, GgufValue v);
void gguf_erase_kv(GgufMetadata& m, std::string_view key);  // every occurrence
bool gguf_is_int_type(GgufValueType t);                     // u8 ... i64
bool gguf_is_float_type(GgufValueType t);                   // f32, f64
std::optional<std::string> gguf_get_string(const GgufMetadata& m, std::string_view key,
                                           const std::string& file);
// Any integer type; a u64 above INT64_MAX throws.
std::optional<int64_t> gguf_get_int(const GgufMetadata& m, std::string_view key,
                                    const std::string& file);
// f32/f64 and the integer types (a u64 above INT64_MAX throws, as in gguf_get_int).
std::optional<double> gguf_get_float(const GgufMetadata& m, std::string_view key,
                                     const std::string& file);
std::optional<bool> gguf_get_bool(const GgufMetadata& m, std::string_view key,
                                  const std::string& file);
std::optional<std::vector<std::string>> gguf_get_string_array(const GgufMetadata& m,
                                                              std::string_view key,
                                                              const std::string& file);
// Arrays of f32/f64 or of an integer type (elements as in gguf_get_float).
std::optional<std::vector<double>> gguf_get_float_array(const GgufMetadata& m, std::string_view key,
                                                        const std::string& file);
// Arrays of an integer type; an element above INT64_MAX throws naming its index.
std::optional<std::vector<int64_t>> gguf_get_int_array(const GgufMetadata& m, std::string_view key,
                                                       const std::string& file);

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;        // GgmlType id
  std::vector<int64_t> ne;  // ggml order: ne[0] is the fastest-varying (row length)
  uint64_t offset = 0;      // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  int64_t numel() const;
};

class GgufFile {
 public:
  // Maps read-only and validates everything; throws IoError naming the file, key or tensor
  // and its index.
  static GgufFile open(const std::string& path);
  // True when the file exists and starts with "GGUF".
  static bool sniff(const std::string& path);

  const std::string& path() const { return map_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

  const GgufMetadata& metadata() const { return kv_; }   // file order
  const GgufValue* find_kv(std::string_view key) const;  // null when absent
  // Typed getters: gguf_get_*(metadata(), key, path()) (the rules and messages are there).
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // Whole tensor dequantized to fp32 (ggml order, i.e. row-major [ne[n-1], ..., ne[0]]); throws
  // IoError naming the file and tensor for a type we cannot dequantize.
  std::vector<float> dequantize(const GgufTensorInfo& t) const;

 private:
  MappedFile map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  GgufMetadata kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> kv_index_, tensor_index_;
};

// Writes tensors of `f` dequantized to an fp32 safetensors file at `out` (streamed one tensor
// at a time, atomic: temp file + rename), with safetensors shapes [ne[n-1], ..., ne[0]] and
// the tensors in file order. `names` selects tensors (in the order given); empty: all. Throws
// IoError naming the file and tensor for an unknown name or a type that cannot be dequantized
// (checked for all of them before anything is written). Returns the number of tensors written.
size_t write_dequantized_safetensors(const GgufFile& f, const std::vector<std::string>& names,
                                     const std::string& out);

// ggml_dequantize of format/ggml.h, its errors as IoError (naming the type).
void ggml_dequantize(uint32_t type, const uint8_t* src, int64_t n, float* dst);

}  // namespace scalesweep::io

// safetensors reader (memory-mapped, read-only, hardened against corrupt files) and writer
// (atomic: temp file + fsync + rename). Format: 8-byte little-endian header length N, N bytes
// of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the data region; offsets are relative to its start.
//
// Every error is an IoError whose message names the file, and where it applies the tensor
// and the index ("model.safetensors: tensor 'w': data_offsets [0, 12) hold 12 bytes but
// F32 [2, 2] needs 16").
//
// Several files (a Hugging Face sharded checkpoint) are several SafetensorsFile objects;
// they are movable, and every TensorInfo carries the path of its file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {

// The element type of a tensor in a safetensors file (huggingface/safetensors `Dtype`); npy
// files map their descr onto it too. Dense tensors of the runtime are scalesweep::DType.
enum class StDType {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  // Dtypes of the reference implementation (huggingface/safetensors `Dtype`) that a file may
  // hold but scalesweep does not read: a file with them opens (their byte size is validated
  // as the reference does), and raw()/read_f32() of such a tensor throw IoError.
  kF4,      // 4-bit elements, two per byte
  kF6E2M3,  // 6-bit elements, four per three bytes
  kF6E3M2,
  kF8E4M3FNUZ,
  kF8E5M2FNUZ,
  kC64,  // complex, two F32 parts
};

// The safetensors spellings ("F32", "BF16", "F8_E4M3", ...), case-sensitive as the format.
inline constexpr auto kStDTypeNames =
    make_names<StDType>("safetensors dtype", {{StDType::kF64, "F64"},
                                              {StDType::kF32, "F32"},
                                              {StDType::kF16, "F16"},
                                              {StDType::kBF16, "BF16"},
                                              {StDType::kI64, "I64"},
                                              {StDType::kI32, "I32"},
                                              {StDType::kI16, "I16"},
                                              {StDType::kI8, "I8"},
                                              {StDType::kU64, "U64"},
                                              {StDType::kU32, "U32"},
                                              {StDType::kU16, "U16"},
                                              {StDType::kU8, "U8"},
                                              {StDType::kBool, "BOOL"},
                                              {StDType::kF8E4M3, "F8_E4M3"},
                                              {StDType::kF8E5M2, "F8_E5M2"},
                                              {StDType::kF8E8M0, "F8_E8M0"},
                                              {StDType::kF4, "F4"},
                                              {StDType::kF6E2M3, "F6_E2M3"},
                                              {StDType::kF6E3M2, "F6_E3M2"},
                                              {StDType::kF8E4M3FNUZ, "F8_E4M3FNUZ"},
                                              {StDType::kF8E5M2FNUZ, "F8_E5M2FNUZ"},
                                              {StDType::kC64, "C64"}});

// The file dtype of a dense tensor stored as `d` (F32, BF16, F16).
constexpr StDType st_dtype(DType d) {
  return d == DType::kF32 ? StDType::kF32 : d == DType::kBF16 ? StDType::kBF16 : StDType::kF16;
}

// kStDTypeNames.name(d).
std::string_view dtype_name(StDType d);
// Throws IoError (naming the string) for a dtype the reference implementation does not know.
StDType parse_dtype(std::string_view s);
size_t dtype_bits(StDType d);  // bits per element (4 for F4, 6 for F6_*)
// Bytes per element; throws IoError for the sub-byte dtypes (F4, F6_E2M3, F6_E3M2).
size_t dtype_size(StDType d);
// False for the dtypes listed above as not read by scalesweep (their data is refused).
bool dtype_is_readable(StDType d);
// True for F32, F16, BF16, F64: the dtypes read_f32 converts.
bool dtype_is_float(StDType d);

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // byte offset from the start of the FILE
  uint64_t nbytes = 0;
  int64_t numel() const;
};

// Shape as "[2, 3]".
std::string shape_str(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Largest header accepted (the reference implementation's limit).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  // Maps the file and validates the whole header (throws IoError): header length within
  // kMaxHeaderBytes and the file, valid JSON object without duplicate keys, every entry with
  // a dtype of the reference implementation, a non-negative shape, data_offsets [begin, end)
  // inside the data region, end - begin == numel * dtype bits / 8 (a whole number of bytes,
  // as the reference's `validate` computes it, also for the sub-byte F4/F6 dtypes), and, as the
  // reference implementation (huggingface/safetensors `validate`) requires, offsets that tile the
  // data region exactly: in offset order each tensor begins where the previous one ends (no gap, no
  // overlap) and the last one ends at the end of the file (no trailing bytes).
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return map_.path(); }
  // In file order (ascending offsets).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const TensorInfo* find(std::string_view name) const;
  // Throws IoError "FILE: no tensor 'NAME' (it has: a, b, c ...)".
  const TensorInfo& at(std::string_view name) const;

  // The tensor's bytes inside the mapping (valid while this object lives). Throws IoError
  // naming the file, tensor and dtype for a dtype that is not dtype_is_readable().
  std::span<const uint8_t> raw(const TensorInfo& t) const;
  std::span<const uint8_t> raw(std::string_view name) const { return raw(at(name)); }
  // Converts F32/F16/BF16/F64 to float (F64 values outside the float range are an error
  // naming the index; NaN/Inf are passed through, the caller decides). Other dtypes throw.
  std::vector<float> read_f32(const TensorInfo& t) const;
  std::vector<float> read_f32(std::string_view name) const { return read_f32(at(name)); }

 private:
  MappedFile map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory order of add() calls and writes it atomically
// (a temp file in the target directory, fsync, rename): a failed write leaves no file.
class SafetensorsWriter {
 public:
  // Copies the bytes. Throws IoError on a duplicate or empty name, a name starting with
  // "__", or bytes.size() != numel * dtype size.
  void add(std::string name, StDType dtype, std::vector<int64_t> shape,
           std::span<const uint8_t> bytes);
  // Takes ownership (no copy).
  void add(std::string name, StDType dtype, std::vector<int64_t> shape,
           std::vector<uint8_t>&& bytes);
  void add_f32(std::string name, std::vector<int64_t> shape, std::span<const float> values);
  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  size_t size() const { return entries_.size(); }
  // Serializes (header padded with spaces to a multiple of 8 bytes) and writes atomically.
  void write(const std::string& path) const;
  // The whole file as bytes (for tests and for callers that stream elsewhere).
  std::vector<uint8_t> serialize() const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::string header_json() const;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Parses "FILE.safetensors:TENSOR" (the last ':' after ".safetensors"); returns false when
// `spec` has no such form.
bool split_tensor_spec(const std::string& spec, std::string* file, std::string* tensor);

}  // namespace scalesweep::io

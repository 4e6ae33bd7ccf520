// NumPy .npy reader and writer (format versions 1.0, 2.0 and 3.0), little-endian C-order
// arrays. Read: float32, float16, float64 (to float32), uint8, int8, int32, int64 (raw).
// Rejected with an IoError naming the file: bad magic, unknown version, header that is not
// a dict literal with exactly descr/fortran_order/shape, fortran_order True, big-endian or
// unsupported dtypes, negative or overflowing shapes, data shorter or longer than the shape.
// Written atomically (temp file + fsync + rename).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "scalesweep/io/safetensors.h"  // IoError, StDType, shape_str

namespace scalesweep::io {

struct NpyArray {
  StDType dtype = StDType::kF32;  // kF32, kF16, kF64, kU8, kI8, kI32, kI64
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian, C order
  int64_t numel() const;
};

// Reads the raw array.
NpyArray read_npy(const std::string& path);
// Parses an in-memory .npy image (`path` is used in messages).
NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& path);

struct NpyF32 {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Float arrays as float32 (float16 widened exactly; float64 rounded to nearest, an error
// naming the index if a finite value overflows float32). Other dtypes throw.
NpyF32 read_npy_f32(const std::string& path);

// Writes dtype/shape/bytes (bytes.size() must match) as .npy version 1.0 (2.0 if the header
// needs it), atomically.
void write_npy(const std::string& path, StDType dtype, const std::vector<int64_t>& shape,
               std::span<const uint8_t> bytes);
void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   std::span<const float> values);
// The file image write_npy would write.
std::vector<uint8_t> serialize_npy(StDType dtype, const std::vector<int64_t>& shape,
                                   std::span<const uint8_t> bytes);

}  // namespace scalesweep::io

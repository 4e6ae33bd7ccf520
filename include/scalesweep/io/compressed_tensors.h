// compressed-tensors NVFP4 checkpoints ("nvfp4-pack-quantized"; SPEC "Ecosystem layouts"),
// the layout vLLM loads. Per quantized Linear PREFIX (e.g. "model.layers.0.self_attn.q_proj"):
//   PREFIX.weight_packed        U8       [N, ceil(K/2)]   element 2i low nibble, 2i+1 high
//   PREFIX.weight_scale         F8_E4M3  [N, ceil(K/16)]  row-major block scales
//   PREFIX.weight_global_scale  F32      [1]              encode direction gs = 6*C/amax
//   PREFIX.input_global_scale   F32      [1]              W4A4 only, encode direction
// Decoding: w = fl(fl(q * s) / gs) (q * s is exact), the same value scalesweep::dequantize
// gives. A partial last block (K % 16 != 0) has its own scale over its real length; an odd K
// has a zero pad nibble in the last byte of each row.
// config.json "quantization_config" follows the serialization of compressed-tensors 0.12
// (QuantizationConfig.model_dump as written by llm-compressor's NVFP4 / NVFP4A16 presets).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/io/safetensors.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {

// The "quantization_config" object. w4a4 adds input_activations (dynamic "local": per-token
// block scales at run time, static calibrated global scale). `ignore` lists module names kept
// in full precision (at least "lm_head").
nlohmann::json nvfp4_quantization_config(bool w4a4, int group_size,
                                         const std::vector<std::string>& ignore);

// What a config.json declares. `present` is false without a quantization_config.
struct CtInfo {
  bool present = false;
  std::string quant_method, format;
  bool nvfp4 = false;  // format nvfp4-pack-quantized, 4-bit float weights, tensor_group
  int group_size = 16;
  bool w4a4 = false;  // input_activations present
  std::vector<std::string> ignore;
};
// Parses config["quantization_config"]; throws IoError (naming `where`) for a declared but
// unsupported scheme (another quant_method or format, group size not 16, ...).
CtInfo parse_quantization_config(const nlohmann::json& config, const std::string& where);

// The safetensors tensors of one NVFP4 Linear (names as above), ready to write.
struct TensorBlob {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
std::vector<TensorBlob> nvfp4_linear_tensors(const std::string& prefix, const QuantizedTensor& q,
                                             std::optional<float> input_global_scale);

// Finds a tensor by name across the files of a checkpoint (one file or the shards of an
// index); returns nullptr when absent.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
};
using TensorLookup = std::function<TensorRef(std::string_view name)>;

// True when PREFIX.weight_packed exists.
bool has_nvfp4_weight(const TensorLookup& lookup, const std::string& prefix);

// Reads and dequantizes PREFIX.weight_* to fp32 [rows, cols] (rows/cols from the model
// config: the packed layout cannot tell an odd K from K+1). Validates dtypes, shapes, the
// global scale (finite, > 0) and every scale byte (no NaN 0x7F/0xFF, no negative scale),
// and the pad nibble; throws IoError naming the file, the tensor and the first bad index.
std::vector<float> read_nvfp4_weight(const TensorLookup& lookup, const std::string& prefix,
                                     int64_t rows, int64_t cols);
// Same, into a QuantizedTensor (codes/scales copied, for inspection and tests).
QuantizedTensor read_nvfp4_quantized(const TensorLookup& lookup, const std::string& prefix,
                                     int64_t rows, int64_t cols);
// Reads PREFIX.input_global_scale when present.
std::optional<float> read_input_global_scale(const TensorLookup& lookup, const std::string& prefix);

// Streams a safetensors file whose tensors are all declared up front: the header is written
// first, then each tensor's bytes in declaration order, through an AtomicFile (temp file in
// the target directory, renamed by commit()). Memory use is one tensor at a time.
class SafetensorsStreamWriter {
 public:
  void declare(std::string name, DType dtype, std::vector<int64_t> shape);
  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  // Writes the header; after this only write() and commit() are allowed.
  void open(const std::string& path);
  // The next declared tensor must be `name`, with exactly its byte size.
  void write(std::string_view name, std::span<const uint8_t> bytes);
  void commit();  // throws IoError when a declared tensor was not written
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter() = default;
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  uint64_t total_bytes() const;  // header + data, once open()

 private:
  struct Decl {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
  };
  std::vector<Decl> decls_;
  std::map<std::string, std::string> metadata_;
  struct Impl;
  Impl* impl_ = nullptr;
  size_t next_ = 0;
  uint64_t header_bytes_ = 0;
};

}  // namespace scalesweep::io

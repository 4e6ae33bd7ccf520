// compressed-tensors NVFP4 checkpoints ("nvfp4-pack-quantized"; SPEC "Ecosystem layouts"),
// the layout vLLM loads. Per quantized Linear PREFIX (e.g. "model.layers.0.self_attn.q_proj"):
//   PREFIX.weight_packed        U8       [N, ceil(K/2)]   element 2i low nibble, 2i+1 high
//   PREFIX.weight_scale         F8_E4M3  [N, ceil(K/16)]  row-major block scales
//   PREFIX.weight_global_scale  F32      [1]              encode direction gs = 6*C/amax
//   PREFIX.input_global_scale   F32      [1]              W4A4 only, encode direction
// Decoding: w = fl(fl(q * s) / gs) (q * s is exact), the same value scalesweep::dequantize
// gives. A partial last block (K % 16 != 0) has its own scale over its real length; an odd K
// has a zero pad nibble in the last byte of each row.
// config.json "quantization_config" is what compressed-tensors' ModelCompressor.update_config
// writes for llm-compressor's NVFP4A16 / NVFP4 presets ({"version": compressed_tensors
// .__version__, "quant_method", "sparsity_config": {}, "transform_config": {},
// **QuantizationConfig.model_dump()}), field for field as releases 0.14.0 to 0.18.0 write it
// (read from their wheels): 0.13.0 is the first release whose QuantizationArgs knows
// scale_dtype / zp_dtype (0.12.x rejects them: extra="forbid"), 0.19.0 stopped inferring the
// observer and 0.20.0 omits null fields. All releases from 0.13.0 on accept it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/io/safetensors.h"
#include "scalesweep/io/tensor_order.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {

// The compressed-tensors release whose serialization nvfp4_quantization_config reproduces
// (the first of the identical 0.14.0 .. 0.18.0 range), written as quantization_config.version.
inline constexpr const char* kCompressedTensorsVersion = "0.14.0";

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
  StDType dtype;
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
// Same validation, without a copy: a model::Tensor of dtype kNvfp4 whose codes and scales
// point into the files' mapped bytes (the caller keeps the files alive).
model::Tensor view_nvfp4_weight(const TensorLookup& lookup, const std::string& prefix, int64_t rows,
                                int64_t cols);
// What a checkpoint declares about how it runs: NVFP4 weights (already dequantized by the
// loader) and, for W4A4, the static activation global scales of its Linears, per decoder
// layer and model::InputId (encode direction, as stored; q/k/v and gate/up, fused in vLLM,
// share one quantized input: the largest of their scales, as vLLM takes for a fused layer).
struct CheckpointQuant {
  bool nvfp4_weights = false;
  bool w4a4 = false;
  // [layer][model::InputId], W4A4 only; 0 where the Linears reading that input are dense
  // (listed in quantization_config.ignore): that input runs in full precision, as in vLLM.
  std::vector<std::array<float, 4>> input_gs;
  // [layer][expert] of a mixture-of-experts layer (empty for a dense layer), W4A4 only: the
  // encode-direction global scales of the expert's gate/up input (0) and down input (1), each
  // expert its own, as vLLM's MoE loader reads them; 0 where that expert's Linears are dense.
  std::vector<std::vector<std::array<float, 2>>> expert_input_gs;
};

// Reads PREFIX.input_global_scale when present.
std::optional<float> read_input_global_scale(const TensorLookup& lookup, const std::string& prefix);

// Streams a safetensors file whose tensors are all declared up front: the header is written
// first, then each tensor's bytes in declaration order, through an AtomicFile (temp file in
// the target directory, renamed by commit()). Memory use is one tensor at a time.
class SafetensorsStreamWriter {
 public:
  void declare(std::string name, StDType dtype, std::vector<int64_t> shape);
  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  // Writes the header; after this only write() and commit() are allowed.
  void open(const std::string& path);
  // The next declared tensor must be `name`, with exactly its byte size.
  void write(std::string_view name, std::span<const uint8_t> bytes);
  // The next bytes of the current tensor `name`, in order: the tensor is complete once its
  // declared byte count has arrived (more is refused). A large tensor is written this way a
  // tile at a time, never held whole.
  void write_part(std::string_view name, std::span<const uint8_t> bytes);
  void commit();  // throws IoError when a declared tensor was not written (or only partly)
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter() = default;
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  uint64_t total_bytes() const;  // header + data, once open()

 private:
  struct Decl {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
  };
  std::vector<Decl> decls_;
  std::map<std::string, std::string> metadata_;
  struct Impl;
  Impl* impl_ = nullptr;
  TensorWriteOrder order_;
  uint64_t header_bytes_ = 0;
};

// Hugging Face sharded output, streamed: every tensor is declared up front (name, dtype,
// shape, in file order), open() assigns them to shards exactly as huggingface_hub's
// split_state_dict_into_shards_factory does (transformers' save_pretrained): in order, a
// tensor that would take the current shard past max_shard_bytes of tensor data starts a new
// one, a tensor larger than the limit alone gets a shard of its own (numbered before the
// current one, as there), a tensor is never split. Files are named
// model-00001-of-0000N.safetensors with model.safetensors.index.json ({"metadata":
// {"total_parameters": elements stored, "total_size": bytes of tensor data}, "weight_map":
// {tensor: file}}, keys sorted, indent 2, as transformers' save_pretrained writes it); one
// shard is model.safetensors without an index.
// max_shard_bytes = 0: never split. write() must follow the declaration order; each shard
// is a SafetensorsStreamWriter (temp file, renamed by commit()) opened at its first tensor
// and committed after its last one, so memory stays one tensor at a time.
class ShardedStreamWriter {
 public:
  explicit ShardedStreamWriter(uint64_t max_shard_bytes) : max_(max_shard_bytes) {}
  void declare(std::string name, StDType dtype, std::vector<int64_t> shape);
  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  // Assigns shards; `dir` must exist. Nothing is written yet.
  void open(const std::string& dir);
  void write(std::string_view name, std::span<const uint8_t> bytes);
  // As SafetensorsStreamWriter::write_part: a tensor's bytes in pieces, in order.
  void write_part(std::string_view name, std::span<const uint8_t> bytes);
  // Checks that every tensor was written, commits the last shards, writes the index.
  void commit();
  const std::vector<std::string>& files() const { return files_; }  // after open()
  uint64_t data_bytes() const { return data_bytes_; }               // "total_size"
  uint64_t file_bytes() const;                                      // after commit()

 private:
  struct Decl {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    size_t shard = 0;
  };
  uint64_t max_;
  std::vector<Decl> decls_;
  std::map<std::string, std::string> metadata_;
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<SafetensorsStreamWriter>> shards_;
  std::vector<size_t> left_;  // tensors still to write, per shard
  std::vector<bool> started_;
  std::vector<uint64_t> sizes_;  // file sizes
  TensorWriteOrder order_;
  bool opened_ = false;
  uint64_t data_bytes_ = 0;
};

}  // namespace scalesweep::io

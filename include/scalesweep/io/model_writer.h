// The protocol every quantized-model writer follows, whatever the file format: every tensor is
// declared from the config when the writer is made; the caller then pushes the embeddings,
// decoder layers 0 .. n-1 and the head in that order (each written and droppable as soon as
// the call returns), and commit() puts the output in place atomically (nothing is left at the
// output path when commit() is not reached). Implemented by io::CheckpointWriter
// (compressed-tensors directory, io/checkpoint.h) and io::GgufModelWriter (NVFP4 GGUF,
// io/gguf_writer.h); open_model_writer chooses one from the output path.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/model/calib.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {

struct CheckpointSpec;  // io/checkpoint.h
struct GgufModelSpec;   // io/gguf_writer.h

// One Linear of a decoder layer: `q` null = stored dense (its weight from the layer); in a
// MoE layer, `expert` >= 0 names an expert's gate/up/down (hf_expert_module_name).
struct CheckpointLinear {
  model::LinearId id = model::LinearId::kQ;
  const QuantizedTensor* q = nullptr;
  std::optional<float> input_global_scale;
  int expert = -1;
};

// What a committed writer wrote.
struct CheckpointFiles {
  std::vector<std::string> files;   // the file names (safetensors shards; the .gguf)
  std::vector<std::string> ignore;  // compressed-tensors: quantization_config.ignore as written
  uint64_t bytes = 0;               // size of the tensor file(s)
  double write_seconds = 0;         // encoding and writing the tensors
};

class ModelWriter {
 public:
  virtual ~ModelWriter() = default;
  virtual void write_embeddings(const model::Tensor& tok_embeddings) = 0;
  // The seven Linears in io::kAllLinears order, or a MoE layer's q, k, v, o and then every
  // expert's gate, up, down (expert order); each writer documents what it stores dense.
  virtual void write_layer(int layer, const model::LayerWeights& lw,
                           const std::vector<CheckpointLinear>& linears) = 0;
  virtual void write_head(const model::Tensor& final_norm, const model::Tensor& lm_head) = 0;
  virtual CheckpointFiles commit() = 0;
};

// Whether `out` names a GGUF output (it ends in ".gguf"); anything else is a compressed-tensors
// directory.
bool is_gguf_path(const std::string& out);

// The writer for `out` (is_gguf_path): a GgufModelWriter with the spec `gguf()` gives, else a
// CheckpointWriter with `ct()`'s (only the chosen one is called).
std::unique_ptr<ModelWriter> open_model_writer(const std::string& out,
                                               const std::function<CheckpointSpec()>& ct,
                                               const std::function<GgufModelSpec()>& gguf);

}  // namespace scalesweep::io

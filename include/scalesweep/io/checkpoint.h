// The compressed-tensors NVFP4 checkpoint writer (a Hugging Face directory vLLM loads):
// config.json with quantization_config, the safetensors tensors (sharded as Hugging Face
// does), the tokenizer files. Layer `io`: the file format only; what to quantize and how is
// the pipeline's (pipeline/quantize_model.h). The protocol (embeddings, layers, head,
// commit; atomic) is io::ModelWriter's (io/model_writer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/format/dtype.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/model_writer.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/linear_set.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {

struct CheckpointSpec {
  model::Config config;
  bool write_lm_head = true;  // false: tied embeddings (tie_word_embeddings = true)
  // Linears stored dense (per layer, or a kind in every layer), each listed by its module
  // name in quantization_config.ignore (with lm_head).
  model::LinearSet dense;
  bool w4a4 = false;                // NVFP4 Linears carry input_global_scale
  std::string producer;             // safetensors metadata "producer"
  DType dense_dtype = DType::kF32;  // embeddings, norms, biases, lm_head, dense Linears
  // > 0: shards of at most this many bytes of tensor data (ShardedStreamWriter); 0: one file.
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;  // replace an existing output directory
  // The source model: a HF directory (its config.json is the base of ours, its non-weight
  // files are copied) or a llama2.c / GGUF file (config.json from `config`,
  // generation_config.json and the tokenizer as tokenizer.json when `tokenizer` is one).
  std::string source;
  bool source_is_hf_dir = false;
  const model::Tokenizer* tokenizer = nullptr;
  // A non-HF source's chat template, generation config and special token ids
  // (generation_config.json, chat_template.jinja); nullopt: chat_meta_from_tokenizer.
  std::optional<ChatMeta> chat;
};

class CheckpointWriter final : public ModelWriter {
 public:
  // Reads the source's config.json (HF: refuses one that already has quantization_config),
  // declares every tensor, opens the temporary directory beside `out_dir`.
  CheckpointWriter(const std::string& out_dir, const CheckpointSpec& spec);
  ~CheckpointWriter() override;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void write_embeddings(const model::Tensor& tok_embeddings) override;
  // The seven Linears in io::kAllLinears order; dense ones must be those of the spec. A MoE
  // layer (Config::moe_layer, a Hugging Face source only): q, k, v, o, then every expert's
  // gate, up, down (expert order), all quantized; its router is written dense from the layer
  // and listed in quantization_config.ignore (as llm-compressor leaves mlp.gate).
  void write_layer(int layer, const model::LayerWeights& lw,
                   const std::vector<CheckpointLinear>& linears) override;
  void write_head(const model::Tensor& final_norm, const model::Tensor& lm_head) override;
  CheckpointFiles commit() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalesweep::io

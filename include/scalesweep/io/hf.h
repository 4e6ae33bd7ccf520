// Hugging Face model directories (Llama 2/3, TinyLlama, SmolLM, Qwen2/2.5, Qwen3, and the
// mixture-of-experts Qwen3-MoE and Mixtral, per-expert or fused expert tensors):
// config.json + model.safetensors (or a sharded model.safetensors.index.json) in fp32, bf16
// or fp16, plus tokenizer.json.
//
// Loading maps every shard read-only; fp32 tensors whose data is 4-byte aligned are used in
// place (zero copy, the mapping is kept alive by Weights::storage), bf16/fp16/fp64 tensors
// are widened to owned fp32 buffers. Weights keep HF conventions (rotate-half RoPE, [out, in]
// row-major), which is what model::Weights expects.
//
// Errors (std::runtime_error, or io::IoError from the safetensors reader) name the file and
// the tensor: unsupported architecture or rope_scaling, a missing tensor, a shape mismatch
// ("expected [64, 64], got [64, 32]"), a non-float dtype, a non-finite weight, missing
// config.json / weights files, a shard named by the index that does not exist.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/format/dtype.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/model_parts.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::io {

// Parses config.json text into a model config (`name` for messages). Supported
// architectures: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
// MixtralForCausalLM (their MoE fields read, or refused by name where they would change the
// math in a way the runtime does not implement).
model::Config parse_hf_config(std::string_view json, const std::string& name);

// DIR/config.json as load_hf_dir reads it (parse_hf_config, the quantization_config checked),
// without reading any tensor.
model::Config read_hf_config(const std::string& dir);

// Loads the weights of a HF model directory.
// The quantization_config of DIR/config.json (parse_quantization_config; `present` false
// without one).
CtInfo hf_quantization_config(const std::string& dir);

// The quantization a HF directory's config.json declares (compressed-tensors), with the
// W4A4 input global scales read from its tensors. Throws for a W4A4 checkpoint whose NVFP4
// Linear has no input_global_scale (naming the tensor), or whose fused group (q/k/v,
// gate/up) mixes dense and NVFP4 Linears.
CheckpointQuant read_hf_checkpoint_quant(const std::string& dir, const model::Config& c);

model::Weights load_hf_dir(const std::string& dir);

// Layer-by-layer access to a HF directory without loading the model: the constructor parses
// config.json and maps the shards (reads no tensor data); each call below materializes the
// requested tensors as owned fp32 buffers (bf16/fp16 widened, fp32 copied, the same checks
// and messages as load_hf_dir) in a fresh Weights and releases the file pages it read, so
// resident memory holds only what the caller keeps alive.
class HfLazyModel final : public ModelParts {
 public:
  explicit HfLazyModel(const std::string& dir);
  ~HfLazyModel() override;
  HfLazyModel(HfLazyModel&&) noexcept;
  HfLazyModel& operator=(HfLazyModel&&) noexcept;
  const model::Config& config() const override;
  const std::string& dir() const;
  // config + layers sized n_layers, only layers[l] filled (fp32).
  model::Weights layer(int l) const override;
  // config + tok_embeddings only.
  model::Weights embeddings() const override;
  // config + final_norm and (untied models) lm_head.
  model::Weights head() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The safetensors files of a HF directory as the loaders read them: model.safetensors, or
// the shards model.safetensors.index.json names (each must exist and hold the tensors listed
// for it), memory-mapped and validated. Throws naming the file. Used by `inspect`.
class HfTensorFiles {
 public:
  explicit HfTensorFiles(const std::string& dir);
  ~HfTensorFiles();
  HfTensorFiles(const HfTensorFiles&) = delete;
  HfTensorFiles& operator=(const HfTensorFiles&) = delete;
  TensorRef find(std::string_view name) const;  // empty when absent
  TensorLookup lookup() const;                  // valid while this object lives
  // In index order of first mention (one file for model.safetensors).
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The tokenizer of a HF directory (tokenizer.json, with tokenizer_config.json when present);
// null when the directory has no tokenizer.json. BOS/EOS missing from the tokenizer files
// come from the model config.
std::unique_ptr<model::HfBpeTokenizer> load_hf_tokenizer(const std::string& dir,
                                                         const model::Config& config);

struct HfWriteOptions {
  DType dtype = DType::kF32;
  // > 0: split the tensors into model-0000i-of-0000n.safetensors files of at most about this
  // many bytes each, with model.safetensors.index.json (a tensor is never split).
  uint64_t shard_bytes = 0;
  bool overwrite = false;  // replace an existing output directory
  // Tokenizer files to write (tokenizer.json, tokenizer_config.json); none when null.
  const model::BpeSpec* tokenizer = nullptr;
  // generation_config.json and chat_template.jinja (chat_meta.h); nullopt: the tokenizer's
  // template and BOS/EOS/pad, else the config's BOS/EOS.
  std::optional<ChatMeta> chat;
};

// Writes `w` as a HF directory atomically (a temporary directory beside `dir`, renamed when
// complete): config.json, generation_config.json, the safetensors file(s) and the tokenizer
// files. Tensors are written in HF names; tied embeddings write no lm_head.weight.
// Throws when `dir` exists (unless overwrite) or on any write error; nothing is left behind.
void save_hf_dir(const model::Weights& w, const std::string& dir, const HfWriteOptions& opt);

// The bytes of a dense tensor stored as `dt` (little-endian; bf16/f16 rounded to nearest
// even from fp32, a tensor already held in `dt` copied as is), handed to `sink` in file order,
// in pieces: a tensor held in `dt` as one span of its storage, any other a tile of rows
// (model::prefill_tile_rows, about 8 MiB of fp32) at a time, so that a writer of parts
// (SafetensorsStreamWriter::write_part) never holds the whole tensor's bytes.
void encode_dense_tensor(const model::Tensor& t, DType dt,
                         const std::function<void(std::span<const uint8_t>)>& sink);

}  // namespace scalesweep::io

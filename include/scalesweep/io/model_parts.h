// A model read one part at a time: the source of the streamed pipelines (quantize, and through
// it every output format), which hold one decoder layer in fp32 at a time. Two kinds:
// io::HfLazyModel (hf.h) reads a Hugging Face directory's tensors per layer from the
// safetensors mappings; io::StoredModelParts views a model loaded with its tensors as stored
// (a GGUF's quantized blocks, bf16 in a mapping: io::load_model) and widens one layer on
// request.
#pragma once

#include <cstdint>
#include <memory>

#include "scalesweep/model/config.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::io {

// Drops the clean pages of [p, p + bytes) of a read-only file mapping from this process's
// resident set; a later access reads them again (from the page cache). Best effort: nothing
// for a null or empty range or when madvise fails. A tensor read through once (a load-time
// check, a layer widened by a streamed reader) need not stay resident.
void release_file_pages(const void* p, int64_t bytes);
// The same for a tensor's mapped bytes (Tensor::mapped; nothing when it has none).
void release_file_pages(const model::Tensor& t);

class ModelParts {
 public:
  virtual ~ModelParts() = default;
  virtual const model::Config& config() const = 0;
  // config + tok_embeddings only (any storage dtype).
  virtual model::Weights embeddings() const = 0;
  // config + layers sized n_layers, only layers[l] filled, its tensors fp32. Throws naming the
  // source for l outside [0, n_layers).
  virtual model::Weights layer(int l) const = 0;
  // config + final_norm and (untied models) lm_head.
  virtual model::Weights head() const = 0;
};

// Parts of weights loaded as stored (shared, not copied): embeddings and head are views,
// layer(l) an fp32 copy of that layer alone. `name` (the source) prefixes messages.
class StoredModelParts final : public ModelParts {
 public:
  StoredModelParts(std::shared_ptr<const model::Weights> w, std::string name);
  const model::Config& config() const override;
  model::Weights embeddings() const override;
  model::Weights layer(int l) const override;
  model::Weights head() const override;

 private:
  std::shared_ptr<const model::Weights> w_;
  std::string name_;
};

}  // namespace scalesweep::io

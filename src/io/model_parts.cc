// A model read one part at a time (include/scalesweep/io/model_parts.h).
#include "scalesweep/io/model_parts.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "scalesweep/model/weight.h"

namespace scalesweep::io {
void release_file_pages(const void* p, int64_t bytes) {
  if (!p || bytes <= 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto b = reinterpret_cast<uintptr_t>(p) / page * page;
  const auto e = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

void release_file_pages(const model::Tensor& t) { release_file_pages(t.mapped, t.mapped_bytes); }

StoredModelParts::StoredModelParts(std::shared_ptr<const model::Weights> w, std::string name)
    : w_(std::move(w)), name_(std::move(name)) {
  if (!w_) throw std::invalid_argument("StoredModelParts: no weights");
  if (static_cast<int>(w_->layers.size()) != w_->config.n_layers)
    throw std::runtime_error(name_ + ": the model has " + std::to_string(w_->layers.size()) +
                             " layers, its config " + std::to_string(w_->config.n_layers));
}

const model::Config& StoredModelParts::config() const { return w_->config; }

model::Weights StoredModelParts::embeddings() const {
  model::Weights e;
  e.config = w_->config;
  e.tok_embeddings = w_->tok_embeddings;
  e.storage = w_->storage;  // keeps the mapping (or owned data) alive
  return e;
}

model::Weights StoredModelParts::layer(int l) const {
  const model::Config& c = w_->config;
  if (l < 0 || l >= c.n_layers)
    throw std::out_of_range(name_ + ": no decoder layer " + std::to_string(l) + " (the model has " +
                            std::to_string(c.n_layers) + ")");
  model::Weights w;
  w.config = c;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  w.layers[static_cast<size_t>(l)] = w_->layers[static_cast<size_t>(l)];
  w.storage = w_->storage;
  model::materialize_f32(w);  // this layer's tensors only: the others are absent
  // The stored bytes were read once: drop their file pages from the resident set (a later
  // access reads them again), so that a streamed run does not accumulate the whole file.
  const model::LayerWeights& s = w_->layers[static_cast<size_t>(l)];
  for (const model::Tensor* t : {&s.wq, &s.wk, &s.wv, &s.wo, &s.w1, &s.w2, &s.w3})
    release_file_pages(*t);
  return w;
}

model::Weights StoredModelParts::head() const {
  model::Weights h;
  h.config = w_->config;
  h.final_norm = w_->final_norm;
  if (!h.config.tied_embeddings) h.lm_head = w_->lm_head;
  h.storage = w_->storage;
  return h;
}

}  // namespace scalesweep::io

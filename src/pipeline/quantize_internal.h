// Pieces the quantization paths share inside the pipeline layer (quantize_layer.cc,
// quantize_write.cc, quantize_stream.cc, quantize_model.cc); not part of the public API.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalesweep/model/config.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {

using WeightsPtr = std::shared_ptr<const model::Weights>;

// What the checkpoint writer pulls, in file order; each returned object is dropped as soon
// as its tensors are written.
struct CheckpointFeed {
  std::function<WeightsPtr()> embeddings;  // ->tok_embeddings
  // ->layers[l] (dense tensors) and the quantized Linears of layer l.
  std::function<WeightsPtr(int l, std::vector<LinearResult>& rs)> layer;
  std::function<WeightsPtr()> head;  // ->final_norm, ->lm_head
};

// Drives the writer io::open_model_writer chooses for `out_dir`: embeddings, layer 0 .. n-1
// (quantized by the feed), head, commit.
QuantizeReport write_checkpoint(const model::Config& c, bool write_lm_head,
                                const std::string& src_path, bool hf_src,
                                const model::Tokenizer* tokenizer, const QuantizeOptions& opt,
                                const std::string& out_dir, const WriteOptions& wopt,
                                const std::function<void(int64_t, int64_t)>& progress,
                                const CheckpointFeed& feed);

// `opt` with the Linears vLLM cannot take marked dense (WriteOptions::partial_blocks), or for a
// GGUF output those ggml cannot store as NVFP4 (io::gguf_dense_linears).
QuantizeOptions with_vllm_dense(const QuantizeOptions& opt, const model::Config& c,
                                const WriteOptions& wopt, const std::string& out);

// The sensitivities of every Linear that `opt` quantizes, streamed (quantize_stream.cc): the
// calibration samples go through the full-precision layers one at a time (or `so.stats` is
// read), each layer's statistics give its Linears' sensitivities and are freed.
std::vector<LinearSensitivity> streamed_sensitivities(
    const StreamSource& source, const StreamOptions& so, const QuantizeOptions& opt,
    Sensitivity sensitivity, const std::function<void(int64_t, int64_t)>& progress);

// The weight a result replaces: a Linear of the layer, or an expert's.
model::Tensor& result_weight(model::LayerWeights& lw, const LinearResult& r);

}  // namespace scalesweep::pipeline

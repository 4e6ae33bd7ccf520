// llama2.c checkpoints (karpathy/llama2.c):
//  - legacy: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len),
//    a negative vocab_size meaning an untied classifier, then fp32 weights in the order
//    tok_embeddings, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, two legacy
//    freq_cis tables (seq_len * head_dim/2 floats each), then wcls [vocab, dim] if untied.
//  - v1 ("version 1" of export.py): uint32 magic 0x616b3432 ("ak42"), int32 version 1,
//    the same 7 int32, uint8 shared_classifier, zero padding to 256 bytes, then fp32
//    attention_norm[L], ffn_norm[L], final norm, tok_embeddings, wq, wk, wv, wo, w1, w2, w3,
//    and wcls when not shared.
// The loader returns HF conventions: wq/wk rows are permuted from llama2.c's interleaved
// RoPE pairs to rotate-half, so the runtime only implements HF RoPE.
#pragma once

#include <string>

#include "scalesweep/model/weights.h"

namespace scalesweep::io {

enum class Llama2cFormat { kLegacy, kV1 };

// Throws std::runtime_error naming the file (bad header, sizes not matching the file length).
model::Weights load_llama2c(const std::string& path, Llama2cFormat* format = nullptr);

// True when `path` starts with a plausible llama2.c header (v1 magic, or 7 int32 that pass
// the loader's header checks); the payload size is not checked (load_llama2c names it).
bool is_llama2c_file(const std::string& path);

// Writers (used by tests and to round-trip): inverse permutation of wq/wk rows back to
// interleaved RoPE. Written atomically.
void save_llama2c(const model::Weights& w, const std::string& path, Llama2cFormat format);

// Row permutation between interleaved pairs (llama2.c / Meta) and rotate-half (HF) for a
// [n_heads*head_dim, cols] matrix: to_hf=true maps row h*hd+2i -> h*hd+i and
// h*hd+2i+1 -> h*hd+hd/2+i.
void permute_rope_rows(const float* src, float* dst, int n_heads, int head_dim, int64_t cols,
                       bool to_hf);

}  // namespace scalesweep::io

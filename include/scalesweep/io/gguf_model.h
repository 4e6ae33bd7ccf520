// Llama-family models from GGUF files (llama.cpp): the model config and tokenizer from the
// metadata, the weights from the tensors (dequantized to fp32 by io/gguf.h).
//
// Config: `general.architecture` llama, qwen2, qwen3 or qwen3moe (Mixtral: llama with experts),
// and its `{arch}.*` keys (block_count,
// embedding_length, feed_forward_length, attention.head_count(_kv), attention.key_length /
// value_length, context_length, rope.freq_base, rope.dimension_count,
// attention.layer_norm_rms_epsilon, vocab_size; mixture of experts: expert_count,
// expert_used_count, expert_feed_forward_length (qwen3moe), the 3-D expert tensors
// blk.N.ffn_{gate,up,down}_exps [n_expert, ...] and the router blk.N.ffn_gate_inp, with
// llama.cpp's softmax gating and normalised top-k weights). Every `{arch}.*` key outside the
// ones this mapping understands is refused naming the key (rope scaling, sliding windows, shared
// experts,
// LayerNorm epsilons, logit softcapping, ... change the math and are not implemented), as is
// any tensor the architecture does not use. RoPE scaling: `rope.scaling.type` linear (with
// rope.scaling.factor) and yarn (factor, original_context_length, yarn_beta_fast/slow; the
// attention factor llama.cpp applies, 0.1 ln(factor) + 1), and the `rope_freqs.weight` tensor
// of Llama-3 scaling (llama only; see gguf_llama3_rope_factors).
//
// Weights: GGUF stores a [out, in] matrix with ne = [in, out], i.e. already row-major
// [out, in]. For the `llama` architecture llama.cpp's converter (convert_hf_to_gguf.py,
// LlamaModel.permute) reorders the rows of attn_q / attn_k from Hugging Face's rotate-half
// layout to interleaved RoPE pairs (GGML's NORM rope); the loader undoes it, so the weights
// are in HF conventions like every other loader's. qwen2/qwen3 use NEOX (rotate-half) rope
// and are stored unpermuted.
//
// Tokenizer: `tokenizer.ggml.model` gpt2 (byte-level BPE with `merges`, the pre-tokenizer
// named by `tokenizer.ggml.pre`) or llama (SentencePiece-style BPE with byte fallback; the
// merges, which GGUF does not store, are derived from the token scores as transformers'
// SentencePiece converter does).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scalesweep/io/gguf.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::io {

// The architecture of a GGUF's `general.architecture`: llama, qwen2, qwen3, and the
// mixture-of-experts qwen3moe and Mixtral, which llama.cpp names llama with `llama.expert_count`
// > 0 (`has_experts`); nullopt for any other.
std::optional<model::Arch> gguf_arch(std::string_view general_architecture, bool has_experts);

// Model config from GGUF metadata. `has_tensor` tells whether a tensor is in the file (tied
// embeddings when `output.weight` is absent; Llama-3 RoPE scaling when `rope_freqs.weight` is
// present: its parameters from kGgufLlama3RopeKey, else Llama 3.x's with factor 0, which
// load_gguf_weights sets from the tensor). `name` (the
// file) prefixes every message. Throws std::runtime_error naming the key.
model::Config gguf_model_config(const GgufMetadata& meta,
                                const std::function<bool(std::string_view)>& has_tensor,
                                const std::string& name);

// Tokenizer spec from the `tokenizer.ggml.*` metadata. Throws std::runtime_error naming the
// key (and the index for a bad array element); an absent `tokenizer.ggml.model` is an error
// too (gguf_has_tokenizer tells first).
model::BpeSpec gguf_tokenizer_spec(const GgufMetadata& meta, const std::string& name);
bool gguf_has_tokenizer(const GgufMetadata& meta);

// The byte-level pre-tokenizer names of `tokenizer.ggml.pre` this mapping supports.
std::vector<std::string> gguf_supported_pre_tokenizers();
// The inverse, for writers: the `tokenizer.ggml.pre` name whose split this spec is (GPT-2's
// regex is "gpt2"); nullopt for a SentencePiece spec or a split no name describes.
std::optional<std::string> gguf_pre_tokenizer_name(const model::BpeSpec& s);

// SentencePiece merges implied by a vocabulary and its scores, in rank order, exactly as
// transformers' generate_merges(vocab, vocab_scores) builds them: every split of a token into
// two tokens of the vocabulary (at code point boundaries) is a merge, ranked by the merged
// token's score (highest first), then by the longer left part, then the longer right part;
// ties keep vocabulary order (and, within one token, the parts' ids in ascending order).
std::vector<std::pair<std::string, std::string>> sentencepiece_merges_from_scores(
    const std::vector<std::string>& tokens, const std::vector<float>& scores);

// Undoes LlamaModel.permute of convert_hf_to_gguf.py on a [n_heads*head_dim, cols] matrix
// (interleaved-pair rows -> rotate-half rows); `dst` must not alias `src`.
void gguf_unpermute_qk_rows(const float* src, float* dst, int n_heads, int head_dim, int64_t cols);

// Weights of an opened GGUF file (config as gguf_model_config; every tensor shape-checked and
// checked finite). A decoder Linear with a `blk.N.<linear>.scale` tensor (F32, ne [1];
// llama.cpp's per-tensor NVFP4 scale, which multiplies the matmul output) is dequantized as
// fl(w * scale), w the ggml dequantized value.
// Without `keep`, every tensor is dequantized to owned fp32. With `keep` (a pointer owning
// `f`, held by Weights::storage), matrices stay as stored in the file mapping: F16/BF16/F32
// without a row permutation or scale are read in place (kF16/kBF16/kF32), every other type
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4, NVFP4, and permuted or scaled
// matrices) stays as ggml blocks (model::WeightDType::kGgml, with the scale and the
// permutation) whose rows have the bits of the fp32 load; the runtime reads them in fused
// kernels or a tile of rows at a time. Norms and biases are fp32.
model::Weights load_gguf_weights(const GgufFile& f,
                                 const std::shared_ptr<const GgufFile>& keep = nullptr);
// Opens `path` and loads its weights.
model::Weights load_gguf(const std::string& path);

// Llama-3 RoPE scaling in GGUF. llama.cpp stores it as the F32 tensor `rope_freqs.weight`
// (ne [head_dim/2]: factor i divides frequency i) and no rope keys; its converter
// (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors) computes the factors from
// factor, low/high_freq_factor and the original context in float32. gguf_llama3_rope_factors
// computes them the same way for c.rope_scaling (type kLlama3). Our writer also records the
// four parameters (kGgufLlama3RopeKey: [factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings], ignored by llama.cpp) so that our reader gets them back;
// without that key (llama.cpp's own files) the reader assumes Llama 3.x's low 1, high 4 and
// 8192 with the factor of the lowest frequency, and refuses a tensor that does not match.
inline constexpr const char* kGgufLlama3RopeKey = "scalesweep.rope.llama3";
// The model's own architecture where our writer stored it as another llama.cpp architecture:
// "qwen2" in a general.architecture "llama" file (llama.cpp's qwen2 graph ignores the FFN
// Linears' per-tensor `.scale`; its llama graph takes q/k/v biases and every `.scale`). Our
// reader reads such a file as the Qwen2 model; llama.cpp ignores the key.
inline constexpr const char* kGgufSourceArchKey = "scalesweep.architecture";
// Whether the file's q/k rows are in llama.cpp's llama order (general.architecture "llama":
// Llama, Mixtral, a Qwen2 stored as llama); qwen2/qwen3/qwen3moe files keep the HF order.
bool gguf_qk_permuted(const GgufFile& f);
std::vector<float> gguf_llama3_rope_factors(const model::Config& c);
// The tokenizer described by the file's metadata; null when it has no tokenizer.ggml.model.
std::unique_ptr<model::HfBpeTokenizer> load_gguf_tokenizer(const GgufFile& f);
std::unique_ptr<model::HfBpeTokenizer> load_gguf_tokenizer(const std::string& path);

}  // namespace scalesweep::io

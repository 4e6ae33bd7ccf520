// GGUF v3 writer (llama.cpp's model file format; the reader is io/gguf.h) and the NVFP4 model
// writer behind `scalesweep quantize ... -o OUT.gguf` and `scalesweep convert` (CT <-> GGUF).
//
// GgufWriter: metadata of every value type, tensors declared up front (name, ggml type, ne),
// the header (with every tensor offset) written from the declarations, then each tensor's
// bytes streamed in declaration order with the alignment padding, through an AtomicFile (temp
// file beside the target, renamed by commit(); nothing is left behind on an exception).
//
// ggml's NVFP4 (GGML_TYPE_NVFP4 = 40, ggml-common.h block_nvfp4): super-blocks of 64 elements
// along a row, 36 bytes each: d[4] = the E4M3 bytes of the four 16-element sub-blocks, then
// qs[32]: sub-block s, j = 0..7: qs[s*8 + j] low nibble = element s*16 + j, high nibble =
// element s*16 + j + 8 (E2M1 codes). ggml_ue4m3_to_fp32 decodes d[s] x 0.5 and kvalues_mxfp4 is
// 2 x E2M1, so an element is E2M1(code) x E4M3(d[s]) exactly (0x7F decodes to 0). A row length
// that is not a multiple of 64 cannot be NVFP4 in ggml.
//
// The per-tensor scale (llama.cpp src/llama-model.cpp: optional `blk.N.<linear>.scale`, F32,
// ne {1}; src/llama-graph.cpp build_lora_mm: y = (W . x) * scale) is the DECODE direction:
// scale = fl(1 / gs) for the compressed-tensors encode-direction global scale gs (which
// dequantizes as fl(q*s / gs)). Matched against the llama.cpp vendored by llama-cpp-python
// 0.3.36 (ggml 0.25.3, llama 0.5.0; the sdist records no commit: cmake/build-info.cmake says
// "unknown"): GGML_TYPE_NVFP4 = 40, LLAMA_FTYPE_MOSTLY_NVFP4 = 39.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/model_writer.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/linear_set.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {

// ---- metadata values --------------------------------------------------------------------------
// A scalar of type `type` holding `v` as given (no check that the type can hold it: tests build
// wrong values with it too).
GgufValue gguf_value(GgufValueType type, decltype(GgufValue::scalar) v);
// An array of `elem_type` holding `elems` as given (not checked either).
GgufValue gguf_value_array(GgufValueType elem_type, std::vector<GgufValue> elems);
GgufValue gguf_value_u32(uint32_t v);
GgufValue gguf_value_i32(int32_t v);
GgufValue gguf_value_u64(uint64_t v);
GgufValue gguf_value_f32(float v);
GgufValue gguf_value_bool(bool v);
GgufValue gguf_value_string(std::string v);
GgufValue gguf_value_string_array(const std::vector<std::string>& v);
GgufValue gguf_value_f32_array(const std::vector<float>& v);
GgufValue gguf_value_i32_array(const std::vector<int32_t>& v);

// Bytes of a tensor of `type` with ggml shape `ne` (ne[0] the row length); throws IoError
// naming `what` for an unknown type or a row length that is not a whole number of blocks.
uint64_t ggml_tensor_bytes(uint32_t type, const std::vector<int64_t>& ne, const std::string& what);

// ---- the file format ---------------------------------------------------------------------------
class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32);  // a power of two; written as general.alignment
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata in file order; a repeated key is refused (IoError naming it).
  void add_kv(std::string key, GgufValue v);
  // A tensor (ggml order ne); a repeated name or a row length that is no whole number of the
  // type's blocks is refused.
  void declare(std::string name, GgmlType type, std::vector<int64_t> ne);
  // Writes the header into a temp file beside `path`; after this only write() and commit().
  void open(const std::string& path);
  // The next declared tensor must be `name`, with exactly its byte size.
  void write(std::string_view name, std::span<const uint8_t> bytes);
  // The next bytes of the current tensor `name`, in order (a large tensor a tile at a time):
  // complete, and padded, once its declared byte count has arrived; more is refused.
  void write_part(std::string_view name, std::span<const uint8_t> bytes);
  // Throws IoError when a declared tensor was not written (or only partly); returns the file
  // size.
  uint64_t commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- tensor encodings ------------------------------------------------------------------------
// ggml NVFP4 blocks of a compressed-tensors-layout QuantizedTensor (NVFP4, block 16, cols a
// multiple of 64): codes and E4M3 scale bytes carried over bit for bit, nibbles re-packed.
// `row_order` (optional, rows entries): output row r is source row row_order[r].
std::vector<uint8_t> encode_ggml_nvfp4(const QuantizedTensor& q,
                                       const std::vector<int64_t>& row_order = {});
// The inverse: ggml NVFP4 rows -> compressed-tensors codes/scales (global_scale as given).
QuantizedTensor decode_ggml_nvfp4(const uint8_t* data, int64_t rows, int64_t cols,
                                  float global_scale);
// Plain reference of the NVFP4 decode: element (r, c) of ggml NVFP4 rows as E2M1 x E4M3.
float ggml_nvfp4_element(const uint8_t* data, int64_t cols, int64_t r, int64_t c);
// ggml's quantize_row_q8_0_ref: per 32 elements d = amax/127 stored as f16, q = round(x / d)
// (half away from zero) with 1/d computed once. n a multiple of 32.
std::vector<uint8_t> encode_q8_0(const float* x, int64_t n);

// llama.cpp's q/k row order (convert_hf_to_gguf.py LlamaModel.permute): GGUF row
// h*hd + 2i + a holds HF row h*hd + a*hd/2 + i. Returns, for each GGUF row, its HF row.
std::vector<int64_t> gguf_qk_row_order(int n_heads, int head_dim);
// The inverse (for each HF row, its GGUF row).
std::vector<int64_t> gguf_qk_row_order_inverse(int n_heads, int head_dim);

// ---- tokenizer metadata ------------------------------------------------------------------------
// Every tokenizer.* key of a GGUF file, verbatim, in file order.
GgufMetadata gguf_tokenizer_kv_copy(const GgufMetadata& m);
// tokenizer.ggml.model "llama" from a llama2.c vocabulary (spaces as "▁", <0xXX> bytes as
// byte tokens, 0/1/2 unk/bos/eos).
GgufMetadata gguf_tokenizer_kv_llama2c(const model::Llama2cTokenizer& t);
// From a tokenizer.json spec: byte-level -> "gpt2" (tokens, merges, token_type,
// tokenizer.ggml.pre named after the pre-tokenizer; an unmapped one is refused naming it);
// SentencePiece-style -> "llama" (scores ranked by the merge that first builds each token).
GgufMetadata gguf_tokenizer_kv_spec(const model::BpeSpec& s, const std::string& name);
// Dispatches on the tokenizer's class (Llama2cTokenizer, HfBpeTokenizer).
GgufMetadata gguf_tokenizer_kv(const model::Tokenizer& t, const std::string& name);
// The tokenizer.* keys of a Hugging Face directory's tokenizer.json (gguf_tokenizer_kv_spec);
// empty where the directory has no tokenizer.json.
GgufMetadata gguf_tokenizer_kv_of_hf_dir(const std::string& dir);

// ---- the model writer --------------------------------------------------------------------------
// Dense (non-NVFP4) tensor types a GGUF output can take: embeddings, lm_head and Linears left
// dense. Norms are always F32 (as llama.cpp's converter keeps 1-D tensors).
enum class GgufDense { kF32, kF16, kBF16, kQ8_0 };
inline constexpr auto kGgufDenseNames =
    make_names<GgufDense>("GGUF dense type", {{GgufDense::kF32, "f32"},
                                              {GgufDense::kF16, "f16"},
                                              {GgufDense::kBF16, "bf16"},
                                              {GgufDense::kQ8_0, "q8_0"}});

// How a Qwen2 model is stored for llama.cpp. `llama`: general.architecture "llama" (its graph
// adds the q/k/v biases and multiplies every Linear's `.scale`), q/k rows and their biases
// permuted as for Llama, kGgufSourceArchKey = "qwen2", every Linear NVFP4. `qwen2`: llama.cpp's
// own converter's layout, whose graph (llama-cpp-python 0.3.36) ignores the FFN Linears'
// `.scale`, so gate/up/down stay dense. Other architectures are stored as themselves.
enum class GgufQwen2As { kLlama, kQwen2 };
inline constexpr auto kGgufQwen2AsNames =
    make_names<GgufQwen2As>("GGUF architecture of a qwen2 model",
                            {{GgufQwen2As::kLlama, "llama"}, {GgufQwen2As::kQwen2, "qwen2"}});

struct GgufModelSpec {
  model::Config config;       // llama, qwen2 or qwen3 (check_gguf_config)
  bool write_lm_head = true;  // false: tied embeddings (no output.weight)
  model::LinearSet dense;     // Linears stored dense (in the dense type), per layer
  GgufDense dense_type = GgufDense::kF32;
  GgufQwen2As qwen2_as = GgufQwen2As::kLlama;
  std::string name;           // general.name
  GgufMetadata tokenizer_kv;  // tokenizer.* keys (may be empty: no tokenizer)
  // Set over tokenizer_kv (set_chat_meta_kv): template, BOS/EOS/EOT/pad ids, sampling defaults.
  std::optional<ChatMeta> chat;
  std::string source;      // for messages
  bool overwrite = false;  // replace an existing file
  // When known before writing (lossless conversion): the compressed-tensors global scales of
  // the NVFP4 Linears in file order, recorded as kGgufGlobalScalesKey so that GGUF -> CT gives
  // them back bit for bit (fl(1/fl(1/gs)) is not always gs). llama.cpp ignores the key.
  std::vector<float> global_scales;
};

inline constexpr const char* kGgufGlobalScalesKey = "scalesweep.nvfp4.global_scales";

// The ggml type a dense tensor of row length `cols` gets: Q8_0 needs cols % 32 == 0 (else
// F16, as llama.cpp's quantizer falls back).
GgmlType gguf_dense_type_for(GgufDense d, int64_t cols);

// What llama.cpp (and our reader) can load, refused by name (IoError) before anything is
// written. Architectures as llama.cpp's converter writes them: `llama` (q/k rows permuted to
// interleaved RoPE pairs), `qwen2` (NEOX RoPE, unpermuted; blk.N.attn_{q,k,v}.bias F32),
// `qwen3` (unpermuted; blk.N.attn_{q,k}_norm.weight F32 [head_dim]); key_length/value_length
// when head_dim * n_heads != dim. RoPE: linear (rope.scaling.type/factor), yarn (type, factor,
// original_context_length, yarn_beta_fast/slow; truncate and the default attention factor
// 0.1 ln(factor) + 1 only, which llama.cpp applies), llama3 (llama only: the F32 tensor
// rope_freqs.weight [head_dim/2] and kGgufLlama3RopeKey). Mixture-of-experts models as
// `qwen3moe` (q/k norms) and Mixtral as `llama` with expert_count: the router
// blk.N.ffn_gate_inp F32, every expert's Linear stacked in blk.N.ffn_{gate,up,down}_exps (ne
// [cols, rows, n_expert], NVFP4) with one `.scale` per expert (F32 {n_expert}, 1/gs of that
// expert, multiplied into its output by llama.cpp's build_moe_ffn). Refused: dynamic NTK, q/k/v
// biases outside qwen2, q/k norms outside qwen3/qwen3moe and those without them; for experts:
// dense layers between expert layers, norm_topk_prob = false, expert rows that are no whole
// number of 64-element super-blocks.
void check_gguf_config(const model::Config& c, const std::string& source);

// general.architecture as llama.cpp names it: qwen3moe for Qwen3-MoE, llama for Mixtral (with
// expert_count), the Hugging Face model_type otherwise.
std::string gguf_arch_name(model::Arch a);
// The general.architecture a model of `c` is stored under (gguf_arch_name, or "llama" for a
// Qwen2 model stored as llama).
std::string gguf_file_arch(const model::Config& c, GgufQwen2As qwen2_as);

// Why Linear `id` of config `c` cannot be NVFP4 in a GGUF llama.cpp runs correctly, or "" when
// it can: a row length that is no whole number of ggml's 64-element super-blocks, or an
// architecture whose llama.cpp graph does not multiply the per-tensor `.scale` into that
// Linear (llama-cpp-python 0.3.36: qwen2's ffn_gate/ffn_up/ffn_down; measured, see
// python/tests/test_gguf_archs.py), so that its NVFP4 weights would be used gs times too large.
// Such Linears are kept dense by `quantize` (with this reason as a note) and refused as NVFP4
// by the writer.
std::string gguf_nvfp4_obstacle(const model::Config& c, model::LinearId id, GgufQwen2As qwen2_as);
// The Linears with an obstacle (kept dense in every layer), indexed by model::LinearId.
std::array<bool, 7> gguf_dense_linears(const model::Config& c, GgufQwen2As qwen2_as);

// io::ModelWriter's protocol (io/model_writer.h): every tensor is declared from the config up
// front, then embeddings, layers 0..n-1, head, commit() (temp file renamed into place).
class GgufModelWriter final : public ModelWriter {
 public:
  GgufModelWriter(const std::string& out, const GgufModelSpec& spec);
  ~GgufModelWriter() override;
  GgufModelWriter(const GgufModelWriter&) = delete;
  GgufModelWriter& operator=(const GgufModelWriter&) = delete;
  void write_embeddings(const model::Tensor& tok_embeddings) override;
  // NVFP4 Linears need block 16 and cols % 64 == 0; their global scale becomes the .scale
  // tensor 1/gs. input_global_scale is refused (llama.cpp has no W4A4 for these Linears).
  void write_layer(int layer, const model::LayerWeights& lw,
                   const std::vector<CheckpointLinear>& linears) override;
  void write_head(const model::Tensor& final_norm, const model::Tensor& lm_head) override;
  CheckpointFiles commit() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// llama.cpp tensor names of a decoder Linear ("blk.3.attn_q").
std::string gguf_linear_name(int layer, model::LinearId id);

}  // namespace scalesweep::io

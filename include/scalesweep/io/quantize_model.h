// Whole-model NVFP4 quantization (RTN or GPTQ with any block-scale selector) and the
// compressed-tensors checkpoint writer behind `scalesweep quantize` (layer `io`).
//
// Every Linear of every decoder layer is quantized (q/k/v/o, gate/up/down); embeddings, norms,
// biases and lm_head stay in full precision. Fused projections share one encode-direction
// global scale computed from the largest amax of the group (q/k/v; gate/up), as vLLM and
// llm-compressor require. Importance for the weighted selectors is diag(sum x x^T) of the
// Linear's calibration input (GPTQ: diag H = 2/n of it). W4A4 stores the input global scale
// 6*C/amax from the calibration amax of the Linear's input (C = 448 for absmax, else 256).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/load.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {

struct QuantizeOptions {
  Method method = Method::kSweepMse;
  int block = 16;
  bool gptq = false;
  double damp = 0.01;     // GPTQ relative damping
  int gptq_block = 128;   // GPTQ lazy-batch column block
  bool act_order = true;  // GPTQ static reordering
  bool w4a4 = false;      // record input global scales (--quant WA)
  int threads = 0;
  // Linears left unquantized (their source values), indexed by model::LinearId. A fused
  // group's shared global scale comes from its quantized members only.
  std::array<bool, 7> dense{};
};

// Whether these options need calibration statistics (GPTQ, W4A4, weighted selectors).
bool needs_calibration(const QuantizeOptions& o);
// Throws std::invalid_argument with a message for the user when options are impossible
// (opt-fp32, a block size that the checkpoint format cannot store when `for_checkpoint`,
// missing calibration, MXFP4-only settings, ...).
void check_quantize_options(const QuantizeOptions& o, const model::CalibStats* calib,
                            bool for_checkpoint);

// "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj", ...
std::string hf_module_name(int layer, model::LinearId id);
const model::Tensor& linear_weight(const model::LayerWeights& lw, model::LinearId id);
model::Tensor& linear_weight(model::LayerWeights& lw, model::LinearId id);
inline constexpr model::LinearId kAllLinears[7] = {
    model::LinearId::kQ,    model::LinearId::kK,  model::LinearId::kV,   model::LinearId::kO,
    model::LinearId::kGate, model::LinearId::kUp, model::LinearId::kDown};

struct LinearResult {
  int layer = 0;
  model::LinearId id = model::LinearId::kQ;
  std::string name;    // HF module name
  bool dense = false;  // left unquantized (QuantizeOptions::dense): q has rows/cols only
  QuantizedTensor q;
  std::optional<float> input_global_scale;
  double nmse = 0;                     // weight NMSE of the result
  double loss_rtn = 0, loss_gptq = 0;  // tr(D H D^T) (GPTQ runs only)
  double seconds = 0;
};

// Quantizes the seven Linears of `layer` (order q, k, v, o, gate, up, down).
std::vector<LinearResult> quantize_layer(const model::Weights& w, int layer,
                                         const model::CalibStats* calib,
                                         const QuantizeOptions& opt);

// A copy of `w` whose Linear weights are replaced by their dequantized NVFP4 values
// (simulation of a quantized checkpoint; the other tensors are shared, not copied).
// `results` (optional) receives the per-Linear results with their codes dropped.
model::Weights quantized_weights(const model::Weights& w, const model::CalibStats* calib,
                                 const QuantizeOptions& opt,
                                 const std::function<void(int64_t, int64_t)>& progress = {},
                                 std::vector<LinearResult>* results = nullptr);

enum class DenseDType { kF32, kBF16, kF16 };

// What the checkpoint writer does with Linears that vLLM's compressed-tensors NVFP4 path
// cannot load (see vllm_unsupported_linears).
enum class PartialBlocks {
  kDense,     // leave them (and their fused group) dense, listed in quantization_config.ignore
  kQuantize,  // quantize them anyway, partial last block (loadable by scalesweep only)
};

// The Linears of a model with config `c` that vLLM's compressed-tensors NVFP4 schemes
// (CompressedTensorsW4A4Fp4 / W4A16Fp4) cannot take, with the reason, in kAllLinears order:
//  - K % 16 != 0: vLLM allocates weight_scale [N, K // 16] and weight_packed [N, K // 2]
//    (create_weights), so a partial last block has no place, and its FP4 GEMMs (CUTLASS,
//    FlashInfer, Marlin) work on whole 16-element groups. N has no constraint (vLLM pads N
//    to 32 for CUTLASS, to 64 for Marlin).
//  - a member of a fused group (q/k/v -> qkv_proj, gate/up -> gate_up_proj) whose partner
//    cannot be quantized: vLLM requires one scheme per fused layer (should_ignore_layer
//    raises "Found a different quantization schemes"), so the whole group stays dense.
//  - under tensor parallelism `tp` (vLLM's tensor_parallel_size), the row-parallel Linears
//    o_proj and down_proj (RowParallelLinear) split K: each rank holds K / tp input columns
//    (vLLM refuses K % tp != 0) and weight_scale [N, (K / tp) // 16], so they also need
//    (K / tp) % 16 == 0. Column-parallel Linears (q/k/v, gate/up) split N, which NVFP4 does
//    not constrain (see vllm_tp_refusal for vLLM's own divisibility requirement).
// Throws std::invalid_argument unless 1 <= tp <= kMaxTp.
inline constexpr int kMaxTp = 1024;
struct UnsupportedLinear {
  model::LinearId id;
  std::string reason;
};
std::vector<UnsupportedLinear> vllm_unsupported_linears(const model::Config& c, int tp = 1);
// Whether a Linear is row-parallel in vLLM (o_proj, down_proj: K split across ranks).
bool vllm_row_parallel(model::LinearId id);
// A note for the user when vLLM itself will refuse tensor_parallel_size = tp for this model
// (a column-parallel Linear whose N is not a multiple of tp: vLLM divides N by tp); empty
// when it will not (as far as these shapes tell; vLLM also checks head counts).
std::string vllm_tp_refusal(const model::Config& c, int tp);

struct WriteOptions {
  DenseDType dense = DenseDType::kF32;  // embeddings, norms, biases, lm_head, dense Linears
  PartialBlocks partial_blocks = PartialBlocks::kDense;
  // vLLM tensor_parallel_size the checkpoint must load under (vllm_unsupported_linears).
  int tp = 1;
  // > 0: Hugging Face shards model-0000i-of-0000n.safetensors of at most this many bytes of
  // tensor data each (huggingface_hub's split: a tensor is never split, one larger than the
  // limit gets a shard of its own) + model.safetensors.index.json; a single shard is written
  // as model.safetensors without an index, as HF does. 0: always one model.safetensors.
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;  // replace an existing output directory
  // Testing hook: called after each layer is written (an exception thrown here simulates an
  // interrupted run; the output directory must then not exist).
  std::function<void(int)> after_layer;
};

struct QuantizeReport {
  std::string out_dir;
  std::vector<LinearResult> linears;  // codes dropped; dense ones flagged
  std::vector<std::string> ignore;    // quantization_config.ignore as written
  std::vector<std::string> files;     // the safetensors file names, in shard order
  uint64_t bytes = 0;                 // size of the safetensors file(s)
  double seconds = 0;
  // Wall-time breakdown (seconds; the rest of `seconds` is setup, tokenization, config and
  // tokenizer files). load: reading (and widening) the source layers (streamed path only);
  // forward: the calibration samples through the layers; hessians: accumulating sum x x^T
  // (and amax) from the forward's inputs; quantize: GPTQ / RTN of the Linears; write: encoding
  // and writing the safetensors tensors.
  struct Phases {
    double load = 0, forward = 0, hessians = 0, quantize = 0, write = 0;
  } phases;
};

// Quantizes `src` (loaded from `src_path`, a llama2.c file or a HF directory) and writes a
// compressed-tensors NVFP4 checkpoint to `out_dir` atomically (a temporary directory beside
// it, renamed at the end). Streams: one layer's tensors are in memory at a time.
// `progress(done, total)` counts Linears.
QuantizeReport write_quantized_checkpoint(
    const LoadedModel& src, const std::string& src_path, const model::CalibStats* calib,
    const QuantizeOptions& opt, const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress = {});

// Layer-by-layer streaming of a Hugging Face directory (`scalesweep quantize` on a HF source):
// the input model is never loaded whole. Per decoder layer: materialize its tensors (fp32,
// io::HfLazyModel), run the calibration samples' hidden states through it collecting the
// statistics the options need (Hessians sum x x^T for GPTQ / weighted selectors, amax for
// W4A4), quantize its Linears (quantize_layer), write them, propagate the hidden states, free
// the layer. Resident memory: one layer (fp32) + its statistics + the calibration hidden
// states [nsamples, seqlen, dim] fp32 + the embeddings while they are written/embedded.
struct StreamOptions {
  std::string calib_text;                    // calibration text (needed unless `stats`)
  const model::CalibStats* stats = nullptr;  // precomputed statistics: used as given, no forward
  int64_t nsamples = 128, seqlen = 512;      // seqlen is capped at the model's max_seq_len
  uint64_t seed = 0;
  std::string tokenizer;  // tokenizer override (default: the directory's tokenizer.json)
  // GPTQ: propagate the hidden states through the QUANTIZED layer, so that later layers
  // calibrate on the outputs of quantized earlier layers (sequential GPTQ, as GPTQ and
  // llm-compressor do). false: through the full-precision layer (the statistics, hence the
  // result, then equal the whole-model path's). RTN always propagates full precision, so its
  // output equals the whole-model path byte for byte.
  bool sequential = true;
};

QuantizeReport write_quantized_checkpoint_streamed(
    const std::string& hf_dir, const StreamOptions& so, const QuantizeOptions& opt,
    const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress = {});

// Instrumentation of the streamed path: decoder layers materialized right now, and the most
// at once since reset_streamed_layers_peak().
int streamed_layers_live();
int streamed_layers_peak();
void reset_streamed_layers_peak();

// config.json for a model (Llama, Qwen2, Qwen3 HF conventions) without quantization_config.
std::string hf_config_json(const model::Config& c);

}  // namespace scalesweep::io

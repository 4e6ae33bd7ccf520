// Whole-model NVFP4 quantization (RTN or GPTQ with any block-scale selector) into a
// compressed-tensors checkpoint: the job behind `scalesweep quantize` (layer `pipeline`; the
// file format is io/checkpoint.h, vLLM's loading rules pipeline/vllm_compat.h).
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

#include "scalesweep/base/names.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/load.h"
#include "scalesweep/io/model_parts.h"
#include "scalesweep/io/model_writer.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/linear_set.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/events.h"
#include "scalesweep/pipeline/mixed_precision.h"
#include "scalesweep/pipeline/vllm_compat.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::pipeline {

struct QuantizeOptions {
  Method method = Method::kSweepMse;
  int block = 16;
  bool gptq = false;
  double damp = 0.01;     // GPTQ relative damping
  int gptq_block = 128;   // GPTQ lazy-batch column block
  bool act_order = true;  // GPTQ static reordering
  // GPTQ block scales chosen before the column loop or in it (gptq/gptq.h), and the dynamic
  // selection's importance for the weighted methods.
  gptq::ScaleTiming gptq_scales = gptq::ScaleTiming::kStatic;
  gptq::DynamicImportance gptq_importance = gptq::GptqConfig{}.importance;
  bool w4a4 = false;  // record input global scales (--quant WA)
  int threads = 0;
  // C in a fused group's global scale gs = 6C/amax (the group's largest |w|); nullopt: the
  // method's default (quant::default_max_block_scale: 448 absmax, 256 otherwise). 448 is
  // compressed-tensors' and llm-compressor's convention (gs = 448 * 6 / amax).
  std::optional<float> max_block_scale;
  // > 0: each fused group's global scale is searched (quant::search_global_scale over the rule's
  // and 448 * 2^(-k/steps), k < steps) for the least total objective of the group's members,
  // instead of the rule 6C/amax. 0: the rule.
  int global_scale_steps = 0;
  // Linears left unquantized (their source values), per layer or a kind in every layer
  // (--keep-dense). A fused group's shared global scale comes from its quantized members only.
  model::LinearSet dense;
  // Mixture-of-experts layers (quantize_layer): an expert whose statistics hold fewer tokens
  // than this (ExpertStats::in.tokens: the tokens routed to it, or every token when calibrated
  // with all_experts; -1: the model's hidden size dim, below which its gate/up ΣxxT [dim, dim]
  // cannot have full rank) is quantized data-free: RTN with data_free_method(method) instead of
  // GPTQ or a calibrated selector (--expert-min-tokens).
  int64_t expert_min_tokens = -1;
};

// The selector an expert without enough calibration tokens uses: a method that reads no
// statistics is its own; sweep-wmse -> sweep-mse, exhaustive-wmse and exhaustive-hessian ->
// exhaustive-mse, opt-fp8-wmse -> opt-fp8-mse, sweep-hessian -> sweep-mse; sweep (a custom
// window) stays sweep, unweighted.
Method data_free_method(Method m);

// Named recipes (`quantize --preset`): the combination of selector, GPTQ and global-scale
// search that measured best (docs/PEERS.md has the tables behind it).
enum class Preset { kBest };
inline constexpr auto kPresetNames = make_names<Preset>("preset", {{Preset::kBest, "best"}});
// Sets the options a preset decides (method, gptq and its scale timing, global_scale_steps);
// the others (block, w4a4, dense, threads, ...) stay as given. Which options a preset owns:
// preset_fields(), for the callers' conflict checks.
void apply_preset(Preset p, QuantizeOptions& o);
std::vector<std::string> preset_fields(Preset p);

// Whether these options need calibration statistics (GPTQ, W4A4, weighted selectors).
bool needs_calibration(const QuantizeOptions& o);
// Throws std::invalid_argument with a message for the user when options are impossible
// (opt-fp32, a block size that the checkpoint format cannot store when `for_checkpoint`,
// missing calibration, MXFP4-only settings, ...).
void check_quantize_options(const QuantizeOptions& o, const model::CalibStats* calib,
                            bool for_checkpoint);

// Where a MoE expert's W4A4 input global scale comes from (QuantizeOptions::w4a4): kOwn, the
// amax of its own calibrated input (the router sent it at least expert_min_tokens tokens);
// kLayerMax, an expert below that (or without tokens) takes the largest input amax among the
// layer's experts that reached it (or, when none did, among those that saw any token) for
// the same input (gate/up or down): never 0, NaN or Inf, and never a smaller range than a
// calibrated expert of the layer sees.
enum class InputScaleSource { kOwn, kLayerMax };
inline constexpr auto kInputScaleSourceNames = make_names<InputScaleSource>(
    "input scale source",
    {{InputScaleSource::kOwn, "own"}, {InputScaleSource::kLayerMax, "layer-max"}});

struct LinearResult {
  int layer = 0;
  model::LinearId id = model::LinearId::kQ;
  int expert = -1;         // a MoE layer's expert (its gate/up/down), else -1
  int64_t routed = 0;      // an expert's routed calibration tokens
  bool data_free = false;  // an expert below expert_min_tokens: RTN with data_free_method
  std::optional<InputScaleSource> input_scale_source;  // experts with W4A4
  std::string name;                                    // HF module name
  bool dense = false;  // left unquantized (QuantizeOptions::dense): q has rows/cols only
  QuantizedTensor q;
  std::optional<float> input_global_scale;
  double nmse = 0;                     // weight NMSE of the result
  double loss_rtn = 0, loss_gptq = 0;  // tr(D H D^T) (GPTQ runs only)
  double seconds = 0;
};

// Quantizes the seven Linears of `layer` (order q, k, v, o, gate, up, down); a MoE layer
// (Config::moe_layer): q, k, v, o, then each expert's gate, up, down (expert order), the
// router left dense (not in the result). Each expert's gate and up share one global scale
// (6C / the larger amax of the two: the fused group llm-compressor writes); its down has its
// own. Experts with at least expert_min_tokens routed tokens use the run's selector, or GPTQ
// on their own ΣxxT; the others are data-free (data_free_method, RTN).
std::vector<LinearResult> quantize_layer(const model::Weights& w, int layer,
                                         const model::CalibStats* calib,
                                         const QuantizeOptions& opt);

// The sensitivities (pipeline/mixed_precision.h) of the Linears of `layer` that `opt`
// quantizes (those in opt.dense are skipped), from that layer's statistics in `calib` (with
// ΣxxT): each Linear's RTN result with the run's selector and group global scale (opt.gptq and
// opt.w4a4 are ignored).
std::vector<LinearSensitivity> layer_sensitivities(const model::Weights& w, int layer,
                                                   const model::CalibStats& calib,
                                                   const QuantizeOptions& opt, Sensitivity s);

// The measured sensitivities (Sensitivity kKl, kNll) of every Linear that `opt` quantizes:
// the hidden states of the sequences `seqs` ([nsamples, seqlen] tokens) entering each layer are
// kept, and for each Linear (quantized as the run does: RTN, or with opt.gptq GPTQ on these
// statistics) the layers from its own on and the head run again with only it quantized; KL and
// NLL against the dense model's. The proxies of layer_sensitivities (loss, energy: RTN) are
// filled too. Cost: one suffix of the model per Linear.
std::vector<LinearSensitivity> measured_sensitivities(
    const model::Weights& w, const model::CalibStats& calib, const QuantizeOptions& opt,
    const std::vector<int>& seqs, int64_t nsamples, int64_t seqlen, Sensitivity s,
    const std::function<void(int64_t, int64_t)>& progress = {});

// How quantized_weights holds a quantized Linear: its dequantized values in fp32, or packed
// (model::WeightDType::kNvfp4: the codes, E4M3 scales and global scale, 4.5 bits a weight;
// NVFP4 with 16-element blocks only, anything else stays fp32), which the runtime decodes to
// the same fp32 values bit for bit.
enum class QuantizedForm { kF32, kPacked };

// A copy of `w` whose Linear weights are replaced by their NVFP4 quantization (simulation of a
// quantized checkpoint; the other tensors are shared, not copied). `results` (optional)
// receives the per-Linear results with their codes dropped.
model::Weights quantized_weights(const model::Weights& w, const model::CalibStats* calib,
                                 const QuantizeOptions& opt,
                                 const std::function<void(int64_t, int64_t)>& progress = {},
                                 std::vector<LinearResult>* results = nullptr,
                                 QuantizedForm form = QuantizedForm::kF32);

// Puts layer `layer`'s results (quantize_layer) into `out` (a copy of the source model) as
// quantized_weights does; dense results leave the source tensor. Each result's codes are
// moved out (its scales kept).
void place_quantized_layer(model::Weights& out, int layer, std::vector<LinearResult>& rs,
                           QuantizedForm form);

struct WriteOptions {
  DType dense = DType::kF32;  // embeddings, norms, biases, lm_head, dense Linears
  PartialBlocks partial_blocks = PartialBlocks::kDense;
  // vLLM tensor_parallel_size the checkpoint must load under (vllm_unsupported_linears).
  int tp = 1;
  // > 0: Hugging Face shards model-0000i-of-0000n.safetensors of at most this many bytes of
  // tensor data each (huggingface_hub's split: a tensor is never split, one larger than the
  // limit gets a shard of its own) + model.safetensors.index.json; a single shard is written
  // as model.safetensors without an index, as HF does. 0: always one model.safetensors.
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;  // replace an existing output directory
  // GGUF outputs (io::is_gguf_path): dense tensors in Q8_0 instead of `dense` (rows whose length
  // is not a multiple of 32 fall back to F16); a GGUF source's tokenizer.* keys are copied
  // verbatim unless the tokenizer was overridden.
  bool dense_q8_0 = false;
  io::GgufQwen2As gguf_qwen2_as = io::GgufQwen2As::kLlama;  // GGUF outputs of Qwen2 models
  bool tokenizer_override = false;
};

struct QuantizeReport {
  std::string out_dir;
  std::vector<LinearResult> linears;  // codes dropped; dense ones flagged
  std::vector<std::string> ignore;    // quantization_config.ignore as written
  std::vector<std::string> files;     // the safetensors file names, in shard order
  uint64_t bytes = 0;                 // size of the safetensors file(s)
  double seconds = 0;
  // Wall-time breakdown (seconds; the rest of `seconds` is setup, tokenization, config and
  // tokenizer files). load: reading (and widening) the source (the layers as they stream, or
  // the whole model of a GGUF / llama2.c / non-streamed source); forward: the calibration
  // samples through the layers (for a whole-model source its Hessian accumulation included,
  // hessians then 0); hessians: accumulating sum x x^T (and amax) from the forward's inputs;
  // quantize: GPTQ / RTN of the Linears; write: encoding and writing the tensors. `seconds`
  // covers the whole job, the load included.
  // sensitivity: the measurement of --target-bpw before any of these (for a streamed source
  // its own pass: load, forward, statistics and RTN of every layer; else the RTN and the
  // proxies on the statistics in memory).
  struct Phases {
    double load = 0, forward = 0, hessians = 0, quantize = 0, write = 0, sensitivity = 0;
  } phases;
  // --target-bpw: the choice and the sensitivities it was made from (every Linear that could
  // be NVFP4, in layer order).
  std::optional<MixedPlan> mixed;
  std::vector<LinearSensitivity> sensitivities;
};

// Quantizes `src` (loaded from `src_path`, a llama2.c file or a HF directory) and writes a
// compressed-tensors NVFP4 checkpoint (or, for an `out_dir` ending in .gguf, an NVFP4 GGUF
// file) to `out_dir` atomically (a temporary directory beside
// it, renamed at the end). Streams: one layer's tensors are in memory at a time.
// `progress(done, total)` counts Linears.
QuantizeReport write_quantized_checkpoint(
    const io::LoadedModel& src, const std::string& src_path, const model::CalibStats* calib,
    const QuantizeOptions& opt, const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress = {});

// Layer-by-layer streaming (`scalesweep quantize` on a HF directory or a GGUF file): the input
// model is never widened whole. Per decoder layer: materialize its tensors (fp32,
// io::ModelParts::layer), run the calibration samples' hidden states through it collecting the
// statistics the options need (Hessians sum x x^T for GPTQ / weighted selectors, amax for
// W4A4), quantize its Linears (quantize_layer), write them, propagate the hidden states, free
// the layer. Resident memory: one layer (fp32) + its statistics + the calibration hidden
// states [nsamples, seqlen, dim] fp32 + the embeddings while they are written/embedded.
struct StreamOptions {
  CalibSource calib;  // calib.text needed unless `stats`; calib.stats is not read here
  const model::CalibStats* stats = nullptr;  // precomputed statistics: used as given, no forward
  std::string tokenizer;  // tokenizer override (default: the directory's tokenizer.json)
  // GPTQ: propagate the hidden states through the QUANTIZED layer, so that later layers
  // calibrate on the outputs of quantized earlier layers (sequential GPTQ, as GPTQ and
  // llm-compressor do). false: through the full-precision layer (the statistics, hence the
  // result, then equal the whole-model path's). RTN always propagates full precision, so its
  // output equals the whole-model path byte for byte.
  bool sequential = true;
};

// Where the layers come from: a HF directory (io::HfLazyModel) or a model loaded as stored
// (io::StoredModelParts: a GGUF's quantized blocks stay in the file mapping).
struct StreamSource {
  const io::ModelParts* parts = nullptr;
  std::string path;  // the source file or directory (messages, chat metadata, tokenizer files)
  bool hf_dir = false;
  // The source's tokenizer (calibration, and written beside the output); null for a HF
  // directory, whose tokenizer files are read from `path`.
  const model::Tokenizer* tokenizer = nullptr;
};

QuantizeReport write_quantized_checkpoint_streamed(
    const StreamSource& source, const StreamOptions& so, const QuantizeOptions& opt,
    const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress = {});
// A HF directory's layers (io::HfLazyModel).
QuantizeReport write_quantized_checkpoint_streamed(
    const std::string& hf_dir, const StreamOptions& so, const QuantizeOptions& opt,
    const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress = {});

// ---- the one entry -------------------------------------------------------------------------

// What `scalesweep quantize` asks for. Calibration comes from calib.stats (a file of
// `scalesweep calibrate`) or is collected from calib.text when the options need it (GPTQ,
// W4A4, weighted selectors); calib.seqlen is capped at the model's max_seq_len with a note.
struct QuantizeRequest {
  QuantizeOptions options;
  std::string out_dir;
  std::string tokenizer;  // tokenizer override (llama2.c models; HF/GGUF: tokenizer.json)
  CalibSource calib;
  std::optional<DType> dense;  // nullopt: the HF source's torch_dtype, float32 otherwise
  PartialBlocks partial_blocks = PartialBlocks::kDense;
  int tp = 1;
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;
  bool dense_q8_0 = false;  // --dense-dtype q8_0 (GGUF outputs only)
  // --gguf-arch: how a Qwen2 model is stored in a GGUF output (GGUF outputs only; unset: llama).
  std::optional<io::GgufQwen2As> gguf_qwen2_as;
  bool stream = true;      // a HF directory or GGUF is streamed layer by layer unless false
  bool sequential = true;  // StreamOptions::sequential
  // Mixed precision (pipeline/mixed_precision.h): the Linear weights take at most this many
  // bits per weight; the Linears with the highest sensitivity per extra bit stay dense (per
  // fused group for a compressed-tensors output). Needs calibration (calib).
  std::optional<double> target_bpw;
  Sensitivity sensitivity = Sensitivity::kRelative;
  // Measured sensitivities (kl, nll): on the first this many calibration sequences (the model
  // is then loaded whole: each Linear's pass runs the layers after it).
  int64_t sensitivity_samples = 4;
};

// Progress stages: "calibrate" (unit "seq", counted in sequences), "sensitivity" ("linear",
// with --target-bpw), then "quantize" ("linear").
using QuantizeEvents = JobEvents;

struct QuantizeResult {
  QuantizeReport report;
  DType dense = DType::kF32;  // the dense dtype used
  bool streamed = false;      // layer by layer (HF or GGUF source) or in memory
};

// Throws std::invalid_argument for a request that cannot succeed, before anything is read
// (quantize_model calls it too; the CLI calls it before checking its output path).
void check_quantize_request(const QuantizeRequest& request);

// Checks the request (before loading anything when it can), chooses the streamed path for a
// HF directory or a GGUF file (unless !stream; a llama2.c file is loaded whole), calibrates when
// the options need it, quantizes (GPTQ or RTN) and writes the checkpoint. `source` is a llama2.c
// .bin, a GGUF file or a HF directory.
QuantizeResult quantize_model(const std::string& source, const QuantizeRequest& request,
                              const QuantizeEvents& events = {});

}  // namespace scalesweep::pipeline

// Run-time model setup (layer `pipeline`) behind `ppl` and `generate`: load a model, apply what
// its checkpoint declares (NVFP4 weights as stored, W4A4 run-time activation quantization) or
// the simulated quantization asked for (model::SimQuantSpec, with calibration statistics when
// it needs them), and build the Transformer that runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"

namespace scalesweep::pipeline {

// What the command line asked for (tools/options.h SimQuantOptions and ModelOptions).
struct RuntimeRequest {
  std::string model, tokenizer;  // the model path; a separate tokenizer file when non-empty
  std::string quant = "none";    // none, W, WA, WAKV, WAKVQ
  std::string method = "sweep-mse", format = "nvfp4";
  int block = 0;  // 0: the format's
  // Which of the options that only shape --quant were given (--format, --method, --block).
  bool format_given = false, method_given = false, block_given = false;
  std::string stats, calib_text;  // --stats FILE, --calib FILE
  int64_t nsamples = 128, seqlen = 512;
  uint64_t seed = 0;  // picks the calibration sequences
  bool force_requant = false;
  std::string compute = "fp32";  // model::kComputeNames
};

// Where load_runtime reports: `note` gets pipeline notes (the --calib-seqlen cap), `calibrate`
// the calibration progress (done, total), as pipeline::calib_stats_for passes it.
struct RuntimeProgress {
  std::function<void(const std::string&)> note;
  std::function<void(int64_t, int64_t)> calibrate;
};

struct RuntimeModel {
  io::LoadedModel model;                     // its tokenizer is always set
  model::SimQuantSpec spec;                  // what is simulated on top of the loaded weights
  std::unique_ptr<model::CalibStats> stats;  // null unless spec.needs_stats()
  // A W4A4 checkpoint run as it declares (no --quant): its Linear inputs quantized per token
  // at run time with its stored input_global_scale and `act_method` block scales.
  std::shared_ptr<const model::RuntimeQuant> checkpoint_rq;
  std::string act_method;
  std::string method;                             // the request's method
  model::Compute compute = model::Compute::kF32;  // checked available before loading
};

// The spec a request describes (throws std::invalid_argument for an unknown setting, format
// or method, for impossible combinations such as --format mxfp4 --block 16, and for a shaping
// option given without --quant).
model::SimQuantSpec runtime_spec(const RuntimeRequest& request);

// Validates the request (before loading anything), loads the model (requiring a tokenizer),
// applies what the checkpoint declares (W4A4: run-time activation quantization with the stored
// global scales, --method naming the block-scale selector, absmax by default as vLLM; --quant
// on NVFP4 weights is refused without --force-requant) and, when the spec needs them, loads or
// collects calibration statistics (--calib-seqlen is capped at the model's max_seq_len with a
// note).
RuntimeModel load_runtime(const RuntimeRequest& request, const RuntimeProgress& progress = {});

// How the model runs: quant ("FP", "W", "WA", ...), method, format ("none" for FP), block,
// source ("none": full precision, "simulated": --quant, "checkpoint": the quantization the
// checkpoint declares, "checkpoint+simulated": --force-requant on an NVFP4 checkpoint) and
// compute.
struct RuntimeDescription {
  std::string quant, method, format;
  int block = 0;
  std::string source, compute;
};
RuntimeDescription describe_runtime(const RuntimeModel& rm);

// The Transformer that runs `rm` on `fp` (its weights, moved out of rm.model), in rm.compute.
std::unique_ptr<model::Transformer> make_runtime_transformer(
    const RuntimeModel& rm, std::shared_ptr<const model::Weights> fp, int max_ctx);

}  // namespace scalesweep::pipeline

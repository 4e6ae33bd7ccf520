// Run-time model setup (layer `pipeline`) behind `ppl` and `generate`: load a model, apply what
// its checkpoint declares (NVFP4 weights as stored, W4A4 run-time activation quantization) or
// the simulated quantization asked for (model::SimQuantSpec, with calibration statistics when
// it needs them), and build the Transformer that runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/events.h"

namespace scalesweep::pipeline {

// The simulated quantization asked for: the setting (kNone: off) and the options that only
// shape it, each nullopt when not given (then sweep-mse, nvfp4, the format's block). On a
// W4A4 checkpoint run as it declares, `method` alone names the run-time activation selector.
struct SimQuantRequest {
  model::QuantSetting setting = model::QuantSetting::kNone;
  std::optional<Method> method;
  std::optional<TensorFormat> format;
  std::optional<int> block;
  bool shaped() const { return method || format || block; }
};

// A model to run (`ppl`, `generate`), typed: names are parsed by the caller (tools/options.h
// parse_named, the Python module).
struct RuntimeRequest {
  std::string model, tokenizer;  // the model path; a separate tokenizer file when non-empty
  SimQuantRequest sim;
  CalibSource calib;  // when the simulated quantization needs statistics
  bool force_requant = false;
  model::Compute compute = model::Compute::kF32;
  // The job's own checks that need only the model's config (a context against max_seq_len):
  // load_runtime runs them on the config read without weights (io::peek_model_config), before
  // loading, and again on the loaded config where the path has no such peek (llama2.c).
  std::function<void(const model::Config&)> check_config;
};

// Where load_runtime reports: notes (the calib_seqlen cap) and the stage "calibrate" (unit
// "seq", counted in sequences) when it collects statistics from a text.
using RuntimeProgress = JobEvents;

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

// The spec a request describes (throws quant::check_block's OptionError for impossible
// combinations such as format mxfp4 with block 16, std::invalid_argument for method sweep,
// and OptionError for a shaping option given without a setting, named by its field).
model::SimQuantSpec runtime_spec(const RuntimeRequest& request);

// Validates the request (before loading anything), loads the model (requiring a tokenizer),
// applies what the checkpoint declares (W4A4: run-time activation quantization with the stored
// global scales, sim.method naming the block-scale selector, absmax by default as vLLM; a
// setting on NVFP4 weights is refused without force_requant) and, when the spec needs them,
// loads or collects calibration statistics (calib.seqlen is capped at the model's max_seq_len
// with a note naming "calib_seqlen"). A compute mode this build lacks: OptionError "compute".
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

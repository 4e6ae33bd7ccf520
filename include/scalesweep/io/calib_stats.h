// Calibration statistics (model::CalibStats) as a safetensors file:
//   layers.{l}.{attn_in|attn_out|mlp_in|mlp_out}.xtx     F64 [dim, dim]  Σ x xᵀ
//   layers.{l}.{...}.tokens                              I64 [1]
//   layers.{l}.{...}.amax                                F32 [1]
//   layers.{l}.{q|k|v}.amax                              F32 [1]
//   layers.{l}.{q|k|v}.sqnorm                            F64 [channels]
// metadata: format = "scalesweep-calib-v1", n_layers, nsamples, seqlen, seed.
#pragma once

#include <string>

#include "scalesweep/model/calib.h"

namespace scalesweep::io {

// Written atomically (no file on failure).
void save_calib_stats(const model::CalibStats& s, const std::string& path);
// Throws IoError naming the file and the tensor on a missing tensor, wrong dtype or shape,
// non-finite or negative values.
model::CalibStats load_calib_stats(const std::string& path);

}  // namespace scalesweep::io

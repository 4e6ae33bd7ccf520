// Calibration statistics (model::CalibStats) as a safetensors file:
//   layers.{l}.{attn_in|attn_out|mlp_in|mlp_out}.xtx     F64 [dim, dim]  Σ x xᵀ
//   layers.{l}.{...}.tokens                              I64 [1]
//   layers.{l}.{...}.amax                                F32 [1]
//   layers.{l}.{q|k|v}.amax                              F32 [1]
//   layers.{l}.{q|k|v}.sqnorm                            F64 [channels]
// A mixture-of-experts layer (model/calib.h) has no mlp_out records and, per expert e,
//   layers.{l}.experts.{e}.{mlp_in|mlp_out}.{xtx|tokens|amax}   as above ([dim], [moe_hidden_dim])
//   layers.{l}.experts.{e}.routed                                I64 [1]  tokens routed to e
// metadata: format = "scalesweep-calib-v1", n_layers, nsamples, seqlen, seed (windows when not
// random: "spread"); n_experts only in
// files of MoE models (files without it, all files before MoE support, load as before).
#pragma once

#include <memory>
#include <string>

#include "scalesweep/model/calib.h"

namespace scalesweep::io {

// Written atomically (no file on failure). Every input must hold ΣxxT (has_xtx()).
void save_calib_stats(const model::CalibStats& s, const std::string& path);

// The same file, written one layer at a time (layer-by-layer calibration): every tensor is
// declared from the shapes of `c` when constructed, the header is written, write_layer(l)
// appends layer l (in order 0, 1, ..., with ΣxxT), commit() renames the temp file into place
// (nothing is left at `path` when commit() is not reached). Byte-identical to
// save_calib_stats of the same statistics (which uses it).
class CalibStatsWriter {
 public:
  CalibStatsWriter(const model::Config& c, int64_t nsamples, int64_t seqlen, model::CalibDraw draw,
                   const std::string& path);
  ~CalibStatsWriter();
  CalibStatsWriter(const CalibStatsWriter&) = delete;
  CalibStatsWriter& operator=(const CalibStatsWriter&) = delete;
  void write_layer(int l, const model::LayerStats& L);
  void commit();

 private:
  friend void save_calib_stats(const model::CalibStats& s, const std::string& path);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws IoError naming the file and the tensor on a missing tensor, wrong dtype or shape,
// non-finite or negative values. with_xtx = false: ΣxxT is not loaded (InputStats::xtx stays
// empty); only its diagonal is read into xdiag (and checked), with amax, tokens, q/k/v —
// all that simulated quantization needs. Otherwise xdiag is xtx's diagonal.
model::CalibStats load_calib_stats(const std::string& path, bool with_xtx = true);

}  // namespace scalesweep::io

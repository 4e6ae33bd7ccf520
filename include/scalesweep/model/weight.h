// Reading weights stored in any WeightDType (include/scalesweep/model/weights.h): row
// dequantization (a scalar reference and a fast version with identical results), fp32
// materialization for the code that needs fp32 (GPTQ, quantize, calibration), and the
// matrix products of the runtime that dequantize a tile of weight rows at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "scalesweep/model/config.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::model {

// out[(r1 - r0) * t.cols()] = rows [r0, r1) of t as fp32. bf16/f16 widen exactly; NVFP4
// decodes fl(fl(fp4 * E4M3 scale) / global_scale) (the arithmetic of
// io::read_nvfp4_weight); ggml blocks decode with format/ggml.h's scalar dequantizers, times
// the per-tensor scale, llama's q/k permutation undone. Throws std::out_of_range for rows
// outside the tensor and std::invalid_argument for a tensor without data.
void dequantize_rows_reference(const Tensor& t, int64_t r0, int64_t r1, float* out);
// The same values (bit for bit), vectorized: the fused AVX-512 decoders of
// src/model/quant_kernels.h for NVFP4 and the ggml types they cover, else per dtype.
void dequantize_rows(const Tensor& t, int64_t r0, int64_t r1, float* out);

// The whole tensor as an owned fp32 vector.
std::vector<float> to_f32(const Tensor& t);
// max |t| over the tensor in any storage dtype (read a row at a time, no fp32 copy).
float tensor_amax(const Tensor& t);
// `t` itself when it is fp32, else an fp32 copy whose storage is appended to `keep`.
Tensor as_f32(const Tensor& t, std::vector<std::shared_ptr<void>>& keep);
// Makes every tensor of `w` fp32 in place (copies kept in w.storage); tied lm_head stays
// an alias of tok_embeddings.
void materialize_f32(Weights& w);
// Bytes of one decoder layer of `c` widened to fp32 (norms, biases and the seven Linears).
int64_t layer_f32_bytes(const Config& c);
// Bytes of the weight payload of `t` in its storage precision.
int64_t storage_bytes(const Tensor& t);

// Decode (one input row): y[o - o0] = W[o] · x for o in [o0, o1). fp32 and bf16 read the
// weights in place; NVFP4 and the ggml types NVFP4, MXFP4, Q4_0, Q4_1, Q8_0, Q4_K and Q6_K run
// fused kernels on the stored blocks (AVX-512 CPUs); the others (f16, Q5_*, and every type on
// other CPUs) dequantize tiles of rows into a scratch buffer first. Every dtype gives the same
// bits as the fp32 kernel on the widened weights.
void gemv_rows(const Tensor& w, const float* x, int64_t o0, int64_t o1, float* y);

// Rows of weights dequantized per tile for the decode kernels and the loaders' checks (about
// 256 KiB of fp32, L2).
int64_t weight_tile_rows(int64_t cols);
// Rows of a prefill weight tile (dequantized once per matrix product, then one sgemm with every
// token): at least 256 rows, about 8 MiB of fp32, so that the sgemm has columns to block over.
int64_t prefill_tile_rows(int64_t cols);

}  // namespace scalesweep::model

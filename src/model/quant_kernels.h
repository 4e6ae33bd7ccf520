// Fused kernels of the runtime over weights kept as stored: NVFP4 (compressed-tensors packing,
// WeightDType::kNvfp4) and the ggml block types NVFP4, MXFP4, Q4_0, Q4_1, Q8_0, Q4_K and Q6_K
// (WeightDType::kGgml). Each decodes 16 consecutive weights of a row into one vector register
// with the scalar dequantizer's arithmetic (dequantize_rows_reference: the same IEEE operations
// in the same order, so the same bits), and the matrix-vector product multiplies them into the
// 16 partial sums of weight.h's fp32 gemv in its order (products and sums rounded separately,
// the pairwise tree at the end): gemv on stored weights gives the bits of gemv on their fp32
// widening, without the widening.
//
// AVX-512 (F, BW, DQ, VL) only, chosen at run time. quant_kernel_available() is false on other
// CPUs, for the other types (Q5_0, Q5_1, Q5_K, bf16/f16/f32 which have their own paths) and
// for kNvfp4 rows that are not a whole number of 16-element blocks; the callers then
// dequantize a tile of rows with the scalar dequantizers and run the fp32 kernel on it.
#pragma once

#include <cstdint>

#include "scalesweep/model/weights.h"

namespace scalesweep::model::detail {

// Whether the fused kernels below take `t` on this CPU.
bool quant_kernel_available(const Tensor& t);

// Rows [r0, r1) of t as fp32 (the bits of dequantize_rows_reference). Requires
// quant_kernel_available(t) and valid rows (the caller checks).
void quant_dequantize_rows(const Tensor& t, int64_t r0, int64_t r1, float* out);

// y[o - o0] = W[o] · x for o in [o0, o1), as gemv_rows on the fp32 widening of t.
void quant_gemv_rows(const Tensor& t, const float* x, int64_t o0, int64_t o1, float* y);

// Row r's stored row under t's ggml_permute_head_dim (r itself when it is 0).
int64_t ggml_stored_row(const Tensor& t, int64_t r);

// Bytes of one stored row of a kGgml tensor.
int64_t ggml_row_bytes(const Tensor& t);

}  // namespace scalesweep::model::detail

// bf16 matrix products of the runtime's opt-in bf16 compute mode (Compute::kBF16):
//   C[m, n] (row stride ldc) = A[m, k] · W[n, k]ᵀ
// with A and W bf16 (uint16_t bit patterns, rows contiguous) and C fp32. Every product of two
// bf16 values is exact in fp32; only the summation order and the treatment of subnormals
// differ between the two implementations below.
//
// Error bound of bf16_gemm against bf16_gemm_reference (bf16_gemm_tolerance): any order of
// summing k exact products in fp32 is within γ_k · Σ|a_i w_i| of the exact sum (γ_k =
// k·u / (1 - k·u), u = 2^-24), so the two are within 2 γ_k Σ|a_i w_i|. vdpbf16ps (AVX512-BF16)
// treats subnormal operands as zero and flushes subnormal results, which adds at most
// 2^-126 · (Σ|a_i| + Σ|w_i| + 2k).
#pragma once

#include <cstdint>

namespace scalesweep::model {

// The plain reference: c[i, j] = Σ_p fl32(a[i, p] · w[j, p]) summed in p order in fp32.
void bf16_gemm_reference(const uint16_t* a, const uint16_t* w, int m, int n, int k, float* c,
                         int64_t ldc);

// Whether bf16_gemm is built in (oneDNN found at configure time).
bool bf16_gemm_available();

// The fast product (oneDNN matmul, bf16 src/weights, f32 dst; primitives cached by shape;
// output columns split over all cores with base/parallel.h, one single-threaded oneDNN call
// per worker). Throws std::runtime_error when not available,
// std::invalid_argument for non-positive sizes or ldc < n.
void bf16_gemm(const uint16_t* a, const uint16_t* w, int m, int n, int k, float* c, int64_t ldc);

// The bound stated above for one output element, from Σ|a_i w_i|, Σ|a_i| + Σ|w_i| and k.
double bf16_gemm_tolerance(double sum_abs_products, double sum_abs_operands, int k);

// fp32 -> bf16, round to nearest even (NaN stays NaN, quiet).
uint16_t f32_to_bf16(float f);
// n values.
void f32_to_bf16(const float* x, int64_t n, uint16_t* out);
float bf16_to_f32(uint16_t b);

}  // namespace scalesweep::model

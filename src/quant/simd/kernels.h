// Fast CPU kernels for NVFP4 quantization (Highway, runtime dispatch over every SIMD target
// compiled in: AVX-512, AVX2, SSE4, SSSE3, scalar emulation). Every kernel produces exactly the
// bytes of the scalar reference (src/scale/selector.cc, src/quant/quantize.cc) on every
// target; docs/NUMERICS.md ("Fast CPU path") explains why each shortcut is exact.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/row_job.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::simd {

// --- dispatch control (tests and benchmarks) ---
// Targets compiled into the kernels and supported by this CPU, best first.
std::vector<int64_t> dispatch_targets();
const char* target_name(int64_t target);
// Restricts dispatch to one target (0 restores the best supported one). Not thread-safe with
// kernels running concurrently; meant for tests and benchmarks.
void force_target(int64_t target);
// Name of the target the next kernel call dispatches to.
const char* active_target_name();

// --- kernels ---
// y[i] = fl(x[i] * gs), x widened exactly from dtype.
void load_scaled(const void* x, DType dtype, int64_t n, float gs, float* y);
// amax[b] = max |y| over block b of `block` elements (the last block may be partial).
void block_amax(const float* y, int64_t n, int block, float* amax);
// E4M3 pattern of positive finite v[i], round-to-nearest-even (saturating at 448) or floor.
void fp8_round(const float* v, int64_t n, bool floor_mode, uint8_t* pattern);
// FP4 codes (sign << 3 | index) of y for the E4M3 scale `pattern` (0 = scale 0: sign only).
void fp4_codes(const float* y, int64_t n, int pattern, uint8_t* codes);
// Packs one byte per code into nibbles: out[j] = c[2j] | c[2j+1] << 4 (c[n] read as 0 if n
// is odd); out has (n + 1) / 2 bytes.
void pack_nibbles(const uint8_t* c, int64_t n, uint8_t* out);
// Contract losses (docs/NUMERICS.md) of the block y[0..n) (w = nullptr: unweighted) for the
// consecutive E4M3 patterns lo .. lo + count - 1 (1 <= lo, lo + count - 1 <= 126), with the
// same candidate kernel the sweeps use.
void candidate_losses(const float* y, const float* w, int n, int lo, int count, float* loss);
// Rows [r0, r1) of a job, bit-identical to detail::quantize_rows_reference. Returns false
// (writing nothing) for jobs it does not handle: MXFP4 (UE8M0 scales).
bool quantize_rows(const detail::RowJob& job, int64_t r0, int64_t r1);
// As quantize_rows, and also checks every y = fl(x * gs) of the rows: |y| <= 2^48 (so the
// input is finite and the global scale passes quantize()'s amax * gs <= 2^48 check). On the
// first violation it sets *bad and stops (rows left incomplete). For a given global scale,
// where quantize() then needs no separate input scan.
bool quantize_rows_checked(const detail::RowJob& job, int64_t r0, int64_t r1, bool* bad);
// amax of |x| over n elements with `threads` threads; false if any element is NaN or Inf.
bool scan_finite_amax(const void* x, DType dtype, int64_t n, int threads, float* amax);
// Benchmark baseline: reads every input element and writes packed-output-sized bytes
// (one nibble per element, one byte per block), with no quantization arithmetic.
void copy_baseline(const void* x, DType dtype, int64_t rows, int64_t cols, int block,
                   uint8_t* codes, uint8_t* scales, int64_t r0, int64_t r1);

}  // namespace scalesweep::simd

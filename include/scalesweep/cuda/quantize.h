// CUDA NVFP4 quantization operator (activations X[M, K], bf16 / fp16 / fp32 in) with the
// absmax, 4over6, sweep-mse, sweep-wmse, exhaustive-mse and exhaustive-wmse block-scale
// selectors. With Numerics::kExact (the default) results are the bytes of the CPU reference
// (scalesweep::quantize with the same global scale, docs/NUMERICS.md): same scale bits and
// codes on every block, same loss. Numerics::kFast (sweeps only) may choose another scale on
// near-ties (docs/CUDA.md "Fast numerics").
//
// This header needs no CUDA headers: streams are passed as `CudaStream` (= cudaStream_t).
// validate() and the output sizes are plain host code, usable and tested without a GPU; the
// launch functions live in the ss_cuda library (built only where nvcc exists).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalesweep/cuda/layout.h"
#include "scalesweep/quant/quantize.h"

struct CUstream_st;

namespace scalesweep::cuda {

using CudaStream = CUstream_st*;  // cudaStream_t; nullptr = the legacy default stream

// Output element type of the fused quantize-dequantize (simulation) output.
using scalesweep::DType;

// How the sweep selectors evaluate their candidate losses.
//   kExact: the contract loss (docs/NUMERICS.md), in-order float sum: the CPU reference's bytes
//           for every method (the default).
//   kFast:  sweep-mse / sweep-wmse only (refused for the other methods): the same candidate
//           windows, each candidate's loss estimated with a reciprocal, a magic-add rounding to
//           the E2M1 grid and FMAs (src/kernels/cuda/fast_quant.h), so the chosen scale may
//           differ from the exact kernel's on near-ties; its contract loss is within a relative
//           1e-6 of the exhaustive optimum's (tested on >= 10^8 blocks on the GPU). Codes are
//           the exact codes of the chosen scale and block_loss its exact contract loss.
//   kHalf2: sweep-mse / sweep-wmse only: as kFast, but each candidate's loss estimated in packed
//           fp16x2 arithmetic, two elements per instruction (src/kernels/cuda/half2_quant.h), on
//           the block scaled by a power of two; a coarser estimate (fp16 rounding of |y|, of the
//           squares and of the sums), so near-ties within about 1e-2 can go either way
//           (docs/CUDA.md "half2 numerics" gives the measured excess). Codes and block_loss as
//           kFast: exact for the chosen scale.
enum class Numerics { kExact, kFast, kHalf2 };
inline constexpr auto kNumericsNames = make_names<Numerics>(
    "numerics",
    {{Numerics::kExact, "exact"}, {Numerics::kFast, "fast"}, {Numerics::kHalf2, "half2"}});

// One launch. All pointers are DEVICE pointers. Every output is optional (nullptr = not
// written) but at least one of codes / scales / scales_swizzled / dequant must be given.
struct QuantizeArgs {
  const void* x = nullptr;  // [rows, cols], row-major, element type `dtype`
  DType dtype = DType::kBF16;
  int64_t rows = 0, cols = 0;  // cols % 16 != 0: the last block of a row is partial (SPEC)
  // kAbsMax, kFourOverSix, kSweepMse, kSweepWmse, kExhaustiveMse, kExhaustiveWmse
  Method method = Method::kSweepMse;
  Numerics numerics = Numerics::kExact;  // kFast, kHalf2: sweep-mse / sweep-wmse only
  // Encode-direction global scale gs (y = fl(x * gs)); finite and > 0.
  float global_scale = 1.0f;
  // Importance [cols] (finite, >= 0) for kSweepWmse / kExhaustiveWmse; nullptr = unweighted,
  // as the CPU path.
  // Ignored by the unweighted methods.
  const float* importance = nullptr;

  uint8_t* codes = nullptr;            // [rows, packed_cols(cols)]
  uint8_t* scales = nullptr;           // [rows, blocks_per_row(cols)] row-major
  uint8_t* scales_swizzled = nullptr;  // swizzled_bytes(rows, cols), padding set to 0
  float* block_loss = nullptr;         // [rows, blocks_per_row(cols)] contract loss (y domain)
  void* dequant = nullptr;             // [rows, cols] x_hat = fl(q * s / gs), type dequant_dtype
  DType dequant_dtype = DType::kF32;   // bf16/fp16: x_hat rounded to nearest even
  // Optional device int64: set to the smallest flat index of an input element that is
  // non-finite or whose |x * gs| exceeds 2^48 (the CPU path's limit), or left at kNoBadIndex
  // (the launch initializes it). Outputs are unspecified when one exists.
  int64_t* first_nonfinite = nullptr;
};
inline constexpr int64_t kNoBadIndex = 0x7F7F7F7F7F7F7F7FLL;

// The input half of a launch: x, its type and shape, the method, its numerics, the global scale
// and the importance. The caller points the outputs it wants at its buffers.
inline QuantizeArgs input_args(const void* x, DType dtype, int64_t rows, int64_t cols,
                               Method method, float global_scale, const float* importance = nullptr,
                               Numerics numerics = Numerics::kExact) {
  QuantizeArgs a;
  a.x = x;
  a.dtype = dtype;
  a.rows = rows;
  a.cols = cols;
  a.method = method;
  a.numerics = numerics;
  a.global_scale = global_scale;
  a.importance = importance;
  return a;
}

// Argument checks (shapes, null pointers, dtype/method, global scale, size overflow). Throws
// std::invalid_argument with a message naming the problem. Host code, no GPU needed.
void validate(const QuantizeArgs& a);
// True for the methods the CUDA operator implements.
bool method_supported(Method m);
// True where method m has the numerics n (kExact: every supported method; kFast, kHalf2: the
// sweeps).
bool numerics_supported(Method m, Numerics n);

// Enqueues the operator on `stream` (asynchronous; validates first; throws std::runtime_error
// on a CUDA error, naming the call).
void quantize(const QuantizeArgs& a, CudaStream stream = nullptr);

// Convenience: host vectors in, host vectors out (allocates, copies, runs, synchronizes).
// Non-finite input is an error naming the element ("element [3, 17] is NaN").
struct HostQuantized {
  QuantizedTensor q;                     // codes + row-major scales + global scale
  std::vector<uint8_t> scales_swizzled;  // swizzled_bytes(rows, cols)
  std::vector<float> block_loss;         // [rows, blocks_per_row(cols)]
};
// x: host array [rows, cols] of `dtype`; importance: host [cols] or nullptr.
HostQuantized quantize_host(const void* x, DType dtype, int64_t rows, int64_t cols, Method method,
                            float global_scale, const float* importance = nullptr,
                            Numerics numerics = Numerics::kExact);
// Fused quantize-dequantize on the device; returns x_hat as float [rows, cols].
std::vector<float> fake_quantize_host(const void* x, DType dtype, int64_t rows, int64_t cols,
                                      Method method, float global_scale,
                                      const float* importance = nullptr,
                                      Numerics numerics = Numerics::kExact);

// Device information; throws std::runtime_error("no CUDA device: ...") when there is none.
std::string device_name();
// Number of CUDA devices, 0 when the runtime reports none or fails (never throws).
int device_count();

// ---- Benchmark (scalesweep bench-gpu).
struct BenchConfig {
  int64_t cols = 8192;
  std::vector<int64_t> rows;  // default 128 .. 32768 (powers of two)
  std::vector<Method> methods;
  // Each method is timed once per entry where numerics_supported (empty: exact only).
  std::vector<Numerics> numerics;
  DType dtype = DType::kBF16;
  int warmup = 10, runs = 100;
};
struct BenchRow {
  int64_t rows = 0, cols = 0;
  Method method = Method::kAbsMax;
  Numerics numerics = Numerics::kExact;
  double median_ms = 0, min_ms = 0;
  double bytes = 0;      // read + written by the operator
  double gbps = 0;       // bytes / median time
  double copy_ms = 0;    // device-to-device copy of the input bytes, same run
  double copy_gbps = 0;  // 2 * input bytes / copy time (read + write)
};
// Runs on device 0; progress(i, total) is called after each measured configuration.
std::vector<BenchRow> bench(const BenchConfig& cfg,
                            void (*progress)(int64_t done, int64_t total, void* ctx) = nullptr,
                            void* ctx = nullptr);

}  // namespace scalesweep::cuda

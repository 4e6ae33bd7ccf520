// fp32 matrix products of the runtime's Linear layers (Compute::kF32, the reference mode):
//   C[m, n] (row stride ldc) = A[m, k] · W[n, k]ᵀ
// with oneDNN's sgemm where the build has oneDNN (its JIT kernels use the CPU's widest vector
// unit on every x86 CPU, where OpenBLAS 0.3.21 falls back to its SSE3 "Prescott" kernels on
// CPUs it does not know: 4x slower on the Xeons of this project's machines), else OpenBLAS.
// Output columns are split over the calling thread's gemm threads (set_gemm_threads; all
// cores by default), one single-threaded call per worker: every element is computed by one
// call over the whole k, whatever the split.
#pragma once

#include <cstdint>

namespace scalesweep::model {

// The plain reference: c[i, j] = Σ_p a[i, p] · w[j, p] in double, rounded to fp32.
void f32_gemm_reference(const float* a, const float* w, int m, int n, int k, float* c, int64_t ldc);

// The fast product. Throws std::invalid_argument for non-positive sizes or ldc < n.
void f32_gemm(const float* a, const float* w, int m, int n, int k, float* c, int64_t ldc);

// The attention products: C[m, n] (row stride ldc) = alpha · A[m, k] (row stride lda) ·
// B[k, n] (row stride ldb), on the calling thread only (oneDNN where the build has it, else
// OpenBLAS with one thread). Throws std::invalid_argument for non-positive sizes or strides
// shorter than a row.
void f32_gemm_nn(int m, int n, int k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc);

// Its plain reference (sums in double, rounded to fp32).
void f32_gemm_nn_reference(int m, int n, int k, float alpha, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float* c, int64_t ldc);

// Threads f32_gemm splits its columns over when called from this thread (0: all cores, the
// default; 1 inside worker threads that already occupy every core). Returns the previous value.
int set_gemm_threads(int threads);

// OpenBLAS on one thread for this object's lifetime (its thread count is one process-wide
// value): set before worker threads start their own products, restored on exit.
class OneBlasThread {
 public:
  OneBlasThread();
  ~OneBlasThread();
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int saved_;
};

// Which implementation f32_gemm runs ("oneDNN" or "OpenBLAS").
const char* f32_gemm_backend();

}  // namespace scalesweep::model

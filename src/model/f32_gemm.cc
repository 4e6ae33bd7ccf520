// fp32 products of the runtime (model/f32_gemm.h).
#include "model/f32_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "scalesweep/base/parallel.h"

#ifdef SS_HAVE_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

namespace scalesweep::model {
namespace {

thread_local int tls_gemm_threads = 0;

// One call on one thread: C[m, n] = A W[n, k]ᵀ.
void gemm_one_thread(const float* a, const float* w, int m, int n, int k, float* c, int64_t ldc) {
#ifdef SS_HAVE_DNNL
  // Debian's oneDNN threads with OpenMP; each call runs single-threaded on its worker (the
  // OpenMP ICV is per thread), as bf16_gemm does.
  omp_set_num_threads(1);
  const dnnl_status_t st = dnnl_sgemm('N', 'T', m, n, k, 1.0f, a, k, w, k, 0.0f, c, ldc);
  if (st != dnnl_success)
    throw std::runtime_error("f32_gemm: oneDNN sgemm failed (status " + std::to_string(st) + ")");
#else
  const OneBlasThread one;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, w, k, 0.0f, c,
              static_cast<int>(ldc));
#endif
}

void check_nn(int m, int n, int k, int64_t lda, int64_t ldb, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0 || lda < k || ldb < n || ldc < n)
    throw std::invalid_argument("f32_gemm_nn: bad sizes m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) +
                                " ldc=" + std::to_string(ldc));
}

}  // namespace

void f32_gemm_nn(int m, int n, int k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc) {
  check_nn(m, n, k, lda, ldb, ldc);
#ifdef SS_HAVE_DNNL
  omp_set_num_threads(1);
  const dnnl_status_t st = dnnl_sgemm('N', 'N', m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc);
  if (st != dnnl_success)
    throw std::runtime_error("f32_gemm_nn: oneDNN sgemm failed (status " + std::to_string(st) +
                             ")");
#else
  const OneBlasThread one;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, static_cast<int>(lda),
              b, static_cast<int>(ldb), 0.0f, c, static_cast<int>(ldc));
#endif
}

void f32_gemm_nn_reference(int m, int n, int k, float alpha, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float* c, int64_t ldc) {
  check_nn(m, n, k, lda, ldb, ldc);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += static_cast<double>(a[i * lda + p]) * b[p * ldb + j];
      c[i * ldc + j] = static_cast<float>(alpha * s);
    }
}

void f32_gemm_reference(const float* a, const float* w, int m, int n, int k, float* c,
                        int64_t ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p)
        s += static_cast<double>(a[static_cast<int64_t>(i) * k + p]) *
             w[static_cast<int64_t>(j) * k + p];
      c[i * ldc + j] = static_cast<float>(s);
    }
}

void f32_gemm(const float* a, const float* w, int m, int n, int k, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0 || ldc < n)
    throw std::invalid_argument("f32_gemm: bad sizes m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " ldc=" + std::to_string(ldc));
  // Small products stay on the calling thread.
  const int threads = static_cast<int64_t>(m) * n * k >= (int64_t{1} << 21) ? tls_gemm_threads : 1;
  // Column chunks of whole 64-column panels (the kernels' widest blocking), so that a chunk
  // boundary never splits a panel.
  const int panels = (n + 63) / 64;
  parallel_for(panels, threads, [&](int64_t p0, int64_t p1, int) {
    const int j0 = static_cast<int>(p0 * 64), j1 = std::min(n, static_cast<int>(p1 * 64));
    gemm_one_thread(a, w + static_cast<int64_t>(j0) * k, m, j1 - j0, k, c + j0, ldc);
  });
}

OneBlasThread::OneBlasThread() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
OneBlasThread::~OneBlasThread() { openblas_set_num_threads(saved_); }

int set_gemm_threads(int threads) {
  if (threads < 0) throw std::invalid_argument("gemm threads must be >= 0");
  const int prev = tls_gemm_threads;
  tls_gemm_threads = threads;
  return prev;
}

const char* f32_gemm_backend() {
#ifdef SS_HAVE_DNNL
  return "oneDNN";
#else
  return "OpenBLAS";
#endif
}

}  // namespace scalesweep::model

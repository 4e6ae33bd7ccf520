#include "model/bf16_gemm.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "scalesweep/base/parallel.h"

#ifdef SS_HAVE_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace scalesweep::model {

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void f32_to_bf16(const float* x, int64_t n, uint16_t* out) {
  // f32_to_bf16(float) without a branch, so that the loop vectorizes (same bits).
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void bf16_gemm_reference(const uint16_t* a, const uint16_t* w, int m, int n, int k, float* c,
                         int64_t ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const uint16_t* ai = a + static_cast<int64_t>(i) * k;
      const uint16_t* wj = w + static_cast<int64_t>(j) * k;
      float s = 0.0f;
      for (int p = 0; p < k; ++p) s += bf16_to_f32(ai[p]) * bf16_to_f32(wj[p]);
      c[i * ldc + j] = s;
    }
}

double bf16_gemm_tolerance(double sum_abs_products, double sum_abs_operands, int k) {
  const double ku = k * 0x1p-24;
  return 2 * ku / (1 - ku) * sum_abs_products + 0x1p-126 * (sum_abs_operands + 2.0 * k);
}

#ifdef SS_HAVE_DNNL
namespace {
struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<std::tuple<int, int, int, int64_t>, std::shared_ptr<dnnl::matmul>> cache;
};
Dnnl& dnnl_state() {
  static Dnnl d;
  return d;
}

// One oneDNN call on one thread: C[m, n] = A W[n, k]ᵀ.
void gemm_one_thread(const uint16_t* a, const uint16_t* w, int m, int n, int k, float* c,
                     int64_t ldc) {
  // Debian's oneDNN threads with OpenMP; a team of OpenMP threads beside our workers (and
  // OpenBLAS's) oversubscribes the cores and its barriers then cost more than the product.
  // Each call runs single-threaded on its worker (the OpenMP ICV is per thread).
  omp_set_num_threads(1);
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc ad(dims{m, k}, dt::bf16, dims{k, 1});
  const dnnl::memory::desc wd(dims{k, n}, dt::bf16, dims{1, k});  // W[n, k] read as [k, n]
  const dnnl::memory::desc cd(dims{m, n}, dt::f32, dims{ldc, 1});
  Dnnl& d = dnnl_state();
  std::shared_ptr<dnnl::matmul> mm;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto& slot = d.cache[{m, n, k, ldc}];
    if (!slot)
      slot = std::make_shared<dnnl::matmul>(
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, wd, cd), d.eng));
    mm = slot;
  }
  dnnl::stream s(d.eng);
  dnnl::memory am(ad, d.eng, const_cast<uint16_t*>(a));
  dnnl::memory wm(wd, d.eng, const_cast<uint16_t*>(w));
  dnnl::memory cm(cd, d.eng, c);
  mm->execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
  s.wait();
}
}  // namespace

bool bf16_gemm_available() { return true; }

void bf16_gemm(const uint16_t* a, const uint16_t* w, int m, int n, int k, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0 || ldc < n)
    throw std::invalid_argument("bf16_gemm: bad sizes m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " ldc=" + std::to_string(ldc));
  // Output columns split over all cores (each element is computed by one call: the split
  // changes no bits); small products stay on the calling thread.
  const int threads = static_cast<int64_t>(m) * n * k >= (int64_t{1} << 21) ? 0 : 1;
  parallel_for(n, threads, [&](int64_t j0, int64_t j1, int) {
    gemm_one_thread(a, w + j0 * k, m, static_cast<int>(j1 - j0), k, c + j0, ldc);
  });
}
#else
bool bf16_gemm_available() { return false; }

void bf16_gemm(const uint16_t*, const uint16_t*, int, int, int, float*, int64_t) {
  throw std::runtime_error(
      "bf16 compute needs oneDNN, which this build lacks (install libdnnl-dev, e.g. "
      "scripts/setup.sh, and configure again)");
}
#endif

}  // namespace scalesweep::model

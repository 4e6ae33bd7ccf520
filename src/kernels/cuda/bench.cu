// Operator benchmark (scalesweep bench-gpu): latency of each method on X[M, K] against a
// device-to-device copy of the same input bytes measured in the same run. CUDA events around
// each launch, L2 flushed before every timed launch (a 256 MiB memset, not timed), warm-up
// launches, median of the timed runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/internal.h"

namespace scalesweep::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Deterministic test activations: roughly Gaussian (sum of 4 uniforms) with a few large
// channels, as in LLM activations; importance log-uniform.
__global__ void fill_input(void* x, int dtype, int64_t n, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint64_t h = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 31;
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 29;
      s += static_cast<float>(h >> 40) * (1.0f / 16777216.0f) - 0.5f;
    }
    if ((i % cols) % 97 == 3) s *= 20.0f;  // outlier channels
    if (dtype == 0)
      static_cast<float*>(x)[i] = s;
    else if (dtype == 1)
      static_cast<uint16_t*>(x)[i] = format::f32_to_bf16(s);
    else
      static_cast<uint16_t*>(x)[i] = format::f32_to_f16(s);
  }
}

__global__ void fill_importance(float* w, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint64_t h = (static_cast<uint64_t>(i) + 1) * 0xD6E8FEB86659FD93ull;
  w[i] = exp2f(static_cast<float>(h >> 40) * (1.0f / 16777216.0f) * 16.0f - 8.0f);
}

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) { check(cudaMalloc(&p, n ? n : 1), "cudaMalloc"); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

struct Events {
  cudaEvent_t a{}, b{};
  Events() {
    check(cudaEventCreate(&a), "cudaEventCreate");
    check(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

// Median and min (ms) of `runs` timed calls of fn after `warmup` untimed ones.
template <class Fn>
std::pair<double, double> time_ms(Fn&& fn, void* flush, size_t flush_bytes, int warmup, int runs,
                                  cudaStream_t st) {
  Events ev;
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  t.reserve(static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) {
    check(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, st), "cudaMemsetAsync(flush)");
    check(cudaEventRecord(ev.a, st), "cudaEventRecord");
    fn();
    check(cudaEventRecord(ev.b, st), "cudaEventRecord");
    check(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

}  // namespace

std::vector<BenchRow> bench(const BenchConfig& cfg_in, void (*progress)(int64_t, int64_t, void*),
                            void* ctx) {
  BenchConfig cfg = cfg_in;
  if (cfg.rows.empty())
    for (int64_t m = 128; m <= 32768; m *= 2) cfg.rows.push_back(m);
  if (cfg.methods.empty())
    cfg.methods = {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse, Method::kSweepWmse,
                   Method::kExhaustiveMse};
  if (cfg.cols <= 0 || cfg.cols % 16 != 0)
    throw std::invalid_argument("bench-gpu: --k must be a positive multiple of 16 (got " +
                                std::to_string(cfg.cols) + ")");
  if (cfg.warmup < 0 || cfg.runs < 1)
    throw std::invalid_argument("bench-gpu: need warmup >= 0 and runs >= 1");
  for (int64_t m : cfg.rows)
    if (m <= 0) throw std::invalid_argument("bench-gpu: M must be > 0");
  for (Method m : cfg.methods)
    if (!method_supported(m))
      throw std::invalid_argument("bench-gpu: method '" + std::string(kMethodNames.name(m)) +
                                  "' is not implemented on CUDA");
  if (cfg.numerics.empty()) cfg.numerics = {Numerics::kExact};
  (void)device_name();  // throws "no CUDA device" with the reason

  const int64_t K = cfg.cols;
  const int64_t max_m = *std::max_element(cfg.rows.begin(), cfg.rows.end());
  const size_t esize = cfg.dtype == DType::kF32 ? 4 : 2;
  Buf x(static_cast<size_t>(max_m * K) * esize);
  Buf copy_dst(static_cast<size_t>(max_m * K) * esize);
  Buf codes(static_cast<size_t>(max_m * packed_cols(K)));
  Buf swz(static_cast<size_t>(swizzled_bytes(max_m, K)));
  Buf imp(static_cast<size_t>(K) * 4);
  const size_t flush_bytes = size_t{256} << 20;
  Buf flush(flush_bytes);
  cudaStream_t st = nullptr;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{st};
  fill_input<<<1024, 256, 0, st>>>(x.p, static_cast<int>(cfg.dtype), max_m * K, K);
  check(cudaGetLastError(), "fill_input");
  fill_importance<<<static_cast<unsigned>((K + 255) / 256), 256, 0, st>>>(
      static_cast<float*>(imp.p), K);
  check(cudaGetLastError(), "fill_importance");
  check(cudaStreamSynchronize(st), "fill");

  // (method, numerics) pairs in method order; numerics a method lacks are left out.
  std::vector<std::pair<Method, Numerics>> runs;
  for (Method m : cfg.methods)
    for (Numerics nu : cfg.numerics)
      if (numerics_supported(m, nu)) runs.emplace_back(m, nu);
  std::vector<BenchRow> out;
  const int64_t total = static_cast<int64_t>(cfg.rows.size() * runs.size());
  int64_t done = 0;
  for (int64_t M : cfg.rows) {
    const size_t in_bytes = static_cast<size_t>(M * K) * esize;
    const auto copy = time_ms(
        [&] {
          check(cudaMemcpyAsync(copy_dst.p, x.p, in_bytes, cudaMemcpyDeviceToDevice, st),
                "cudaMemcpyAsync");
        },
        flush.p, flush_bytes, cfg.warmup, cfg.runs, st);
    for (const auto& [method, numerics] : runs) {
      QuantizeArgs a = input_args(
          x.p, cfg.dtype, M, K, method,
          method == Method::kAbsMax ? 6.0f * 448.0f / 40.0f : 6.0f * 256.0f / 40.0f,
          method_is_weighted(method) ? static_cast<const float*>(imp.p) : nullptr, numerics);
      a.codes = static_cast<uint8_t*>(codes.p);
      a.scales_swizzled = static_cast<uint8_t*>(swz.p);
      const auto t =
          time_ms([&] { quantize(a, st); }, flush.p, flush_bytes, cfg.warmup, cfg.runs, st);
      BenchRow r;
      r.rows = M;
      r.cols = K;
      r.method = method;
      r.numerics = numerics;
      r.median_ms = t.first;
      r.min_ms = t.second;
      r.bytes = static_cast<double>(in_bytes) + static_cast<double>(M * packed_cols(K)) +
                static_cast<double>(swizzled_bytes(M, K)) +
                (method_is_weighted(method) ? static_cast<double>(K) * 4 : 0.0);
      r.gbps = r.bytes / (r.median_ms * 1e-3) / 1e9;
      r.copy_ms = copy.first;
      r.copy_gbps = 2.0 * static_cast<double>(in_bytes) / (copy.first * 1e-3) / 1e9;
      out.push_back(r);
      if (progress) progress(++done, total, ctx);
    }
  }
  return out;
}

}  // namespace scalesweep::cuda

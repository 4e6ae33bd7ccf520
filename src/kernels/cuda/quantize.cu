// CUDA NVFP4 quantization kernels and the host API that launches them
// (include/scalesweep/cuda/quantize.h). The per-block arithmetic is block_quant.h, shared with
// the CPU emulation; see docs/NUMERICS.md for the contract.
//
// Design (memory bound): one thread per 16-element block, consecutive threads on consecutive
// blocks of a row, so a warp reads 32 consecutive blocks (1 KB of bf16) with 128-bit loads
// (streaming, evict-first: read once), writes its 32 x 8 code bytes as one coalesced 256-byte
// run of 64-bit stores and its 32 row-major scale bytes as one 32-byte run. The sweep's
// candidate losses are evaluated in registers (16 values of |y|, the 7 exact thresholds of the
// candidate, one float accumulator).
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <memory>
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

}  // namespace

namespace kern {
namespace {

constexpr int kThreads = 256;
// Resident CTAs per SM asked of the register allocator (__launch_bounds__): left to itself it
// gives every vectorized kernel 100-118 registers, i.e. 2 CTAs of 256 threads per SM, too few
// warps to hide the loads of the memory-bound absmax; 4 CTAs (64 registers) compile without
// spills on sm_90 (ptxas -v) and took absmax from 79 to 80 % of copy bandwidth on an H100
// (M = 32768, K = 8192). 4over6 ran 6 % slower that way, and the issue-bound sweeps keep the
// compiler's choice too (at 80 registers sweep-wmse spills).
// half2 sweep-mse: 3 CTAs (80 registers, no spills; ncu on an H200 found it short of eligible
// warps at the compiler's 104 registers and 2 CTAs, issue slots 72 % busy): 0.903 -> 0.822 ms at
// M = 32768, K = 8192. half2 sweep-wmse ran slower that way (1.333 -> 1.408 ms) and keeps the
// compiler's choice.
template <Method M, Numerics kNu>
inline constexpr int kMinCtas = M == Method::kAbsMax
                                    ? 4
                                    : ((M == Method::kSweepMse && kNu == Numerics::kHalf2) ? 3 : 1);
std::atomic<int64_t> g_grid_cap{0};  // detail::set_grid_cap_for_testing

// 16 elements of block b (flat block index; cols % 16 == 0, 16-byte aligned input).
template <DType T>
__device__ __forceinline__ void load16(const void* x, int64_t b, float gs, float (&y)[kBlock]) {
  if constexpr (T == DType::kF32) {
    const float4* p = static_cast<const float4*>(x) + b * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = __ldcs(p + j);
      y[4 * j + 0] = fmul(v.x, gs);
      y[4 * j + 1] = fmul(v.y, gs);
      y[4 * j + 2] = fmul(v.z, gs);
      y[4 * j + 3] = fmul(v.w, gs);
    }
  } else {
    const uint4* p = static_cast<const uint4*>(x) + b * 2;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4 v = __ldcs(p + j);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint16_t lo = static_cast<uint16_t>(w[q] & 0xFFFFu);
        const uint16_t hi = static_cast<uint16_t>(w[q] >> 16);
        if constexpr (T == DType::kBF16) {
          y[8 * j + 2 * q] = fmul(format::bf16_to_f32(lo), gs);
          y[8 * j + 2 * q + 1] = fmul(format::bf16_to_f32(hi), gs);
        } else {
          y[8 * j + 2 * q] = fmul(format::f16_to_f32(lo), gs);
          y[8 * j + 2 * q + 1] = fmul(format::f16_to_f32(hi), gs);
        }
      }
    }
  }
}

// The sweep-mse window tables in shared memory (divergent per-lane lookups; kernel parameters
// live in constant memory, which serializes them). Every thread of the CTA must call this.
struct SharedWindows {
  const int8_t* full;
  const int8_t* part;
};
template <Method M>
__device__ __forceinline__ SharedWindows stage_windows(const Params& P, int8_t* smem) {
  if constexpr (M != Method::kSweepMse) {
    return {nullptr, nullptr};
  } else {
    const int8_t* f = &P.win_full[0][0];
    const int8_t* q = &P.win_part[0][0];
    for (int i = threadIdx.x; i < 2 * kPatterns; i += blockDim.x) {
      smem[i] = f[i];
      smem[2 * kPatterns + i] = q[i];
    }
    __syncthreads();
    return {smem, smem + 2 * kPatterns};
  }
}

// The fast and half2 sweeps' scale / reciprocal table (block_quant.h fill_fast_table) in shared
// memory, nullptr for the exact kernels. Every thread of the CTA must call this.
template <Numerics kNu>
__device__ __forceinline__ const float* stage_fast_table(float* smem) {
  if constexpr (kNu == Numerics::kExact) {
    return nullptr;
  } else {
    for (int i = threadIdx.x; i < kPatterns; i += blockDim.x) fill_fast_table(smem, i);
    __syncthreads();
    return smem;
  }
}

// Vectorized path: cols % 16 == 0, input 16-byte aligned, codes 8-byte aligned.
template <DType T, Method M, Numerics kNu, bool kDeq>
__global__ void __launch_bounds__(kThreads, kMinCtas<M, kNu>)
    quantize_vec(Params P, int64_t nblocks) {
#if SS_CUDA_SASS_PROBE
  // scripts/sass_count.py only: the bench-gpu configuration (codes and swizzled scales;
  // importance for sweep-wmse) as compile-time facts, so that the static SASS of the
  // grid-stride loop is the executed path. Never defined in a build.
  P.scales = nullptr;
  P.loss = nullptr;
  P.deq = nullptr;
  P.first_bad = nullptr;
  if constexpr (kWeightedMethod<M>) __builtin_assume(P.imp != nullptr);
#endif
  __shared__ int8_t smem[4 * kPatterns];
  __shared__ float smem_fast[kNu != Numerics::kExact ? 2 * kPatterns : 1];
  const SharedWindows win = stage_windows<M>(P, smem);
  const float* fast_tab = stage_fast_table<kNu>(smem_fast);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Row m and block kb of b, stepped along with b (row_block: no integer division):
  // b + stride = (m + sm) * nb + (kb + sk), with kb + sk < 2 nb.
  const RowBlock first = row_block(b, P.nb, P.inv_nb), step = row_block(stride, P.nb, P.inv_nb);
  int64_t m = first.m, kb = first.kb;
  const int64_t sm = step.m, sk = step.kb;
  for (; b < nblocks; b += stride) {
    float y[kBlock], w[kBlock];
    load16<T>(P.x, b, P.gs, y);
    if (P.first_bad) {  // atomicMin keeps the smallest flat index
#pragma unroll
      for (int i = 0; i < kBlock; ++i)
        if (!in_range(y[i])) report_bad(P.first_bad, b * kBlock + i);
    }
    if (kWeightedMethod<M> && P.imp) {
      const float4* ip = reinterpret_cast<const float4*>(P.imp + kb * kBlock);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = __ldg(ip + j);
        w[4 * j] = v.x;
        w[4 * j + 1] = v.y;
        w[4 * j + 2] = v.z;
        w[4 * j + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlock; ++i) w[i] = 0.0f;
    }
    uint64_t packed = 0;
    finish_block<M, kNu, kDeq>(P, m, kb, kBlock, y, w, win.full, &packed, fast_tab);
    if (P.codes) __stcs(reinterpret_cast<unsigned long long*>(P.codes) + b, packed);
    kb += sk;
    m += sm;
    if (kb >= P.nb) {
      kb -= P.nb;
      ++m;
    }
  }
}

// Generic path: any cols (partial last block), any alignment.
template <DType T, Method M, Numerics kNu>
__global__ void __launch_bounds__(kThreads) quantize_generic(Params P, int64_t nblocks) {
  __shared__ int8_t smem[4 * kPatterns];
  __shared__ float smem_fast[kNu != Numerics::kExact ? 2 * kPatterns : 1];
  const SharedWindows win = stage_windows<M>(P, smem);
  const float* fast_tab = stage_fast_table<kNu>(smem_fast);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nblocks;
       b += stride) {
    const RowBlock rb = row_block(b, P.nb, P.inv_nb);
    process_block<T, M, kNu>(P, rb.m, rb.kb, win.full, win.part, fast_tab);
  }
}

template <DType T, Method M, Numerics kNu = Numerics::kExact>
void launch_tm(const Params& P, bool vec, cudaStream_t st) {
  const int64_t nblocks = P.rows * P.nb;
  // SM count of the current device (queried once per process; thread-safe initialization).
  static const int sm_count = [] {
    int dev = 0, n = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
          "cudaDeviceGetAttribute");
    return n;
  }();
  // Enough resident blocks to fill the machine; a grid-stride loop covers the rest.
  const int64_t want = (nblocks + kThreads - 1) / kThreads;
  int64_t cap = static_cast<int64_t>(sm_count) * 64;
  const int64_t test_cap = g_grid_cap.load(std::memory_order_relaxed);
  if (test_cap > 0 && test_cap < cap) cap = test_cap;
  const unsigned grid = static_cast<unsigned>(want < cap ? want : cap);
  if (vec)
    if (P.deq)
      quantize_vec<T, M, kNu, true><<<grid, kThreads, 0, st>>>(P, nblocks);
    else
      quantize_vec<T, M, kNu, false><<<grid, kThreads, 0, st>>>(P, nblocks);
  else
    quantize_generic<T, M, kNu><<<grid, kThreads, 0, st>>>(P, nblocks);
  check(cudaGetLastError(), "kernel launch");
}

// nu: kFast / kHalf2 (validate() admits them for the sweeps only).
template <DType T, Method M>
void launch_nu(const Params& P, Numerics nu, bool vec, cudaStream_t st) {
  switch (nu) {
    case Numerics::kFast:
      return launch_tm<T, M, Numerics::kFast>(P, vec, st);
    case Numerics::kHalf2:
      return launch_tm<T, M, Numerics::kHalf2>(P, vec, st);
    default:
      return launch_tm<T, M>(P, vec, st);
  }
}
template <DType T>
void launch_t(const Params& P, Method m, Numerics nu, bool vec, cudaStream_t st) {
  switch (m) {
    case Method::kAbsMax:
      return launch_tm<T, Method::kAbsMax>(P, vec, st);
    case Method::kFourOverSix:
      return launch_tm<T, Method::kFourOverSix>(P, vec, st);
    case Method::kSweepMse:
      return launch_nu<T, Method::kSweepMse>(P, nu, vec, st);
    case Method::kSweepWmse:
      return launch_nu<T, Method::kSweepWmse>(P, nu, vec, st);
    case Method::kExhaustiveMse:
      return launch_tm<T, Method::kExhaustiveMse>(P, vec, st);
    case Method::kExhaustiveWmse:
      return launch_tm<T, Method::kExhaustiveWmse>(P, vec, st);
    default:
      break;  // refused by kmethod() before any launch
  }
}

// ---- native-conversion self check
__global__ void conversion_check(int64_t n, unsigned long long* mismatches) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    // x: every float bit pattern class over 2^-24 .. 2^12 (low bits from a hash).
    uint64_t h = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    const uint32_t e = 103u + static_cast<uint32_t>(h % 37u);  // 2^-24 .. 2^12
    const float x = from_bits((e << 23) | static_cast<uint32_t>((h >> 8) & 0x7FFFFFu));
    unsigned long long bad = 0;
    // E4M3 RNE: native (where compiled) vs the generic codec.
    if (e4m3_rne(x) != format::E4M3::encode_rne(x)) ++bad;
    // E2M1 of y / s for an FP8 scale s: IEEE quotient + RNE (native cvt where compiled) vs the
    // exact thresholds; checked through block_codes on a one-element block.
    const float s = e4m3_value(1u + static_cast<uint32_t>((h >> 40) % 126u));
    float y[kBlock] = {}, ay[kBlock] = {};
    y[0] = (h >> 63) ? -x : x;
    ay[0] = x;
    const uint64_t code = block_codes<true>(y, ay, s, 1) & 0xFu;
    const Thresholds th(s);
    const uint64_t want = th.index(x) | ((h >> 63) << 3);
    if (code != want) ++bad;
    if (bad) atomicAdd(mismatches, bad);
  }
}

__global__ void native_flags(int* out) {
  out[0] = SS_NATIVE_E4M3;
  out[1] = SS_NATIVE_E2M1;
}

}  // namespace
}  // namespace kern

namespace {

template <class T>
struct DevBuf {
  T* p = nullptr;
  explicit DevBuf(size_t n) {
    if (n) check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

void require_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("no CUDA device: ") + cudaGetErrorString(e));
  if (n == 0) throw std::runtime_error("no CUDA device: cudaGetDeviceCount returned 0");
}

size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string device_name() {
  require_device();
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
}

void quantize(const QuantizeArgs& a, CudaStream stream) {
  validate(a);
  const Method m = detail::kmethod(a.method);
  const kern::Params P = detail::make_params(a);
  cudaStream_t st = stream;
  if (a.scales_swizzled && swizzled_has_padding(a.rows, a.cols))
    check(cudaMemsetAsync(a.scales_swizzled, 0, static_cast<size_t>(swizzled_bytes(a.rows, a.cols)),
                          st),
          "cudaMemsetAsync(scales_swizzled)");
  if (a.first_nonfinite)
    check(cudaMemsetAsync(a.first_nonfinite, 0x7F, sizeof(int64_t), st),
          "cudaMemsetAsync(first_nonfinite)");
  const bool vec = a.cols % kBlock == 0 && aligned(a.x, 16) && aligned(a.codes, 8) &&
                   (!a.importance || aligned(a.importance, 16));
  switch (a.dtype) {
    case DType::kF32:
      return kern::launch_t<DType::kF32>(P, m, a.numerics, vec, st);
    case DType::kBF16:
      return kern::launch_t<DType::kBF16>(P, m, a.numerics, vec, st);
    case DType::kF16:
      return kern::launch_t<DType::kF16>(P, m, a.numerics, vec, st);
  }
}

namespace {

void check_host_inputs(const void* x, int64_t rows, int64_t cols, const float* importance) {
  if (!x) throw std::invalid_argument("cuda quantize: input pointer x is null");
  if (importance) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = importance[c];
      if (!(v >= 0.0f) || !std::isfinite(v))
        throw std::invalid_argument("cuda quantize: importance element [" + std::to_string(c) +
                                    "] is " +
                                    (std::isnan(v)   ? "NaN"
                                     : std::isinf(v) ? "infinite"
                                                     : "negative") +
                                    "; importance must be finite and >= 0");
    }
  }
  (void)rows;
}

void throw_bad(const void* x, DType dtype, int64_t cols, int64_t idx, float gs) {
  const float v = load_element(x, dtype, idx);
  const std::string at = "[" + std::to_string(idx / cols) + ", " + std::to_string(idx % cols) + "]";
  if (std::isfinite(v)) {
    const float y = v * gs;
    if (std::isfinite(y))
      throw std::invalid_argument("cuda quantize: element " + at + " = " + std::to_string(v) +
                                  " times global scale " + std::to_string(gs) + " = " +
                                  std::to_string(y) +
                                  " exceeds 2^48; the global scale is far too large");
    throw std::invalid_argument("cuda quantize: element " + at + " = " + std::to_string(v) +
                                " times global scale " + std::to_string(gs) + " overflows float");
  }
  throw std::invalid_argument("cuda quantize: element " + at + " is " +
                              (std::isnan(v) ? "NaN" : "infinite") + "; the input must be finite");
}

void run_host(QuantizeArgs& a, const void* x, const float* importance) {
  require_device();
  const size_t xbytes = static_cast<size_t>(a.rows * a.cols) * dtype_size(a.dtype);
  DevBuf<uint8_t> dx(xbytes);
  check(cudaMemcpy(dx.p, x, xbytes, cudaMemcpyHostToDevice), "cudaMemcpy(x)");
  std::unique_ptr<DevBuf<float>> dimp;
  if (importance && method_is_weighted(a.method)) {
    dimp = std::make_unique<DevBuf<float>>(static_cast<size_t>(a.cols));
    check(cudaMemcpy(dimp->p, importance, static_cast<size_t>(a.cols) * 4, cudaMemcpyHostToDevice),
          "cudaMemcpy(importance)");
  }
  DevBuf<int64_t> bad(1);
  a.x = dx.p;
  a.importance = dimp ? dimp->p : nullptr;
  a.first_nonfinite = bad.p;
  quantize(a, nullptr);
  check(cudaDeviceSynchronize(), "kernel execution");
  int64_t first = kNoBadIndex;
  check(cudaMemcpy(&first, bad.p, sizeof first, cudaMemcpyDeviceToHost), "cudaMemcpy(status)");
  if (first != kNoBadIndex) throw_bad(x, a.dtype, a.cols, first, a.global_scale);
}

}  // namespace

HostQuantized quantize_host(const void* x, DType dtype, int64_t rows, int64_t cols, Method method,
                            float global_scale, const float* importance, Numerics numerics) {
  QuantizeArgs a = input_args(x, dtype, rows, cols, method, global_scale, nullptr, numerics);
  a.codes = reinterpret_cast<uint8_t*>(1);  // placeholders for validate()
  validate(a);
  check_host_inputs(x, rows, cols, importance);
  const int64_t nb = blocks_per_row(cols);
  DevBuf<uint8_t> codes(static_cast<size_t>(rows * packed_cols(cols)));
  DevBuf<uint8_t> scales(static_cast<size_t>(rows * nb));
  DevBuf<uint8_t> swz(static_cast<size_t>(swizzled_bytes(rows, cols)));
  DevBuf<float> loss(static_cast<size_t>(rows * nb));
  a.codes = codes.p;
  a.scales = scales.p;
  a.scales_swizzled = swz.p;
  a.block_loss = loss.p;
  run_host(a, x, importance);
  HostQuantized h;
  h.q.format = TensorFormat::kNvfp4;
  h.q.rows = rows;
  h.q.cols = cols;
  h.q.block = kBlock;
  h.q.global_scale = global_scale;
  h.q.codes.resize(static_cast<size_t>(rows * packed_cols(cols)));
  h.q.scales.resize(static_cast<size_t>(rows * nb));
  h.scales_swizzled.resize(static_cast<size_t>(swizzled_bytes(rows, cols)));
  h.block_loss.resize(static_cast<size_t>(rows * nb));
  check(cudaMemcpy(h.q.codes.data(), codes.p, h.q.codes.size(), cudaMemcpyDeviceToHost),
        "cudaMemcpy(codes)");
  check(cudaMemcpy(h.q.scales.data(), scales.p, h.q.scales.size(), cudaMemcpyDeviceToHost),
        "cudaMemcpy(scales)");
  check(
      cudaMemcpy(h.scales_swizzled.data(), swz.p, h.scales_swizzled.size(), cudaMemcpyDeviceToHost),
      "cudaMemcpy(scales_swizzled)");
  check(cudaMemcpy(h.block_loss.data(), loss.p, h.block_loss.size() * 4, cudaMemcpyDeviceToHost),
        "cudaMemcpy(block_loss)");
  return h;
}

std::vector<float> fake_quantize_host(const void* x, DType dtype, int64_t rows, int64_t cols,
                                      Method method, float global_scale, const float* importance,
                                      Numerics numerics) {
  QuantizeArgs a = input_args(x, dtype, rows, cols, method, global_scale, nullptr, numerics);
  a.dequant = reinterpret_cast<void*>(1);  // placeholder for validate()
  a.dequant_dtype = DType::kF32;
  validate(a);
  check_host_inputs(x, rows, cols, importance);
  DevBuf<float> out(static_cast<size_t>(rows * cols));
  a.dequant = out.p;
  run_host(a, x, importance);
  std::vector<float> h(static_cast<size_t>(rows * cols));
  check(cudaMemcpy(h.data(), out.p, h.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy(dequant)");
  return h;
}

namespace detail {

void set_grid_cap_for_testing(int64_t ctas) { kern::g_grid_cap.store(ctas < 0 ? 0 : ctas); }

ConversionCheck check_native_conversions(int64_t n) {
  require_device();
  ConversionCheck r;
  DevBuf<unsigned long long> mism(1);
  DevBuf<int> flags(2);
  check(cudaMemset(mism.p, 0, sizeof(unsigned long long)), "cudaMemset");
  kern::conversion_check<<<1024, 256>>>(n, mism.p);
  check(cudaGetLastError(), "conversion_check launch");
  kern::native_flags<<<1, 1>>>(flags.p);
  check(cudaGetLastError(), "native_flags launch");
  check(cudaDeviceSynchronize(), "conversion_check");
  unsigned long long mm = 0;
  int f[2] = {0, 0};
  check(cudaMemcpy(&mm, mism.p, sizeof mm, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(f, flags.p, sizeof f, cudaMemcpyDeviceToHost), "cudaMemcpy");
  r.checked = n;
  r.mismatches = static_cast<int64_t>(mm);
  r.native_e4m3 = f[0] != 0;
  r.native_e2m1 = f[1] != 0;
  return r;
}

}  // namespace detail
}  // namespace scalesweep::cuda

// Device-side check of the fast and half2 sweeps (Numerics::kFast, kHalf2) on many blocks
// (gpu_test.cc): test tensors are generated on the device, the exact kernel, the fast kernel and
// the exhaustive kernel run on the same data, and a kernel compares their per-block contract losses
// (each kernel's block_loss is the exact contract loss of its chosen scale; the exact and the
// exhaustive kernels are checked bit-identical to the CPU reference by the other GPU tests).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/internal.h"

namespace scalesweep::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

__device__ __forceinline__ uint64_t mix(uint64_t h) {
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h;
}
// Uniform in (0, 1): 24 random bits, never 0 or 1.
__device__ __forceinline__ float unit(uint64_t h) {
  return (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// x[i] of test kind `kind` (detail::kFastCheckKinds); one value per element, block-level
// parameters from the block's hash. f32 output, or bf16 (kind 4, bench-like activations).
__global__ void fill_kind(float* xf, uint16_t* xb, int kind, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint64_t hb = mix((static_cast<uint64_t>(i / 16) + 1) * 0x9E3779B97F4A7C15ull + seed);
    const uint64_t h1 = mix(hb ^ (static_cast<uint64_t>(i % 16) + 1) * 0xD6E8FEB86659FD93ull);
    const uint64_t h2 = mix(h1 + 0x632BE59BD9B4E019ull);
    const uint64_t h3 = mix(h2 + 0x632BE59BD9B4E019ull);
    // Block scale 2^-24 .. 2^6 (every FP8 binade, subnormal bases and saturation included).
    const float scale = exp2f(floorf(unit(hb) * 30.0f) - 24.0f) * (1.0f + unit(mix(hb + 1)));
    const float sign = (h3 >> 7) & 1 ? -1.0f : 1.0f;
    const float u1 = unit(h1), u2 = unit(h2);
    const float nrm = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);  // Box-Muller
    float v = 0.0f;
    switch (kind) {
      case 0:  // normal
        v = nrm * scale;
        break;
      case 1:  // Laplace (heavy tail)
        v = sign * -logf(u2) * scale;
        break;
      case 2:  // Student-t-like (heavier tail)
        v = nrm / sqrtf(fmaxf(1e-6f, -2.0f * logf(unit(h3)) / 3.0f)) * scale;
        break;
      case 3:  // uniform
        v = sign * u2 * scale;
        break;
      case 4: {  // bench-like: sum of 4 uniforms, every 97th channel x20 (bf16)
        float s = u1 + u2 + unit(h3) + unit(mix(h3 + 5)) - 2.0f;
        if ((i % 8192) % 97 == 3) s *= 20.0f;
        v = s;
        break;
      }
      case 5: {  // exact FP4 ties and grid values of a random FP8 scale
        const float s = kern::e4m3_value(1u + static_cast<uint32_t>(unit(hb) * 120.0f));
        v = sign * s *
            (u1 < 0.6f ? mids[static_cast<int>(u2 * 7.0f)] : grid[static_cast<int>(u2 * 8.0f)]);
        break;
      }
      case 6:  // FP8-valued
        v = sign * kern::e4m3_value(static_cast<uint32_t>(u1 * 127.0f));
        break;
      case 7: {  // outlier: normal with one element x (50 .. 1050)
        v = nrm;
        if (static_cast<int64_t>(hb % 16) == i % 16) v *= 50.0f + 1000.0f * unit(mix(hb + 2));
        break;
      }
      case 8:  // integer-valued 0..12 (many exact loss ties between scales)
        v = sign * floorf(u1 * 13.0f);
        break;
      default:  // one-hot
        v = static_cast<int64_t>(hb % 16) == i % 16 ? sign * scale : 0.0f;
        break;
    }
    if (xb)
      xb[i] = format::f32_to_bf16(v);
    else
      xf[i] = v;
  }
}

__global__ void fill_weights(float* w, int64_t n, uint64_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint64_t h = mix((static_cast<uint64_t>(i) + 1) * 0xD6E8FEB86659FD93ull + seed);
  w[i] = unit(h) < 0.05f ? 0.0f : exp2f(unit(mix(h)) * 16.0f - 8.0f);
}

struct Counters {
  unsigned long long blocks, differs, worse, violations, exact_not_optimal;
  unsigned int max_excess_bits;  // float bits of the largest excess (non-negative)
  double sum_excess;
  unsigned long long first_violation;
};

// ref: the reference loss per block (exhaustive optimum for sweep-mse, window optimum for
// sweep-wmse); opt: the exhaustive optimum (for sweep-mse: exact must equal it).
// half2: the allowance is kern::half2_excess_bound of the block (a from the input xf / xb times gs,
// w_a from imp, cols a multiple of 16), and the excess statistics are relative to lo + 2^-16 a^2
// w_a; otherwise a relative tol.
__global__ void compare_losses(const uint8_t* ps_exact, const uint8_t* ps_fast,
                               const float* l_exact, const float* l_fast, const float* l_opt,
                               bool mse, double tol, bool half2, const float* xf,
                               const uint16_t* xb, float gs, const float* imp, int64_t cols,
                               int64_t n, Counters* c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long differs = 0, worse = 0, viol = 0, notopt = 0, blocks = 0;
  float max_ex = 0.0f;
  double sum_ex = 0.0;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < n;
       b += stride) {
    ++blocks;
    const double lf = l_fast[b], le = l_exact[b], lo = l_opt[b];
    const double ref = mse ? lo : le;
    if (mse && le != lo) ++notopt;
    if (ps_exact[b] != ps_fast[b]) ++differs;
    double allowed = tol * ref, floor = 0.0;
    if (half2) {
      float a = 0.0f, wa = imp ? 0.0f : 1.0f;
      const int64_t kb = b % (cols / 16);
      for (int i = 0; i < 16; ++i) {
        const float x = xf ? xf[b * 16 + i] : format::bf16_to_f32(xb[b * 16 + i]);
        a = fmaxf(a, fabsf(__fmul_rn(x, gs)));
        if (imp) wa = fmaxf(wa, imp[kb * 16 + i]);
      }
      allowed = kern::half2_excess_bound(a, wa, lf, ref);
      floor = 0x1p-16 * static_cast<double>(a) * a * wa;
    }
    if (lf > le) {
      ++worse;
      const double ex = ref + floor > 0.0 ? (lf - ref) / (ref + floor) : 1.0;
      max_ex = fmaxf(max_ex, static_cast<float>(ex));
      sum_ex += ex;
    }
    if (lf - ref > allowed) {
      ++viol;
      atomicMin(&c->first_violation, static_cast<unsigned long long>(b));
    }
  }
  atomicAdd(&c->blocks, blocks);
  if (differs) atomicAdd(&c->differs, differs);
  if (worse) atomicAdd(&c->worse, worse);
  if (viol) atomicAdd(&c->violations, viol);
  if (notopt) atomicAdd(&c->exact_not_optimal, notopt);
  if (max_ex > 0.0f) atomicMax(&c->max_excess_bits, __float_as_uint(max_ex));
  if (sum_ex > 0.0) atomicAdd(&c->sum_excess, sum_ex);
}

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { check(cudaMalloc(&p, (n ? n : 1) * sizeof(T)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

}  // namespace

namespace detail {

FastCheck check_fast_numerics(Method method, int kind, int64_t rows, int64_t cols, uint64_t seed,
                              bool weighted, Numerics numerics, double tol) {
  if (method != Method::kSweepMse && method != Method::kSweepWmse)
    throw std::invalid_argument("check_fast_numerics: sweep-mse or sweep-wmse only");
  if (numerics == Numerics::kExact)
    throw std::invalid_argument("check_fast_numerics: fast or half2 numerics only");
  if (kind < 0 || kind >= kFastCheckKinds)
    throw std::invalid_argument("check_fast_numerics: kind " + std::to_string(kind) +
                                " out of range");
  const int64_t n = rows * cols, nb = rows * blocks_per_row(cols);
  const bool bf16 = kind == 4;
  Dev<float> xf(bf16 ? 0 : static_cast<size_t>(n));
  Dev<uint16_t> xb(bf16 ? static_cast<size_t>(n) : 0);
  Dev<float> imp(static_cast<size_t>(cols));
  Dev<uint8_t> sc_exact(static_cast<size_t>(nb)), sc_fast(static_cast<size_t>(nb)),
      sc_opt(static_cast<size_t>(nb));
  Dev<float> l_exact(static_cast<size_t>(nb)), l_fast(static_cast<size_t>(nb)),
      l_opt(static_cast<size_t>(nb));
  Dev<Counters> cnt(1);
  fill_kind<<<4096, 256>>>(bf16 ? nullptr : xf.p, bf16 ? xb.p : nullptr, kind, n, seed);
  check(cudaGetLastError(), "fill_kind");
  fill_weights<<<static_cast<unsigned>((cols + 255) / 256), 256>>>(imp.p, cols, seed);
  check(cudaGetLastError(), "fill_weights");
  QuantizeArgs a =
      input_args(bf16 ? static_cast<const void*>(xb.p) : static_cast<const void*>(xf.p),
                 bf16 ? DType::kBF16 : DType::kF32, rows, cols, method,
                 bf16 ? 6.0f * 256.0f / 40.0f : 1.0f, weighted ? imp.p : nullptr);
  a.scales = sc_exact.p;
  a.block_loss = l_exact.p;
  quantize(a, nullptr);
  a.numerics = numerics;
  a.scales = sc_fast.p;
  a.block_loss = l_fast.p;
  quantize(a, nullptr);
  a.numerics = Numerics::kExact;
  a.method = method == Method::kSweepMse ? Method::kExhaustiveMse : Method::kExhaustiveWmse;
  a.scales = sc_opt.p;
  a.block_loss = l_opt.p;
  quantize(a, nullptr);
  Counters zero{};
  zero.first_violation = ~0ull;
  check(cudaMemcpy(cnt.p, &zero, sizeof zero, cudaMemcpyHostToDevice), "cudaMemcpy(counters)");
  compare_losses<<<1024, 256>>>(sc_exact.p, sc_fast.p, l_exact.p, l_fast.p, l_opt.p,
                                method == Method::kSweepMse, tol, numerics == Numerics::kHalf2,
                                bf16 ? nullptr : xf.p, bf16 ? xb.p : nullptr, a.global_scale,
                                a.importance, cols, nb, cnt.p);
  check(cudaGetLastError(), "compare_losses");
  check(cudaDeviceSynchronize(), "fast check");
  Counters c{};
  check(cudaMemcpy(&c, cnt.p, sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy(counters)");
  FastCheck r;
  r.blocks = static_cast<int64_t>(c.blocks);
  r.differs = static_cast<int64_t>(c.differs);
  r.worse = static_cast<int64_t>(c.worse);
  r.violations = static_cast<int64_t>(c.violations);
  r.exact_not_optimal = static_cast<int64_t>(c.exact_not_optimal);
  r.max_excess = static_cast<double>(__builtin_bit_cast(float, c.max_excess_bits));
  r.sum_excess = c.sum_excess;
  r.first_violation = c.violations ? static_cast<int64_t>(c.first_violation) : -1;
  if (r.first_violation >= 0) {  // the first offending block, for the failure message
    float lf = 0, le = 0, lo = 0;
    uint8_t pf = 0, pe = 0, po = 0;
    const int64_t b = r.first_violation;
    check(cudaMemcpy(&lf, l_fast.p + b, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(&le, l_exact.p + b, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(&lo, l_opt.p + b, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(&pf, sc_fast.p + b, 1, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(&pe, sc_exact.p + b, 1, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(&po, sc_opt.p + b, 1, cudaMemcpyDeviceToHost), "cudaMemcpy");
    r.violation = "block " + std::to_string(b) + ": " + std::string(kNumericsNames.name(numerics)) +
                  " pattern " + std::to_string(pf) + " loss " + std::to_string(lf) +
                  ", exact pattern " + std::to_string(pe) + " loss " + std::to_string(le) +
                  ", exhaustive pattern " + std::to_string(po) + " loss " + std::to_string(lo);
  }
  return r;
}

}  // namespace detail
}  // namespace scalesweep::cuda

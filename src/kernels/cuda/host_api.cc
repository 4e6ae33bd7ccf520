// Host-side parts of the CUDA operator: argument checks, method mapping, launch parameters and
// the CPU emulation of the kernels (plain C++, built and tested with or without nvcc).
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/cuda/internal.h"
#include "scalesweep/scale/bounds.h"

namespace scalesweep::cuda {

bool method_supported(Method m) {
  return m == Method::kAbsMax || m == Method::kFourOverSix || m == Method::kSweepMse ||
         m == Method::kSweepWmse || m == Method::kExhaustiveMse || m == Method::kExhaustiveWmse;
}

bool numerics_supported(Method m, Numerics n) {
  if (!method_supported(m)) return false;
  return n == Numerics::kExact || ((n == Numerics::kFast || n == Numerics::kHalf2) &&
                                   (m == Method::kSweepMse || m == Method::kSweepWmse));
}

namespace {

bool dtype_valid(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

std::string shape_str(int64_t r, int64_t c) {
  std::ostringstream os;  // (string concatenation trips GCC 12's -Wrestrict false positive)
  os << '[' << r << ", " << c << ']';
  return os.str();
}

}  // namespace

void validate(const QuantizeArgs& a) {
  const std::string where = "cuda quantize " + shape_str(a.rows, a.cols) + ": ";
  if (a.rows <= 0 || a.cols <= 0)
    throw std::invalid_argument(where + "empty or negative shape; need rows > 0 and cols > 0");
  // Element indices, packed bytes and the swizzled buffer must fit int64 with room to spare.
  constexpr int64_t kMaxElems = int64_t{1} << 56;
  if (a.rows > kMaxElems / a.cols)
    throw std::invalid_argument(where + "tensor too large (rows * cols > 2^56)");
  if (!a.x) throw std::invalid_argument(where + "input pointer x is null");
  if (!dtype_valid(a.dtype))
    throw std::invalid_argument(where + "unsupported input dtype " +
                                std::to_string(static_cast<int>(a.dtype)) +
                                "; use float32, bfloat16 or float16");
  if (!method_supported(a.method))
    throw std::invalid_argument(where + "method '" + std::string(kMethodNames.name(a.method)) +
                                "' is not implemented on CUDA; use absmax, 4over6, sweep-mse, "
                                "sweep-wmse, exhaustive-mse or exhaustive-wmse");
  if (a.numerics != Numerics::kExact && a.numerics != Numerics::kFast &&
      a.numerics != Numerics::kHalf2)
    throw std::invalid_argument(where + "unknown numerics " +
                                std::to_string(static_cast<int>(a.numerics)) +
                                "; use exact, fast or half2");
  if (!numerics_supported(a.method, a.numerics))
    throw std::invalid_argument(
        where + "numerics '" + std::string(kNumericsNames.name(a.numerics)) +
        "' is not implemented for method '" + std::string(kMethodNames.name(a.method)) +
        "'; fast and half2 numerics exist for sweep-mse and sweep-wmse only");
  const float gs = a.global_scale;
  if (!(gs > 0.0f) || !(gs <= std::numeric_limits<float>::max()))
    throw std::invalid_argument(where + "global scale " + std::to_string(gs) +
                                " is invalid; need a finite value > 0 (encode direction)");
  if (!a.codes && !a.scales && !a.scales_swizzled && !a.dequant && !a.block_loss)
    throw std::invalid_argument(where +
                                "no output requested (codes, scales, scales_swizzled, dequant "
                                "and block_loss are all null)");
  if (a.dequant && !dtype_valid(a.dequant_dtype))
    throw std::invalid_argument(where + "unsupported dequant dtype " +
                                std::to_string(static_cast<int>(a.dequant_dtype)));
}

namespace detail {

Method kmethod(Method m) {
  if (method_supported(m)) return m;
  throw std::invalid_argument("method '" + std::string(kMethodNames.name(m)) +
                              "' is not implemented on CUDA");
}

namespace {

// The sweep-mse per-base windows proven for blocks of n elements (src/scale/bounds), as the
// CPU selector uses them; {1, 0} where nothing is proven.
void fill_windows(int8_t (&t)[kern::kPatterns][2], int n) {
  for (int P = 0; P < kern::kPatterns; ++P) {
    const auto w = bounds::proven_window(bounds::ElemFormat::kE2M1, ScaleFormat::kE4M3, n, P);
    if (w && w->lo <= w->hi) {
      if (w->lo < -127 || w->hi > 127)
        throw std::logic_error("cuda: proven sweep window offset out of int8 range");
      t[P][0] = static_cast<int8_t>(w->lo);
      t[P][1] = static_cast<int8_t>(w->hi);
    } else {
      t[P][0] = 1;
      t[P][1] = 0;
    }
  }
}

}  // namespace

kern::Params make_params(const QuantizeArgs& a) {
  kern::Params p{};
  if (a.method == Method::kSweepMse) {
    fill_windows(p.win_full, kBlock);
    const int part = static_cast<int>(a.cols % kBlock);
    fill_windows(p.win_part, part ? part : kBlock);
  } else {
    for (int P = 0; P < kern::kPatterns; ++P) {
      p.win_full[P][0] = p.win_part[P][0] = 1;
      p.win_full[P][1] = p.win_part[P][1] = 0;
    }
  }
  p.x = a.x;
  p.rows = a.rows;
  p.cols = a.cols;
  p.nb = blocks_per_row(a.cols);
  p.inv_nb = 1.0 / static_cast<double>(p.nb);
  p.pc = packed_cols(a.cols);
  p.gs = a.global_scale;
  p.imp = method_is_weighted(a.method) ? a.importance : nullptr;
  p.codes = a.codes;
  p.scales = a.scales;
  p.scales_sw = a.scales_swizzled;
  p.loss = a.block_loss;
  p.deq = a.dequant;
  p.deq_type = static_cast<int>(a.dequant_dtype);
  p.first_bad = reinterpret_cast<unsigned long long*>(a.first_nonfinite);
  return p;
}

namespace {

template <DType T, Method M, Numerics kNu = Numerics::kExact>
void emulate_all(const kern::Params& p) {
  for (int64_t m = 0; m < p.rows; ++m)
    for (int64_t kb = 0; kb < p.nb; ++kb)
      kern::process_block<T, M, kNu>(p, m, kb, &p.win_full[0][0], &p.win_part[0][0]);
}

template <DType T, Method M>
void emulate_nu(const kern::Params& p, Numerics nu) {
  switch (nu) {
    case Numerics::kFast:
      return emulate_all<T, M, Numerics::kFast>(p);
    case Numerics::kHalf2:
      return emulate_all<T, M, Numerics::kHalf2>(p);
    default:
      return emulate_all<T, M>(p);
  }
}

template <DType T>
void emulate_type(const kern::Params& p, Method m, Numerics nu) {
  switch (m) {
    case Method::kAbsMax:
      return emulate_all<T, Method::kAbsMax>(p);
    case Method::kFourOverSix:
      return emulate_all<T, Method::kFourOverSix>(p);
    case Method::kSweepMse:
      return emulate_nu<T, Method::kSweepMse>(p, nu);
    case Method::kSweepWmse:
      return emulate_nu<T, Method::kSweepWmse>(p, nu);
    case Method::kExhaustiveMse:
      return emulate_all<T, Method::kExhaustiveMse>(p);
    case Method::kExhaustiveWmse:
      return emulate_all<T, Method::kExhaustiveWmse>(p);
    default:
      break;  // refused by kmethod()
  }
}

}  // namespace

void emulate(const QuantizeArgs& a) {
  validate(a);
  const kern::Params p = make_params(a);
  if (a.scales_swizzled && swizzled_has_padding(a.rows, a.cols)) {
    const int64_t n = swizzled_bytes(a.rows, a.cols);
    for (int64_t i = 0; i < n; ++i) a.scales_swizzled[i] = 0;
  }
  if (a.first_nonfinite) *a.first_nonfinite = kNoBadIndex;
  const Method m = kmethod(a.method);
  switch (a.dtype) {
    case DType::kF32:
      return emulate_type<DType::kF32>(p, m, a.numerics);
    case DType::kBF16:
      return emulate_type<DType::kBF16>(p, m, a.numerics);
    case DType::kF16:
      return emulate_type<DType::kF16>(p, m, a.numerics);
  }
}

}  // namespace detail
}  // namespace scalesweep::cuda

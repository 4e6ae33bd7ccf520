// Decode matrix-vector products of the runtime (model::gemv_rows) on one thread, per storage
// type, against fp32 and against the unfused path (dequantize a tile of rows with the scalar
// dequantizer, then the fp32 kernel: what every quantized type ran before the fused kernels).
// Two shapes: 1536 x 768 (a small model's MLP matrix, near L2) and 4096 x 4096 (far beyond it).
//   build/bench/gemv_bench [--seconds S]
// Prints ns per weight, GB/s of stored weights, and the ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/quant_kernels.h"
#include "scalesweep/format/ggml.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/model/weight.h"

namespace {

using namespace scalesweep;
using model::Tensor;
using model::WeightDType;

double time_per_call(const std::function<void()>& f, double seconds) {
  f();  // warm
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double el = 0;
  do {
    f();
    ++calls;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (el < seconds);
  return el / calls;
}

struct Case {
  std::string name;
  Tensor t;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> scales;
  std::vector<float> f32;
};

uint16_t half_of(float x) { return format::f32_to_f16(x); }

// Random blocks of a ggml type with sane fp16 scales.
std::vector<uint8_t> ggml_blocks(format::GgmlType type, int64_t n, std::mt19937_64& rng) {
  const auto tr = *format::ggml_type_traits(static_cast<uint32_t>(type));
  const int64_t blocks = n / tr.block_elems;
  std::vector<uint8_t> v(static_cast<size_t>(blocks * tr.block_bytes));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = v.data() + i * tr.block_bytes;
    const uint16_t d = half_of(0.01f), m = half_of(0.002f);
    switch (type) {
      case format::GgmlType::kQ8_0:
        std::memcpy(b, &d, 2);
        break;
      case format::GgmlType::kQ4_K:
        std::memcpy(b, &d, 2);
        std::memcpy(b + 2, &m, 2);
        break;
      case format::GgmlType::kQ6_K:
        std::memcpy(b + 208, &d, 2);
        break;
      case format::GgmlType::kNVFP4:
        for (int j = 0; j < 4; ++j) b[j] = static_cast<uint8_t>(0x30 + rng() % 16);
        break;
      default:
        break;
    }
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--seconds") seconds = std::atof(argv[i + 1]);
  const std::pair<int64_t, int64_t> shapes[] = {{1536, 768}, {4096, 4096}};
  std::printf(
      "gemv_rows on one thread, %.1f s per row (best effort timing; ratios are what "
      "to read)\n",
      seconds);
  std::printf("%-12s %-11s %9s %8s %10s %10s\n", "shape", "storage", "ns/weight", "GB/s", "vs fp32",
              "vs unfused");
  for (auto [rows, cols] : shapes) {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> nd;
    const int64_t n = rows * cols;
    std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
    for (auto& v : x) v = nd(rng);
    std::vector<Case> cases;
    {
      Case c{"fp32", {}, {}, {}, std::vector<float>(static_cast<size_t>(n))};
      for (auto& v : c.f32) v = nd(rng) * 0.02f;
      cases.push_back(std::move(c));
    }
    {
      Case c{"bf16", {}, std::vector<uint8_t>(static_cast<size_t>(2 * n)), {}, {}};
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = format::f32_to_bf16(nd(rng) * 0.02f);
        std::memcpy(c.bytes.data() + 2 * i, &h, 2);
      }
      c.t.dtype = WeightDType::kBF16;
      cases.push_back(std::move(c));
    }
    {
      Case c{"NVFP4 (ct)",
             {},
             std::vector<uint8_t>(static_cast<size_t>(n / 2)),
             std::vector<uint8_t>(static_cast<size_t>(n / 16)),
             {}};
      for (auto& b : c.bytes) b = static_cast<uint8_t>(rng());
      for (auto& b : c.scales) b = static_cast<uint8_t>(0x30 + rng() % 16);
      c.t.dtype = WeightDType::kNvfp4;
      c.t.nvfp4_global_scale = 448.0f * 6.0f / 0.1f;
      cases.push_back(std::move(c));
    }
    for (auto [type, name] :
         {std::pair{format::GgmlType::kNVFP4, "NVFP4 ggml"},
          std::pair{format::GgmlType::kQ8_0, "Q8_0"}, std::pair{format::GgmlType::kQ4_K, "Q4_K"},
          std::pair{format::GgmlType::kQ6_K, "Q6_K"}}) {
      Case c{name, {}, ggml_blocks(type, n, rng), {}, {}};
      c.t.dtype = WeightDType::kGgml;
      c.t.ggml_type = static_cast<uint32_t>(type);
      cases.push_back(std::move(c));
    }
    double fp32_s = 0;
    for (Case& c : cases) {
      c.t.shape = {rows, cols};
      if (c.t.dtype == WeightDType::kF32) {
        c.t.data = c.f32.data();
      } else {
        c.t.raw = c.bytes.data();
        c.t.nvfp4_scales = c.scales.data();
      }
      const double s =
          time_per_call([&] { model::gemv_rows(c.t, x.data(), 0, rows, y.data()); }, seconds);
      if (c.t.dtype == WeightDType::kF32) fp32_s = s;
      // The unfused path: a tile of rows through the scalar dequantizer, then the fp32 kernel.
      double unfused = 0;
      if (c.t.dtype == WeightDType::kNvfp4 || c.t.dtype == WeightDType::kGgml) {
        const int64_t tile = model::weight_tile_rows(cols);
        std::vector<float> buf(static_cast<size_t>(tile * cols));
        Tensor ft;
        unfused = time_per_call(
            [&] {
              for (int64_t r = 0; r < rows; r += tile) {
                const int64_t r1 = std::min(rows, r + tile);
                model::dequantize_rows_reference(c.t, r, r1, buf.data());
                ft.shape = {r1 - r, cols};
                ft.data = buf.data();
                model::gemv_rows(ft, x.data(), 0, r1 - r, y.data() + r);
              }
            },
            seconds);
      }
      const double bytes = static_cast<double>(model::storage_bytes(c.t));
      char vs_unfused[32] = "-";
      if (unfused > 0) std::snprintf(vs_unfused, sizeof vs_unfused, "%.2fx", unfused / s);
      std::printf("%5lldx%-6lld %-11s %9.3f %8.2f %9.2fx %10s\n", static_cast<long long>(rows),
                  static_cast<long long>(cols), c.name.c_str(), s * 1e9 / static_cast<double>(n),
                  bytes / s / 1e9, fp32_s / s, vs_unfused);
    }
  }
  std::printf("(vs fp32: fp32 time / this time, >1 is faster; vs unfused: unfused time / this)\n");
  std::printf("fused kernels on this CPU: %s\n",
              [] {
                Tensor t;
                t.shape = {1, 32};
                t.dtype = WeightDType::kGgml;
                t.ggml_type = static_cast<uint32_t>(format::GgmlType::kQ8_0);
                return model::detail::quant_kernel_available(t);
              }()
                  ? "yes (AVX-512)"
                  : "no (the unfused path runs)");
}

// Google Benchmark of the fast NVFP4 kernels (src/quant/simd), per kernel and per dispatch
// target (the benchmark argument is the index into simd::dispatch_targets(), best first;
// the label names the target). Throughput is reported in elements/s.
//   build/bench/kernels_bench --benchmark_filter=Candidate
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/simd/kernels.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/quantize.h"

namespace {

using namespace scalesweep;

constexpr int64_t kRows = 256, kCols = 4096;  // 1 Mi elements, 64 Ki blocks of 16

const std::vector<float>& data_f32() {
  static const std::vector<float> x = [] {
    std::vector<float> v(static_cast<size_t>(kRows * kCols));
    std::mt19937 g(1);
    std::normal_distribution<float> n;
    for (auto& e : v) e = n(g);
    return v;
  }();
  return x;
}

const std::vector<uint16_t>& data_bf16() {
  static const std::vector<uint16_t> x = [] {
    std::vector<uint16_t> v(data_f32().size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = format::f32_to_bf16(data_f32()[i]);
    return v;
  }();
  return x;
}

// Selects the target of state.range(0); false (and skips) when there is no such target.
bool use_target(benchmark::State& state) {
  const auto t = simd::dispatch_targets();
  const size_t i = static_cast<size_t>(state.range(0));
  if (i >= t.size()) {
    state.SkipWithError("target not available on this CPU");
    return false;
  }
  simd::force_target(t[i]);
  state.SetLabel(simd::target_name(t[i]));
  return true;
}

void finish(benchmark::State& state, int64_t elements) {
  state.SetItemsProcessed(state.iterations() * elements);
  simd::force_target(0);
}

void BM_LoadScaledBf16(benchmark::State& state) {
  if (!use_target(state)) return;
  std::vector<float> y(data_bf16().size());
  for (auto _ : state) {
    simd::load_scaled(data_bf16().data(), DType::kBF16, static_cast<int64_t>(y.size()), 300.0f,
                      y.data());
    benchmark::DoNotOptimize(y.data());
  }
  finish(state, static_cast<int64_t>(y.size()));
}

void BM_BlockAmax(benchmark::State& state) {
  if (!use_target(state)) return;
  const auto& y = data_f32();
  std::vector<float> a(y.size() / 16);
  for (auto _ : state) {
    simd::block_amax(y.data(), static_cast<int64_t>(y.size()), 16, a.data());
    benchmark::DoNotOptimize(a.data());
  }
  finish(state, static_cast<int64_t>(y.size()));
}

void BM_Fp8Round(benchmark::State& state) {
  if (!use_target(state)) return;
  std::vector<float> v(data_f32().size() / 16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::fabs(data_f32()[i]) * 50.0f / 6.0f;
  std::vector<uint8_t> p(v.size());
  for (auto _ : state) {
    simd::fp8_round(v.data(), static_cast<int64_t>(v.size()), false, p.data());
    benchmark::DoNotOptimize(p.data());
  }
  finish(state, static_cast<int64_t>(v.size()));  // scales/s
}

void BM_Fp4Codes(benchmark::State& state) {
  if (!use_target(state)) return;
  const auto& y = data_f32();
  std::vector<uint8_t> c(y.size());
  for (auto _ : state) {
    simd::fp4_codes(y.data(), static_cast<int64_t>(y.size()), 44, c.data());
    benchmark::DoNotOptimize(c.data());
  }
  finish(state, static_cast<int64_t>(y.size()));
}

void BM_PackNibbles(benchmark::State& state) {
  if (!use_target(state)) return;
  std::vector<uint8_t> c(data_f32().size()), out(c.size() / 2);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(i & 15);
  for (auto _ : state) {
    simd::pack_nibbles(c.data(), static_cast<int64_t>(c.size()), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  finish(state, static_cast<int64_t>(c.size()));
}

// Candidate losses of one block of 16 for `count` consecutive patterns (11 = sweep-mse window,
// 16 = sweep-wmse window); items = element-candidate pairs.
void BM_CandidateLosses(benchmark::State& state) {
  if (!use_target(state)) return;
  const int count = static_cast<int>(state.range(1));
  const auto& y = data_f32();
  const int64_t nblocks = 4096;
  float loss[16];
  for (auto _ : state) {
    for (int64_t b = 0; b < nblocks; ++b) {
      simd::candidate_losses(y.data() + b * 16, nullptr, 16, 40, count, loss);
      benchmark::DoNotOptimize(loss);
    }
  }
  finish(state, nblocks * 16 * count);
}

// Whole quantize_into() (1 thread, bf16 input, output buffers reused across iterations as
// the copy baseline's are) per method.
void BM_Quantize(benchmark::State& state) {
  if (!use_target(state)) return;
  const auto methods = kMethodNames.values();
  const Method m = methods[static_cast<size_t>(state.range(1))];
  QuantConfig cfg;
  cfg.selector.method = m;
  if (m == Method::kSweep) cfg.selector.window = Window{-3, 7};
  cfg.threads = 1;
  std::vector<float> imp(kCols, 1.0f);
  const Importance im{ImportanceKind::kPerColumn, imp.data()};
  QuantizedTensor q;
  for (auto _ : state) {
    quantize_into(data_bf16().data(), DType::kBF16, kRows, kCols, im, cfg, q);
    benchmark::DoNotOptimize(q.codes.data());
  }
  state.SetLabel(std::string(simd::target_name(
                     simd::dispatch_targets()[static_cast<size_t>(state.range(0))])) +
                 " " + std::string(kMethodNames.name(m)));
  finish(state, kRows * kCols);
}

void BM_CopyBaseline(benchmark::State& state) {
  if (!use_target(state)) return;
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols / 2)),
      scales(static_cast<size_t>(kRows * kCols / 16));
  for (auto _ : state) {
    simd::copy_baseline(data_bf16().data(), DType::kBF16, kRows, kCols, 16, codes.data(),
                        scales.data(), 0, kRows);
    benchmark::DoNotOptimize(codes.data());
  }
  finish(state, kRows * kCols);
}

void targets(benchmark::internal::Benchmark* b) {
  const int n = static_cast<int>(simd::dispatch_targets().size());
  for (int i = 0; i < n; ++i) b->Arg(i);
}

void targets_x_counts(benchmark::internal::Benchmark* b) {
  const int n = static_cast<int>(simd::dispatch_targets().size());
  for (int i = 0; i < n; ++i)
    for (int c : {1, 11, 16}) b->Args({i, c});
}

void targets_x_methods(benchmark::internal::Benchmark* b) {
  const int n = static_cast<int>(simd::dispatch_targets().size());
  const auto ms = kMethodNames.values();
  for (int i = 0; i < n; ++i)
    for (int m = 0; m < static_cast<int>(ms.size()); ++m) {
      if (ms[static_cast<size_t>(m)] == Method::kOptFp32) continue;
      if (i > 0 && (ms[static_cast<size_t>(m)] == Method::kOptFp8Mse ||
                    ms[static_cast<size_t>(m)] == Method::kOptFp8Wmse))
        continue;  // scalar-dominated (continuous optimum): best target only
      b->Args({i, m});
    }
}

BENCHMARK(BM_LoadScaledBf16)->Apply(targets);
BENCHMARK(BM_BlockAmax)->Apply(targets);
BENCHMARK(BM_Fp8Round)->Apply(targets);
BENCHMARK(BM_Fp4Codes)->Apply(targets);
BENCHMARK(BM_PackNibbles)->Apply(targets);
BENCHMARK(BM_CandidateLosses)->Apply(targets_x_counts);
BENCHMARK(BM_CopyBaseline)->Apply(targets);
BENCHMARK(BM_Quantize)->Apply(targets_x_methods)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

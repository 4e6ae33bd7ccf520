// One parallel-for for every layer: a static split of [0, n) into contiguous chunks, one per
// worker, so that what a chunk computes depends only on its range (and outputs written per
// index are identical for every thread count). Layer `base`: no dependencies.
//
//   parallel_for(n, threads, [&](int64_t begin, int64_t end, int worker) { ... });
//
// - threads == 0 means all cores (hardware_threads()); threads < 0 is refused.
// - min(threads, n) chunks; chunk w is [n*w/chunks, n*(w+1)/chunks), worker index w; n <= 0
//   calls nothing; a single chunk runs on the calling thread (no thread is started).
// - The calling thread runs chunk 0; chunks 1.. run on new threads. A thread that cannot start
//   (std::system_error: pids limit, address space) has its chunk, and those after it, run on
//   the calling thread: same ranges, same worker indices, same results.
// - An exception thrown by a chunk is rethrown on the caller after every thread has joined;
//   when several chunks throw, the one of the lowest worker index wins (deterministic).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace scalesweep {

// "All cores": std::thread::hardware_concurrency() clamped to [1, kMaxHardwareThreads] (0 when
// unknown counts as 1).
inline constexpr int kMaxHardwareThreads = 256;
int hardware_threads();

// threads == 0 -> hardware_threads(); threads > 0 -> threads; threads < 0 ->
// std::invalid_argument naming `what` (e.g. "--threads").
int resolve_threads(int threads, const char* what = "threads");

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end, int worker);
void parallel_for_impl(int64_t n, int threads, ChunkFn fn, void* ctx);

// Test seam: after `starts` more successful thread starts (process-wide), every further thread
// start in parallel_for throws std::system_error as if the system had no thread left. A
// negative value (the default) removes the limit. Returns the previous value.
int set_thread_start_limit(int starts);
}  // namespace detail

template <class F>
void parallel_for(int64_t n, int threads, F&& body) {
  using Body = std::remove_reference_t<F>;
  detail::parallel_for_impl(
      n, threads,
      [](void* ctx, int64_t begin, int64_t end, int worker) {
        (*static_cast<Body*>(ctx))(begin, end, worker);
      },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace scalesweep

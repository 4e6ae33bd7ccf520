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

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

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

// Persistent workers for many short loops in a row (a decode step runs about 200
// matrix-vector products of a fraction of a millisecond each, where parallel_for's thread start
// per loop would cost as much as the work). run() splits [0, n) exactly as parallel_for does
// (min(threads, n) chunks, the same ranges and worker indices, the caller running chunk 0, the
// lowest worker's exception rethrown), so results do not depend on which of the two ran a loop.
// Workers spin for about 200 microseconds after a job, then sleep until the next. Workers that
// could not start (std::system_error) leave their chunks to the caller. A run() from inside a
// worker, or while another thread is in run(), goes to parallel_for instead.
class WorkerPool {
 public:
  explicit WorkerPool(int threads = 0);  // 0: all cores; <0: std::invalid_argument
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return threads_; }

  template <class F>
  void run(int64_t n, F&& body) {
    using Body = std::remove_reference_t<F>;
    run_impl(
        n,
        [](void* ctx, int64_t begin, int64_t end, int worker) {
          (*static_cast<Body*>(ctx))(begin, end, worker);
        },
        const_cast<void*>(static_cast<const void*>(&body)));
  }

 private:
  void run_impl(int64_t n, detail::ChunkFn fn, void* ctx);
  void worker_loop(int w);

  int threads_;
  std::vector<std::thread> workers_;  // worker w is workers_[w - 1]
  std::mutex busy_;
  std::atomic<uint32_t> generation_{0};  // 32 bits: a futex word
  std::atomic<int> pending_{0};
  bool stop_ = false;
  // The current job (written before generation_ is bumped, read after it is seen).
  int64_t n_ = 0;
  int chunks_ = 0;
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::vector<std::exception_ptr> err_;
};

}  // namespace scalesweep

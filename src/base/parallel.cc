#include "scalesweep/base/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace scalesweep {
namespace {
std::atomic<int> g_start_limit{-1};

// Starts a thread, or throws std::system_error (a real failure, or the test seam's).
std::thread start_thread(void (*run)(void*, int), void* state, int worker) {
  int left = g_start_limit.load();
  while (left >= 0) {
    if (left == 0)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "parallel_for: thread start limit (test seam)");
    if (g_start_limit.compare_exchange_weak(left, left - 1)) break;
  }
  return std::thread(run, state, worker);
}

struct State {
  int64_t n;
  int chunks;
  detail::ChunkFn fn;
  void* ctx;
  std::vector<std::exception_ptr> err;
};

void run_chunk(void* p, int w) {
  auto* s = static_cast<State*>(p);
  try {
    s->fn(s->ctx, s->n * w / s->chunks, s->n * (w + 1) / s->chunks, w);
  } catch (...) {
    s->err[static_cast<size_t>(w)] = std::current_exception();
  }
}
}  // namespace

int hardware_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return std::clamp(static_cast<int>(std::min<unsigned>(hc, kMaxHardwareThreads)), 1,
                    kMaxHardwareThreads);
}

int resolve_threads(int threads, const char* what) {
  if (threads < 0)
    throw std::invalid_argument(std::string(what) + " must be >= 0 (0 = all cores), got " +
                                std::to_string(threads));
  return threads == 0 ? hardware_threads() : threads;
}

namespace detail {
int set_thread_start_limit(int starts) { return g_start_limit.exchange(starts < 0 ? -1 : starts); }

void parallel_for_impl(int64_t n, int threads, ChunkFn fn, void* ctx) {
  if (n <= 0) return;
  const int chunks = static_cast<int>(std::min<int64_t>(resolve_threads(threads), n));
  if (chunks == 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  State s{n, chunks, fn, ctx, std::vector<std::exception_ptr>(static_cast<size_t>(chunks))};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(chunks - 1));
  int started = 1;
  for (; started < chunks; ++started) {
    try {
      pool.push_back(start_thread(run_chunk, &s, started));
    } catch (const std::system_error&) {
      break;  // no thread to be had: this chunk and the rest run on the calling thread
    }
  }
  run_chunk(&s, 0);
  for (int w = started; w < chunks; ++w) run_chunk(&s, w);
  for (auto& th : pool) th.join();
  for (auto& e : s.err)
    if (e) std::rethrow_exception(e);
}
}  // namespace detail

namespace {
thread_local bool t_in_pool_worker = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins while `a` holds `old` for about 200 microseconds, then sleeps on it (futex). Past the
// first 64 spins it yields between checks, so that on an oversubscribed machine the thread it
// waits for can run on this core (pausing longer made a 2-core machine under load 2.2x slower
// in decode).
template <typename T>
void await_change(const std::atomic<T>& a, T old) {
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 1; a.load(std::memory_order_acquire) == old; ++i) {
    if (i < 64)
      cpu_relax();
    else
      std::this_thread::yield();
    if ((i & 15) == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(200)) {
      while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
      return;
    }
  }
}
}  // namespace

WorkerPool::WorkerPool(int threads) : threads_(resolve_threads(threads)) {
  err_.resize(static_cast<size_t>(threads_));
  for (int w = 1; w < threads_; ++w) {
    try {
      workers_.push_back(start_thread(
          [](void* self, int worker) { static_cast<WorkerPool*>(self)->worker_loop(worker); }, this,
          w));
    } catch (const std::system_error&) {
      break;  // no thread to be had: the caller runs the chunks of the workers that are missing
    }
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(busy_);
    stop_ = true;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

void WorkerPool::worker_loop(int w) {
  t_in_pool_worker = true;
  uint32_t seen = 0;
  for (;;) {
    await_change(generation_, seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    if (w < chunks_) {
      try {
        fn_(ctx_, n_ * w / chunks_, n_ * (w + 1) / chunks_, w);
      } catch (...) {
        err_[static_cast<size_t>(w)] = std::current_exception();
      }
    }
    // Every worker acknowledges every job, so none can still be reading it when the next
    // one is written.
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void WorkerPool::run_impl(int64_t n, detail::ChunkFn fn, void* ctx) {
  if (n <= 0) return;
  const int chunks = static_cast<int>(std::min<int64_t>(threads_, n));
  if (chunks == 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (t_in_pool_worker || !lock.owns_lock() || workers_.empty()) {
    if (lock.owns_lock()) lock.unlock();
    detail::parallel_for_impl(n, threads_, fn, ctx);
    return;
  }
  n_ = n;
  chunks_ = chunks;
  fn_ = fn;
  ctx_ = ctx;
  std::fill(err_.begin(), err_.end(), nullptr);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  // Chunk 0, and those of workers that did not start, on the calling thread.
  for (int w = 0; w < chunks; ++w) {
    if (w != 0 && w <= static_cast<int>(workers_.size())) continue;
    try {
      fn(ctx, n * w / chunks, n * (w + 1) / chunks, w);
    } catch (...) {
      err_[static_cast<size_t>(w)] = std::current_exception();
    }
  }
  for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;)
    await_change(pending_, left);
  for (int w = 0; w < chunks; ++w)
    if (err_[static_cast<size_t>(w)]) std::rethrow_exception(err_[static_cast<size_t>(w)]);
}

}  // namespace scalesweep

#include "scalesweep/base/parallel.h"

#include <algorithm>
#include <atomic>
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

}  // namespace scalesweep

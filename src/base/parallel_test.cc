#include "scalesweep/base/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace scalesweep {
namespace {

// Restores the thread-start limit when a test ends (also on failure).
struct StartLimit {
  explicit StartLimit(int n) : prev(detail::set_thread_start_limit(n)) {}
  ~StartLimit() { detail::set_thread_start_limit(prev); }
  int prev;
};

// Runs parallel_for and checks: every index in [0, n) visited exactly once, chunks contiguous
// and in worker order, worker indices 0..chunks-1 each once, chunks = min(threads, n).
void check_cover(int64_t n, int threads) {
  SCOPED_TRACE("n=" + std::to_string(n) + " threads=" + std::to_string(threads));
  std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::mutex mu;
  std::vector<std::pair<int, std::pair<int64_t, int64_t>>> calls;
  parallel_for(n, threads, [&](int64_t b, int64_t e, int w) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back({w, {b, e}});
  });
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
  const int t = threads == 0 ? hardware_threads() : threads;
  const int64_t chunks = n <= 0 ? 0 : std::min<int64_t>(t, n);
  ASSERT_EQ(static_cast<int64_t>(calls.size()), chunks);
  std::sort(calls.begin(), calls.end());
  for (int64_t w = 0; w < chunks; ++w) {
    const auto& c = calls[static_cast<size_t>(w)];
    EXPECT_EQ(c.first, w);
    EXPECT_EQ(c.second.first, n * w / chunks);
    EXPECT_EQ(c.second.second, n * (w + 1) / chunks);
    EXPECT_LT(c.second.first, c.second.second);  // no empty chunk
  }
}

TEST(ParallelFor, CoversEveryIndexOnce) {
  for (int64_t n : {0, 1, 2, 3, 5, 7, 16, 17, 100, 1023, 4096})
    for (int threads : {0, 1, 2, 3, 4, 7, 8, 16, 33, 100}) check_cover(n, threads);
  check_cover(-5, 4);  // nothing to do: no call
}

TEST(ParallelFor, CoversEveryIndexOnceWithoutThreads) {
  for (int limit : {0, 1, 3}) {
    StartLimit lim(limit);
    for (int64_t n : {1, 5, 64, 1000})
      for (int threads : {2, 4, 9}) check_cover(n, threads);
  }
}

TEST(ParallelFor, SingleChunkRunsOnCaller) {
  const auto me = std::this_thread::get_id();
  std::thread::id seen;
  parallel_for(1000, 1, [&](int64_t, int64_t, int) { seen = std::this_thread::get_id(); });
  EXPECT_EQ(seen, me);
  parallel_for(1, 8, [&](int64_t, int64_t, int) { seen = std::this_thread::get_id(); });
  EXPECT_EQ(seen, me);
  // No thread start at all: with the start limit at 0, a single chunk must not even try.
  StartLimit lim(0);
  std::set<std::thread::id> ids;
  std::mutex mu;
  parallel_for(100, 4, [&](int64_t, int64_t, int) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids, std::set<std::thread::id>{me});  // every chunk fell back to the caller
}

TEST(ParallelFor, ThreadsActuallyUsed) {
  std::set<std::thread::id> ids;
  std::mutex mu;
  parallel_for(4, 4, [&](int64_t, int64_t, int) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 4u);
}

TEST(ParallelFor, PartialThreadStartFailure) {
  // Two threads start, the third fails: chunks 3.. run on the caller, all results present.
  StartLimit lim(2);
  std::vector<int> out(8, -1);
  std::set<std::thread::id> ids;
  std::mutex mu;
  parallel_for(8, 8, [&](int64_t b, int64_t e, int w) {
    for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = w;
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(out, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ids.size(), 3u);  // caller + the two that started
}

TEST(ParallelFor, WorkerExceptionsReachTheCaller) {
  for (int limit : {-1, 0, 1}) {
    StartLimit lim(limit);
    SCOPED_TRACE("start limit " + std::to_string(limit));
    // Thrown in a worker other than the caller's chunk.
    EXPECT_THROW(parallel_for(100, 4,
                              [](int64_t b, int64_t, int) {
                                if (b >= 50) throw std::runtime_error("late");
                              }),
                 std::runtime_error);
    // Several chunks throw: the lowest worker index wins, whatever finished first.
    try {
      parallel_for(100, 4, [](int64_t, int64_t, int w) {
        if (w >= 1) throw std::out_of_range("worker " + std::to_string(w));
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::out_of_range& e) {
      EXPECT_STREQ(e.what(), "worker 1");
    }
    // The caller's own chunk throws: the other chunks still run and are joined first.
    std::atomic<int> done{0};
    EXPECT_THROW(parallel_for(100, 4,
                              [&](int64_t, int64_t, int w) {
                                if (w == 0) throw std::logic_error("first");
                                done.fetch_add(1);
                              }),
                 std::logic_error);
    EXPECT_EQ(done.load(), 3);
  }
  // Single chunk: the exception passes straight through.
  EXPECT_THROW(parallel_for(10, 1, [](int64_t, int64_t, int) { throw std::runtime_error("x"); }),
               std::runtime_error);
}

TEST(ParallelFor, ThreadCounts) {
  EXPECT_GE(hardware_threads(), 1);
  EXPECT_LE(hardware_threads(), kMaxHardwareThreads);
  EXPECT_EQ(resolve_threads(0), hardware_threads());
  EXPECT_EQ(resolve_threads(5), 5);
  try {
    resolve_threads(-1, "--threads");
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--threads must be >= 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parallel_for(10, -2, [](int64_t, int64_t, int) {}), std::invalid_argument);
}

// A chunked float reduction: fixed blocks of 64 summed per block (each block inside one call),
// then the block sums added in order on the caller. Same bits for every thread count, with and
// without thread-start failures; a per-worker partial sum would not be.
TEST(ParallelFor, ChunkedReductionIsDeterministic) {
  const int64_t n = 100003, block = 64, nb = (n + block - 1) / block;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = u(rng) * std::exp2(static_cast<float>(rng() % 40) - 20.0f);
  auto reduce = [&](int threads) {
    std::vector<float> part(static_cast<size_t>(nb));
    parallel_for(nb, threads, [&](int64_t b0, int64_t b1, int) {
      for (int64_t b = b0; b < b1; ++b) {
        float s = 0;
        for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
          s += x[static_cast<size_t>(i)];
        part[static_cast<size_t>(b)] = s;
      }
    });
    float s = 0;
    for (float p : part) s += p;
    return s;
  };
  const float ref = reduce(1);
  for (int t : {0, 2, 3, 5, 8, 13, 64, 2000}) EXPECT_EQ(reduce(t), ref) << t << " threads";
  StartLimit lim(1);
  EXPECT_EQ(reduce(7), ref);
}

// WorkerPool::run splits as parallel_for does, for every pool size and n, job after job.
TEST(WorkerPool, SameChunksAsParallelFor) {
  for (int threads : {1, 2, 3, 5, 8}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 16, 100, 1023})
      for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE("threads " + std::to_string(threads) + " n " + std::to_string(n));
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        std::vector<std::pair<int, std::pair<int64_t, int64_t>>> calls;
        pool.run(n, [&](int64_t b, int64_t e, int w) {
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          calls.push_back({w, {b, e}});
        });
        for (auto& h : hits) ASSERT_EQ(h.load(), 1);
        const int64_t chunks = std::min<int64_t>(threads, n);
        ASSERT_EQ(static_cast<int64_t>(calls.size()), chunks);
        std::sort(calls.begin(), calls.end());
        for (int64_t w = 0; w < chunks; ++w) {
          EXPECT_EQ(calls[static_cast<size_t>(w)].first, w);
          EXPECT_EQ(calls[static_cast<size_t>(w)].second.first, n * w / chunks);
          EXPECT_EQ(calls[static_cast<size_t>(w)].second.second, n * (w + 1) / chunks);
        }
      }
  }
  EXPECT_THROW(WorkerPool(-1), std::invalid_argument);
}

// Many tiny jobs in a row (the decode pattern), with pauses long enough for the workers to go
// to sleep between some of them.
TEST(WorkerPool, ManyShortJobsAndSleeps) {
  WorkerPool pool(3);
  std::vector<int64_t> sum(3);
  int64_t want = 0;
  for (int j = 0; j < 20000; ++j) {
    pool.run(3, [&](int64_t b, int64_t, int w) { sum[static_cast<size_t>(w)] += b + j; });
    want += 0 + 1 + 2 + 3 * j;
    if (j % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(sum[0] + sum[1] + sum[2], want);
}

TEST(WorkerPool, ThreadsActuallyUsedAndStartFailures) {
  {
    WorkerPool pool(4);
    std::set<std::thread::id> ids;
    std::mutex mu;
    pool.run(4, [&](int64_t, int64_t, int) {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    EXPECT_EQ(ids.size(), 4u);
  }
  // One worker starts, the others fail: their chunks run on the caller, same ranges.
  StartLimit lim(1);
  WorkerPool pool(4);
  std::vector<int> out(8, -1);
  std::set<std::thread::id> ids;
  std::mutex mu;
  pool.run(8, [&](int64_t b, int64_t e, int w) {
    for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = w;
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(out, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(ids.size(), 2u);  // the caller and the one worker
}

TEST(WorkerPool, ExceptionsAndNesting) {
  WorkerPool pool(4);
  try {
    pool.run(100, [](int64_t, int64_t, int w) {
      if (w >= 1) throw std::out_of_range("worker " + std::to_string(w));
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "worker 1");
  }
  EXPECT_THROW(pool.run(100,
                        [](int64_t, int64_t, int w) {
                          if (w == 0) throw std::logic_error("first");
                        }),
               std::logic_error);
  // The pool still works after exceptions, and a run inside a worker (nested) completes
  // through parallel_for.
  std::atomic<int64_t> total{0};
  pool.run(4, [&](int64_t, int64_t, int) {
    pool.run(10, [&](int64_t b, int64_t e, int) { total.fetch_add(e - b); });
  });
  EXPECT_EQ(total.load(), 40);
  // Two threads running jobs on one pool at once: one gets the pool, the other parallel_for.
  std::atomic<int64_t> both{0};
  std::thread other([&] {
    for (int i = 0; i < 200; ++i)
      pool.run(64, [&](int64_t b, int64_t e, int) { both.fetch_add(e - b); });
  });
  for (int i = 0; i < 200; ++i)
    pool.run(64, [&](int64_t b, int64_t e, int) { both.fetch_add(e - b); });
  other.join();
  EXPECT_EQ(both.load(), 2 * 200 * 64);
}

}  // namespace
}  // namespace scalesweep

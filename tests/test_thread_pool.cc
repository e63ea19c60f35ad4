// The pool runs every index exactly once, in fixed contiguous chunks, across many back-to-back loops
// (the spin path) and after workers went to sleep (the condition-variable path).
#include <atomic>
#include <vector>

#include "engine/thread_pool.h"
#include "test_support.h"

using namespace towers;

namespace {
void check_covers(ThreadPool& pool, size_t n) {
  std::vector<std::atomic<int>> hits(n);
  std::vector<std::pair<size_t, size_t>> chunk(pool.size(), {0, 0});
  pool.parallel_for(n, [&](size_t b, size_t e, int t) {
    chunk[t] = {b, e};
    for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  for (size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
  // Chunks are a pure function of (n, threads): thread t owns [n*t/T, n*(t+1)/T).
  if (n > 1) {
    for (int t = 0; t < pool.size(); ++t) {
      size_t b = n * t / pool.size(), e = n * (t + 1) / pool.size();
      if (b < e) CHECK(chunk[t] == std::make_pair(b, e));
    }
  }
}
}  // namespace

TEST_CASE("parallel_for covers every index below n exactly once for every size and thread count") {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (size_t n : {0, 1, 2, 3, 7, 8, 9, 100, 4097}) check_covers(pool, n);
  }
}

TEST_CASE("thousands of back-to-back loops neither lose nor repeat work") {
  ThreadPool pool(4);
  std::atomic<long> total{0};
  for (int round = 0; round < 5000; ++round) {
    pool.parallel_for(16, [&](size_t b, size_t e, int) { total.fetch_add(static_cast<long>(e - b)); });
  }
  CHECK(total.load() == 5000L * 16);
}

TEST_CASE("pools start and stop cleanly, including with workers asleep") {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    if (i % 2) check_covers(pool, 10);
  }
}

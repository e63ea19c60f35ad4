// The pool runs every index exactly once, in fixed contiguous chunks (parallel_for) or in chunks
// handed out on demand (parallel_dynamic), across many back-to-back loops (the spin path) and after
// workers went to sleep (the condition-variable path).
#include <atomic>
#include <chrono>
#include <vector>

#include "engine/base/thread_pool.h"
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

TEST_CASE("parallel_dynamic covers every index exactly once, in pieces (more than one per thread, far fewer than n)") {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 2, 3, 7, 100, 4097, 100000}) {
      CAPTURE(threads);
      CAPTURE(n);
      std::vector<std::atomic<int>> hits(n);
      std::atomic<size_t> calls{0}, bad_thread{0};
      pool.parallel_dynamic(n, [&](size_t b, size_t e, int t) {
        if (t < 0 || t >= pool.size() || b >= e) bad_thread.fetch_add(1);
        calls.fetch_add(1);
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      CHECK(bad_thread.load() == 0);
      for (size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
      // One call for a single thread; with more, guided chunks: more than one per thread for big n,
      // but far fewer than n.
      if (threads == 1 && n > 0) CHECK(calls.load() == 1);
      if (threads > 1 && n >= 4097) CHECK(calls.load() > static_cast<size_t>(threads));
      if (n >= 4097) CHECK(calls.load() < n / 16);
    }
  }
}

TEST_CASE("parallel_dynamic: an idle thread takes over the unclaimed part of a stalled thread's range") {
  // The caller (thread 0) stalls inside its first piece until every other index is done. That can
  // only happen if thread 1, after its own half, steals the rest of thread 0's half.
  ThreadPool pool(2);
  const size_t n = 1000;
  std::atomic<size_t> done{0};
  std::atomic<bool> timed_out{false};
  std::atomic<size_t> first_piece{0};
  pool.parallel_dynamic(n, [&](size_t b, size_t e, int t) {
    if (t == 0 && first_piece.load() == 0) {
      first_piece.store(e - b);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (done.load() < n - (e - b)) {
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out.store(true);
          break;
        }
      }
    }
    done.fetch_add(e - b);
  });
  CHECK_FALSE(timed_out.load());
  CHECK(done.load() == n);
  CHECK(first_piece.load() < n / 2);  // a piece, not the whole half
}

TEST_CASE("more threads than cores: late workers are taken off, work is done once, thread indices never overlap") {
  // 16 threads on a machine with fewer cores: many workers are descheduled when a loop starts, so
  // the caller takes over their parts. Every index must still run exactly once, and no two calls may
  // run with the same thread index at once (callers keep per-thread scratch by that index).
  ThreadPool pool(16);
  std::vector<std::atomic<int>> busy(16);
  std::atomic<int> overlap{0};
  for (int round = 0; round < 400; ++round) {
    const size_t n = 1 + static_cast<size_t>(round) * 37 % 500;
    std::vector<std::atomic<int>> hits(n);
    const ThreadPool::Body body = [&](size_t b, size_t e, int t) {
      if (busy[t].exchange(1) != 0) overlap.fetch_add(1);
      for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      busy[t].store(0);
    };
    if (round % 2) {
      pool.parallel_dynamic(n, body);
    } else {
      pool.parallel_for(n, body);
    }
    for (size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
  }
  CHECK(overlap.load() == 0);
  MESSAGE("late workers taken off: " << pool.late_workers() << " (of 400 loops x 15 workers)");
}

TEST_CASE("static and dynamic loops alternate back to back without losing work") {
  ThreadPool pool(3);
  std::atomic<long> total{0};
  for (int round = 0; round < 3000; ++round) {
    const ThreadPool::Body body = [&](size_t b, size_t e, int) { total.fetch_add(static_cast<long>(e - b)); };
    if (round % 2) {
      pool.parallel_dynamic(37, body);
    } else {
      pool.parallel_for(37, body);
    }
  }
  CHECK(total.load() == 3000L * 37);
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

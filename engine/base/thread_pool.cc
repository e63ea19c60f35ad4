#include "engine/base/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace towers {
namespace {
// How long an idle worker polls for the next loop before it goes to sleep.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  slots_ = std::vector<Slot>(static_cast<size_t>(n_threads_));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(size_t n, const Body& fn) { run(n, fn, false); }
void ThreadPool::parallel_dynamic(size_t n, const Body& fn) {
  run(n, fn, n < (uint64_t{1} << 32));  // ranges are packed in 32 bits each
}

namespace {
constexpr uint64_t pack_range(uint64_t front, uint64_t end) { return front << 32 | end; }
}  // namespace

// This thread's part of the published loop.
void ThreadPool::work(int index) {
  if (!dynamic_) {
    const size_t begin = chunk_begin(n_, index), end = chunk_begin(n_, index + 1);
    if (begin < end) (*body_)(begin, end, index);
    return;
  }
  // Own range: claim a quarter of what is left at a time, so pieces shrink toward the end and the
  // part still open to thieves stays large.
  std::atomic<uint64_t>& own = slots_[index].range;
  uint64_t cur = own.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t f = cur >> 32, e = cur & 0xffffffffu;
    if (f >= e) break;
    const uint64_t c = std::max<uint64_t>(1, (e - f) / 4);
    if (own.compare_exchange_weak(cur, pack_range(f + c, e), std::memory_order_acq_rel)) {
      (*body_)(f, f + c, index);
      cur = own.load(std::memory_order_acquire);
    }
  }
  // Then steal the back half of another thread's unclaimed indices until none are left.
  for (int k = 1; k < n_threads_; ++k) {
    std::atomic<uint64_t>& other = slots_[(index + k) % n_threads_].range;
    cur = other.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t f = cur >> 32, e = cur & 0xffffffffu;
      if (f >= e) break;
      const uint64_t c = std::max<uint64_t>(1, (e - f) / 2);
      if (other.compare_exchange_weak(cur, pack_range(f, e - c), std::memory_order_acq_rel)) {
        (*body_)(e - c, e, index);
        cur = other.load(std::memory_order_acquire);
      }
    }
  }
}

void ThreadPool::run(size_t n, const Body& fn, bool dynamic) {
  if (n_threads_ == 1 || n <= 1) {
    if (n) fn(0, n, 0);
    return;
  }
  {
    std::lock_guard lock(mu_);
    body_ = &fn;
    n_ = n;
    dynamic_ = dynamic;
    for (int t = 0; t < n_threads_; ++t) {
      if (dynamic) slots_[t].range.store(pack_range(chunk_begin(n, t), chunk_begin(n, t + 1)), std::memory_order_relaxed);
      if (t > 0) slots_[t].state.store(kAssigned, std::memory_order_release);
    }
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) start_cv_.notify_all();
  work(0);  // dynamic: this also steals whatever the others have not claimed
  for (int t = 1; t < n_threads_; ++t) {
    int expected = kAssigned;
    if (slots_[t].state.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) {
      // Worker t has not started: its part is ours (dynamic: nothing is left of it by now).
      late_.fetch_add(1, std::memory_order_relaxed);
      if (!dynamic) {
        const size_t begin = chunk_begin(n, t), end = chunk_begin(n, t + 1);
        if (begin < end) fn(begin, end, t);
      }
      continue;
    }
    while (slots_[t].state.load(std::memory_order_acquire) != kDone) cpu_relax();
    slots_[t].state.store(kIdle, std::memory_order_relaxed);
  }
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Poll for a new loop, then sleep until one is published.
    auto deadline = std::chrono::steady_clock::now() + kSpin;
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
      cpu_relax();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
        std::unique_lock lock(mu_);
        sleepers_.fetch_add(1);
        start_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    if (stop_.load()) return;
    // Joining is the move kAssigned -> kRunning; the loop's fields were written before the state's
    // release store and stay unchanged until this worker reports kDone. If the caller took this
    // part over already, the state is kIdle (or kAssigned again, for a newer loop: then this joins
    // that one, which is as correct).
    seen = generation_.load(std::memory_order_acquire);
    int expected = kAssigned;
    if (slots_[index].state.compare_exchange_strong(expected, kRunning, std::memory_order_acq_rel)) {
      work(index);
      slots_[index].state.store(kDone, std::memory_order_release);
    }
  }
}

}  // namespace towers

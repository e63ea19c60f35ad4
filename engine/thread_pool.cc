#include "engine/thread_pool.h"

#include <algorithm>

namespace towers {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_chunk(const ThreadPool::Body& body, size_t n, int n_threads, int index) {
  size_t begin = n * index / n_threads;
  size_t end = n * (index + 1) / n_threads;
  if (begin < end) body(begin, end, index);
}

void ThreadPool::parallel_for(size_t n, const Body& fn) {
  if (n_threads_ == 1 || n <= 1) {
    if (n) fn(0, n, 0);
    return;
  }
  {
    std::lock_guard lock(mu_);
    body_ = &fn;
    n_ = n;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  run_chunk(fn, n, n_threads_, 0);
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const Body* body;
    size_t n;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      body = body_;
      n = n_;
    }
    run_chunk(*body, n, n_threads_, index);
    {
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace towers

// A mutex that knows its owner in debug builds, so methods named *_locked can assert that the caller
// holds it (LevelDB's port::Mutex::AssertHeld). Release builds carry no extra state or cost.
#pragma once
#include <atomic>
#include <cassert>
#include <mutex>
#include <thread>

namespace towers {

class Mutex {
 public:
  void lock() {
    mu_.lock();
#ifndef NDEBUG
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
  }
  void unlock() {
#ifndef NDEBUG
    owner_.store(std::thread::id(), std::memory_order_relaxed);
#endif
    mu_.unlock();
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
#ifndef NDEBUG
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
    return true;
  }
  void assert_held() const {
#ifndef NDEBUG
    assert(owner_.load(std::memory_order_relaxed) == std::this_thread::get_id() && "the caller must hold this mutex");
#endif
  }

 private:
  std::mutex mu_;
#ifndef NDEBUG
  std::atomic<std::thread::id> owner_{};
#endif
};

}  // namespace towers

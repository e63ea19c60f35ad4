// Locks whose holder must not wait. A thread that holds a NoWaitMutex (the daemon's catalog lock) must
// not wait for the disk or run the model while it does: every thread that needs the lock next — the
// scheduler preparing or finishing a turn — would wait for that work too, and its streams with it.
// The places that wait or compute call check_may_wait(): the record log's synchronous append and
// compaction (daemon/state_store.h), the forward pass (engine/model/forward.h) and the segment pool's
// calls that do file I/O or copy KV (mmapstore/segment_pool.h).
//
// Every build counts, per thread, the NoWaitMutexes held (a thread-local integer: no cost worth a
// switch). A violation is counted (lock_rule_violations()) and, in debug builds (no NDEBUG), aborts
// with the place named — unless a test installed a hook, which then gets it instead.
#pragma once
#include <cstdint>
#include <mutex>

namespace towers {

namespace detail {
inline thread_local int no_wait_locks_held = 0;
void lock_rule_broken(const char* what);
}  // namespace detail

class NoWaitMutex {
 public:
  void lock() {
    mu_.lock();
    ++detail::no_wait_locks_held;
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    ++detail::no_wait_locks_held;
    return true;
  }
  void unlock() {
    --detail::no_wait_locks_held;
    mu_.unlock();
  }

 private:
  std::mutex mu_;
};

// How many NoWaitMutexes this thread holds.
inline int no_wait_locks_held() { return detail::no_wait_locks_held; }

// Called by `what` before it waits or computes: a violation when this thread holds a NoWaitMutex.
inline void check_may_wait(const char* what) {
  if (detail::no_wait_locks_held != 0) detail::lock_rule_broken(what);
}

// Violations so far (every build).
uint64_t lock_rule_violations();
// Tests: `hook` gets each violation instead of the debug abort; nullptr restores the default.
// Returns the previous hook.
using LockRuleHook = void (*)(const char* what);
LockRuleHook set_lock_rule_hook(LockRuleHook hook);

}  // namespace towers

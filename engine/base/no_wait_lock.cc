#include "engine/base/no_wait_lock.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace towers {

namespace {
std::atomic<uint64_t> g_violations{0};
std::atomic<LockRuleHook> g_hook{nullptr};
}  // namespace

void detail::lock_rule_broken(const char* what) {
  g_violations.fetch_add(1, std::memory_order_relaxed);
  if (LockRuleHook hook = g_hook.load()) return hook(what);
#ifndef NDEBUG
  std::fprintf(stderr, "lock rule broken: %s runs while this thread holds a lock whose holder must not wait "
               "(engine/base/no_wait_lock.h)\n", what);
  std::abort();
#endif
}

uint64_t lock_rule_violations() { return g_violations.load(std::memory_order_relaxed); }

LockRuleHook set_lock_rule_hook(LockRuleHook hook) { return g_hook.exchange(hook); }

}  // namespace towers

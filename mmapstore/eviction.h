// Which resident segments leave RAM first: the eviction policy as a pure function of a snapshot.
//
// The pool (or a simulation: bench/bench_policy.cc) describes every resident segment as an
// EvictionCandidate; eviction_order() returns the ones that may leave, in the order they should.
// No locks, no clocks, no pool: what it decides is a function of its arguments only, so it is tested
// on hand-built entries (tests/test_eviction.cc).
//
// Never leaving, whatever the policy: segments pinned by the operator, segments leased right now,
// segments with fan-out >= pin_fan_out (a base that many segments were computed under is read by all
// of them), and the top `pinned_levels` levels of the hierarchy (level pinning: 1 keeps every platform
// segment, 2 also the communities, ...). Evicting for good (no warm tier) also needs a leaf.
//
// Policies (docs/store.md, "Eviction policies", has the trace benchmark that compares them):
//  - lru: least recently used first.
//  - lindy: what has been in use longer is expected to stay in use longer (the Lindy effect), where
//    a segment's age is the age of what it belongs to, its *lineage* (a session for its transcript
//    turns; the bot for the shared platform/community/bot segments), not the segment's own creation
//    time: a long-lived session's newest turn is as old as the session. Keep score
//        lineage_uses * a / (a + idle),   a = last_used - lineage_born + lindy_prior_age
//    a / (a + idle) is the chance a lineage with Pareto(alpha = 1) lifetimes that has lived `a` is
//    still alive after `idle` without a use (old lineages survive long silences, young ones do not);
//    lineage_uses is Lindy counted in uses (used U times: expect about U more). The prior age keeps
//    a session that has just started from counting as dead. Lowest score leaves first.
//  - token-lru: the token-aware LRU of seed 004 (shared/seeds/paged-kv-rag-structures.md, §3.1 and
//    B.1), "priority = recency / tokens, evict the minimum", with a cumulative budget. The seed's
//    recency is a timestamp, whose origin would change the order; we take recency = 1 / idle, so the
//    priority is 1 / (idle * tokens) and the segment with the largest idle * tokens leaves first:
//    of two equally idle segments the longer one goes (it frees more), and a short segment has to
//    be proportionally staler to go. The cumulative budget is the caller's loop (choose_victims):
//    take victims in this order until the bytes to free are covered. Tokens, not bytes, as the seed
//    says: a Q4 platform token and an F16 transcript token weigh the same here, although the budget
//    they are freed from is counted in bytes.
// Ties break on more bytes first, then the smaller id, so the order is total and reproducible.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "mmapstore/cache_trie.h"

namespace towers {

enum class EvictionPolicy {
  Lru,       // least recently used first
  Lindy,     // youngest lineage first, by age and use count (see above)
  TokenLru,  // largest idle time x tokens first (seed 004)
};
std::string_view to_string(EvictionPolicy p);  // "lru", "lindy", "token-lru"
std::optional<EvictionPolicy> parse_eviction_policy(std::string_view s);
inline constexpr std::string_view kEvictionPolicyNames = "lru, lindy or token-lru";  // for error messages

using EvictionClock = std::chrono::steady_clock;

// One resident segment, as the policy sees it.
struct EvictionCandidate {
  SegmentId id = kNoSegment;
  size_t bytes = 0;                  // RAM freed when it leaves
  int64_t tokens = 0;
  size_t depth = 0;                  // level in the hierarchy: 0 = top (platform)
  bool pinned = false;               // by the operator
  uint64_t leases = 0;               // leases holding it now (the trie's refcount)
  size_t fan_out = 0;                // segments directly below it
  bool has_children = false;         // anything below it at all (only leaves can be evicted for good)
  EvictionClock::time_point created, last_used;
  uint64_t uses = 0;                 // leases that used it
  // What it belongs to: its session, or its bot for shared segments. 0: none, the segment is its own
  // lineage (lineage_born and lineage_uses are then ignored: `created` and `uses` stand for them).
  uint64_t lineage = 0;
  EvictionClock::time_point lineage_born;  // when that lineage first appeared
  uint64_t lineage_uses = 0;               // leases of the whole lineage
};

struct EvictionRules {
  EvictionPolicy policy = EvictionPolicy::Lru;
  EvictionClock::time_point now;     // idle times are measured to here
  size_t pin_fan_out = 8;            // fan-out >= this: never evicted (0: no fan-out pinning)
  size_t pinned_levels = 0;          // depth < this: never evicted
  bool leaves_only = false;          // evicting for good (no warm tier): segments without children only
  EvictionClock::duration lindy_prior_age = std::chrono::seconds(60);
};

// Whether the rules let this segment leave at all.
bool evictable(const EvictionCandidate& c, const EvictionRules& rules);

// The evictable candidates' ids, first to leave first.
std::vector<SegmentId> eviction_order(std::span<const EvictionCandidate> candidates, const EvictionRules& rules);

// The shortest prefix of eviction_order whose bytes add up to at least `bytes_to_free` (all of the
// order when they never do: everything else is pinned or leased).
std::vector<SegmentId> choose_victims(std::span<const EvictionCandidate> candidates, const EvictionRules& rules,
                                      size_t bytes_to_free);

}  // namespace towers

// Eviction policies as a pure function (mmapstore/eviction.h): each policy's order on hand-built
// entries, what never leaves (pins, leases, fan-out, levels, non-leaves), Lindy's lineage age rule and
// token-lru's weighting by tokens.
#include <doctest/doctest.h>

#include "mmapstore/eviction.h"

using namespace towers;
using std::chrono::seconds;

namespace {

const EvictionClock::time_point t0{};
EvictionClock::time_point at(int s) { return t0 + seconds(s); }

// A resident segment created at `created` and last used at `used` (seconds), 1 KiB, 10 tokens.
EvictionCandidate seg(SegmentId id, int created, int used) {
  EvictionCandidate c;
  c.id = id;
  c.bytes = 1024;
  c.tokens = 10;
  c.depth = 3;
  c.created = at(created);
  c.last_used = at(used);
  c.uses = 1;
  return c;
}

// ... belonging to a lineage born at `born` and used `uses` times.
EvictionCandidate in_lineage(EvictionCandidate c, uint64_t lineage, int born, uint64_t uses) {
  c.lineage = lineage;
  c.lineage_born = at(born);
  c.lineage_uses = uses;
  return c;
}

EvictionRules rules(EvictionPolicy p, int now) {
  EvictionRules r;
  r.policy = p;
  r.now = at(now);
  return r;
}

using Ids = std::vector<SegmentId>;

}  // namespace

TEST_CASE("policy names round-trip and unknown names are refused") {
  for (EvictionPolicy p : {EvictionPolicy::Lru, EvictionPolicy::Lindy, EvictionPolicy::TokenLru}) {
    CHECK(parse_eviction_policy(to_string(p)) == p);
  }
  CHECK(to_string(EvictionPolicy::TokenLru) == "token-lru");
  CHECK_FALSE(parse_eviction_policy("LRU").has_value());
  CHECK_FALSE(parse_eviction_policy("token_lru").has_value());
  CHECK_FALSE(parse_eviction_policy("").has_value());
}

TEST_CASE("lru: least recently used first, whatever the creation time") {
  const std::vector<EvictionCandidate> c = {seg(1, 0, 50), seg(2, 40, 10), seg(3, 5, 90), seg(4, 30, 30)};
  CHECK(eviction_order(c, rules(EvictionPolicy::Lru, 100)) == Ids{2, 4, 1, 3});
}

TEST_CASE("ties break on more bytes first, then the smaller id") {
  std::vector<EvictionCandidate> c = {seg(7, 0, 10), seg(3, 0, 10), seg(5, 0, 10)};
  c[2].bytes = 4096;
  for (EvictionPolicy p : {EvictionPolicy::Lru, EvictionPolicy::Lindy, EvictionPolicy::TokenLru}) {
    CHECK(eviction_order(c, rules(p, 20)) == Ids{5, 3, 7});
  }
}

TEST_CASE("pinned, leased, wide and top-level segments never leave") {
  std::vector<EvictionCandidate> c = {seg(1, 0, 0), seg(2, 0, 1), seg(3, 0, 2), seg(4, 0, 3), seg(5, 0, 4)};
  c[0].pinned = true;
  c[1].leases = 1;
  c[2].fan_out = 8;
  c[3].depth = 0;
  EvictionRules r = rules(EvictionPolicy::Lru, 10);
  r.pinned_levels = 1;
  CHECK(eviction_order(c, r) == Ids{5});
  r.pin_fan_out = 9;  // 8 children are no longer enough
  CHECK(eviction_order(c, r) == Ids{3, 5});
  r.pin_fan_out = 0;  // no fan-out pinning at all
  r.pinned_levels = 0;
  CHECK(eviction_order(c, r) == Ids{3, 4, 5});
}

TEST_CASE("evicting for good takes leaves only") {
  std::vector<EvictionCandidate> c = {seg(1, 0, 0), seg(2, 0, 5)};
  c[0].has_children = true;
  EvictionRules r = rules(EvictionPolicy::Lru, 10);
  CHECK(eviction_order(c, r) == Ids{1, 2});
  r.leaves_only = true;
  CHECK(eviction_order(c, r) == Ids{2});
}

TEST_CASE("token-lru: idle time x tokens, largest first") {
  // Equally idle: the longer segment goes first (LRU has nothing to choose by but the tie-break).
  std::vector<EvictionCandidate> c = {seg(1, 0, 50), seg(2, 0, 50)};
  c[0].tokens = 10;
  c[1].tokens = 100;
  CHECK(eviction_order(c, rules(EvictionPolicy::TokenLru, 60)) == Ids{2, 1});
  // A short segment has to be proportionally staler: 10 tokens idle 50 s (500) stay while 100 tokens
  // idle 10 s (1000) go, where LRU takes the staler one first...
  c = {seg(1, 0, 10), seg(2, 0, 50)};
  c[0].tokens = 10;
  c[1].tokens = 100;
  CHECK(eviction_order(c, rules(EvictionPolicy::TokenLru, 60)) == Ids{2, 1});
  CHECK(eviction_order(c, rules(EvictionPolicy::Lru, 60)) == Ids{1, 2});
  // ... and 10 tokens idle 200 s (2000) are stale enough to go first.
  c[0].last_used = at(-140);
  CHECK(eviction_order(c, rules(EvictionPolicy::TokenLru, 60)) == Ids{1, 2});
}

TEST_CASE("lindy: a long-lived session's newest turn outlives a young session's old turn") {
  // Session 1 started at t=0 and sealed its newest turn at t=990; session 2 started at t=900 and
  // sealed its turn at t=901. Both were used 10 times, last at t=995.
  std::vector<EvictionCandidate> c = {in_lineage(seg(1, 990, 995), 100, 0, 10),     // newest turn, old session
                                      in_lineage(seg(2, 901, 995), 200, 900, 10)};  // old turn, young session
  CHECK(eviction_order(c, rules(EvictionPolicy::Lindy, 1000)) == Ids{2, 1});
  // Aged by its own creation time instead (no lineage), the newest turn would be the first to go.
  for (auto& e : c) e.lineage = 0;
  c[0].uses = c[1].uses = 10;
  CHECK(eviction_order(c, rules(EvictionPolicy::Lindy, 1000)) == Ids{1, 2});
}

TEST_CASE("lindy: silence longer than the lineage's age counts against it, and uses count for it") {
  // An old session silent for 9,900 s after living 100 s vs a young one idle for 10 s: same uses.
  std::vector<EvictionCandidate> c = {in_lineage(seg(2, 9900, 9990), 2, 9900, 5), in_lineage(seg(1, 0, 100), 1, 0, 5)};
  CHECK(eviction_order(c, rules(EvictionPolicy::Lindy, 10000)) == Ids{1, 2});
  // Same ages and idle times: the lineage used more often stays.
  c = {in_lineage(seg(1, 0, 90), 10, 0, 50), in_lineage(seg(2, 0, 90), 20, 0, 3)};
  CHECK(eviction_order(c, rules(EvictionPolicy::Lindy, 100)) == Ids{2, 1});
  // A lineage that has just started is not dead: its prior age keeps it above a long-silent one.
  c = {in_lineage(seg(1, 0, 10), 10, 0, 1), in_lineage(seg(2, 995, 995), 20, 995, 1)};
  CHECK(eviction_order(c, rules(EvictionPolicy::Lindy, 1000)) == Ids{1, 2});
}

TEST_CASE("choose_victims takes the order's shortest prefix that frees enough bytes") {
  std::vector<EvictionCandidate> c = {seg(1, 0, 10), seg(2, 0, 20), seg(3, 0, 30)};
  c[0].bytes = 100;
  c[1].bytes = 200;
  c[2].bytes = 400;
  const EvictionRules r = rules(EvictionPolicy::Lru, 40);
  CHECK(choose_victims(c, r, 0).empty());
  CHECK(choose_victims(c, r, 100) == Ids{1});
  CHECK(choose_victims(c, r, 101) == Ids{1, 2});
  CHECK(choose_victims(c, r, 300) == Ids{1, 2});
  CHECK(choose_victims(c, r, 5000) == Ids{1, 2, 3});  // not enough: everything evictable
  c[1].leases = 1;
  CHECK(choose_victims(c, r, 101) == Ids{1, 3});
}

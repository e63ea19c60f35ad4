// Cache trie: hand cases for the radix-tree shapes, refcount/evict rules, and property tests against
// a brute-force reference (a map from sequences to ids, scanned linearly).
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "mmapstore/cache_trie.h"

using namespace towers;

namespace {

using Seq = std::vector<int32_t>;
using Step = CacheTrie::Step;

void require_ok(const CacheTrie& t) {
  Status s = t.check_invariants();
  INFO(s.message());
  REQUIRE(s.ok());
}

SegmentId put(CacheTrie& t, const Seq& s, SegmentId id) {
  auto r = t.insert(s, id);
  std::string why = r.ok() ? std::string() : r.error();
  INFO(why);
  REQUIRE(r.ok());
  CHECK(r->inserted);
  CHECK(r->segment == id);
  require_ok(t);
  return id;
}

bool is_proper_prefix(const Seq& a, const Seq& b) {
  return a.size() < b.size() && std::equal(a.begin(), a.end(), b.begin());
}

size_t lcp(const Seq& a, const Seq& b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// The brute-force reference.
struct Reference {
  std::map<Seq, SegmentId> by_seq;
  std::map<SegmentId, Seq> by_id;
  std::map<SegmentId, uint64_t> refs;

  CacheTrie::Match match(const Seq& q) const {
    CacheTrie::Match m;
    size_t last = 0;
    for (size_t len = 1; len <= q.size(); ++len) {
      auto it = by_seq.find(Seq(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(len)));
      if (it != by_seq.end()) {
        m.path.push_back(Step{it->second, last, len});
        last = len;
      }
    }
    for (const auto& [k, id] : by_seq) m.matched = std::max(m.matched, lcp(k, q));
    if (!m.path.empty()) {
      m.length = m.path.back().end;
      m.segment = m.path.back().segment;
    }
    return m;
  }
  bool has_dependents(const Seq& s) const {
    for (const auto& [k, id] : by_seq)
      if (is_proper_prefix(s, k)) return true;
    return false;
  }
  size_t fan_out(const Seq& s) const {
    size_t n = 0;
    for (const auto& [k, id] : by_seq) {
      if (!is_proper_prefix(s, k)) continue;
      bool direct = true;
      for (const auto& [j, jid] : by_seq)
        if (is_proper_prefix(s, j) && is_proper_prefix(j, k)) direct = false;
      n += direct;
    }
    return n;
  }
  size_t depth(const Seq& s) const {
    size_t n = 0;
    for (const auto& [k, id] : by_seq) n += is_proper_prefix(k, s);
    return n;
  }
  // Parent: the longest key that is a proper prefix.
  std::pair<SegmentId, size_t> parent(const Seq& s) const {
    std::pair<SegmentId, size_t> best{kNoSegment, 0};
    for (const auto& [k, id] : by_seq)
      if (is_proper_prefix(k, s) && k.size() >= best.second) best = {id, k.size()};
    return best;
  }
  // Radix-tree node count and stored tokens implied by the key set.
  std::pair<size_t, size_t> shape() const {
    std::map<Seq, std::set<int32_t>> prefixes;  // non-empty prefix -> next tokens
    for (const auto& [k, id] : by_seq)
      for (size_t len = 1; len <= k.size(); ++len) {
        auto& next = prefixes[Seq(k.begin(), k.begin() + static_cast<std::ptrdiff_t>(len))];
        if (len < k.size()) next.insert(k[len]);
      }
    size_t nodes = 0;
    for (const auto& [p, next] : prefixes) nodes += by_seq.count(p) || next.size() >= 2;
    return {nodes, prefixes.size()};
  }
};

void check_same_match(const CacheTrie& t, const Reference& ref, const Seq& q) {
  auto got = t.match(q);
  auto want = ref.match(q);
  CAPTURE(q.size());
  CHECK(got.length == want.length);
  CHECK(got.segment == want.segment);
  CHECK(got.matched == want.matched);
  CHECK(got.path == want.path);
}

void check_against_reference(const CacheTrie& t, const Reference& ref) {
  require_ok(t);
  auto st = t.stats();
  REQUIRE(st.payloads == ref.by_seq.size());
  REQUIRE(t.size() == ref.by_seq.size());
  auto [nodes, tokens] = ref.shape();
  REQUIRE(st.nodes == nodes);
  REQUIRE(st.edge_tokens == tokens);
  CHECK(st.bytes >= tokens * sizeof(int32_t));

  size_t top = 0;
  for (const auto& [id, s] : ref.by_id) {
    auto info = t.info(id);
    REQUIRE(info.ok());
    CHECK(info->end == s.size());
    CHECK(info->depth == ref.depth(s));
    CHECK(info->fan_out == ref.fan_out(s));
    CHECK(info->refcount == ref.refs.at(id));
    auto [pid, plen] = ref.parent(s);
    CHECK(info->parent == pid);
    CHECK(info->begin == plen);
    top += pid == kNoSegment;
    auto seq = t.sequence(id);
    REQUIRE(seq.ok());
    CHECK(*seq == s);
  }
  CHECK(t.root_fan_out() == top);

  // for_each: every payload once, parents before children, in token order (= the map's order).
  std::vector<SegmentId> order;
  t.for_each([&](const CacheTrie::PayloadInfo& p) {
    order.push_back(p.segment);
    const Seq& s = ref.by_id.at(p.segment);
    CHECK(p.end == s.size());
    CHECK(p.depth == ref.depth(s));
    CHECK(p.parent == ref.parent(s).first);
    CHECK(p.fan_out == ref.fan_out(s));
  });
  std::vector<SegmentId> want;
  for (const auto& [s, id] : ref.by_seq) want.push_back(id);
  CHECK(order == want);
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  size_t below(size_t n) { return static_cast<size_t>(g() % n); }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }
};

// A random sequence of length 1..40 over `alphabet` tokens, usually grown from an existing key so
// prefixes collide often.
Seq random_seq(Rng& r, const Reference& ref, int32_t alphabet) {
  Seq s;
  if (!ref.by_seq.empty() && r.chance(70)) {
    auto it = ref.by_seq.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(r.below(ref.by_seq.size())));
    s.assign(it->first.begin(), it->first.begin() + static_cast<std::ptrdiff_t>(r.below(it->first.size() + 1)));
  }
  size_t len = 1 + r.below(40);
  if (s.size() >= len) s.resize(len);
  while (s.size() < len) s.push_back(static_cast<int32_t>(r.below(static_cast<size_t>(alphabet))));
  return s;
}

SegmentId random_id(Rng& r, const Reference& ref, SegmentId next_id) {
  if (ref.by_id.empty() || r.chance(5)) return next_id + 1000;  // unknown
  auto it = ref.by_id.begin();
  std::advance(it, static_cast<std::ptrdiff_t>(r.below(ref.by_id.size())));
  return it->first;
}

void run_property(uint64_t seed, int32_t alphabet, int ops) {
  CAPTURE(seed);
  CAPTURE(alphabet);
  Rng r(seed);
  CacheTrie t;
  Reference ref;
  SegmentId next_id = 1;
  size_t inserted = 0, evicted = 0, refused = 0;
  for (int op = 0; op < ops; ++op) {
    CAPTURE(op);
    size_t kind = r.below(100);
    // Keep the trie from growing without bound: evict more when it is large.
    if (ref.by_seq.size() > 60 && kind < 40) kind = 60;
    if (kind < 40) {  // insert
      Seq s = random_seq(r, ref, alphabet);
      if (r.chance(5) && !ref.by_id.empty()) {
        // An id already in use: refused unless s is its own sequence (or s already has a payload).
        auto known = ref.by_id.begin();
        std::advance(known, static_cast<std::ptrdiff_t>(r.below(ref.by_id.size())));
        SegmentId id = known->first;
        if (r.chance(30)) s = known->second;
        auto res = t.insert(s, id);
        auto existing = ref.by_seq.find(s);
        if (existing != ref.by_seq.end()) {
          REQUIRE(res.ok());
          CHECK(!res->inserted);
          CHECK(res->segment == existing->second);
        } else {
          CHECK(!res.ok());
        }
      } else {
        SegmentId id = next_id++;
        auto res = t.insert(s, id);
        REQUIRE(res.ok());
        auto existing = ref.by_seq.find(s);
        if (existing != ref.by_seq.end()) {
          CHECK(!res->inserted);
          CHECK(res->segment == existing->second);
        } else {
          CHECK(res->inserted);
          CHECK(res->segment == id);
          ref.by_seq[s] = id;
          ref.by_id[id] = s;
          ref.refs[id] = 0;
          ++inserted;
        }
      }
    } else if (kind < 52) {  // acquire
      SegmentId id = random_id(r, ref, next_id);
      Status s = t.acquire(id);
      CHECK(s.ok() == (ref.by_id.count(id) == 1));
      if (s.ok()) ++ref.refs[id];
    } else if (kind < 64) {  // release
      SegmentId id = random_id(r, ref, next_id);
      Status s = t.release(id);
      bool can = ref.by_id.count(id) && ref.refs[id] > 0;
      CHECK(s.ok() == can);
      if (s.ok()) --ref.refs[id];
    } else if (kind < 90) {  // evict
      SegmentId id = random_id(r, ref, next_id);
      Status s = t.evict(id);
      bool known = ref.by_id.count(id) == 1;
      bool can = known && ref.refs[id] == 0 && !ref.has_dependents(ref.by_id[id]);
      CHECK(s.ok() == can);
      if (!s.ok()) CHECK(!s.message().empty());
      if (can) {
        ref.by_seq.erase(ref.by_id[id]);
        ref.by_id.erase(id);
        ref.refs.erase(id);
        ++evicted;
        CHECK(!t.contains(id));
        CHECK(!t.fan_out(id).ok());
      } else if (known) {
        ++refused;
      }
    } else {  // release everything held by a random id (sessions ending)
      SegmentId id = random_id(r, ref, next_id);
      if (ref.refs.count(id)) {
        while (ref.refs[id] > 0) {
          REQUIRE(t.release(id).ok());
          --ref.refs[id];
        }
      }
    }

    require_ok(t);
    REQUIRE(t.size() == ref.by_seq.size());
    for (int q = 0; q < 4; ++q) {
      Seq query = random_seq(r, ref, alphabet);
      if (r.chance(20)) query.push_back(alphabet);  // a token never stored
      check_same_match(t, ref, query);
    }
    if (op % 25 == 0) check_against_reference(t, ref);
  }
  check_against_reference(t, ref);

  // Drain: sessions end, then evict whatever is evictable until nothing is left; every step keeps
  // the shape invariants and the matches, and the empty trie holds no node.
  for (auto& [id, n] : ref.refs) {
    for (; n > 0; --n) REQUIRE(t.release(id).ok());
  }
  while (!ref.by_id.empty()) {
    size_t before = ref.by_id.size();
    std::vector<SegmentId> ids;
    for (const auto& [id, seq] : ref.by_id) ids.push_back(id);
    for (SegmentId id : ids) {
      bool can = !ref.has_dependents(ref.by_id.at(id));
      Status s = t.evict(id);
      REQUIRE(s.ok() == can);
      if (!can) continue;
      ref.by_seq.erase(ref.by_id.at(id));
      ref.by_id.erase(id);
      ref.refs.erase(id);
      require_ok(t);
      check_same_match(t, ref, random_seq(r, ref, alphabet));
    }
    REQUIRE(ref.by_id.size() < before);
  }
  CHECK(t.empty());
  CHECK(t.stats().nodes == 0);
  CHECK(t.stats().edge_tokens == 0);
  CHECK(t.root_fan_out() == 0);

  // The run must have exercised every path.
  CHECK(inserted > static_cast<size_t>(ops) / 10);
  CHECK(evicted > static_cast<size_t>(ops) / 20);
  CHECK(refused > 0);
  MESSAGE("seed " << seed << " alphabet " << alphabet << ": " << inserted << " inserted, " << evicted
                  << " evicted, " << refused << " evictions refused, " << t.size() << " left");
}

}  // namespace

TEST_CASE("empty trie matches nothing") {
  CacheTrie t;
  require_ok(t);
  auto m = t.match(Seq{1, 2, 3});
  CHECK(m.length == 0);
  CHECK(m.segment == kNoSegment);
  CHECK(m.matched == 0);
  CHECK(m.path.empty());
  CHECK(t.match(Seq{}).matched == 0);
  auto st = t.stats();
  CHECK(st.nodes == 0);
  CHECK(st.payloads == 0);
  CHECK(st.edge_tokens == 0);
  CHECK(t.root_fan_out() == 0);
}

TEST_CASE("insert rejects bad input and changes nothing") {
  CacheTrie t(CacheTrie::Limits{.max_sequence = 8});
  put(t, {1, 2, 3}, 7);
  auto before = t.stats();
  CHECK(!t.insert(Seq{}, 1).ok());
  CHECK(!t.insert(Seq{1, 2}, kNoSegment).ok());
  CHECK(!t.insert(Seq{1, -2}, 1).ok());
  CHECK(!t.insert(Seq(9, 1), 1).ok());
  auto dup = t.insert(Seq{1, 2}, 7);  // id 7 already marks {1,2,3}
  REQUIRE(!dup.ok());
  CHECK(dup.error().find("already registered") != std::string::npos);
  auto after = t.stats();
  CHECK(after.nodes == before.nodes);
  CHECK(after.edge_tokens == before.edge_tokens);
  require_ok(t);
}

TEST_CASE("re-inserting a sequence keeps the existing payload") {
  CacheTrie t;
  put(t, {1, 2, 3}, 1);
  REQUIRE(t.acquire(1).ok());
  auto again = t.insert(Seq{1, 2, 3}, 2);
  REQUIRE(again.ok());
  CHECK(!again->inserted);
  CHECK(again->segment == 1);
  CHECK(!t.contains(2));
  auto same = t.insert(Seq{1, 2, 3}, 1);
  REQUIRE(same.ok());
  CHECK(!same->inserted);
  CHECK(t.info(1)->refcount == 1);  // untouched
  require_ok(t);
}

TEST_CASE("splitting in the middle of an edge") {
  CacheTrie t;
  put(t, {1, 2, 3, 4}, 1);
  CHECK(t.stats().nodes == 1);
  put(t, {1, 2, 5}, 2);
  auto st = t.stats();
  CHECK(st.nodes == 3);  // {1,2} (no payload) -> {3,4}, {5}
  CHECK(st.edge_tokens == 5);
  CHECK(st.payloads == 2);
  CHECK(t.root_fan_out() == 2);
  CHECK(t.info(1)->parent == kNoSegment);
  CHECK(t.info(2)->parent == kNoSegment);

  auto m = t.match(Seq{1, 2, 3, 4, 9});
  CHECK(m.length == 4);
  CHECK(m.segment == 1);
  CHECK(m.matched == 4);
  CHECK(m.path == std::vector<Step>{{1, 0, 4}});
  m = t.match(Seq{1, 2, 5});
  CHECK(m.segment == 2);
  CHECK(m.length == 3);
  m = t.match(Seq{1, 2});  // ends at the payload-less split node
  CHECK(m.length == 0);
  CHECK(m.matched == 2);
  CHECK(m.segment == kNoSegment);
  CHECK(*t.sequence(1) == Seq{1, 2, 3, 4});
  CHECK(*t.sequence(2) == Seq{1, 2, 5});
}

TEST_CASE("inserting a prefix of an existing sequence") {
  CacheTrie t;
  put(t, {1, 2, 3, 4}, 1);
  put(t, {1, 2}, 2);  // splits {1,2,3,4}; the split node takes the payload
  CHECK(t.stats().nodes == 2);
  CHECK(*t.fan_out(2) == 1);
  CHECK(*t.fan_out(1) == 0);
  CHECK(t.root_fan_out() == 1);
  auto info = t.info(1);
  CHECK(info->parent == 2);
  CHECK(info->begin == 2);
  CHECK(info->end == 4);
  CHECK(info->depth == 1);

  auto m = t.match(Seq{1, 2, 3, 4, 5});
  CHECK(m.length == 4);
  CHECK(m.segment == 1);
  CHECK(m.path == std::vector<Step>{{2, 0, 2}, {1, 2, 4}});
  m = t.match(Seq{1, 2, 3});  // the query ends mid-edge below the prefix
  CHECK(m.length == 2);
  CHECK(m.segment == 2);
  CHECK(m.matched == 3);

  Status s = t.evict(2);
  CHECK(!s.ok());
  CHECK(s.message().find("dependent") != std::string::npos);
  REQUIRE(t.evict(1).ok());
  require_ok(t);
  CHECK(t.stats().nodes == 1);
  CHECK(t.stats().edge_tokens == 2);
  REQUIRE(t.evict(2).ok());
  require_ok(t);
  CHECK(t.stats().nodes == 0);
  CHECK(t.empty());
}

TEST_CASE("an extension hangs below the existing payload") {
  CacheTrie t;
  put(t, {1, 2}, 1);
  put(t, {1, 2, 3, 4}, 2);
  put(t, {1, 2, 3, 4, 5, 6}, 3);
  CHECK(t.stats().nodes == 3);
  CHECK(*t.fan_out(1) == 1);
  CHECK(*t.fan_out(2) == 1);
  auto m = t.match(Seq{1, 2, 3, 4, 5, 6, 7});
  CHECK(m.path == std::vector<Step>{{1, 0, 2}, {2, 2, 4}, {3, 4, 6}});
  CHECK(m.matched == 6);
  CHECK(t.info(3)->depth == 2);
  // A second branch under the middle payload raises its fan-out.
  put(t, {1, 2, 3, 4, 9}, 4);
  CHECK(*t.fan_out(2) == 2);
  CHECK(t.info(2)->children == 2);
}

TEST_CASE("disjoint sequences") {
  CacheTrie t;
  put(t, {1, 2}, 1);
  put(t, {3, 4}, 2);
  CHECK(t.stats().nodes == 2);
  CHECK(t.root_fan_out() == 2);
  CHECK(t.match(Seq{3, 4, 5}).segment == 2);
  CHECK(t.match(Seq{1, 2, 5}).segment == 1);
  auto m = t.match(Seq{5, 1, 2});
  CHECK(m.matched == 0);
  CHECK(m.segment == kNoSegment);
}

TEST_CASE("a match diverging mid-edge") {
  CacheTrie t;
  put(t, {1, 2, 3, 4, 5}, 1);
  auto m = t.match(Seq{1, 2, 3, 9});
  CHECK(m.length == 0);
  CHECK(m.segment == kNoSegment);
  CHECK(m.matched == 3);
  CHECK(m.path.empty());
  put(t, {1}, 2);
  m = t.match(Seq{1, 2, 3, 9});
  CHECK(m.length == 1);
  CHECK(m.segment == 2);
  CHECK(m.matched == 3);
  CHECK(m.path == std::vector<Step>{{2, 0, 1}});
}

TEST_CASE("eviction prunes leaves and merges payload-less chains") {
  CacheTrie t;
  put(t, {1, 2, 3}, 1);
  put(t, {1, 2, 4}, 2);
  CHECK(t.stats().nodes == 3);
  REQUIRE(t.evict(1).ok());
  require_ok(t);
  CHECK(t.stats().nodes == 1);  // {1,2} merged back into {4}
  CHECK(t.stats().edge_tokens == 3);
  CHECK(t.match(Seq{1, 2, 4}).segment == 2);
  CHECK(t.match(Seq{1, 2, 3}).matched == 2);

  // Three-way branch: removing one leaf keeps the branch node.
  put(t, {1, 2, 3}, 3);
  put(t, {1, 2, 5}, 4);
  CHECK(t.stats().nodes == 4);
  REQUIRE(t.evict(3).ok());
  require_ok(t);
  CHECK(t.stats().nodes == 3);
  // A payload-carrying parent is never merged away.
  put(t, {1, 2}, 5);
  REQUIRE(t.evict(4).ok());
  require_ok(t);
  CHECK(t.stats().nodes == 2);
  CHECK(t.match(Seq{1, 2, 4}).path == std::vector<Step>{{5, 0, 2}, {2, 2, 3}});
}

TEST_CASE("refcounts pin payloads") {
  CacheTrie t;
  put(t, {1, 2, 3}, 1);
  CHECK(!t.acquire(99).ok());
  CHECK(!t.release(1).ok());  // not acquired
  REQUIRE(t.acquire(1).ok());
  REQUIRE(t.acquire(1).ok());
  CHECK(t.info(1)->refcount == 2);
  Status s = t.evict(1);
  CHECK(!s.ok());
  CHECK(s.message().find("in use") != std::string::npos);
  REQUIRE(t.release(1).ok());
  CHECK(!t.evict(1).ok());
  REQUIRE(t.release(1).ok());
  REQUIRE(t.evict(1).ok());
  CHECK(!t.contains(1));
  CHECK(t.match(Seq{1, 2, 3}).segment == kNoSegment);
  CHECK(t.match(Seq{1, 2, 3}).matched == 0);
  CHECK(!t.evict(1).ok());
  CHECK(!t.acquire(1).ok());
  require_ok(t);

  // A parent with payload descendants cannot go, even unpinned; it can once they are gone.
  put(t, {1}, 10);
  put(t, {1, 2}, 11);
  put(t, {1, 3}, 12);
  REQUIRE(t.acquire(12).ok());
  CHECK(*t.fan_out(10) == 2);
  s = t.evict(10);
  CHECK(!s.ok());
  CHECK(s.message().find("2 dependent") != std::string::npos);
  REQUIRE(t.evict(11).ok());
  CHECK(*t.fan_out(10) == 1);
  CHECK(!t.evict(10).ok());
  CHECK(!t.evict(12).ok());
  REQUIRE(t.release(12).ok());
  REQUIRE(t.evict(12).ok());
  REQUIRE(t.evict(10).ok());
  CHECK(t.empty());
  CHECK(t.stats().nodes == 0);
  require_ok(t);
}

TEST_CASE("for_each visits payloads with depth and length") {
  CacheTrie t;
  put(t, {5, 1}, 1);         // platform
  put(t, {5, 1, 7, 7}, 2);   // community
  put(t, {5, 1, 7, 7, 3}, 3);  // bot
  put(t, {5, 1, 2}, 4);      // another community
  put(t, {6}, 5);
  std::vector<std::tuple<SegmentId, size_t, size_t, SegmentId>> seen;
  t.for_each([&](const CacheTrie::PayloadInfo& p) { seen.emplace_back(p.segment, p.depth, p.end, p.parent); });
  std::vector<std::tuple<SegmentId, size_t, size_t, SegmentId>> want = {
      {1, 0, 2, kNoSegment}, {4, 1, 3, 1}, {2, 1, 4, 1}, {3, 2, 5, 2}, {5, 0, 1, kNoSegment}};
  CHECK(seen == want);
  CHECK(*t.fan_out(1) == 2);
  CHECK(t.root_fan_out() == 2);
}

TEST_CASE("move leaves a usable empty trie") {
  CacheTrie a;
  put(a, {1, 2}, 1);
  CacheTrie b(std::move(a));
  CHECK(b.contains(1));
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): documented state
  put(a, {3}, 2);
  a = std::move(b);
  CHECK(a.contains(1));
  CHECK(!a.contains(2));
  require_ok(a);
}

TEST_CASE("a deep chain of payloads works and tears down without recursion") {
  CacheTrie deep;
  Seq s;
  for (SegmentId id = 1; id <= 3000; ++id) {
    s.push_back(static_cast<int32_t>(id % 7));
    REQUIRE(deep.insert(s, id).ok());
  }
  CHECK(deep.info(3000)->depth == 2999);
  CHECK(deep.match(s).path.size() == 3000);
  require_ok(deep);
}

TEST_CASE("property: random operations agree with a brute-force reference") {
  const int ops = 3000;
  SUBCASE("alphabet 2") {
    run_property(1, 2, ops);
    run_property(2, 2, ops);
  }
  SUBCASE("alphabet 3") {
    run_property(3, 3, ops);
    run_property(4, 3, ops);
  }
  SUBCASE("alphabet 5") {
    run_property(5, 5, ops);
    run_property(6, 5, ops);
  }
}

// The segment pool: hierarchy segments prefilled once, towers leased by longest prefix, exact against
// monolithic prefill, pins that keep leased segments alive, and eviction by policy within a budget.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <future>
#include <random>

#include "fault_injection_fs.h"
#include "gated_fs.h"
#include "mmapstore/segment_pool.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

using test::concat;
using test::random_tokens;
using test::max_abs_diff;

SegmentOptions with_id(SegmentId id) {
  SegmentOptions o;
  o.id = id;
  return o;
}
SegmentOptions with_format(KvQuant f) {
  SegmentOptions o;
  o.format = f;
  return o;
}
SegmentOptions pinned() {
  SegmentOptions o;
  o.pinned = true;
  return o;
}

PoolOptions exact_f32() {
  PoolOptions o;
  o.depth.by_depth = {KvQuant::F32};
  o.depth.transcript = KvQuant::F32;
  return o;
}

struct Fixture {
  std::unique_ptr<Model> model = test::synth_tiny("pool", "f16");
  ThreadPool threads{2};
  Forward fwd{*model, threads, Kernels::Reference};
  std::mt19937 rng{7};
  int vocab() const { return model->config().n_vocab; }
};

}  // namespace

TEST_CASE("a leased tower over platform/community/bot segments equals monolithic prefill") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd, exact_f32());
  auto platform = random_tokens(f.rng, 30, f.vocab()), community = random_tokens(f.rng, 20, f.vocab()),
       bot = random_tokens(f.rng, 15, f.vocab()), transcript = random_tokens(f.rng, 12, f.vocab());
  auto p = pool.add(kNoSegment, platform);
  REQUIRE_MESSAGE(p.ok(), p.error());
  auto c = pool.add(*p, community);
  REQUIRE(c.ok());
  auto b = pool.add(*c, bot);
  REQUIRE(b.ok());
  CHECK(pool.info(*b)->depth == 2);
  CHECK(pool.info(*b)->parent == *c);
  CHECK(pool.info(*c)->fan_out == 1);

  auto all = concat({platform, community, bot, transcript});
  auto lease = pool.assemble(all, 8);
  REQUIRE(lease.ok());
  CHECK(lease->cached_tokens == 65);
  CHECK(lease->path == std::vector<SegmentId>{*p, *c, *b});
  std::vector<float> got, want;
  REQUIRE(f.fwd.eval(*lease->tower, std::span(all).subspan(65), Logits::All, got).ok());

  DenseKvCache mono(f.model->config(), 100);
  REQUIRE(f.fwd.eval(mono, all, Logits::All, want).ok());
  want.erase(want.begin(), want.begin() + 65 * size_t(f.vocab()));
  CHECK(max_abs_diff(got, want) < 1e-4);
  CHECK(pool.info(*p)->refcount == 1);
  pool.release(*lease);
  CHECK(pool.info(*p)->refcount == 0);

  auto st = pool.stats();
  CHECK(st.segments == 3);
  CHECK(st.leases == 1);
  CHECK(st.cached_tokens == 65);
  CHECK(st.prefill_tokens == 12);
}

TEST_CASE("a fully cached prompt backs off one segment so the caller still gets logits") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd, exact_f32());
  auto a = random_tokens(f.rng, 10, f.vocab()), b = random_tokens(f.rng, 6, f.vocab());
  auto pa = pool.add(kNoSegment, a).value();
  auto pb = pool.add(pa, b).value();
  auto lease = pool.assemble(concat({a, b}), 4);
  REQUIRE(lease.ok());
  CHECK(lease->cached_tokens == 10);
  CHECK(lease->path == std::vector<SegmentId>{pa});
  pool.release(*lease);
  // A prompt that is exactly the top segment leaves nothing cached.
  auto top = pool.assemble(a, 0);
  CHECK(top->cached_tokens == 0);
  CHECK(top->tower->capacity() == 10);
  pool.release(*top);
  (void)pb;
}

TEST_CASE("shared segments are stored once however many sessions lease them") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd, exact_f32());
  auto base = random_tokens(f.rng, 40, f.vocab());
  auto id = pool.add(kNoSegment, base).value();
  CHECK(pool.add(kNoSegment, base).value() == id);  // same chain and tokens: the same segment
  const size_t bytes = pool.stats().kv_bytes;
  std::vector<Lease> leases;
  for (int s = 0; s < 10; ++s) {
    auto mine = concat({base, random_tokens(f.rng, 5, f.vocab())});
    auto l = pool.assemble(mine, 0);
    REQUIRE(l.ok());
    std::vector<float> logits;
    REQUIRE(f.fwd.eval(*l->tower, std::span(mine).subspan(40), Logits::Last, logits).ok());
    leases.push_back(std::move(l.value()));
  }
  CHECK(pool.stats().kv_bytes == bytes);
  CHECK(pool.info(id)->refcount == 10);
  for (auto& l : leases) pool.release(l);
  CHECK(pool.info(id)->refcount == 0);
}

TEST_CASE("the depth policy picks each segment's format, options override it") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd);  // default: platform Q4, community Q6, bot Q8
  auto p = pool.add(kNoSegment, random_tokens(f.rng, 8, f.vocab())).value();
  auto c = pool.add(p, random_tokens(f.rng, 8, f.vocab())).value();
  auto b = pool.add(c, random_tokens(f.rng, 8, f.vocab())).value();
  auto o = pool.add(c, random_tokens(f.rng, 8, f.vocab()), with_format(KvQuant::F16)).value();
  CHECK(pool.info(p)->format == KvQuant::Q4);
  CHECK(pool.info(c)->format == KvQuant::Q6);
  CHECK(pool.info(b)->format == KvQuant::Q8);
  CHECK(pool.info(o)->format == KvQuant::F16);
  auto st = pool.stats();
  CHECK(st.count_by_depth[2] == 2);
  CHECK(st.bytes_by_format.count("q4") == 1);
}

TEST_CASE("bad input is refused with a reason and changes nothing") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd, exact_f32());
  auto ok = pool.add(kNoSegment, random_tokens(f.rng, 4, f.vocab()), with_id(42));
  REQUIRE(ok.ok());
  CHECK(*ok == 42);
  std::vector<int32_t> none;
  CHECK(!pool.add(kNoSegment, none).ok());
  CHECK(!pool.add(999, random_tokens(f.rng, 4, f.vocab())).ok());
  std::vector<int32_t> bad = {1, f.vocab()};
  CHECK(!pool.add(kNoSegment, bad).ok());
  std::vector<int32_t> negative = {1, -3};
  CHECK(!pool.add(kNoSegment, negative).ok());
  CHECK(!pool.add(kNoSegment, random_tokens(f.rng, 4, f.vocab()), with_id(42)).ok());
  auto too_long = random_tokens(f.rng, f.model->config().n_ctx_train + 1, f.vocab());
  auto r = pool.add(kNoSegment, too_long);
  CHECK(!r.ok());
  CHECK(pool.stats().segments == 1);
  CHECK(!pool.remove(7).ok());
  CHECK(pool.add(kNoSegment, random_tokens(f.rng, 4, f.vocab())).value() == 43);  // ids continue past restored ones
}

TEST_CASE("a leased or parent segment is never removed, eviction follows the policy within the budget") {
  Fixture f;
  for (EvictionPolicy policy : {EvictionPolicy::Lru, EvictionPolicy::Lindy}) {
    CAPTURE(to_string(policy));
    PoolOptions o = exact_f32();
    o.eviction = policy;
    SegmentPool pool(*f.model, f.fwd, o);
    auto base_tokens = random_tokens(f.rng, 16, f.vocab());
    auto base = pool.add(kNoSegment, base_tokens, pinned()).value();
    std::vector<SegmentId> leaves;
    std::vector<std::vector<int32_t>> seqs;
    for (int i = 0; i < 4; ++i) {
      auto t = random_tokens(f.rng, 8, f.vocab());
      leaves.push_back(pool.add(base, t).value());
      seqs.push_back(concat({base_tokens, t, random_tokens(f.rng, 2, f.vocab())}));
    }
    CHECK(!pool.remove(base).ok());  // segments below depend on it
    // Touch leaves 3, 2 (in that order): least recently used first is 0, 3, 2. Lindy (mmapstore/eviction.h:
    // keep score = uses x age / (age + idle), age that of the lineage) gives the same order here: leaf 0
    // was never used, and 3 has been idle longer than 2 with as many uses. (Its other orders are
    // tested on the pure function, tests/test_eviction.cc.)
    for (int i : {3, 2}) {
      auto l = pool.assemble(seqs[i], 0);
      pool.release(*l);
    }
    auto held = pool.assemble(seqs[1], 0);  // leaf 1 is leased: never evicted
    REQUIRE(held->path.back() == leaves[1]);
    CHECK(!pool.remove(leaves[1]).ok());

    const size_t leaf_bytes = pool.info(leaves[0])->kv_bytes;
    // The budget counts the held lease's tail too: room for one leaf fewer than what is resident.
    pool.set_ram_budget(pool.stats().resident_bytes - leaf_bytes);
    CHECK(pool.enforce_budget() == 1);
    const SegmentId expect_gone = leaves[0];
    CHECK(!pool.info(expect_gone).has_value());
    pool.set_ram_budget(pool.stats().resident_bytes - leaf_bytes);
    CHECK(pool.enforce_budget() == 1);
    const SegmentId second = leaves[3];
    CHECK(!pool.info(second).has_value());
    pool.set_ram_budget(1);  // nothing fits: only unpinned, unleased leaves go
    pool.enforce_budget();
    CHECK(pool.info(base).has_value());
    CHECK(pool.info(leaves[1]).has_value());
    CHECK(!pool.info(leaves[0]).has_value());
    CHECK(!pool.info(leaves[2]).has_value());
    pool.release(*held);
    CHECK(pool.enforce_budget() == 1);
    CHECK(pool.stats().segments == 1);
  }
}

TEST_CASE("lindy ages the segments of one lineage together, whatever their labels say") {
  Fixture f;
  PoolOptions o = exact_f32();
  o.eviction = EvictionPolicy::Lindy;
  SegmentPool pool(*f.model, f.fwd, o);
  auto base_tokens = random_tokens(f.rng, 16, f.vocab());
  const SegmentId base = pool.add(kNoSegment, base_tokens, pinned()).value();
  // A session's two turns: one lineage (its label is free text), the newest never used yet ...
  SegmentOptions turn;
  turn.label = "turn";
  turn.lineage = "session:a";
  auto t0 = random_tokens(f.rng, 8, f.vocab()), t1 = random_tokens(f.rng, 8, f.vocab());
  const SegmentId a0 = pool.add(base, t0, turn).value();
  const SegmentId a1 = pool.add(a0, t1, turn).value();
  CHECK(pool.info(a1)->lineage == "session:a");
  // ... and a leaf whose label looks like a session's but that is its own lineage.
  SegmentOptions other;
  other.label = "session:b";
  auto tb = random_tokens(f.rng, 8, f.vocab());
  const SegmentId b = pool.add(base, tb, other).value();
  for (int i = 0; i < 3; ++i) {
    auto l = pool.assemble(concat({base_tokens, t0, random_tokens(f.rng, 2, f.vocab())}), 0);
    pool.release(*l);
  }
  auto l = pool.assemble(concat({base_tokens, tb, random_tokens(f.rng, 2, f.vocab())}), 0);
  pool.release(*l);
  // The unused turn is as used as its session (3 uses) and stays; the other leaf (1 use) goes.
  // (Aged on its own, the turn would go first: it was never used.)
  pool.set_ram_budget(pool.stats().resident_bytes - pool.info(b)->kv_bytes);
  CHECK(pool.enforce_budget() == 1);
  CHECK(pool.info(a1).has_value());
  CHECK(!pool.info(b).has_value());
}

TEST_CASE("sealing a session's tail lets the next request with that prefix reuse it") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd, exact_f32());
  auto sys = random_tokens(f.rng, 20, f.vocab()), turn1 = random_tokens(f.rng, 10, f.vocab()),
       turn2 = random_tokens(f.rng, 6, f.vocab());
  auto base = pool.add(kNoSegment, sys).value();
  auto first = concat({sys, turn1});
  auto lease = pool.assemble(first, 0);
  REQUIRE(lease.ok());
  std::vector<float> logits;
  REQUIRE(f.fwd.eval(*lease->tower, turn1, Logits::Last, logits).ok());
  auto sealed = pool.seal(*lease, turn1);
  REQUIRE_MESSAGE(sealed.ok(), sealed.error());
  CHECK(pool.info(*sealed)->parent == base);
  CHECK(lease->cached_tokens == 30);
  CHECK(!pool.seal(*lease, turn1).ok());  // the tail is empty now
  pool.release(*lease);

  auto second = concat({sys, turn1, turn2});
  auto again = pool.assemble(second, 0);
  CHECK(again->cached_tokens == 30);
  std::vector<float> got, want;
  REQUIRE(f.fwd.eval(*again->tower, turn2, Logits::All, got).ok());
  DenseKvCache mono(f.model->config(), 64);
  REQUIRE(f.fwd.eval(mono, second, Logits::All, want).ok());
  want.erase(want.begin(), want.begin() + 30 * size_t(f.vocab()));
  CHECK(max_abs_diff(got, want) < 1e-4);
  pool.release(*again);
}

namespace {
// A session turn as the daemon runs it: a lease over what is cached of `prompt`, the rest of `turn`
// (prompt tokens, then the generated ones) evaluated into its tail, and the tail sealed.
SegmentId seal_turn(Fixture& f, SegmentPool& pool, std::span<const int32_t> base, std::span<const int32_t> turn,
                    size_t prompt) {
  auto lease = pool.assemble(concat({base, turn.first(prompt)}), static_cast<int32_t>(turn.size() - prompt));
  REQUIRE(lease.ok());
  REQUIRE(lease->cached_tokens == base.size());
  std::vector<float> logits;
  REQUIRE(f.fwd.eval(*lease->tower, turn, Logits::Last, logits).ok());
  auto id = pool.seal(*lease, std::vector<int32_t>(turn.begin(), turn.end()));
  REQUIRE_MESSAGE(id.ok(), id.error());
  pool.release(*lease);
  return id.value();
}

// The tower's segments lie back to back from position 0, each where it was computed.
void check_back_to_back(const Tower& tower) {
  int32_t pos = 0;
  for (const auto& seg : tower.segments()) {
    CHECK(seg->computed_pos() == pos);
    pos += seg->length();
  }
  CHECK(pos == tower.base_length());
}
}  // namespace

TEST_CASE("a tower is the matched segment's own parent chain, never the trie's payload path") {
  // Two sessions of one bot send the same first message; one turn is sealed after 10 tokens, the
  // other after 20, both under the bot. In the trie the longer one sits below the shorter one, but
  // its KV was computed after the bot: a tower over bot, short, long would hold the first 10 tokens
  // twice and everything after at the wrong positions.
  Fixture f;
  auto sys = random_tokens(f.rng, 20, f.vocab()), turn = random_tokens(f.rng, 20, f.vocab()),
       next = random_tokens(f.rng, 5, f.vocab());
  const std::span<const int32_t> t(turn);
  auto all = concat({sys, turn, next});

  // The reference: only the longer turn exists.
  SegmentPool alone(*f.model, f.fwd, exact_f32());
  const SegmentId alone_base = alone.add(kNoSegment, sys).value();
  const SegmentId alone_long = seal_turn(f, alone, sys, t, 4);
  auto ref = alone.assemble(all, 0);
  REQUIRE(ref.ok());
  CHECK(ref->path == std::vector<SegmentId>{alone_base, alone_long});
  std::vector<float> want;
  REQUIRE(f.fwd.eval(*ref->tower, next, Logits::All, want).ok());
  alone.release(*ref);

  for (bool short_first : {true, false}) {
    CAPTURE(short_first);
    SegmentPool pool(*f.model, f.fwd, exact_f32());
    const SegmentId base = pool.add(kNoSegment, sys).value();
    SegmentId shorter = kNoSegment, longer = kNoSegment;
    if (short_first) {
      shorter = seal_turn(f, pool, sys, t.first(10), 4);
      longer = seal_turn(f, pool, sys, t, 4);
    } else {
      longer = seal_turn(f, pool, sys, t, 4);
      shorter = seal_turn(f, pool, sys, t.first(10), 4);
    }
    CHECK(pool.info(longer)->parent == base);
    CHECK(pool.info(shorter)->parent == base);
    CHECK(pool.info(longer)->depth == 1);
    REQUIRE(pool.check_invariants().ok());

    CHECK(pool.plan(all).path == std::vector<SegmentId>{base, longer});
    auto lease = pool.assemble(all, 0);
    REQUIRE(lease.ok());
    CHECK(lease->path == std::vector<SegmentId>{base, longer});
    CHECK(lease->cached_tokens == 40);
    CHECK(lease->tower->base_length() == 40);
    check_back_to_back(*lease->tower);
    std::vector<float> got;
    REQUIRE(f.fwd.eval(*lease->tower, next, Logits::All, got).ok());
    CHECK(got == want);  // as if the shorter turn did not exist
    pool.release(*lease);

    // The shorter turn's continuation still finds its own chain.
    auto own = concat({sys, t.first(10), next});
    auto l2 = pool.assemble(own, 0);
    REQUIRE(l2.ok());
    CHECK(l2->path == std::vector<SegmentId>{base, shorter});
    CHECK(l2->cached_tokens == 30);
    pool.release(*l2);

    // Without the longer segment in memory, the shorter one's chain is the longest usable prefix.
    REQUIRE(pool.freeze(longer, {}).ok());
    CHECK(pool.plan(all).path == std::vector<SegmentId>{base, longer});  // what to build
    auto l3 = pool.assemble(all, 0);
    REQUIRE(l3.ok());
    CHECK(l3->path == std::vector<SegmentId>{base, shorter});
    CHECK(l3->cached_tokens == 30);
    check_back_to_back(*l3->tower);
    pool.release(*l3);
    REQUIRE(pool.thaw(longer).ok());
    auto l4 = pool.assemble(all, 0);
    REQUIRE(l4.ok());
    std::vector<float> thawed;
    REQUIRE(f.fwd.eval(*l4->tower, next, Logits::All, thawed).ok());
    CHECK(thawed == want);
    pool.release(*l4);
  }
}

TEST_CASE("sealing tokens that are a segment under another chain switches the lease to that chain") {
  Fixture f;
  SegmentPool pool(*f.model, f.fwd, exact_f32());
  auto sys = random_tokens(f.rng, 20, f.vocab()), turn = random_tokens(f.rng, 20, f.vocab()),
       next = random_tokens(f.rng, 5, f.vocab());
  const std::span<const int32_t> t(turn);
  const SegmentId base = pool.add(kNoSegment, sys).value();
  const SegmentId longer = seal_turn(f, pool, sys, t, 4);
  const SegmentId shorter = seal_turn(f, pool, sys, t.first(10), 4);
  auto all = concat({sys, turn, next});
  auto ref = pool.assemble(all, 0);
  REQUIRE(ref.ok());
  std::vector<float> want;
  REQUIRE(f.fwd.eval(*ref->tower, next, Logits::All, want).ok());
  pool.release(*ref);

  // A lease over base, shorter whose tail reaches the end of `longer` (computed after base only).
  auto lease = pool.assemble(concat({sys, t.first(12)}), 8 + 5);
  REQUIRE(lease.ok());
  CHECK(lease->path == std::vector<SegmentId>{base, shorter});
  std::vector<float> logits;
  REQUIRE(f.fwd.eval(*lease->tower, t.subspan(10), Logits::Last, logits).ok());
  auto id = pool.seal(*lease, std::vector<int32_t>(turn.begin() + 10, turn.end()));
  REQUIRE_MESSAGE(id.ok(), id.error());
  CHECK(id.value() == longer);
  CHECK(lease->path == std::vector<SegmentId>{base, longer});
  CHECK(lease->cached_tokens == 40);
  check_back_to_back(*lease->tower);
  CHECK(pool.info(shorter)->refcount == 0);
  CHECK(pool.info(longer)->refcount == 1);
  std::vector<float> got;
  REQUIRE(f.fwd.eval(*lease->tower, next, Logits::All, got).ok());
  CHECK(got == want);
  pool.release(*lease);
  CHECK(pool.info(base)->refcount == 0);

  // The same when `longer` is not in memory: refused, the lease unchanged.
  REQUIRE(pool.freeze(longer, {}).ok());
  auto l2 = pool.assemble(concat({sys, t.first(12)}), 8);
  REQUIRE(l2.ok());
  REQUIRE(f.fwd.eval(*l2->tower, t.subspan(10), Logits::Last, logits).ok());
  auto refused = pool.seal(*l2, std::vector<int32_t>(turn.begin() + 10, turn.end()));
  CHECK(refused.status().code() == Status::Code::kConflict);
  CHECK(l2->path == std::vector<SegmentId>{base, shorter});
  CHECK(pool.info(longer)->tier == Tier::Cold);
  pool.release(*l2);
  REQUIRE(pool.check_invariants().ok());
}

TEST_CASE("over budget, segments go warm (unmapped, on disk) and come back by page_in, exactly") {
  Fixture f;
  PoolOptions o = exact_f32();
  o.store_dir = test::temp_dir() / "warm-pool";
  std::filesystem::remove_all(o.store_dir);
  std::filesystem::create_directories(o.store_dir);
  o.model_fingerprint = 99;
  SegmentPool pool(*f.model, f.fwd, o);
  auto sys = random_tokens(f.rng, 24, f.vocab()), bot = random_tokens(f.rng, 12, f.vocab()),
       user = random_tokens(f.rng, 5, f.vocab());
  auto base = pool.add(kNoSegment, sys).value();
  auto b = pool.add(base, bot).value();
  auto all = concat({sys, bot, user});
  pool.flush_writes();
  CHECK(pool.info(b)->durable);

  auto logits_of = [&](SegmentPool& p) {
    (void)p.page_in(p.plan(all).path);
    auto l = p.assemble(all, 0);
    REQUIRE(l.ok());
    CHECK(l->cached_tokens == 36);
    std::vector<float> out;
    REQUIRE(f.fwd.eval(*l->tower, user, Logits::All, out).ok());
    p.release(*l);
    return out;
  };
  const auto hot = logits_of(pool);
  pool.set_ram_budget(1);
  CHECK(pool.enforce_budget() == 2);  // parents may go warm too: they stay in the trie
  auto st = pool.stats();
  CHECK(st.warm_segments == 2);
  CHECK(st.hot_bytes == 0);
  CHECK(pool.info(base)->tier == Tier::Warm);
  CHECK(std::distance(std::filesystem::directory_iterator(o.store_dir), {}) == 2);
  auto plan = pool.plan(all);
  CHECK(plan.path == std::vector<SegmentId>{base, b});
  CHECK(!plan.all_hot());
  auto unpaged = pool.assemble(all, 0);  // never waits for the disk: warm segments end the prefix
  REQUIRE(unpaged.ok());
  CHECK(unpaged->cached_tokens == 0);
  pool.release(*unpaged);

  CHECK(logits_of(pool) == hot);  // paged in: the same bytes, the same logits
  st = pool.stats();
  CHECK(st.page_ins == 2);
  CHECK(st.hot_segments == 2);

  // A damaged warm file is never served: page_in drops the segment to cold, the lease stops before
  // it and the caller prefills more.
  CHECK(pool.enforce_budget() == 2);
  {
    const auto victim = pool.file_path(b);
    const auto size = std::filesystem::file_size(victim);
    std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size - 10));  // inside V: only the payload checksum sees it
    file.put('\x7f');
  }
  CHECK(pool.page_in(pool.plan(all).path).is_corruption());
  CHECK(pool.info(b)->tier == Tier::Cold);
  CHECK(!std::filesystem::exists(pool.file_path(b)));
  auto l = pool.assemble(all, 0);
  REQUIRE(l.ok());
  CHECK(l->cached_tokens == 24);
  CHECK(pool.stats().page_in_error.find("checksum") != std::string::npos);
  std::vector<float> out;
  REQUIRE(f.fwd.eval(*l->tower, std::span(all).subspan(24), Logits::All, out).ok());
  std::vector<float> tail(out.end() - 5 * f.vocab(), out.end());
  CHECK(max_abs_diff(tail, hot) < 1e-4);
  pool.release(*l);
  CHECK(pool.remove(b).ok());
  CHECK(std::distance(std::filesystem::directory_iterator(o.store_dir), {}) == 1);
}

TEST_CASE("idle segments freeze to cold (no KV anywhere) and thaw by prefill to the same bytes") {
  Fixture f;
  PoolOptions o;  // default depth policy: quantized segments must thaw to identical bytes too
  SegmentPool pool(*f.model, f.fwd, o);
  auto sys = random_tokens(f.rng, 20, f.vocab()), bot = random_tokens(f.rng, 10, f.vocab()),
       user = random_tokens(f.rng, 4, f.vocab());
  auto base = pool.add(kNoSegment, sys).value();
  auto b = pool.add(base, bot).value();
  const auto base_k = test::to_vec(pool.get(base)->k_bytes()), bot_v = test::to_vec(pool.get(b)->v_bytes());
  auto all = concat({sys, bot, user});
  auto l = pool.assemble(all, 0);
  std::vector<float> hot;
  REQUIRE(f.fwd.eval(*l->tower, user, Logits::All, hot).ok());

  CHECK(pool.freeze(b, {1, 2, 3}).message().find("in use") != std::string::npos);
  pool.release(*l);
  CHECK(pool.idle(std::chrono::hours(1)).empty());
  auto idle = pool.idle(std::chrono::seconds(0));
  CHECK(idle.size() == 2);
  REQUIRE(pool.freeze(b, {1, 2, 3}).ok());
  REQUIRE(pool.freeze(base, {}).ok());
  CHECK(!pool.freeze(base, {}).ok());  // cold already
  CHECK(pool.info(b)->tier == Tier::Cold);
  CHECK(pool.get(b) == nullptr);
  CHECK(pool.coded(b) == std::vector<uint8_t>{1, 2, 3});
  auto st = pool.stats();
  CHECK(st.cold_segments == 2);
  CHECK(st.kv_bytes == 0);
  CHECK(st.cold_bytes == 3);

  REQUIRE(pool.thaw(b).ok());  // thaws base, then bot under it
  auto again = pool.assemble(all, 0);
  REQUIRE(again.ok());
  CHECK(again->cached_tokens == 30);
  std::vector<float> thawed;
  REQUIRE(f.fwd.eval(*again->tower, user, Logits::All, thawed).ok());
  CHECK(thawed == hot);
  CHECK(test::to_vec(pool.get(base)->k_bytes()) == base_k);
  CHECK(test::to_vec(pool.get(b)->v_bytes()) == bot_v);
  CHECK(pool.stats().thaws == 2);
  CHECK(pool.stats().thaw_tokens == 30);
  CHECK(pool.coded(b).empty());
  pool.release(*again);

  // A child can be added under a cold parent: the parent thaws first.
  REQUIRE(pool.freeze(b, {}).ok());
  auto child = pool.add(b, random_tokens(f.rng, 3, f.vocab()));
  REQUIRE_MESSAGE(child.ok(), child.error());
  CHECK(pool.info(b)->tier == Tier::Hot);
}

TEST_CASE("a segment added cold (a cold tier restored from disk) runs no model until its first lease") {
  Fixture f;
  PoolOptions o;
  SegmentPool hot_pool(*f.model, f.fwd, o);
  auto sys = random_tokens(f.rng, 20, f.vocab()), bot = random_tokens(f.rng, 10, f.vocab()),
       user = random_tokens(f.rng, 4, f.vocab());
  auto hb = hot_pool.add(hot_pool.add(kNoSegment, sys).value(), bot).value();
  const auto want_v = test::to_vec(hot_pool.get(hb)->v_bytes());

  SegmentPool pool(*f.model, f.fwd, o);
  SegmentOptions cold;
  cold.cold = std::vector<uint8_t>{7, 7};
  auto base = pool.add(kNoSegment, sys, cold);
  REQUIRE(base.ok());
  auto b = pool.add(base.value(), bot, cold);
  REQUIRE(b.ok());
  CHECK(pool.info(b.value())->tier == Tier::Cold);
  CHECK(pool.info(b.value())->format == hot_pool.info(hb)->format);  // the depth policy still applies
  CHECK(pool.coded(b.value()) == std::vector<uint8_t>{7, 7});
  CHECK(pool.stats().kv_bytes == 0);
  CHECK(pool.stats().cold_segments == 2);
  CHECK(pool.stats().thaws == 0);

  auto cold_lease = pool.assemble(concat({sys, bot, user}), 0);  // cold segments end the prefix
  CHECK(cold_lease->cached_tokens == 0);
  pool.release(*cold_lease);
  CHECK(pool.stats().thaws == 0);
  REQUIRE(pool.thaw(b.value()).ok());
  auto l = pool.assemble(concat({sys, bot, user}), 0);
  REQUIRE(l.ok());
  CHECK(l->cached_tokens == 30);
  CHECK(pool.stats().thaws == 2);
  CHECK(test::to_vec(pool.get(b.value())->v_bytes()) == want_v);
  CHECK(pool.info(b.value())->kv_bytes == hot_pool.info(hb)->kv_bytes);
  pool.release(*l);
}

namespace {
PoolOptions stored(const std::string& name, FileSystem* fs = nullptr) {
  PoolOptions o;  // the default formats: transcripts are Q8, as the daemon keeps them
  o.store_dir = test::temp_dir() / name;
  std::filesystem::remove_all(o.store_dir);
  std::filesystem::create_directories(o.store_dir);
  o.model_fingerprint = 42;
  o.fs = fs;
  return o;
}

SegmentOptions derived_from(SegmentId source, int32_t skip) {
  SegmentOptions o;
  o.derive_from = source;
  o.derive_skip = skip;
  return o;
}
}  // namespace

TEST_CASE("a derived segment is its source's rows shifted, from memory or from the source's file, and never goes cold") {
  // A session's kept turns after older ones were dropped: rows [8, 20) of a 20-token turn move from
  // position 30 to position 20, right below the bot. No prefill of those 12 tokens gives that KV.
  Fixture f;
  auto sys = random_tokens(f.rng, 20, f.vocab()), old_turn = random_tokens(f.rng, 10, f.vocab()),
       turn = random_tokens(f.rng, 20, f.vocab());
  const std::span<const int32_t> kept = std::span<const int32_t>(turn).subspan(8);
  std::vector<uint8_t> want_k, want_v;
  for (bool from_file : {false, true}) {
    CAPTURE(from_file);
    PoolOptions o = stored("derive-pool");
    SegmentPool pool(*f.model, f.fwd, o);
    const SegmentId base = pool.add(kNoSegment, sys).value();
    const SegmentId t1 = pool.add(base, old_turn).value();
    const SegmentId t2 = pool.add(t1, turn).value();
    const SegmentId moved = pool.add_cold(base, kept, derived_from(t2, 8)).value();
    CHECK(pool.info(moved)->tier == Tier::Cold);
    CHECK(pool.info(moved)->derive_from == t2);
    CHECK(pool.info(moved)->begin == 20);
    pool.flush_writes();
    if (from_file) {
      pool.set_ram_budget(1);
      REQUIRE(pool.enforce_budget() >= 1);
      REQUIRE(pool.info(t2)->tier == Tier::Warm);
      CHECK(pool.derive(moved).code() == Status::Code::kUnavailable);  // its source is on disk
      REQUIRE(pool.thaw(moved).ok());  // pages the source in, then shifts: no prefill
      pool.set_ram_budget(0);
    } else {
      REQUIRE(pool.derive(moved).ok());
    }
    auto info = pool.info(moved);
    CHECK(info->tier == Tier::Hot);
    CHECK(info->derived);
    CHECK(info->derive_from == kNoSegment);
    CHECK(pool.stats().thaws == 0);  // no model run
    auto seg = pool.get(moved);
    REQUIRE(seg);
    CHECK(seg->computed_pos() == 20);
    CHECK(seg->parent() == base);
    if (!from_file) {
      want_k = test::to_vec(seg->k_bytes());
      want_v = test::to_vec(seg->v_bytes());
      // Not what a prefill of the kept tokens under the base gives.
      SegmentPool plain(*f.model, f.fwd, PoolOptions{});
      const SegmentId pb = plain.add(kNoSegment, sys).value();
      CHECK(test::to_vec(plain.get(plain.add(pb, kept).value())->k_bytes()) != want_k);
    } else {
      CHECK(test::to_vec(seg->k_bytes()) == want_k);  // the same bytes whichever tier the source was in
      CHECK(test::to_vec(seg->v_bytes()) == want_v);
    }

    // It leaves memory only to the warm tier: its file is its only copy.
    CHECK(pool.freeze(moved, {}).code() == Status::Code::kConflict);
    auto idle = pool.idle(std::chrono::seconds(0));
    CHECK(std::find(idle.begin(), idle.end(), moved) == idle.end());
    pool.flush_writes();
    pool.set_ram_budget(1);
    pool.enforce_budget();
    CHECK(pool.info(moved)->tier == Tier::Warm);
    pool.set_ram_budget(0);
    pool.flush_writes();

    // A restart: the file says it is derived.
    SegmentPool restarted(*f.model, f.fwd, o);
    REQUIRE(restarted.adopt({base, kNoSegment, sys, {}}).ok());
    REQUIRE(restarted.adopt({moved, base, std::vector<int32_t>(kept.begin(), kept.end()), {}}).ok());
    CHECK(restarted.info(moved)->derived);
    CHECK(!restarted.info(base)->derived);
    CHECK(restarted.freeze(moved, {}).code() == Status::Code::kConflict);
  }
}

TEST_CASE("the disk budget never sends a derived segment cold") {
  Fixture f;
  PoolOptions o = stored("derive-disk");
  SegmentPool pool(*f.model, f.fwd, o);
  auto sys = random_tokens(f.rng, 20, f.vocab()), turn = random_tokens(f.rng, 20, f.vocab()),
       other = random_tokens(f.rng, 20, f.vocab());
  const SegmentId base = pool.add(kNoSegment, sys).value();
  const SegmentId t = pool.add(base, turn).value();
  const SegmentId moved = pool.add_cold(base, std::span<const int32_t>(turn).subspan(5), derived_from(t, 5)).value();
  REQUIRE(pool.derive(moved).ok());
  const SegmentId plain = pool.add(base, other).value();
  pool.flush_writes();
  pool.set_ram_budget(1);
  pool.enforce_budget();
  REQUIRE(pool.info(moved)->tier == Tier::Warm);
  REQUIRE(pool.info(plain)->tier == Tier::Warm);
  // A budget of one byte: every warm segment that may go cold goes.
  SegmentPool budgeted(*f.model, f.fwd, [&] {
    PoolOptions b = o;
    b.disk_budget_bytes = 1;
    return b;
  }());
  REQUIRE(budgeted.adopt({base, kNoSegment, sys, {}}).ok());
  REQUIRE(budgeted.adopt({t, base, turn, {}}).ok());
  REQUIRE(budgeted.adopt({moved, base, std::vector<int32_t>(turn.begin() + 5, turn.end()), {}}).ok());
  REQUIRE(budgeted.adopt({plain, base, other, {}}).ok());
  CHECK(budgeted.enforce_disk_budget() == 3);
  CHECK(budgeted.info(moved)->tier == Tier::Warm);
  CHECK(budgeted.info(plain)->tier == Tier::Cold);
  CHECK(budgeted.info(t)->tier == Tier::Cold);
}

TEST_CASE("when_durable answers once the given segments' files are written and synced") {
  Fixture f;
  test::GatedFS gate;
  SegmentPool pool(*f.model, f.fwd, stored("durable-pool", &gate));
  auto sys = random_tokens(f.rng, 20, f.vocab()), turn = random_tokens(f.rng, 12, f.vocab());
  const SegmentId base = pool.add(kNoSegment, sys).value();
  pool.flush_writes();

  // Already durable: at once, on this thread.
  std::optional<Status> now;
  pool.when_durable(std::vector<SegmentId>{base}, [&](const Status& st) { now = st; });
  REQUIRE(now.has_value());
  CHECK(now->ok());
  // Unknown: at once, an error.
  now.reset();
  pool.when_durable(std::vector<SegmentId>{999}, [&](const Status& st) { now = st; });
  REQUIRE(now.has_value());
  CHECK(now->code() == Status::Code::kNotFound);

  // Two new segments whose files the writer cannot create yet: no answer until both are there.
  gate.close();
  const SegmentId a = pool.add(base, turn).value();
  const SegmentId b = pool.add_cold(base, std::span<const int32_t>(turn).subspan(4), derived_from(a, 4)).value();
  REQUIRE(pool.derive(b).ok());
  std::atomic<bool> answered{false};
  std::promise<std::pair<Status, bool>> result;
  pool.when_durable(std::vector<SegmentId>{base, a, b}, [&](const Status& st) {
    answered = true;
    // What a record appended here may name exists on disk.
    result.set_value({st, std::filesystem::exists(pool.file_path(a)) && std::filesystem::exists(pool.file_path(b))});
  });
  CHECK(!answered);  // the writer is held at its first file
  CHECK(!pool.info(a)->durable);
  gate.open();
  auto [st, files] = result.get_future().get();
  CHECK(st.ok());
  CHECK(files);
  CHECK(pool.info(a)->durable);
  CHECK(pool.info(b)->durable);

  // Without a store nothing is ever written: at once.
  SegmentPool ram(*f.model, f.fwd, exact_f32());
  const SegmentId r = ram.add(kNoSegment, sys).value();
  now.reset();
  ram.when_durable(std::vector<SegmentId>{r}, [&](const Status& s) { now = s; });
  REQUIRE(now.has_value());
  CHECK(now->ok());
}

TEST_CASE("when_durable reports a failed write and writes the segment again when asked again") {
  Fixture f;
  test::FaultInjectionFS fs;
  SegmentPool pool(*f.model, f.fwd, stored("durable-fail", &fs));
  auto sys = random_tokens(f.rng, 20, f.vocab());
  fs.faults.fail_sync_after = 0;  // the next file sync fails
  const SegmentId base = pool.add(kNoSegment, sys).value();
  std::promise<Status> first;
  pool.when_durable(std::vector<SegmentId>{base}, [&](const Status& st) { first.set_value(st); });
  Status failed = first.get_future().get();
  CHECK(!failed.ok());
  CHECK(!pool.info(base)->durable);
  CHECK(pool.info(base)->tier == Tier::Hot);  // still in memory

  fs.faults.fail_sync_after = -1;
  std::promise<Status> second;
  pool.when_durable(std::vector<SegmentId>{base}, [&](const Status& st) { second.set_value(st); });
  CHECK(second.get_future().get().ok());
  CHECK(pool.info(base)->durable);
  CHECK(std::filesystem::exists(pool.file_path(base)));
}

// The persistent store: every segment gets a file written off the caller's thread, is served from
// the mapping once the file is durable, and comes back in another pool (a restart) by adopt() —
// header checks only — with its payload verified on first page-in, without running the model.
#include <fstream>
#include <random>

#include "gated_fs.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_pool.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

using test::concat;
using test::random_tokens;

struct Store {
  std::unique_ptr<Model> model = test::synth_tiny("store", "f16");
  ThreadPool threads{1};
  Forward fwd{*model, threads, Kernels::Reference};
  std::mt19937 rng{7};
  PoolOptions options;
  explicit Store(const std::string& name) {
    options.store_dir = test::temp_dir() / name;
    std::filesystem::remove_all(options.store_dir);
    std::filesystem::create_directories(options.store_dir);
    options.model_fingerprint = 1234;
  }
  int vocab() const { return model->config().n_vocab; }
  // Logits of `user` after the longest cached prefix of all (paged in first).
  std::vector<float> logits(SegmentPool& pool, std::span<const int32_t> all, size_t expect_cached) {
    (void)pool.page_in(pool.plan(all).path);
    auto l = pool.assemble(all, 0);
    REQUIRE(l.ok());
    CHECK(l->cached_tokens == expect_cached);
    std::vector<float> out;
    REQUIRE(fwd.eval(*l->tower, all.subspan(l->cached_tokens), Logits::All, out).ok());
    pool.release(*l);
    return out;
  }
};

size_t files_in(const std::filesystem::path& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

}  // namespace

TEST_CASE("segments move from RAM to their mapped file once it is durable, with the same logits") {
  Store s("store-swap");
  SegmentPool pool(*s.model, s.fwd, s.options);
  auto sys = random_tokens(s.rng, 20, s.vocab()), bot = random_tokens(s.rng, 8, s.vocab()),
       user = random_tokens(s.rng, 4, s.vocab());
  auto base = pool.add(kNoSegment, sys).value();
  auto b = pool.add(base, bot).value();
  auto all = concat({sys, bot, user});
  auto l = s.logits(pool, all, 28);  // served from RAM, or from the mapping if the writer was quick
  pool.flush_writes();
  CHECK(pool.info(base)->durable);
  CHECK(pool.info(b)->durable);
  auto st = pool.stats();
  CHECK(st.files_written == 2);
  CHECK(st.owned_bytes == 0);  // both now read their mappings
  CHECK(st.disk_bytes == std::filesystem::file_size(pool.file_path(base)) + std::filesystem::file_size(pool.file_path(b)));
  CHECK(st.hot_bytes == st.disk_bytes);
  CHECK(s.logits(pool, all, 28) == l);
  CHECK(files_in(s.options.store_dir) == 2);
}

TEST_CASE("a restart adopts the files (no model run), verifies them on first use and serves the same logits") {
  Store s("store-adopt");
  auto sys = random_tokens(s.rng, 16, s.vocab()), bot = random_tokens(s.rng, 8, s.vocab()),
       turn = random_tokens(s.rng, 6, s.vocab()), user = random_tokens(s.rng, 3, s.vocab());
  SegmentId base, b, t;
  std::vector<float> before;
  {
    SegmentPool pool(*s.model, s.fwd, s.options);
    base = pool.add(kNoSegment, sys).value();
    b = pool.add(base, bot).value();
    // A session turn: prefilled into a lease's tail, then sealed (transcript format).
    auto lease = pool.assemble(concat({sys, bot, turn}), 0);
    REQUIRE(lease.ok());
    std::vector<float> ignore;
    REQUIRE(s.fwd.eval(*lease->tower, turn, Logits::Last, ignore).ok());
    t = pool.seal(*lease, turn).value();
    pool.release(*lease);
    before = s.logits(pool, concat({sys, bot, turn, user}), 30);
    pool.flush_writes();
  }  // the pool goes; its files stay
  CHECK(files_in(s.options.store_dir) == 3);

  ThreadPool threads(1);
  Forward counting(*s.model, threads, Kernels::Reference);
  SegmentPool pool(*s.model, counting, s.options);
  auto spec = [&](SegmentId id, SegmentId parent, const std::vector<int32_t>& toks) {
    AdoptSpec a;
    a.id = id;
    a.parent = parent;
    a.tokens = toks;
    return a;
  };
  REQUIRE(pool.adopt(spec(base, kNoSegment, sys)).ok());
  REQUIRE(pool.adopt(spec(b, base, bot)).ok());
  REQUIRE(pool.adopt(spec(t, b, turn)).ok());
  CHECK(pool.adopt(spec(t, b, turn)).ok());  // twice (sessions sharing a segment): the same one
  CHECK(pool.info(t)->tier == Tier::Warm);
  CHECK(pool.stats().hot_bytes == 0);
  CHECK(pool.stats().thaws == 0);
  CHECK(s.logits(pool, concat({sys, bot, turn, user}), 30) == before);
  CHECK(pool.stats().page_ins == 3);
  CHECK(pool.stats().thaws == 0);  // no prefill of any segment
  // New segments get fresh ids beyond the adopted ones.
  auto more = pool.add(t, random_tokens(s.rng, 2, s.vocab()));
  REQUIRE(more.ok());
  CHECK(more.value() > std::max({base, b, t}));
}

TEST_CASE("adopt refuses a file that disagrees with the record log, and garbage is collected") {
  Store s("store-refuse");
  auto sys = random_tokens(s.rng, 12, s.vocab()), bot = random_tokens(s.rng, 5, s.vocab());
  SegmentId base, b;
  {
    SegmentPool pool(*s.model, s.fwd, s.options);
    base = pool.add(kNoSegment, sys).value();
    b = pool.add(base, bot).value();
    pool.flush_writes();
  }
  std::ofstream(s.options.store_dir / "seg-999.tws") << "left by a crash";
  std::ofstream(s.options.store_dir / "seg-5.tws.tmp") << "half written";
  SegmentPool pool(*s.model, s.fwd, s.options);
  AdoptSpec top;
  top.id = base;
  top.tokens = sys;
  AdoptSpec wrong = top;
  wrong.tokens[3] ^= 1;
  auto st = pool.adopt(wrong);
  CHECK(st.is_corruption());
  CHECK(st.message().find("other tokens") != std::string::npos);
  AdoptSpec child;
  child.id = b;
  child.parent = base;
  child.tokens = bot;
  CHECK(pool.adopt(child).is_not_found());  // its parent is not adopted (yet)
  REQUIRE(pool.adopt(top).ok());
  AdoptSpec missing = child;
  missing.id = 77;
  CHECK(pool.adopt(missing).is_not_found());
  REQUIRE(pool.adopt(child).ok());
  CHECK(pool.collect_garbage() == 2);
  CHECK(files_in(s.options.store_dir) == 2);
  CHECK(pool.check_invariants().ok());
}

TEST_CASE("the RAM budget counts mapped segments and lease tails, and holds under a larger working set") {
  Store s("store-budget");
  SegmentPool pool(*s.model, s.fwd, s.options);
  auto sys = random_tokens(s.rng, 8, s.vocab());
  auto base = pool.add(kNoSegment, sys).value();
  std::vector<std::vector<int32_t>> bots;
  for (int i = 0; i < 12; ++i) {
    bots.push_back(random_tokens(s.rng, 10, s.vocab()));
    REQUIRE(pool.add(base, bots.back()).ok());
  }
  pool.flush_writes();
  const size_t one = pool.info(base)->kv_bytes;
  pool.set_ram_budget(4 * one);  // the working set is about 12 bot segments: three times the budget
  for (int round = 0; round < 3; ++round) {
    for (const auto& bt : bots) {
      auto all = concat({sys, bt, random_tokens(s.rng, 2, s.vocab())});
      (void)pool.page_in(pool.plan(all).path);
      auto l = pool.assemble(all, 0);
      REQUIRE(l.ok());
      CHECK(l->cached_tokens == 18);
      pool.release(*l);
      pool.enforce_budget();
      auto st = pool.stats();
      CHECK(st.resident_bytes <= 4 * one + one);  // within the budget plus what is leased
      CHECK(st.tail_bytes == 0);
    }
  }
  auto st = pool.stats();
  CHECK(st.page_outs > 0);
  CHECK(st.page_ins > 0);
  CHECK(st.warm_segments > 0);
  CHECK(pool.check_invariants().ok());
}

TEST_CASE("over the disk budget, the least recently used warm segments go cold and come back by a build") {
  Store s("store-disk");
  SegmentPool pool(*s.model, s.fwd, s.options);
  auto sys = random_tokens(s.rng, 8, s.vocab());
  auto base = pool.add(kNoSegment, sys, [] {
    SegmentOptions o;
    o.pinned = true;
    return o;
  }());
  REQUIRE(base.ok());
  std::vector<SegmentId> bots;
  std::vector<std::vector<int32_t>> toks;
  for (int i = 0; i < 6; ++i) {
    toks.push_back(random_tokens(s.rng, 10, s.vocab()));
    bots.push_back(pool.add(base.value(), toks.back()).value());
  }
  pool.flush_writes();
  const size_t file = std::filesystem::file_size(pool.file_path(bots[0]));
  const auto want_k = test::to_vec(pool.get(bots[0])->k_bytes());
  pool.set_ram_budget(1);
  pool.enforce_budget();  // everything unpinned is warm now: in its file only
  CHECK(pool.stats().warm_segments == 6);
  CHECK(pool.enforce_disk_budget() == 0);  // no disk budget
  PoolOptions o = s.options;
  o.disk_budget_bytes = std::filesystem::file_size(pool.file_path(base.value())) + 3 * file;
  SegmentPool limited(*s.model, s.fwd, o);  // the same files, adopted by a pool with a disk budget
  AdoptSpec top;
  top.id = base.value();
  top.tokens = sys;
  top.options.pinned = true;
  REQUIRE(limited.adopt(top).ok());
  for (int i = 0; i < 6; ++i) {
    AdoptSpec a;
    a.id = bots[i];
    a.parent = base.value();
    a.tokens = toks[i];
    REQUIRE(limited.adopt(a).ok());
  }
  CHECK(limited.enforce_disk_budget() == 3);
  auto st = limited.stats();
  CHECK(st.cold_segments == 3);
  CHECK(st.disk_bytes <= o.disk_budget_bytes);
  CHECK(limited.info(base.value())->tier == Tier::Warm);  // pinned: never frozen
  // A cold one comes back by prefill to the same bytes.
  SegmentId cold = kNoSegment;
  for (SegmentId b : bots) {
    if (limited.info(b)->tier == Tier::Cold) cold = b;
  }
  REQUIRE(cold != kNoSegment);
  REQUIRE(limited.thaw(cold).ok());
  if (cold == bots[0]) CHECK(test::to_vec(limited.get(cold)->k_bytes()) == want_k);
  CHECK(limited.check_invariants().ok());
}

namespace {
// A restart of a base and one segment under it: both adopted from their files.
void adopt_pair(SegmentPool& pool, SegmentId base, const std::vector<int32_t>& base_tokens, SegmentId child,
                const std::vector<int32_t>& child_tokens) {
  AdoptSpec a;
  a.id = base;
  a.tokens = base_tokens;
  REQUIRE(pool.adopt(a).ok());
  a.id = child;
  a.parent = base;
  a.tokens = child_tokens;
  REQUIRE(pool.adopt(a).ok());
}
}  // namespace

TEST_CASE("a modular segment says so in its file, and replace() swaps in the exact KV and rewrites the file") {
  Store s("store-modular");
  auto sys = random_tokens(s.rng, 12, s.vocab()), edited = random_tokens(s.rng, 15, s.vocab()),
       bot = random_tokens(s.rng, 8, s.vocab()), user = random_tokens(s.rng, 3, s.vocab());
  Rope rope(s.model->config());
  SegmentId base2, placed;
  std::vector<float> exact_logits;
  test::GatedFS gated;  // holds the writer while the checks below see a write in flight
  s.options.fs = &gated;
  {
    SegmentPool pool(*s.model, s.fwd, s.options);
    const SegmentId base = pool.add(kNoSegment, sys).value();
    const SegmentId old_bot = pool.add(base, bot).value();
    base2 = pool.add(kNoSegment, edited).value();
    SegmentOptions o;
    o.modular_from = {old_bot};
    o.repair = 3;
    placed = pool.add_cold(base2, bot, o).value();
    auto info = pool.info(placed);
    REQUIRE(info);
    CHECK(info->tier == Tier::Cold);
    CHECK(info->modular_from == std::vector<SegmentId>{old_bot});
    CHECK(info->repair == 3);
    CHECK_FALSE(info->modular);
    // What the scheduler's modular build installs: the old rows moved to where the bot now starts.
    auto old = pool.get_hot(old_bot);
    const Segment::Rows rows[] = {{old.get(), 0, old->length()}};
    auto moved = Segment::join(rows, static_cast<int32_t>(edited.size()), rope, info->format, placed, base2);
    pool.flush_writes();
    gated.close();  // its file's write waits until the checks below have seen it in flight
    REQUIRE(pool.install(placed, moved, /*modular=*/true).ok());
    CHECK(pool.info(placed)->modular);
    CHECK(pool.info(placed)->modular_from.empty());
    CHECK(pool.replace(placed, moved).code() == Status::Code::kUnavailable);  // its file is being written
    gated.open();
    pool.flush_writes();
    REQUIRE(pool.info(placed)->durable);
    // A segment of other tokens is refused.
    CHECK(pool.replace(placed, pool.get_hot(base2)).code() == Status::Code::kInvalidArgument);
    // The exact KV: the bot prefilled under the edited base.
    auto lease = pool.lease_chain(base2, static_cast<int32_t>(bot.size()));
    REQUIRE(lease.ok());
    std::vector<float> ignore;
    REQUIRE(s.fwd.eval(*lease->tower, bot, Logits::Last, ignore).ok());
    auto exact = lease->tower->seal_tail(bot, pool.info(placed)->format, placed);
    pool.release(*lease);
    gated.close();
    REQUIRE(pool.replace(placed, exact).ok());
    CHECK_FALSE(pool.info(placed)->modular);
    CHECK_FALSE(pool.info(placed)->durable);  // until the new file is renamed over the old one
    gated.open();
    pool.flush_writes();
    CHECK(pool.info(placed)->durable);
    CHECK(pool.replace(placed, exact).ok());  // not modular any more: nothing to do
    exact_logits = s.logits(pool, concat({edited, bot, user}), edited.size() + bot.size());
  }
  // A restart reads the flag from the file: the exact one is not modular.
  SegmentPool pool(*s.model, s.fwd, s.options);
  adopt_pair(pool, base2, edited, placed, bot);
  CHECK_FALSE(pool.info(placed)->modular);
  CHECK(s.logits(pool, concat({edited, bot, user}), edited.size() + bot.size()) == exact_logits);
}

TEST_CASE("a modular segment restarts modular, and going cold ends it: the next build is exact") {
  Store s("store-modular-restart");
  auto sys = random_tokens(s.rng, 12, s.vocab()), bot = random_tokens(s.rng, 8, s.vocab());
  Rope rope(s.model->config());
  SegmentId base, placed;
  {
    SegmentPool pool(*s.model, s.fwd, s.options);
    base = pool.add(kNoSegment, sys).value();
    const SegmentId other = pool.add(kNoSegment, random_tokens(s.rng, 5, s.vocab())).value();
    const SegmentId old_bot = pool.add(other, bot).value();
    SegmentOptions o;
    o.modular_from = {old_bot};
    placed = pool.add_cold(base, bot, o).value();
    auto old = pool.get_hot(old_bot);
    const Segment::Rows rows[] = {{old.get(), 0, old->length()}};
    REQUIRE(pool.install(placed, Segment::join(rows, 12, rope, pool.info(placed)->format, placed, base), true).ok());
    pool.flush_writes();
  }
  SegmentPool pool(*s.model, s.fwd, s.options);
  adopt_pair(pool, base, sys, placed, bot);
  CHECK(pool.info(placed)->modular);
  CHECK(pool.info(placed)->tier == Tier::Warm);
  REQUIRE(pool.freeze(placed, {}).ok());  // to the cold tier: a prefill brings it back, exact
  CHECK_FALSE(pool.info(placed)->modular);
}

TEST_CASE("retire: an edited segment goes, or, when only a longer text's segment keeps its trie node, its KV and file go") {
  Store s("store-retire");
  SegmentPool pool(*s.model, s.fwd, s.options);
  auto old_text = random_tokens(s.rng, 12, s.vocab()), bot = random_tokens(s.rng, 6, s.vocab());
  SegmentOptions pinned;
  pinned.pinned = true;
  const SegmentId old_base = pool.add(kNoSegment, old_text, pinned).value();
  const SegmentId old_bot = pool.add(old_base, bot).value();
  // The edit appended to the text: the new base's tokens extend the old one's.
  const SegmentId new_base = pool.add(kNoSegment, concat({old_text, random_tokens(s.rng, 4, s.vocab())}), pinned).value();
  pool.flush_writes();
  CHECK(pool.retire(old_base).code() == Status::Code::kConflict);  // old_bot was computed on top of it
  auto lease = pool.lease_chain(old_bot, 1);
  REQUIRE(lease.ok());
  CHECK(pool.retire(old_bot).code() == Status::Code::kConflict);  // in use
  pool.release(*lease);
  REQUIRE(pool.retire(old_bot).ok());
  CHECK_FALSE(pool.info(old_bot));
  CHECK(pool.remove(old_base).code() == Status::Code::kConflict);  // the trie: new_base extends its tokens
  REQUIRE(pool.retire(old_base).ok());
  auto info = pool.info(old_base);
  REQUIRE(info);
  CHECK(info->tier == Tier::Cold);
  CHECK_FALSE(info->pinned);
  CHECK_FALSE(std::filesystem::exists(pool.file_path(old_base)));
  CHECK(pool.info(new_base)->tier == Tier::Hot);
  CHECK(pool.check_invariants().ok());
}

// The background compressor moves idle segments to the cold tier through the pool, never one in use,
// and the tower built after it gives the same logits.
#include <cstring>
#include <fstream>
#include <future>
#include <random>

#include "engine/codec/codec.h"
#include "mmapstore/cold_pack.h"
#include "mmapstore/compressor.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {


// Stands in for the arithmetic coder: records what it was asked to code, returns the tokens as bytes.
struct RecordingEncoder {
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> calls;
  Compressor::Encode fn() {
    return [this](Forward&, std::span<const int32_t> ctx, std::span<const int32_t> toks) -> Result<std::vector<uint8_t>> {
      calls.emplace_back(std::vector<int32_t>(ctx.begin(), ctx.end()), std::vector<int32_t>(toks.begin(), toks.end()));
      std::vector<uint8_t> out(toks.size() * 4);
      std::memcpy(out.data(), toks.data(), out.size());
      return out;
    };
  }
};

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(3 + rng() % (vocab - 3));
  return v;
}

}  // namespace

TEST_CASE("compress codes a segment under its parents' tokens and freezes it, leased ones are skipped") {
  auto model = test::synth_tiny("compressor", "q8_0");
  ThreadPool threads(2);
  Forward fwd(*model, threads);
  SegmentPool pool(*model, fwd);
  std::mt19937 rng(3);
  const int V = model->config().n_vocab;
  auto sys = random_tokens(rng, 12, V), bot = random_tokens(rng, 7, V), user = random_tokens(rng, 3, V);
  auto base = pool.add(kNoSegment, sys).value();
  auto b = pool.add(base, bot).value();
  RecordingEncoder enc;
  Compressor comp(pool, *model, enc.fn(), {});

  std::vector<int32_t> all = sys;
  all.insert(all.end(), bot.begin(), bot.end());
  all.insert(all.end(), user.begin(), user.end());
  auto lease = pool.assemble(all, 0);
  std::vector<float> before;
  REQUIRE(fwd.eval(*lease->tower, user, Logits::All, before).ok());
  CHECK(!comp.compress(b).ok());  // in use
  CHECK(comp.stats().skipped == 1);
  pool.release(*lease);

  REQUIRE(comp.compress(b).ok());
  REQUIRE(enc.calls.size() == 2);
  CHECK(enc.calls[1].first == sys);
  CHECK(enc.calls[1].second == bot);
  CHECK(pool.info(b)->tier == Tier::Cold);
  CHECK(pool.coded(b).size() == bot.size() * 4);
  CHECK(comp.stats().compressed == 1);
  CHECK(comp.stats().tokens == bot.size());
  CHECK(!comp.compress(b).ok());  // cold already
  CHECK(!comp.compress(12345).ok());

  // Thawed (the scheduler does this before assembling; assemble never runs the model), the segment
  // has its KV again and the same tower gives the same logits.
  REQUIRE(pool.thaw(b).ok());
  CHECK(pool.info(b)->tier == Tier::Hot);
  auto again = pool.assemble(all, 0);
  REQUIRE(again.ok());
  CHECK(again->tower->segments().size() == 2);
  std::vector<float> after;
  REQUIRE(fwd.eval(*again->tower, user, Logits::All, after).ok());
  CHECK(after == before);
  pool.release(*again);
}

TEST_CASE("the background loop compresses what is idle and stops cleanly") {
  auto model = test::synth_tiny("compressor", "q8_0");
  ThreadPool threads(1);
  Forward fwd(*model, threads);
  SegmentPool pool(*model, fwd);
  std::mt19937 rng(5);
  const int V = model->config().n_vocab;
  auto base = pool.add(kNoSegment, random_tokens(rng, 9, V)).value();
  auto leaf = pool.add(base, random_tokens(rng, 5, V)).value();

  std::promise<void> two_done;
  std::atomic<int> seen{0};
  Compressor::Encode enc = [&](Forward&, std::span<const int32_t>, std::span<const int32_t> t) -> Result<std::vector<uint8_t>> {
    if (seen.fetch_add(1) == 1) two_done.set_value();
    return std::vector<uint8_t>(t.size(), 1);
  };
  Compressor::Options o;
  o.idle_for = std::chrono::seconds(0);
  o.scan_every = std::chrono::hours(1);  // one pass at start, then it waits for stop()
  Compressor comp(pool, *model, enc, o);
  comp.start();
  auto f = two_done.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  comp.stop();
  CHECK(comp.stats().compressed == 2);
  CHECK(pool.stats().cold_segments == 2);
  (void)leaf;
}

TEST_CASE("driven by the disk budget: idle segments go cold in the policy's order only until the files fit") {
  auto model = test::synth_tiny("compressor", "q8_0");
  ThreadPool threads(1);
  Forward fwd(*model, threads);
  const auto dir = test::temp_dir() / "compressor-disk-budget";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  PoolOptions o;
  o.store_dir = dir;
  SegmentPool pool(*model, fwd, o);
  std::mt19937 rng(11);
  const int V = model->config().n_vocab;
  auto base = pool.add(kNoSegment, random_tokens(rng, 9, V), [] {
    SegmentOptions p;
    p.pinned = true;
    return p;
  }()).value();
  std::vector<SegmentId> bots;
  for (int i = 0; i < 5; ++i) bots.push_back(pool.add(base, random_tokens(rng, 8, V)).value());
  pool.flush_writes();
  RecordingEncoder enc;
  Compressor::Options co;
  co.idle_for = std::chrono::seconds(0);
  Compressor comp(pool, *model, enc.fn(), co);
  CHECK(pool.disk_over_budget() == 0);  // no budget
  CHECK(comp.compress_over_disk_budget(std::chrono::seconds(0)) == 0);

  const size_t file = std::filesystem::file_size(pool.file_path(bots[0]));
  REQUIRE(file > 0);
  const size_t on_disk = pool.stats().disk_bytes;
  pool.set_disk_budget(on_disk - 2 * file);  // two bots' files too many
  CHECK(pool.disk_over_budget() == 2 * file);
  // Older than idle_for: none of them, so none may go, however far over the budget.
  CHECK(comp.compress_over_disk_budget(std::chrono::hours(1)) == 0);
  CHECK(comp.compress_over_disk_budget(std::chrono::seconds(0)) == 2);
  CHECK(pool.disk_over_budget() == 0);
  // In the policy's order (lru here): the two least recently used, the first two added.
  CHECK(pool.info(bots[0])->tier == Tier::Cold);
  CHECK(pool.info(bots[1])->tier == Tier::Cold);
  for (int i = 2; i < 5; ++i) CHECK(pool.info(bots[size_t(i)])->tier != Tier::Cold);
  CHECK(pool.info(base)->tier != Tier::Cold);  // pinned
  CHECK(comp.compress_over_disk_budget(std::chrono::seconds(0)) == 0);  // within the budget: nothing more
  // The scheduler's backstop (for warm segments: their files only) leaves what is within its slack to
  // the compressor.
  pool.set_ram_budget(1);
  pool.enforce_budget();
  pool.set_disk_budget(pool.stats().disk_bytes - file);
  CHECK(pool.enforce_disk_budget(1.5) == 0);
  CHECK(pool.enforce_disk_budget() == 1);
  REQUIRE(pool.check_invariants().ok());
}

namespace {

// A pool of four segments — a base, a bot, and two turns of one session — coded by the real codec.
struct AtRest {
  std::unique_ptr<Model> model = test::synth_tiny("at-rest", "q8_0");
  ThreadPool threads{2};
  Forward fwd{*model, threads};
  SegmentPool pool;
  Codec codec{*model, &threads};
  std::mt19937 rng{17};
  std::vector<int32_t> sys, bot, t1, t2, user, all;
  SegmentId base = 0, b = 0, turn1 = 0, turn2 = 0;
  // What the decoder does to the coded bytes and to the tokens it returns (damage on purpose).
  bool flip_byte = false, change_token = false;

  // with_turns false: the base and the bot only (a restart brings the turns back from the store).
  explicit AtRest(PoolOptions options = {}, bool with_turns = true) : pool(*model, fwd, std::move(options)) {
    const int V = model->config().n_vocab;
    sys = random_tokens(rng, 12, V), bot = random_tokens(rng, 7, V), t1 = random_tokens(rng, 9, V);
    t2 = random_tokens(rng, 11, V), user = random_tokens(rng, 3, V);
    base = pool.add(kNoSegment, sys).value();
    b = pool.add(base, bot).value();
    if (with_turns) {
      turn1 = pool.add(b, t1, session_options()).value();
      turn2 = pool.add(turn1, t2, session_options()).value();
    }
    for (const auto* part : {&sys, &bot, &t1, &t2, &user}) all.insert(all.end(), part->begin(), part->end());
    pool.set_cold_decoder([this](Forward& f, std::span<const int32_t> ctx, std::span<const uint8_t> coded) {
      std::vector<uint8_t> bytes(coded.begin(), coded.end());
      if (flip_byte) bytes[bytes.size() / 2] ^= 0x10;
      auto tokens = codec.decode(f, ctx, bytes);
      if (tokens.ok() && change_token) tokens.value()[0] ^= 1;
      return tokens;
    });
  }
  static SegmentOptions session_options() {
    SegmentOptions o;
    o.label = o.lineage = "session:abc";
    return o;
  }
  Compressor::Encode encoder() {
    return [this](Forward& f, std::span<const int32_t> ctx, std::span<const int32_t> toks) {
      return codec.encode(f, ctx, toks);
    };
  }
  std::vector<float> logits() {
    auto lease = pool.assemble(all, 0);
    REQUIRE(lease.ok());
    CHECK(lease->cached_tokens == all.size() - user.size());
    std::vector<float> out;
    REQUIRE(fwd.eval(*lease->tower, user, Logits::All, out).ok());
    pool.release(*lease);
    return out;
  }
  size_t token_bytes(std::initializer_list<const std::vector<int32_t>*> parts) const {
    size_t n = 0;
    for (const auto* p : parts) n += p->size() * sizeof(int32_t);
    return n;
  }
};

}  // namespace

TEST_CASE("a cold session goes to rest: its tokens leave RAM, plan finds it by hash, wake decodes it, same logits") {
  AtRest t;
  const std::vector<float> before = t.logits();
  CHECK(t.pool.stats().token_bytes == t.token_bytes({&t.sys, &t.bot, &t.t1, &t.t2}));
  Compressor comp(t.pool, *t.model, t.encoder(), {});

  // The first turn cold: its tokens stay, the second turn's node needs them.
  REQUIRE(comp.compress(t.turn1).ok());
  CHECK(t.pool.info(t.turn1)->tier == Tier::Cold);
  CHECK_FALSE(t.pool.at_rest(t.turn1));
  // The second cold too: both leave the trie, and no token of the session is held any more.
  REQUIRE(comp.compress(t.turn2).ok());
  CHECK(t.pool.at_rest(t.turn1));
  CHECK(t.pool.at_rest(t.turn2));
  CHECK_FALSE(t.pool.at_rest(t.b));
  PoolStats st = t.pool.stats();
  CHECK(st.token_bytes == t.token_bytes({&t.sys, &t.bot}));
  CHECK(st.at_rest_segments == 2);
  CHECK(st.at_rest_bytes == t.pool.coded(t.turn1).size() + t.pool.coded(t.turn2).size());
  CHECK(st.segments == 4);
  REQUIRE(t.pool.check_invariants().ok());
  CHECK(t.pool.list().size() == 4);
  CHECK_FALSE(t.pool.sequence(t.turn2).ok());  // nothing but the record holds its tokens

  // Found by prefix without its tokens: the hash of the query's tokens after the bot.
  PathPlan plan = t.pool.plan(t.all);
  CHECK(plan.path == std::vector<SegmentId>{t.base, t.b, t.turn1, t.turn2});
  CHECK(plan.tiers.back() == Tier::Cold);
  CHECK(plan.damaged.empty());
  std::vector<int32_t> other = t.all;
  other[t.sys.size() + t.bot.size() + t.t1.size() + 2] ^= 1;  // the second turn differs
  CHECK(t.pool.plan(other).path == std::vector<SegmentId>{t.base, t.b, t.turn1});

  // Back: decoded under its parents into the trie, then prefilled; the same tower, the same logits.
  REQUIRE(t.pool.thaw(t.turn2).ok());
  st = t.pool.stats();
  CHECK(st.wakes == 2);
  CHECK(st.wake_tokens == t.t1.size() + t.t2.size());
  CHECK(st.at_rest_segments == 0);
  CHECK(st.token_bytes == t.token_bytes({&t.sys, &t.bot, &t.t1, &t.t2}));
  CHECK(t.pool.info(t.turn2)->tier == Tier::Hot);
  CHECK(t.logits() == before);
  REQUIRE(t.pool.check_invariants().ok());

  // The same tokens under the same parent are the segment at rest, not a second copy: added, it is
  // that one (still at rest); sealed from a lease that computed them, it takes that KV, in the trie.
  REQUIRE(comp.compress(t.turn1).ok());
  REQUIRE(comp.compress(t.turn2).ok());
  REQUIRE(t.pool.at_rest(t.turn1));
  CHECK(t.pool.add_cold(t.b, t.t1).value() == t.turn1);
  CHECK(t.pool.at_rest(t.turn1));
  std::vector<int32_t> upto_t1(t.all.begin(), t.all.begin() + static_cast<std::ptrdiff_t>(t.sys.size() + t.bot.size() + t.t1.size()));
  auto lease = t.pool.assemble(upto_t1, 0);
  REQUIRE(lease.ok());
  REQUIRE(lease->cached_tokens == t.sys.size() + t.bot.size());
  std::vector<float> ignored;
  REQUIRE(t.fwd.eval(*lease->tower, t.t1, Logits::Last, ignored).ok());
  CHECK(t.pool.seal(*lease, t.t1).value() == t.turn1);
  t.pool.release(*lease);
  CHECK_FALSE(t.pool.at_rest(t.turn1));
  CHECK(t.pool.info(t.turn1)->tier == Tier::Hot);
  CHECK(t.pool.stats().segments == 4);
  REQUIRE(t.pool.check_invariants().ok());

  // Removing a session at rest (leaves first) needs no decode.
  REQUIRE(comp.compress(t.turn1).ok());
  REQUIRE(t.pool.at_rest(t.turn1));
  CHECK_FALSE(t.pool.remove(t.turn1).ok());  // the second turn was computed on top of it
  REQUIRE(t.pool.remove(t.turn2).ok());
  REQUIRE(t.pool.remove(t.turn1).ok());
  CHECK(t.pool.stats().at_rest_segments == 0);
  CHECK(t.pool.stats().wakes == 2);
  REQUIRE(t.pool.check_invariants().ok());
}

TEST_CASE("a record at rest that does not decode to its tokens is reported by segment and session, never served") {
  for (bool flip : {true, false}) {
    CAPTURE(flip);
    AtRest t;
    Compressor comp(t.pool, *t.model, t.encoder(), {});
    REQUIRE(comp.compress(t.turn1).ok());
    REQUIRE(comp.compress(t.turn2).ok());
    (flip ? t.flip_byte : t.change_token) = true;  // a damaged record, or a decoder that errs
    auto woken = t.pool.wake(t.turn2);
    REQUIRE_FALSE(woken.ok());
    CHECK(woken.status().code() == Status::Code::kCorruption);
    CHECK(woken.error().find("segment " + std::to_string(t.turn1) + " (session:abc)") != std::string::npos);
    CHECK(woken.error().find(flip ? "CRC" : "hash") != std::string::npos);
    CHECK(t.pool.stats().wake_errors == 1);
    CHECK(t.pool.at_rest(t.turn1));
    // The plan says so (the scheduler fails the request with it) and nothing thaws.
    CHECK(t.pool.plan(t.all).damaged == woken.error());
    CHECK_FALSE(t.pool.thaw(t.turn2).ok());
    (flip ? t.flip_byte : t.change_token) = false;
    CHECK_FALSE(t.pool.wake(t.turn2).ok());  // marked: never decoded again, never served
    REQUIRE(t.pool.check_invariants().ok());
  }
}

TEST_CASE("with a store, records at rest go to the cold packs and leave RAM, a new pool brings them back at rest from the index") {
  const auto dir = test::temp_dir() / "at-rest-packs";
  std::filesystem::remove_all(dir);
  PoolOptions options;
  options.store_dir = dir;
  std::vector<float> before;
  SegmentId turn1 = 0, turn2 = 0;
  uint64_t pack_disk_bytes = 0;
  {
    AtRest t(options);
    before = t.logits();
    turn1 = t.turn1, turn2 = t.turn2;
    Compressor comp(t.pool, *t.model, t.encoder(), {});
    REQUIRE(comp.compress(t.turn1).ok());
    REQUIRE(comp.compress(t.turn2).ok());
    REQUIRE(t.pool.at_rest(t.turn2));
    const PoolStats st = t.pool.stats();
    CHECK(st.packed_segments == 2);
    CHECK(st.at_rest_segments == 2);
    CHECK(st.at_rest_bytes == 0);  // the records left RAM ...
    CHECK(t.pool.coded(t.turn1).empty());
    CHECK(st.pack_record_bytes > 0);  // ... for the packs: the records and one index entry each
    CHECK(st.pack_disk_bytes == st.pack_record_bytes + 2 * kColdIndexEntryBytes);
    CHECK(st.token_bytes == t.token_bytes({&t.sys, &t.bot}));  // and no token of the session is held
    pack_disk_bytes = st.pack_disk_bytes;
    // Woken from the packs: the same tower, the same logits.
    REQUIRE(t.pool.thaw(t.turn2).ok());
    CHECK(t.pool.stats().wakes == 2);
    CHECK(t.logits() == before);
    // To rest again: the record in the packs is the same one, nothing is appended.
    REQUIRE(comp.compress(t.turn1).ok());
    REQUIRE(comp.compress(t.turn2).ok());
    CHECK(t.pool.stats().packed_segments == 2);
    CHECK(t.pool.stats().at_rest_bytes == 0);
    CHECK(t.pool.stats().pack_disk_bytes == pack_disk_bytes);
    REQUIRE(t.pool.check_invariants().ok());
    t.pool.flush_writes();
  }
  // A restart: the index alone brings the session back at rest (no record read, no token in RAM).
  {
    AtRest t(options, false);
    REQUIRE(t.pool.packed(turn1));
    REQUIRE(t.pool.packed(turn2));
    CHECK(t.pool.adopt_at_rest(turn1, t.b, AtRest::session_options(), t.t2).code() == Status::Code::kCorruption);
    CHECK_FALSE(t.pool.adopt_at_rest(turn2, t.b, AtRest::session_options()).ok());  // another parent
    REQUIRE(t.pool.adopt_at_rest(turn1, t.b, AtRest::session_options(), t.t1).ok());
    REQUIRE(t.pool.adopt_at_rest(turn2, turn1, AtRest::session_options()).ok());
    PoolStats st = t.pool.stats();
    CHECK(st.at_rest_segments == 2);
    CHECK(st.at_rest_bytes == 0);
    CHECK(st.token_bytes == t.token_bytes({&t.sys, &t.bot}));
    REQUIRE(t.pool.check_invariants().ok());
    CHECK(t.pool.plan(t.all).path == std::vector<SegmentId>{t.base, t.b, turn1, turn2});
    REQUIRE(t.pool.thaw(turn2).ok());
    CHECK(t.logits() == before);
    // A removed segment's record is dead: the next start does not find it.
    REQUIRE(t.pool.remove(turn2).ok());
    CHECK_FALSE(t.pool.packed(turn2));
    CHECK(t.pool.packed(turn1));
    t.pool.flush_writes();
  }
  // A damaged record: the wake names the segment and its session, and serves nothing.
  {
    auto packs = ColdPack::open(dir / "cold");
    REQUIRE(packs.ok());
    ColdRecordRef ref;
    REQUIRE(packs.value()->find(turn1, &ref));
    std::fstream f(dir / "cold" / ("pack-" + std::to_string(ref.pack) + ".twp"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(ref.offset + ref.length / 2));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(ref.offset + ref.length / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }
  AtRest t(options, false);
  REQUIRE(t.pool.adopt_at_rest(turn1, t.b, AtRest::session_options(), t.t1).ok());
  auto woken = t.pool.wake(turn1);
  REQUIRE_FALSE(woken.ok());
  CHECK(woken.error().find("(session:abc)") != std::string::npos);
  CHECK(woken.error().find("CRC") != std::string::npos);
  CHECK_FALSE(t.pool.plan(t.all).damaged.empty());
}

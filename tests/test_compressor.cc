// The background compressor moves idle segments to the cold tier through the pool, never one in use,
// and the tower built after it gives the same logits.
#include <cstring>
#include <future>
#include <random>

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

// Driving a Catalog as towerd does, without a scheduler: one session turn run by hand (prepare,
// build what is cold, lease, greedy tokens, finish) and the turns a state log holds. For the catalog's
// tests (tests/test_catalog*.cc).
#pragma once
#include <algorithm>
#include <filesystem>
#include <functional>
#include <future>
#include <map>

#include "daemon/catalog.h"
#include "daemon/state_store.h"
#include <doctest/doctest.h>
#include "mmapstore/record_log.h"
#include "model_fixtures.h"
#include "test_support.h"

namespace towers::test {

using daemon::Catalog;

// A tiny synthetic model as the catalog's tests run it (reference kernels, plain chat turns), and a
// fresh state directory for it (`tag` names both).
struct CatalogModel {
  std::unique_ptr<Model> model;
  ThreadPool threads{1};
  Forward fwd;
  daemon::PromptBuilder prompts;
  std::filesystem::path dir;
  explicit CatalogModel(const std::string& tag)
      : model(synth_tiny(tag, "f16")), fwd(*model, threads, Kernels::Reference),
        prompts(model->tokenizer(), ChatFamily::Plain), dir(temp_dir() / tag) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "segments");
  }
  PoolOptions pool_options() const {
    PoolOptions po;
    po.store_dir = dir / "segments";
    po.model_fingerprint = 7;
    return po;
  }
};

// One start of a catalog over a CatalogModel's state directory: its pool, its log (and the records
// the log held when opened, for Catalog::apply), the catalog.
struct CatalogState {
  daemon::Config config;
  SegmentPool pool;
  std::vector<daemon::Record> records;
  std::unique_ptr<daemon::StateStore> store;
  std::unique_ptr<Catalog> catalog;
  CatalogState(CatalogModel& m, daemon::Config cfg) : config(std::move(cfg)), pool(*m.model, m.fwd, m.pool_options()) {
    std::vector<std::string> problems;
    auto opened = daemon::StateStore::open(m.dir, records, problems);
    REQUIRE(opened.ok());
    store = std::move(opened.value());
    catalog = std::make_unique<Catalog>(*m.model, pool, m.prompts, *store, config, 7);
  }
};

// The session turns a state log holds: (session, turn number) -> the segment ids the record names.
inline std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> logged_turns(const std::filesystem::path& log) {
  std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> turns;
  auto read = read_record_log(log, [&](const LogRecord& r) {
    auto rec = daemon::parse_record(static_cast<daemon::RecordType>(r.type), r.payload);
    if (!rec.ok()) return;
    if (auto* t = std::get_if<daemon::record::SessionTurn>(&rec.value())) turns[{t->id, t->n}] = t->segments;
  });
  REQUIRE(read.ok());
  return turns;
}

// One session turn as the scheduler runs it: prepare, build what is cold, lease, greedy tokens, finish.
// `before_prepare` runs after begin_turn (it sees whether old turns are dropped).
inline std::future<Status> run_turn(Catalog& catalog, SegmentPool& pool, Forward& fwd, const std::string& session,
                                    const std::string& user, int n_gen, Catalog::Turn* turn_out,
                                    const std::function<void(const Catalog::Turn&)>& before_prepare = {}) {
  auto t = catalog.begin_turn(session, {"user", user, ""}, static_cast<size_t>(n_gen));
  REQUIRE_MESSAGE(t.ok(), t.error());
  if (before_prepare) before_prepare(*t);
  auto prompt = catalog.prepare_turn(*t);
  REQUIRE_MESSAGE(prompt.ok(), prompt.error());
  for (SegmentId id : pool.plan(*prompt).path) {
    if (pool.info(id)->tier != Tier::Hot) REQUIRE(pool.thaw(id).ok());
  }
  auto lease = pool.assemble(*prompt, n_gen);
  REQUIRE(lease.ok());
  daemon::GenOutcome out;
  out.prompt = *prompt;
  out.tail.assign(prompt->begin() + static_cast<std::ptrdiff_t>(lease->cached_tokens), prompt->end());
  std::vector<float> logits;
  REQUIRE(fwd.eval(*lease->tower, out.tail, Logits::Last, logits).ok());
  for (int i = 0; i < n_gen; ++i) {
    const auto tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.tokens.push_back(tok);
    if (i + 1 == n_gen) break;
    out.tail.push_back(tok);
    REQUIRE(fwd.eval(*lease->tower, std::vector<int32_t>{tok}, Logits::Last, logits).ok());
  }
  out.finish_reason = FinishReason::Length;
  auto done = std::make_shared<std::promise<Status>>();
  catalog.finish_turn(*t, out, &lease.value(), "reply to " + user, [done](const Status& st) { done->set_value(st); });
  pool.release(*lease);
  if (turn_out) *turn_out = *t;
  return done->get_future();
}

}  // namespace towers::test

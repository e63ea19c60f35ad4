// Recovery never invents a conversation (issue 11 item 8): a state log with two sessions' numbered
// turns, every byte flipped in turn; whatever replay makes of the damage, each session served is a
// prefix of its true history (a damaged turn cuts its session there; later turns of it are not
// replayed), and the line that reports the cut names the session.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>

#include "daemon/catalog.h"
#include "daemon/state_store.h"
#include "gated_fs.h"
#include "mmapstore/record_log.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;

namespace {

std::vector<char> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_file(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct History {
  std::map<std::string, std::vector<ChatMessage>> sessions;
};

// The true history: a bot, two sessions, five numbered turns each, interleaved.
History write_log(const std::filesystem::path& dir) {
  std::vector<Record> recs;
  std::vector<std::string> problems;
  auto store = StateStore::open(dir, recs, problems);
  REQUIRE(store.ok());
  History h;
  REQUIRE(store.value()->append(record::Header{"tiny", 7}).ok());
  REQUIRE(store.value()->append(record::SegmentPut{"p", Level::Platform, "", "Platform text.", 1, 1}).ok());
  REQUIRE(store.value()->append(record::SegmentPut{"b", Level::Bot, "p", "Bot text.", 2, 2}).ok());
  for (const char* id : {"s1", "s2"}) REQUIRE(store.value()->append(record::SessionCreate{id, "b", 3}).ok());
  for (uint64_t n = 1; n <= 5; ++n) {
    for (const std::string id : {"s1", "s2"}) {
      const std::string user = id + " asks question " + std::to_string(n);
      const std::string reply = id + " gets answer " + std::to_string(n);
      std::vector<size_t> seals = {n * 4};
      REQUIRE(store.value()->append(record::SessionTurn{id, n, 0, 0, user, reply, {1, 2}, {3, 4}, seals, {}, int64_t(n)}).ok());
      h.sessions[id].push_back({"user", user});
      h.sessions[id].push_back({"assistant", reply});
    }
  }
  return h;
}

}  // namespace

TEST_CASE("a flipped byte anywhere in the log never makes a served transcript that did not happen") {
  auto model = test::synth_tiny("recovery", "f16");
  ThreadPool threads(1);
  Forward fwd(*model, threads, Kernels::Reference);
  SegmentPool pool(*model, fwd, {});
  PromptBuilder prompts(model->tokenizer(), ChatFamily::Plain);
  Config cfg;
  const auto dir = test::temp_dir() / "recovery-true";
  std::filesystem::remove_all(dir);
  const History truth = write_log(dir);
  const auto log = read_file(dir / "towerd.log");
  REQUIRE(log.size() > 500);
  const auto work = test::temp_dir() / "recovery-flipped";
  size_t cut = 0, shorter = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    CAPTURE(i);
    std::filesystem::remove_all(work);
    std::filesystem::create_directories(work);
    auto bad = log;
    bad[i] ^= 0x20;
    write_file(work / "towerd.log", bad);
    std::vector<Record> recs;
    std::vector<std::string> problems;
    auto store = StateStore::open(work, recs, problems);
    REQUIRE(store.ok());
    Catalog catalog(*model, pool, prompts, *store.value(), cfg, 7);
    std::vector<std::string> lines;
    for (const auto& r : recs) {
      if (Status st = catalog.apply(r); !st.ok()) lines.push_back(st.message());
    }
    for (const auto& view : catalog.sessions()) {
      auto s = catalog.session(view.id, true);
      REQUIRE(s.ok());
      const auto& got = *s->transcript;
      const auto& want = truth.sessions.at(view.id);
      REQUIRE(got.size() <= want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        REQUIRE(got[k].role == want[k].role);
        REQUIRE(got[k].content == want[k].content);
      }
      if (got.size() < want.size()) ++shorter;
    }
    for (const auto& l : lines) {
      if (l.find("is missing") == std::string::npos) continue;
      ++cut;
      CHECK((l.find("\"s1\"") != std::string::npos || l.find("\"s2\"") != std::string::npos));
    }
  }
  MESSAGE(log.size() << " flipped bytes: " << cut << " sessions cut at a missing turn, " << shorter
                     << " served shorter than the truth, none different");
  CHECK(cut > 0);
}

TEST_CASE("sealed session transcripts are Q8 by default, F16 when [pool] transcript_format says so") {
  auto model = test::synth_tiny("transcript-format", "f16");
  ThreadPool threads(1);
  Forward fwd(*model, threads, Kernels::Reference);
  PromptBuilder prompts(model->tokenizer(), ChatFamily::Plain);
  const auto dir = test::temp_dir() / "transcript-format";
  std::filesystem::remove_all(dir);
  write_log(dir);
  const auto toml = dir / "towerd.toml";
  std::ofstream(toml) << "[pool]\ntranscript_format = \"f16\"\n";
  Config f16;
  REQUIRE(load_config(toml, &f16).ok());
  const std::pair<Config, KvQuant> cases[] = {{Config{}, KvQuant::Q8}, {f16, KvQuant::F16}};
  for (const auto& [cfg, want] : cases) {
    const std::string format = simd::kv_quant_name(want);
    CAPTURE(format);
    SegmentPool pool(*model, fwd, {});
    std::vector<Record> recs;
    std::vector<std::string> problems;
    auto store = StateStore::open(dir, recs, problems);
    REQUIRE(store.ok());
    Catalog catalog(*model, pool, prompts, *store.value(), cfg, 7);
    for (const auto& r : recs) REQUIRE(catalog.apply(r).ok());
    REQUIRE(catalog.restore().ok());
    size_t transcripts = 0;
    for (const auto& info : pool.list()) {
      if (info.label.rfind("session:", 0) != 0) continue;
      ++transcripts;
      CHECK(info.format == want);
    }
    CHECK(transcripts > 0);  // the two sessions' transcripts are the same tokens: they share segments
  }
}

namespace {
// The session turns a state log holds: (session, turn number) -> the segment ids the record names.
std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> logged_turns(const std::filesystem::path& log) {
  std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> turns;
  auto read = read_record_log(log, [&](const LogRecord& r) {
    auto rec = parse_record(static_cast<RecordType>(r.type), r.payload);
    if (!rec.ok()) return;
    if (auto* t = std::get_if<record::SessionTurn>(&rec.value())) turns[{t->id, t->n}] = t->segments;
  });
  REQUIRE(read.ok());
  return turns;
}

// One session turn as the scheduler runs it: prepare, build what is cold, lease, greedy tokens, finish.
// `before_prepare` runs after begin_turn (it sees whether old turns are dropped).
std::future<Status> run_turn(Catalog& catalog, SegmentPool& pool, Forward& fwd, const std::string& session,
                             const std::string& user, int n_gen, Catalog::Turn* turn_out,
                             const std::function<void(const Catalog::Turn&)>& before_prepare = {}) {
  auto t = catalog.begin_turn(session, user, static_cast<size_t>(n_gen));
  REQUIRE_MESSAGE(t.ok(), t.error());
  if (before_prepare) before_prepare(*t);
  auto prompt = catalog.prepare_turn(*t);
  REQUIRE_MESSAGE(prompt.ok(), prompt.error());
  for (SegmentId id : pool.plan(*prompt).path) {
    if (pool.info(id)->tier != Tier::Hot) REQUIRE(pool.thaw(id).ok());
  }
  auto lease = pool.assemble(*prompt, n_gen);
  REQUIRE(lease.ok());
  GenOutcome out;
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
}  // namespace

TEST_CASE("a turn that moved kept turns up is recorded only once their shifted segments' files are durable") {
  // Past the prompt limit a session drops its oldest turns and the kept ones are RoPE-shifted copies
  // of their old KV: no prefill of their tokens gives that KV back, so a record naming them before
  // their files exist would, after a crash, serve a different conversation state.
  auto model = test::synth_tiny("turn-order", "f16");
  ThreadPool threads(1);
  Forward fwd(*model, threads, Kernels::Reference);
  PromptBuilder prompts(model->tokenizer(), ChatFamily::Plain);
  const auto dir = test::temp_dir() / "turn-order";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "segments");
  Config cfg;
  cfg.max_prompt_tokens = 160;
  std::set<SegmentId> derived;
  uint64_t drop_turn = 0;
  {
    test::GatedFS gate;
    PoolOptions po;
    po.store_dir = dir / "segments";
    po.fs = &gate;
    po.model_fingerprint = 7;
    SegmentPool pool(*model, fwd, po);
    std::vector<Record> recs;
    std::vector<std::string> problems;
    auto store = StateStore::open(dir, recs, problems);
    REQUIRE(store.ok());
    Catalog catalog(*model, pool, prompts, *store.value(), cfg, 7);
    REQUIRE(store.value()->append(catalog.header()).ok());
    REQUIRE(catalog.put_segment("p", Level::Platform, "", "You are a storyteller.").ok());
    REQUIRE(catalog.put_segment("b", Level::Bot, "p", "Tell short stories.").ok());
    REQUIRE(catalog.create_session("b", "s").ok());
    for (int n = 1; n <= 30 && drop_turn == 0; ++n) {
      const std::string user = "Tell me part " + std::to_string(n) + " of the story.";
      Catalog::Turn turn;
      auto done = run_turn(catalog, pool, fwd, "s", user, 16, &turn, [&](const Catalog::Turn& t) {
        if (t.drop_turns > 0) gate.close();  // the shifted segments' files wait
      });
      if (turn.drop_turns == 0) {
        REQUIRE(done.get().ok());
        continue;
      }
      drop_turn = static_cast<uint64_t>(n);
      // Everything queued on the log before this barrier is durable once it returns.
      REQUIRE(store.value()->append(record::SessionCreate{"barrier", "b", 1}).ok());
      CHECK(logged_turns(store.value()->path()).count({"s", drop_turn}) == 0);
      CHECK(done.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);  // the reply waits too
      gate.open();
      REQUIRE(done.get().ok());
      auto logged = logged_turns(store.value()->path());
      REQUIRE(logged.count({"s", drop_turn}) == 1);
      for (uint64_t id : logged[{"s", drop_turn}]) {
        auto info = pool.info(id);
        REQUIRE(info.has_value());
        if (!info->derived) continue;
        derived.insert(id);
        CHECK(std::filesystem::exists(pool.file_path(id)));
      }
    }
    REQUIRE(drop_turn > 0);
    CHECK(!derived.empty());
  }
  // A restart adopts every segment the log names from its file; the shifted ones stay derived.
  SegmentPool pool(*model, fwd, [&] {
    PoolOptions po;
    po.store_dir = dir / "segments";
    po.model_fingerprint = 7;
    return po;
  }());
  std::vector<Record> recs;
  std::vector<std::string> problems;
  auto store = StateStore::open(dir, recs, problems);
  REQUIRE(store.ok());
  Catalog catalog(*model, pool, prompts, *store.value(), cfg, 7);
  for (const auto& r : recs) (void)catalog.apply(r);
  auto restored = catalog.restore();
  REQUIRE(restored.ok());
  CHECK(restored->cold == 0);
  for (SegmentId id : derived) {
    REQUIRE(pool.info(id).has_value());
    CHECK(pool.info(id)->derived);
  }
}

// Recovery never invents a conversation (issue 11 item 8): a state log with two sessions' numbered
// turns, every byte flipped in turn; whatever replay makes of the damage, each session served is a
// prefix of its true history (a damaged turn cuts its session there; later turns of it are not
// replayed), and the line that reports the cut names the session.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "catalog_fixtures.h"
#include "daemon/catalog.h"
#include "daemon/state_store.h"
#include "gated_fs.h"
#include "mmapstore/record_log.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;
using towers::test::logged_turns;
using towers::test::run_turn;

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
      REQUIRE(store.value()->append(record::SessionTurn{id, n, 0, 0, user, reply, {1, 2}, {3, 4}, seals, {}, int64_t(n), "", ""}).ok());
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

namespace {
// What this process writes to stderr (towerd's log) while it lives.
class StderrCapture {
 public:
  explicit StderrCapture(std::filesystem::path file) : file_(std::move(file)) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string finish() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    const auto bytes = read_file(file_);
    return std::string(bytes.begin(), bytes.end());
  }

 private:
  std::filesystem::path file_;
  int saved_ = -1;
};
}  // namespace

TEST_CASE("a session whose first transcript file is gone is repaired once: the next start logs nothing") {
  // After a crash a session's file may be missing. The start logs it and recomputes the segment on
  // the session's next message; it used to log the same warning at every start until then (12,749
  // lines over a kill loop). Now the first start rewrites the log without the missing file's name.
  test::CatalogModel m("repair-once");
  std::filesystem::path first_file;
  {
    test::CatalogState st(m, Config{});
    Catalog& catalog = *st.catalog;
    REQUIRE(st.store->append(catalog.header()).ok());
    REQUIRE(catalog.put_segment("p", Level::Platform, "", "You are a storyteller.").ok());
    REQUIRE(catalog.put_segment("b", Level::Bot, "p", "Tell short stories.").ok());
    REQUIRE(catalog.create_session("b", "s").ok());
    for (int n = 1; n <= 3; ++n) REQUIRE(run_turn(catalog, st.pool, m.fwd, "s", "Part " + std::to_string(n), 8, nullptr).get().ok());
    st.pool.flush_writes();
    auto logged = logged_turns(st.store->path());
    REQUIRE(logged.count({"s", 3}) == 1);
    REQUIRE(logged[{"s", 3}].size() >= 2);
    first_file = st.pool.file_path(logged[{"s", 3}].front());
  }
  REQUIRE(std::filesystem::remove(first_file));
  // One start: restore (and, with `chat`, the session's next message). What it logged.
  auto start = [&](const std::string& name, bool chat) {
    StderrCapture capture(m.dir / (name + ".stderr"));
    test::CatalogState st(m, Config{});
    Catalog& catalog = *st.catalog;
    for (const auto& r : st.records) REQUIRE(catalog.apply(r).ok());
    auto restored = catalog.restore();
    REQUIRE(restored.ok());
    const size_t repaired = restored->sessions_repaired;
    CHECK(catalog.session("s", false)->messages == 6);  // the conversation itself is whole
    if (chat) REQUIRE(run_turn(catalog, st.pool, m.fwd, "s", "Part 4", 8, nullptr).get().ok());
    return std::make_pair(repaired, capture.finish());
  };
  auto [repaired, log] = start("first", false);
  CHECK(repaired == 1);
  CHECK(log.find("transcript segment 1 cannot be used") != std::string::npos);
  // Not structured bindings: CHECK_MESSAGE captures them in a lambda, which clang 14 refuses.
  const auto again = start("second", false);
  const std::string& log_again = again.second;
  CHECK(again.first == 0);
  CHECK_MESSAGE(log_again.find("warning") == std::string::npos, log_again);
  CHECK_MESSAGE(log_again.find("error") == std::string::npos, log_again);
  const auto chat = start("third", true);  // the session still answers
  const std::string& log_chat = chat.second;
  CHECK(chat.first == 0);
  CHECK_MESSAGE(log_chat.find("warning") == std::string::npos, log_chat);
}

// Recovery never invents a conversation (issue 11 item 8): a state log with two sessions' numbered
// turns, every byte flipped in turn; whatever replay makes of the damage, each session served is a
// prefix of its true history (a damaged turn cuts its session there; later turns of it are not
// replayed), and the line that reports the cut names the session.
#include <filesystem>
#include <fstream>

#include "daemon/catalog.h"
#include "daemon/state_store.h"
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
  auto f16 = load_config(toml);
  REQUIRE(f16.ok());
  const std::pair<Config, KvQuant> cases[] = {{Config{}, KvQuant::Q8}, {f16.value(), KvQuant::F16}};
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

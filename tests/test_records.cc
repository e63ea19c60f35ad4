// towerd's state-log records (daemon/records.h): every kind survives payload → struct → payload and a
// StateStore append/compact/reopen unchanged; old payloads (fields added later missing) still read;
// damaged ones are refused with the kind and the field named, never half-applied.
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "daemon/records.h"
#include "daemon/state_store.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;

namespace {

std::vector<Record> one_of_each() {
  record::SessionSnapshot snap{"s-1", "helper", 1700000000, 1700000100,
                               {{"user", "hi \xc3\xa9"}, {"assistant", "hello"}, {"tool", R"([{"tool_call_id":"c","content":"1"}])"}},
                               {1, 2, 3, 50000}, {2, 4}, {7, 9}, 3, {2, 4}, R"([{"name":"f"}])"};
  return {
      record::Header{"tiny-llama", 0xfedcba9876543210ull},
      record::SegmentPut{"acme", Level::Platform, "", "You work for Acme.\n\"Quoted\"", 1700000000},
      record::SegmentPut{"helper", Level::Bot, "acme", "Be brief.", 1700000001, 42},
      record::SegmentTier{"helper", {0, 1, 2, 255, 128, 7}, 1700000002},
      record::SegmentTier{"helper", {}, 1700000003},
      record::SessionCreate{"s-1", "helper", 1700000004},
      record::SessionTurn{"s-1", 1, 0, 0, "hi", "hello", {10, 11}, {12, -1, 13}, {5, 9}, {7, 8}, 1700000005, "", ""},
      record::SessionTurn{"s-1", 2, 1, 5, "again", "yes", {14}, {15}, {5}, {9}, 1700000006, "", ""},
      // A turn of tool results, on the turn that brought the session's tools.
      record::SessionTurn{"s-1", 3, 0, 0, R"([{"tool_call_id":"c","content":"18 C"}])", "ok", {16}, {17}, {7}, {}, 1700000007,
                          "tool", R"([{"name":"get_weather"}])"},
      record::SessionDelete{"s-1"},
      snap,
      // A session at rest: one message found in its transcript's text, one kept verbatim.
      record::SessionRest{"s-2", "helper", 1700000008, 1700000009, 4, {30}, {12, 29}, {11, 13}, {2},
                          {{"user", true, 5, 7, ""}, {"assistant", false, 0, 0, "caf\xc3\xa9 \"x\""}}, ""},
      record::SegmentDelete{"helper"},
  };
}

// Field-by-field equality through the one encoding every reader uses, plus the typed fields that
// matter most (so an encoder that dropped a field on both sides would still be caught).
void check_same(const Record& a, const Record& b) {
  REQUIRE(a.index() == b.index());
  CHECK(record_payload(a) == record_payload(b));
  if (auto* x = std::get_if<record::SessionTurn>(&a)) {
    auto& y = std::get<record::SessionTurn>(b);
    CHECK(x->delta == y.delta);
    CHECK(x->generated == y.generated);
    CHECK(x->seals == y.seals);
    CHECK(x->segments == y.segments);
    CHECK(x->n == y.n);
    CHECK(x->dropped == y.dropped);
    CHECK(x->dropped_tokens == y.dropped_tokens);
    CHECK(x->assistant == y.assistant);
    CHECK(x->role == y.role);
    CHECK(x->tools == y.tools);
  }
  if (auto* x = std::get_if<record::SegmentTier>(&a)) CHECK(x->coded == std::get<record::SegmentTier>(b).coded);
  if (auto* x = std::get_if<record::SegmentPut>(&a)) {
    CHECK(x->level == std::get<record::SegmentPut>(b).level);
    CHECK(x->segment == std::get<record::SegmentPut>(b).segment);
    CHECK(x->text == std::get<record::SegmentPut>(b).text);
  }
  if (auto* x = std::get_if<record::SessionSnapshot>(&a)) {
    auto& y = std::get<record::SessionSnapshot>(b);
    REQUIRE(x->messages.size() == y.messages.size());
    for (size_t i = 0; i < x->messages.size(); ++i) {
      CHECK(x->messages[i].role == y.messages[i].role);
      CHECK(x->messages[i].content == y.messages[i].content);
    }
    CHECK(x->transcript == y.transcript);
    CHECK(x->segments == y.segments);
    CHECK(x->turns == y.turns);
    CHECK(x->turn_ends == y.turn_ends);
    CHECK(x->tools == y.tools);
  }
  if (auto* x = std::get_if<record::SessionRest>(&a)) {
    auto& y = std::get<record::SessionRest>(b);
    CHECK(x->seals == y.seals);
    CHECK(x->segments == y.segments);
    CHECK(x->tail == y.tail);
    CHECK(x->turns == y.turns);
    REQUIRE(x->messages.size() == y.messages.size());
    for (size_t i = 0; i < x->messages.size(); ++i) {
      CHECK(x->messages[i].role == y.messages[i].role);
      CHECK(x->messages[i].in_transcript == y.messages[i].in_transcript);
      CHECK(x->messages[i].offset == y.messages[i].offset);
      CHECK(x->messages[i].length == y.messages[i].length);
      CHECK(x->messages[i].content == y.messages[i].content);
    }
  }
}

}  // namespace

TEST_CASE("levels parse and print") {
  for (Level l : kLevels) CHECK(parse_level(to_string(l)) == l);
  CHECK(!parse_level("Platform"));
  CHECK(!parse_level(""));
  CHECK(Level::Platform < Level::Community);
  CHECK(Level::Community < Level::Bot);
}

TEST_CASE("every record kind round-trips through its payload") {
  for (const Record& r : one_of_each()) {
    CAPTURE(record_type_name(type_of(r)));
    auto back = parse_record(type_of(r), record_payload(r));
    REQUIRE_MESSAGE(back.ok(), back.error());
    check_same(r, back.value());
  }
}

TEST_CASE("payloads written before a field existed still read") {
  auto put = parse_record(RecordType::SegmentPut, R"({"name":"a","level":"community","parent":"p","text":"t"})");
  REQUIRE_MESSAGE(put.ok(), put.error());
  CHECK(std::get<record::SegmentPut>(put.value()).level == Level::Community);
  CHECK(std::get<record::SegmentPut>(put.value()).updated == 0);
  auto tier = parse_record(RecordType::SegmentTier, R"({"name":"a"})");
  REQUIRE(tier.ok());
  CHECK(std::get<record::SegmentTier>(tier.value()).coded.empty());
}

TEST_CASE("damaged payloads are refused, naming the kind and the field") {
  struct Case {
    RecordType type;
    const char* payload;
    const char* says;
  } cases[] = {
      {RecordType::SegmentPut, R"({"name":"a","level":"galaxy","text":"t"})", "\"level\""},
      {RecordType::SegmentPut, R"({"name":"a","level":"bot"})", "\"text\" is missing"},
      {RecordType::SessionTurn, R"({"id":"s","user":"u","assistant":"a","delta":[1,"x"],"generated":[],"seals":[]})",
       "\"delta\""},
      {RecordType::SessionTurn, R"({"id":"s","user":"u","assistant":"a","delta":[],"generated":[],"seals":[-1]})",
       "\"seals\""},
      {RecordType::SegmentTier, R"({"name":"a","coded":"!!not base64!!"})", "\"coded\""},
      {RecordType::SessionSnapshot, R"({"id":"s","bot":"b","messages":[{"role":"user"}],"transcript":[],"seals":[]})",
       "\"messages\""},
      {RecordType::SessionRest,
       R"({"id":"s","bot":"b","turns":1,"turn_ends":[3],"seals":[2],"segments":[5],"tail":[1],"messages":[{"role":"user","at":[1]}]})",
       "\"at\" that is not [offset, length]"},
      {RecordType::SessionRest, R"({"id":"s","bot":"b","turns":1,"turn_ends":[3],"seals":[2],"segments":[5],"messages":[]})",
       "\"tail\" is missing"},
      {RecordType::Header, R"([1,2])", "not a JSON object"},
      {RecordType::Header, R"({"model":"m","fingerprint":-5})", "\"fingerprint\""},
      {static_cast<RecordType>(99), R"({})", "unknown record type"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.payload);
    auto r = parse_record(c.type, c.payload);
    REQUIRE(!r.ok());
    CHECK(r.status().is_corruption());
    CHECK_MESSAGE(r.error().find(c.says) != std::string::npos, r.error());
  }
}

TEST_CASE("the state store appends, compacts and replays typed records") {
  const auto dir = test::temp_dir() / "records-state";
  std::filesystem::remove_all(dir);
  const auto all = one_of_each();
  {
    std::vector<Record> replayed;
    std::vector<std::string> problems;
    auto store = StateStore::open(dir, replayed, problems);
    REQUIRE_MESSAGE(store.ok(), store.error());
    CHECK(replayed.empty());
    for (const auto& r : all) REQUIRE(store.value()->append(r).ok());
  }
  {
    std::vector<Record> replayed;
    std::vector<std::string> problems;
    auto store = StateStore::open(dir, replayed, problems);
    REQUIRE_MESSAGE(store.ok(), store.error());
    CHECK(problems.empty());
    REQUIRE(replayed.size() == all.size());
    for (size_t i = 0; i < all.size(); ++i) check_same(all[i], replayed[i]);
    // Compaction keeps what it is given, in order.
    std::vector<Record> live(all.begin(), all.begin() + 3);
    REQUIRE(store.value()->compact(live).ok());
  }
  std::vector<Record> replayed;
  std::vector<std::string> problems;
  auto store = StateStore::open(dir, replayed, problems);
  REQUIRE_MESSAGE(store.ok(), store.error());
  REQUIRE(replayed.size() == 3);
  for (size_t i = 0; i < 3; ++i) check_same(all[i], replayed[i]);
}

TEST_CASE("an append_async callback that waits for a lock whose holder appends does not stop the log") {
  // The load test's deadlock: a turn's settle callback took the catalog's lock while the lock's holder
  // waited for its own record. Callbacks run off the writer thread, so the holder's record is written
  // and it lets go.
  const auto dir = test::temp_dir() / "records-callback-lock";
  std::filesystem::remove_all(dir);
  std::vector<Record> replayed;
  std::vector<std::string> problems;
  auto store = StateStore::open(dir, replayed, problems);
  REQUIRE_MESSAGE(store.ok(), store.error());
  const auto all = one_of_each();
  std::mutex catalog;
  std::unique_lock holder(catalog);  // this thread plays the holder
  std::mutex m;
  std::condition_variable cv;
  bool callback_entered = false, callback_done = false;
  store.value()->append_async(all[0], [&](const Status& st) {
    CHECK(st.ok());
    {
      std::lock_guard l(m);
      callback_entered = true;
    }
    cv.notify_all();
    std::lock_guard wait_for_holder(catalog);
    std::lock_guard l(m);
    callback_done = true;
    cv.notify_all();
  });
  {
    std::unique_lock l(m);
    cv.wait(l, [&] { return callback_entered; });  // the callback now waits for `catalog`
  }
  CHECK(store.value()->append(all[1]).ok());  // must not wait for the callback
  holder.unlock();
  std::unique_lock l(m);
  cv.wait(l, [&] { return callback_done; });
  CHECK(callback_done);
}

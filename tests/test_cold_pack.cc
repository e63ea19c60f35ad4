// Packed cold records (mmapstore/cold_pack.h): records come back byte for byte after a reopen that
// reads only the index; torn tails are cut; a damaged record is an error, never bytes; and over a
// file system that crashes, tears writes and fails syncs, every acknowledged record survives.
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "fault_injection_fs.h"
#include "mmapstore/cold_pack.h"
#include "mmapstore/rest_table.h"
#include "test_support.h"

using namespace towers;
using test::FaultInjectionFS;

namespace {

// The packs' directory, as in a store: made by the first append.
std::filesystem::path fresh_dir(const std::string& name) { return test::fresh_dir(name) / "cold"; }

std::vector<uint8_t> record_of(uint64_t id, size_t n) {
  std::vector<uint8_t> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = static_cast<uint8_t>(id * 31 + i * 7);
  return r;
}

ColdPut put_of(uint64_t id, const std::vector<uint8_t>& rec) {
  return {id, id / 2, id * 0x9E3779B97F4A7C15ull, static_cast<int32_t>(id + 10), rec};
}

void append_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::app) << bytes;
}

}  // namespace

TEST_CASE("cold pack: records come back after a reopen that reads only the index, removal, rollover") {
  const auto dir = fresh_dir("cold-pack");
  std::map<uint64_t, std::vector<uint8_t>> records;
  {
    auto pack = ColdPack::open(dir, posix_fs(), {.pack_bytes = 1000});
    REQUIRE_MESSAGE(pack.ok(), pack.error());
    for (uint64_t batch = 0; batch < 5; ++batch) {
      std::vector<ColdPut> puts;
      for (uint64_t i = 0; i < 4; ++i) {
        const uint64_t id = 1 + batch * 4 + i;
        records[id] = record_of(id, 100 + id * 13);
      }
      for (uint64_t i = 0; i < 4; ++i) puts.push_back(put_of(1 + batch * 4 + i, records[1 + batch * 4 + i]));
      auto refs = pack.value()->append(puts);
      REQUIRE_MESSAGE(refs.ok(), refs.error());
      REQUIRE(refs->size() == 4);
      for (const auto& r : refs.value()) CHECK(pack.value()->read(r).value() == records[r.id]);
    }
    const uint64_t gone[] = {3, 7, 99};
    REQUIRE(pack.value()->remove(gone).ok());
    records.erase(3), records.erase(7);
    const ColdPackStats st = pack.value()->stats();
    CHECK(st.records == 18);
    CHECK(st.packs > 1);  // 1000-byte packs
    CHECK(st.index_bytes == 22 * kColdIndexEntryBytes);
    uint64_t live = 0;
    for (const auto& [id, r] : records) live += r.size();
    CHECK(st.record_bytes == live);
    CHECK(st.dead_bytes == st.pack_bytes - live);
  }
  ColdPackReport rep;
  auto pack = ColdPack::open(dir, posix_fs(), {.pack_bytes = 1000}, &rep);
  REQUIRE(pack.ok());
  CHECK(rep.entries == 22);
  CHECK(rep.live == 18);
  CHECK(rep.damaged == 0);
  CHECK(rep.torn_index_bytes == 0);
  auto entries = pack.value()->entries();
  REQUIRE(entries.size() == records.size());
  for (const ColdRecordRef& r : entries) {
    CAPTURE(r.id);
    CHECK(r.parent == r.id / 2);
    CHECK(r.tokens_xxh3 == r.id * 0x9E3779B97F4A7C15ull);
    CHECK(r.tokens == static_cast<int32_t>(r.id + 10));
    CHECK(pack.value()->read(r).value() == records.at(r.id));
  }
  CHECK_FALSE(pack.value()->find(3, nullptr));
  // Appending goes on after the reopen, into the last pack or a new one.
  const auto rec = record_of(50, 40);
  const ColdPut more[] = {put_of(50, rec)};
  auto ref = pack.value()->append(more);
  REQUIRE(ref.ok());
  CHECK(pack.value()->read(ref->at(0)).value() == rec);
}

TEST_CASE("cold pack: a torn tail is cut at open, a damaged entry skipped, a damaged record never served") {
  const auto dir = fresh_dir("cold-pack-torn");
  std::vector<ColdRecordRef> refs;
  const auto r1 = record_of(1, 300), r2 = record_of(2, 200);
  {
    auto pack = ColdPack::open(dir);
    REQUIRE(pack.ok());
    const ColdPut puts[] = {put_of(1, r1), put_of(2, r2)};
    refs = pack.value()->append(puts).value();
  }
  // A crash in the middle of the next append: record bytes and half an entry, never synced.
  append_file(dir / "pack-0.twp", std::string(77, 'x'));
  append_file(dir / "index.twi", std::string(30, 'y'));
  {
    ColdPackReport rep;
    auto pack = ColdPack::open(dir, posix_fs(), {}, &rep);
    REQUIRE(pack.ok());
    CHECK(rep.torn_index_bytes == 30);
    CHECK(rep.torn_pack_bytes == 77);
    CHECK(rep.live == 2);
    CHECK(std::filesystem::file_size(dir / "pack-0.twp") == 500);
    CHECK(std::filesystem::file_size(dir / "index.twi") == 2 * kColdIndexEntryBytes);
  }
  // A flipped byte in the first entry: skipped and reported; the second still there.
  {
    std::fstream f(dir / "index.twi", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x55');
  }
  {
    ColdPackReport rep;
    auto pack = ColdPack::open(dir, posix_fs(), {}, &rep);
    REQUIRE(pack.ok());
    CHECK(rep.damaged == 1);
    CHECK(rep.live == 1);
    REQUIRE(rep.problems.size() == 1);
    CHECK(rep.problems[0].find("checksum") != std::string::npos);
    CHECK(pack.value()->find(2, nullptr));
    CHECK(rep.torn_pack_bytes == 0);  // record 2 ends the pack: nothing after it is cut
  }
  // A flipped byte in a record: read says which segment, and gives no bytes.
  {
    std::fstream f(dir / "pack-0.twp", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(refs[1].offset + 17));
    f.put('\x00');
  }
  auto pack = ColdPack::open(dir);
  REQUIRE(pack.ok());
  auto got = pack.value()->read(refs[1]);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == Status::Code::kCorruption);
  CHECK(got.error().find("segment 2") != std::string::npos);
  CHECK(got.error().find("CRC") != std::string::npos);
}

TEST_CASE("cold pack: an index mostly of dead entries is rewritten at open") {
  const auto dir = fresh_dir("cold-pack-rewrite");
  std::vector<std::vector<uint8_t>> recs;
  {
    auto pack = ColdPack::open(dir);
    REQUIRE(pack.ok());
    std::vector<ColdPut> puts;
    for (uint64_t id = 1; id <= 5000; ++id) recs.push_back(record_of(id, 8));
    for (uint64_t id = 1; id <= 5000; ++id) puts.push_back(put_of(id, recs[id - 1]));
    REQUIRE(pack.value()->append(puts).ok());
    std::vector<uint64_t> gone;
    for (uint64_t id = 1; id <= 4000; ++id) gone.push_back(id);
    REQUIRE(pack.value()->remove(gone).ok());
  }
  ColdPackReport rep;
  auto pack = ColdPack::open(dir, posix_fs(), {}, &rep);
  REQUIRE(pack.ok());
  CHECK(rep.rewrote_index);
  CHECK(rep.live == 1000);
  CHECK(std::filesystem::file_size(dir / "index.twi") == 1000 * kColdIndexEntryBytes);
  for (const ColdRecordRef& r : pack.value()->entries()) REQUIRE(pack.value()->read(r).value() == recs[r.id - 1]);
}

TEST_CASE("cold pack: after any crash or fault, every acknowledged record is there with its bytes, and nothing else") {
  const int runs = 300;
  int faulted = 0, torn_runs = 0;
  for (int run = 0; run < runs; ++run) {
    CAPTURE(run);
    std::mt19937 rng(run);
    const auto dir = fresh_dir("fi-cold-pack");
    FaultInjectionFS fs;
    switch (rng() % 4) {
      case 0: break;
      case 1: fs.faults.fail_sync_after = static_cast<int>(rng() % 10); break;
      case 2: fs.faults.space_left = static_cast<int64_t>(rng() % 6000); break;
      case 3: fs.faults.fail_dir_sync_after = static_cast<int>(rng() % 3); break;
    }
    std::map<uint64_t, std::vector<uint8_t>> acked, maybe;  // maybe: a failed append may have landed
    std::set<uint64_t> removed;
    {
      auto pack = ColdPack::open(dir, fs, {.pack_bytes = 2048});
      if (!pack.ok()) continue;  // the fault hit the creation: nothing acknowledged
      uint64_t id = 1;
      for (int batch = 0; batch < 8; ++batch) {
        std::vector<std::vector<uint8_t>> recs;
        std::vector<ColdPut> puts;
        const int n = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < n; ++i) recs.push_back(record_of(id + i, 1 + rng() % 700));
        for (int i = 0; i < n; ++i) puts.push_back(put_of(id + i, recs[i]));
        auto refs = pack.value()->append(puts);
        for (int i = 0; i < n; ++i) (refs.ok() ? acked : maybe)[id + i] = recs[i];
        faulted += !refs.ok();
        id += n;
        if (batch == 4 && !acked.empty()) {
          const uint64_t gone = acked.begin()->first;
          if (pack.value()->remove(std::span(&gone, 1)).ok()) removed.insert(gone);
          else maybe[gone] = acked[gone];  // its removal may or may not have landed
          acked.erase(gone);
        }
      }
    }
    const bool torn = rng() % 2 == 0;
    torn_runs += torn;
    fs.crash(rng, torn);
    ColdPackReport rep;
    auto pack = ColdPack::open(dir, posix_fs(), {.pack_bytes = 2048}, &rep);
    REQUIRE_MESSAGE(pack.ok(), pack.error());
    CHECK(rep.damaged == 0);  // only tails tear
    for (const auto& one : acked) {  // (no structured binding: CAPTURE's lambda cannot take one on clang 14)
      const uint64_t id = one.first;
      CAPTURE(id);
      ColdRecordRef ref;
      REQUIRE(pack.value()->find(id, &ref));
      REQUIRE(pack.value()->read(ref).value() == one.second);
    }
    for (const ColdRecordRef& ref : pack.value()->entries()) {
      CAPTURE(ref.id);
      REQUIRE((acked.count(ref.id) || maybe.count(ref.id)));
      REQUIRE_FALSE(removed.count(ref.id));
      auto bytes = pack.value()->read(ref);
      REQUIRE_MESSAGE(bytes.ok(), bytes.error());  // an entry never names bytes that are not there
      REQUIRE(bytes.value() == (acked.count(ref.id) ? acked.at(ref.id) : maybe.at(ref.id)));
    }
    // And it takes appends again.
    const auto rec = record_of(999, 33);
    const ColdPut after[] = {put_of(999, rec)};
    auto ref = pack.value()->append(after);
    REQUIRE_MESSAGE(ref.ok(), ref.error());
    CHECK(pack.value()->read(ref->at(0)).value() == rec);
  }
  MESSAGE(runs << " runs, " << torn_runs << " with torn writes, " << faulted << " failed appends");
}

// The pool's records of segments at rest (mmapstore/rest_table.h): random inserts and erases against a
// std::map, every lookup checked after each change (the indexes move records on erase).
TEST_CASE("segments at rest: the compact table finds every record by id and by (parent, hash) through inserts and erases") {
  RestTable table;
  std::map<SegmentId, RestRecord> want;
  std::mt19937_64 rng(7);
  auto check = [&] {
    REQUIRE(table.size() == want.size());
    std::map<SegmentId, std::map<int32_t, uint32_t>> lengths;
    for (const auto& entry : want) {
      // Named, not a structured binding: clang 14 refuses bindings captured by the lambda below.
      const SegmentId id = entry.first;
      const RestRecord& r = entry.second;
      const RestRecord* got = table.find(id);
      REQUIRE(got);
      CHECK(got->parent == r.parent);
      CHECK(got->length == r.length);
      CHECK(got->label == r.label);
      size_t hits = 0;
      table.find_by_hash(r.parent, r.tokens_xxh3, [&](const RestRecord& o) {
        hits += o.id == id;
        return false;
      });
      CHECK(hits == 1);
      lengths[r.parent][r.length]++;
    }
    for (const auto& [parent, by_length] : lengths) {
      const auto* got = table.lengths_below(parent);
      REQUIRE(got);
      CHECK(std::vector<std::pair<int32_t, uint32_t>>(by_length.begin(), by_length.end()) == *got);
    }
  };
  for (int step = 0; step < 6000; ++step) {
    if (want.empty() || rng() % 3 != 0) {
      RestRecord r;
      r.id = 1 + rng() % 5000;
      if (want.count(r.id)) continue;
      r.parent = 1 + rng() % 4;
      r.tokens_xxh3 = rng() % 64;  // few distinct hashes: many records share a (parent, hash) key
      r.length = 1 + static_cast<int32_t>(rng() % 5);
      r.label = "session:" + std::to_string(r.id);
      want[r.id] = r;
      table.insert(r);
    } else {
      auto it = want.begin();
      std::advance(it, static_cast<long>(rng() % want.size()));
      table.erase(it->first);
      CHECK_FALSE(table.find(it->first));
      want.erase(it);
    }
    if (step % 500 == 0) check();
  }
  check();
  for (auto it = want.begin(); it != want.end(); it = want.erase(it)) table.erase(it->first);
  CHECK(table.size() == 0);
  CHECK_FALSE(table.lengths_below(1));
  CHECK_FALSE(table.has_children(2));
}

TEST_CASE("segments at rest: a record costs its fixed size and ~2 index slots, no node and no token") {
  RestTable table;
  constexpr size_t kN = 100000;
  table.reserve(kN);  // what a restart does: the packs' index says how many
  for (size_t i = 0; i < kN; ++i) {
    RestRecord r;
    r.id = 1000 + i;
    r.parent = 2 + i % 10;
    r.tokens_xxh3 = i * 0x9e3779b97f4a7c15ull;
    r.length = 4000;
    r.label = "session:" + std::to_string(i);  // fits std::string's own buffer
    table.insert(std::move(r));
  }
  const double per_record = static_cast<double>(table.bytes()) / kN;
  MESSAGE("bytes per segment at rest: " << per_record << " (record " << sizeof(RestRecord) << ")");
  CHECK(per_record < sizeof(RestRecord) + 48);  // a full pool entry and its map node were ~370 B
}

// The daemon's record log: round trips, torn tails, flipped bits (the bad record is reported and
// skipped, never served, and reading continues after it), compaction.
#include <fstream>
#include <random>

#include "mmapstore/record_log.h"
#include "test_support.h"

using namespace towers;

namespace {

std::filesystem::path fresh(const std::string& name) {
  auto p = test::temp_dir() / ("record-log-" + name);
  std::filesystem::remove(p);
  return p;
}

std::vector<LogRecord> read_all(const std::filesystem::path& p, LogReadReport* report = nullptr) {
  std::vector<LogRecord> out;
  auto r = read_record_log(p, [&](const LogRecord& rec) { out.push_back(rec); });
  REQUIRE_MESSAGE(r.ok(), r.error());
  if (report) *report = r.value();
  return out;
}

std::string payload_for(int i) {
  std::string s = "record " + std::to_string(i) + ":";
  s.append(static_cast<size_t>(i * 37 % 300), static_cast<char>('a' + i % 26));
  return s;
}

std::filesystem::path write_n(const std::string& name, int n) {
  auto p = fresh(name);
  auto w = RecordLogWriter::open(p);
  REQUIRE_MESSAGE(w.ok(), w.error());
  for (int i = 0; i < n; ++i) REQUIRE(w.value()->append(static_cast<uint8_t>(1 + i % 3), payload_for(i), i % 4 == 0).ok());
  return p;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void spit(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

}  // namespace

TEST_CASE("crc32c known answers") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);  // RFC 3720 B.4
  // Incremental equals one-shot.
  CHECK(crc32c("56789", crc32c("1234")) == crc32c("123456789"));
}

TEST_CASE("round trip, append after reopen, empty and missing files") {
  auto p = write_n("roundtrip", 50);
  LogReadReport rep;
  auto recs = read_all(p, &rep);
  REQUIRE(recs.size() == 50);
  CHECK(rep.damaged == 0);
  CHECK_FALSE(rep.torn_tail);
  for (int i = 0; i < 50; ++i) {
    CHECK(recs[i].type == 1 + i % 3);
    CHECK(recs[i].payload == payload_for(i));
  }
  {
    auto w = RecordLogWriter::open(p);
    REQUIRE(w.ok());
    CHECK(w.value()->size() == std::filesystem::file_size(p));
    REQUIRE(w.value()->append(9, "", true).ok());  // empty payload is fine
    CHECK_FALSE(w.value()->append(0, "x", true).ok());
  }
  recs = read_all(p);
  REQUIRE(recs.size() == 51);
  CHECK(recs.back().type == 9);
  CHECK(recs.back().payload.empty());

  CHECK(read_all(fresh("missing")).empty());
  auto e = fresh("empty");
  spit(e, "");
  CHECK(read_all(e).empty());
}

TEST_CASE("torn tail: every truncation keeps exactly the whole records and the writer cuts the rest") {
  auto p = write_n("torn-src", 6);
  const std::string full = slurp(p);
  std::vector<uint64_t> ends;
  for (const auto& r : read_all(p)) ends.push_back(r.offset + kRecordHeaderBytes + r.payload.size());
  auto t = fresh("torn");
  for (size_t cut = 0; cut <= full.size(); ++cut) {
    spit(t, full.substr(0, cut));
    LogReadReport rep;
    auto recs = read_all(t, &rep);
    size_t whole = 0;
    while (whole < ends.size() && ends[whole] <= cut) ++whole;
    REQUIRE(recs.size() == whole);
    CHECK(rep.damaged == 0);
    CHECK(rep.torn_tail == (cut != (whole ? ends[whole - 1] : 0)));
  }
  // Reopening for append cuts the torn tail; new records follow the last whole one.
  spit(t, full.substr(0, full.size() - 3));
  LogReadReport rep;
  auto w = RecordLogWriter::open(t, &rep);
  REQUIRE(w.ok());
  CHECK(rep.torn_tail);
  REQUIRE(w.value()->append(2, "after", true).ok());
  auto recs = read_all(t, &rep);
  REQUIRE(recs.size() == 6);
  CHECK(recs[4].payload == payload_for(4));
  CHECK(recs[5].payload == "after");
  CHECK_FALSE(rep.torn_tail);
}

TEST_CASE("flipped bits: the damaged record is reported and skipped, the others are all served") {
  auto p = write_n("flip-src", 20);
  const std::string full = slurp(p);
  const auto good = read_all(p);
  auto t = fresh("flip");
  std::mt19937 rng(42);
  // Every byte of record 7 (header and payload), and random bytes anywhere.
  std::vector<size_t> positions;
  for (size_t i = good[7].offset; i < good[8].offset; ++i) positions.push_back(i);
  for (int i = 0; i < 300; ++i) positions.push_back(rng() % full.size());
  for (size_t pos : positions) {
    std::string bad = full;
    bad[pos] = static_cast<char>(bad[pos] ^ (1u << (rng() % 8)));
    spit(t, bad);
    LogReadReport rep;
    auto recs = read_all(t, &rep);
    // Which record held the byte.
    size_t hit = 0;
    while (hit + 1 < good.size() && good[hit + 1].offset <= pos) ++hit;
    REQUIRE_MESSAGE(recs.size() == good.size() - 1, "flip at " << pos);
    CHECK(rep.damaged + (rep.torn_tail ? 1 : 0) == 1);
    CHECK_FALSE(rep.problems.empty());
    size_t j = 0;
    for (size_t i = 0; i < good.size(); ++i) {
      if (i == hit) continue;
      REQUIRE(recs[j].payload == good[i].payload);
      CHECK(recs[j].type == good[i].type);
      ++j;
    }
  }
}

TEST_CASE("garbage between records and a damaged middle survive reopening, compaction drops them") {
  auto p = write_n("garbage", 10);
  std::string bytes = slurp(p);
  const auto good = read_all(p);
  bytes.insert(good[5].offset, "\x57\x7Ehello garbage\x57\x7E\x00\x00\x00\x00");
  spit(p, bytes);
  LogReadReport rep;
  auto recs = read_all(p, &rep);
  CHECK(recs.size() == 10);
  CHECK(rep.damaged == 1);
  {
    auto w = RecordLogWriter::open(p);
    REQUIRE(w.ok());
    REQUIRE(w.value()->append(1, "tail", true).ok());
  }
  recs = read_all(p);
  REQUIRE(recs.size() == 11);
  std::vector<RecordToWrite> live;
  for (const auto& r : recs) live.push_back({r.type, r.payload});
  REQUIRE(rewrite_record_log(p, live).ok());
  recs = read_all(p, &rep);
  CHECK(recs.size() == 11);
  CHECK(rep.damaged == 0);
  CHECK(recs.back().payload == "tail");
  CHECK_FALSE(std::filesystem::exists(p.string() + ".compact.tmp"));
}

TEST_CASE("a large record round-trips and an oversized one is refused") {
  auto p = fresh("large");
  auto w = RecordLogWriter::open(p);
  REQUIRE(w.ok());
  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>(i / 4096);
  REQUIRE(w.value()->append(5, big, true).ok());
  CHECK_FALSE(w.value()->append(5, std::string(kMaxRecordBytes + 1, 'y'), false).ok());
  auto recs = read_all(p);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].payload == big);
}

// Crash safety of the store, by fault injection (LevelDB's db/fault_injection_test.cc is the model):
// the record log and the segment files are written through a FileSystem that loses unsynced bytes and
// unsynced names at a "crash", tears writes, and fails fsync, rename, directory sync or space on
// request. After each, reopening loses nothing that was acknowledged and never serves a wrong byte.
#include <random>

#include "fault_injection_fs.h"
#include "mmapstore/record_log.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_pool.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;
using test::FaultInjectionFS;

namespace {

std::vector<std::string> read_all(const std::filesystem::path& path) {
  std::vector<std::string> out;
  auto rep = read_record_log(path, [&](const LogRecord& r) { out.push_back(r.payload); });
  REQUIRE(rep.ok());
  return out;
}

// A random fault plan for one run.
FaultInjectionFS::Faults random_faults(std::mt19937& rng) {
  FaultInjectionFS::Faults f;
  switch (rng() % 5) {
    case 0: break;
    case 1: f.fail_sync_after = static_cast<int>(rng() % 12); break;
    case 2: f.space_left = static_cast<int64_t>(rng() % 3000); break;
    case 3: f.fail_rename_after = 0; break;
    case 4: f.fail_dir_sync_after = static_cast<int>(rng() % 2); break;
  }
  return f;
}

}  // namespace

TEST_CASE("record log: after any crash or fault, every acknowledged record is there, in order, and nothing else") {
  const int runs = 300;
  int torn_runs = 0, faulted_appends = 0, compactions = 0;
  for (int run = 0; run < runs; ++run) {
    CAPTURE(run);
    std::mt19937 rng(run);
    const auto dir = test::fresh_dir("fi-log");
    const auto path = dir / "towerd.log";
    FaultInjectionFS fs;
    fs.faults = random_faults(rng);
    std::vector<std::string> appended;  // in order; a failed append is not in it
    size_t acked = 0;                   // appended[0, acked) are acknowledged (a sync returned ok)
    {
      auto w = RecordLogWriter::open(path, nullptr, fs);
      if (!w.ok()) continue;  // the fault hit the creation itself: nothing was acknowledged
      for (int i = 0; i < 24; ++i) {
        std::string payload = "run " + std::to_string(run) + " record " + std::to_string(i) + " " +
                              std::string(rng() % 300, static_cast<char>('a' + i % 26));
        const bool sync = rng() % 3 != 0;
        Status st = w.value()->append(1 + i % 7, payload, sync);
        if (st.ok()) {
          appended.push_back(payload);
          if (sync) acked = appended.size();
        } else {
          ++faulted_appends;
          // A write error cut the record back: it is not in the log. A failed sync leaves the record's
          // bytes in an unknown state: it may or may not survive, but the writer refuses anything after.
          if (st.message().find("fdatasync") != std::string::npos) appended.push_back(payload);
        }
        if (i == 12 && rng() % 3 == 0) {
          // Compaction of what is acknowledged, itself exposed to the faults.
          ++compactions;
          std::vector<RecordToWrite> live;
          for (size_t k = 0; k < acked; ++k) live.push_back({1, appended[k]});
          if (rewrite_record_log(path, live, fs).ok()) {
            appended.resize(acked);
            w = RecordLogWriter::open(path, nullptr, fs);
            if (!w.ok()) break;
          } else {
            break;  // the daemon keeps the old log and its writer; here the run just ends
          }
        }
      }
    }
    const bool torn = rng() % 2 == 0;
    torn_runs += torn;
    fs.crash(rng, torn);
    auto got = read_all(path);
    // What survives is a prefix of what was appended (the log never reorders or invents), at least
    // everything acknowledged. (Compaction may have rewritten the type byte: only payloads count.)
    REQUIRE(got.size() >= acked);
    REQUIRE(got.size() <= appended.size());
    for (size_t k = 0; k < got.size(); ++k) REQUIRE(got[k] == appended[k]);
    // And it opens for writing again: a torn tail is cut, new records follow the old ones.
    auto w = RecordLogWriter::open(path);
    REQUIRE_MESSAGE(w.ok(), w.error());
    REQUIRE(w.value()->append(1, "after the crash", true).ok());
    auto again = read_all(path);
    REQUIRE(again.size() == got.size() + 1);
    CHECK(again.back() == "after the crash");
  }
  MESSAGE(runs << " runs, " << torn_runs << " with torn writes, " << faulted_appends << " failed appends, "
               << compactions << " compactions");
}

TEST_CASE("segment files: a file the writer acknowledged survives a crash, anything else fails cleanly") {
  auto model = test::synth_tiny("fault-injection", "f16");
  ThreadPool threads(1);
  Forward fwd(*model, threads, Kernels::Reference);
  const int runs = 40;
  int adopted = 0, refused = 0;
  for (int run = 0; run < runs; ++run) {
    CAPTURE(run);
    std::mt19937 rng(1000 + run);
    const auto dir = test::fresh_dir("fi-segments");
    FaultInjectionFS fs;
    fs.faults = random_faults(rng);
    if (fs.faults.space_left >= 0) fs.faults.space_left *= 20;
    PoolOptions o;
    o.store_dir = dir;
    o.fs = &fs;
    o.model_fingerprint = 42;
    struct Made {
      SegmentId id, parent;
      std::vector<int32_t> tokens;
      std::vector<uint8_t> k;
      bool durable;
    };
    std::vector<Made> made;
    {
      SegmentPool pool(*model, fwd, o);
      SegmentId parent = kNoSegment;
      for (int i = 0; i < 4; ++i) {
        std::vector<int32_t> toks(3 + rng() % 6);
        for (auto& t : toks) t = static_cast<int32_t>(rng() % model->config().n_vocab);
        auto id = pool.add(parent, toks);
        REQUIRE_MESSAGE(id.ok(), id.error());
        made.push_back({id.value(), parent, toks, test::to_vec(pool.get(id.value())->k_bytes()), false});
        parent = id.value();
      }
      pool.flush_writes();
      for (auto& m : made) m.durable = pool.info(m.id)->durable;
    }
    fs.crash(rng, rng() % 2 == 0);
    // A restart: adopt parents first; a segment whose file is bad or missing is rebuilt (here: stop).
    ThreadPool t2(1);
    Forward f2(*model, t2, Kernels::Reference);
    PoolOptions o2 = o;
    o2.fs = nullptr;
    SegmentPool pool(*model, f2, o2);
    for (const auto& m : made) {
      AdoptSpec spec;
      spec.id = m.id;
      spec.parent = m.parent;
      spec.tokens = m.tokens;
      Status st = pool.adopt(spec);
      if (m.durable) REQUIRE_MESSAGE(st.ok(), st.message());  // acknowledged: must be there
      if (!st.ok()) {
        CHECK((st.is_not_found() || st.is_corruption()));
        ++refused;
        break;  // children of a missing segment cannot be adopted
      }
      // Whatever is adopted and paged in holds exactly the bytes computed before the crash.
      const SegmentId id = m.id;
      Status paged = pool.page_in(std::span(&id, 1));
      if (m.durable) REQUIRE(paged.ok());
      if (!paged.ok()) {
        ++refused;
        break;
      }
      CHECK(test::to_vec(pool.get(m.id)->k_bytes()) == m.k);
      ++adopted;
    }
  }
  MESSAGE(adopted << " segments adopted after crashes, " << refused << " refused cleanly");
}

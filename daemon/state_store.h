// towerd's persistent state: one record log (mmapstore/record_log.h) at <state_dir>/towerd.log of the
// records in daemon/records.h, one per change.
// The directory is locked (flock on <state_dir>/towerd.lock) while a StateStore is open.
// fsync policy: a record is acknowledged (append returns, or append_async calls back) only once it
// is durable. Records and compactions go through one queue and one writer thread with group commit
// (LevelDB's DBImpl::Write is the model): every record queued while a sync runs is written behind it
// and made durable by the next single fdatasync, so many replies finishing together cost one sync.
// Who waits: append_async and compact_async only queue (no I/O on the caller's thread), so the
// catalog queues its records while it holds its lock — the log's order is the order its state
// changed — and waits for them after releasing it (daemon/catalog.h); append and compact wait, and
// must not be called under a lock whose holder may not wait (engine/base/no_wait_lock.h: checked).
// The scheduler thread never waits on the log. A reply that was cancelled (client gone, shutdown) is
// not recorded: the session stays as it was before the message.
// Compaction rewrites the live state as header + segment_put (+ segment_tier) + session_snapshot
// records (new file, fsync, rename, fsync of the directory) when the log exceeds [state] compact_bytes
// and at least half of it is dead; queued like a record, it replaces everything queued before it.
// After a failed fsync the log refuses every later write (mmapstore/record_log.h: no retry on a page
// cache that may have dropped the data); so does a compacted log that cannot be reopened.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/records.h"
#include "mmapstore/record_log.h"

namespace towers::daemon {

class StateStore {
 public:
  // Opens (creating the directory and log as needed) and returns every valid record in order.
  // Damaged records are skipped; `problems` says where (the daemon logs them).
  static Result<std::unique_ptr<StateStore>> open(const std::filesystem::path& dir, std::vector<Record>& records,
                                                  std::vector<std::string>& problems, FileSystem& fs = posix_fs());
  // Appends and waits until the record is durable.
  Status append(const Record& record);
  // Appends without waiting: `done` runs once the record is durable (ok) or cannot be (the error), in
  // the order records were appended, on the store's completion thread — never on the writer thread,
  // so a `done` that waits for a lock whose holder is appending cannot stop the log (a deadlock the
  // load test found: a turn's settle waited for the catalog, the catalog's holder for its record).
  // done may be empty.
  void append_async(const Record& record, std::function<void(const Status&)> done);
  // Rewrites the log as exactly `live`, after every record queued before the call (their state is
  // what `live` describes) and before any queued after it: queued now, `done` runs once the new log
  // is durable (or the old one stays: the error), on the completion thread like append_async's.
  void compact_async(std::vector<Record> live, std::function<void(const Status&)> done);
  // compact_async and wait.
  Status compact(const std::vector<Record>& live);
  uint64_t bytes() const;
  uint64_t syncs() const;  // fdatasyncs so far (group commit makes them fewer than records)
  // bytes() and syncs() never wait for the writer.
  ~StateStore();          // writes what is queued, then stops
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Pending {
    uint8_t type = 0;
    std::string payload;
    std::function<void(const Status&)> done;
    bool signal_only = false;  // done only wakes a waiter (append, compact): run on the writer thread
    std::shared_ptr<const std::vector<Record>> compaction;  // set: rewrite the log as these records
  };
  explicit StateStore(FileSystem& fs) : fs_(fs) {}
  void loop();
  void complete_loop();
  void enqueue(Pending p);
  Status enqueue_and_wait(Pending p);  // p.done is set here: wakes the caller
  Status rewrite_locked(const std::vector<Record>& live);  // writer thread, write_mu_ held

  FileSystem& fs_;
  std::filesystem::path path_;
  int lock_fd_ = -1;  // holds the directory's flock
  // The writer thread owns writer_ while it writes a batch.
  mutable std::mutex write_mu_;
  std::unique_ptr<RecordLogWriter> writer_;
  Status failed_;  // the first failure: every later write fails with it (write_mu_)
  std::atomic<uint64_t> bytes_{0}, syncs_{0};
  mutable std::mutex mu_;  // the queue
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  bool stop_ = false;
  std::thread thread_;
  // Callbacks of append_async, run in order by completer_.
  std::mutex completions_mu_;
  std::condition_variable completions_wake_;
  std::deque<std::pair<std::function<void(const Status&)>, Status>> completions_;
  bool completions_stop_ = false;
  std::thread completer_;
};

}  // namespace towers::daemon

// towerd's persistent state: one record log (mmapstore/record_log.h) at <state_dir>/towerd.log of the
// records in daemon/records.h, one per change.
// The directory is locked (flock on <state_dir>/towerd.lock) while a StateStore is open.
// fsync policy: every record is appended with fdatasync before the client gets its answer (segment
// and session changes when they are made, a session turn at the end of its reply). A reply that was
// cancelled (client gone, shutdown) is not recorded: the session stays as it was before the message.
// Compaction rewrites the live state as header + segment_put (+ segment_tier) + session_snapshot
// records (new file, fsync, rename, fsync of the directory) when the log exceeds [state] compact_bytes
// and at least half of it is dead.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/records.h"
#include "mmapstore/record_log.h"

namespace towers::daemon {

class StateStore {
 public:
  // Opens (creating the directory and log as needed) and returns every valid record in order.
  // Damaged records are skipped; `problems` says where (the daemon logs them).
  static Result<std::unique_ptr<StateStore>> open(const std::filesystem::path& dir, std::vector<Record>& records,
                                                  std::vector<std::string>& problems);
  Status append(const Record& record);  // synced
  Status compact(const std::vector<Record>& live);
  uint64_t bytes() const;
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  StateStore() = default;
  std::filesystem::path path_;
  mutable std::mutex mu_;
  std::unique_ptr<RecordLogWriter> writer_;
  int lock_fd_ = -1;  // holds the directory's flock
};

}  // namespace towers::daemon

// towerd's persistent state: one record log (mmapstore/record_log.h) at <state_dir>/towerd.log whose
// records are JSON objects, one per change:
//   header           {model, fingerprint}                       written when the log is created/compacted
//   segment_put      {name, level, parent, text}                 define or update a hierarchy segment
//   segment_delete   {name}
//   session_create   {id, bot, created}
//   session_turn     {id, user, assistant, delta, generated, seals, at}   one completed reply
//   session_delete   {id}
//   session_snapshot {id, bot, created, updated, messages, transcript, seals}  (written by compaction)
//   segment_tier     {name, coded?, at}   a hierarchy segment's tier at rest: with `coded` (base64 codec
//                                         container of its tokens) it restarts cold, without it hot
// The directory is locked (flock on <state_dir>/towerd.lock) while a StateStore is open.
// fsync policy: every record is appended with fdatasync before the client gets its answer (segment
// and session changes when they are made, a session turn at the end of its reply). A reply that was
// cancelled (client gone, shutdown) is not recorded: the session stays as it was before the message.
// Compaction rewrites the live state as header + segment_put + session_snapshot records (new file,
// fsync, rename, fsync of the directory) when the log exceeds [state] compact_bytes and at least half
// of it is dead.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mmapstore/record_log.h"

namespace towers::daemon {

enum class RecordType : uint8_t {
  Header = 1,
  SegmentPut = 2,
  SegmentDelete = 3,
  SessionCreate = 4,
  SessionTurn = 5,
  SessionDelete = 6,
  SessionSnapshot = 7,
  SegmentTier = 8,
};
const char* record_type_name(RecordType t);

class StateStore {
 public:
  struct Replayed {
    RecordType type;
    nlohmann::json body;
  };
  // Opens (creating the directory and log as needed) and returns every valid record in order.
  // Damaged records are skipped; `problems` says where (the daemon logs them).
  static Result<std::unique_ptr<StateStore>> open(const std::filesystem::path& dir, std::vector<Replayed>& records,
                                                  std::vector<std::string>& problems);
  Status append(RecordType type, const nlohmann::json& body);  // synced
  Status compact(const std::vector<std::pair<RecordType, nlohmann::json>>& live);
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

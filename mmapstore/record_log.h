// An append-only log of checksummed records (LevelDB's log idea, without its 32 KiB blocks): the
// daemon's crash-safe store of segment definitions and session transcripts.
//
// On disk: a file of records, each
//   magic  u16  0x7E57 (little-endian bytes 57 7E): where a record may start, for resynchronising
//   crc    u32  CRC32C (Castagnoli) of length ‖ type ‖ payload, masked as LevelDB does
//   length u32  payload bytes (at most kMaxRecordBytes)
//   type   u8   caller-defined, 1..255 (0 is never written)
//   payload
// Integers are little-endian. There is no file header: an empty file is an empty log.
//
// Reading never serves a damaged record. A record whose checksum fails (flipped bits) or whose
// header is impossible is reported and skipped; reading resumes at the next position where a record
// with a valid checksum starts (a scan for the magic, each candidate verified by its CRC), so one bad
// record costs only itself. Bytes after the last valid record that hold no valid record are a torn
// tail (a crash during an append): reported, and cut off when the log is next opened for writing.
//
// Durability: append(..., sync=true) returns after fdatasync, so a record acknowledged that way
// survives a crash or power loss; sync=false leaves it to the next synced append or sync().
// Creating the file also fsyncs its directory. rewrite_record_log() (compaction) writes a new file
// beside the old one, fsyncs it, renames it over the old one and fsyncs the directory: a crash at any
// point leaves either the old log or the new one, never a mix.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/status.h"
#include "mmapstore/posix_file.h"

namespace towers {

inline constexpr uint32_t kMaxRecordBytes = 64u << 20;
inline constexpr size_t kRecordHeaderBytes = 11;

// CRC32C (Castagnoli polynomial, reflected), as in iSCSI/ext4/LevelDB; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

struct LogRecord {
  uint8_t type = 0;
  std::string payload;
  uint64_t offset = 0;  // of its header in the file
};

struct LogReadReport {
  size_t records = 0;          // delivered to the callback
  size_t damaged = 0;          // damaged regions skipped (each may span one or more records)
  uint64_t skipped_bytes = 0;  // bytes not delivered (damaged regions and the torn tail)
  bool torn_tail = false;      // the file ends in bytes that hold no valid record
  uint64_t valid_end = 0;      // end of the last valid record
  uint64_t file_bytes = 0;
  std::vector<std::string> problems;  // one line per damaged region or torn tail, with its offset
};

// Calls fn for every valid record in file order. A missing file is an empty log. Errors only when the
// file cannot be read at all.
Result<LogReadReport> read_record_log(const std::filesystem::path& path,
                                      const std::function<void(const LogRecord&)>& fn);

// The encoded form of one record (header + payload), for tests and rewrite.
std::string encode_record(uint8_t type, std::string_view payload);

class RecordLogWriter {
 public:
  // Opens (creating it if absent) for appending. A torn tail is cut off first (report->torn_tail says
  // so); damaged regions in the middle stay (readers skip them; compaction drops them).
  static Result<std::unique_ptr<RecordLogWriter>> open(const std::filesystem::path& path,
                                                      LogReadReport* report = nullptr, FileSystem& fs = posix_fs());
  ~RecordLogWriter();
  RecordLogWriter(const RecordLogWriter&) = delete;
  RecordLogWriter& operator=(const RecordLogWriter&) = delete;

  // type must be 1..255, payload at most kMaxRecordBytes. On a failed write the file is cut back to
  // its previous end, so a half-written record never precedes later ones. After a failed sync (or a
  // cut-back that failed) the writer refuses every later append with that error: what reached the
  // disk is unknown, and a record acknowledged behind a hole would replay out of order.
  Status append(uint8_t type, std::string_view payload, bool sync);
  Status sync();
  uint64_t size() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  RecordLogWriter(std::filesystem::path path, std::unique_ptr<WritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  std::filesystem::path path_;
  std::unique_ptr<WritableFile> file_;
  Status failed_;
};

// Compaction: atomically replaces `path` by a log holding exactly `records` (type, payload), synced.
struct RecordToWrite {
  uint8_t type;
  std::string payload;
};
Status rewrite_record_log(const std::filesystem::path& path, std::span<const RecordToWrite> records,
                          FileSystem& fs = posix_fs());

}  // namespace towers

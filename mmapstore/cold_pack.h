// Packed cold records: the coded records of segments at rest (mmapstore/segment_pool.h), appended to
// a few pack files, and an index a restart reads without reading a record. A session at rest costs
// its coded bytes plus one index entry on disk, and in RAM a fixed entry pointing into a pack.
//
// On disk, in one directory (the store's cold/):
//   pack-<n>.twp   coded records back to back, nothing between them (the index says where each one
//                  is); a new pack starts once the current one holds ColdPackOptions::pack_bytes
//   index.twi      fixed 52-byte entries, appended, little-endian:
//                    id u64 | parent u64 | xxh3 u64 (of the segment's own tokens) | offset u64 |
//                    length u32 (0: the segment's record was removed) | crc u32 (CRC32C of the
//                    record) | tokens i32 | pack u32 | entry_crc u32 (CRC32C of the 48 bytes before)
//                  The last entry of an id wins.
//
// Durability (the record log's discipline, mmapstore/record_log.h): append() writes the records to
// the pack, fdatasyncs it (and the directory when it made a file), then writes their index entries
// and fdatasyncs the index; only then does it return ok, and only then may the caller forget the
// bytes it holds. An entry never names a record that may not be on disk. open() cuts a torn tail
// (index bytes after the last whole entry, pack bytes after the last indexed record), skips an entry
// whose own CRC fails (reported), and rewrites the index when most of it is dead entries. After a
// failed sync the writer refuses every later append (what reached the disk is unknown). read()
// checks the record's CRC: a damaged record is an error naming the segment, never bytes.
//
// Not done: dead records (removed or re-coded segments) stay in their pack until a pack compaction
// (dead_bytes counts them).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/base/status.h"
#include "mmapstore/flat_index.h"
#include "mmapstore/posix_file.h"

namespace towers {

inline constexpr size_t kColdIndexEntryBytes = 52;

// Where one coded record is, and what finds its segment without it.
struct ColdRecordRef {
  uint64_t id = 0, parent = 0;
  uint64_t tokens_xxh3 = 0;  // xxh3_tokens of the segment's own tokens
  int32_t tokens = 0;        // how many
  uint32_t pack = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t crc = 0;  // CRC32C of the record
};

struct ColdPackOptions {
  uint64_t pack_bytes = 1ull << 30;  // a pack file this big is closed and the next one started
};

struct ColdPackReport {
  size_t entries = 0;         // index entries read (live and dead)
  size_t live = 0;            // segments with a record
  size_t damaged = 0;         // index entries whose CRC failed (skipped)
  uint64_t torn_index_bytes = 0, torn_pack_bytes = 0;  // cut off at open
  bool rewrote_index = false;
  std::vector<std::string> problems;
};

struct ColdPackStats {
  size_t records = 0;            // live
  uint64_t record_bytes = 0;     // their bytes
  uint64_t dead_bytes = 0;       // pack bytes no live entry names
  uint64_t index_bytes = 0, pack_bytes = 0;  // file sizes
  size_t packs = 0;
};

// One record to append: the segment it codes and its bytes.
struct ColdPut {
  uint64_t id = 0, parent = 0;
  uint64_t tokens_xxh3 = 0;
  int32_t tokens = 0;
  std::span<const uint8_t> record;
};

class ColdPack {
 public:
  // Opens and reads the index (nothing is created before the first append). Errors only when a file
  // cannot be opened at all.
  static Result<std::unique_ptr<ColdPack>> open(const std::filesystem::path& dir, FileSystem& fs = posix_fs(),
                                               ColdPackOptions options = {}, ColdPackReport* report = nullptr);
  ~ColdPack();
  ColdPack(const ColdPack&) = delete;
  ColdPack& operator=(const ColdPack&) = delete;

  // Appends the records, durably (see the top of this file); the refs, in order. Thread-safe.
  Result<std::vector<ColdRecordRef>> append(std::span<const ColdPut> puts);
  // The segments' records are dead: one index entry each (synced). Unknown ids are ignored.
  Status remove(std::span<const uint64_t> ids);
  // The record's bytes, CRC checked (Corruption naming the segment otherwise).
  Result<std::vector<uint8_t>> read(const ColdRecordRef& ref) const;
  // The live entry of a segment, if any.
  bool find(uint64_t id, ColdRecordRef* ref) const;
  std::vector<ColdRecordRef> entries() const;  // every live entry, by id
  ColdPackStats stats() const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  ColdPack(std::filesystem::path dir, FileSystem& fs, ColdPackOptions options)
      : dir_(std::move(dir)), fs_(fs), options_(options) {}
  std::filesystem::path pack_path(uint32_t pack) const;
  Status ensure_index_locked();  // the directory and the index, made by the first append
  Status append_entries_locked(std::span<const ColdRecordRef> refs);
  int read_fd_locked(uint32_t pack) const;

  std::filesystem::path dir_;
  FileSystem& fs_;
  ColdPackOptions options_;
  mutable std::mutex mu_;
  DenseById<ColdRecordRef> live_;  // by segment id (a restart looks each one up): ~70 B a record
  void put_live_locked(const ColdRecordRef& r);  // adds or replaces r's id, counting live_bytes_
  void drop_live_locked(uint64_t id);           // removes id if live, counting live_bytes_
  uint64_t live_bytes_ = 0;
  std::map<uint32_t, uint64_t> pack_sizes_;  // every pack file's size
  uint32_t current_ = 0;                     // the pack appended to
  std::unique_ptr<WritableFile> pack_, index_;
  bool index_is_new_ = false;  // made by this process, its name not synced yet
  Status failed_;
  mutable std::map<uint32_t, int> read_fds_;
};

}  // namespace towers

// The store's one file seam. Every byte the record log and the segment files write goes through a
// FileSystem, so a test can put one in between that loses what was not synced, fails fsync or
// rename, tears a write or runs out of space (tests/test_fault_injection.cc; LevelDB's
// db/fault_injection_test.cc is the model). Reads do not go through it: a crash changes what is on
// disk, and readers check every byte they trust (checksums), whatever put it there.
//
// Durability contract, as POSIX gives it and the callers rely on:
//   - bytes appended to a file survive a crash only once sync() returned ok;
//   - a file's *name* (creation, rename, removal) survives only once sync_dir() of its directory
//     returned ok after the change;
//   - a failed sync() means nothing about what reached the disk: the caller must treat the file as
//     unknown (the record log cuts back and stops; segment files are rewritten elsewhere).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

#include "engine/base/status.h"

namespace towers {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status append(std::span<const uint8_t> bytes) = 0;
  virtual Status truncate(uint64_t size) = 0;  // cut back to size (after a failed append)
  virtual Status sync() = 0;                   // fdatasync: appended bytes are durable
  virtual uint64_t size() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Opens for appending at the end, creating an empty file when absent.
  virtual Result<std::unique_ptr<WritableFile>> open_append(const std::filesystem::path& path) = 0;
  // Creates a new empty file, replacing any file of that name.
  virtual Result<std::unique_ptr<WritableFile>> create(const std::filesystem::path& path) = 0;
  virtual Status rename(const std::filesystem::path& from, const std::filesystem::path& to) = 0;
  virtual Status remove(const std::filesystem::path& path) = 0;  // a missing file is not an error
  virtual Status sync_dir(const std::filesystem::path& dir) = 0;
};

// The real one (open/write/fdatasync/rename/fsync of the directory).
FileSystem& posix_fs();

// Writes a whole file so that a crash leaves the old file or the new one, never a mix: the parts go
// to "<path>.tmp", which is synced, renamed over path, and the directory synced. Any failure removes
// the temporary file and returns the error (IOError, with the path and the system's reason).
Status write_file_atomic(FileSystem& fs, const std::filesystem::path& path,
                         std::span<const std::span<const uint8_t>> parts);

// "what failed: path: strerror(errno)" as an IOError (ENOSPC and EDQUOT as ResourceExhausted).
Status errno_status(const std::string& what, const std::filesystem::path& path, int err);

}  // namespace towers

// io_uring for the store's bulk file I/O (issue 24, item 4): the reads of many files in one batch
// (a warm path paged in with O_DIRECT into owned memory), and the writes of many files each linked to
// its own fdatasync, all submitted together so that the device sees every request at once instead of
// one file's write and sync after another's. Which use keeps which path, measured: docs/store.md,
// "io_uring".
//
// A Ring belongs to one thread at a time (the segment writer's, a benchmark's); it is not
// thread-safe. Opening one fails with Unimplemented where the kernel or a seccomp filter refuses
// io_uring: callers fall back to plain reads and writes.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/base/status.h"

namespace towers {

class Ring {
 public:
  // A ring of `depth` submission entries (requests in flight at once).
  static Result<std::unique_ptr<Ring>> open(unsigned depth = 64);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Reads into each `into` from `offset` until it is full or the file ends; returns the bytes read
  // per request (fewer than asked: the file ended), or the first error. With an O_DIRECT fd, `into`,
  // `offset` and the size must be multiples of the device's block size (4096 always is).
  struct Read {
    int fd = -1;
    uint64_t offset = 0;
    std::span<uint8_t> into;
  };
  Result<std::vector<uint64_t>> read_all(std::span<const Read> reads);

  // Writes each `bytes` at `offset`, then (linked behind the write, so it runs only once the write
  // is whole) fdatasync of its fd when `datasync`. Returns a status per request: an error names
  // the step that failed (ENOSPC as ResourceExhausted, as errno_status does).
  struct Write {
    int fd = -1;
    uint64_t offset = 0;
    std::span<const uint8_t> bytes;
    bool datasync = true;
  };
  std::vector<Status> write_all(std::span<const Write> writes);

 private:
  struct Impl;
  explicit Ring(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace towers

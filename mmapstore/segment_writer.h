// The segment writer: one background thread that writes segment files, so the model thread never
// waits on the disk. Files are written in batches: every file of a batch is written to its .tmp and
// synced, then all are renamed and one fsync of the directory makes the whole batch durable (group
// commit). `done` runs on the writer thread once per job, in submission order, after its file is
// durable or failed.
//
// Io::Uring writes a batch's files in one io_uring submission, each file's write with its fdatasync
// linked behind it (mmapstore/uring_io.h), instead of one file's write and sync after another's. It
// needs the real file system (a test's file seam sees Posix writes) and a kernel that allows
// io_uring; where either is missing the writer uses Posix and io() says so.
#pragma once
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/model/segment.h"
#include "mmapstore/posix_file.h"

namespace towers {

class Ring;

class SegmentWriter {
 public:
  struct Job {
    std::shared_ptr<const Segment> segment;
    std::filesystem::path path;
    uint64_t context_xxh3 = 0;  // of the parent chain's tokens (mmapstore/segment_format.h)
    uint8_t flags = 0;          // segment_format::kFlag*
  };
  using Done = std::function<void(const Job& job, const Status& status)>;

  enum class Io { Posix, Uring };
  SegmentWriter(FileSystem& fs, uint64_t model_fingerprint, Done done, Io io = Io::Posix);
  ~SegmentWriter();  // writes what is queued, then stops
  SegmentWriter(const SegmentWriter&) = delete;
  SegmentWriter& operator=(const SegmentWriter&) = delete;

  void submit(Job job);
  // Waits until every job submitted before the call is done (tests, shutdown, benchmarks).
  void flush();
  size_t pending() const;  // submitted, not done yet
  Io io() const { return ring_ ? Io::Uring : Io::Posix; }
  const std::string& io_note() const { return io_note_; }  // why Uring was asked and not used ("" if it was not)

 private:
  void loop();
  void write_batch(std::deque<Job>& batch);
  // Phase 1 (each file's bytes to its .tmp, synced), one way or the other.
  void write_posix(const std::deque<Job>& batch, std::vector<Status>& status);
  void write_uring(const std::deque<Job>& batch, std::vector<Status>& status);

  FileSystem& fs_;
  const uint64_t fingerprint_;
  Done done_;
  std::unique_ptr<Ring> ring_;  // Io::Uring; used on the writer thread only
  std::string io_note_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Job> queue_;
  size_t in_flight_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace towers

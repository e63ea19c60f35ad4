// The background compressor: moves segments nobody used for a while to the cold tier (in towerd,
// only while the segment files are over the disk budget: Options::while_over_disk_budget).
// It codes each one's tokens (conditioned on its parent chain) with the given encoder — the
// arithmetic coder of engine/codec/codec.h in the daemon — hands the bytes to SegmentPool::freeze, which drops
// the KV, and the next lease thaws the segment by prefill.
//
// It runs on its own thread with its own Forward (one thread, no pool workers) at SCHED_IDLE, so the
// kernel gives it a core only when the serving threads leave one idle; it never holds the pool lock
// while coding. A segment leased again while being coded is simply skipped (freeze refuses it).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "mmapstore/segment_pool.h"

namespace towers {

class Compressor {
 public:
  // Codes `tokens` given the tokens before them; runs the model through `forward`.
  using Encode = std::function<Result<std::vector<uint8_t>>(Forward& forward, std::span<const int32_t> context,
                                                            std::span<const int32_t> tokens)>;
  struct Options {
    std::chrono::steady_clock::duration idle_for = std::chrono::minutes(10);
    std::chrono::steady_clock::duration scan_every = std::chrono::seconds(5);
    bool idle_priority = true;  // SCHED_IDLE for the background thread
    // The background loop codes idle segments only while the pool's segment files are over its disk
    // budget, in the eviction policy's order (idle_for is then the youngest a segment may go cold
    // at, not a timer). false: every segment idle for idle_for goes cold.
    bool while_over_disk_budget = false;
  };
  struct Stats {
    uint64_t scans = 0;  // passes of the background loop
    uint64_t compressed = 0, skipped = 0, failed = 0;
    uint64_t tokens = 0, coded_bytes = 0;
    double seconds = 0;  // spent coding
    std::string last_error;
  };

  Compressor(SegmentPool& pool, const Model& model, Encode encode, Options options);
  ~Compressor();  // stops the thread
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  void start();  // the background loop: every scan_every, compress what is idle (and, per Options, needed)
  void stop();

  // Compresses one segment now, on the calling thread (towerctl compress, tests). Must not run
  // concurrently with the background loop's own work on the same segment (the loop skips what freeze
  // refuses, so a race costs time, never data).
  Status compress(SegmentId id);
  // One pass over every segment idle for at least `idle_for`; returns how many went cold.
  size_t compress_idle(std::chrono::steady_clock::duration idle_for);
  // The same, stopping as soon as the segment files are within the disk budget.
  size_t compress_over_disk_budget(std::chrono::steady_clock::duration idle_for);

  Stats stats() const;

 private:
  void loop();
  // compress_idle's pass, stopping (or not starting) once `needed` says no more is.
  size_t compress_idle_while(std::chrono::steady_clock::duration idle_for, const std::function<bool()>& needed);

  SegmentPool& pool_;
  ThreadPool threads_{1};
  Forward forward_;
  Encode encode_;
  Options options_;
  std::mutex work_mu_;  // one coding job at a time (forward_ is single-threaded)
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Stats stats_;
};

}  // namespace towers

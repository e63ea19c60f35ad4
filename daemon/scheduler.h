// The scheduler: the only thread that runs the model. Generation requests wait in a bounded FIFO and
// are admitted up to max_batch at a time; every step evaluates, in one Forward::eval_batch, the next
// token of every decoding sequence plus a chunk of at most prefill_chunk prompt tokens of sequences
// still prefilling. A sequence's logits do not depend on what it is batched with, so a request's
// tokens (at temperature 0, or with a seed) do not depend on the load.
//
// Each sequence leases its tower from the SegmentPool (longest cached prefix), prefills the rest,
// decodes with a Decoder (engine/decoder.h: the same stop/EOS/UTF-8 rules as generate()), and hands
// its lease to the job's on_finish hook (which may seal it into a segment) before releasing it.
// Other work that must run the model (defining segments) is posted as tasks, run between steps.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/metrics.h"
#include "engine/forward.h"
#include "engine/sampler.h"
#include "mmapstore/segment_pool.h"

namespace towers::daemon {

struct GenOutcome {
  Status error;                     // the generation failed (nothing else is meaningful); its code says why
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;      // generated (without an end-of-generation token)
  std::vector<int32_t> tail;        // tokens evaluated into the lease's tail (prompt rest + generated)
  std::string finish_reason;        // eos, stop, length, context, cancelled, timeout
  size_t cached_tokens = 0;         // prompt tokens served from segments
  double queue_s = 0, prefill_s = 0, first_token_s = -1, total_s = 0;
};

struct GenJob {
  // On the scheduler thread, at admission: the prompt tokens (may run the model, e.g. restore a
  // session's segments). An error fails the job with that status.
  std::function<Result<std::vector<int32_t>>()> prepare;
  SamplerConfig sampling;
  int max_tokens = 256;
  std::vector<std::string> stop;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::atomic<bool> cancelled{false};
  // On the scheduler thread, once prepare and the lease succeeded: the model is about to run.
  std::function<void()> on_admitted;
  // On the scheduler thread: text as it becomes final; then on_finish exactly once. lease is null
  // when the job failed before it had one; it is released after on_finish returns.
  std::function<void(std::string_view)> on_text;
  std::function<void(GenOutcome&, Lease*)> on_finish;
  std::chrono::steady_clock::time_point enqueued;
};

class Scheduler {
 public:
  struct Options {
    int max_batch = 8;
    int prefill_chunk = 256;
    int queue_length = 64;
  };
  Scheduler(const Model& model, Forward& forward, SegmentPool& pool, Metrics& metrics, Options options);
  ~Scheduler();

  void start();
  // Stops admitting: queued jobs fail (Unavailable); running ones get `grace` to finish, then are cancelled.
  void shutdown(std::chrono::milliseconds grace);

  // ResourceExhausted when the queue is full, Unavailable when shutting down.
  Status submit(std::shared_ptr<GenJob> job);
  // Runs fn on the scheduler thread between steps and waits for it.
  Status run(std::function<Status()> fn);
  // Posts fn to the scheduler thread without waiting.
  void post(std::function<void()> fn);

  size_t queued() const;
  size_t active() const { return active_count_.load(); }
  // Seconds since the scheduler last went round its loop (watchdog: a stuck model call).
  double stalled_seconds() const;

 private:
  struct Seq;
  void loop();
  void admit(std::shared_ptr<GenJob> job);
  void step();
  void finish(Seq& s, std::string reason);
  void fail(std::shared_ptr<GenJob> job, Status st);

  const Model& model_;
  Forward& forward_;
  SegmentPool& pool_;
  Metrics& metrics_;
  Options opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenJob>> queue_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::unique_ptr<Seq>> seqs_;  // scheduler thread only
  std::atomic<size_t> active_count_{0};
  bool stopping_ = false, exit_ = false;
  std::chrono::steady_clock::time_point grace_end_ = std::chrono::steady_clock::time_point::max();
  std::atomic<int64_t> heartbeat_ns_{0};
  std::thread thread_;
};

}  // namespace towers::daemon

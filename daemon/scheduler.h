// The scheduler: the only thread that runs the model, and it never waits for anything else. All model
// work is scheduled work:
//   generations  requests wait in a bounded FIFO and are admitted up to max_batch at a time;
//   builds       segments in the pool cold (new definitions, thaws, segments whose file was lost)
//                are computed by prefill under their parent chain, then installed in the pool; a
//                segment placed modularly (its parent was edited) prefills only its first tokens
//                and reuses the rest of its old rows, RoPE-shifted;
//   rebuilds     modular segments recomputed exactly in the background, last in line, each only
//                once its parent chain is exact.
// Background work (builds nobody waits for, rebuilds) only fills steps that carry nothing but
// decodes, in short chunks while requests keep arriving (scheduler.cc, kBackgroundChunk).
// Every step evaluates, in one Forward::eval_batch, the next token of every decoding sequence first,
// then chunks of prompt and build tokens, oldest first (generations' prompts before builds): up to
// prefill_chunk when nothing decodes, else as many as keep the step within decode_slowdown times the
// decodes alone (daemon/prefill_pacer.h), so a long prefill slows the streams by a bounded factor
// instead of stopping them; prompts, which someone waits on, get at least 64 tokens per step. A sequence's logits do not depend on what it is batched with or how its
// prompt is cut into chunks, so a request's tokens (at temperature 0, or with a seed) do not depend on
// the load.
//
// Before a generation's tower is assembled, every segment on its prompt's path must be in memory:
// warm ones are paged in by the pager thread (map, populate, verify: file I/O off this thread) and
// cold ones are built first; the generation waits meanwhile without holding up the others. The RAM
// budget is enforced after every step. Each sequence decodes with a Decoder (engine/generate/decoder.h: the
// same stop/EOS/UTF-8 rules as generate()) and hands its lease to the job's on_finish hook (which
// may seal it into a segment) before releasing it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/metrics.h"
#include "daemon/prefill_pacer.h"
#include "daemon/worker_thread.h"
#include "engine/model/forward.h"
#include "engine/constrained/grammar_matcher.h"
#include "engine/generate/finish_reason.h"
#include "engine/generate/sampler.h"
#include "mmapstore/segment_pool.h"

namespace towers {
class Decoder;
}

namespace towers::daemon {

struct GenOutcome {
  Status error;                     // the generation failed (nothing else is meaningful); its code says why
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;      // generated (without an end-of-generation token)
  std::vector<int32_t> tail;        // tokens evaluated into the lease's tail (prompt rest + generated)
  FinishReason finish_reason = FinishReason::Length;
  size_t cached_tokens = 0;         // prompt tokens served from segments
  double queue_s = 0, prefill_s = 0, first_token_s = -1, total_s = 0;
  // n > 1: every choice's tokens and finish reason, in order (tokens and finish_reason above are
  // choice 0's), and the segment the prompt was sealed into so that the choices share its KV.
  struct Choice {
    std::vector<int32_t> tokens;
    FinishReason finish_reason = FinishReason::Length;
  };
  std::vector<Choice> choices;
  SegmentId sealed_prompt = kNoSegment;
};

struct GenJob {
  // On the scheduler thread, at admission: the prompt tokens (must not run the model or wait: segments
  // it needs go in the pool cold, and the scheduler builds them). An error fails the job.
  std::function<Result<std::vector<int32_t>>()> prepare;
  SamplerConfig sampling;
  // Choices (OpenAI's n): the prompt is prefilled once and sealed into a segment; then n sequences,
  // each with a private tail over it, sample their first token from the same logits and decode in the
  // same steps. Choice i samples with seed + i (choice 0 is what n = 1 gives, up to the sealed
  // prompt's KV format). on_finish then gets a null lease (each choice's is released as it ends).
  int n = 1;
  // Constrained decoding (response_format, tools): every choice's tokens follow this grammar
  // (engine/constrained/grammar_matcher.h); null: unconstrained.
  std::shared_ptr<GrammarAutomaton> grammar;
  int max_tokens = 256;
  std::vector<std::string> stop;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::atomic<bool> cancelled{false};
  // On the scheduler thread, once prepare succeeded and its tower is assembled: the model is about to run.
  std::function<void()> on_admitted;
  // On the scheduler thread: a choice's text as it becomes final, with the logprobs of the tokens it
  // completes (sampling.logprobs >= 0; engine/generate/decoder.h); then on_finish exactly once, after every
  // choice ended. lease is null when the job failed before it had one, and for n > 1; it is released
  // after on_finish returns.
  std::function<void(int choice, std::string_view text, std::vector<Logprobs> logprobs)> on_text;
  std::function<void(GenOutcome&, Lease*)> on_finish;
  std::chrono::steady_clock::time_point enqueued;
};

class Scheduler {
 public:
  struct Options {
    int max_batch = 8;
    int prefill_chunk = 256;
    int queue_length = 64;
    double decode_slowdown = 1.6;  // daemon/prefill_pacer.h
    bool background_exact = true;  // a modular segment, once installed, is queued for an exact rebuild
  };
  Scheduler(const Model& model, Forward& forward, SegmentPool& pool, Metrics& metrics, Options options);
  ~Scheduler();

  void start();
  // Stops admitting: queued jobs fail (Unavailable); running ones get `grace` to finish, then are cancelled.
  void shutdown(std::chrono::milliseconds grace);

  // ResourceExhausted when the queue is full, Unavailable when shutting down.
  Status submit(std::shared_ptr<GenJob> job);
  // Computes the cold segment `id` (paging in or building its parent chain first) as scheduled work.
  // done (may be empty) runs on the scheduler thread once it is in memory (ok) or cannot be. Builds of
  // the same segment are joined. A segment that is not cold is done at once. background: nobody waits
  // for it (a restart's recompute, a modular placement): it only fills steps that carry nothing but
  // decodes, in short chunks.
  void build(SegmentId id, std::function<void(const Status&)> done, bool background = false);
  // Recomputes the modular segment `id` exactly, in the background, and swaps the result in
  // (SegmentPool::replace). Nothing to do when it is not modular (any more).
  void rebuild_exact(SegmentId id);
  // Drops the exact rebuilds of these segments (replaced by an edit: nobody will use them).
  void cancel_rebuilds(std::vector<SegmentId> ids);
  // How far the exact rebuild of `id` has come (0 = queued, 1 = done); nullopt when none is queued.
  std::optional<double> exact_progress(SegmentId id) const;
  size_t exact_rebuilds() const;  // queued or running
  // Runs fn on the scheduler thread between steps and waits for it.
  Status run(std::function<Status()> fn);
  // Posts fn to the scheduler thread without waiting.
  void post(std::function<void()> fn);

  size_t queued() const;
  size_t active() const { return active_count_.load(); }
  size_t building() const { return building_count_.load(); }
  // Seconds since the scheduler last went round its loop (watchdog: a stuck model call).
  double stalled_seconds() const;

 private:
  struct Seq;
  struct Choices;
  struct Build;
  void loop();
  void admit(std::shared_ptr<GenJob> job);
  // Advances what waits for segments: requests page-ins and builds, assembles ready towers.
  void resolve();
  // True when every segment of `path` is in memory; otherwise asks for what is missing (wanted:
  // someone waits for it, so it goes before background work).
  bool ready(const PathPlan& path, bool wanted);
  void request_build(SegmentId id, bool wanted, std::function<void(const Status&)> done);
  // These segments alone (not their chains), those still in the pool: what ready() is to bring in.
  PathPlan plan_of(std::span<const SegmentId> ids) const;
  void resolve_build(Build& b);
  void resolve_exact(Build& b, const SegmentInfo& info);
  // Leases the parent chain (in memory) and takes the first `count` of the segment's own tokens to
  // prefill. False when it cannot start this round (or failed: then the build is finished).
  bool start_prefill(Build& b, const SegmentInfo& info, int32_t count);
  // The build's tokens are in: seal, join with reused rows (modular), install or replace.
  void complete_build(Build& b);
  void try_replace(Build& b);
  void finish_build(Build& b, const Status& st);
  void set_progress(const Build& b, std::optional<double> progress);
  void step();
  std::unique_ptr<Decoder> make_decoder(Seq& s, const SamplerConfig& sampling);
  // Samples the next token of a sequence whose last token (or prompt) was just evaluated.
  void advance(Seq& s, std::span<const float> logits);
  // n > 1, the prompt just evaluated: seals it and starts choices 1..n-1 from the same logits.
  void fork_choices(Seq& s, std::span<const float> logits);
  // Sequences running or admitted, counting a job that has not forked its choices yet as n.
  size_t slots_in_use() const;
  void finish(Seq& s, FinishReason reason);
  void fail(std::shared_ptr<GenJob> job, Status st);

  const Model& model_;
  Forward& forward_;
  SegmentPool& pool_;
  Metrics& metrics_;
  Options opt_;
  Rope rope_;
  PrefillPacer pacer_;  // scheduler thread only
  // A build ended since the loop last waited: what waits for it (a build of a segment below it, a
  // generation) is resolved at once instead of after the next wake-up.
  bool build_ended_ = false;  // scheduler thread
  bool decodes_waited_ = false;  // the last step left the decodes out for a first token (scheduler thread)
  // When a request (a generation, a build someone waits for) last arrived: background work takes
  // short steps for a while after it (scheduler thread).
  std::chrono::steady_clock::time_point last_request_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenJob>> queue_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false, exit_ = false;
  std::chrono::steady_clock::time_point grace_end_ = std::chrono::steady_clock::time_point::max();
  // Scheduler thread only.
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::vector<std::unique_ptr<Build>> builds_;  // in the order they were asked for
  std::atomic<size_t> active_count_{0}, building_count_{0};
  std::atomic<int64_t> heartbeat_ns_{0};
  mutable std::mutex progress_mu_;
  std::map<SegmentId, double> exact_progress_;  // rebuilds queued or running
  // Off the model thread: page-ins (paging_ is what the pager has been asked for and not done), and
  // the joins of modular builds (CPU work, on a thread of their own so a page-in never waits for one).
  WorkerThread pager_, joiner_;
  std::set<SegmentId> paging_;  // scheduler thread
  std::thread thread_;
};

}  // namespace towers::daemon

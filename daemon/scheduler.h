// The scheduler: the only thread that runs the model, and it never waits for anything else (the locks
// its job hooks take, the catalog's among them, are never held across the disk or the model:
// engine/base/no_wait_lock.h checks it). All model work is scheduled work:
//   generations  requests wait in a bounded FIFO and are admitted up to max_batch at a time;
//   builds       segments in the pool cold (new definitions, thaws, segments whose file was lost)
//                are computed by prefill under their parent chain, then installed in the pool; a
//                segment placed modularly (its parent was edited) prefills only its first tokens
//                and reuses the rest of its old rows, RoPE-shifted;
//   rebuilds     modular segments recomputed exactly in the background, last in line, each only
//                once its parent chain is exact.
// Background work (builds nobody waits for, rebuilds) only fills steps that carry nothing but
// decodes, and never holds the model longer than one short step (Options::background_step_seconds,
// by the pacer's measured cost per token): a request that arrives meanwhile waits for that step alone.
// Every step evaluates, in one ModelStep::eval_batch (daemon/model_step.h), the next token of every decoding sequence first,
// then chunks of prompt and build tokens, oldest first (generations' prompts before builds): up to
// prefill_chunk when nothing decodes, else as many as keep the step within decode_slowdown times the
// decodes alone (daemon/prefill_pacer.h), so a long prefill slows the streams by a bounded factor
// instead of stopping them; prompts, which someone waits on, get at least 64 tokens per step. A sequence's logits do not depend on what it is batched with or how its
// prompt is cut into chunks, so a request's tokens (at temperature 0, or with a seed) do not depend on
// the load.
//
// A generation whose client left stops at the next step: the API cancels it when the connection
// closes, and the scheduler asks every job's hooks (client_gone) before each step as well (so a disconnect is
// seen within one step, however busy the I/O threads are); it counts the steps a generation ran after
// its cancel (Metrics::steps_after_cancel).
//
// Before a generation's tower is assembled, every segment on its prompt's path must be in memory:
// warm ones are paged in by the pager thread (map, populate, verify: file I/O off this thread) and
// cold ones are built first; the generation waits meanwhile without holding up the others. The RAM
// budget is enforced after every step. Each sequence decodes with a Decoder (engine/generate/decoder.h: the
// same stop/EOS/UTF-8 rules as generate()) and hands its lease to the job's hooks (GenerationHooks::finished,
// which may seal it into a segment) before releasing it.
#pragma once
#include <array>
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
#include "daemon/model_step.h"
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

// GenJob::cancelled: set from any thread (`job->cancelled = true`: the client left, a write failed,
// shutdown). It keeps the step count of the scheduler the job was submitted to at that moment, so
// that the steps the generation ran after its cancel can be counted (not the time: a check of it
// must not depend on the machine's speed).
class CancelFlag {
 public:
  CancelFlag& operator=(bool on) {
    if (!on || on_.load()) return *this;
    const std::atomic<uint64_t>* steps = steps_.load();
    at_step_ = steps ? steps->load() : 0;  // before on_: whoever sees it set sees the step
    on_ = true;
    return *this;
  }
  operator bool() const { return on_.load(); }
  uint64_t set_at_step() const { return at_step_.load(); }
  void count_steps_of(const std::atomic<uint64_t>* steps) { steps_ = steps; }

 private:
  std::atomic<const std::atomic<uint64_t>*> steps_{nullptr};
  std::atomic<uint64_t> at_step_{0};
  std::atomic<bool> on_{false};
};

// What a generation tells whoever asked for it, in this order, all on the scheduler thread: prompt
// (at admission), admitted, text (any number of times), finished (exactly once, also when the job
// failed before it ran). daemon/turns.h implements it for the API; tests implement it with a fake.
class GenerationHooks {
 public:
  virtual ~GenerationHooks() = default;
  // The prompt tokens. Must not run the model or wait: segments it needs go in the pool cold, and the
  // scheduler builds them. An error fails the job.
  virtual Result<std::vector<int32_t>> prompt() = 0;
  // Before every step until the job ends: true when its client is gone (then it is cancelled). Must not
  // block: a look at the socket, no I/O.
  virtual bool client_gone() { return false; }
  // The prompt's tower is assembled: the model is about to run.
  virtual void admitted() {}
  // A choice's text as it becomes final, with the logprobs of the tokens it completes
  // (sampling.logprobs >= 0; engine/generate/decoder.h).
  virtual void text(int choice, std::string_view text, std::vector<Logprobs> logprobs) = 0;
  // After every choice ended. lease is null when the job failed before it had one, and for n > 1; it
  // is released after finished returns.
  virtual void finished(GenOutcome& out, Lease* lease) = 0;
};

struct GenJob {
  std::shared_ptr<GenerationHooks> hooks;
  SamplerConfig sampling;
  // Choices (OpenAI's n): the prompt is prefilled once and sealed into a segment; then n sequences,
  // each with a private tail over it, sample their first token from the same logits and decode in the
  // same steps. Choice i samples with seed + i (choice 0 is what n = 1 gives, up to the sealed
  // prompt's KV format). finished then gets a null lease (each choice's is released as it ends).
  int n = 1;
  // Constrained decoding (response_format, tools): every choice's tokens follow this grammar
  // (engine/constrained/grammar_matcher.h); null: unconstrained.
  std::shared_ptr<GrammarAutomaton> grammar;
  int max_tokens = 256;
  std::vector<std::string> stop;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  CancelFlag cancelled;
  std::chrono::steady_clock::time_point enqueued;
};

// Why the model prefilled tokens: every prefilled token has one cause (GET /v1/pool, /metrics).
enum class PrefillCause {
  Prompt,         // a generation's prompt past its cached segments (a lease's tail)
  Build,          // a segment computed from its tokens: a new definition, a file lost or dropped
  Thaw,           // a cold-tier segment brought back (its tokens were coded)
  ModularRepair,  // the first tokens of a segment placed modularly after an edit above it
  ExactRebuild,   // a modular segment recomputed exactly in the background
};
inline constexpr int kPrefillCauses = 5;
std::string_view to_string(PrefillCause c);

class Scheduler {
 public:
  struct Options {
    int max_batch = 8;
    int prefill_chunk = 256;
    int queue_length = 64;
    double decode_slowdown = 1.3;  // daemon/prefill_pacer.h
    bool background_exact = true;  // a modular segment, once installed, is queued for an exact rebuild
    // The longest a step of background work may take by the pacer's estimate: what a request that
    // arrives meanwhile waits for (a 256-token chunk is a second on a 1B model on two cores).
    double background_step_seconds = 0.1;
    // Segment files may pass the disk budget by this factor before the scheduler deletes warm ones
    // uncoded: with the cold tier on, the compressor brings them down to the budget by coding idle
    // segments (they go to rest), and this is only the backstop against a burst.
    double disk_budget_slack = 1.0;
  };
  // model gives the tokenizer and shape; step runs it (daemon/model_step.h).
  Scheduler(const Model& model, ModelStep& step, SegmentPool& pool, Metrics& metrics, Options options);
  ~Scheduler();

  void start();
  // Tests, instead of start(): one round of the scheduler's loop on the caller's thread, without
  // waiting (posted tasks, admissions, waiting work resolved, one model step, the budgets). Page-ins
  // and modular joins need start()'s threads. False once it has shut down.
  bool run_one_round();
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
  // Decoding a segment at rest (SegmentPool::wake) runs the model for seconds on a real model: with a
  // waker (a Forward of its own; set before start) it runs on the waker thread and the build waits
  // for it like a page-in, the streams going on meanwhile. Without one (tests) it runs in the step.
  using Waker = std::function<Result<std::vector<int32_t>>(SegmentId id)>;
  void set_waker(Waker waker) { waker_fn_ = std::move(waker); }
  // Decodes a segment at rest (and its parents at rest) back into the trie and waits: a session's
  // wake (Catalog::wake_session), from a thread that may block. On the waker's thread, after any
  // decode asked before it; without a waker, on the scheduler thread between steps.
  Status wake(SegmentId id);
  // Runs fn on the scheduler thread between steps and waits for it.
  Status run(std::function<Status()> fn);
  // Posts fn to the scheduler thread without waiting.
  void post(std::function<void()> fn);

  size_t queued() const;
  size_t active() const { return active_count_.load(); }
  size_t building() const { return building_count_.load(); }
  uint64_t steps() const { return steps_.load(); }  // model steps run so far
  // Tokens prefilled so far by cause (PrefillCause's order).
  std::array<uint64_t, kPrefillCauses> prefilled() const;
  // Seconds since the scheduler last went round its loop (watchdog: a stuck model call).
  double stalled_seconds() const;

 private:
  struct Seq;
  struct Choices;
  struct Build;
  void loop();
  bool round(bool wait);
  // Ends s when it is cancelled (or its client is gone) or past its deadline; true when it ended.
  bool stopped(Seq& s, std::chrono::steady_clock::time_point now);
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
  // Tokens a sequence may generate: its max_tokens, within the model's context after its prompt (the
  // decoder then ends it "context" when the cache is full).
  int32_t room(const Seq& s) const;
  // Sequences running or admitted, counting a job that has not forked its choices yet as n.
  size_t slots_in_use() const;
  void finish(Seq& s, FinishReason reason);
  void fail(std::shared_ptr<GenJob> job, Status st);

  const Model& model_;
  ModelStep& model_step_;
  SegmentPool& pool_;
  Metrics& metrics_;
  Options opt_;
  Rope rope_;
  PrefillPacer pacer_;  // scheduler thread only
  // A build ended since the loop last waited: what waits for it (a build of a segment below it, a
  // generation) is resolved at once instead of after the next wake-up.
  bool build_ended_ = false;  // scheduler thread
  bool decodes_waited_ = false;  // the last step left the decodes out for a first token (scheduler thread)
  std::atomic<uint64_t> steps_{0};  // model steps run (CancelFlag reads it from any thread)
  std::array<std::atomic<uint64_t>, kPrefillCauses> prefilled_{};
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
  WorkerThread pager_, joiner_, waker_;
  std::set<SegmentId> paging_;  // scheduler thread
  Waker waker_fn_;
  std::set<SegmentId> waking_;                 // asked of the waker, not done (scheduler thread)
  std::map<SegmentId, Status> wake_failed_;    // the waker's errors, for their builds (scheduler thread)
  std::thread thread_;
};

}  // namespace towers::daemon

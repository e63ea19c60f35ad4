#include "daemon/scheduler.h"

#include <algorithm>
#include <future>

#include "daemon/log.h"
#include "engine/generate/decoder.h"
#include "engine/text/tokenizer.h"

namespace towers::daemon {

using Clock = std::chrono::steady_clock;

namespace {
// Prompt tokens a step may carry beside decodes whatever the pacer says (daemon/prefill_pacer.h).
constexpr int kPromptFloor = 64;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

struct Scheduler::Seq {
  std::shared_ptr<GenJob> job;
  Lease lease;
  GenOutcome out;
  bool assembled = false;            // false: waiting for the segments of its path
  size_t pos = 0;                    // next prompt token to prefill
  std::unique_ptr<GrammarConstraint> constraint;  // the job's grammar, this sequence's place in it
  std::unique_ptr<Decoder> decoder;  // set once the prompt is in
  int32_t next = -1;                 // sampled, to be evaluated in the next step
  Clock::time_point started, last_token;
  uint64_t admitted_step = 0;        // the scheduler's step count when it was admitted
  bool done = false;
  int choice = 0;
  std::shared_ptr<Choices> choices;  // n > 1, once the prompt is in: what the job's choices share
};

// The choices of one job (n > 1): what the hooks are told (finished) once the last of them ends.
struct Scheduler::Choices {
  GenOutcome out;
  int running = 0;
};

// A segment being computed: its parent chain leased, its own tokens prefilled into the tail.
struct Scheduler::Build {
  enum class Kind { Compute, Exact };  // a cold segment, or an exact rebuild of a modular one
  SegmentId id = kNoSegment;
  Kind kind = Kind::Compute;
  bool wanted = false;         // someone waits for it (a generation, a request): before background work
  std::vector<std::function<void(const Status&)>> waiters;
  Lease lease;                 // the parent chain, once all of it is in memory
  std::vector<int32_t> tokens;  // to prefill: its own tokens (modular: the first `repair` of them)
  KvQuant format = KvQuant::F32;
  std::vector<std::shared_ptr<const Segment>> reuse;  // modular: the old rows that follow the prefilled ones
  std::shared_ptr<const Segment> exact;  // a rebuild done, waiting for its file's previous write
  bool joining = false;        // modular: its rows are being joined off the model thread
  PrefillCause cause = PrefillCause::Build;  // of its prefill
  size_t pos = 0;
  bool done = false;
  int rank() const { return kind == Kind::Exact ? 2 : wanted ? 0 : 1; }
};

std::string_view to_string(PrefillCause c) {
  switch (c) {
    case PrefillCause::Prompt: return "prompt";
    case PrefillCause::Build: return "build";
    case PrefillCause::Thaw: return "thaw";
    case PrefillCause::ModularRepair: return "modular_repair";
    case PrefillCause::ExactRebuild: return "exact_rebuild";
  }
  return "unknown";
}

std::array<uint64_t, kPrefillCauses> Scheduler::prefilled() const {
  std::array<uint64_t, kPrefillCauses> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = prefilled_[i].load();
  return out;
}

Scheduler::Scheduler(const Model& model, ModelStep& step, SegmentPool& pool, Metrics& metrics, Options options)
    : model_(model),
      model_step_(step),
      pool_(pool),
      metrics_(metrics),
      opt_(options),
      rope_(model.config()),
      pacer_(options.prefill_chunk, options.decode_slowdown, static_cast<size_t>(std::max(1, options.max_batch))) {
  heartbeat_ns_ = Clock::now().time_since_epoch().count();
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stopping_ = exit_ = true;
    grace_end_ = Clock::now();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  pager_.stop();
  joiner_.stop();
  waker_.stop();
}

void Scheduler::start() {
  pager_.start();
  joiner_.start();
  if (waker_fn_) waker_.start();
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  std::deque<std::shared_ptr<GenJob>> dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    grace_end_ = Clock::now() + grace;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& j : dropped) fail(j, Status::Unavailable("the daemon is shutting down"));
  {
    std::lock_guard lock(mu_);
    exit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Scheduler::submit(std::shared_ptr<GenJob> job) {
  if (!job->hooks) return Status::InvalidArgument("a generation job without hooks");
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("the daemon is shutting down");
    if (static_cast<int>(queue_.size()) >= opt_.queue_length) {
      return Status::ResourceExhausted("the request queue is full (limits.queue_length = " +
                                       std::to_string(opt_.queue_length) + "); retry shortly");
    }
    job->enqueued = Clock::now();
    job->cancelled.count_steps_of(&steps_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Status::Ok();
}

Status Scheduler::run(std::function<Status()> fn) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  {
    std::lock_guard lock(mu_);
    if (exit_) return Status::Unavailable("the daemon is shutting down");
    tasks_.push_back([p, fn = std::move(fn)] { p->set_value(fn()); });
  }
  cv_.notify_all();
  return f.get();
}

void Scheduler::post(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(fn));
  }
  cv_.notify_all();
}

size_t Scheduler::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

double Scheduler::stalled_seconds() const {
  if (seqs_.empty() && queued() == 0) return 0;
  return std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(heartbeat_ns_.load())).count();
}

void Scheduler::fail(std::shared_ptr<GenJob> job, Status st) {
  GenOutcome out;
  // Cancelled before admission (a client gone while queued): a cancelled sequence that ran no step.
  if (st.code() == Status::Code::kCancelled) metrics_.steps_after_cancel(0);
  out.error = std::move(st);
  out.finish_reason = FinishReason::Error;
  job->hooks->finished(out, nullptr);
}

void Scheduler::build(SegmentId id, std::function<void(const Status&)> done, bool background) {
  post([this, id, background, done = std::move(done)]() mutable { request_build(id, !background, std::move(done)); });
}

void Scheduler::request_build(SegmentId id, bool wanted, std::function<void(const Status&)> done) {
  for (auto& b : builds_) {
    if (b->id == id && b->kind == Build::Kind::Compute && !b->done) {
      b->wanted |= wanted;
      if (done) b->waiters.push_back(std::move(done));
      return;
    }
  }
  auto b = std::make_unique<Build>();
  b->id = id;
  b->wanted = wanted;
  if (done) b->waiters.push_back(std::move(done));
  builds_.push_back(std::move(b));
}

void Scheduler::rebuild_exact(SegmentId id) {
  post([this, id] {
    for (auto& b : builds_) {
      if (b->id == id && b->kind == Build::Kind::Exact && !b->done) return;
    }
    auto b = std::make_unique<Build>();
    b->id = id;
    b->kind = Build::Kind::Exact;
    set_progress(*b, 0.0);
    builds_.push_back(std::move(b));
  });
}

void Scheduler::cancel_rebuilds(std::vector<SegmentId> ids) {
  post([this, ids = std::move(ids)] {
    for (auto& b : builds_) {
      if (b->kind == Build::Kind::Exact && std::find(ids.begin(), ids.end(), b->id) != ids.end()) {
        finish_build(*b, Status::Cancelled("segment " + std::to_string(b->id) + " was replaced by an edit"));
      }
    }
  });
}

std::optional<double> Scheduler::exact_progress(SegmentId id) const {
  std::lock_guard lock(progress_mu_);
  auto it = exact_progress_.find(id);
  if (it == exact_progress_.end()) return std::nullopt;
  return it->second;
}

size_t Scheduler::exact_rebuilds() const {
  std::lock_guard lock(progress_mu_);
  return exact_progress_.size();
}

void Scheduler::set_progress(const Build& b, std::optional<double> progress) {
  if (b.kind != Build::Kind::Exact) return;
  std::lock_guard lock(progress_mu_);
  if (progress) exact_progress_[b.id] = *progress;
  else exact_progress_.erase(b.id);
}

void Scheduler::loop() {
  while (round(true)) {
  }
  // Exiting: builds fail, and tasks posted after the last round run now so nobody waits on them.
  for (auto& b : builds_) finish_build(*b, Status::Unavailable("the daemon is shutting down"));
  builds_.clear();
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
}

bool Scheduler::run_one_round() { return round(false); }

bool Scheduler::round(bool wait) {
  std::deque<std::function<void()>> tasks;
  std::vector<std::shared_ptr<GenJob>> admitted;
  bool grace_over = false;
  {
    std::unique_lock lock(mu_);
    auto runnable = [&] {
      for (const auto& s : seqs_) {
        if (s->assembled || s->job->cancelled) return true;
      }
      for (const auto& b : builds_) {
        if (b->lease.tower) return true;
      }
      return false;
    };
    const size_t max_batch = static_cast<size_t>(opt_.max_batch);
    size_t used = slots_in_use();
    if (wait) {
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
        return exit_ || !tasks_.empty() || runnable() || build_ended_ || (!queue_.empty() && used < max_batch);
      });
    }
    build_ended_ = false;
    heartbeat_ns_ = Clock::now().time_since_epoch().count();
    tasks.swap(tasks_);
    // A job of n choices takes n places (one larger than max_batch is admitted alone).
    while (!queue_.empty()) {
      const size_t want = static_cast<size_t>(std::max(1, queue_.front()->n));
      if (used + want > max_batch && used > 0) break;
      used += want;
      admitted.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    grace_over = stopping_ && Clock::now() >= grace_end_;
    if (exit_ && seqs_.empty() && tasks.empty() && admitted.empty()) return false;
  }
  for (auto& t : tasks) t();
  for (auto& j : admitted) admit(std::move(j));
  if (grace_over) {
    for (auto& s : seqs_) s->job->cancelled = true;
  }
  resolve();
  step();
  pool_.enforce_budget();  // continuously: between steps, not only when idle
  pool_.enforce_disk_budget(opt_.disk_budget_slack);
  active_count_ = seqs_.size();
  building_count_ = builds_.size();
  return true;
}

void Scheduler::admit(std::shared_ptr<GenJob> job) {
  if (job->cancelled) return fail(job, Status::Cancelled("cancelled before it started"));
  auto prompt = job->hooks->prompt();
  if (!prompt.ok()) return fail(job, prompt.status());
  if (prompt->empty()) return fail(job, Status::InvalidArgument("the prompt is empty"));
  if (const int n_ctx = model_.config().n_ctx_train; n_ctx > 0 && prompt->size() >= static_cast<size_t>(n_ctx)) {
    return fail(job, Status::ResourceExhausted("the prompt is " + std::to_string(prompt->size()) +
                                               " tokens; the model's context is " + std::to_string(n_ctx)));
  }
  auto s = std::make_unique<Seq>();
  s->job = std::move(job);
  s->out.prompt = std::move(prompt.value());
  s->admitted_step = steps_.load();
  seqs_.push_back(std::move(s));
}

bool Scheduler::ready(const PathPlan& path, bool wanted) {
  std::vector<SegmentId> page;
  bool all = true;
  for (size_t i = 0; i < path.path.size(); ++i) {
    const SegmentId id = path.path[i];
    if (path.tiers[i] == Tier::Hot) continue;
    all = false;
    if (path.tiers[i] == Tier::Warm) {
      if (paging_.insert(id).second) page.push_back(id);
    } else {
      request_build(id, wanted, nullptr);  // joins a build of it already asked for
    }
  }
  if (!page.empty()) {
    // One request for the whole path: its files are mapped and populated together, before the step.
    pager_.post([this, ids = std::move(page)] {
      Status st = pool_.page_in(ids);  // a bad file leaves its segment cold: the waiter builds it
      if (!st.ok()) log_warn(st.message() + "; it is recomputed");
      post([this, ids] {
        for (SegmentId id : ids) paging_.erase(id);
      });
    });
  }
  return all;
}

void Scheduler::resolve() {
  for (auto& sp : seqs_) {
    Seq& s = *sp;
    if (s.assembled || s.done || stopped(s, Clock::now())) continue;
    PathPlan plan = pool_.plan(s.out.prompt);
    if (!plan.damaged.empty()) {  // its history cannot be decoded: an error, never another transcript
      s.out.error = Status::Corruption(plan.damaged);
      finish(s, FinishReason::Error);
      continue;
    }
    if (!ready(plan, true)) continue;
    auto lease = pool_.assemble(s.out.prompt, room(s));
    if (!lease.ok()) {
      s.out.error = lease.status();
      finish(s, FinishReason::Error);
      continue;
    }
    s.lease = std::move(lease.value());
    s.assembled = true;
    s.out.cached_tokens = s.lease.cached_tokens;
    s.out.queue_s = since(s.job->enqueued);
    s.pos = s.lease.cached_tokens;
    s.started = Clock::now();
    s.job->hooks->admitted();
  }
  std::erase_if(seqs_, [](const std::unique_ptr<Seq>& s) { return s->done; });
  // Builds: a new build may be appended while resolving (a cold parent), so index, not iterate.
  for (size_t i = 0; i < builds_.size(); ++i) {
    if (builds_[i]->exact) try_replace(*builds_[i]);
    else if (!builds_[i]->lease.tower && !builds_[i]->done && !builds_[i]->joining) resolve_build(*builds_[i]);
  }
  std::erase_if(builds_, [](const std::unique_ptr<Build>& b) { return b->done; });
}

PathPlan Scheduler::plan_of(std::span<const SegmentId> ids) const {
  PathPlan plan;
  for (SegmentId id : ids) {
    if (auto info = pool_.info(id)) {
      plan.path.push_back(id);
      plan.tiers.push_back(info->tier);
      plan.ends.push_back(static_cast<size_t>(info->begin + info->length));
    }
  }
  return plan;
}

void Scheduler::resolve_build(Build& b) {
  auto info = pool_.info(b.id);
  if (!info && b.kind == Build::Kind::Exact) return finish_build(b, Status::Cancelled("replaced by an edit"));
  if (!info) return finish_build(b, Status::NotFound("segment " + std::to_string(b.id) + " left the pool"));
  if (b.kind == Build::Kind::Exact) return resolve_exact(b, *info);
  if (info->tier != Tier::Cold) return finish_build(b, Status::Ok());  // in memory, or on disk: nothing to compute
  if (info->derive_from != kNoSegment) {
    // Shifted rows of another segment (a session's kept turns): that one in memory first (paged in,
    // or computed itself), then the shift; no model run.
    if (PathPlan source = plan_of(std::span(&info->derive_from, 1)); !source.path.empty()) {
      if (!ready(source, b.wanted)) return;
      Status st = pool_.derive(b.id);
      if (st.code() == Status::Code::kUnavailable) return;  // it left memory meanwhile: next round
      if (st.code() != Status::Code::kNotFound) return finish_build(b, st);
    }
    // The source left the pool: computed by prefill below, as any segment.
  }
  int32_t prefill = info->length;
  b.reuse.clear();
  if (!info->modular_from.empty() && info->repair < info->length) {
    // Placed modularly: the old rows (paged in when they are on disk; never computed for this: a
    // source without KV means an ordinary prefill) after a prefill of the first `repair` tokens.
    PathPlan sources = plan_of(info->modular_from);
    const bool usable = sources.path.size() == info->modular_from.size() &&
                        std::none_of(sources.tiers.begin(), sources.tiers.end(), [](Tier t) { return t == Tier::Cold; });
    if (usable) {
      if (!ready(sources, b.wanted)) return;
      for (SegmentId from : sources.path) {
        auto seg = pool_.get_hot(from);
        if (!seg) {  // it left memory meanwhile: next round
          b.reuse.clear();
          return;
        }
        b.reuse.push_back(std::move(seg));
      }
      prefill = info->repair;
    }
  }
  if (info->parent != kNoSegment && !ready(pool_.plan_chain(info->parent), b.wanted)) return;
  if (start_prefill(b, *info, prefill) && b.tokens.empty()) complete_build(b);  // repair = 0: the old rows alone
}

Status Scheduler::wake(SegmentId id) {
  if (!waker_fn_) return run([this, id] { return pool_.wake(id).status(); });
  auto woke = std::make_shared<std::promise<Status>>();
  std::future<Status> done = woke->get_future();
  waker_.post([this, id, woke] { woke->set_value(waker_fn_(id).status()); });
  try {
    return done.get();
  } catch (const std::future_error&) {  // the waker stopped first (shutdown)
    return Status::Unavailable("the daemon is stopping");
  }
}

bool Scheduler::start_prefill(Build& b, const SegmentInfo& info, int32_t count) {
  // A segment at rest is decoded from its coded record first (its tokens come from nowhere else): on
  // the waker's thread when there is one, and the build goes on once it is back in the trie.
  if (auto failed = wake_failed_.find(b.id); failed != wake_failed_.end()) {
    Status st = failed->second;
    wake_failed_.erase(failed);
    finish_build(b, st);
    return false;
  }
  if (waker_fn_ && pool_.at_rest(b.id)) {
    if (waking_.insert(b.id).second) {
      waker_.post([this, id = b.id] {
        auto woke = waker_fn_(id);
        post([this, id, st = woke.ok() ? Status::Ok() : woke.status()] {
          waking_.erase(id);
          if (!st.ok()) wake_failed_[id] = st;
          build_ended_ = true;  // what waits for it is resolved at once
        });
      });
    }
    return false;
  }
  auto lease = pool_.lease_chain(info.parent, std::max(count, 1));
  if (!lease.ok()) {
    if (lease.status().code() != Status::Code::kUnavailable) finish_build(b, lease.status());
    return false;  // Unavailable: it left memory meanwhile, next round
  }
  // A segment at rest is decoded from its coded record first (the tokens come from nowhere else).
  auto seq = pool_.wake(b.id);
  if (!seq.ok()) {
    pool_.release(lease.value());
    finish_build(b, seq.status());
    return false;
  }
  b.tokens.assign(seq.value().begin() + info.begin, seq.value().begin() + info.begin + count);
  b.format = info.format;
  b.lease = std::move(lease.value());
  b.pos = 0;
  b.cause = b.kind == Build::Kind::Exact ? PrefillCause::ExactRebuild
            : !b.reuse.empty()           ? PrefillCause::ModularRepair
            : !pool_.coded(b.id).empty() ? PrefillCause::Thaw
                                         : PrefillCause::Build;
  if (count > 0) {
    log_info("segment " + std::to_string(b.id) + (info.label.empty() ? "" : " (" + info.label + ")") + ": prefilling " +
             std::to_string(count) + " of its " + std::to_string(info.length) + " tokens (" +
             std::string(to_string(b.cause)) + (b.wanted ? ", awaited" : ", background") + ")");
  }
  return true;
}

void Scheduler::resolve_exact(Build& b, const SegmentInfo& info) {
  // Cold: whatever computes it next computes it exactly. Not modular: rebuilt meanwhile.
  if (info.tier == Tier::Cold || !info.modular) return finish_build(b, Status::Ok());
  // Its parent chain exact first: rows computed over a modular parent would not be exact.
  for (SegmentId p = info.parent; p != kNoSegment;) {
    auto parent = pool_.info(p);
    if (!parent) return finish_build(b, Status::Cancelled("its parent chain was replaced by an edit"));
    if (parent->approximate()) return;
    p = parent->parent;
  }
  if (info.parent != kNoSegment && !ready(pool_.plan_chain(info.parent), false)) return;
  (void)start_prefill(b, info, info.length);
}

void Scheduler::complete_build(Build& b) {
  if (b.kind == Build::Kind::Exact) {
    b.exact = b.lease.tower->seal_tail(b.tokens, b.format, b.id);
    pool_.release(b.lease);
    if (!b.exact) return finish_build(b, Status::Error("internal: sealing a rebuild failed"));
    return try_replace(b);
  }
  if (b.reuse.empty()) {
    auto seg = b.lease.tower->seal_tail(b.tokens, b.format, b.id);
    return finish_build(b, seg ? pool_.install(b.id, std::move(seg)) : Status::Error("internal: sealing a build failed"));
  }
  // Modular: the rows just computed (kept in F32 until the join quantizes the whole), then the old
  // rows after them, RoPE-shifted to where they now stand.
  const int32_t repaired = static_cast<int32_t>(b.tokens.size());
  auto head = repaired > 0 ? b.lease.tower->seal_tail(b.tokens, KvQuant::F32, b.id) : nullptr;
  auto info = pool_.info(b.id);
  if (!info || (repaired > 0 && !head)) return finish_build(b, Status::Error("internal: sealing a modular build failed"));
  std::vector<Segment::Rows> rows;
  if (head) rows.push_back({head.get(), 0, repaired});
  int32_t skip = repaired;  // rows of the old segments the repair replaced
  for (const auto& old : b.reuse) {
    const int32_t from = std::min(skip, old->length());
    skip -= from;
    if (from < old->length()) rows.push_back({old.get(), from, old->length()});
  }
  // The join dequantizes, rotates and quantizes every row (0.2 ms a row on a 1B model): a long
  // transcript would hold up every stream for a second, so it runs off the model thread.
  pool_.release(b.lease);
  b.joining = true;
  joiner_.post([this, id = b.id, kind = b.kind, rows = std::move(rows), keep = b.reuse, head, begin = info->begin,
                    format = b.format, parent = info->parent] {
    std::shared_ptr<const Segment> seg = Segment::join(rows, begin, rope_, format, id, parent);
    post([this, id, kind, seg = std::move(seg)]() mutable {
      for (auto& bp : builds_) {
        Build& b = *bp;
        if (b.id != id || b.kind != kind || !b.joining || b.done) continue;
        b.joining = false;
        Status st = seg ? pool_.install(id, std::move(seg), true) : Status::Error("internal: joining a modular build failed");
        finish_build(b, st);
        if (st.ok() && opt_.background_exact) rebuild_exact(id);
        return;
      }
    });
  });
}

void Scheduler::try_replace(Build& b) {
  Status st = pool_.replace(b.id, b.exact);
  if (st.code() == Status::Code::kUnavailable) return;  // its previous file is still being written
  if (st.ok()) log_info("segment " + std::to_string(b.id) + " is exact again (background rebuild)");
  finish_build(b, st);
}

void Scheduler::finish_build(Build& b, const Status& st) {
  if (b.done) return;
  b.done = true;
  build_ended_ = true;
  set_progress(b, std::nullopt);
  b.reuse.clear();
  b.exact.reset();
  if (b.lease.tower) pool_.release(b.lease);
  if (!st.ok() && st.code() != Status::Code::kCancelled) {
    log_warn("segment " + std::to_string(b.id) + " could not be computed: " + st.message());
  }
  for (auto& w : b.waiters) w(st);
  b.waiters.clear();
}

int32_t Scheduler::room(const Seq& s) const {
  const int32_t want = std::max(1, s.job->max_tokens);
  const int n_ctx = model_.config().n_ctx_train;
  if (n_ctx <= 0) return want;
  return std::min(want, n_ctx - static_cast<int32_t>(s.out.prompt.size()));  // admit() left at least 1
}

size_t Scheduler::slots_in_use() const {
  size_t n = 0;
  for (const auto& s : seqs_) n += s->choices || s->done ? 1 : static_cast<size_t>(std::max(1, s->job->n));
  return n;
}

bool Scheduler::stopped(Seq& s, Clock::time_point now) {
  if (!s.job->cancelled && s.job->hooks->client_gone()) {
    s.job->cancelled = true;
    log_debug("client went away (seen before a step); its generation is cancelled");
  }
  if (s.job->cancelled) finish(s, FinishReason::Cancelled);
  else if (now >= s.job->deadline) finish(s, FinishReason::Timeout);
  return s.done;
}

void Scheduler::finish(Seq& s, FinishReason reason) {
  if (s.done) return;
  s.done = true;
  if (reason == FinishReason::Cancelled) {
    metrics_.steps_after_cancel(steps_.load() - std::max(s.job->cancelled.set_at_step(), s.admitted_step));
  }
  s.out.finish_reason = reason;
  if (s.decoder) {
    s.out.tokens = s.decoder->tokens();
    if (keeps_held_text(reason)) {
      std::string rest = s.decoder->flush();
      std::vector<Logprobs> logprobs = s.decoder->take_logprobs();
      if (!rest.empty() || !logprobs.empty()) s.job->hooks->text(s.choice, rest, std::move(logprobs));
    }
  }
  s.out.total_s = since(s.job->enqueued);
  if (!s.choices) {
    metrics_.generation_done(static_cast<int>(s.out.prompt.size()), static_cast<int>(s.out.cached_tokens),
                             static_cast<int>(s.out.tokens.size()), s.out.first_token_s);
    s.job->hooks->finished(s.out, s.lease.tower ? &s.lease : nullptr);
    if (s.lease.tower) pool_.release(s.lease);
    return;
  }
  // One of several choices: its lease goes now, finished waits for the last one.
  Choices& c = *s.choices;
  c.out.choices[static_cast<size_t>(s.choice)] = {s.out.tokens, s.out.finish_reason};
  if (!s.out.error.ok()) c.out.error = s.out.error;
  if (s.choice == 0) {
    c.out.prompt = std::move(s.out.prompt);
    c.out.tokens = s.out.tokens;
    c.out.finish_reason = s.out.finish_reason;
    c.out.cached_tokens = s.out.cached_tokens;
    c.out.queue_s = s.out.queue_s;
    c.out.prefill_s = s.out.prefill_s;
    c.out.first_token_s = s.out.first_token_s;
    c.out.sealed_prompt = s.out.sealed_prompt;
  }
  if (s.lease.tower) pool_.release(s.lease);
  if (--c.running > 0) return;
  c.out.total_s = s.out.total_s;
  size_t tokens = 0;
  for (const auto& ch : c.out.choices) tokens += ch.tokens.size();
  metrics_.generation_done(static_cast<int>(c.out.prompt.size()), static_cast<int>(c.out.cached_tokens),
                           static_cast<int>(tokens), c.out.first_token_s);
  s.job->hooks->finished(c.out, nullptr);
}

std::unique_ptr<Decoder> Scheduler::make_decoder(Seq& s, const SamplerConfig& sampling) {
  if (s.job->grammar) s.constraint = std::make_unique<GrammarConstraint>(s.job->grammar);
  return std::make_unique<Decoder>(model_.tokenizer(), sampling, s.job->stop, s.out.prompt,
                                   std::max(1, s.job->max_tokens), s.constraint.get());
}

void Scheduler::advance(Seq& s, std::span<const float> logits) {
  Decoder::Step d = s.decoder->step(logits, s.lease.tower->size() >= s.lease.tower->capacity());
  if (s.out.first_token_s < 0) s.out.first_token_s = since(s.job->enqueued);
  else metrics_.token_interval(since(s.last_token));
  s.last_token = Clock::now();
  std::vector<Logprobs> logprobs = s.decoder->take_logprobs();
  if (!d.text.empty() || !logprobs.empty()) s.job->hooks->text(s.choice, d.text, std::move(logprobs));
  if (s.job->cancelled) return finish(s, FinishReason::Cancelled);
  if (d.done) return finish(s, d.finish_reason);
  s.next = d.token;
}

void Scheduler::fork_choices(Seq& s, std::span<const float> logits) {
  const int n = s.job->n;
  auto shared = std::make_shared<Choices>();
  shared->out.choices.resize(static_cast<size_t>(n));
  shared->running = 1;
  s.choices = shared;
  // The prompt's tail becomes a segment (as the catalog's prompt cache would seal it at the end), so
  // that every choice reads the same prompt KV and only its own tokens live in a private tail.
  SegmentOptions o;
  o.label = "prompt";
  auto sealed = pool_.seal(s.lease, s.out.tail, o);
  if (!sealed.ok()) {
    s.out.error = sealed.status();
    return finish(s, FinishReason::Error);
  }
  s.out.tail.clear();
  s.out.sealed_prompt = sealed.value();
  for (int i = 1; i < n; ++i) {
    auto lease = pool_.lease_chain(sealed.value(), room(s));
    if (!lease.ok()) {
      s.out.error = lease.status();
      s.job->cancelled = true;  // the choices already started stop too
      return finish(s, FinishReason::Error);
    }
    auto c = std::make_unique<Seq>();
    c->job = s.job;
    c->lease = std::move(lease.value());
    c->out.prompt = s.out.prompt;
    c->out.cached_tokens = s.out.cached_tokens;
    c->assembled = true;
    c->pos = s.out.prompt.size();
    c->started = s.started;
    c->admitted_step = s.admitted_step;
    c->choice = i;
    c->choices = shared;
    SamplerConfig sampling = s.job->sampling;
    sampling.seed += static_cast<uint64_t>(i);
    c->decoder = make_decoder(*c, sampling);
    Seq& choice = *c;
    seqs_.push_back(std::move(c));
    ++shared->running;
    advance(choice, logits);
  }
}

void Scheduler::step() {
  const int n_vocab = model_.config().n_vocab;
  std::vector<Forward::Sequence> batch;
  struct Slot {
    Seq* seq = nullptr;    // a generation ...
    Build* build = nullptr;  // ... or a build
    size_t chunk = 0;      // prompt tokens in this step (0 = decoding)
  };
  std::vector<Slot> slots;
  const auto now = Clock::now();
  // A short prompt (a chat message) that this step would finish gets its first token from a step of
  // its own, without the decodes: on a compute-bound CPU a step costs about its token count, so the
  // waiting client gets its first token in the time of its prompt alone (not prompt + every decode),
  // while the streams wait about as long as they would for the step that held both. Never two such
  // steps in a row, so a flood of new prompts cannot stall the streams.
  auto short_prompt = [](const Seq& s) {
    return s.assembled && !s.done && !s.decoder && !s.job->cancelled && s.out.prompt.size() - s.pos <= kPromptFloor;
  };
  auto decodes = [](const Seq& s) { return s.assembled && !s.done && s.decoder; };
  for (auto& sp : seqs_) {
    if (sp->assembled && !sp->done) stopped(*sp, now);
  }
  const bool first_token_step = !decodes_waited_ && std::any_of(seqs_.begin(), seqs_.end(), [&](auto& s) { return short_prompt(*s); }) &&
                                std::any_of(seqs_.begin(), seqs_.end(), [&](auto& s) { return decodes(*s); });
  decodes_waited_ = first_token_step;
  // Decodes first: one token of every decoding sequence.
  for (auto& sp : seqs_) {
    Seq& s = *sp;
    if (first_token_step) break;
    if (!s.assembled || s.done || !s.decoder) continue;
    batch.push_back({s.lease.tower.get(), std::span<const int32_t>(&s.next, 1), Logits::Last});
    slots.push_back({&s, nullptr, 0});
  }
  // Then prefill chunks, oldest first, within the pacer's budget: generations' prompts, then builds.
  // Someone is waiting for a prompt's first token, so prompts get at least kPromptFloor tokens per
  // step (a chat message is done in one step); builds are background work and get what the pacer
  // leaves.
  const size_t decoding = batch.size();
  const int paced = first_token_step ? kPromptFloor : pacer_.budget(decoding);
  const int prompt_budget = decoding == 0 ? paced : std::max(paced, kPromptFloor);
  int prompt_tokens = 0;
  for (auto& sp : seqs_) {
    Seq& s = *sp;
    if (prompt_tokens >= prompt_budget) break;
    if (!s.assembled || s.done || s.decoder) continue;
    if (first_token_step && !short_prompt(s)) continue;
    const size_t n = std::min<size_t>(static_cast<size_t>(prompt_budget - prompt_tokens), s.out.prompt.size() - s.pos);
    prompt_tokens += static_cast<int>(n);
    batch.push_back({s.lease.tower.get(), std::span<const int32_t>(s.out.prompt).subspan(s.pos, n), Logits::Last});
    slots.push_back({&s, nullptr, n});
  }
  // Builds: what the prompts left of the pacer's budget; those someone waits for first, then
  // background work: builds nobody waits for, exact rebuilds of modular segments. It takes as many
  // tokens as the pacer expects to cost Options::background_step_seconds, so a request that arrives
  // meanwhile, even on a quiet daemon, waits for one short step, not a full chunk of someone else's.
  int budget = first_token_step ? 0 : paced - prompt_tokens;
  for (int rank = 0; rank <= 2; ++rank) {
    if (rank == 1) {
      // A join someone waits for runs on the joiner thread: background work leaves it the CPU.
      const bool join_wanted = std::any_of(builds_.begin(), builds_.end(), [](auto& b) { return b->wanted && b->joining; });
      budget = prompt_tokens > 0 || batch.size() > decoding || join_wanted
                   ? 0
                   : std::min(budget, pacer_.background_budget(opt_.background_step_seconds));
    }
    for (auto& bp : builds_) {
      Build& b = *bp;
      if (budget <= 0) break;
      if (!b.lease.tower || b.done || b.rank() != rank || b.pos >= b.tokens.size()) continue;
      const size_t n = std::min<size_t>(static_cast<size_t>(budget), b.tokens.size() - b.pos);
      budget -= static_cast<int>(n);
      batch.push_back({b.lease.tower.get(), std::span<const int32_t>(b.tokens).subspan(b.pos, n), Logits::Last});
      slots.push_back({nullptr, &b, n});
    }
  }
  if (batch.empty()) {
    std::erase_if(seqs_, [](const std::unique_ptr<Seq>& s) { return s->done; });
    return;
  }
  std::vector<float> logits;
  size_t tokens = 0;
  for (auto& b : batch) tokens += b.tokens.size();
  Status st = model_step_.eval_batch(batch, logits);
  ++steps_;
  pacer_.observe(model_step_.last_step_seconds(), decoding, tokens - decoding);
  metrics_.batch_step(batch.size(), tokens);
  if (!st.ok()) {
    log_error("model step failed: " + st.message());
    for (Slot& slot : slots) {
      if (slot.seq) slot.seq->out.error = st, finish(*slot.seq, FinishReason::Error);
      else finish_build(*slot.build, st);
    }
  } else {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].build) {
        Build& b = *slots[i].build;
        b.pos += slots[i].chunk;
        prefilled_[static_cast<size_t>(b.cause)] += slots[i].chunk;
        set_progress(b, static_cast<double>(b.pos) / static_cast<double>(b.tokens.size() + 1));
        if (b.pos >= b.tokens.size()) complete_build(b);
        continue;
      }
      Seq& s = *slots[i].seq;
      std::span<const float> row(logits.data() + i * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
      if (slots[i].chunk > 0) {
        prefilled_[static_cast<size_t>(PrefillCause::Prompt)] += slots[i].chunk;
        s.out.tail.insert(s.out.tail.end(), s.out.prompt.begin() + static_cast<std::ptrdiff_t>(s.pos),
                          s.out.prompt.begin() + static_cast<std::ptrdiff_t>(s.pos + slots[i].chunk));
        s.pos += slots[i].chunk;
        if (s.pos < s.out.prompt.size()) continue;
        s.out.prefill_s = since(s.started);
        s.decoder = make_decoder(s, s.job->sampling);
        if (s.job->n > 1) {
          fork_choices(s, row);
          if (s.done) continue;
        }
      } else {
        s.out.tail.push_back(s.next);
      }
      advance(s, row);
    }
  }
  std::erase_if(seqs_, [](const std::unique_ptr<Seq>& s) { return s->done; });
  std::erase_if(builds_, [](const std::unique_ptr<Build>& b) { return b->done; });
}

}  // namespace towers::daemon

#include "daemon/scheduler.h"

#include <future>

#include "daemon/log.h"
#include "engine/decoder.h"
#include "engine/tokenizer.h"

namespace towers::daemon {

using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

struct Scheduler::Seq {
  std::shared_ptr<GenJob> job;
  Lease lease;
  GenOutcome out;
  size_t pos = 0;                   // next prompt token to prefill
  std::unique_ptr<Decoder> decoder;  // set once the prompt is in
  int32_t next = -1;                 // sampled, to be evaluated in the next step
  Clock::time_point started;
  bool done = false;
};

Scheduler::Scheduler(const Model& model, Forward& forward, SegmentPool& pool, Metrics& metrics, Options options)
    : model_(model), forward_(forward), pool_(pool), metrics_(metrics), opt_(options) {
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
}

void Scheduler::start() { thread_ = std::thread([this] { loop(); }); }

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
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("the daemon is shutting down");
    if (static_cast<int>(queue_.size()) >= opt_.queue_length) {
      return Status::ResourceExhausted("the request queue is full (limits.queue_length = " +
                                       std::to_string(opt_.queue_length) + "); retry shortly");
    }
    job->enqueued = Clock::now();
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
  out.error = std::move(st);
  out.finish_reason = "error";
  if (job->on_finish) job->on_finish(out, nullptr);
}

void Scheduler::loop() {
  for (;;) {
    std::deque<std::function<void()>> tasks;
    std::vector<std::shared_ptr<GenJob>> admitted;
    bool grace_over = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(1), [&] {
        return exit_ || !tasks_.empty() || !seqs_.empty() ||
               (!queue_.empty() && static_cast<int>(seqs_.size()) < opt_.max_batch);
      });
      heartbeat_ns_ = Clock::now().time_since_epoch().count();
      tasks.swap(tasks_);
      while (!queue_.empty() && static_cast<int>(seqs_.size() + admitted.size()) < opt_.max_batch) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      grace_over = stopping_ && Clock::now() >= grace_end_;
      if (exit_ && seqs_.empty() && tasks.empty() && admitted.empty()) break;
    }
    for (auto& t : tasks) t();
    for (auto& j : admitted) admit(std::move(j));
    if (grace_over) {
      for (auto& s : seqs_) s->job->cancelled = true;
    }
    if (!seqs_.empty()) step();
    active_count_ = seqs_.size();
  }
  // Exiting: tasks posted after the last round run now so nobody waits on them forever.
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
}

void Scheduler::admit(std::shared_ptr<GenJob> job) {
  if (job->cancelled) return fail(job, Status::Cancelled("cancelled before it started"));
  auto prompt = job->prepare ? job->prepare() : Result<std::vector<int32_t>>(Status::Error("the job has no prompt"));
  if (!prompt.ok()) return fail(job, prompt.status());
  if (prompt->empty()) return fail(job, Status::InvalidArgument("the prompt is empty"));
  // Warm and cold segments on the prompt's path come back first (page-in, thaw by prefill).
  if (PathPlan plan = pool_.plan(prompt.value()); !plan.all_hot()) (void)pool_.thaw(plan.path.back());
  auto lease = pool_.assemble(prompt.value(), std::max(1, job->max_tokens));
  if (!lease.ok()) return fail(job, lease.status());
  auto s = std::make_unique<Seq>();
  s->job = std::move(job);
  s->lease = std::move(lease.value());
  s->out.prompt = std::move(prompt.value());
  s->out.cached_tokens = s->lease.cached_tokens;
  s->out.queue_s = since(s->job->enqueued);
  s->pos = s->lease.cached_tokens;
  s->started = Clock::now();
  if (s->job->on_admitted) s->job->on_admitted();
  seqs_.push_back(std::move(s));
}

void Scheduler::finish(Seq& s, std::string reason) {
  if (s.done) return;
  s.done = true;
  s.out.finish_reason = std::move(reason);
  const std::string& r = s.out.finish_reason;
  if (s.decoder) {
    s.out.tokens = s.decoder->tokens();
    if (r != "stop" && r != "cancelled" && s.job->on_text) {
      std::string rest = s.decoder->flush();
      if (!rest.empty()) s.job->on_text(rest);
    }
  }
  s.out.total_s = since(s.job->enqueued);
  metrics_.generation_done(static_cast<int>(s.out.prompt.size()), static_cast<int>(s.out.cached_tokens),
                           static_cast<int>(s.out.tokens.size()), s.out.first_token_s);
  if (s.job->on_finish) s.job->on_finish(s.out, &s.lease);
  pool_.release(s.lease);
}

void Scheduler::step() {
  const int n_vocab = model_.config().n_vocab;
  std::vector<Forward::Sequence> batch;
  std::vector<Seq*> in_batch;
  std::vector<size_t> chunk;  // prompt tokens per sequence in this step (0 = decoding)
  int prefill_budget = opt_.prefill_chunk;
  const auto now = Clock::now();
  for (auto& sp : seqs_) {
    Seq& s = *sp;
    if (s.job->cancelled) {
      finish(s, "cancelled");
      continue;
    }
    if (now >= s.job->deadline) {
      finish(s, "timeout");
      continue;
    }
    if (!s.decoder) {
      if (prefill_budget <= 0) continue;
      const size_t n = std::min<size_t>(static_cast<size_t>(prefill_budget), s.out.prompt.size() - s.pos);
      prefill_budget -= static_cast<int>(n);
      batch.push_back({s.lease.tower.get(), std::span<const int32_t>(s.out.prompt).subspan(s.pos, n), Logits::Last});
      chunk.push_back(n);
    } else {
      batch.push_back({s.lease.tower.get(), std::span<const int32_t>(&s.next, 1), Logits::Last});
      chunk.push_back(0);
    }
    in_batch.push_back(&s);
  }
  if (!batch.empty()) {
    std::vector<float> logits;
    size_t tokens = 0;
    for (auto& b : batch) tokens += b.tokens.size();
    Status st = forward_.eval_batch(batch, logits);
    metrics_.batch_step(batch.size(), tokens);
    if (!st.ok()) {
      log_error("model step failed: " + st.message());
      for (Seq* s : in_batch) {
        s->out.error = st;
        finish(*s, "error");
      }
    } else {
      for (size_t i = 0; i < in_batch.size(); ++i) {
        Seq& s = *in_batch[i];
        std::span<const float> row(logits.data() + i * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
        if (chunk[i] > 0) {
          s.out.tail.insert(s.out.tail.end(), s.out.prompt.begin() + static_cast<std::ptrdiff_t>(s.pos),
                            s.out.prompt.begin() + static_cast<std::ptrdiff_t>(s.pos + chunk[i]));
          s.pos += chunk[i];
          if (s.pos < s.out.prompt.size()) continue;
          s.out.prefill_s = since(s.started);
          s.decoder = std::make_unique<Decoder>(model_.tokenizer(), s.job->sampling, s.job->stop, s.out.prompt,
                                                std::max(1, s.job->max_tokens));
        } else {
          s.out.tail.push_back(s.next);
        }
        Decoder::Step d = s.decoder->step(row, s.lease.tower->size() >= s.lease.tower->capacity());
        if (s.out.first_token_s < 0) s.out.first_token_s = since(s.job->enqueued);
        if (!d.text.empty() && s.job->on_text) s.job->on_text(d.text);
        if (s.job->cancelled) {
          finish(s, "cancelled");
          continue;
        }
        if (d.done) {
          finish(s, d.finish_reason);
          continue;
        }
        s.next = d.token;
      }
    }
  }
  std::erase_if(seqs_, [](const std::unique_ptr<Seq>& s) { return s->done; });
  if (seqs_.empty()) pool_.enforce_budget();
}

}  // namespace towers::daemon

// The scheduler alone: a fake model step (no model file, no ../shared) whose logits follow from each
// sequence's last token and position, and whose cost is counted, not timed. The tests step the
// scheduler one round at a time and count steps: admission and the bounded queue, batching, the
// first-token step, chunked prefill beside decodes as the pacer says, cancellation, background work
// bounded by its cost (and every prefilled token counted by cause), and the model's context.
#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>

#include "daemon/metrics.h"
#include "daemon/model_step.h"
#include "daemon/prefill_pacer.h"
#include "daemon/scheduler.h"
#include "model_fixtures.h"

using namespace towers;
using daemon::GenJob;
using daemon::GenOutcome;
using daemon::Scheduler;

namespace {

// The tiny synthetic model gives the tokenizer, the shape and the context (2048); the fake runs it.
struct FakeStep final : daemon::ModelStep {
  // A step costs fixed + per_token * tokens "seconds" (counted, never measured).
  double fixed = 0.002, per_token = 0.004;
  struct Part {
    const KvCache* cache;
    int32_t pos;  // of its first token
    std::vector<int32_t> tokens;
  };
  struct Logged {
    std::vector<Part> parts;
    size_t tokens = 0;
    double cost = 0;
  };
  std::vector<Logged> log;
  int32_t max_pos = 0;  // past the last row ever written
  std::function<void(size_t step)> during_step;  // runs inside each step (tests of threads)

  explicit FakeStep(const Model& m) : n_vocab(m.config().n_vocab) {
    for (int32_t id = 0; id < n_vocab; ++id) {
      if (!m.tokenizer().is_end_of_generation(id) && id != m.tokenizer().bos()) candidates.push_back(id);
    }
  }
  // The token the fake's logits pick after `token` at `pos`.
  int32_t next(int32_t token, int32_t pos) const {
    return candidates[static_cast<size_t>(token * 31 + pos * 17) % candidates.size()];
  }

  Status eval_batch(std::span<const Forward::Sequence> batch, std::vector<float>& logits) override {
    Logged l;
    logits.clear();
    for (const auto& s : batch) {
      const int32_t pos = s.cache->next_pos();
      l.parts.push_back({s.cache, pos, {s.tokens.begin(), s.tokens.end()}});
      l.tokens += s.tokens.size();
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        if (s.which == Logits::Last && i + 1 < s.tokens.size()) continue;
        std::vector<float> row(static_cast<size_t>(n_vocab), 0.0f);
        row[static_cast<size_t>(next(s.tokens[i], pos + static_cast<int32_t>(i)))] = 10.0f;
        logits.insert(logits.end(), row.begin(), row.end());
      }
      s.cache->commit(static_cast<int32_t>(s.tokens.size()));  // rows stay zero: nothing reads them
      max_pos = std::max(max_pos, pos + static_cast<int32_t>(s.tokens.size()));
    }
    if (during_step) during_step(log.size());
    l.cost = fixed + per_token * static_cast<double>(l.tokens);
    last = l.cost;
    log.push_back(std::move(l));
    return Status::Ok();
  }
  double last_step_seconds() const override { return last; }

  const int32_t n_vocab;
  std::vector<int32_t> candidates;
  double last = 0;
};

// One generation as the test sees it.
struct Run {
  std::shared_ptr<GenJob> job = std::make_shared<GenJob>();
  std::vector<int32_t> prompt;
  bool admitted = false, finished = false;
  GenOutcome out;
  std::atomic<bool> gone{false};  // what client_gone answers
  std::function<void()> on_admitted, on_finished;  // run after the hooks noted it
};

// What the scheduler tells a Run (the job owns it; it points back at the Run, which outlives the job's
// time in the scheduler as the tests are written).
struct RunHooks : daemon::GenerationHooks {
  explicit RunHooks(Run* run) : run(run) {}
  Result<std::vector<int32_t>> prompt() override { return run->prompt; }
  bool client_gone() override { return run->gone.load(); }
  void admitted() override {
    run->admitted = true;
    if (run->on_admitted) run->on_admitted();
  }
  void text(int, std::string_view, std::vector<Logprobs>) override {}
  void finished(GenOutcome& o, Lease*) override {
    run->finished = true;
    run->out = o;
    if (run->on_finished) run->on_finished();
  }
  Run* run;
};

struct Harness {
  std::unique_ptr<Model> model = test::synth_tiny("sched", "f16");
  ThreadPool threads{1};
  Forward forward{*model, threads, Kernels::Reference};  // the pool's own (unused here: no add())
  SegmentPool pool{*model, forward};
  FakeStep fake{*model};
  daemon::Metrics metrics;
  std::vector<int> admissions;  // Run index, in the order they were admitted
  std::unique_ptr<Scheduler> sched;

  explicit Harness(Scheduler::Options o = {}) { sched = std::make_unique<Scheduler>(*model, fake, pool, metrics, o); }

  // A prompt whose first token names the run (each run's sequence is then told apart in the log).
  std::shared_ptr<Run> make(int index, size_t prompt_len, int max_tokens) {
    auto r = std::make_shared<Run>();
    for (size_t i = 0; i < prompt_len; ++i) r->prompt.push_back(fake.candidates[(static_cast<size_t>(index) * 7 + i * 3) % 200]);
    r->prompt[0] = fake.candidates[300 + static_cast<size_t>(index)];
    r->job->max_tokens = max_tokens;
    r->job->sampling.temperature = 0;
    r->on_admitted = [this, index] { admissions.push_back(index); };
    r->job->hooks = std::make_shared<RunHooks>(r.get());
    return r;
  }
  std::shared_ptr<Run> submit(int index, size_t prompt_len, int max_tokens) {
    auto r = make(index, prompt_len, max_tokens);
    REQUIRE(sched->submit(r->job).ok());
    return r;
  }
  // Rounds until every run finished; at most `limit` (a hang fails instead of looping).
  int run_until_done(std::initializer_list<std::shared_ptr<Run>> runs, int limit = 10000) {
    int n = 0;
    auto done = [&] { return std::all_of(runs.begin(), runs.end(), [](auto& r) { return r->finished; }); };
    while (!done() && n < limit) {
      sched->run_one_round();
      ++n;
    }
    REQUIRE(done());
    return n;
  }
  // The tokens the fake's logits give after `prompt`, greedily: what a run must have generated.
  std::vector<int32_t> expected(const std::vector<int32_t>& prompt, int n) const {
    std::vector<int32_t> out;
    int32_t token = prompt.back(), pos = static_cast<int32_t>(prompt.size()) - 1;
    for (int i = 0; i < n; ++i) out.push_back(token = fake.next(token, pos++));
    return out;
  }
  // The log's part of run r in step i (its cache is the one whose first chunk began with r's first
  // token), or nullptr.
  const FakeStep::Part* part_of(const Run& r, size_t step) {
    const KvCache* cache = nullptr;
    for (size_t i = 0; i <= step; ++i) {
      for (const auto& p : fake.log[i].parts) {
        if (p.pos == 0 && !p.tokens.empty() && p.tokens[0] == r.prompt[0]) cache = p.cache;
      }
    }
    for (const auto& p : fake.log[step].parts) {
      if (p.cache == cache) return &p;
    }
    return nullptr;
  }
};

}  // namespace

TEST_CASE("admission: at most max_batch run, the rest wait in a bounded FIFO, a full queue refuses") {
  Scheduler::Options o;
  o.max_batch = 2;
  o.queue_length = 3;
  Harness h(o);
  auto a = h.submit(0, 8, 4), b = h.submit(1, 8, 4), c = h.submit(2, 8, 4);
  auto d = h.make(3, 8, 4);
  Status full = h.sched->submit(d->job);
  CHECK(full.code() == Status::Code::kResourceExhausted);
  CHECK(full.message().find("queue is full") != std::string::npos);
  CHECK(h.sched->queued() == 3);
  h.sched->run_one_round();
  CHECK(h.admissions == std::vector<int>{0, 1});
  CHECK(h.sched->queued() == 1);
  REQUIRE(h.sched->submit(d->job).ok());  // room again
  h.run_until_done({a, b, c, d});
  CHECK(h.admissions == std::vector<int>{0, 1, 2, 3});  // first in, first out
  size_t widest = 0;
  for (const auto& l : h.fake.log) widest = std::max(widest, l.parts.size());
  CHECK(widest == 2);
  for (auto* r : {&a, &b, &c, &d}) {
    CHECK((*r)->out.finish_reason == FinishReason::Length);
    CHECK((*r)->out.tokens == h.expected((*r)->prompt, 4));
  }
}

TEST_CASE("batching: the decodes of several sequences go in one step, each gets its own logits") {
  Scheduler::Options o;
  o.max_batch = 4;
  Harness h(o);
  auto a = h.submit(0, 8, 6), b = h.submit(1, 9, 6), c = h.submit(2, 10, 6);
  const int rounds = h.run_until_done({a, b, c});
  // One step for the three prompts, then five steps of three decodes each (the sixth token of each
  // is sampled from the fifth's logits and never evaluated).
  REQUIRE(h.fake.log.size() == 6);
  CHECK(h.fake.log[0].tokens == 27);
  for (size_t i = 1; i < 6; ++i) {
    CHECK(h.fake.log[i].parts.size() == 3);
    CHECK(h.fake.log[i].tokens == 3);
  }
  CHECK(rounds == 6);
  for (auto* r : {&a, &b, &c}) CHECK((*r)->out.tokens == h.expected((*r)->prompt, 6));
}

TEST_CASE("first-token step: a short prompt beside streams gets a step of its own, never two in a row") {
  Harness h;
  auto a = h.submit(0, 8, 100);
  for (int i = 0; i < 3; ++i) h.sched->run_one_round();
  REQUIRE(a->admitted);
  auto b = h.submit(1, 20, 5), c = h.submit(2, 30, 5);
  h.sched->run_one_round();
  // B's and C's prompts alone, without A's decode: each waiting client's first token after a step of
  // its prompt's size.
  const auto& first = h.fake.log.back();
  CHECK(first.tokens == 50);
  CHECK(h.part_of(*a, h.fake.log.size() - 1) == nullptr);
  h.sched->run_one_round();
  CHECK(h.fake.log.back().parts.size() == 3);  // then all three decode together
  auto d = h.submit(3, 10, 5);
  h.sched->run_one_round();  // D's prompt alone
  CHECK(h.part_of(*a, h.fake.log.size() - 1) == nullptr);
  auto e = h.submit(4, 10, 5);
  h.sched->run_one_round();  // E arrived right after a first-token step: it waits for the decodes' step
  CHECK(h.part_of(*a, h.fake.log.size() - 1) != nullptr);
  CHECK(h.part_of(*e, h.fake.log.size() - 1) != nullptr);
  a->job->cancelled = true;
  h.run_until_done({a, b, c, d, e});
  CHECK(b->out.tokens == h.expected(b->prompt, 5));
}

TEST_CASE("chunked prefill: a long prompt goes in chunks the pacer sizes while the streams go on") {
  Scheduler::Options o;
  o.prefill_chunk = 256;
  o.decode_slowdown = 1.6;
  Harness h(o);
  // Decodes cost a fixed 20 ms a step (reading the weights), prefill 0.1 ms a token: beside one
  // decode the pacer lets a step grow to ~108 tokens (1.6 x 20 ms), above the 64-token floor.
  h.fake.fixed = 0.020;
  h.fake.per_token = 0.0001;
  auto a = h.submit(0, 8, 400);
  for (int i = 0; i < 5; ++i) h.sched->run_one_round();
  auto b = h.submit(1, 1000, 3);
  h.run_until_done({b});
  // Replay the steps through a pacer of the same settings: every chunk of B beside A's decode is what
  // it allowed (at least the 64-token floor), and A got a token in every step but B's last one.
  daemon::PrefillPacer mirror(o.prefill_chunk, o.decode_slowdown, static_cast<size_t>(o.max_batch));
  size_t b_tokens = 0, steps_without_a = 0, chunks = 0;
  int largest = 0;
  for (size_t i = 0; i < h.fake.log.size(); ++i) {
    const auto& l = h.fake.log[i];
    const auto* pa = h.part_of(*a, i);
    const auto* pb = h.part_of(*b, i);
    const size_t decoding = pa && pa->tokens.size() == 1 ? 1 : 0;
    if (pb && pb->tokens.size() > 1) {
      const size_t left = b->prompt.size() - b_tokens;
      if (decoding == 1) {
        const size_t want = static_cast<size_t>(std::max(64, mirror.budget(1)));
        CHECK(pb->tokens.size() == std::min(want, left));
        largest = std::max(largest, static_cast<int>(pb->tokens.size()));
        ++chunks;
      } else {
        CHECK(left <= 64);  // B's last chunk: a first-token step of its own
        ++steps_without_a;
      }
      b_tokens += pb->tokens.size();
    }
    mirror.observe(l.cost, decoding, l.tokens - decoding);
  }
  CHECK(b_tokens == 1000);
  CHECK(steps_without_a <= 1);
  CHECK(chunks >= 8);
  CHECK(largest > 64);  // the pacer, not only the floor, sized some chunks
  CHECK(largest <= 120);
  CHECK(!a->finished);  // the stream went on
  CHECK(b->out.tokens == h.expected(b->prompt, 3));
  a->job->cancelled = true;
  h.run_until_done({a});
}

TEST_CASE("cancellation: a client that leaves stops its generation within one step") {
  Harness h;
  auto a = h.submit(0, 8, 1000), b = h.submit(1, 8, 1000);
  for (int i = 0; i < 10; ++i) h.sched->run_one_round();
  REQUIRE(a->admitted);
  // A's client hangs up (seen by the scheduler's look at the socket before the next step), B is
  // cancelled from another thread (the I/O thread saw its connection close).
  a->gone = true;
  b->job->cancelled = true;
  const size_t steps_before = h.fake.log.size();
  h.sched->run_one_round();
  CHECK(a->finished);
  CHECK(b->finished);
  CHECK(a->out.finish_reason == FinishReason::Cancelled);
  CHECK(b->out.finish_reason == FinishReason::Cancelled);
  CHECK(h.fake.log.size() == steps_before);  // no step ran for them after it
  CHECK(a->out.tokens.size() <= 11);
  const auto m = h.metrics.snapshot();
  CHECK(m.cancelled_sequences == 2);
  CHECK(m.max_steps_after_cancel == 0);

  // Gone before it was admitted: no step at all, no tokens.
  auto c = h.submit(2, 8, 1000);
  c->gone = true;
  h.run_until_done({c});
  CHECK(c->out.finish_reason == FinishReason::Cancelled);
  CHECK(c->out.tokens.empty());
  CHECK(h.fake.log.size() == steps_before);
}

TEST_CASE("cancellation from another thread during a step: the step in flight is the one counted after it") {
  Harness h;
  auto a = h.make(0, 8, 1000);
  std::promise<void> in_step, cancel_set, ended;
  auto cancel_set_f = cancel_set.get_future();
  h.fake.during_step = [&](size_t step) {
    if (step != 5) return;
    in_step.set_value();
    cancel_set_f.wait();  // the model is busy while the other thread cancels
  };
  a->on_finished = [&] { ended.set_value(); };
  h.sched->start();
  REQUIRE(h.sched->submit(a->job).ok());
  in_step.get_future().wait();
  a->job->cancelled = true;  // as the I/O thread does when the connection closes
  cancel_set.set_value();
  ended.get_future().wait();
  CHECK(a->out.finish_reason == FinishReason::Cancelled);
  CHECK(h.fake.log.size() == 6);  // no step after the one in flight
  CHECK(a->out.tokens.size() == 6);
  CHECK(h.metrics.snapshot().max_steps_after_cancel == 1);
  h.sched->shutdown(std::chrono::milliseconds(0));
}

TEST_CASE("background work: no step of it holds the model longer than one short step, and it yields") {
  Scheduler::Options o;
  o.prefill_chunk = 256;  // a 256-token step costs 1.03 s on this fake (a 1B model on two cores)
  Harness h(o);
  std::vector<int32_t> text(1500);
  for (size_t i = 0; i < text.size(); ++i) text[i] = h.fake.candidates[(i * 13) % 500];
  auto id = h.pool.add_cold(kNoSegment, text);
  REQUIRE(id.ok());
  bool built = false;
  Status built_status = Status::Error("not done");
  h.sched->build(id.value(), [&](const Status& st) { built = true, built_status = st; }, /*background=*/true);
  for (int i = 0; i < 6; ++i) h.sched->run_one_round();
  auto r = h.submit(0, 40, 3);
  h.sched->run_one_round();
  // The request's prompt goes in the next step, alone: background work gives way.
  REQUIRE(r->admitted);
  CHECK(h.fake.log.back().parts.size() == 1);
  CHECK(h.fake.log.back().tokens == 40);
  int rounds = 0;
  while (!built && rounds++ < 1000) h.sched->run_one_round();
  REQUIRE(built);
  CHECK(built_status.ok());
  CHECK(r->finished);
  CHECK(r->out.tokens == h.expected(r->prompt, 3));
  auto info = h.pool.info(id.value());
  REQUIRE(info);
  CHECK(info->tier == Tier::Hot);
  size_t build_tokens = 0;
  double worst = 0;  // of the steps of background work alone
  for (size_t i = 0; i < h.fake.log.size(); ++i) {
    const auto* pr = h.part_of(*r, i);
    build_tokens += h.fake.log[i].tokens - (pr ? pr->tokens.size() : 0);
    if (!pr) worst = std::max(worst, h.fake.log[i].cost);
  }
  CHECK(build_tokens == 1500);
  // Every prefilled token counted once, by its cause.
  const auto prefilled = h.sched->prefilled();
  CHECK(prefilled[static_cast<size_t>(daemon::PrefillCause::Build)] == 1500);
  CHECK(prefilled[static_cast<size_t>(daemon::PrefillCause::Prompt)] == 40);
  CHECK(prefilled[static_cast<size_t>(daemon::PrefillCause::Thaw)] == 0);
  // A request arriving during any background step waits at most this long for the model.
  CHECK(worst <= o.background_step_seconds * 1.05);
  CHECK(worst >= o.background_step_seconds * 0.8);  // and the steps are not needlessly small
}

TEST_CASE("context: a generation stops at the model's context, a prompt that fills it is refused") {
  Harness h;
  const int n_ctx = h.model->config().n_ctx_train;
  auto a = h.submit(0, static_cast<size_t>(n_ctx - 8), 100);
  auto b = h.submit(1, static_cast<size_t>(n_ctx), 10);
  h.run_until_done({a, b});
  CHECK(a->out.finish_reason == FinishReason::Context);
  CHECK(h.fake.max_pos <= n_ctx);  // no row past the context was ever written
  CHECK(a->out.tokens.size() >= 8);
  CHECK(a->out.tokens.size() <= 9);  // the last one sampled, with no room to evaluate it
  CHECK(b->out.error.code() == Status::Code::kResourceExhausted);
  CHECK(b->out.error.message().find("context") != std::string::npos);
  CHECK(!b->admitted);
}

TEST_CASE("prefilled tokens by cause: a segment built, frozen to the cold tier, then thawed") {
  Harness h;
  std::vector<int32_t> text(100);
  for (size_t i = 0; i < text.size(); ++i) text[i] = h.fake.candidates[(i * 11) % 500];
  auto id = h.pool.add_cold(kNoSegment, text);
  REQUIRE(id.ok());
  int built = 0;
  auto count = [&](const Status& st) {
    CHECK(st.ok());
    ++built;
  };
  h.sched->build(id.value(), count);
  for (int i = 0; i < 100 && built < 1; ++i) h.sched->run_one_round();
  REQUIRE(built == 1);
  REQUIRE(h.pool.freeze(id.value(), {1, 2, 3}).ok());  // its tokens "coded": a thaw computes it again
  h.sched->build(id.value(), count);
  for (int i = 0; i < 100 && built < 2; ++i) h.sched->run_one_round();
  REQUIRE(built == 2);
  CHECK(h.pool.info(id.value())->tier == Tier::Hot);
  const auto p = h.sched->prefilled();
  CHECK(p[static_cast<size_t>(daemon::PrefillCause::Build)] == 100);
  CHECK(p[static_cast<size_t>(daemon::PrefillCause::Thaw)] == 100);
  CHECK(p[static_cast<size_t>(daemon::PrefillCause::Prompt)] == 0);
  CHECK(p[static_cast<size_t>(daemon::PrefillCause::ExactRebuild)] == 0);
}

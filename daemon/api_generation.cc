// The generation runner shared by POST /v1/chat/completions and POST /v1/sessions/{id}/messages: it
// submits the job and returns at once; the job's hooks answer on the scheduler thread as the model
// runs (daemon/api_reply.h's objects: chat or text completions, n choices, streamed or whole), and the
// client's disconnect cancels the job (HttpResponder::on_close), which the scheduler sees before and
// after every step.
#include <chrono>

#include "daemon/api_reply.h"
#include "daemon/log.h"
#include "daemon/service.h"

namespace towers::daemon::api {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// One generation's answer, built by the job's hooks. They run one after the other — admitted, text...,
// finished on the scheduler thread, then settle wherever the record became durable — so nothing here
// needs a lock. The OpenAI objects themselves come from the ReplyBuilder (daemon/api_reply.h).
class GenerationReply : public std::enable_shared_from_this<GenerationReply> {
 public:
  GenerationReply(Service& svc, std::shared_ptr<HttpResponder> out, GenerationSpec spec, std::weak_ptr<GenJob> job)
      : svc_(svc), out_(std::move(out)), spec_(std::move(spec)), job_(std::move(job)),
        builder_(spec_.api, svc.model_id, spec_.params, spec_.prompt_tokens, spec_.extra) {
    builder_.set_dropped(spec_.dropped_turns, spec_.dropped_tokens);
  }

  // The model is about to run: a stream starts now, so later errors are SSE error events.
  void admitted() {
    if (!spec_.params.stream || started_) return;
    started_ = true;
    if (!out_->start_stream(200, "text/event-stream")) return cancel();
    send(builder_.start_events());  // none for completions (an empty chunk would end a stream)
  }

  void text(int choice, std::string_view t, std::vector<Logprobs> logprobs) {
    send(builder_.add(choice, t, std::move(logprobs)));
  }

  // The model is done: the spec's on_finish seals and queues the record, and the reply goes out once
  // it is settled (durable, or failed), on whichever thread that happens.
  void finished(GenOutcome& o, Lease* lease) {
    auto outcome = std::make_shared<GenOutcome>(o);
    outcome->prompt.clear();
    outcome->tail.clear();
    const auto job = job_.lock();
    const bool cancelled = (job && job->cancelled) || o.error.code() == Status::Code::kCancelled;
    Settled settled = [self = shared_from_this(), outcome, cancelled](const Status& st) {
      self->settle(*outcome, cancelled, st);
    };
    if (spec_.on_finish) spec_.on_finish(o, lease, builder_.text(), std::move(settled));
    else settled(Status::Ok());
  }

 private:
  // Before the model ran: a plain error reply. After the stream started: an SSE error event.
  void failed(const ApiStatus& e) {
    if (!started_) return send_error(*out_, e);
    log_warn("a streamed reply failed after it started: " + e.status.message());
    out_->write_chunk(sse_error_event(e));
    out_->write_chunk("data: [DONE]\n\n");
    out_->end_stream();
  }

  void send(const std::string& events) {
    if (!events.empty() && !out_->write_chunk(events)) cancel();
  }

  // The client is gone or not reading: the model stops at its next step.
  void cancel() {
    if (auto job = job_.lock()) job->cancelled = true;
  }

  void settle(GenOutcome& o, bool cancelled, const Status& st) {
    if (!st.ok() && o.error.ok() && o.finish_reason != FinishReason::Cancelled) o.error = st;
    if (o.error.ok() && o.finish_reason == FinishReason::Grammar) {
      // The grammar (response_format's or the tool calls') could not go on (its automaton's limit, or
      // no token of this vocabulary continues it): not the client's fault, and not a reply to pass off
      // as complete.
      o.error = Status::Error(std::string("constrained decoding stopped: the ") +
                              (spec_.params.tool_format ? "tool-call" : "response_format's") + " grammar cannot continue");
    }
    svc_.metrics.generation_finished(
        to_string(cancelled ? FinishReason::Cancelled : o.error.ok() ? o.finish_reason : FinishReason::Error));
    if (!o.error.ok()) return failed(not_found_as(o.error, spec_.not_found_code));
    if (o.finish_reason == FinishReason::Timeout) log_warn("a generation reached limits.request_timeout_seconds");
    if (spec_.params.stream) {
      out_->write_chunk(builder_.end_events(o));
      return out_->end_stream();
    }
    reply(*out_, builder_.whole(o));
  }

  Service& svc_;
  std::shared_ptr<HttpResponder> out_;
  GenerationSpec spec_;
  std::weak_ptr<GenJob> job_;
  ReplyBuilder builder_;
  bool started_ = false;
};

}  // namespace

ApiStatus run_generation(Service& svc, HttpResponder& out, GenerationSpec spec) {
  const int n_ctx = svc.model.config().n_ctx_train;
  const int prompt_limit = svc.config.max_prompt_tokens > 0 ? std::min(svc.config.max_prompt_tokens, n_ctx) : n_ctx;
  auto reject = [&](ApiStatus e) {
    if (spec.on_rejected) spec.on_rejected();
    return e;
  };
  if (spec.prompt_tokens >= static_cast<size_t>(prompt_limit)) {
    return reject(ApiStatus(Status::ResourceExhausted("the prompt is " + std::to_string(spec.prompt_tokens) +
                                                      " tokens; this server accepts prompts of at most " +
                                                      std::to_string(prompt_limit - 1) + " tokens (model context " +
                                                      std::to_string(n_ctx) + ")"),
                            spec.api == ReplyApi::Chat ? "messages" : "prompt", "context_length_exceeded"));
  }
  auto job = std::make_shared<GenJob>();
  job->sampling = spec.params.sampling;
  job->stop = spec.params.stop;
  job->n = spec.params.n;
  job->grammar = spec.params.grammar;
  job->max_tokens = std::min<int>(spec.params.max_tokens, n_ctx - static_cast<int>(spec.prompt_tokens));
  job->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(svc.config.request_timeout_s * 1000));
  job->prepare = spec.prepare;
  auto on_rejected = spec.on_rejected;
  auto answer = std::make_shared<GenerationReply>(svc, out.shared_from_this(), std::move(spec), job);
  job->on_admitted = [answer] { answer->admitted(); };
  job->on_text = [answer](int choice, std::string_view t, std::vector<Logprobs> logprobs) {
    answer->text(choice, t, std::move(logprobs));
  };
  job->on_finish = [answer](GenOutcome& o, Lease* lease) { answer->finished(o, lease); };
  job->client_gone = [weak = out.weak_from_this()] {
    auto o = weak.lock();
    return !o || o->client_gone();
  };
  out.on_close([weak = std::weak_ptr<GenJob>(job)] {
    if (auto j = weak.lock()) {
      j->cancelled = true;
      log_debug("client went away; its generation is cancelled");
    }
  });
  if (Status st = svc.scheduler.submit(job); !st.ok()) {
    svc.metrics.rejected(st.code() == Status::Code::kResourceExhausted ? "queue_full" : "shutting_down");
    if (on_rejected) on_rejected();
    return st;
  }
  return {};  // answered by the job's hooks
}

}  // namespace towers::daemon::api

// A turn from its typed request to the acknowledged reply (daemon/turns.h lists the steps). The
// OpenAI objects come from the ReplyBuilder (daemon/api_reply.h); the session's state from the
// catalog (daemon/catalog.h).
#include "daemon/turns.h"

#include <chrono>

#include "daemon/api_reply.h"
#include "daemon/log.h"

namespace towers::daemon::api {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

class Turn : public GenerationHooks, public std::enable_shared_from_this<Turn> {
 public:
  Turn(Service& svc, std::shared_ptr<HttpResponder> out, GenerationSpec spec)
      : svc_(svc), out_(std::move(out)), spec_(std::move(spec)),
        builder_(spec_.api, svc.model_id, spec_.params, spec_.prompt_estimate(), spec_.extra) {
    if (const auto* t = spec_.session_turn()) builder_.set_dropped(t->drop_turns, t->drop_tokens);
  }

  // The prompt fits the context; the job joins the scheduler's queue. An error: it never will run.
  ApiStatus submit() {
    const int n_ctx = svc_.model.config().n_ctx_train;
    const size_t prompt_limit = svc_.catalog.prompt_limit();
    const size_t prompt_tokens = spec_.prompt_estimate();
    if (prompt_tokens >= prompt_limit) {
      rejected();
      return ApiStatus(Status::ResourceExhausted("the prompt is " + std::to_string(prompt_tokens) +
                                                 " tokens; this server accepts prompts of at most " +
                                                 std::to_string(prompt_limit - 1) + " tokens (" +
                                                 svc_.catalog.prompt_limit_why() + ")"),
                       spec_.api == ReplyApi::Chat ? "messages" : "prompt", "context_length_exceeded");
    }
    auto job = std::make_shared<GenJob>();
    job->hooks = shared_from_this();
    job->sampling = spec_.params.sampling;
    job->stop = spec_.params.stop;
    job->n = spec_.params.n;
    job->grammar = spec_.params.grammar;
    job->max_tokens = std::min<int>(spec_.params.max_tokens, n_ctx - static_cast<int>(prompt_tokens));
    job->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(svc_.config.request_timeout_s * 1000));
    job_ = job;
    out_->on_close([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->client_left();
    });
    if (Status st = svc_.scheduler.submit(std::move(job)); !st.ok()) {
      svc_.metrics.rejected(st.code() == Status::Code::kResourceExhausted ? "queue_full" : "shutting_down");
      rejected();
      return st;
    }
    return {};
  }

  // At admission (scheduler thread): the prompt's tokens, from the catalog.
  Result<std::vector<int32_t>> prompt() override {
    if (const auto* t = spec_.session_turn()) return svc_.catalog.prepare_turn(*t);
    return svc_.catalog.prepare_stateless(std::get<Catalog::Stateless>(spec_.context));
  }

  bool client_gone() override { return out_->client_gone(); }

  // The model is about to run: a stream starts now, so later errors are SSE error events.
  void admitted() override {
    if (!spec_.params.stream || started_) return;
    started_ = true;
    if (!out_->start_stream(200, "text/event-stream")) return cancel();
    send(builder_.start_events());  // none for completions (an empty chunk would end a stream)
  }

  void text(int choice, std::string_view t, std::vector<Logprobs> logprobs) override {
    send(builder_.add(choice, t, std::move(logprobs)));
  }

  // The model is done (scheduler thread, before the lease is released): the catalog seals what is
  // kept and queues the session's record; the reply goes out once that is recorded.
  void finished(GenOutcome& o, Lease* lease) override {
    auto outcome = std::make_shared<GenOutcome>(o);
    outcome->prompt.clear();
    outcome->tail.clear();
    const auto job = job_.lock();
    const bool cancelled = (job && job->cancelled) || o.error.code() == Status::Code::kCancelled;
    auto recorded = [self = shared_from_this(), outcome, cancelled](const Status& st) {
      self->recorded(*outcome, cancelled, st);
    };
    if (const auto* t = spec_.session_turn()) {
      return svc_.catalog.finish_turn(*t, o, lease, builder_.text(), std::move(recorded));
    }
    svc_.catalog.finish_stateless(o, lease);
    recorded(Status::Ok());
  }

 private:
  // The session's record is durable (ok) or not (the error): the reply goes out.
  void recorded(GenOutcome& o, bool cancelled, const Status& st) {
    if (spec_.remove_session_if_empty) remove_session_if_empty();
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

  // The job never ran: a session turn lets its session go.
  void rejected() {
    if (const auto* t = spec_.session_turn()) svc_.catalog.abort_turn(t->session);
    if (spec_.remove_session_if_empty) remove_session_if_empty();
  }

  // The session made for this turn has no turn after all: it goes, on the offload thread (its removal
  // waits for a record).
  void remove_session_if_empty() {
    const auto* t = spec_.session_turn();
    if (!t || !svc_.offload) return;
    svc_.offload->post([&svc = svc_, session = t->session] {
      auto s = svc.catalog.session(session, false);
      if (s.ok() && s->turns == 0 && !s->busy) (void)svc.catalog.delete_session(session);
    });
  }

  // The connection closed: the model stops at its next step.
  void client_left() {
    if (auto job = job_.lock(); job && !job->cancelled) {
      job->cancelled = true;
      log_debug("client went away; its generation is cancelled");
    }
  }

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

  Service& svc_;
  std::shared_ptr<HttpResponder> out_;
  GenerationSpec spec_;
  std::weak_ptr<GenJob> job_;
  ReplyBuilder builder_;
  bool started_ = false;
};

}  // namespace

size_t GenerationSpec::prompt_estimate() const {
  return std::visit([](const auto& c) { return c.prompt_estimate; }, context);
}

ApiStatus run_generation(Service& svc, HttpResponder& out, GenerationSpec spec) {
  return std::make_shared<Turn>(svc, out.shared_from_this(), std::move(spec))->submit();
}

ApiStatus begin_session_turn(Service& svc, const std::string& session, const Catalog::TurnInput& input,
                             const GenParams& params, const std::string& session_param, GenerationSpec* spec) {
  // Room for the reply: what it asks for, up to half the prompt limit (a long max_tokens must not
  // drop most of a session's history).
  const size_t limit = svc.catalog.prompt_limit();
  const size_t reserve = std::min<size_t>(static_cast<size_t>(std::max(1, params.max_tokens)), limit / 2);
  auto turn = svc.catalog.begin_turn(session, input, reserve);
  if (!turn.ok()) {
    if (turn.status().code() == Status::Code::kResourceExhausted) {
      return ApiStatus(turn.status(), "messages", "context_length_exceeded");
    }
    if (turn.status().code() == Status::Code::kInvalidArgument) {
      return ApiStatus(turn.status(), input.tools.empty() ? "messages" : "tools");
    }
    return not_found_as(turn.status(), "session_not_found", session_param);
  }
  spec->params = params;
  spec->extra = {{"session", turn.value().session}};
  spec->context = std::move(turn.value());
  spec->not_found_code = "session_not_found";
  return {};
}

GenerationSpec stateless_spec(Catalog::Stateless stateless) {
  GenerationSpec spec;
  spec.context = std::move(stateless);
  spec.not_found_code = "segment_not_found";
  return spec;
}

}  // namespace towers::daemon::api

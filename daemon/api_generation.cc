// The generation runner shared by POST /v1/chat/completions and POST /v1/sessions/{id}/messages: it
// submits the job and returns at once; the job's hooks answer on the scheduler thread as the model
// runs (a chat.completion object, or chat.completion.chunk events ending in "data: [DONE]"), and the
// client's disconnect cancels the job (HttpResponder::on_close), which the scheduler sees before and
// after every step.
#include <chrono>
#include <ctime>

#include "daemon/log.h"
#include "daemon/random_id.h"
#include "daemon/service.h"

namespace towers::daemon::api {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// What the client sees: OpenAI's finish reasons ("timeout" and "context" read as "length").
std::string openai_finish(const std::string& r) {
  if (r == "eos" || r == "stop") return "stop";
  if (r == "cancelled") return "stop";
  return "length";
}

// One generation's answer, built by the job's hooks. They run one after the other — admitted, text...,
// finished on the scheduler thread, then settle wherever the record became durable — so nothing here
// needs a lock.
class GenerationReply : public std::enable_shared_from_this<GenerationReply> {
 public:
  GenerationReply(Service& svc, std::shared_ptr<HttpResponder> out, GenerationSpec spec, std::weak_ptr<GenJob> job)
      : svc_(svc), out_(std::move(out)), spec_(std::move(spec)), job_(std::move(job)),
        id_(random_hex_id("chatcmpl-")), created_(static_cast<int64_t>(std::time(nullptr))) {}

  // The model is about to run: a stream starts now, so later errors are SSE error events.
  void admitted() {
    if (!spec_.params.stream || started_) return;
    started_ = true;
    if (!out_->start_stream(200, "text/event-stream")) return cancel();
    event(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  }

  void text(std::string_view t) {
    text_.append(t);
    if (spec_.params.stream) event(chunk({{"content", t}}, nullptr));
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
    if (spec_.on_finish) spec_.on_finish(o, lease, text_, std::move(settled));
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

  json chunk(const json& delta, const json& finish) const {
    json c = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", svc_.model_id},
              {"choices", json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
    for (auto& [k, v] : spec_.extra.items()) c[k] = v;
    return c;
  }

  void event(const json& j) {
    if (!out_->write_chunk("data: " + dump(j) + "\n\n")) cancel();
  }

  // The client is gone or not reading: the model stops at its next step.
  void cancel() {
    if (auto job = job_.lock()) job->cancelled = true;
  }

  void settle(GenOutcome& o, bool cancelled, const Status& st) {
    if (!st.ok() && o.error.ok() && o.finish_reason != "cancelled") o.error = st;
    svc_.metrics.generation_finished(cancelled ? "cancelled" : o.error.ok() ? o.finish_reason : "error");
    if (!o.error.ok()) return failed(not_found_as(o.error, spec_.not_found_code));
    if (o.finish_reason == "timeout") log_warn("a generation reached limits.request_timeout_seconds");
    const size_t prompt_tokens = spec_.prompt_tokens;
    json usage = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", o.tokens.size()},
                  {"total_tokens", prompt_tokens + o.tokens.size()},
                  {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
    if (spec_.dropped_turns) {
      // The session reached the context: its oldest turns were left out of this prompt (and of it).
      usage["dropped_turns"] = spec_.dropped_turns;
      usage["dropped_tokens"] = spec_.dropped_tokens;
    }
    const json timings = {{"queue_ms", o.queue_s * 1000}, {"prefill_ms", o.prefill_s * 1000},
                          {"first_token_ms", o.first_token_s * 1000}, {"total_ms", o.total_s * 1000},
                          {"finish", o.finish_reason}};
    if (spec_.params.stream) {
      json last = chunk(json::object(), openai_finish(o.finish_reason));
      last["usage"] = usage;
      last["towers"] = timings;
      event(last);
      out_->write_chunk("data: [DONE]\n\n");
      return out_->end_stream();
    }
    json r = {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", svc_.model_id},
              {"choices", json::array({{{"index", 0},
                                        {"message", {{"role", "assistant"}, {"content", text_}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", openai_finish(o.finish_reason)}}})},
              {"usage", usage}, {"towers", timings}};
    for (auto& [k, v] : spec_.extra.items()) r[k] = v;
    reply(*out_, r);
  }

  Service& svc_;
  std::shared_ptr<HttpResponder> out_;
  GenerationSpec spec_;
  std::weak_ptr<GenJob> job_;
  const std::string id_;
  const int64_t created_;
  std::string text_;
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
                            "messages", "context_length_exceeded"));
  }
  auto job = std::make_shared<GenJob>();
  job->sampling = spec.params.sampling;
  job->stop = spec.params.stop;
  job->max_tokens = std::min<int>(spec.params.max_tokens, n_ctx - static_cast<int>(spec.prompt_tokens));
  job->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(svc.config.request_timeout_s * 1000));
  job->prepare = spec.prepare;
  auto on_rejected = spec.on_rejected;
  auto answer = std::make_shared<GenerationReply>(svc, out.shared_from_this(), std::move(spec), job);
  job->on_admitted = [answer] { answer->admitted(); };
  job->on_text = [answer](std::string_view t) { answer->text(t); };
  job->on_finish = [answer](GenOutcome& o, Lease* lease) { answer->finished(o, lease); };
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

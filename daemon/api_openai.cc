// OpenAI-compatible endpoints: POST /v1/chat/completions, GET /v1/models; and the generation runner
// shared with session messages (daemon/api_towers.cc).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <random>

#include "daemon/http_error.h"
#include "daemon/random_id.h"
#include "daemon/log.h"
#include "daemon/service.h"

namespace towers::daemon::api {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string completion_id() { return random_hex_id("chatcmpl-"); }

// What the client sees: OpenAI's finish reasons ("timeout" and "context" read as "length").
std::string openai_finish(const std::string& r) {
  if (r == "eos" || r == "stop") return "stop";
  if (r == "cancelled") return "stop";
  return "length";
}

std::string content_text(const json& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (!m.contains("content") || m["content"].is_null()) {
    throw bad_request(where + " is missing");
  }
  const json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (const auto& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
        throw bad_request(where + ": only text parts ({\"type\":\"text\",\"text\":...}) are supported");
      }
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw bad_request(where + " must be a string or an array of text parts");
}

std::vector<ChatMessage> parse_messages(const json& body) {
  if (!body.contains("messages")) throw bad_request("\"messages\" is required");
  const json& ms = body["messages"];
  if (!ms.is_array() || ms.empty()) throw bad_request("\"messages\" must be a non-empty array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    if (!m.is_object()) throw bad_request("messages[" + std::to_string(i) + "] must be an object");
    if (!m.contains("role") || !m["role"].is_string()) throw bad_request("messages[" + std::to_string(i) + "].role must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      throw bad_request("messages[" + std::to_string(i) + "].role \"" + role + "\" is not supported (system, user, assistant)");
    }
    if (role == "system" && i != 0) throw bad_request("only the first message may be a system message");
    out.push_back({role, content_text(m, i)});
  }
  return out;
}

// The wait between the scheduler (producer) and the connection thread (writer).
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;  // not yet written
  bool done = false;
  GenOutcome outcome;
};

}  // namespace

GenParams parse_gen_params(const Service& svc, const json& b) {
  GenParams p;
  auto number = [&](const char* k, double lo, double hi) -> std::optional<double> {
    if (!b.contains(k) || b[k].is_null()) return std::nullopt;
    if (!b[k].is_number()) throw bad_request(std::string("\"") + k + "\" must be a number");
    double v = b[k].get<double>();
    if (!(v >= lo && v <= hi)) {
      throw bad_request(std::string("\"") + k + "\" must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
    return v;
  };
  if (auto v = number("temperature", 0, 2)) p.sampling.temperature = static_cast<float>(*v);
  if (auto v = number("top_p", 0, 1)) p.sampling.top_p = static_cast<float>(*v);
  if (auto v = number("min_p", 0, 1)) p.sampling.min_p = static_cast<float>(*v);
  if (auto v = number("repeat_penalty", 0, 10)) p.sampling.repeat_penalty = static_cast<float>(*v);
  if (b.contains("top_k") && !b["top_k"].is_null()) {
    if (!b["top_k"].is_number_integer()) throw bad_request("\"top_k\" must be an integer");
    p.sampling.top_k = b["top_k"].get<int>();
  }
  if (b.contains("seed") && !b["seed"].is_null()) {
    if (!b["seed"].is_number_integer()) throw bad_request("\"seed\" must be an integer");
    p.sampling.seed = b["seed"].is_number_unsigned() ? b["seed"].get<uint64_t>() : static_cast<uint64_t>(b["seed"].get<int64_t>());
  }
  if (b.contains("n") && !b["n"].is_null() && (!b["n"].is_number_integer() || b["n"].get<int64_t>() != 1)) {
    throw bad_request("\"n\" must be 1 (one choice per request)");
  }
  p.max_tokens = svc.config.default_max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (b.contains(k) && !b[k].is_null()) {
      if (!b[k].is_number_integer() || b[k].get<int64_t>() < 1) throw bad_request(std::string("\"") + k + "\" must be a positive integer");
      if (b[k].get<int64_t>() > svc.config.max_tokens) {
        throw bad_request(std::string("\"") + k + "\" of " + std::to_string(b[k].get<int64_t>()) +
                          " exceeds this server's limit of " + std::to_string(svc.config.max_tokens) + " (limits.max_tokens)");
      }
      p.max_tokens = b[k].get<int>();
    }
  }
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& s = b["stop"];
    if (s.is_string()) p.stop.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 16) {
      for (const auto& e : s) {
        if (!e.is_string()) throw bad_request("\"stop\" must be a string or an array of strings");
        p.stop.push_back(e.get<std::string>());
      }
    } else {
      throw bad_request("\"stop\" must be a string or an array of at most 16 strings");
    }
  }
  if (b.contains("stream") && !b["stream"].is_null()) {
    if (!b["stream"].is_boolean()) throw bad_request("\"stream\" must be true or false");
    p.stream = b["stream"].get<bool>();
  }
  for (const auto& s : svc.prompts.stop_strings()) p.stop.push_back(s);
  return p;
}

void run_generation(Service& svc, HttpResponder& out, GenerationSpec spec) {
  const int n_ctx = svc.model.config().n_ctx_train;
  const int prompt_limit = svc.config.max_prompt_tokens > 0 ? std::min(svc.config.max_prompt_tokens, n_ctx) : n_ctx;
  auto reject = [&](HttpError e) {
    if (spec.on_rejected) spec.on_rejected();
    throw e;
  };
  if (spec.prompt_tokens >= static_cast<size_t>(prompt_limit)) {
    HttpError e(400, "invalid_request_error",
                "the prompt is " + std::to_string(spec.prompt_tokens) + " tokens; this server accepts prompts of at most " +
                    std::to_string(prompt_limit - 1) + " tokens (model context " + std::to_string(n_ctx) + ")");
    reject(e);
  }
  auto job = std::make_shared<GenJob>();
  job->sampling = spec.params.sampling;
  job->stop = spec.params.stop;
  job->max_tokens = std::min<int>(spec.params.max_tokens, n_ctx - static_cast<int>(spec.prompt_tokens));
  job->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(svc.config.request_timeout_s * 1000));
  auto ch = std::make_shared<Channel>();
  auto full_text = std::make_shared<std::string>();
  auto prepare = spec.prepare;
  job->prepare = [prepare](int& http_status) {
    http_status = 500;
    return prepare();
  };
  job->on_text = [ch, full_text](std::string_view t) {
    full_text->append(t);
    std::lock_guard lock(ch->mu);
    ch->text.append(t);
    ch->cv.notify_all();
  };
  auto on_finish = spec.on_finish;
  job->on_finish = [ch, full_text, on_finish](GenOutcome& o, Lease* lease) {
    if (on_finish) on_finish(o, lease, *full_text);
    std::lock_guard lock(ch->mu);
    ch->done = true;
    ch->outcome = std::move(o);
    ch->outcome.prompt.clear();
    ch->outcome.tail.clear();
    ch->cv.notify_all();
  };
  switch (svc.scheduler.submit(job)) {
    case Scheduler::Submit::Ok: break;
    case Scheduler::Submit::QueueFull: {
      svc.metrics.rejected("queue_full");
      HttpError e(429, "rate_limit_error", "the request queue is full (limits.queue_length); retry shortly");
      e.retry_after = 1;
      reject(e);
      break;
    }
    case Scheduler::Submit::ShuttingDown: {
      svc.metrics.rejected("shutting_down");
      HttpError e(503, "overloaded_error", "the daemon is shutting down");
      e.retry_after = 5;
      reject(e);
    }
  }

  const std::string id = completion_id();
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  auto chunk = [&](const json& delta, const json& finish) {
    json c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", svc.model_id},
              {"choices", json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
    for (auto& [k, v] : spec.extra.items()) c[k] = v;
    return c;
  };
  bool streaming = spec.params.stream;
  bool started = false;
  std::string collected;
  GenOutcome outcome;
  for (;;) {
    std::string piece;
    bool done = false;
    {
      std::unique_lock lock(ch->mu);
      ch->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return ch->done || !ch->text.empty(); });
      piece.swap(ch->text);
      done = ch->done;
      if (done) outcome = ch->outcome;
    }
    if (done && !outcome.error.ok() && !started) break;  // an error before any output: a plain error reply
    if (streaming && !started) {
      started = true;
      if (!out.start_stream(200, "text/event-stream") ||
          !out.write_chunk("data: " + dump(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)) + "\n\n")) {
        job->cancelled = true;
      }
    }
    if (!piece.empty()) {
      collected += piece;
      if (streaming && !job->cancelled &&
          !out.write_chunk("data: " + dump(chunk({{"content", piece}}, nullptr)) + "\n\n")) {
        job->cancelled = true;
      }
    }
    if (done) break;
    if (!job->cancelled && out.client_gone()) {
      job->cancelled = true;
      log_info("client went away; cancelling its generation");
    }
  }
  if (!outcome.error.ok()) {
    if (!started) {
      HttpError e(outcome.http_status >= 400 ? outcome.http_status : 500,
                  outcome.http_status == 503 ? "overloaded_error" : outcome.http_status < 500 ? "invalid_request_error" : "server_error",
                  outcome.error.message());
      throw e;
    }
    json err = {{"error", {{"message", outcome.error.message()}, {"type", "server_error"}}}};
    out.write_chunk("data: " + dump(err) + "\n\n");
    out.write_chunk("data: [DONE]\n\n");
    out.end_stream();
    return;
  }
  if (outcome.finish_reason == "timeout") log_warn("a generation reached limits.request_timeout_seconds");
  const size_t prompt_tokens = spec.prompt_tokens;
  json usage = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", outcome.tokens.size()},
                {"total_tokens", prompt_tokens + outcome.tokens.size()},
                {"prompt_tokens_details", {{"cached_tokens", outcome.cached_tokens}}}};
  json timings = {{"queue_ms", outcome.queue_s * 1000}, {"prefill_ms", outcome.prefill_s * 1000},
                  {"first_token_ms", outcome.first_token_s * 1000}, {"total_ms", outcome.total_s * 1000},
                  {"finish", outcome.finish_reason}};
  if (streaming) {
    json last = chunk(json::object(), openai_finish(outcome.finish_reason));
    last["usage"] = usage;
    last["towers"] = timings;
    out.write_chunk("data: " + dump(last) + "\n\n");
    out.write_chunk("data: [DONE]\n\n");
    out.end_stream();
    return;
  }
  json r = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", svc.model_id},
            {"choices", json::array({{{"index", 0},
                                      {"message", {{"role", "assistant"}, {"content", collected}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", openai_finish(outcome.finish_reason)}}})},
            {"usage", usage}, {"towers", timings}};
  for (auto& [k, v] : spec.extra.items()) r[k] = v;
  send_json(out, 200, r);
}

void handle_openai(Service& svc, const HttpRequest& req, HttpResponder& out, bool& handled) {
  if (req.path == "/v1/models") {
    handled = true;
    if (req.method != "GET") throw HttpError(405, "invalid_request_error", "use GET");
    json m = {{"id", svc.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "towerd"},
              {"context_length", svc.model.config().n_ctx_train}};
    send_json(out, 200, {{"object", "list"}, {"data", json::array({m})}});
    return;
  }
  if (req.path != "/v1/chat/completions") return;
  handled = true;
  if (req.method != "POST") throw HttpError(405, "invalid_request_error", "use POST");
  json body = parse_body(req);
  GenParams params = parse_gen_params(svc, body);
  std::vector<ChatMessage> messages = parse_messages(body);
  std::string session, bot;
  if (body.contains("session") && !body["session"].is_null()) {
    if (!body["session"].is_string()) throw bad_request("\"session\" must be a string");
    session = body["session"].get<std::string>();
  }
  if (body.contains("bot") && !body["bot"].is_null()) {
    if (!body["bot"].is_string()) throw bad_request("\"bot\" must be a string");
    bot = body["bot"].get<std::string>();
  }
  GenerationSpec spec;
  spec.params = params;
  if (!session.empty()) {
    // The session holds the history: only the last message, a user message, is new.
    if (messages.back().role != "user") throw bad_request("with \"session\", the last message must be the user's new message");
    auto turn = std::make_shared<Catalog::Turn>(svc.catalog.begin_turn(session, messages.back().content));
    spec.prompt_tokens = turn->prompt_estimate;
    spec.prepare = [&svc, turn] { return svc.catalog.prepare_turn(*turn); };
    spec.on_finish = [&svc, turn](GenOutcome& o, Lease* l, const std::string& text) { svc.catalog.finish_turn(*turn, o, l, text); };
    spec.on_rejected = [&svc, turn] { svc.catalog.abort_turn(turn->session); };
    spec.extra = {{"session", session}};
  } else {
    auto st = std::make_shared<Catalog::Stateless>(svc.catalog.begin_stateless(bot, std::move(messages)));
    spec.prompt_tokens = st->prompt_estimate;
    spec.prepare = [&svc, st] { return svc.catalog.prepare_stateless(*st); };
    spec.on_finish = [&svc](GenOutcome& o, Lease* l, const std::string&) { svc.catalog.finish_stateless(o, l); };
    if (!bot.empty()) spec.extra = {{"bot", bot}};
  }
  run_generation(svc, out, std::move(spec));
}

}  // namespace towers::daemon::api

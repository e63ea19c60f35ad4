#include "daemon/api_reply.h"

#include <ctime>

#include "daemon/api_logprobs.h"
#include "daemon/random_id.h"

namespace towers::daemon::api {

using json = nlohmann::json;

std::string openai_finish(const std::string& r) {
  if (r == "eos" || r == "stop" || r == "cancelled") return "stop";
  return "length";
}

ReplyBuilder::ReplyBuilder(ReplyApi api, std::string model_id, const GenParams& params, size_t prompt_tokens,
                           json extra)
    : api_(api),
      model_id_(std::move(model_id)),
      id_(random_hex_id(api == ReplyApi::Chat ? "chatcmpl-" : "cmpl-")),
      created_(static_cast<int64_t>(std::time(nullptr))),
      stream_(params.stream),
      include_usage_(params.include_usage),
      logprobs_(params.sampling.logprobs >= 0),
      prompt_tokens_(prompt_tokens),
      extra_(std::move(extra)),
      choices_(static_cast<size_t>(std::max(1, params.n))) {}

std::string ReplyBuilder::event(const json& j) { return "data: " + dump(j) + "\n\n"; }

json ReplyBuilder::chunk(json choices) const {
  json c = {{"id", id_},
            {"object", api_ == ReplyApi::Chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_id_},
            {"choices", std::move(choices)}};
  if (include_usage_) c["usage"] = nullptr;
  for (auto& [k, v] : extra_.items()) c[k] = v;
  return c;
}

json ReplyBuilder::logprobs_json(std::span<const Logprobs> lps, size_t* text_offset) const {
  if (!logprobs_) return nullptr;
  return api_ == ReplyApi::Chat ? chat_logprobs(lps) : completion_logprobs(lps, text_offset);
}

std::string ReplyBuilder::add(int choice, std::string_view text, std::vector<Logprobs> logprobs) {
  Choice& c = choices_.at(static_cast<size_t>(choice));
  c.text.append(text);
  if (!stream_) {
    for (auto& lp : logprobs) c.logprobs.push_back(std::move(lp));
    return {};
  }
  if (text.empty() && logprobs.empty()) return {};
  json lp = logprobs_json(logprobs, &c.text_offset);
  json ch = api_ == ReplyApi::Chat
                ? json{{"index", choice}, {"delta", {{"content", text}}}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}}
                : json{{"index", choice}, {"text", text}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}};
  return event(chunk(json::array({std::move(ch)})));
}

std::string ReplyBuilder::start_events() const {
  if (api_ != ReplyApi::Chat) return {};
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    out += event(chunk(json::array({{{"index", i},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}})));
  }
  return out;
}

namespace {
// Each choice's tokens and finish reason: the outcome's own for one choice.
std::vector<GenOutcome::Choice> outcome_choices(const GenOutcome& o) {
  if (!o.choices.empty()) return o.choices;
  return {{o.tokens, o.finish_reason}};
}
}  // namespace

json ReplyBuilder::usage(const GenOutcome& o) const {
  size_t completion = 0;
  for (const auto& c : outcome_choices(o)) completion += c.tokens.size();
  json u = {{"prompt_tokens", prompt_tokens_}, {"completion_tokens", completion},
            {"total_tokens", prompt_tokens_ + completion},
            {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
  if (dropped_turns_) {
    // The session reached the context: its oldest turns were left out of this prompt (and of it).
    u["dropped_turns"] = dropped_turns_;
    u["dropped_tokens"] = dropped_tokens_;
  }
  return u;
}

json ReplyBuilder::timings(const GenOutcome& o) const {
  return {{"queue_ms", o.queue_s * 1000}, {"prefill_ms", o.prefill_s * 1000},
          {"first_token_ms", o.first_token_s * 1000}, {"total_ms", o.total_s * 1000}, {"finish", o.finish_reason}};
}

std::string ReplyBuilder::end_events(const GenOutcome& o) const {
  std::string out;
  const auto finishes = outcome_choices(o);
  for (size_t i = 0; i < choices_.size() && i < finishes.size(); ++i) {
    const json finish = openai_finish(finishes[i].finish_reason);
    json ch = api_ == ReplyApi::Chat
                  ? json{{"index", i}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", finish}}
                  : json{{"index", i}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish}};
    json c = chunk(json::array({std::move(ch)}));
    if (i + 1 == choices_.size()) c["towers"] = timings(o);
    out += event(c);
  }
  if (include_usage_) {
    json c = chunk(json::array());
    c["usage"] = usage(o);
    out += event(c);
  }
  return out + "data: [DONE]\n\n";
}

json ReplyBuilder::whole(const GenOutcome& o) const {
  const auto finishes = outcome_choices(o);
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const json finish = i < finishes.size() ? json(openai_finish(finishes[i].finish_reason)) : json(nullptr);
    size_t offset = 0;
    json lp = logprobs_json(c.logprobs, &offset);
    if (api_ == ReplyApi::Chat) {
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},
                         {"logprobs", std::move(lp)},
                         {"finish_reason", finish}});
    } else {
      choices.push_back({{"index", i}, {"text", c.text}, {"logprobs", std::move(lp)}, {"finish_reason", finish}});
    }
  }
  json r = {{"id", id_},
            {"object", api_ == ReplyApi::Chat ? "chat.completion" : "text_completion"},
            {"created", created_},
            {"model", model_id_},
            {"choices", std::move(choices)},
            {"usage", usage(o)},
            {"towers", timings(o)}};
  for (auto& [k, v] : extra_.items()) r[k] = v;
  return r;
}

}  // namespace towers::daemon::api

#include "daemon/api_reply.h"

#include <ctime>

#include "daemon/api_logprobs.h"
#include "daemon/random_id.h"

namespace towers::daemon::api {

using json = nlohmann::json;

std::string_view openai_finish_reason(FinishReason reason, bool called_tools) {
  switch (reason) {
    case FinishReason::Eos:
    case FinishReason::Stop:
    case FinishReason::Cancelled:
      // A reply that stopped after making tool calls; one cut short stays "length".
      return called_tools ? "tool_calls" : "stop";
    case FinishReason::Length:
    case FinishReason::Context:
    case FinishReason::Grammar:
    case FinishReason::Timeout:
    case FinishReason::Error:
      break;
  }
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
      seed_(params.sampling.seed),
      tool_format_(api == ReplyApi::Chat ? params.tool_format : std::nullopt),
      extra_(std::move(extra)),
      choices_(static_cast<size_t>(std::max(1, params.n))) {
  if (tool_format_ && stream_) {
    for (Choice& c : choices_) c.tools = std::make_unique<ToolCallParser>(*tool_format_, /*tools_active=*/true);
  }
  if (api == ReplyApi::Responses) response_ = std::make_unique<ResponseReply>(params, prompt_tokens, extra_);
}

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
  if (response_) return response_->add(text);
  Choice& c = choices_.at(static_cast<size_t>(choice));
  c.text.append(text);
  if (!stream_) {
    for (auto& lp : logprobs) c.logprobs.push_back(std::move(lp));
    return {};
  }
  if (c.tools) return tool_events(choice, c.tools->feed(text), logprobs);
  if (text.empty() && logprobs.empty()) return {};
  json lp = logprobs_json(logprobs, &c.text_offset);
  json ch = api_ == ReplyApi::Chat
                ? json{{"index", choice}, {"delta", {{"content", text}}}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}}
                : json{{"index", choice}, {"text", text}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}};
  return event(chunk(json::array({std::move(ch)})));
}

std::string ReplyBuilder::tool_events(int choice, const std::vector<ToolCallParser::Event>& events,
                                      std::vector<Logprobs>& logprobs) {
  Choice& c = choices_.at(static_cast<size_t>(choice));
  std::string out;
  for (const auto& ev : events) {
    json delta;
    if (ev.kind == ToolCallParser::Event::Kind::Content) {
      delta = {{"content", ev.text}};
    } else if (ev.kind == ToolCallParser::Event::Kind::CallStart) {
      c.call_ids.push_back(random_hex_id("call_"));
      delta = {{"tool_calls", json::array({{{"index", ev.index},
                                             {"id", c.call_ids.back()},
                                             {"type", "function"},
                                             {"function", {{"name", ev.text}, {"arguments", ""}}}}})}};
    } else {
      delta = {{"tool_calls", json::array({{{"index", ev.index}, {"function", {{"arguments", ev.text}}}}})}};
    }
    json lp = logprobs.empty() ? json(nullptr) : logprobs_json(logprobs, &c.text_offset);
    logprobs.clear();
    out += event(chunk(json::array({{{"index", choice}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}}})));
  }
  // Text held back (it may begin a call): its logprobs wait for the text, as a chunk of their own.
  if (!logprobs.empty() && logprobs_) {
    out += event(chunk(json::array({{{"index", choice}, {"delta", {{"content", ""}}}, {"logprobs", logprobs_json(logprobs, &c.text_offset)}, {"finish_reason", nullptr}}})));
  }
  return out;
}

std::string ReplyBuilder::start_events() {
  if (response_) return response_->start_events();
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

json towers_timings(const GenOutcome& o, uint64_t seed) {
  return {{"queue_ms", o.queue_s * 1000}, {"prefill_ms", o.prefill_s * 1000},
          {"first_token_ms", o.first_token_s * 1000}, {"total_ms", o.total_s * 1000}, {"finish", to_string(o.finish_reason)},
          {"seed", seed}};
}

std::string ReplyBuilder::end_events(const GenOutcome& o) {
  if (response_) return response_->end_events(o);
  std::string out;
  const auto finishes = outcome_choices(o);
  for (size_t i = 0; i < choices_.size() && i < finishes.size(); ++i) {
    if (choices_[i].tools) {
      // What the parser held back; a call cut short (max_tokens) is left as it was streamed.
      auto rest = choices_[i].tools->finish();
      std::vector<Logprobs> none;
      if (rest.ok()) out += tool_events(static_cast<int>(i), rest.value(), none);
    }
    const json finish = openai_finish_reason(finishes[i].finish_reason, !choices_[i].call_ids.empty());
    json ch = api_ == ReplyApi::Chat
                  ? json{{"index", i}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", finish}}
                  : json{{"index", i}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish}};
    json c = chunk(json::array({std::move(ch)}));
    if (i + 1 == choices_.size()) c["towers"] = towers_timings(o, seed_);
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
  if (response_) return response_->whole(o);
  const auto finishes = outcome_choices(o);
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const FinishReason* reason = i < finishes.size() ? &finishes[i].finish_reason : nullptr;
    size_t offset = 0;
    json lp = logprobs_json(c.logprobs, &offset);
    if (api_ == ReplyApi::Chat) {
      json message = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
      // With tools, the text is parsed into calls as a stream of it would be: a reply cut by
      // max_tokens (finish_reason "length") keeps the calls it began, as streamed.
      auto parsed = tool_format_ ? parse_tool_reply(*tool_format_, c.text, /*as_streamed=*/true)
                                 : Result<ParsedReply>(ParsedReply{});
      const bool called = parsed.ok() && !parsed.value().tool_calls.empty();
      if (called) {
        json calls = json::array();
        for (const auto& call : parsed.value().tool_calls) {
          calls.push_back({{"id", random_hex_id("call_")},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        message["content"] = parsed.value().content.empty() ? json(nullptr) : json(parsed.value().content);
        message["tool_calls"] = std::move(calls);
      }
      choices.push_back({{"index", i},
                         {"message", std::move(message)},
                         {"logprobs", std::move(lp)},
                         {"finish_reason", reason ? json(openai_finish_reason(*reason, called)) : json(nullptr)}});
    } else {
      choices.push_back({{"index", i}, {"text", c.text}, {"logprobs", std::move(lp)},
                         {"finish_reason", reason ? json(openai_finish_reason(*reason)) : json(nullptr)}});
    }
  }
  json r = {{"id", id_},
            {"object", api_ == ReplyApi::Chat ? "chat.completion" : "text_completion"},
            {"created", created_},
            {"model", model_id_},
            {"choices", std::move(choices)},
            {"usage", usage(o)},
            {"towers", towers_timings(o, seed_)}};
  for (auto& [k, v] : extra_.items()) r[k] = v;
  return r;
}

}  // namespace towers::daemon::api

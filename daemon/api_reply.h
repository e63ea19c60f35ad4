// The OpenAI objects of one generation's reply: chat completions (chat.completion, or
// chat.completion.chunk events), legacy completions (text_completion, streamed or not) and responses
// (handed to daemon/api_response_reply.h's ResponseReply), with n choices, logprobs (daemon/api_logprobs.h), finish reasons, usage, and Towers' extra fields.
//
// Streamed, as OpenAI sends it: chat starts with each choice's {"role":"assistant","content":""}
// delta; every piece of text is a chunk of one choice (its logprobs with it); at the end each choice's
// finish chunk, then — only when stream_options.include_usage asked for it — a chunk with
// "choices": [] and the usage (the other chunks then carry "usage": null), then "data: [DONE]".
// With tools (GenParams::tool_format), each choice's text goes through a ToolCallParser: content
// deltas until a call starts, then "tool_calls" deltas (the call's id, type and name first, then its
// arguments in pieces); a reply with calls finishes with "tool_calls". Whole, the message carries
// "tool_calls" and a null content when the calls are all it says.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <memory>
#include <optional>
#include <vector>

#include "daemon/api_response_reply.h"
#include "daemon/service.h"

namespace towers::daemon::api {

class ReplyBuilder {
 public:
  ReplyBuilder(ReplyApi api, std::string model_id, const GenParams& params, size_t prompt_tokens,
               nlohmann::json extra);

  // Keeps a choice's text (and, for a whole reply, its logprobs) and returns its SSE event when the
  // reply streams ("" otherwise, or when there is nothing to send).
  std::string add(int choice, std::string_view text, std::vector<Logprobs> logprobs);
  // SSE events: the stream's start (chat: the role deltas), and its end from the outcome (finish
  // chunks, usage if asked, [DONE]).
  std::string start_events();
  std::string end_events(const GenOutcome& o);
  // The whole reply (not streamed).
  nlohmann::json whole(const GenOutcome& o) const;

  // A session turn that left out its oldest turns: usage reports how many (and their tokens).
  void set_dropped(size_t turns, size_t tokens) {
    dropped_turns_ = turns;
    dropped_tokens_ = tokens;
    if (response_) response_->set_dropped(turns, tokens);
  }

  const std::string& text(int choice = 0) const {
    return response_ ? response_->text() : choices_[static_cast<size_t>(choice)].text;
  }

 private:
  struct Choice {
    std::string text;
    std::vector<Logprobs> logprobs;
    size_t text_offset = 0;  // completions' logprobs: bytes of text before the next token
    std::unique_ptr<ToolCallParser> tools;  // streamed with tools: what is content, what a call
    std::vector<std::string> call_ids;       // ... and the ids given to its calls
  };
  // Streamed with tools: the chunks of a choice's parser events (logprobs ride on the first).
  std::string tool_events(int choice, const std::vector<ToolCallParser::Event>& events, std::vector<Logprobs>& logprobs);
  nlohmann::json chunk(nlohmann::json choices) const;
  nlohmann::json usage(const GenOutcome& o) const;
  nlohmann::json logprobs_json(std::span<const Logprobs> lps, size_t* text_offset) const;
  static std::string event(const nlohmann::json& j);

  ReplyApi api_;
  std::string model_id_;
  std::string id_;
  int64_t created_;
  bool stream_, include_usage_, logprobs_;
  size_t prompt_tokens_;
  uint64_t seed_;  // the sampling seed (the request's, or the one drawn for it): "towers.seed"
  std::optional<ToolFormat> tool_format_;
  nlohmann::json extra_;
  std::vector<Choice> choices_;
  size_t dropped_turns_ = 0, dropped_tokens_ = 0;
  // ReplyApi::Responses: the response's objects and events (extra is its base object).
  std::unique_ptr<ResponseReply> response_;
};

// Towers' own part of a reply ("towers"): queue, prefill, first token and total in ms, the finish
// reason, the sampling seed (to replay it).
nlohmann::json towers_timings(const GenOutcome& o, uint64_t seed);

// What an OpenAI client sees: "stop" (Eos, Stop, Cancelled), "tool_calls" (such a stop after the reply
// made tool calls), else "length" (Length, and Context, Timeout, Grammar, Error: cut short).
std::string_view openai_finish_reason(FinishReason reason, bool called_tools = false);

}  // namespace towers::daemon::api

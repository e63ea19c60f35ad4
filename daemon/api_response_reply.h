// The objects of OpenAI's Responses API for one generation (POST /v1/responses, daemon/api_responses.cc):
// the `response` object, whole, and its typed SSE events when it streams. ReplyBuilder
// (daemon/api_reply.h) hands a ReplyApi::Responses generation to a ResponseReply, so the generation
// runner answers a response as it answers a chat completion.
//
// Streamed, as OpenAI sends it (every event has an "event:" line, and its data a "type" equal to it
// and a "sequence_number" counting from 0):
//   response.created, response.in_progress            the response, status "in_progress", no output
//   response.output_item.added                        the assistant message item, status "in_progress"
//   response.content_part.added                       its output_text part, empty
//   response.output_text.delta ...                    each piece of text
//   response.output_text.done, response.content_part.done, response.output_item.done   the whole text
//   response.completed (or response.incomplete)       the response with its output and usage
// With tools (GenParams::tool_format) the reply's text is parsed as it streams (ToolCallParser): the
// message item is added only when content comes, and each call is a function_call item of its own
// ({"type": "function_call", "id": "fc_…", "call_id": "call_…", "name", "arguments", "status"}):
//   response.output_item.added (arguments "")        a call begins
//   response.function_call_arguments.delta ...        each piece of its arguments
//   response.function_call_arguments.done, response.output_item.done   when the next item begins or
//                                                     the reply ends
// The ids are derived from the response's id, as the message item's is (resp_<session>_<turn> has
// fc_<session>_<turn>_<k> and call_<session>_<turn>_<k>), so GET /v1/responses/{id} rebuilds them and a
// function_call_output's call_id names the session turn it answers.
// No "data: [DONE]" (the Responses API has none). A reply cut short (max_output_tokens, the context,
// the deadline) is status "incomplete" with incomplete_details.reason "max_output_tokens" (the item
// "incomplete" too), as OpenAI reports it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "daemon/service.h"

namespace towers::daemon::api {

// The message item's id of a response: "msg_" and what follows "resp_" in its id (so that GET
// /v1/responses/{id} rebuilds the same item).
std::string response_item_id(const std::string& response_id);
// The assistant message item holding `text`; status "completed", "in_progress" or "incomplete".
nlohmann::json response_message_item(const std::string& response_id, std::string_view status, const std::string& text);
// The output items of a reply's text: without tools one message item; with them (format) the content
// before the calls, if any, as a message item, then a function_call item per call (a reply cut short
// keeps the calls it began, as a stream of it did). Nothing at all: an empty message item.
nlohmann::json response_output(const std::string& response_id, std::string_view status, const std::string& text,
                               std::optional<ToolFormat> format);
// The k-th function call item of a response (k = 0, 1, ...).
nlohmann::json response_function_call_item(const std::string& response_id, size_t k, const std::string& name,
                                           const std::string& arguments, std::string_view status);
// The response object: `base` (id, created_at, model, instructions, ... as the request set them)
// with status, output and usage (null: not known, e.g. a stored response read back).
nlohmann::json response_object(const nlohmann::json& base, std::string_view status, nlohmann::json output,
                               nlohmann::json usage);

class ResponseReply {
 public:
  // base: the response object's fields known before the model runs (its "id" among them).
  ResponseReply(const GenParams& params, size_t prompt_tokens, nlohmann::json base);

  std::string add(std::string_view text);      // a streamed delta event ("" when not streaming)
  std::string start_events();                  // created .. content_part.added
  std::string end_events(const GenOutcome& o);  // output_text.done .. completed/incomplete
  nlohmann::json whole(const GenOutcome& o) const;  // the response at the end (also the last event's)
  const std::string& text() const { return text_; }
  void set_dropped(size_t turns, size_t tokens) { dropped_turns_ = turns, dropped_tokens_ = tokens; }

 private:
  std::string event(std::string_view type, nlohmann::json data);
  // Streamed with tools: the events of the parser's events, and those closing the item now open.
  std::string tool_events(const std::vector<ToolCallParser::Event>& events);
  std::string open_message();
  std::string close_open_item();
  std::string message_done(const nlohmann::json& item, const std::string& text);  // the message item's end
  nlohmann::json usage(const GenOutcome& o) const;
  const std::string& id() const;

  bool stream_;
  size_t prompt_tokens_;
  uint64_t seed_;
  nlohmann::json base_;
  std::string text_;
  uint64_t sequence_ = 0;
  std::optional<ToolFormat> tool_format_;
  std::unique_ptr<ToolCallParser> parser_;  // streamed with tools
  // Streamed with tools: the items so far (the message's content, the calls' names and arguments),
  // and which one is open (not done yet).
  bool message_ = false;
  std::string content_;
  std::vector<std::pair<std::string, std::string>> calls_;
  bool item_open_ = false;
  size_t dropped_turns_ = 0, dropped_tokens_ = 0;
};

}  // namespace towers::daemon::api

// OpenAI's Responses API on towerd's sessions: a response IS a turn of a session. The pieces of
// POST /v1/responses that need no model — the request's fields as the chat path's, its input items,
// and response ids — so that they are tested alone (tests/test_api_responses.cc); the handlers are in
// daemon/api_responses.cc, the reply objects in daemon/api_response_reply.h.
//
// A response id is derived, not stored: "resp_" + session id + "_" + the turn's number (1, 2, ...).
// The session and its numbered turns are in the state log already, so a restart continues a
// previous_response_id chain without a record of its own (docs/api.md, "Responses").
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/api_error.h"
#include "engine/constrained/tool_format.h"
#include "engine/text/chat_template.h"

namespace towers::daemon::api {

struct ResponseRef {
  std::string session;
  uint64_t turn = 0;  // 1, 2, ...
};
std::string response_id(const std::string& session, uint64_t turn);
// nullopt: not an id response_id() writes (e.g. a store:false response's "resp_<hex>").
std::optional<ResponseRef> parse_response_id(std::string_view id);

// The segment names of the system prompt a response without `bot` gets: its instructions as the text
// of bot "responses.<16 hex of their hash>" under platform "responses" (empty text), shared by every
// response with the same instructions.
inline constexpr std::string_view kResponsesPlatform = "responses";
std::string instructions_bot(const std::string& instructions);
bool is_instructions_bot(std::string_view bot);

// The session turn an output item id names: "msg_<session>_<turn>" (response_item_id).
std::optional<ResponseRef> parse_item_id(std::string_view id);
// The session turn a function call's call_id names: "call_<session>_<turn>_<k>" (its k-th call).
std::optional<ResponseRef> parse_call_id(std::string_view call_id);

// "input" (a string, or items) with "instructions": the system text (instructions, then the text of
// system and developer messages, joined by blank lines; nullopt when there is none) and the user and
// assistant messages in order. An item_reference ({"type": "item_reference", "id": "msg_..."}, what
// the AI SDK sends for an earlier reply when responses are stored) is an assistant message whose
// text the handler reads from the session (references[i] = the id; "" for a message sent whole).
// A function_call_output item ({"type": "function_call_output", "call_id", "output"}) is a "tool"
// message; a function_call item ({"type": "function_call", "call_id", "name", "arguments"}, what the
// AI SDK sends back for an earlier reply's call) is a call of the assistant message before it (a new
// one when there is none), as the chat API writes calls. Non-text parts are refused by name (param
// "input[i]...").
struct ResponseInput {
  std::optional<std::string> system;
  std::vector<ChatMessage> messages;    // user, assistant, and "tool" (a function_call_output's output)
  std::vector<std::string> references;  // one per message
  std::vector<std::string> call_ids;    // one per message: a tool message's call_id ("" for the others)
  std::vector<std::vector<ToolCall>> calls;  // one per message: an assistant message's function_call items
};
ApiStatus parse_response_input(const nlohmann::json& body, ResponseInput* out);

// A Responses body's fields as a chat completions body that parse_gen_params reads
// (max_output_tokens -> max_tokens, text.format -> response_format, ...; `ordered`: the body in the
// client's key order, so that a JSON schema keeps its properties' order). A field towerd does not
// know is 400 unknown_parameter, one it does not support (tools, reasoning, ...) 400
// unsupported_parameter, both naming it. The fields towerd handles itself (input, instructions,
// previous_response_id, store, bot) are not copied.
ApiStatus responses_chat_body(const nlohmann::ordered_json& body, nlohmann::ordered_json* chat);
// An error of parse_gen_params on that chat body, naming the Responses field instead
// (max_tokens -> max_output_tokens, response_format... -> text.format...).
ApiStatus as_responses_error(ApiStatus e);

}  // namespace towers::daemon::api

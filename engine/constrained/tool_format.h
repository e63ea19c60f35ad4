// Tool calling (OpenAI "tools" / "tool_choice") on top of the chat formats of engine/text/chat_template.h:
// rendering tools, tool calls and tool results into the prompt the way each model family was trained,
// the grammar that makes the reply a valid call (engine/constrained/grammar.h), and parsing the reply back into
// tool calls, whole or as OpenAI-style streamed deltas.
//
// Formats (tool_format_for):
//   Llama3Json  Llama 3.1/3.2/3.3's JSON tool calling (meta-llama/Llama-3.1-8B-Instruct's template with
//               tools_in_user_message): the system turn gets "Environment: ipython", the first user turn
//               is prefixed with "Given the following functions, ..." and each tool as
//               tojson(indent=4); the reply is one call {"name": NAME, "parameters": {...}}; an
//               assistant call is rendered so, tool results as "ipython" turns holding tojson(content).
//               Like chat_template.h's Llama3, without the "Cutting Knowledge Date" lines. One call per
//               reply (the template refuses more).
//   Hermes      Qwen2.5-Instruct's template (NousResearch Hermes style): the system message gets a
//               "# Tools" section listing tojson(tool) inside <tools></tools>; calls are
//               <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>, one or more, optionally
//               after some text; tool results become a user turn of <tool_response>...</tool_response>
//               blocks (consecutive tool messages share one turn). Also the generic format of every
//               family whose template has no tool format of its own (llama2, mistral, zephyr, gemma,
//               plain), with the same wording.
// tojson is Hugging Face's (Python json.dumps, ensure_ascii=False): ", " and ": " separators.
//
// tool_choice: None renders no tools and constrains nothing (tool calls and results in the history are
// still rendered); Auto lets the model's first tokens choose between text and a call (Llama3Json: a
// reply starting with "{" is a call; Hermes: any text that does not contain "<tool_call>", then
// optionally calls); Required: one or more calls (Llama3Json: exactly one); Named: exactly one call of
// that function. Hermes calls are separated by one "\n"; after a call the turn may end (also after
// that "\n"), and after the last call max_calls allows only the end. Every call the grammar allows has arguments valid against the tool's parameters
// schema (engine/constrained/json_schema.h lists the supported keywords; others are an error at request time).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/chat_template.h"
#include "engine/base/status.h"

namespace towers {

struct ToolDefinition {
  std::string name;         // [a-zA-Z0-9_-]{1,64}, as OpenAI requires
  std::string description;  // may be empty
  std::string parameters;   // JSON Schema text; empty: {"type": "object"} (any object)
};

struct ToolCall {
  std::string id;         // the caller's ("call_..."); parsing leaves it empty
  std::string name;
  std::string arguments;  // JSON text, as the model wrote it
};

struct ToolChoice {
  enum class Mode { None, Auto, Required, Named };
  Mode mode = Mode::Auto;
  std::string name;  // Named: the function
};

// A chat message as the OpenAI API carries it.
struct ToolChatMessage {
  std::string role;                  // "system", "user", "assistant" or "tool"
  std::string content;               // "" for an assistant message with tool_calls and null content
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only (not rendered by these templates)
};

enum class ToolFormat { Llama3Json, Hermes };
ToolFormat tool_format_for(ChatFamily family);
std::string_view tool_format_name(ToolFormat format);  // "llama3-json", "hermes"

// The messages to give apply_chat_template(family, ...). default_system: the system message the
// template inserts when there is none (chat_template_default_system(); Qwen2.5's); the result starts
// with it when the conversation has no system message. InvalidArgument for bad tools (names, schemas
// that are not JSON), unknown roles, tool_calls on other roles, or what the family's template refuses
// (Llama3Json: several calls in one message, tools without a first user message).
Result<std::vector<ChatMessage>> render_tool_messages(ChatFamily family, std::span<const ToolChatMessage> messages,
                                                      std::span<const ToolDefinition> tools,
                                                      const ToolChoice& choice, std::string_view default_system);

// Where a format puts the tool definitions, and their text there, for a prompt built of segments
// (daemon/prompt.h: a session's tools are a segment of their own under its bot). SystemEnd (Hermes):
// appended to the system text after "\n\n"; FirstUserStart (Llama3Json): at the start of the first
// user message's content. render_tool_messages writes the same text in the same place.
struct ToolsBlock {
  enum class Place { SystemEnd, FirstUserStart };
  Place place = Place::SystemEnd;
  std::string text;
};
Result<ToolsBlock> tools_block(ToolFormat format, std::span<const ToolDefinition> tools);

// The canonical JSON of tool definitions ([{"name", "description"?, "parameters"?}], parameters in
// the client's key order): what a session records, and what decides whether two requests send the
// same tools. parse_tools_json reads it back (InvalidArgument when it is not such an array).
std::string tools_json(std::span<const ToolDefinition> tools);
Result<std::vector<ToolDefinition>> parse_tools_json(std::string_view text);
// Tool messages (role "tool") as JSON [{"tool_call_id", "content"}, ...], and back: how a session
// keeps a turn of tool results.
std::string tool_results_json(std::span<const ToolChatMessage> results);
Result<std::vector<ToolChatMessage>> parse_tool_results_json(std::string_view text);

// GBNF for the reply under `choice` ("" when nothing constrains it: Mode None, or no tools).
// max_calls: how many calls one reply may hold (OpenAI's parallel_tool_calls false = 1; Llama3Json: 1).
// InvalidArgument for a Named choice that is not among the tools, a schema the compiler rejects
// (naming the tool and keyword), or duplicate tool names.
Result<std::string> tool_call_gbnf(ToolFormat format, std::span<const ToolDefinition> tools, const ToolChoice& choice,
                                   int max_calls = 8);

// Streaming parse of a reply into content and tool calls, as OpenAI streams them: text is content
// until a call starts (text that may be the start of a call is held back until it is certain), a call
// first gives its name, then its arguments in pieces as they are generated. Concatenating a call's
// argument pieces gives its arguments JSON text. Without `tools_active` everything is content.
class ToolCallParser {
 public:
  ToolCallParser(ToolFormat format, bool tools_active);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  struct Event {
    enum class Kind { Content, CallStart, Arguments };
    Kind kind;
    int index = 0;     // CallStart, Arguments: the call's index in the reply (0, 1, ...)
    std::string text;  // Content: text; CallStart: the function name; Arguments: a piece
  };
  std::vector<Event> feed(std::string_view text);
  // End of the reply: what was held back. InvalidArgument when a call was left unfinished or is not a
  // valid {"name": ..., "arguments"/"parameters": ...} object (never the case under tool_call_gbnf's
  // grammar, unless max_tokens cut the reply).
  Result<std::vector<Event>> finish();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The whole reply at once: the concatenated events of a ToolCallParser (content: the text before the
// calls, without the whitespace just before the first one). A reply cut short (max_tokens) is an
// error, or with `as_streamed` what a stream of it gave: the calls so far (the last one's arguments
// unfinished) and the content not held back, so that a whole reply and a streamed one agree.
struct ParsedReply {
  std::string content;
  std::vector<ToolCall> tool_calls;
};
Result<ParsedReply> parse_tool_reply(ToolFormat format, std::string_view text, bool as_streamed = false);

}  // namespace towers

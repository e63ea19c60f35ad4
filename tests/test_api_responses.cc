// The Responses API's pieces that need no model (daemon/api_responses.h, daemon/api_response_reply.h):
// response ids and the instructions' bot names, input items, the body's fields as the chat path's
// (and refused ones named), and the typed stream events with their order and sequence numbers.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "daemon/api_reply.h"
#include "daemon/api_responses.h"

using namespace towers;
using namespace towers::daemon;
using namespace towers::daemon::api;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

struct Event {
  std::string name;  // the "event:" line
  json data;
};

// "event: NAME\ndata: {...}\n\n" ... as (name, data); fails the test on another shape.
std::vector<Event> sse_events(const std::string& text) {
  std::vector<Event> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    const std::string block = text.substr(at, end - at);
    const size_t nl = block.find('\n');
    REQUIRE(block.starts_with("event: "));
    REQUIRE(block.substr(nl + 1).starts_with("data: "));
    out.push_back({block.substr(7, nl - 7), json::parse(block.substr(nl + 7))});
    at = end + 2;
  }
  return out;
}

ApiStatus input_of(const json& body, ResponseInput* in) { return parse_response_input(body, in); }

ApiStatus chat_of(const char* body, ojson* chat) { return responses_chat_body(ojson::parse(body), chat); }

GenOutcome outcome(FinishReason reason, size_t tokens, size_t cached) {
  GenOutcome o;
  o.finish_reason = reason;
  o.tokens.assign(tokens, 7);
  o.cached_tokens = cached;
  return o;
}

}  // namespace

TEST_CASE("a response id names its session and turn, and only ids of that form parse") {
  for (const std::string session : {"s-0123abcd", "my_session.v2", "x"}) {
    for (uint64_t turn : {1ull, 2ull, 123456789ull}) {
      auto ref = parse_response_id(response_id(session, turn));
      REQUIRE(ref);
      CHECK(ref->session == session);
      CHECK(ref->turn == turn);
    }
  }
  for (const char* bad : {"resp_0123456789abcdef", "resp_s_0", "resp_s_", "resp__3", "resp_s_1x", "chatcmpl-1", "",
                          "resp_s_123456789012345678901"}) {
    CHECK_MESSAGE(!parse_response_id(bad), bad);
  }
}

TEST_CASE("the instructions' bot is named by their hash, the same for the same text") {
  const std::string a = instructions_bot("Answer in French."), b = instructions_bot("Answer in German.");
  CHECK(a == instructions_bot("Answer in French."));
  CHECK(a != b);
  CHECK(a.starts_with("responses."));
  CHECK(is_instructions_bot(a));
  CHECK(is_instructions_bot(instructions_bot("")));
  CHECK(!is_instructions_bot("responses"));
  CHECK(!is_instructions_bot("hal"));
}

TEST_CASE("input: a string, or message items with text parts, system texts joined to the instructions") {
  ResponseInput in;
  REQUIRE(input_of({{"input", "Hi"}}, &in).ok());
  REQUIRE(in.messages.size() == 1);
  CHECK(in.messages[0].role == "user");
  CHECK(in.messages[0].content == "Hi");
  CHECK(!in.system);

  ResponseInput items;
  const json body = {{"instructions", "Be brief."},
                     {"input", json::array({{{"role", "developer"}, {"content", "Use English."}},
                                            {{"type", "message"}, {"role", "user"},
                                             {"content", json::array({{{"type", "input_text"}, {"text", "One "}},
                                                                      {{"type", "input_text"}, {"text", "two"}}})}},
                                            {{"role", "assistant"}, {"id", "msg_1"}, {"status", "completed"},
                                             {"content", json::array({{{"type", "output_text"}, {"text", "ok"}, {"annotations", json::array()}}})}},
                                            {{"role", "user"}, {"content", "three"}}})}};
  REQUIRE(input_of(body, &items).ok());
  REQUIRE(items.system);
  CHECK(*items.system == "Be brief.\n\nUse English.");
  REQUIRE(items.messages.size() == 3);
  CHECK(items.messages[0].content == "One two");
  CHECK(items.messages[1].role == "assistant");
  CHECK(items.messages[1].content == "ok");
  CHECK(items.messages[2].content == "three");
}

TEST_CASE("input: an item reference to a response's message is an assistant message to fill in") {
  ResponseInput in;
  REQUIRE(input_of({{"input", json::array({{{"role", "user"}, {"content", "a"}},
                                           {{"type", "item_reference"}, {"id", "msg_s-1_1"}},
                                           {{"role", "user"}, {"content", "b"}}})}},
                   &in)
              .ok());
  REQUIRE(in.messages.size() == 3);
  REQUIRE(in.references.size() == 3);
  CHECK(in.messages[1].role == "assistant");
  CHECK(in.references[0].empty());
  CHECK(in.references[1] == "msg_s-1_1");
  auto ref = parse_item_id(in.references[1]);
  REQUIRE(ref);
  CHECK(ref->session == "s-1");
  CHECK(ref->turn == 1);
  CHECK(!parse_item_id("resp_s-1_1"));
}

TEST_CASE("input: function_call_output items are tool messages with their call ids") {
  ResponseInput in;
  REQUIRE(input_of({{"input", json::array({{{"type", "function_call_output"}, {"call_id", "call_s_1_0"}, {"output", "18 C"}},
                                           {{"type", "function_call_output"}, {"call_id", "call_s_1_1"}, {"output", "9 C"}}})}},
                   &in)
              .ok());
  REQUIRE(in.messages.size() == 2);
  CHECK(in.messages[0].role == "tool");
  CHECK(in.messages[0].content == "18 C");
  CHECK(in.call_ids == std::vector<std::string>{"call_s_1_0", "call_s_1_1"});
  REQUIRE(input_of({{"input", "x"}}, &in).ok());
  CHECK(in.call_ids.back().empty());
}

TEST_CASE("input: function_call items are the calls of the assistant message before them") {
  ResponseInput in;
  const json call0 = {{"type", "function_call"}, {"call_id", "call_s-1_1_0"}, {"name", "f"}, {"arguments", "{\"a\":1}"}};
  const json call1 = {{"type", "function_call"}, {"call_id", "call_s-1_1_1"}, {"name", "g"}, {"arguments", "{}"}};
  REQUIRE(input_of({{"input", json::array({{{"role", "user"}, {"content", "a"}}, {{"type", "item_reference"}, {"id", "msg_s-1_1"}},
                                           call0, call1, {{"type", "function_call_output"}, {"call_id", "call_s-1_1_0"}, {"output", "1"}}})}},
                   &in)
              .ok());
  REQUIRE(in.messages.size() == 3);  // user, the assistant's text (a reference) with both calls, the output
  REQUIRE(in.calls.size() == 3);
  CHECK(in.calls[0].empty());
  REQUIRE(in.calls[1].size() == 2);
  CHECK(in.calls[1][0].id == "call_s-1_1_0");
  CHECK(in.calls[1][0].name == "f");
  CHECK(in.calls[1][0].arguments == "{\"a\":1}");
  CHECK(in.calls[1][1].name == "g");
  CHECK(in.references[1] == "msg_s-1_1");
  CHECK(in.messages[2].role == "tool");
  // Without a message before them, the calls are an assistant message of their own.
  ResponseInput alone;
  REQUIRE(input_of({{"input", json::array({{{"role", "user"}, {"content", "a"}}, call0})}}, &alone).ok());
  REQUIRE(alone.messages.size() == 2);
  CHECK(alone.messages[1].role == "assistant");
  CHECK(alone.messages[1].content.empty());
  CHECK(alone.calls[1].size() == 1);
  // An item reference to a function call of a towerd response is a call too, named by its item id
  // (the handler reads its name and arguments from the session).
  ResponseInput referenced;
  REQUIRE(input_of({{"input", json::array({{{"role", "user"}, {"content", "a"}}, {{"type", "item_reference"}, {"id", "fc_s-1_1_0"}}})}},
                   &referenced)
              .ok());
  REQUIRE(referenced.messages.size() == 2);
  REQUIRE(referenced.calls[1].size() == 1);
  CHECK(referenced.calls[1][0].id == "fc_s-1_1_0");
  auto ref = parse_call_id("call_s-1f_12_3");
  REQUIRE(ref);
  CHECK(ref->session == "s-1f");
  CHECK(ref->turn == 12);
  for (const char* bad : {"call_3f9a", "call_s_1_", "call_s_x_1", "fc_s_1_0", "call__1_0"}) CHECK_MESSAGE(!parse_call_id(bad), bad);
}

TEST_CASE("input: foreign item references, images and unknown fields are refused by name") {
  struct Case {
    json input;
    std::string param;
    Status::Code code;
  };
  const std::vector<Case> cases = {
      {json::array({{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}}}), "input[0].arguments", Status::Code::kInvalidArgument},
      {json::array({{{"type", "function_call_output"}, {"output", "1"}}}), "input[0].call_id", Status::Code::kInvalidArgument},
      {json::array({{{"type", "function_call_output"}, {"call_id", "c"}, {"output", json::object()}}}), "input[0].output",
       Status::Code::kInvalidArgument},
      {json::array({{{"type", "item_reference"}, {"id", "fc_1"}}}), "input[0].id", Status::Code::kUnimplemented},
      {json::array({{{"type", "item_reference"}, {"id", "rs_s-1_1"}}}), "input[0].id", Status::Code::kUnimplemented},
      {json::array({{{"type", "item_reference"}}}), "input[0].id", Status::Code::kInvalidArgument},
      {json::array({{{"role", "user"}, {"content", json::array({{{"type", "input_image"}, {"image_url", "x"}}})}}}),
       "input[0].content[0].type", Status::Code::kUnimplemented},
      {json::array({{{"role", "user"}, {"content", "a"}, {"audio", "x"}}}), "input[0].audio", Status::Code::kUnimplemented},
      {json::array({{{"role", "tool"}, {"content", "a"}}}), "input[0].role", Status::Code::kUnimplemented},
      {json::array({{{"role", "user"}}}), "input[0].content", Status::Code::kInvalidArgument},
      {json::array({{{"role", "system"}, {"content", "only a system message"}}}), "input", Status::Code::kInvalidArgument},
      {json::array(), "input", Status::Code::kInvalidArgument},
      {json(42), "input", Status::Code::kInvalidArgument},
  };
  for (const Case& c : cases) {
    ResponseInput in;
    const ApiStatus e = input_of({{"input", c.input}}, &in);
    CHECK_MESSAGE(!e.ok(), c.input.dump());
    CHECK_MESSAGE(e.param == c.param, c.input.dump());
    CHECK_MESSAGE(e.status.code() == c.code, c.input.dump());
  }
  ResponseInput in;
  CHECK(input_of(json::object(), &in).param == "input");
  CHECK(input_of({{"input", "x"}, {"instructions", 3}}, &in).param == "instructions");
}

TEST_CASE("the body's fields become the chat path's: max_output_tokens, text.format in key order") {
  ojson chat;
  REQUIRE(chat_of(R"({"model":"m","input":"x","instructions":"i","store":true,"previous_response_id":"resp_s_1","bot":"b",
                      "max_output_tokens":5,"temperature":0.5,"top_p":0.9,"seed":7,"stream":true,
                      "stream_options":{"include_obfuscation":false},"metadata":{"k":"v"},"user":"u",
                      "tools":[],"tool_choice":"auto","parallel_tool_calls":true,"include":[],"reasoning":{"effort":null},
                      "text":{"format":{"type":"json_schema","name":"n","strict":true,
                                        "schema":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}})",
                  &chat)
              .ok());
  CHECK(chat["max_tokens"] == 5);
  CHECK(chat["temperature"] == 0.5);
  CHECK(chat["seed"] == 7);
  CHECK(chat["stream"] == true);
  CHECK(chat["model"] == "m");
  for (const char* own : {"input", "instructions", "store", "previous_response_id", "bot", "max_output_tokens", "text",
                          "stream_options", "include", "reasoning"}) {
    CHECK_MESSAGE(!chat.contains(own), own);
  }
  CHECK(chat["tools"] == ojson::array());
  CHECK(chat["tool_choice"] == "auto");
  const ojson& rf = chat["response_format"];
  CHECK(rf["type"] == "json_schema");
  CHECK(rf["json_schema"]["name"] == "n");
  CHECK(rf["json_schema"]["strict"] == true);
  // The schema's properties in the client's order (what the grammar's output follows).
  CHECK(rf["json_schema"]["schema"]["properties"].dump() == R"({"z":{"type":"string"},"a":{"type":"integer"}})");

  REQUIRE(chat_of(R"({"input":"x","text":{"format":{"type":"json_object"},"verbosity":"medium"}})", &chat).ok());
  CHECK(chat["response_format"] == ojson{{"type", "json_object"}});
  REQUIRE(chat_of(R"({"input":"x","text":{"format":{"type":"text"}}})", &chat).ok());
  CHECK(chat["response_format"] == ojson{{"type", "text"}});
  // Function tools and a named tool_choice in the chat API's shape (the parameters in key order).
  REQUIRE(chat_of(R"({"input":"x","tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object",
                      "properties":{"z":{},"a":{}}},"strict":true}],"tool_choice":{"type":"function","name":"f"},
                      "parallel_tool_calls":false})",
                  &chat)
              .ok());
  CHECK(chat["tools"].dump() ==
        R"([{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"z":{},"a":{}}},"strict":true}}])");
  CHECK(chat["tool_choice"] == ojson{{"type", "function"}, {"function", {{"name", "f"}}}});
  CHECK(chat["parallel_tool_calls"] == false);
}

TEST_CASE("unknown fields and unsupported ones are refused by name, never ignored") {
  struct Case {
    const char* body;
    const char* param;
    const char* code;  // "" = the status code's default
    Status::Code status;
  };
  const Case cases[] = {
      {R"({"input":"x","temprature":1})", "temprature", "unknown_parameter", Status::Code::kInvalidArgument},
      {R"({"input":"x","max_tokens":5})", "max_tokens", "unknown_parameter", Status::Code::kInvalidArgument},
      {R"({"input":"x","messages":[]})", "messages", "unknown_parameter", Status::Code::kInvalidArgument},
      {R"({"input":"x","tools":[{"type":"web_search"}]})", "tools[0].type", "", Status::Code::kUnimplemented},
      {R"({"input":"x","tool_choice":{"type":"file_search"}})", "tool_choice", "", Status::Code::kUnimplemented},
      {R"({"input":"x","reasoning":{"effort":"high"}})", "reasoning", "", Status::Code::kUnimplemented},
      {R"({"input":"x","include":["message.output_text.logprobs"]})", "include", "", Status::Code::kUnimplemented},
      {R"({"input":"x","background":true})", "background", "", Status::Code::kUnimplemented},
      {R"({"input":"x","truncation":"auto"})", "truncation", "", Status::Code::kUnimplemented},
      {R"({"input":"x","conversation":"conv_1"})", "conversation", "", Status::Code::kUnimplemented},
      {R"({"input":"x","top_logprobs":3})", "top_logprobs", "", Status::Code::kUnimplemented},
      {R"({"input":"x","text":{"verbosity":"low"}})", "text.verbosity", "", Status::Code::kUnimplemented},
      {R"({"input":"x","text":{"fmt":{}}})", "text.fmt", "unknown_parameter", Status::Code::kInvalidArgument},
      {R"({"input":"x","text":{"format":{"type":"grammar"}}})", "text.format.type", "", Status::Code::kInvalidArgument},
      {R"({"input":"x","text":{"format":{"type":"json_schema","schema":{},"x":1}}})", "text.format.x", "unknown_parameter",
       Status::Code::kInvalidArgument},
      {R"({"input":"x","stream_options":{"include_obfuscation":true}})", "stream_options", "", Status::Code::kInvalidArgument},
      {R"({"input":"x","stream":true,"stream_options":{"include_usage":true}})", "stream_options.include_usage",
       "unknown_parameter", Status::Code::kInvalidArgument},
  };
  for (const Case& c : cases) {
    ojson chat;
    const ApiStatus e = chat_of(c.body, &chat);
    CHECK_MESSAGE(!e.ok(), c.body);
    CHECK_MESSAGE(e.param == c.param, c.body);
    CHECK_MESSAGE(e.code == c.code, c.body);
    CHECK_MESSAGE(e.status.code() == c.status, c.body);
  }
  // Null means absent, and the neutral values ask for nothing.
  ojson chat;
  CHECK(chat_of(R"({"input":"x","tools":null,"reasoning":null,"include":null,"background":false,"top_logprobs":0,"truncation":null})", &chat).ok());
}

TEST_CASE("the chat path's errors name the Responses field") {
  const ApiStatus e = as_responses_error(invalid_field("max_tokens", "\"max_tokens\" must be a positive integer"));
  CHECK(e.param == "max_output_tokens");
  CHECK(e.status.message() == "\"max_output_tokens\" must be a positive integer");
  CHECK(e.status.code() == Status::Code::kInvalidArgument);
  const ApiStatus s = as_responses_error(invalid_field("response_format.json_schema.schema", "response_format: unsupported keyword 'not'"));
  CHECK(s.param == "text.format.schema");
  CHECK(s.status.message() == "text.format: unsupported keyword 'not'");
  CHECK(as_responses_error(invalid_field("temperature", "t")).param == "temperature");
  // A config key in the message is not a request field.
  const ApiStatus limit = as_responses_error(invalid_field("max_tokens", "\"max_tokens\" of 9 exceeds this server's limit of 8 (limits.max_tokens)"));
  CHECK(limit.status.message() == "\"max_output_tokens\" of 9 exceeds this server's limit of 8 (limits.max_tokens)");
}

TEST_CASE("a streamed response: the typed events in OpenAI's order, numbered, rebuilding the whole response") {
  GenParams params;
  params.stream = true;
  params.sampling.seed = 42;
  const json base = {{"id", "resp_s-1_3"}, {"created_at", 1}, {"model", "m"}, {"previous_response_id", "resp_s-1_2"}};
  ReplyBuilder stream(ReplyApi::Responses, "m", params, 30, base);
  std::string text = stream.start_events();
  for (const char* piece : {"Once", " upon", "", " a time"}) text += stream.add(0, piece, {});
  text += stream.end_events(outcome(FinishReason::Eos, 4, 25));
  const auto events = sse_events(text);
  std::vector<std::string> names;
  for (size_t i = 0; i < events.size(); ++i) {
    names.push_back(events[i].name);
    CHECK(events[i].data["type"] == events[i].name);
    CHECK(events[i].data["sequence_number"] == i);
  }
  const std::vector<std::string> want = {"response.created", "response.in_progress", "response.output_item.added",
                                         "response.content_part.added", "response.output_text.delta",
                                         "response.output_text.delta", "response.output_text.delta",
                                         "response.output_text.done", "response.content_part.done",
                                         "response.output_item.done", "response.completed"};
  CHECK(names == want);
  CHECK(events[0].data["response"]["status"] == "in_progress");
  CHECK(events[0].data["response"]["id"] == "resp_s-1_3");
  CHECK(events[0].data["response"]["output"].empty());
  std::string deltas;
  for (const auto& e : events) {
    if (e.name == "response.output_text.delta") {
      deltas += e.data["delta"].get<std::string>();
      CHECK(e.data["item_id"] == "msg_s-1_3");
    }
  }
  CHECK(deltas == "Once upon a time");
  CHECK(events[7].data["text"] == deltas);
  const json& done = events.back().data["response"];
  CHECK(done["status"] == "completed");
  CHECK(done["previous_response_id"] == "resp_s-1_2");
  CHECK(done["output"][0]["content"][0]["text"] == deltas);
  CHECK(done["output"][0]["status"] == "completed");
  CHECK(done["usage"]["input_tokens"] == 30);
  CHECK(done["usage"]["input_tokens_details"]["cached_tokens"] == 25);
  CHECK(done["usage"]["output_tokens"] == 4);
  CHECK(done["usage"]["total_tokens"] == 34);
  CHECK(done["towers"]["seed"] == 42);
  CHECK(text.find("[DONE]") == std::string::npos);

  // The same generation whole: the response the last event carried.
  params.stream = false;
  ReplyBuilder whole(ReplyApi::Responses, "m", params, 30, base);
  for (const char* piece : {"Once", " upon", "", " a time"}) CHECK(whole.add(0, piece, {}).empty());
  CHECK(whole.text() == deltas);
  json w = whole.whole(outcome(FinishReason::Eos, 4, 25));
  json d = done;
  w.erase("towers"), d.erase("towers");
  CHECK(w == d);
}

TEST_CASE("a response cut by max_output_tokens is incomplete, as OpenAI reports it") {
  GenParams params;
  params.stream = true;
  ReplyBuilder b(ReplyApi::Responses, "m", params, 5, {{"id", "resp_s_1"}});
  std::string text = b.start_events() + b.add(0, "abc", {});
  text += b.end_events(outcome(FinishReason::Length, 3, 0));
  const auto events = sse_events(text);
  CHECK(events.back().name == "response.incomplete");
  const json& r = events.back().data["response"];
  CHECK(r["status"] == "incomplete");
  CHECK(r["incomplete_details"]["reason"] == "max_output_tokens");
  CHECK(r["output"][0]["status"] == "incomplete");
  params.stream = false;
  ReplyBuilder stop(ReplyApi::Responses, "m", params, 5, {{"id", "resp_s_1"}});
  CHECK(stop.whole(outcome(FinishReason::Stop, 1, 0))["incomplete_details"].is_null());
}

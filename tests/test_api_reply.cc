// The OpenAI reply objects with tools (daemon/api_reply.h): streamed tool-call deltas rebuild the
// call the whole reply carries; every FinishReason's OpenAI finish_reason; and a tool conversation's
// tokens (PromptBuilder::conversation) equal the plain chat path's where the two overlap.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "daemon/api_reply.h"
#include "daemon/prompt.h"
#include "engine/constrained/tool_format.h"
#include "model_fixtures.h"

using namespace towers;
using namespace towers::daemon;
using namespace towers::daemon::api;
using json = nlohmann::json;

namespace {

// The JSON objects of an SSE text ("data: {...}\n\n" ...), without "[DONE]".
std::vector<json> sse_objects(const std::string& events) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = events.find("data: ", at)) != std::string::npos) {
    const size_t end = events.find("\n\n", at);
    const std::string data = events.substr(at + 6, end - at - 6);
    if (data != "[DONE]") out.push_back(json::parse(data));
    at = end;
  }
  return out;
}

GenParams tool_params(bool stream) {
  GenParams p;
  p.stream = stream;
  p.tool_format = ToolFormat::Hermes;
  return p;
}

const std::string kReply = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";

GenOutcome finished(FinishReason reason) {
  GenOutcome o;
  o.finish_reason = reason;
  o.tokens = {1, 2, 3};
  return o;
}

}  // namespace

TEST_CASE("streamed tool calls arrive as OpenAI deltas and rebuild the whole reply's call") {
  ReplyBuilder stream(ReplyApi::Chat, "m", tool_params(true), 10, json::object());
  std::string events = stream.start_events();
  for (size_t i = 0; i < kReply.size(); i += 3) events += stream.add(0, std::string_view(kReply).substr(i, 3), {});
  events += stream.end_events(finished(FinishReason::Eos));
  std::string content, name, arguments, id;
  int starts = 0;
  std::string finish;
  for (const json& c : sse_objects(events)) {
    for (const json& ch : c["choices"]) {
      const json& d = ch["delta"];
      if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const json& call : d["tool_calls"]) {
          CHECK(call["index"] == 0);
          if (call.contains("id")) {
            ++starts;
            id = call["id"];
            CHECK(call["type"] == "function");
            name = call["function"]["name"];
            CHECK(call["function"]["arguments"] == "");
          } else {
            CHECK_FALSE(call["function"].contains("name"));
            arguments += call["function"]["arguments"].get<std::string>();
          }
        }
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  CHECK(content == "Let me look.");
  CHECK(starts == 1);
  CHECK(id.rfind("call_", 0) == 0);
  CHECK(name == "get_weather");
  CHECK(json::parse(arguments) == json::parse(R"({"city": "Paris", "days": 3})"));
  CHECK(finish == "tool_calls");

  ReplyBuilder whole(ReplyApi::Chat, "m", tool_params(false), 10, json::object());
  (void)whole.add(0, kReply, {});
  const json r = whole.whole(finished(FinishReason::Eos));
  const json& msg = r["choices"][0]["message"];
  CHECK(r["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(msg["content"] == "Let me look.");
  REQUIRE(msg["tool_calls"].size() == 1);
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
  CHECK(msg["tool_calls"][0]["function"]["arguments"].get<std::string>() == arguments);
}

TEST_CASE("a tool reply cut by max_tokens keeps the call it began, whole as streamed, finish_reason length") {
  const std::string cut = kReply.substr(0, kReply.size() / 2);
  ReplyBuilder whole(ReplyApi::Chat, "m", tool_params(false), 10, json::object());
  (void)whole.add(0, cut, {});
  const json r = whole.whole(finished(FinishReason::Length));
  CHECK(r["choices"][0]["finish_reason"] == "length");
  const json& msg = r["choices"][0]["message"];
  CHECK(msg["content"] == "Let me look.");
  REQUIRE(msg["tool_calls"].size() == 1);
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
  // The same text streamed: the same content, name and (unfinished) arguments.
  ReplyBuilder streamed(ReplyApi::Chat, "m", tool_params(true), 10, json::object());
  std::string events = streamed.start_events() + streamed.add(0, cut, {}) + streamed.end_events(finished(FinishReason::Length));
  std::string content, name, arguments, finish;
  for (size_t at = 0; (at = events.find("data: {", at)) != std::string::npos;) {
    const size_t end = events.find("\n\n", at);
    const json c = json::parse(events.substr(at + 6, end - at - 6));
    at = end;
    for (const json& ch : c["choices"]) {
      const json& d = ch["delta"];
      if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
      for (const json& call : d.value("tool_calls", json::array())) {
        if (call["function"].contains("name")) name += call["function"]["name"].get<std::string>();
        arguments += call["function"].value("arguments", "");
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  CHECK(content == msg["content"]);
  CHECK(name == "get_weather");
  CHECK(arguments == msg["tool_calls"][0]["function"]["arguments"]);
  CHECK(finish == "length");

  // Without tools, the same text is content, and finishes as "stop".
  GenParams plain;
  ReplyBuilder text(ReplyApi::Chat, "m", plain, 10, json::object());
  (void)text.add(0, kReply, {});
  const json t = text.whole(finished(FinishReason::Eos));
  CHECK(t["choices"][0]["finish_reason"] == "stop");
  CHECK(t["choices"][0]["message"]["content"] == kReply);
}

TEST_CASE("every finish reason has one OpenAI finish_reason, and its own name in metrics and timings") {
  std::set<std::string_view> names;
  for (FinishReason r : {FinishReason::Eos, FinishReason::Stop, FinishReason::Length, FinishReason::Context,
                         FinishReason::Grammar, FinishReason::Cancelled, FinishReason::Timeout, FinishReason::Error}) {
    CAPTURE(to_string(r));
    CHECK(names.insert(to_string(r)).second);
    const bool stopped = r == FinishReason::Eos || r == FinishReason::Stop || r == FinishReason::Cancelled;
    CHECK(openai_finish_reason(r) == (stopped ? "stop" : "length"));
    CHECK(openai_finish_reason(r, /*called_tools=*/true) == (stopped ? "tool_calls" : "length"));
  }
  // The whole reply's timings name the internal reason; the client sees OpenAI's.
  GenParams plain;
  ReplyBuilder b(ReplyApi::Completions, "m", plain, 3, json::object());
  const json r = b.whole(finished(FinishReason::Context));
  CHECK(r["towers"]["finish"] == "context");
  CHECK(r["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("a conversation's tokens equal the chat path's: system block, then the turns") {
  auto model = test::synth_tiny("api-reply", "f16");
  for (ChatFamily family : {ChatFamily::ChatML, ChatFamily::Llama3, ChatFamily::Llama2, ChatFamily::Plain}) {
    CAPTURE(chat_family_name(family));
    PromptBuilder prompts(model->tokenizer(), family);
    const std::vector<ChatMessage> turns = {{"user", "Hello there"}, {"assistant", "Hi, how can I help?"}, {"user", "Tell a story"}};
    std::vector<ChatMessage> all = {{"system", "You are kind."}};
    all.insert(all.end(), turns.begin(), turns.end());
    auto conv = prompts.conversation(all);
    REQUIRE(conv.ok());
    const std::string system = "You are kind.";
    auto base = prompts.system_block(&system);
    auto rest = prompts.turns(true, turns);
    REQUIRE(base.ok());
    REQUIRE(rest.ok());
    CHECK(conv.value().base == base.value());
    CHECK(conv.value().rest == rest.value());
    // Without a system message: the template's opening is the base.
    auto bare = prompts.conversation(turns);
    auto bare_base = prompts.system_block(nullptr);
    auto bare_rest = prompts.turns(false, turns);
    REQUIRE(bare.ok());
    CHECK(bare.value().base == bare_base.value());
    CHECK(bare.value().rest == bare_rest.value());
  }
}

TEST_CASE("tool conversations render through the prompt builder in every tool format") {
  auto model = test::synth_tiny("api-reply-tools", "f16");
  const std::vector<ToolDefinition> tools = {{"get_weather", "The weather", R"({"type": "object", "properties": {"city": {"type": "string"}}})"}};
  std::vector<ToolChatMessage> history(3);
  history[0].role = "user";
  history[0].content = "Weather in Paris?";
  history[1].role = "assistant";
  history[1].tool_calls = {{"call_1", "get_weather", R"({"city": "Paris"})"}};
  history[2].role = "tool";
  history[2].content = "sunny";
  history[2].tool_call_id = "call_1";
  for (ChatFamily family : {ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::Llama2}) {
    CAPTURE(chat_family_name(family));
    PromptBuilder prompts(model->tokenizer(), family);
    auto rendered = render_tool_messages(family, history, tools, ToolChoice{}, "You are helpful.");
    REQUIRE(rendered.ok());
    auto conv = prompts.conversation(rendered.value());
    REQUIRE(conv.ok());
    // The tool's name and the result are in the prompt, as plain text of the conversation.
    const std::string text = model->tokenizer().decode(conv.value().base) + model->tokenizer().decode(conv.value().rest);
    CHECK(text.find("get_weather") != std::string::npos);
    CHECK(text.find("sunny") != std::string::npos);
    CHECK_FALSE(conv.value().rest.empty());
  }
}

// Tool calling: prompts rendered as the Qwen2.5 and Llama 3.1 templates write them (expected texts
// written from the templates), the tool-call grammar under each tool_choice, the reply parser (whole
// and streamed byte by byte), and sampling under the grammar on real vocabularies: every completed
// reply parses into calls whose arguments validate against the tool's schema.
#include <random>

#include <nlohmann/json.hpp>

#include "engine/constrained/grammar_matcher.h"
#include "engine/generate/sampler.h"
#include "engine/constrained/tool_format.h"
#include "grammar_fixtures.h"
#include "json_schema_validator.h"
#include "test_support.h"
#include "vocab_fixtures.h"

using namespace towers;
using nlohmann::json;
using Mode = ToolChoice::Mode;

namespace {

const char* const kQwenDefault = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

std::vector<ToolDefinition> weather_tools() {
  return {{"get_weather", "Get the weather",
           R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"}};
}

std::vector<ToolChatMessage> weather_conversation() {
  return {
      {"user", "What's the weather in Paris?", {}, ""},
      {"assistant", "", {{"call_1", "get_weather", R"({"city":"Paris"})"}}, ""},
      {"tool", "{\"temp\": 21}", {}, "call_1"},
  };
}

std::string render(ChatFamily family, const std::vector<ToolChatMessage>& messages,
                   const std::vector<ToolDefinition>& tools, ToolChoice choice, std::string_view default_system,
                   const ChatTemplateTokens& special) {
  auto msgs = render_tool_messages(family, messages, tools, choice, default_system);
  REQUIRE_MESSAGE(msgs.ok(), msgs.error());
  auto text = apply_chat_template(family, *msgs, special, true);
  REQUIRE_MESSAGE(text.ok(), text.error());
  return *text;
}

std::shared_ptr<const Grammar> tool_grammar(ToolFormat f, const std::vector<ToolDefinition>& tools, ToolChoice choice,
                                            int max_calls = 8) {
  auto gbnf = tool_call_gbnf(f, tools, choice, max_calls);
  REQUIRE_MESSAGE(gbnf.ok(), gbnf.error());
  REQUIRE_FALSE(gbnf->empty());
  auto g = Grammar::parse(*gbnf);
  REQUIRE_MESSAGE(g.ok(), g.error() << "\n" << *gbnf);
  return *g;
}

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) { return test::grammar_accepts(g, text); }

}  // namespace

TEST_CASE("Qwen2.5 (ChatML): tools in the system message, calls in <tool_call>, results as <tool_response>") {
  auto conv = weather_conversation();
  conv.push_back({"tool", "{\"temp\": 22}", {}, "call_1"});  // consecutive results share one user turn
  const std::string got = render(ChatFamily::ChatML, conv, weather_tools(), {}, kQwenDefault, {});
  const std::string expect =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
      "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
      "signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
      "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n{\"temp\": 22}\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\n";
  CHECK(got == expect);
  // An assistant message with content and two calls; a given system message replaces the default.
  std::vector<ToolChatMessage> two = {
      {"system", "Be brief.", {}, ""},
      {"user", "Paris and Rome?", {}, ""},
      {"assistant", "Checking.", {{"a", "get_weather", R"({"city": "Paris"})"}, {"b", "get_weather", R"({"city": "Rome"})"}}, ""}};
  const std::string got2 = render(ChatFamily::ChatML, two, weather_tools(), {}, kQwenDefault, {});
  CHECK(got2.rfind("<|im_start|>system\nBe brief.\n\n# Tools", 0) == 0);
  CHECK(got2.find("<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                  "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                  "{\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n") != std::string::npos);
  // tool_choice none: no tools section, the default system message, history still rendered.
  const std::string none = render(ChatFamily::ChatML, weather_conversation(), weather_tools(), {Mode::None, ""},
                                  kQwenDefault, {});
  CHECK(none.rfind(std::string("<|im_start|>system\n") + kQwenDefault + "<|im_end|>\n<|im_start|>user\n", 0) == 0);
  CHECK(none.find("# Tools") == std::string::npos);
  CHECK(none.find("<tool_response>\n{\"temp\": 21}\n</tool_response>") != std::string::npos);
}

TEST_CASE("Llama 3.1: ipython environment, tools in the first user message, JSON calls, ipython results") {
  const ChatTemplateTokens special{"<|begin_of_text|>", "<|end_of_text|>"};
  const std::string got = render(ChatFamily::Llama3, weather_conversation(), weather_tools(), {}, "", special);
  const std::string expect =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
      "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
      "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables."
      "\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        "
      "\"description\": \"Get the weather\",\n        \"parameters\": {\n            \"type\": \"object\",\n"
      "            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n"
      "                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n"
      "        }\n    }\n}\n\nWhat's the weather in Paris?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": "
      "\"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 21}\"<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  CHECK(got == expect);
  auto two = weather_conversation();
  two[1].tool_calls.push_back({"x", "get_weather", "{}"});
  auto r = render_tool_messages(ChatFamily::Llama3, two, weather_tools(), {}, "");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("one tool call per message") != std::string::npos);
  auto no_user = render_tool_messages(ChatFamily::Llama3, {}, weather_tools(), {}, "");
  CHECK_FALSE(no_user.ok());
}

TEST_CASE("generic format for families without one: alternation kept") {
  const ChatTemplateTokens special{"<s>", "</s>"};
  auto conv = weather_conversation();
  conv.push_back({"assistant", "It is 21 degrees.", {}, ""});
  conv.push_back({"user", "Thanks", {}, ""});
  for (ChatFamily f : {ChatFamily::Mistral, ChatFamily::Llama2, ChatFamily::Gemma, ChatFamily::Zephyr, ChatFamily::Plain}) {
    CAPTURE(chat_family_name(f));
    CHECK(tool_format_for(f) == ToolFormat::Hermes);
    const std::string text = render(f, conv, weather_tools(), {}, "", special);
    CHECK(text.find("# Tools") != std::string::npos);
    CHECK(text.find("<tool_response>\n{\"temp\": 21}\n</tool_response>") != std::string::npos);
  }
}

TEST_CASE("a session's tools: the block and its place, the canonical JSON and the results JSON round trip") {
  // The block is the text render_tool_messages puts in the system message (Hermes) or the first user
  // message (Llama 3): a session's tools segment holds it (daemon/catalog.h, "Tools on sessions").
  auto hermes = tools_block(ToolFormat::Hermes, weather_tools());
  REQUIRE(hermes.ok());
  CHECK(hermes->place == ToolsBlock::Place::SystemEnd);
  auto hermes_msgs = render_tool_messages(ChatFamily::ChatML, weather_conversation(), weather_tools(), {}, "Be brief.");
  REQUIRE(hermes_msgs.ok());
  CHECK((*hermes_msgs)[0].content == "Be brief.\n\n" + hermes->text);
  auto llama = tools_block(ToolFormat::Llama3Json, weather_tools());
  REQUIRE(llama.ok());
  CHECK(llama->place == ToolsBlock::Place::FirstUserStart);
  auto llama_msgs = render_tool_messages(ChatFamily::Llama3, weather_conversation(), weather_tools(), {}, "");
  REQUIRE(llama_msgs.ok());
  CHECK((*llama_msgs)[1].content == llama->text + "What's the weather in Paris?");
  CHECK_FALSE(tools_block(ToolFormat::Hermes, std::vector<ToolDefinition>{}).ok());
  CHECK_FALSE(tools_block(ToolFormat::Hermes, std::vector<ToolDefinition>{{"bad name", "", ""}}).ok());

  // The canonical JSON keeps the parameters' key order and reads back to the same definitions, so two
  // requests with the same tools (however spaced) give the same text and the same tools block.
  const std::vector<ToolDefinition> spaced = {{"get_weather", "Get the weather",
                                               R"({ "type":"object",  "properties":{"city":{"type":"string"}}, "required":["city"]})"}};
  const std::string canonical = tools_json(weather_tools());
  CHECK(tools_json(spaced) == canonical);
  CHECK(canonical.find(R"("parameters":{"type":"object","properties")") != std::string::npos);
  auto back = parse_tools_json(canonical);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 1);
  CHECK(tools_json(back.value()) == canonical);
  CHECK(tools_block(ToolFormat::Hermes, back.value())->text == hermes->text);
  CHECK_FALSE(parse_tools_json("{}").ok());
  CHECK_FALSE(parse_tools_json(R"([{"description":"no name"}])").ok());

  const std::vector<ToolChatMessage> results = {{"tool", "18 C", {}, "call_1"}, {"tool", "{\"rain\": false}", {}, "call_2"}};
  auto read = parse_tool_results_json(tool_results_json(results));
  REQUIRE(read.ok());
  REQUIRE(read->size() == 2);
  CHECK((*read)[1].role == "tool");
  CHECK((*read)[1].content == results[1].content);
  CHECK((*read)[1].tool_call_id == "call_2");
  CHECK_FALSE(parse_tool_results_json("[]").ok());
  CHECK_FALSE(parse_tool_results_json("[{\"tool_call_id\": \"c\"}]").ok());
}

TEST_CASE("bad tool input is rejected with a reason") {
  auto bad = [](std::vector<ToolDefinition> tools, std::vector<ToolChatMessage> msgs = {{"user", "hi", {}, ""}}) {
    auto r = render_tool_messages(ChatFamily::ChatML, msgs, tools, {}, "");
    REQUIRE_FALSE(r.ok());
    return r.error();
  };
  CHECK(bad({{"has space", "", ""}}).find("must be 1 to 64") != std::string::npos);
  CHECK(bad({{"f", "", ""}, {"f", "", ""}}).find("defined twice") != std::string::npos);
  CHECK(bad({{"f", "", "{nope"}}).find("not valid JSON") != std::string::npos);
  CHECK(bad({}, {{"robot", "x", {}, ""}}).find("unknown role 'robot'") != std::string::npos);
  CHECK(bad({}, {{"user", "x", {{"i", "f", "{}"}}, ""}}).find("only assistant") != std::string::npos);
  CHECK(bad({}, {{"assistant", "", {{"i", "f", "{oops"}}, ""}}).find("arguments are not valid JSON") != std::string::npos);
  auto g = tool_call_gbnf(ToolFormat::Hermes, weather_tools(), {Mode::Named, "nope"});
  CHECK(g.error().find("'nope', which is not among the tools") != std::string::npos);
  const std::vector<ToolDefinition> unsupported = {{"f", "", R"({"type": "integer", "multipleOf": 2})"}};
  auto s = tool_call_gbnf(ToolFormat::Hermes, unsupported, {});
  CHECK(s.error() == "tool 'f': JSON schema: unsupported keyword 'multipleOf' at #");
  CHECK(tool_call_gbnf(ToolFormat::Hermes, weather_tools(), {Mode::None, ""})->empty());
  CHECK(tool_call_gbnf(ToolFormat::Hermes, std::vector<ToolDefinition>{}, {})->empty());
}

TEST_CASE("tool-call grammar: Hermes under each tool_choice") {
  std::vector<ToolDefinition> tools = weather_tools();
  tools.push_back({"add", "", R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"], "additionalProperties": false})"});
  const std::string paris = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string add = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
  auto required = tool_grammar(ToolFormat::Hermes, tools, {Mode::Required, ""}, 2);
  CHECK(accepts(required, paris));
  CHECK(accepts(required, paris + "\n" + add));
  CHECK_FALSE(accepts(required, paris + "\n" + add + "\n" + add));  // max_calls 2
  // After a call: the end, or one line break and then the end or the next call; whitespace never
  // commits to another call, and after the last call max_calls allows only the end.
  CHECK(accepts(required, paris + "\n"));
  CHECK_FALSE(test::grammar_viable(required, paris + " "));
  CHECK_FALSE(test::grammar_viable(required, paris + "\n\n"));
  CHECK_FALSE(test::grammar_viable(required, paris + "\n" + add + "\n"));
  CHECK_FALSE(accepts(required, paris + "\n<tool_call>"));
  auto parallel = tool_grammar(ToolFormat::Hermes, tools, {Mode::Required, ""});  // the default: 8 calls
  std::string eight = paris;
  for (int i = 1; i < 8; ++i) eight += "\n" + add;
  CHECK(accepts(parallel, eight));
  CHECK_FALSE(test::grammar_viable(parallel, eight + "\n"));
  CHECK_FALSE(accepts(required, "Sure. " + paris));
  CHECK_FALSE(accepts(required, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>"));
  CHECK_FALSE(accepts(required, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
  CHECK_FALSE(accepts(required, ""));
  auto named = tool_grammar(ToolFormat::Hermes, tools, {Mode::Named, "add"});
  CHECK(accepts(named, add));
  CHECK_FALSE(accepts(named, paris));
  CHECK_FALSE(accepts(named, add + "\n" + add));
  auto autom = tool_grammar(ToolFormat::Hermes, tools, {Mode::Auto, ""});
  CHECK(accepts(autom, ""));
  CHECK(accepts(autom, "It is sunny, <tool < tool_call tool_call> <tool_cal"));
  CHECK(accepts(autom, "Let me check.\n" + paris));
  CHECK(accepts(autom, paris + "\n" + add));
  CHECK_FALSE(accepts(autom, "Let me check <tool_call> oops"));  // once the tag is written, a call must follow
  CHECK_FALSE(accepts(autom, paris + " and some text"));
}

TEST_CASE("tool parameters that describe no value are the client's error, not a broken grammar") {
  for (const char* params : {R"({"$ref": "#"})", R"({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})"}) {
    const std::string text = params;
    CAPTURE(text);
    std::vector<ToolDefinition> tools = weather_tools();
    tools.push_back({"loop", "", params});
    for (ToolFormat format : {ToolFormat::Hermes, ToolFormat::Llama3Json}) {
      auto g = tool_call_gbnf(format, tools, {Mode::Required, ""}, 1);
      REQUIRE_FALSE(g.ok());
      CHECK(g.status().is_invalid_argument());
      CHECK(g.error().find("tool 'loop'") != std::string::npos);
    }
  }
}

TEST_CASE("tool-call grammar: Llama 3 JSON under each tool_choice") {
  const std::string call = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  auto required = tool_grammar(ToolFormat::Llama3Json, weather_tools(), {Mode::Required, ""});
  CHECK(accepts(required, call));
  CHECK_FALSE(accepts(required, call + call));  // one call
  CHECK_FALSE(accepts(required, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"));
  auto autom = tool_grammar(ToolFormat::Llama3Json, weather_tools(), {Mode::Auto, ""});
  CHECK(accepts(autom, call));
  CHECK(accepts(autom, "The weather is {probably} fine."));
  CHECK(accepts(autom, ""));
  CHECK_FALSE(accepts(autom, R"({"name": "other"})"));  // starting with "{" means a call
  CHECK_FALSE(accepts(autom, " " + call));               // no leading whitespace to hide a call behind
}

TEST_CASE("reply parser: whole and byte by byte give the same content and calls") {
  struct Reply {
    ToolFormat format;
    std::string text, content;
    std::vector<std::pair<std::string, std::string>> calls;
  };
  const std::vector<Reply> replies = {
      {ToolFormat::Hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa\\\"ris}\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":[1,{\"b\":2}]}}\n</tool_call>",
       "Let me check.", {{"get_weather", R"({"city": "Pa\"ris}"})"}, {"add", R"({"a":[1,{"b":2}]})"}}},
      {ToolFormat::Hermes, "No tools <tool needed> here.\n", "No tools <tool needed> here.\n", {}},
      {ToolFormat::Hermes, "<tool_call>{\"arguments\": 5, \"name\": \"late\"}</tool_call>", "", {{"late", "5"}}},
      {ToolFormat::Llama3Json, R"({"name": "get_weather", "parameters": {"city": "Paris"}})", "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {ToolFormat::Llama3Json, "Just text {with braces}", "Just text {with braces}", {}},
  };
  for (const Reply& r : replies) {
    CAPTURE(r.text);
    auto whole = parse_tool_reply(r.format, r.text);
    REQUIRE_MESSAGE(whole.ok(), whole.error());
    CHECK(whole->content == r.content);
    REQUIRE(whole->tool_calls.size() == r.calls.size());
    for (size_t i = 0; i < r.calls.size(); ++i) {
      CHECK(whole->tool_calls[i].name == r.calls[i].first);
      CHECK(whole->tool_calls[i].arguments == r.calls[i].second);
    }
    // Streamed one byte at a time: the same result, a call's name before its arguments, and no content
    // emitted that later turns out to be part of a call.
    ToolCallParser p(r.format, true);
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls;
    auto take = [&](const std::vector<ToolCallParser::Event>& events) {
      for (const auto& e : events) {
        if (e.kind == ToolCallParser::Event::Kind::Content) {
          CHECK(calls.empty());
          content += e.text;
        } else if (e.kind == ToolCallParser::Event::Kind::CallStart) {
          CHECK(e.index == int(calls.size()));
          calls.push_back({e.text, ""});
        } else {
          REQUIRE(e.index == int(calls.size()) - 1);
          calls.back().second += e.text;
        }
      }
    };
    for (char c : r.text) take(p.feed(std::string_view(&c, 1)));
    auto tail = p.finish();
    REQUIRE(tail.ok());
    take(*tail);
    CHECK(content == r.content);
    CHECK(calls == r.calls);
  }
  // Arguments stream as they are generated: after the first few argument bytes, a piece is out.
  ToolCallParser p(ToolFormat::Hermes, true);
  auto ev = p.feed("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].kind == ToolCallParser::Event::Kind::CallStart);
  CHECK(ev[1].text == "{\"ci");
  // Without tools everything is content.
  auto plain = ToolCallParser(ToolFormat::Hermes, false).feed("<tool_call>{}</tool_call>");
  REQUIRE(plain.size() == 1);
  CHECK(plain[0].text == "<tool_call>{}</tool_call>");
  // A cut-off call is an error at the end.
  ToolCallParser cut(ToolFormat::Hermes, true);
  cut.feed("<tool_call>\n{\"name\": \"x\", \"argu");
  CHECK_FALSE(cut.finish().ok());
  // ... which a whole reply parsed as streamed keeps as the stream gave it: the call begun, its
  // arguments as far as they went.
  const std::string cut_text = "Hm.\n<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": 1";
  CHECK_FALSE(parse_tool_reply(ToolFormat::Hermes, cut_text).ok());
  auto as_streamed = parse_tool_reply(ToolFormat::Hermes, cut_text, /*as_streamed=*/true);
  REQUIRE(as_streamed.ok());
  ToolCallParser streamed(ToolFormat::Hermes, true);
  std::string content, args;
  for (char c : cut_text) {
    for (const auto& e : streamed.feed(std::string_view(&c, 1))) {
      if (e.kind == ToolCallParser::Event::Kind::Content) content += e.text;
      if (e.kind == ToolCallParser::Event::Kind::Arguments) args += e.text;
    }
  }
  CHECK(as_streamed->content == content);
  REQUIRE(as_streamed->tool_calls.size() == 1);
  CHECK(as_streamed->tool_calls[0].name == "x");
  CHECK(as_streamed->tool_calls[0].arguments == args);
  auto trailing = parse_tool_reply(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>\n");
  REQUIRE(trailing.ok());
  CHECK(trailing->tool_calls.size() == 1);
  CHECK_FALSE(parse_tool_reply(ToolFormat::Llama3Json, R"({"name": "x"})").ok());
}

// ------------------------------------------------------------------------------- sampling under masks

namespace {

std::vector<ToolDefinition> sample_tools() {
  return {
      {"get_weather", "", R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                              "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false})"},
      {"add", "", R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                      "required": ["a", "b"], "additionalProperties": false})"},
      {"tag", "", R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                      "maxItems": 2}, "note": {"type": ["string", "null"], "maxLength": 6}}, "required": ["tags"],
                      "additionalProperties": false})"},
  };
}

void sample_calls(const Tokenizer& tok, ToolFormat format, ToolChoice choice, int replies, int max_tokens) {
  const auto tools = sample_tools();
  auto g = tool_grammar(format, tools, choice, 3);
  auto automaton = std::make_shared<GrammarAutomaton>(g, TokenTrie::from_tokenizer(tok));
  int complete = 0;
  for (int seed = 0; seed < replies; ++seed) {
    const test::Sampled s = test::sample_random(tok, automaton, uint64_t(seed), max_tokens);
    if (!s.complete) continue;
    const std::string& text = s.text;
    ++complete;
    CAPTURE(text);
    auto parsed = parse_tool_reply(format, text);
    REQUIRE_MESSAGE(parsed.ok(), parsed.error());
    REQUIRE_FALSE(parsed->tool_calls.empty());
    for (const ToolCall& call : parsed->tool_calls) {
      if (choice.mode == Mode::Named) CHECK(call.name == choice.name);
      auto it = std::find_if(tools.begin(), tools.end(), [&](const ToolDefinition& t) { return t.name == call.name; });
      REQUIRE(it != tools.end());
      const json args = json::parse(call.arguments, nullptr, false);
      REQUIRE_FALSE(args.is_discarded());
      CHECK(test::SchemaValidator(json::parse(it->parameters)).check(args) == "");
    }
  }
  MESSAGE(tool_format_name(format) << ": " << complete << "/" << replies << " sampled replies completed, all valid calls");
  CHECK(complete * 10 >= replies * 9);
}

}  // namespace

TEST_CASE("sampled tool calls on the Llama 3 vocabulary parse and validate") {
  const Tokenizer* tok = test::shared_hf_vocab("tokenizers/llama3.tokenizer.json", "llama-bpe", "test_tool_format");
  if (!tok) return;
  sample_calls(*tok, ToolFormat::Llama3Json, {Mode::Required, ""}, 20, 600);
  sample_calls(*tok, ToolFormat::Llama3Json, {Mode::Named, "tag"}, 10, 600);
}

TEST_CASE("sampled tool calls on the Qwen vocabulary (<tool_call> is one token there) parse and validate") {
  const Tokenizer* tok = test::shared_hf_vocab("tokenizers/qwen3.tokenizer.json", "qwen2", "test_tool_format");
  if (!tok) return;
  CHECK(tok->token_id("<tool_call>") >= 0);
  sample_calls(*tok, ToolFormat::Hermes, {Mode::Required, ""}, 20, 600);
  sample_calls(*tok, ToolFormat::Hermes, {Mode::Named, "add"}, 10, 600);
}

TEST_CASE("sampled tool calls on stories260K's vocabulary parse and validate") {
  const Tokenizer* tok = test::shared_gguf_vocab("models/stories260K.gguf");
  if (!tok) return;
  sample_calls(*tok, ToolFormat::Hermes, {Mode::Required, ""}, 30, 1500);
  sample_calls(*tok, ToolFormat::Llama3Json, {Mode::Required, ""}, 30, 1500);
}

// towerd's prompts (daemon/prompt.h) in the chat families added for the models people bring: a
// conversation's tokens split into the shared system block and the turns as the tower path splits
// them, Qwen3's reasoning dropped from the history, and thinking off as the request's reply opening.
#include <string>
#include <vector>

#include "daemon/prompt.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;

TEST_CASE("new families: conversation() splits where system_block() and turns() do") {
  auto model = test::synth_tiny("prompt-families", "f16");
  const Tokenizer& tok = model->tokenizer();
  for (ChatFamily family : {ChatFamily::Qwen3, ChatFamily::Phi3, ChatFamily::Phi4, ChatFamily::MistralNemo,
                            ChatFamily::MistralV7, ChatFamily::Gemma}) {
    CAPTURE(chat_family_name(family));
    PromptBuilder prompts(tok, family);
    const std::vector<ChatMessage> turns = {{"user", "Hello there"}, {"assistant", "Hi, how can I help?"}, {"user", "Tell a story"}};
    std::vector<ChatMessage> all = {{"system", "You are kind."}};
    all.insert(all.end(), turns.begin(), turns.end());
    auto conv = prompts.conversation(all);
    REQUIRE_MESSAGE(conv.ok(), conv.error());
    const std::string system = "You are kind.";
    auto base = prompts.system_block(&system);
    auto rest = prompts.turns(true, turns);
    REQUIRE_MESSAGE(base.ok(), base.error());
    REQUIRE_MESSAGE(rest.ok(), rest.error());
    CHECK(conv.value().base == base.value());
    CHECK(conv.value().rest == rest.value());
    // Every content is in the prompt once, in order.
    const std::string text = tok.decode(base.value(), true) + tok.decode(rest.value(), true);
    size_t at = 0;
    for (const auto& m : all) {
      const size_t p = text.find(m.content, at);
      CHECK_MESSAGE(p != std::string::npos, m.content << " not in order in: " << text);
      if (p != std::string::npos) at = p + m.content.size();
    }
  }
}

TEST_CASE("Qwen3 prompts: history without reasoning, thinking off opens the reply with an empty block") {
  auto model = test::synth_tiny("prompt-qwen3", "f16");
  const Tokenizer& tok = model->tokenizer();
  PromptBuilder qwen3(tok, ChatFamily::Qwen3);
  const std::vector<ChatMessage> thought = {
      {"user", "What is 2+2?"}, {"assistant", "<think>\nAdd them.\n</think>\n\n4"}, {"user", "And 3+3?"}};
  const std::vector<ChatMessage> plain = {{"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}};
  auto a = qwen3.turns(false, thought);
  auto b = qwen3.turns(false, plain);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a.value() == b.value());  // as the template renders it: the reasoning is not in later prompts
  CHECK(tok.decode(a.value(), true).find("Add them") == std::string::npos);
  CHECK(tok.decode(qwen3.thinking_off(), true) == "<think>\n\n</think>\n\n");
  // ChatML keeps what the assistant wrote, and has no thinking switch.
  PromptBuilder chatml(tok, ChatFamily::ChatML);
  auto c = chatml.turns(false, thought);
  REQUIRE(c.ok());
  CHECK(tok.decode(c.value(), true).find("Add them") != std::string::npos);
  CHECK(chatml.thinking_off().empty());
}

// A session with tools (daemon/catalog.h, "Tools on sessions") is built of pieces: the bot's level
// (left open when the tools close the system block), the tools' segment, then each turn's delta and
// the reply's tokens (as generated). Decoded, they must read as the family's template renders the
// same conversation with the tools (render_tool_messages, the session-less path), but for Llama 3's
// "Environment: ipython" line, which a session's system block (its bot's) does not get: the prompt
// of the first turn, and the turn of tool results after the reply's call.
TEST_CASE("tools on a session: its pieces read as the template renders the conversation") {
  auto model = test::synth_tiny("prompt-session-tools", "f16");
  const Tokenizer& tok = model->tokenizer();
  const ChatTemplateTokens special{tok.bos() >= 0 ? std::string(tok.token_text(tok.bos())) : "",
                                   tok.eos() >= 0 ? std::string(tok.token_text(tok.eos())) : ""};
  const std::vector<ToolDefinition> tools = {
      {"get_weather", "The weather in a city", R"({"type":"object","properties":{"city":{"type":"string"}}})"}};
  const std::vector<ToolChatMessage> conversation = {
      {"system", "You are kind.", {}, ""},
      {"user", "Weather in Paris?", {}, ""},
      {"assistant", "", {{"call_1", "get_weather", R"({"city": "Paris"})"}}, ""},
      {"tool", "18 degrees", {}, "call_1"}};
  const ToolChoice none{ToolChoice::Mode::None, ""};
  for (ChatFamily family : {ChatFamily::ChatML, ChatFamily::Llama3, ChatFamily::Llama2, ChatFamily::Gemma,
                            ChatFamily::Qwen3, ChatFamily::Plain}) {
    CAPTURE(chat_family_name(family));
    PromptBuilder prompts(tok, family);
    const ToolFormat format = tool_format_for(family);
    // The template's renderings: the first turn's prompt, and the whole conversation.
    auto render = [&](size_t n) {
      auto msgs = render_tool_messages(family, std::span(conversation).first(n), tools, {}, "");
      REQUIRE(msgs.ok());
      auto text = apply_chat_template(family, msgs.value(), special, /*add_generation_prompt=*/true);
      REQUIRE(text.ok());
      std::string t = text.value();
      if (format == ToolFormat::Llama3Json) {
        const std::string env = "Environment: ipython\n\n";
        REQUIRE(t.find(env) != std::string::npos);
        t.erase(t.find(env), env.size());
      }
      return t;
    };
    auto decoded = [&](const std::vector<int32_t>& tokens, const std::string& want) {
      std::string got = tok.decode(tokens, true);
      if (!special.bos.empty() && got.starts_with(special.bos) && !want.starts_with(special.bos)) got.erase(0, special.bos.size());
      return got;
    };

    auto block = tools_block(format, tools);
    REQUIRE_MESSAGE(block.ok(), block.error());
    const bool system_end = block.value().place == ToolsBlock::Place::SystemEnd;
    CHECK(system_end == (format == ToolFormat::Hermes));
    auto bot = prompts.level("You are kind.", /*root=*/true, /*closes=*/!system_end);
    auto tools_tokens = prompts.tools_segment(block.value());
    auto turn1 = prompts.last_turn(true, 1, "Weather in Paris?");
    REQUIRE(bot.ok());
    REQUIRE(tools_tokens.ok());
    REQUIRE(turn1.ok());
    std::vector<int32_t> first = bot.value();
    first.insert(first.end(), tools_tokens.value().begin(), tools_tokens.value().end());
    first.insert(first.end(), turn1.value().begin(), turn1.value().end());
    const std::string want_first = render(2);
    CHECK(decoded(first, want_first) == want_first);

    // The turn of tool results: what the whole rendering has after the reply's call.
    auto call = render_tool_messages(family, std::span(conversation).subspan(2, 1), {}, none, "");
    auto results = render_tool_messages(family, std::span(conversation).subspan(3), {}, none, "");
    REQUIRE(call.ok());
    REQUIRE(results.ok());
    auto turn2 = prompts.next_turn(true, 1, results.value());
    REQUIRE_MESSAGE(turn2.ok(), turn2.error());
    const std::string whole = render(4);
    const std::string& reply = call.value()[0].content;
    REQUIRE(whole.find(reply) != std::string::npos);
    const std::string want_results = whole.substr(whole.find(reply) + reply.size());
    CHECK(tok.decode(turn2.value(), true) == want_results);
  }
}

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

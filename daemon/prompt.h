// How chat messages become tokens in towerd, so that shared prefixes are token-for-token identical
// and can be served from segments.
//
// The model's chat template (engine/text/chat_template.h) is rendered once per shape with sentinel strings
// in place of every content, which splits it into template text and content slots. Template text is
// tokenized with special tokens parsed; contents (system text, user and assistant messages) are
// tokenized as plain text (a user typing "<|im_end|>" gets those characters, not the control token).
// Each piece is tokenized on its own and the pieces are concatenated, so the tokens of a prefix never
// depend on what follows it.
//
// Hierarchy: a bot's system prompt is platform text + "\n\n" + community text + "\n\n" + bot text
// (each trimmed). The level segments split that system block as:
//   platform  = template opening (BOS, system header) + platform text
//   community = "\n\n" + community text
//   bot       = "\n\n" + bot text + template text up to the first user message's content
// (a chain of fewer levels works the same way: the deepest level closes the block). A session's
// transcript follows: user content, template text, assistant tokens (exactly as generated), ...
//
// Known limitation: SentencePiece vocabularies with a dummy prefix add "▁" at the start of every
// separately tokenized piece, so a piece boundary costs one extra space token there (BPE vocabularies,
// e.g. Llama 3 and Qwen2, are unaffected).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/constrained/tool_format.h"
#include "engine/text/chat_template.h"
#include "engine/base/status.h"
#include "engine/text/tokenizer.h"

namespace towers::daemon {

class PromptBuilder {
 public:
  PromptBuilder(const Tokenizer& tokenizer, ChatFamily family);
  ChatFamily family() const { return family_; }

  // Tokens of one hierarchy level: root levels open the system block, closing ones (bots) close it.
  Result<std::vector<int32_t>> level(const std::string& text, bool root, bool closes) const;

  // The tokens of a conversation after its system block: turns alternate user, assistant, ..., user
  // (the last one is the message to answer). assistant_tokens[i], when given (non-null), replaces the
  // tokenization of the i-th assistant message (sessions keep what was generated). has_system: whether
  // a system block precedes (a hierarchy or a system message). The caller puts the system block (a
  // hierarchy chain, or system_block()) in front: these tokens never include the template opening.
  Result<std::vector<int32_t>> turns(bool has_system, std::span<const ChatMessage> turns,
                                     std::span<const std::vector<int32_t>* const> assistant_tokens = {}) const;

  // Tokens of the last user turn only (template text after the previous assistant message, the user
  // content, the opening of the reply) for a conversation of n_user turns (n_user >= 1).
  Result<std::vector<int32_t>> last_turn(bool has_system, size_t n_user, const std::string& user) const;
  // The same for one or more messages of any roles the template knows (a tool-result turn: Hermes'
  // user turn of <tool_response> blocks, Llama 3's "ipython" turns; engine/constrained/tool_format.h
  // renders them) after n_before user/assistant turns: the template text after the last assistant
  // message (none when n_before is 0: the system block ends where the first message's content
  // starts, so it must be a user message), each content, the text between, the reply's opening.
  Result<std::vector<int32_t>> next_turn(bool has_system, size_t n_before, std::span<const ChatMessage> messages) const;

  // A session's tool definitions as segments (daemon/catalog.h, "Tools on sessions"), from
  // tools_block(): SystemEnd gives the system block's end, "\n\n" + the tools' text and the template
  // text up to the first user content (under the bot's level opened with closes = false);
  // FirstUserStart the tools' text as the start of the first user content (under the closed bot).
  Result<std::vector<int32_t>> tools_segment(const ToolsBlock& block) const;

  // The system block of a session-less request: template opening + system text + text up to the
  // first user content; without a system message, the template opening alone (maybe empty).
  Result<std::vector<int32_t>> system_block(const std::string* system) const;

  // A whole conversation of any roles the family's template knows (tool calling renders "ipython"
  // turns, tool results inside user turns, ...: engine/constrained/tool_format.h), split where the first message
  // that is not the system message starts: `base` is the template opening and the system block (the
  // part requests with the same tools and system share), `rest` the turns and the reply's opening.
  // Contents are tokenized as plain text, template text with special tokens, as everywhere here.
  struct Conversation {
    std::vector<int32_t> base, rest;
  };
  Result<Conversation> conversation(std::span<const ChatMessage> messages) const;

  std::vector<std::string> stop_strings() const { return chat_stop_strings(family_); }
  std::string trim_content(const std::string& s) const;
  // Tokens a request with thinking off appends to its prompt (chat_thinking_off_suffix: Qwen3's empty
  // reasoning block); empty for families without the switch.
  std::vector<int32_t> thinking_off() const;

 private:
  struct Skeleton {
    std::string before_system, after_system;  // around the system content (after_system runs to u0)
    std::vector<std::string> gaps;             // gaps[i]: template text after content i (u0, a0, u1, ...)
  };
  Result<Skeleton> skeleton(bool has_system, size_t n_user) const;
  std::vector<int32_t> encode_template(const std::string& text, bool first) const;
  std::vector<int32_t> encode_content(const std::string& text) const;
  // A history message's content as the template writes it (chat_rendered_content, e.g. Qwen3 drops an
  // assistant's reasoning), trimmed as trim_content does.
  std::string history_content(const ChatMessage& m) const;

  const Tokenizer& tok_;
  ChatFamily family_;
  ChatTemplateTokens special_;
  std::string nonce_;
};

}  // namespace towers::daemon

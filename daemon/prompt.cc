#include "daemon/prompt.h"

#include <random>

namespace towers::daemon {

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
std::string strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}
void append(std::vector<int32_t>& out, const std::vector<int32_t>& more) { out.insert(out.end(), more.begin(), more.end()); }
}  // namespace

PromptBuilder::PromptBuilder(const Tokenizer& tokenizer, ChatFamily family) : tok_(tokenizer), family_(family) {
  special_.bos = tok_.bos() >= 0 ? std::string(tok_.token_text(tok_.bos())) : "";
  special_.eos = tok_.eos() >= 0 ? std::string(tok_.token_text(tok_.eos())) : "";
  std::random_device rd;
  nonce_ = std::to_string(rd() % 1000000);
}

std::string PromptBuilder::trim_content(const std::string& s) const {
  switch (family_) {
    case ChatFamily::Llama3:
    case ChatFamily::Llama2:
    case ChatFamily::Gemma:
      return strip(s);
    default:
      return s;
  }
}

std::string PromptBuilder::history_content(const ChatMessage& m) const {
  return trim_content(chat_rendered_content(family_, m.role, m.content));
}

std::vector<int32_t> PromptBuilder::thinking_off() const {
  return encode_template(std::string(chat_thinking_off_suffix(family_)), false);
}

Result<PromptBuilder::Skeleton> PromptBuilder::skeleton(bool has_system, size_t n_user) const {
  if (n_user == 0) return Status::InvalidArgument("a conversation needs a user message");
  auto sentinel = [&](char kind, size_t i) { return "TWRSNTL" + nonce_ + kind + std::to_string(i) + "Z"; };
  std::vector<ChatMessage> msgs;
  if (has_system) msgs.push_back({"system", sentinel('S', 0)});
  std::vector<std::string> slots;
  for (size_t i = 0; i < n_user; ++i) {
    msgs.push_back({"user", sentinel('U', i)});
    slots.push_back(msgs.back().content);
    if (i + 1 < n_user) {
      msgs.push_back({"assistant", sentinel('A', i)});
      slots.push_back(msgs.back().content);
    }
  }
  auto text = apply_chat_template(family_, msgs, special_, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  const std::string& r = text.value();
  Skeleton sk;
  size_t at = 0;
  if (has_system) {
    const std::string s = sentinel('S', 0);
    size_t p = r.find(s);
    if (p == std::string::npos) return Status::Error("chat template dropped the system message");
    sk.before_system = r.substr(0, p);
    at = p + s.size();
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    size_t p = r.find(slots[i], at);
    if (p == std::string::npos) return Status::Error("chat template reorders or drops messages");
    std::string gap = r.substr(at, p - at);
    if (i == 0) {
      if (has_system) sk.after_system = gap;
      else sk.before_system = gap;
    } else {
      sk.gaps.push_back(gap);
    }
    at = p + slots[i].size();
  }
  sk.gaps.push_back(r.substr(at));
  return sk;
}

std::vector<int32_t> PromptBuilder::encode_template(const std::string& text, bool first) const {
  const bool bos = first && !chat_template_emits_bos(family_) && tok_.add_bos_default();
  if (text.empty()) return bos && tok_.bos() >= 0 ? std::vector<int32_t>{tok_.bos()} : std::vector<int32_t>{};
  return tok_.encode(text, bos, /*parse_special=*/true);
}

std::vector<int32_t> PromptBuilder::encode_content(const std::string& text) const {
  if (text.empty()) return {};
  return tok_.encode(text, /*add_bos=*/false, /*parse_special=*/false);
}

Result<std::vector<int32_t>> PromptBuilder::level(const std::string& text, bool root, bool closes) const {
  auto sk = skeleton(true, 1);
  if (!sk.ok()) return sk.status();
  std::vector<int32_t> t;
  if (root) append(t, encode_template(sk->before_system, true));
  append(t, encode_content((root ? "" : "\n\n") + strip(text)));
  if (closes) append(t, encode_template(sk->after_system, false));
  if (t.empty()) return Status::InvalidArgument("segment text renders to no tokens");
  return t;
}

Result<std::vector<int32_t>> PromptBuilder::system_block(const std::string* system) const {
  auto sk = skeleton(system != nullptr, 1);
  if (!sk.ok()) return sk.status();
  std::vector<int32_t> t = encode_template(sk->before_system, true);
  if (system) {
    append(t, encode_content(strip(*system)));
    append(t, encode_template(sk->after_system, false));
  }
  return t;
}

Result<std::vector<int32_t>> PromptBuilder::turns(bool has_system, std::span<const ChatMessage> turns,
                                                  std::span<const std::vector<int32_t>* const> assistant_tokens) const {
  if (turns.empty() || turns.size() % 2 == 0) {
    return Status::InvalidArgument("messages must alternate user, assistant, ..., and end with a user message");
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    const char* want = i % 2 == 0 ? "user" : "assistant";
    if (turns[i].role != want) {
      return Status::InvalidArgument("message " + std::to_string(i) + " has role \"" + turns[i].role + "\" where \"" +
                                     want + "\" was expected (after any system message, messages alternate "
                                     "user/assistant and end with user)");
    }
  }
  auto sk = skeleton(has_system, turns.size() / 2 + 1);
  if (!sk.ok()) return sk.status();
  std::vector<int32_t> out;
  for (size_t i = 0; i < turns.size(); ++i) {
    const size_t a = i / 2;
    if (i % 2 == 1 && a < assistant_tokens.size() && assistant_tokens[a]) append(out, *assistant_tokens[a]);
    else append(out, encode_content(history_content(turns[i])));
    append(out, encode_template(sk->gaps[i], false));
  }
  return out;
}

Result<std::vector<int32_t>> PromptBuilder::last_turn(bool has_system, size_t n_user, const std::string& user) const {
  if (n_user == 0) return Status::InvalidArgument("a conversation needs a user message");
  const ChatMessage message{"user", user};
  return next_turn(has_system, n_user - 1, std::span(&message, 1));
}

Result<std::vector<int32_t>> PromptBuilder::next_turn(bool has_system, size_t n_before,
                                                      std::span<const ChatMessage> messages) const {
  if (messages.empty()) return Status::InvalidArgument("a turn needs a message");
  if (n_before == 0 && messages[0].role != "user") {
    return Status::InvalidArgument("the first turn after the system block must start with a user message, not \"" +
                                   messages[0].role + "\"");
  }
  // The conversation rendered with sentinels for contents: what lies between them is template text.
  auto sentinel = [&](char kind, size_t i) { return "TWRSNTL" + nonce_ + kind + std::to_string(i) + "Z"; };
  std::vector<ChatMessage> slotted;
  if (has_system) slotted.push_back({"system", sentinel('S', 0)});
  for (size_t i = 0; i < n_before; ++i) {
    slotted.push_back({"user", sentinel('U', i)});
    slotted.push_back({"assistant", sentinel('A', i)});
  }
  for (size_t i = 0; i < messages.size(); ++i) slotted.push_back({messages[i].role, sentinel('N', i)});
  auto text = apply_chat_template(family_, slotted, special_, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  const std::string& r = text.value();
  size_t at = 0;
  if (n_before > 0) {
    const std::string last = sentinel('A', n_before - 1);
    const size_t p = r.find(last);
    if (p == std::string::npos) return Status::Error("chat template dropped an assistant message");
    at = p + last.size();
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string s = sentinel('N', i);
    const size_t p = r.find(s, at);
    if (p == std::string::npos) return Status::Error("chat template reorders or drops messages");
    if (n_before > 0 || i > 0) append(out, encode_template(r.substr(at, p - at), false));
    append(out, encode_content(history_content(messages[i])));
    at = p + s.size();
  }
  append(out, encode_template(r.substr(at), false));
  return out;
}

Result<std::vector<int32_t>> PromptBuilder::tools_segment(const ToolsBlock& block) const {
  if (block.place == ToolsBlock::Place::FirstUserStart) return encode_content(block.text);
  auto sk = skeleton(true, 1);
  if (!sk.ok()) return sk.status();
  std::vector<int32_t> t = encode_content("\n\n" + block.text);
  append(t, encode_template(sk->after_system, false));
  return t;
}

Result<PromptBuilder::Conversation> PromptBuilder::conversation(std::span<const ChatMessage> messages) const {
  if (messages.empty()) return Status::InvalidArgument("a conversation needs a message");
  auto sentinel = [&](size_t i) { return "TWRSNTL" + nonce_ + "M" + std::to_string(i) + "Z"; };
  std::vector<ChatMessage> slotted;
  for (size_t i = 0; i < messages.size(); ++i) slotted.push_back({messages[i].role, sentinel(i)});
  auto text = apply_chat_template(family_, slotted, special_, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  const std::string& r = text.value();
  Conversation c;
  size_t at = 0;
  // The base: the template opening, the system content and the template text up to the first turn's
  // content (as system_block() gives it).
  const bool system_first = messages[0].role == "system";
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string s = sentinel(i);
    const size_t p = r.find(s, at);
    if (p == std::string::npos) return Status::Error("the chat template reorders or drops messages");
    append(i == 0 || (i == 1 && system_first) ? c.base : c.rest, encode_template(r.substr(at, p - at), at == 0));
    append(i == 0 && system_first ? c.base : c.rest,
           encode_content(i == 0 && system_first ? strip(messages[i].content) : history_content(messages[i])));
    at = p + s.size();
  }
  append(c.rest, encode_template(r.substr(at), false));
  return c;
}

}  // namespace towers::daemon

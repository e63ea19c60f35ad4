#include "engine/text/chat_template.h"

#include <array>
#include <cstdint>

namespace towers {

namespace {

struct FamilyName {
  ChatFamily family;
  std::string_view name;
};

constexpr std::array<FamilyName, 12> kFamilyNames = {{
    {ChatFamily::Llama3, "llama3"},
    {ChatFamily::ChatML, "chatml"},
    {ChatFamily::Qwen3, "qwen3"},
    {ChatFamily::Llama2, "llama2"},
    {ChatFamily::Mistral, "mistral"},
    {ChatFamily::MistralNemo, "mistral-nemo"},
    {ChatFamily::MistralV7, "mistral-v7"},
    {ChatFamily::Zephyr, "zephyr"},
    {ChatFamily::Gemma, "gemma"},
    {ChatFamily::Phi3, "phi3"},
    {ChatFamily::Phi4, "phi4"},
    {ChatFamily::Plain, "plain"},
}};

constexpr std::array<FamilyName, 12> kFamilyAliases = {{
    {ChatFamily::Llama3, "llama-3"},
    {ChatFamily::ChatML, "qwen"},
    {ChatFamily::ChatML, "qwen2"},
    {ChatFamily::Llama2, "llama-2"},
    {ChatFamily::Gemma, "gemma2"},
    {ChatFamily::Gemma, "gemma-2"},
    {ChatFamily::Gemma, "gemma3"},
    {ChatFamily::Gemma, "gemma-3"},
    {ChatFamily::MistralNemo, "mistral-v3-tekken"},
    {ChatFamily::MistralV7, "mistral-v7-tekken"},
    {ChatFamily::Phi3, "phi-3"},
    {ChatFamily::Phi4, "phi-4"},
}};

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Python's str.isspace() code points.
bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Decodes one UTF-8 code point at s[i]; returns its length, 0 when malformed.
size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  size_t len;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  return len;
}

// Python's str.strip() (Jinja's `trim` filter) on UTF-8 text; malformed bytes count as non-space.
std::string py_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    uint32_t cp;
    const size_t n = decode_utf8(s, begin, cp);
    if (n == 0 || !is_py_space(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    uint32_t cp;
    const size_t n = decode_utf8(s, start, cp);
    if (n != end - start || !is_py_space(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

Status check_known_roles(ChatFamily family, std::span<const ChatMessage> messages) {
  const bool ipython = family == ChatFamily::Llama3;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && !(ipython && r == "ipython")) {
      return Status::InvalidArgument("chat message " + std::to_string(i) + " has unknown role '" + r +
                                     "' (known roles: system, user, assistant" + (ipython ? ", ipython)" : ")"));
    }
  }
  return Status::Ok();
}

// An optional leading system message, then user, assistant, user, ... (as the Llama-2, Mistral,
// Mistral-Nemo, Mistral v7 and Gemma templates demand).
Status check_alternating(ChatFamily family, std::span<const ChatMessage> messages) {
  const size_t start = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  const std::string prefix = "the " + std::string(chat_family_name(family)) + " chat format";
  for (size_t i = start; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r == "system") {
      return Status::InvalidArgument(prefix + " accepts a system message only as the first message (message " +
                                     std::to_string(i) + " is a system message)");
    }
    const char* expected = (i - start) % 2 == 0 ? "user" : "assistant";
    if (r != expected) {
      return Status::InvalidArgument(prefix + " needs roles alternating user/assistant/user/... after the optional "
                                     "system message: message " + std::to_string(i) + " is '" + r + "', expected '" +
                                     expected + "'");
    }
  }
  return Status::Ok();
}

// The system message's content if messages[0] is one.
const std::string* leading_system(std::span<const ChatMessage> messages) {
  return !messages.empty() && messages[0].role == "system" ? &messages[0].content : nullptr;
}

std::string render_llama3(std::span<const ChatMessage> messages, const ChatTemplateTokens& t, bool gen) {
  std::string out = messages.empty() ? "" : t.bos;  // the template puts BOS before the first message
  for (const auto& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + py_strip(m.content) + "<|eot_id|>";
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_chatml(std::span<const ChatMessage> messages, bool gen) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return std::string(s);
}

std::string strip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return std::string(s);
}

// Qwen3's template: assistant turns before the last user message lose their reasoning; one after it
// keeps it in a <think> block (the last message, or one with reasoning).
std::string render_qwen3(std::span<const ChatMessage> messages, bool gen, const ChatOptions& options) {
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user") {
      last_query = i;
      break;
    }
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (m.role != "assistant") {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      continue;
    }
    const std::string_view c = m.content;
    const size_t close = c.rfind(kThinkClose);
    const std::string content = chat_rendered_content(ChatFamily::Qwen3, m.role, c);
    std::string reasoning;
    if (close != std::string_view::npos) {
      std::string_view before = c.substr(0, c.find(kThinkClose));  // split('</think>')[0]
      while (!before.empty() && before.back() == '\n') before.remove_suffix(1);
      const size_t open = before.rfind(kThinkOpen);
      reasoning = lstrip_newlines(open == std::string_view::npos ? before : before.substr(open + kThinkOpen.size()));
    }
    const bool after_query = i > last_query;
    if (after_query && (i + 1 == messages.size() || !reasoning.empty())) {
      out += "<|im_start|>assistant\n<think>\n" + strip_newlines(reasoning) + "\n</think>\n\n" +
             lstrip_newlines(content);
    } else {
      out += "<|im_start|>assistant\n" + content;
    }
    out += "<|im_end|>\n";
  }
  if (gen) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) out += chat_thinking_off_suffix(ChatFamily::Qwen3);
  }
  return out;
}

std::string render_phi3(std::span<const ChatMessage> messages, const ChatTemplateTokens& t, bool gen) {
  std::string out;
  for (const auto& m : messages) {
    if (m.role == "system" && m.content.empty()) continue;
    out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  }
  out += gen ? "<|assistant|>\n" : t.eos;
  return out;
}

std::string render_phi4(std::span<const ChatMessage> messages, bool gen) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "<|im_sep|>" + m.content + "<|im_end|>";
  if (gen) out += "<|im_start|>assistant<|im_sep|>";
  return out;
}

std::string render_mistral_v7(std::span<const ChatMessage> messages, const ChatTemplateTokens& t) {
  std::string out = t.bos;
  for (const auto& m : messages) {
    if (m.role == "system") out += "[SYSTEM_PROMPT]" + m.content + "[/SYSTEM_PROMPT]";
    else if (m.role == "user") out += "[INST]" + m.content + "[/INST]";
    else out += m.content + t.eos;
  }
  return out;
}

std::string render_llama2(std::span<const ChatMessage> messages, const ChatTemplateTokens& t) {
  const std::string* sys = leading_system(messages);
  const auto loop = messages.subspan(sys ? 1 : 0);
  std::string out;
  for (size_t j = 0; j < loop.size(); ++j) {
    const auto& m = loop[j];
    const std::string content =
        j == 0 && sys ? "<<SYS>>\n" + *sys + "\n<</SYS>>\n\n" + m.content : m.content;
    if (m.role == "user") {
      out += t.bos + "[INST] " + py_strip(content) + " [/INST]";
    } else {
      out += " " + py_strip(content) + " " + t.eos;
    }
  }
  return out;
}

// Mistral's [INST] formats: v1 " [INST] " + user + " [/INST]" and " " + assistant + eos; v3-tekken
// (Nemo) the same without the spaces. The system text goes in front of the first user content.
std::string render_mistral(std::span<const ChatMessage> messages, const ChatTemplateTokens& t, bool tekken) {
  const std::string open = tekken ? "[INST]" : " [INST] ", close = tekken ? "[/INST]" : " [/INST]";
  const std::string before_reply = tekken ? "" : " ";
  const std::string* sys = leading_system(messages);
  const auto loop = messages.subspan(sys ? 1 : 0);
  std::string out = t.bos;
  for (size_t j = 0; j < loop.size(); ++j) {
    const auto& m = loop[j];
    if (m.role == "user") {
      out += open + (j == 0 && sys ? *sys + "\n\n" : std::string()) + m.content + close;
    } else {
      out += before_reply + m.content + t.eos;
    }
  }
  return out;
}

std::string render_zephyr(std::span<const ChatMessage> messages, const ChatTemplateTokens& t, bool gen) {
  std::string out;
  for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + t.eos + "\n";
  if (gen && !messages.empty()) out += "<|assistant|>\n";
  return out;
}

std::string render_gemma(std::span<const ChatMessage> messages, const ChatTemplateTokens& t, bool gen) {
  const std::string* sys = leading_system(messages);
  const auto loop = messages.subspan(sys ? 1 : 0);
  std::string out = t.bos;
  for (size_t j = 0; j < loop.size(); ++j) {
    const auto& m = loop[j];
    out += "<start_of_turn>";
    out += m.role == "assistant" ? "model" : m.role;
    out += "\n";
    if (j == 0 && sys) out += *sys + "\n\n";
    out += py_strip(m.content) + "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

std::string render_plain(std::span<const ChatMessage> messages, bool gen) {
  std::string out;
  for (const auto& m : messages) {
    const char* label = m.role == "system" ? "System: " : m.role == "user" ? "User: " : "Assistant: ";
    out += label + m.content + "\n";
  }
  if (gen) out += "Assistant:";
  return out;
}

}  // namespace

std::string_view chat_family_name(ChatFamily family) {
  for (const auto& f : kFamilyNames) {
    if (f.family == family) return f.name;
  }
  return "unknown";
}

std::string chat_family_names() {
  std::string out;
  for (const auto& f : kFamilyNames) {
    if (!out.empty()) out += ", ";
    out += f.name;
  }
  return out;
}

Result<ChatFamily> chat_family_from_name(std::string_view name) {
  const std::string n = lower_ascii(name);
  for (const auto& f : kFamilyNames) {
    if (f.name == n) return f.family;
  }
  for (const auto& f : kFamilyAliases) {
    if (f.name == n) return f.family;
  }
  return Status::Error("unknown chat template '" + std::string(name) + "' (known: " + chat_family_names() + ")");
}

Result<ChatFamily> chat_family_for(std::string_view jinja_template, std::string_view configured) {
  if (configured.empty()) return detect_chat_family(jinja_template);
  return chat_family_from_name(configured);
}

ChatFamily detect_chat_family(std::string_view t) {
  if (contains(t, "<|start_header_id|>")) return ChatFamily::Llama3;
  if (contains(t, "<|im_start|>")) {
    if (contains(t, "<|im_sep|>")) return ChatFamily::Phi4;
    return contains(t, "enable_thinking") ? ChatFamily::Qwen3 : ChatFamily::ChatML;
  }
  if (contains(t, "<start_of_turn>")) return ChatFamily::Gemma;
  if (contains(t, "[INST]")) {
    if (contains(t, "[SYSTEM_PROMPT]")) return ChatFamily::MistralV7;
    if (contains(t, "<<SYS>>")) return ChatFamily::Llama2;
    return contains(t, "\"[INST]\"") ? ChatFamily::MistralNemo : ChatFamily::Mistral;
  }
  if (contains(t, "<|assistant|>") && contains(t, "<|end|>")) return ChatFamily::Phi3;
  if (contains(t, "<|user|>") && (contains(t, "</s>") || contains(t, "eos_token")) && !contains(t, "<|end|>")) {
    return ChatFamily::Zephyr;
  }
  return ChatFamily::Plain;
}

std::string chat_template_default_system(std::string_view t) {
  static constexpr std::string_view kOpen = "<|im_start|>system";
  static constexpr std::string_view kClose = "<|im_end|>";
  for (size_t at = t.find(kOpen); at != std::string_view::npos; at = t.find(kOpen, at + 1)) {
    // Only inside a Jinja string literal: '<|im_start|>system\n...<|im_end|>' (or with "...").
    if (at == 0 || (t[at - 1] != '\'' && t[at - 1] != '"')) continue;
    const char quote = t[at - 1];
    size_t i = at + kOpen.size();
    if (t.substr(i, 2) == "\\n") i += 2;
    else if (t.substr(i, 1) == "\n") i += 1;
    else continue;
    std::string text;
    bool ok = false;
    while (i < t.size()) {
      if (t.substr(i, kClose.size()) == kClose) {
        ok = true;
        break;
      }
      const char c = t[i];
      if (c == quote) break;  // the literal ends before <|im_end|>: content comes from a variable
      if (c == '\\' && i + 1 < t.size()) {
        const char e = t[i + 1];
        text += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        i += 2;
        continue;
      }
      text += c;
      ++i;
    }
    if (ok && !text.empty()) return text;
  }
  return "";
}

std::string chat_rendered_content(ChatFamily family, std::string_view role, std::string_view content) {
  switch (family) {
    case ChatFamily::Llama3:
    case ChatFamily::Llama2:
    case ChatFamily::Gemma:
      return py_strip(content);
    case ChatFamily::Qwen3:
      if (role == "assistant") {
        const size_t close = content.rfind(kThinkClose);
        if (close != std::string_view::npos) return lstrip_newlines(content.substr(close + kThinkClose.size()));
      }
      return std::string(content);
    default:
      return std::string(content);
  }
}

std::string_view chat_thinking_off_suffix(ChatFamily family) {
  return family == ChatFamily::Qwen3 ? "<think>\n\n</think>\n\n" : "";
}

Result<std::string> apply_chat_template(ChatFamily family, std::span<const ChatMessage> messages,
                                        const ChatTemplateTokens& tokens, bool add_generation_prompt,
                                        const ChatOptions& options) {
  if (Status s = check_known_roles(family, messages); !s.ok()) return s;
  switch (family) {
    case ChatFamily::Llama2:
    case ChatFamily::Mistral:
    case ChatFamily::MistralNemo:
    case ChatFamily::MistralV7:
    case ChatFamily::Gemma:
      if (Status s = check_alternating(family, messages); !s.ok()) return s;
      break;
    default:
      break;
  }
  switch (family) {
    case ChatFamily::Llama3: return render_llama3(messages, tokens, add_generation_prompt);
    case ChatFamily::ChatML: return render_chatml(messages, add_generation_prompt);
    case ChatFamily::Qwen3: return render_qwen3(messages, add_generation_prompt, options);
    case ChatFamily::MistralNemo: return render_mistral(messages, tokens, /*tekken=*/true);
    case ChatFamily::MistralV7: return render_mistral_v7(messages, tokens);
    case ChatFamily::Phi3: return render_phi3(messages, tokens, add_generation_prompt);
    case ChatFamily::Phi4: return render_phi4(messages, add_generation_prompt);
    case ChatFamily::Llama2: return render_llama2(messages, tokens);
    case ChatFamily::Mistral: return render_mistral(messages, tokens, /*tekken=*/false);
    case ChatFamily::Zephyr: return render_zephyr(messages, tokens, add_generation_prompt);
    case ChatFamily::Gemma: return render_gemma(messages, tokens, add_generation_prompt);
    case ChatFamily::Plain: return render_plain(messages, add_generation_prompt);
  }
  return Status::Error("unknown chat family " + std::to_string(static_cast<int>(family)));
}

bool chat_template_emits_bos(ChatFamily family) {
  switch (family) {
    case ChatFamily::Llama3:
    case ChatFamily::Llama2:
    case ChatFamily::Mistral:
    case ChatFamily::MistralNemo:
    case ChatFamily::MistralV7:
    case ChatFamily::Gemma:
      return true;
    default:
      return false;
  }
}

std::vector<std::string> chat_stop_strings(ChatFamily family) {
  switch (family) {
    case ChatFamily::Llama3: return {"<|eot_id|>"};
    case ChatFamily::ChatML:
    case ChatFamily::Qwen3:
    case ChatFamily::Phi4: return {"<|im_end|>"};
    case ChatFamily::Phi3: return {"<|end|>"};
    case ChatFamily::Llama2:
    case ChatFamily::Mistral:
    case ChatFamily::MistralNemo:
    case ChatFamily::MistralV7:
    case ChatFamily::Zephyr: return {"</s>"};
    case ChatFamily::Gemma: return {"<end_of_turn>"};
    case ChatFamily::Plain: return {"\nUser:", "\nSystem:"};
  }
  return {};
}

}  // namespace towers

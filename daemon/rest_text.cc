#include "daemon/rest_text.h"

namespace towers::daemon {

std::vector<record::RestMessage> locate_messages(std::string_view text, const std::vector<ChatMessage>& messages) {
  std::vector<record::RestMessage> out;
  out.reserve(messages.size());
  size_t cursor = 0;
  for (const ChatMessage& m : messages) {
    record::RestMessage r;
    r.role = m.role;
    const size_t at = m.content.empty() ? cursor : text.find(m.content, cursor);
    if (at == std::string_view::npos) {
      r.in_transcript = false;
      r.content = m.content;
    } else {
      r.offset = at, r.length = m.content.size();
      cursor = at + m.content.size();
    }
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<ChatMessage>> messages_at(std::string_view text, const std::vector<record::RestMessage>& where) {
  std::vector<ChatMessage> out;
  out.reserve(where.size());
  for (const record::RestMessage& r : where) {
    if (!r.in_transcript) {
      out.push_back({r.role, r.content});
      continue;
    }
    if (r.offset > text.size() || r.length > text.size() - r.offset) {
      return Status::Corruption("a message at [" + std::to_string(r.offset) + ", +" + std::to_string(r.length) +
                                ") is outside its transcript's " + std::to_string(text.size()) + " bytes of text");
    }
    out.push_back({r.role, std::string(text.substr(r.offset, r.length))});
  }
  return out;
}

}  // namespace towers::daemon

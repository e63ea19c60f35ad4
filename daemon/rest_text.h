// Where a session's messages sit in its detokenized transcript. A session at rest keeps, for each
// message, two numbers instead of its text (daemon/records.h, session_rest): the transcript holds
// every message as the template rendered it, so the text comes back from the tokens the coded
// records give back. A message whose text is not found verbatim (a tokenizer that does not give its
// input back, a reply trimmed differently) keeps its text: never a guess.
#pragma once
#include <string_view>
#include <vector>

#include "daemon/records.h"
#include "engine/base/status.h"
#include "engine/text/chat_template.h"

namespace towers::daemon {

// Each message's place in `text` (searched in order, each after the one before), or its content.
std::vector<record::RestMessage> locate_messages(std::string_view text, const std::vector<ChatMessage>& messages);
// The messages back; Corruption when a place is outside `text`.
Result<std::vector<ChatMessage>> messages_at(std::string_view text, const std::vector<record::RestMessage>& where);

}  // namespace towers::daemon

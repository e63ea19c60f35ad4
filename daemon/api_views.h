// The API's JSON form of the catalog's views (GET /v1/segments/{name}, /v1/sessions/{id}, lists),
// shared by the daemon and towerctl's offline verbs so both print the same fields.
#pragma once
#include <nlohmann/json.hpp>

#include "daemon/catalog.h"

namespace towers::daemon {

nlohmann::json segment_json(const SegmentView& s);
nlohmann::json session_json(const SessionView& s);
// A session's kept messages as the chat API writes them: a turn of tool results is one "tool" message
// per result, and with tools (format set) an assistant's calls are "tool_calls", their ids the ones the
// results answered with (call_<i>_<k> while unanswered).
nlohmann::json transcript_json(const std::vector<ChatMessage>& messages, std::optional<ToolFormat> format);
// {"object":"list","data":[...]}
nlohmann::json segments_json(const std::vector<SegmentView>& list);
nlohmann::json sessions_json(const std::vector<SessionView>& list);

}  // namespace towers::daemon

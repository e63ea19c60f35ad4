#include "daemon/api_views.h"

namespace towers::daemon {

using json = nlohmann::json;

json segment_json(const SegmentView& s) {
  json j = {{"name", s.name}, {"level", to_string(s.level)}, {"parent", s.parent}, {"text", s.text},
            {"tokens", s.tokens}, {"updated", s.updated}, {"at_rest", s.coded_bytes ? "cold" : "hot"},
            {"coded_bytes", s.coded_bytes}, {"children", s.children}, {"sessions", s.sessions}};
  if (const auto& p = s.pool) {
    j["pool"] = {{"id", p->id}, {"depth", p->depth}, {"format", simd::kv_quant_name(p->format)},
                 {"kv_bytes", p->kv_bytes}, {"tier", std::string(to_string(p->tier))},
                 {"pinned", p->pinned}, {"hits", p->hits}, {"refcount", p->refcount},
                 {"modular", p->approximate()}};
    if (p->modular && s.exact_progress) j["pool"]["exact_progress"] = *s.exact_progress;
  } else {
    j["pool"] = nullptr;
  }
  return j;
}

namespace {

// A session's tools (tools_json) as a request sends them: [{"type": "function", "function": {...}}].
json tools_openai_json(const std::string& tools) {
  json out = json::array();
  const json defs = json::parse(tools, nullptr, /*allow_exceptions=*/false);
  if (!defs.is_array()) return out;
  for (const auto& f : defs) out.push_back({{"type", "function"}, {"function", f}});
  return out;
}

}  // namespace

json transcript_json(const std::vector<ChatMessage>& messages, std::optional<ToolFormat> format) {
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      auto results = parse_tool_results_json(m.content);
      if (results.ok()) {
        for (const auto& r : results.value()) out.push_back({{"role", "tool"}, {"tool_call_id", r.tool_call_id}, {"content", r.content}});
        continue;
      }
    }
    json msg = {{"role", m.role}, {"content", m.content}};
    auto parsed = format && m.role == "assistant" ? parse_tool_reply(*format, m.content, /*as_streamed=*/true)
                                                  : Result<ParsedReply>(ParsedReply{});
    if (parsed.ok() && !parsed.value().tool_calls.empty()) {
      std::vector<ToolChatMessage> answers;
      if (i + 1 < messages.size() && messages[i + 1].role == "tool") {
        if (auto r = parse_tool_results_json(messages[i + 1].content); r.ok()) answers = std::move(r.value());
      }
      json calls = json::array();
      const auto& tc = parsed.value().tool_calls;
      for (size_t k = 0; k < tc.size(); ++k) {
        const std::string id = k < answers.size() && !answers[k].tool_call_id.empty() ? answers[k].tool_call_id
                                                                                       : "call_" + std::to_string(i) + "_" + std::to_string(k);
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", tc[k].name}, {"arguments", tc[k].arguments}}}});
      }
      msg["content"] = parsed.value().content.empty() ? json(nullptr) : json(parsed.value().content);
      msg["tool_calls"] = std::move(calls);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

json session_json(const SessionView& s) {
  json j = {{"id", s.id}, {"bot", s.bot}, {"created", s.created}, {"updated", s.updated},
            {"messages", s.messages}, {"transcript_tokens", s.transcript_tokens}, {"busy", s.busy},
            {"warm", s.warm}, {"at_rest", s.at_rest}};
  if (!s.tools.empty()) j["tools"] = tools_openai_json(s.tools);
  if (s.transcript) j["transcript"] = transcript_json(*s.transcript, s.tool_format);
  return j;
}

namespace {
template <class View, class ToJson>
json list_json(const std::vector<View>& list, ToJson to_json) {
  json data = json::array();
  for (const auto& v : list) data.push_back(to_json(v));
  return {{"object", "list"}, {"data", data}};
}
}  // namespace

json segments_json(const std::vector<SegmentView>& list) { return list_json(list, segment_json); }
json sessions_json(const std::vector<SessionView>& list) { return list_json(list, session_json); }

}  // namespace towers::daemon

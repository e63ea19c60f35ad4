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

json session_json(const SessionView& s) {
  json j = {{"id", s.id}, {"bot", s.bot}, {"created", s.created}, {"updated", s.updated},
            {"messages", s.messages}, {"transcript_tokens", s.transcript_tokens}, {"busy", s.busy},
            {"warm", s.warm}};
  if (s.transcript) {
    json msgs = json::array();
    for (const auto& m : *s.transcript) msgs.push_back({{"role", m.role}, {"content", m.content}});
    j["transcript"] = msgs;
  }
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

#include "daemon/records.h"

#include <nlohmann/json.hpp>

#include "daemon/base64.h"

namespace towers::daemon {

using json = nlohmann::json;

const char* record_type_name(RecordType t) {
  switch (t) {
    case RecordType::Header: return "header";
    case RecordType::SegmentPut: return "segment_put";
    case RecordType::SegmentDelete: return "segment_delete";
    case RecordType::SessionCreate: return "session_create";
    case RecordType::SessionTurn: return "session_turn";
    case RecordType::SessionDelete: return "session_delete";
    case RecordType::SessionSnapshot: return "session_snapshot";
    case RecordType::SegmentTier: return "segment_tier";
    case RecordType::SessionRest: return "session_rest";
  }
  return "?";
}

RecordType type_of(const Record& r) { return static_cast<RecordType>(r.index() + 1); }

namespace {

json messages_json(const std::vector<ChatMessage>& messages) {
  json out = json::array();
  for (const auto& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

json to_json(const record::Header& r) { return {{"model", r.model}, {"fingerprint", r.fingerprint}}; }
json to_json(const record::SegmentPut& r) {
  json j = {{"name", r.name}, {"level", to_string(r.level)}, {"parent", r.parent}, {"text", r.text}, {"updated", r.updated}};
  if (r.segment) j["segment"] = r.segment;
  return j;
}
json to_json(const record::SegmentDelete& r) { return {{"name", r.name}}; }
json to_json(const record::SegmentTier& r) {
  json j = {{"name", r.name}, {"at", r.at}};
  if (!r.coded.empty()) j["coded"] = base64_encode(r.coded);
  return j;
}
json to_json(const record::SessionCreate& r) { return {{"id", r.id}, {"bot", r.bot}, {"created", r.created}}; }
json to_json(const record::SessionTurn& r) {
  json j = {{"id", r.id}, {"user", r.user}, {"assistant", r.assistant}, {"delta", r.delta},
            {"generated", r.generated}, {"seals", r.seals}, {"at", r.at}};
  if (r.n) j["n"] = r.n;
  if (r.dropped) j["dropped"] = r.dropped, j["dropped_tokens"] = r.dropped_tokens;
  if (!r.segments.empty()) j["segments"] = r.segments;
  if (!r.role.empty()) j["role"] = r.role;
  if (!r.tools.empty()) j["tools"] = r.tools;
  return j;
}
json to_json(const record::SessionDelete& r) { return {{"id", r.id}}; }
json to_json(const record::SessionSnapshot& r) {
  json j = {{"id", r.id}, {"bot", r.bot}, {"created", r.created}, {"updated", r.updated},
            {"messages", messages_json(r.messages)}, {"transcript", r.transcript}, {"seals", r.seals}};
  if (!r.segments.empty()) j["segments"] = r.segments;
  if (r.turns) j["turns"] = r.turns;
  if (!r.turn_ends.empty()) j["turn_ends"] = r.turn_ends;
  if (!r.tools.empty()) j["tools"] = r.tools;
  return j;
}

json to_json(const record::SessionRest& r) {
  json messages = json::array();
  for (const auto& m : r.messages) {
    if (m.in_transcript) messages.push_back({{"role", m.role}, {"at", {m.offset, m.length}}});
    else messages.push_back({{"role", m.role}, {"content", m.content}});
  }
  json j = {{"id", r.id},           {"bot", r.bot},   {"created", r.created}, {"updated", r.updated},
            {"turns", r.turns},     {"turn_ends", r.turn_ends}, {"seals", r.seals}, {"segments", r.segments},
            {"tail", r.tail},       {"messages", std::move(messages)}};
  if (!r.tools.empty()) j["tools"] = r.tools;
  return j;
}

// Reads the fields of one record's JSON object; the first problem is kept and names its field.
class Reader {
 public:
  Reader(const json& j, RecordType type) : j_(j), type_(type) {}

  std::string str(const char* key, bool required = true) {
    const json* v = field(key, required);
    if (!v) return {};
    if (!v->is_string()) return bad(key, "is not a string"), std::string();
    return v->get<std::string>();
  }
  template <class Int>
  Int integer(const char* key, bool required = true) {
    const json* v = field(key, required);
    if (!v) return 0;
    if (!v->is_number_integer() || (std::is_unsigned_v<Int> && !v->is_number_unsigned())) {
      return bad(key, "is not an integer in range"), Int{0};
    }
    return v->get<Int>();
  }
  template <class Int>
  std::vector<Int> integers(const char* key, bool required = true) {
    std::vector<Int> out;
    const json* v = field(key, required);
    if (!v) return out;
    if (!v->is_array()) return bad(key, "is not an array"), out;
    for (const auto& e : *v) {
      if (!e.is_number_integer() || (std::is_unsigned_v<Int> && !e.is_number_unsigned())) {
        return bad(key, "holds a value that is not an integer in range"), std::vector<Int>();
      }
      out.push_back(e.get<Int>());
    }
    return out;
  }
  Level level(const char* key) {
    const std::string s = str(key);
    auto l = parse_level(s);
    if (!l && problem_.empty()) bad(key, "is not platform, community or bot");
    return l.value_or(Level::Bot);
  }
  std::vector<uint8_t> base64(const char* key) {
    const std::string s = str(key, false);
    if (s.empty()) return {};
    auto bytes = base64_decode(s);
    if (!bytes) return bad(key, "is not base64"), std::vector<uint8_t>();
    return std::move(*bytes);
  }
  std::vector<ChatMessage> messages(const char* key) {
    std::vector<ChatMessage> out;
    const json* v = field(key, true);
    if (!v) return out;
    if (!v->is_array()) return bad(key, "is not an array"), out;
    for (const auto& m : *v) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string()) {
        return bad(key, "holds a message without a string role and content"), std::vector<ChatMessage>();
      }
      out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return out;
  }
  std::vector<record::RestMessage> rest_messages(const char* key) {
    std::vector<record::RestMessage> out;
    const json* v = field(key, true);
    if (!v) return out;
    if (!v->is_array()) return bad(key, "is not an array"), out;
    for (const auto& m : *v) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return bad(key, "holds a message without a string role"), std::vector<record::RestMessage>();
      }
      record::RestMessage r;
      r.role = m["role"].get<std::string>();
      if (auto at = m.find("at"); at != m.end()) {
        if (!at->is_array() || at->size() != 2 || !(*at)[0].is_number_unsigned() || !(*at)[1].is_number_unsigned()) {
          return bad(key, "holds an \"at\" that is not [offset, length]"), std::vector<record::RestMessage>();
        }
        r.offset = (*at)[0].get<uint64_t>(), r.length = (*at)[1].get<uint64_t>();
      } else if (auto c = m.find("content"); c != m.end() && c->is_string()) {
        r.in_transcript = false;
        r.content = c->get<std::string>();
      } else {
        return bad(key, "holds a message with neither \"at\" nor a string content"), std::vector<record::RestMessage>();
      }
      out.push_back(std::move(r));
    }
    return out;
  }
  Status status() const {
    return problem_.empty() ? Status::Ok()
                            : Status::Corruption(std::string(record_type_name(type_)) + " record: " + problem_);
  }

 private:
  const json* field(const char* key, bool required) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (required) bad(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  void bad(const char* key, const char* what) {
    if (problem_.empty()) problem_ = std::string("\"") + key + "\" " + what;
  }
  const json& j_;
  RecordType type_;
  std::string problem_;
};

Record read(Reader& in, RecordType type) {
  switch (type) {
    case RecordType::Header: return record::Header{in.str("model", false), in.integer<uint64_t>("fingerprint")};
    case RecordType::SegmentPut:
      return record::SegmentPut{in.str("name"),         in.level("level"),
                                in.str("parent", false), in.str("text"),
                                in.integer<int64_t>("updated", false), in.integer<uint64_t>("segment", false)};
    case RecordType::SegmentDelete: return record::SegmentDelete{in.str("name")};
    case RecordType::SegmentTier:
      return record::SegmentTier{in.str("name"), in.base64("coded"), in.integer<int64_t>("at", false)};
    case RecordType::SessionCreate:
      return record::SessionCreate{in.str("id"), in.str("bot"), in.integer<int64_t>("created", false)};
    case RecordType::SessionTurn:
      return record::SessionTurn{in.str("id"),
                                 in.integer<uint64_t>("n", false),
                                 in.integer<uint64_t>("dropped", false),
                                 in.integer<uint64_t>("dropped_tokens", false),
                                 in.str("user"),
                                 in.str("assistant"),
                                 in.integers<int32_t>("delta"),
                                 in.integers<int32_t>("generated"),
                                 in.integers<size_t>("seals"),
                                 in.integers<uint64_t>("segments", false),
                                 in.integer<int64_t>("at", false),
                                 in.str("role", false),
                                 in.str("tools", false)};
    case RecordType::SessionDelete: return record::SessionDelete{in.str("id")};
    case RecordType::SessionSnapshot:
      return record::SessionSnapshot{in.str("id"),
                                     in.str("bot"),
                                     in.integer<int64_t>("created", false),
                                     in.integer<int64_t>("updated", false),
                                     in.messages("messages"),
                                     in.integers<int32_t>("transcript"),
                                     in.integers<size_t>("seals"),
                                     in.integers<uint64_t>("segments", false),
                                     in.integer<uint64_t>("turns", false),
                                     in.integers<size_t>("turn_ends", false),
                                     in.str("tools", false)};
    case RecordType::SessionRest:
      return record::SessionRest{in.str("id"),
                                 in.str("bot"),
                                 in.integer<int64_t>("created", false),
                                 in.integer<int64_t>("updated", false),
                                 in.integer<uint64_t>("turns"),
                                 in.integers<size_t>("turn_ends"),
                                 in.integers<size_t>("seals"),
                                 in.integers<uint64_t>("segments"),
                                 in.integers<int32_t>("tail"),
                                 in.rest_messages("messages"),
                                 in.str("tools", false)};
  }
  return record::Header{};
}

}  // namespace

std::string record_payload(const Record& r) {
  const json j = std::visit([](const auto& rec) { return to_json(rec); }, r);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Record> parse_record(RecordType type, std::string_view payload) {
  const uint8_t t = static_cast<uint8_t>(type);
  if (t < 1 || t > kLastRecordType) return Status::Corruption("unknown record type " + std::to_string(t));
  const json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corruption(std::string(record_type_name(type)) + " record is not a JSON object");
  }
  Reader in(j, type);
  Record r = read(in, type);
  if (Status st = in.status(); !st.ok()) return st;
  return r;
}

}  // namespace towers::daemon

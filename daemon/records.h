// The records of towerd's state log (daemon/state_store.h), as typed structs, and their one encoding:
// a JSON object per record, the record's kind in the log's type byte. Everything that writes or reads
// the log (the catalog's changes and compaction, towerd's header, towerctl's offline verbs) goes
// through record_payload/parse_record, so a field is spelled in one place.
//
//   kind              payload
//   header            {model, fingerprint}                      first record of a new or compacted log
//   segment_put       {name, level, parent, text, updated, segment?}   define or update a hierarchy
//                                          segment; `segment`: its pool id, whose KV is the store file
//                                          segments/seg-<id>.tws (mmapstore/segment_format.h)
//   segment_delete    {name}
//   segment_tier      {name, coded?, at}   with `coded` (base64 codec container of its tokens) the
//                                          segment restarts cold, without it hot
//   session_create    {id, bot, created}
//   session_turn      {id, n?, dropped?, dropped_tokens?, user, assistant, delta, generated, seals,
//                                          segments?, at}   one completed reply: n is the session's turn
//                                          number (1, 2, ...) so that replay sees a missing turn;
//                                          `dropped` oldest turns (`dropped_tokens` transcript tokens)
//                                          left the session before this turn (it had reached the
//                                          context); segments[i] is the pool id (and file) of the
//                                          transcript segment ending at seals[i]; role? "tool":
//                                          `user` holds tool results; tools?: the session's tools
//   session_delete    {id}
//   session_snapshot  {id, bot, created, updated, messages, transcript, seals, segments?, turns?,
//                      turn_ends?, tools?}   (compaction, and a session repaired at start; turns: numbered so
//                      far, turn_ends: transcript offset where each kept turn ends; a segment id 0:
//                      no file, the segment is recomputed from the tokens)
//   session_rest      {id, bot, created, updated, turns, turn_ends, seals, segments, tail, messages,
//                      tools?}   a session at rest (compaction): no text, no token up to seals.back();
//                      those are only in its segments' coded records in the cold packs. tail: the
//                      tokens after the last seal (the reply's last token, never evaluated);
//                      messages[i]: {role, at: [offset, length]} where its text sits in the
//                      detokenized transcript, or {role, content} when it is not found there verbatim
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "daemon/level.h"
#include "engine/text/chat_template.h"
#include "engine/base/status.h"

namespace towers::daemon {

enum class RecordType : uint8_t {
  Header = 1,
  SegmentPut = 2,
  SegmentDelete = 3,
  SessionCreate = 4,
  SessionTurn = 5,
  SessionDelete = 6,
  SessionSnapshot = 7,
  SegmentTier = 8,
  SessionRest = 9,
};
inline constexpr uint8_t kLastRecordType = static_cast<uint8_t>(RecordType::SessionRest);
const char* record_type_name(RecordType t);

namespace record {
struct Header {
  std::string model;
  uint64_t fingerprint = 0;
};
struct SegmentPut {
  std::string name;
  Level level = Level::Bot;
  std::string parent, text;
  int64_t updated = 0;
  uint64_t segment = 0;  // pool id of its KV (0: none recorded, a log from before the store)
};
struct SegmentDelete {
  std::string name;
};
struct SegmentTier {
  std::string name;
  std::vector<uint8_t> coded;  // empty = hot
  int64_t at = 0;
};
struct SessionCreate {
  std::string id, bot;
  int64_t created = 0;
};
struct SessionTurn {
  std::string id;
  uint64_t n = 0;  // turn number within the session (1, 2, ...); 0: unnumbered (an older log)
  uint64_t dropped = 0, dropped_tokens = 0;  // oldest turns (and their tokens) dropped before this one
  std::string user, assistant;
  std::vector<int32_t> delta, generated;
  std::vector<size_t> seals;
  std::vector<uint64_t> segments;  // pool ids of the transcript segments, one per seal (may be empty)
  int64_t at = 0;
  // "" (a user message in `user`), or "tool": `user` holds the tool results answering the previous
  // reply's calls, as JSON [{"tool_call_id", "content"}, ...] (daemon/catalog.h, "Tools on sessions").
  std::string role;
  std::string tools;  // the session's tools (tools_json), on the turn that brought them (its first)
};
struct SessionDelete {
  std::string id;
};
struct SessionSnapshot {
  std::string id, bot;
  int64_t created = 0, updated = 0;
  std::vector<ChatMessage> messages;
  std::vector<int32_t> transcript;
  std::vector<size_t> seals;
  std::vector<uint64_t> segments;
  uint64_t turns = 0;             // turns numbered so far (0: messages / 2, an older log)
  std::vector<size_t> turn_ends;  // transcript offset after each kept turn (empty: an older log)
  std::string tools;              // the session's tools (tools_json; "": none)
};
// Where one message of a session at rest is: `length` bytes at `offset` of its detokenized
// transcript, or (text not found there verbatim) its own `content`.
struct RestMessage {
  std::string role;
  bool in_transcript = true;
  uint64_t offset = 0, length = 0;
  std::string content;  // !in_transcript
};
struct SessionRest {
  std::string id, bot;
  int64_t created = 0, updated = 0;
  uint64_t turns = 0;
  std::vector<size_t> turn_ends, seals;
  std::vector<uint64_t> segments;  // one per seal, each with its coded record in the cold packs
  std::vector<int32_t> tail;       // transcript tokens after seals.back()
  std::vector<RestMessage> messages;
  std::string tools;
};
}  // namespace record

// One alternative per RecordType, in the same order.
using Record = std::variant<record::Header, record::SegmentPut, record::SegmentDelete, record::SessionCreate,
                            record::SessionTurn, record::SessionDelete, record::SessionSnapshot, record::SegmentTier,
                            record::SessionRest>;

RecordType type_of(const Record& r);
std::string record_payload(const Record& r);  // the payload
// Corruption (naming the kind and the field) when the payload is not a well-formed record of `type`.
Result<Record> parse_record(RecordType type, std::string_view payload);

}  // namespace towers::daemon

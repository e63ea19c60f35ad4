// What the catalog's files (daemon/catalog*.cc) share and nothing else uses: name rules, the errors
// they word alike, and how a recorded turn changes a session (replay and a live turn do the same).
#pragma once
#include <string>

#include "daemon/catalog.h"

namespace towers::daemon::catalog_detail {

int64_t now_s();
// 1-64 characters of letters, digits, '-', '_', '.' (not "." or ".."): segment names and session ids.
bool valid_name(const std::string& s);

Status no_segment(const std::string& name);
Status no_session(const std::string& id);
Status not_recorded(const std::string& what, const Status& st);
// A session at rest asked for what only a woken one has (the edge wakes it first: a race).
Status rest_unavailable(const std::string& id);

// The oldest `turns` turns (and `tokens` transcript tokens) leave the session: it had reached the context.
Status drop_oldest(Session& s, size_t turns, size_t tokens);
// A recorded turn joins the session (its messages, tokens, seals and their segments).
void append_turn(Session& s, const record::SessionTurn& t);
// The session as one record (compaction, a repair at start): replay replaces the session with it.
record::SessionSnapshot snapshot_of(const Session& s);
// A session at rest (Session::rest set) as its record.
record::SessionRest rest_record_of(const Session& s);

}  // namespace towers::daemon::catalog_detail

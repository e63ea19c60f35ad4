// The catalog's lock and what its parts share: views, counts, queueing records, removing segments
// once the lock is released. The parts: catalog_segments.cc, catalog_sessions.cc, catalog_records.cc.
#include "daemon/catalog.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include "daemon/catalog_internal.h"
#include "daemon/log.h"

namespace towers::daemon {

namespace catalog_detail {

int64_t now_s() { return static_cast<int64_t>(std::time(nullptr)); }

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return s != "." && s != "..";
}

Status no_segment(const std::string& name) { return Status::NotFound("segment \"" + name + "\" does not exist"); }
Status no_session(const std::string& id) { return Status::NotFound("session \"" + id + "\" does not exist"); }
Status not_recorded(const std::string& what, const Status& st) {
  return Status::IOError("cannot record " + what + " in the state log: " + st.message());
}

Status rest_unavailable(const std::string& id) {
  return Status::Unavailable("session \"" + id + "\" went to rest while this request was read; send it again");
}

Status drop_oldest(Session& s, size_t turns, size_t tokens) {
  if (turns == 0) return Status::Ok();
  if (turns * 2 > s.messages.size() || tokens > s.transcript.size()) {
    return Status::Corruption("drops " + std::to_string(turns) + " turns the session does not have");
  }
  s.messages.erase(s.messages.begin(), s.messages.begin() + static_cast<std::ptrdiff_t>(2 * turns));
  s.transcript.erase(s.transcript.begin(), s.transcript.begin() + static_cast<std::ptrdiff_t>(tokens));
  std::vector<size_t> ends;
  for (size_t i = std::min(turns, s.turn_ends.size()); i < s.turn_ends.size(); ++i) ends.push_back(s.turn_ends[i] - tokens);
  s.turn_ends = std::move(ends);
  return Status::Ok();
}

void append_turn(Session& s, const record::SessionTurn& t) {
  s.messages.push_back({t.role.empty() ? "user" : t.role, t.user});
  if (!t.tools.empty()) s.tools = t.tools;
  s.messages.push_back({"assistant", t.assistant});
  s.transcript.insert(s.transcript.end(), t.delta.begin(), t.delta.end());
  s.transcript.insert(s.transcript.end(), t.generated.begin(), t.generated.end());
  if (s.turn_ends.size() * 2 + 2 == s.messages.size()) s.turn_ends.push_back(s.transcript.size());
  else s.turn_ends.clear();  // turns of an older log, whose ends were not kept: not truncatable
  s.seals = t.seals;
  s.seal_ids.assign(t.segments.begin(), t.segments.end());
  s.updated = t.at;
}

record::SessionSnapshot snapshot_of(const Session& s) {
  return record::SessionSnapshot{s.id,         s.bot,        s.created,
                                 s.updated,    s.messages,   s.transcript,
                                 s.seals,      std::vector<uint64_t>(s.seal_ids.begin(), s.seal_ids.end()),
                                 s.turns,      s.turn_ends,  s.tools};
}

record::SessionRest rest_record_of(const Session& s) {
  return record::SessionRest{s.id,
                             s.bot,
                             s.created,
                             s.updated,
                             s.turns,
                             s.turn_ends,
                             s.seals,
                             std::vector<uint64_t>(s.seal_ids.begin(), s.seal_ids.end()),
                             s.rest->tail,
                             s.rest->where,
                             s.tools};
}

}  // namespace catalog_detail

Catalog::Catalog(const Model& model, SegmentPool& pool, const PromptBuilder& prompts, StateStore& store,
                 const Config& config, uint64_t fingerprint, uint64_t coder_fingerprint)
    : model_(model), pool_(pool), prompts_(prompts), store_(store), config_(config),
      fingerprint_(fingerprint), coder_fingerprint_(coder_fingerprint ? coder_fingerprint : fingerprint) {}

// The configured limit (max_prompt_tokens within the context) and, when smaller, the tokens whose
// tail KV the RAM budget holds (0: the budget does not bind).
std::pair<size_t, size_t> Catalog::prompt_limits() const {
  const int n_ctx = model_.config().n_ctx_train;
  const size_t configured =
      static_cast<size_t>(config_.max_prompt_tokens > 0 ? std::min(config_.max_prompt_tokens, n_ctx) : n_ctx);
  const size_t budget = pool_.ram_budget_bytes(), per_token = kv_bytes_per_token(model_.config(), config_.tail_format);
  const size_t fits = budget > 0 && per_token > 0 ? std::max<size_t>(1, budget / per_token) : 0;
  return {configured, fits > 0 && fits < configured ? fits : 0};
}

size_t Catalog::prompt_limit() const {
  const auto [configured, fits] = prompt_limits();
  return fits > 0 ? fits : configured;
}

std::string Catalog::prompt_limit_why() const {
  const auto [configured, fits] = prompt_limits();
  if (fits > 0) {
    return "the RAM budget of " + format_size(pool_.ram_budget_bytes()) + " holds the KV of " + std::to_string(fits) +
           " prompt tokens, " + std::to_string(kv_bytes_per_token(model_.config(), config_.tail_format)) + " B each";
  }
  const int n_ctx = model_.config().n_ctx_train;
  if (configured < static_cast<size_t>(n_ctx)) return "[limits] max_prompt_tokens " + std::to_string(configured);
  return "model context " + std::to_string(n_ctx);
}

std::future<Status> Catalog::queue_record_locked(const Record& r) {
  auto durable = std::make_shared<std::promise<Status>>();
  std::future<Status> f = durable->get_future();
  store_.append_async(r, [durable](const Status& st) { durable->set_value(st); });
  return f;
}

void Catalog::remove_segments(const std::vector<SegmentId>& ids) {
  std::vector<SegmentId> left;
  for (SegmentId id : ids) {
    if (id == kNoSegment) continue;
    Status st = pool_.remove(id);
    if (!st.ok() && st.code() != Status::Code::kNotFound) left.push_back(id);
  }
  if (left.empty()) return;
  std::lock_guard lock(mu_);
  retired_.insert(retired_.end(), left.begin(), left.end());
}

size_t Catalog::segment_count() const {
  std::lock_guard lock(mu_);
  return defs_.size();
}
size_t Catalog::session_count() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}
size_t Catalog::warm_sessions() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [id, s] : sessions_) {
    if (s.tail_segment != kNoSegment) {
      auto info = pool_.info(s.tail_segment);
      if (info && info->tier == Tier::Hot) ++n;
    }
  }
  return n;
}

SegmentView Catalog::view_locked(const SegmentDef& d) const {
  SegmentView v{d.name, d.level, d.parent, d.text, d.tokens.size(), d.updated, d.coded.size(), {}, 0, std::nullopt, std::nullopt};
  for (const auto& [n, c] : defs_) {
    if (c.parent == d.name) v.children.push_back(n);
  }
  for (const auto& [id, s] : sessions_) v.sessions += s.bot == d.name;
  if (d.pool_id != kNoSegment) v.pool = pool_.info(d.pool_id);
  return v;
}

SessionView Catalog::view_locked(const Session& s, bool with_transcript) const {
  SessionView v{s.id, s.bot, s.created, s.updated, s.message_count(), s.transcript_size(), s.busy, false, std::nullopt, 0, "", std::nullopt};
  if (s.tail_segment) {
    auto info = pool_.info(s.tail_segment);
    v.warm = info && info->tier == Tier::Hot;
  }
  if (with_transcript) v.transcript = s.messages;
  v.at_rest = s.rest.has_value();
  v.turns = s.turns;
  v.tools = s.tools;
  if (!s.tools.empty()) v.tool_format = tool_format_for(prompts_.family());
  return v;
}

std::vector<SegmentId> Catalog::session_segments_locked(const Session& s) const {
  std::vector<SegmentId> path;
  const std::string lineage = transcript_options(s).lineage;
  for (SegmentId at = s.tail_segment; at != kNoSegment;) {
    auto info = pool_.info(at);
    if (!info || info->lineage != lineage) break;
    path.push_back(at);
    at = info->parent;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

std::set<SegmentId> Catalog::sessions_segments_locked(const std::string& except) const {
  std::set<SegmentId> used;
  for (const auto& [id, s] : sessions_) {
    if (id == except) continue;
    used.insert(s.seal_ids.begin(), s.seal_ids.end());
    used.insert(s.shifted.begin(), s.shifted.end());
    for (SegmentId seg : session_segments_locked(s)) used.insert(seg);
  }
  return used;
}

}  // namespace towers::daemon

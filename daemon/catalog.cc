#include "daemon/catalog.h"

#include <algorithm>
#include <ctime>
#include <random>

#include "daemon/base64.h"
#include "daemon/http_error.h"
#include "daemon/log.h"
#include "daemon/random_id.h"

namespace towers::daemon {

using json = nlohmann::json;

namespace {
int64_t now_s() { return static_cast<int64_t>(std::time(nullptr)); }

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return s != "." && s != "..";
}

std::string random_id() { return random_hex_id("s-"); }

int level_rank(const std::string& level) { return level == "platform" ? 0 : level == "community" ? 1 : 2; }

std::vector<int32_t> ints(const json& j) {
  std::vector<int32_t> v;
  if (!j.is_array()) return v;
  for (const auto& e : j) v.push_back(e.is_number_integer() ? e.get<int32_t>() : -1);
  return v;
}
std::vector<size_t> sizes(const json& j) {
  std::vector<size_t> v;
  if (!j.is_array()) return v;
  for (const auto& e : j) v.push_back(e.is_number_unsigned() ? e.get<size_t>() : 0);
  return v;
}
}  // namespace

Catalog::Catalog(const Model& model, SegmentPool& pool, const PromptBuilder& prompts, StateStore& store,
                 const Config& config, uint64_t fingerprint)
    : model_(model), pool_(pool), prompts_(prompts), store_(store), config_(config), fingerprint_(fingerprint) {}

SegmentDef* Catalog::find_def(const std::string& name) {
  auto it = defs_.find(name);
  return it == defs_.end() ? nullptr : &it->second;
}
const SegmentDef* Catalog::find_def(const std::string& name) const {
  auto it = defs_.find(name);
  return it == defs_.end() ? nullptr : &it->second;
}

std::vector<SegmentDef*> Catalog::chain_locked(const std::string& name) {
  std::vector<SegmentDef*> chain;
  for (SegmentDef* d = find_def(name); d && chain.size() < 8; d = d->parent.empty() ? nullptr : find_def(d->parent)) {
    chain.push_back(d);
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

Status Catalog::tokenize_def_locked(SegmentDef& d) {
  auto t = prompts_.level(d.text, d.parent.empty(), d.level == "bot");
  if (!t.ok()) return t.status();
  d.tokens = std::move(t.value());
  return Status::Ok();
}

Status Catalog::ensure_chain_locked(const std::string& name, SegmentId* id, std::vector<int32_t>* base) {
  auto chain = chain_locked(name);
  if (chain.empty()) return Status::Error("unknown segment \"" + name + "\"");
  SegmentId parent = kNoSegment;
  std::vector<int32_t> context;
  for (SegmentDef* d : chain) {
    if (d->tokens.empty()) {
      if (Status st = tokenize_def_locked(*d); !st.ok()) return st;
    }
    if (d->pool_id == kNoSegment || !pool_.info(d->pool_id)) {
      SegmentOptions o;
      o.label = d->level + ":" + d->name;
      o.pinned = std::find(config_.pin_levels.begin(), config_.pin_levels.end(), d->level) != config_.pin_levels.end();
      if (!d->coded.empty()) {
        if (std::string why = cold_mismatch_locked(*d, context); why.empty()) {
          o.cold = d->coded;  // no prefill now: it thaws on its first lease
        } else {
          log_warn("segment \"" + d->name + "\" restarts hot: its cold copy " + why);
          d->coded.clear();
        }
      }
      auto added = pool_.add(parent, d->tokens, o);
      if (!added.ok()) return Status::Error("segment \"" + d->name + "\": " + added.error());
      d->pool_id = added.value();
    }
    parent = d->pool_id;
    context.insert(context.end(), d->tokens.begin(), d->tokens.end());
  }
  if (base) base->insert(base->end(), context.begin(), context.end());
  if (id) *id = parent;
  return Status::Ok();
}

std::string Catalog::apply(const StateStore::Replayed& r) {
  std::lock_guard lock(mu_);
  const json& b = r.body;
  auto str = [&](const char* k) { return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string(); };
  try {
    switch (r.type) {
      case RecordType::Header: {
        const uint64_t fp = b.value("fingerprint", uint64_t{0});
        if (fp != fingerprint_) {
          model_changed_ = true;
          return "the state was written with another model (" + str("model") +
                 "); transcripts will be re-tokenized from their text";
        }
        return "";
      }
      case RecordType::SegmentPut: {
        SegmentDef d;
        d.name = str("name"), d.level = str("level"), d.parent = str("parent"), d.text = str("text");
        d.updated = b.value("updated", int64_t{0});
        if (!valid_name(d.name)) return "segment record without a valid name; skipped";
        defs_[d.name] = std::move(d);
        return "";
      }
      case RecordType::SegmentDelete:
        defs_.erase(str("name"));
        return "";
      case RecordType::SegmentTier: {
        SegmentDef* d = find_def(str("name"));
        if (!d) return "tier of unknown segment \"" + str("name") + "\"; skipped";
        d->coded.clear();
        if (b.contains("coded")) {
          auto bytes = base64_decode(str("coded"));
          if (!bytes || bytes->empty()) return "segment \"" + d->name + "\": cold copy is not base64; it restarts hot";
          d->coded = std::move(*bytes);
        }
        return "";
      }
      case RecordType::SessionCreate: {
        Session s;
        s.id = str("id"), s.bot = str("bot");
        s.created = s.updated = b.value("created", int64_t{0});
        if (s.id.empty()) return "session record without an id; skipped";
        sessions_[s.id] = std::move(s);
        return "";
      }
      case RecordType::SessionSnapshot: {
        Session s;
        s.id = str("id"), s.bot = str("bot");
        s.created = b.value("created", int64_t{0});
        s.updated = b.value("updated", int64_t{0});
        for (const auto& m : b.value("messages", json::array())) s.messages.push_back({m.value("role", ""), m.value("content", "")});
        s.transcript = ints(b.value("transcript", json::array()));
        s.seals = sizes(b.value("seals", json::array()));
        if (s.id.empty()) return "session snapshot without an id; skipped";
        sessions_[s.id] = std::move(s);
        return "";
      }
      case RecordType::SessionTurn: {
        auto it = sessions_.find(str("id"));
        if (it == sessions_.end()) return "turn of unknown session \"" + str("id") + "\"; skipped";
        Session& s = it->second;
        s.messages.push_back({"user", str("user")});
        s.messages.push_back({"assistant", str("assistant")});
        auto delta = ints(b.value("delta", json::array()));
        auto gen = ints(b.value("generated", json::array()));
        s.transcript.insert(s.transcript.end(), delta.begin(), delta.end());
        s.transcript.insert(s.transcript.end(), gen.begin(), gen.end());
        s.seals = sizes(b.value("seals", json::array()));
        s.updated = b.value("at", int64_t{0});
        return "";
      }
      case RecordType::SessionDelete:
        sessions_.erase(str("id"));
        return "";
    }
  } catch (const std::exception& e) {
    return std::string("malformed ") + record_type_name(r.type) + " record: " + e.what() + "; skipped";
  }
  return "";
}

Status Catalog::restore_segments() {
  std::lock_guard lock(mu_);
  // Validate the replayed hierarchy: drop the definitions whose parent is gone.
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = defs_.begin(); it != defs_.end();) {
      if (!it->second.parent.empty() && !defs_.count(it->second.parent)) {
        log_warn("segment \"" + it->first + "\" has no parent \"" + it->second.parent + "\" any more; dropped");
        it = defs_.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
  }
  if (model_changed_) {
    for (auto& [id, s] : sessions_) {
      std::vector<ChatMessage> turns = s.messages;
      s.transcript.clear();
      s.seals.clear();
      // Re-tokenize each turn from its text.
      for (size_t i = 0; i + 1 < turns.size() + 1; i += 2) {
        if (i >= turns.size()) break;
        auto d = prompts_.last_turn(true, i / 2 + 1, turns[i].content);
        if (!d.ok()) break;
        s.transcript.insert(s.transcript.end(), d->begin(), d->end());
        if (i + 1 < turns.size()) {
          auto a = model_.tokenizer().encode(prompts_.trim_content(turns[i + 1].content), false, false);
          s.transcript.insert(s.transcript.end(), a.begin(), a.end());
        }
      }
    }
  }
  size_t done = 0, failed = 0;
  const size_t total = defs_.size();
  // Parents first: by level.
  std::vector<std::string> order;
  for (const auto& [name, d] : defs_) order.push_back(name);
  std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    return level_rank(defs_.at(a).level) < level_rank(defs_.at(b).level);
  });
  for (const auto& name : order) {
    Status st = ensure_chain_locked(name, nullptr, nullptr);
    if (!st.ok()) {
      ++failed;
      log_error("cannot restore segment \"" + name + "\": " + st.message());
    }
    if (++done % 10 == 0 || done == total) log_info("restored " + std::to_string(done) + "/" + std::to_string(total) + " segments");
  }
  size_t cold = 0;
  for (const auto& [name, d] : defs_) cold += !d.coded.empty();
  if (cold) log_info(std::to_string(cold) + " segment(s) restarted cold (not prefilled; each thaws on first use)");
  if (model_changed_) {
    std::vector<std::pair<RecordType, json>> live = live_records_locked();
    if (Status st = store_.compact(live); !st.ok()) log_error("cannot rewrite the state log: " + st.message());
    model_changed_ = false;
  }
  return failed ? Status::Error(std::to_string(failed) + " segment(s) could not be restored") : Status::Ok();
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

json Catalog::def_json_locked(const SegmentDef& d) const {
  json j = {{"name", d.name}, {"level", d.level}, {"parent", d.parent}, {"text", d.text},
            {"tokens", d.tokens.size()}, {"updated", d.updated}, {"at_rest", d.coded.empty() ? "hot" : "cold"},
            {"coded_bytes", d.coded.size()}};
  json children = json::array();
  for (const auto& [n, c] : defs_) {
    if (c.parent == d.name) children.push_back(n);
  }
  j["children"] = children;
  size_t sessions = 0;
  for (const auto& [id, s] : sessions_) sessions += s.bot == d.name;
  j["sessions"] = sessions;
  if (auto info = pool_.info(d.pool_id)) {
    j["pool"] = {{"id", info->id}, {"depth", info->depth}, {"format", simd::kv_quant_name(info->format)},
                 {"kv_bytes", info->kv_bytes}, {"tier", std::string(to_string(info->tier))},
                 {"pinned", info->pinned}, {"hits", info->hits}, {"refcount", info->refcount}};
  } else {
    j["pool"] = nullptr;
  }
  return j;
}

void Catalog::forget_pool_subtree_locked(const std::string& name) {
  // Old pool segments of this definition and everything below it are recomputed on next use; the old
  // ones are removed where nothing uses them (else the budget moves them out eventually).
  std::vector<std::string> todo = {name};
  std::vector<SegmentId> old;
  for (size_t i = 0; i < todo.size(); ++i) {
    for (auto& [n, d] : defs_) {
      if (d.parent == todo[i]) todo.push_back(n);
    }
    if (SegmentDef* d = find_def(todo[i])) {
      if (d->pool_id) old.push_back(d->pool_id);
      d->pool_id = kNoSegment;
      d->tokens.clear();
    }
    for (auto& [id, s] : sessions_) {
      if (s.bot == todo[i]) {
        if (s.tail_segment) old.push_back(s.tail_segment);
        s.tail_segment = kNoSegment;
      }
    }
  }
  for (auto it = old.rbegin(); it != old.rend(); ++it) (void)pool_.remove(*it);
}

json Catalog::put_segment(const std::string& name, const std::string& level, const std::string& parent,
                          const std::string& text) {
  if (!valid_name(name)) throw bad_request("segment name must be 1-64 characters of letters, digits, '-', '_', '.'");
  if (level != "platform" && level != "community" && level != "bot") {
    throw bad_request("level must be \"platform\", \"community\" or \"bot\", got \"" + level + "\"");
  }
  if (text.size() > static_cast<size_t>(config_.max_segment_chars)) {
    throw HttpError(413, "invalid_request_error", "segment text of " + std::to_string(text.size()) +
                                                      " bytes exceeds limits.max_segment_chars (" +
                                                      std::to_string(config_.max_segment_chars) + ")");
  }
  if (!is_valid_utf8(text)) throw bad_request("segment text is not valid UTF-8");
  std::lock_guard lock(mu_);
  if (level == "platform" && !parent.empty()) throw bad_request("a platform segment has no parent");
  if (level != "platform") {
    const SegmentDef* p = find_def(parent);
    if (parent.empty()) throw bad_request("a " + level + " segment needs a parent");
    if (!p) throw not_found("parent segment \"" + parent + "\" does not exist");
    if (level == "community" && p->level != "platform") throw bad_request("a community's parent must be a platform");
    if (level == "bot" && p->level == "bot") throw bad_request("a bot's parent must be a community or a platform");
  }
  SegmentDef* existing = find_def(name);
  if (existing) {
    bool has_children = false;
    for (const auto& [n, d] : defs_) has_children |= d.parent == name;
    if (existing->level != level && has_children) throw conflict("segment \"" + name + "\" has children; its level cannot change");
    for (const auto& [id, s] : sessions_) {
      if (s.bot == name && level != "bot") throw conflict("segment \"" + name + "\" has sessions; it must stay a bot");
      if (s.bot == name && s.busy) throw conflict("a session of \"" + name + "\" is generating; try again");
    }
    if (existing->text == text && existing->parent == parent && existing->level == level) {
      SegmentId id;
      if (Status st = ensure_chain_locked(name, &id, nullptr); !st.ok()) throw bad_request(st.message());
      return def_json_locked(*existing);
    }
  }
  SegmentDef d;
  d.name = name, d.level = level, d.parent = parent, d.text = text, d.updated = now_s();
  if (Status st = tokenize_def_locked(d); !st.ok()) throw bad_request(st.message());
  SegmentDef backup;
  if (existing) {
    backup = *existing;
    forget_pool_subtree_locked(name);
  }
  defs_[name] = d;
  SegmentId id;
  if (Status st = ensure_chain_locked(name, &id, nullptr); !st.ok()) {
    if (existing) defs_[name] = backup;
    else defs_.erase(name);
    throw bad_request(st.message());
  }
  if (Status st = store_.append(RecordType::SegmentPut, {{"name", name}, {"level", level}, {"parent", parent},
                                                         {"text", text}, {"updated", d.updated}});
      !st.ok()) {
    throw HttpError(500, "server_error", "cannot record the segment: " + st.message());
  }
  log_info(std::string(existing ? "updated " : "defined ") + level + " segment \"" + name + "\" (" +
           std::to_string(defs_[name].tokens.size()) + " tokens)");
  return def_json_locked(defs_[name]);
}

void Catalog::remove_segment(const std::string& name) {
  std::lock_guard lock(mu_);
  SegmentDef* d = find_def(name);
  if (!d) throw not_found("segment \"" + name + "\" does not exist");
  for (const auto& [n, c] : defs_) {
    if (c.parent == name) throw conflict("segment \"" + name + "\" has child segment \"" + n + "\"; remove it first");
  }
  for (const auto& [id, s] : sessions_) {
    if (s.bot == name) throw conflict("segment \"" + name + "\" has session \"" + id + "\"; remove its sessions first");
  }
  if (Status st = store_.append(RecordType::SegmentDelete, {{"name", name}}); !st.ok()) {
    throw HttpError(500, "server_error", "cannot record the removal: " + st.message());
  }
  if (d->pool_id) (void)pool_.remove(d->pool_id);
  defs_.erase(name);
  log_info("removed segment \"" + name + "\"");
}

json Catalog::segment_json(const std::string& name) const {
  std::lock_guard lock(mu_);
  const SegmentDef* d = find_def(name);
  if (!d) throw not_found("segment \"" + name + "\" does not exist");
  return def_json_locked(*d);
}

json Catalog::list_segments() const {
  std::lock_guard lock(mu_);
  json out = json::array();
  for (const char* level : {"platform", "community", "bot"}) {
    for (const auto& [n, d] : defs_) {
      if (d.level == level) out.push_back(def_json_locked(d));
    }
  }
  return {{"object", "list"}, {"data", out}};
}

json Catalog::create_session(const std::string& bot, const std::string& id_in) {
  std::lock_guard lock(mu_);
  const SegmentDef* b = find_def(bot);
  if (!b) throw not_found("bot \"" + bot + "\" does not exist");
  if (b->level != "bot") throw bad_request("segment \"" + bot + "\" is a " + b->level + ", not a bot");
  if (static_cast<int>(sessions_.size()) >= config_.max_sessions) {
    throw HttpError(507, "capacity_error", "the session limit (limits.max_sessions = " +
                                               std::to_string(config_.max_sessions) + ") is reached");
  }
  std::string id = id_in.empty() ? random_id() : id_in;
  if (!valid_name(id)) throw bad_request("session id must be 1-64 characters of letters, digits, '-', '_', '.'");
  if (sessions_.count(id)) throw conflict("session \"" + id + "\" exists already");
  Session s;
  s.id = id, s.bot = bot, s.created = s.updated = now_s();
  if (Status st = store_.append(RecordType::SessionCreate, {{"id", id}, {"bot", bot}, {"created", s.created}}); !st.ok()) {
    throw HttpError(500, "server_error", "cannot record the session: " + st.message());
  }
  sessions_[id] = s;
  return {{"id", id}, {"bot", bot}, {"created", s.created}, {"messages", 0}};
}

void Catalog::delete_session(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) throw not_found("session \"" + id + "\" does not exist");
  if (it->second.busy) throw conflict("session \"" + id + "\" is generating a reply; try again when it is done");
  if (Status st = store_.append(RecordType::SessionDelete, {{"id", id}}); !st.ok()) {
    throw HttpError(500, "server_error", "cannot record the removal: " + st.message());
  }
  // Its transcript segments go when nothing else uses them (another session may share a prefix).
  std::vector<SegmentId> path;
  for (SegmentId at = it->second.tail_segment; at != kNoSegment;) {
    auto info = pool_.info(at);
    if (!info || info->label.rfind("session:", 0) != 0) break;
    path.push_back(at);
    at = info->parent;
  }
  for (SegmentId s : path) {
    if (!pool_.remove(s).ok()) break;
  }
  sessions_.erase(it);
}

json Catalog::session_json(const std::string& id, bool with_transcript) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) throw not_found("session \"" + id + "\" does not exist");
  const Session& s = it->second;
  json j = {{"id", s.id}, {"bot", s.bot}, {"created", s.created}, {"updated", s.updated},
            {"messages", s.messages.size()}, {"transcript_tokens", s.transcript.size()}, {"busy", s.busy}};
  bool warm = false;
  if (s.tail_segment) {
    auto info = pool_.info(s.tail_segment);
    warm = info && info->tier == Tier::Hot;
  }
  j["warm"] = warm;
  if (with_transcript) {
    json msgs = json::array();
    for (const auto& m : s.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    j["transcript"] = msgs;
  }
  return j;
}

json Catalog::list_sessions() const {
  std::lock_guard lock(mu_);
  json out = json::array();
  for (const auto& [id, s] : sessions_) {
    out.push_back({{"id", s.id}, {"bot", s.bot}, {"messages", s.messages.size()},
                   {"transcript_tokens", s.transcript.size()}, {"updated", s.updated}});
  }
  return {{"object", "list"}, {"data", out}};
}

Catalog::Turn Catalog::begin_turn(const std::string& session, const std::string& user) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) throw not_found("session \"" + session + "\" does not exist");
  Session& s = it->second;
  if (s.busy) throw conflict("session \"" + session + "\" is already generating a reply");
  if (!find_def(s.bot)) throw not_found("the session's bot \"" + s.bot + "\" no longer exists");
  Turn t;
  t.session = session;
  t.user = user;
  auto delta = prompts_.last_turn(true, s.messages.size() / 2 + 1, user);
  if (!delta.ok()) throw bad_request(delta.error());
  t.delta = std::move(delta.value());
  size_t base = 0;
  for (SegmentDef* d : chain_locked(s.bot)) base += d->tokens.size();
  t.prompt_estimate = base + s.transcript.size() + t.delta.size();
  s.busy = true;
  return t;
}

void Catalog::abort_turn(const std::string& session) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) it->second.busy = false;
}

Status Catalog::ensure_session_locked(Session& s, SegmentId base_id, size_t base_len) {
  if (s.tail_segment != kNoSegment && pool_.info(s.tail_segment)) return Status::Ok();
  SegmentId parent = base_id;
  size_t at = 0;
  for (size_t end : s.seals) {
    if (end <= at || end > s.transcript.size()) break;
    SegmentOptions o;
    o.format = config_.depth.transcript;
    o.label = "session:" + s.id;
    auto id = pool_.add(parent, std::span<const int32_t>(s.transcript).subspan(at, end - at), o);
    if (!id.ok()) return Status::Error("cannot restore session \"" + s.id + "\": " + id.error());
    parent = id.value();
    at = end;
  }
  s.tail_segment = parent == base_id ? kNoSegment : parent;
  (void)base_len;
  return Status::Ok();
}

Result<std::vector<int32_t>> Catalog::prepare_turn(const Turn& t) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(t.session);
  if (it == sessions_.end()) return Status::Error("session \"" + t.session + "\" was removed");
  Session& s = it->second;
  SegmentId base_id;
  std::vector<int32_t> prompt;
  if (Status st = ensure_chain_locked(s.bot, &base_id, &prompt); !st.ok()) return st;
  const size_t base_len = prompt.size();
  if (Status st = ensure_session_locked(s, base_id, base_len); !st.ok()) return st;
  prompt.insert(prompt.end(), s.transcript.begin(), s.transcript.end());
  prompt.insert(prompt.end(), t.delta.begin(), t.delta.end());
  return prompt;
}

void Catalog::finish_turn(const Turn& t, GenOutcome& out, Lease* lease, const std::string& reply_text) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(t.session);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  s.busy = false;
  if (!out.error.ok() || out.finish_reason == "cancelled" || !lease) return;
  // Seal what was evaluated so the next turn starts from it.
  size_t base_len = 0;
  for (SegmentDef* d : chain_locked(s.bot)) base_len += d->tokens.size();
  std::vector<size_t> seals = s.seals;
  if (!out.tail.empty()) {
    SegmentOptions o;
    o.label = "session:" + s.id;
    auto id = pool_.seal(*lease, out.tail, o);
    if (id.ok()) {
      seals.clear();
      for (SegmentId p : lease->path) {
        auto info = pool_.info(p);
        if (!info) continue;
        const size_t end = static_cast<size_t>(info->begin + info->length);
        if (end > base_len) seals.push_back(end - base_len);
      }
      s.tail_segment = id.value();
    } else {
      log_warn("session \"" + s.id + "\": cannot seal the reply: " + id.error());
      s.tail_segment = kNoSegment;
    }
  }
  const int64_t at = now_s();
  json rec = {{"id", s.id}, {"user", t.user}, {"assistant", reply_text}, {"delta", t.delta},
              {"generated", out.tokens}, {"seals", seals}, {"at", at}};
  if (Status st = store_.append(RecordType::SessionTurn, rec); !st.ok()) {
    log_error("session \"" + s.id + "\": cannot record the turn: " + st.message());
    out.error = Status::Error("the reply could not be stored: " + st.message());
    out.http_status = 500;
    s.tail_segment = kNoSegment;
    return;
  }
  s.messages.push_back({"user", t.user});
  s.messages.push_back({"assistant", reply_text});
  s.transcript.insert(s.transcript.end(), t.delta.begin(), t.delta.end());
  s.transcript.insert(s.transcript.end(), out.tokens.begin(), out.tokens.end());
  s.seals = std::move(seals);
  s.updated = at;
}

Catalog::Stateless Catalog::begin_stateless(const std::string& bot, std::vector<ChatMessage> messages) {
  Stateless s;
  s.bot = bot;
  std::lock_guard lock(mu_);
  if (!bot.empty()) {
    const SegmentDef* b = find_def(bot);
    if (!b) throw not_found("bot \"" + bot + "\" does not exist");
    if (b->level != "bot") throw bad_request("segment \"" + bot + "\" is a " + b->level + ", not a bot");
  }
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    if (!bot.empty()) throw bad_request("the bot's segments are the system prompt: remove the system message or the bot");
    s.system = messages[0].content;
    i = 1;
  }
  s.turns.assign(messages.begin() + static_cast<std::ptrdiff_t>(i), messages.end());
  auto rest = prompts_.turns(!bot.empty() || s.system.has_value(), s.turns);
  if (!rest.ok()) throw bad_request(rest.error());
  s.rest = std::move(rest.value());
  size_t base = 0;
  if (!bot.empty()) {
    for (SegmentDef* d : chain_locked(bot)) base += d->tokens.size();
  } else {
    auto block = prompts_.system_block(s.system ? &*s.system : nullptr);
    if (!block.ok()) throw bad_request(block.error());
    s.base = std::move(block.value());
    base = s.base.size();
  }
  s.prompt_estimate = base + s.rest.size();
  return s;
}

Result<std::vector<int32_t>> Catalog::prepare_stateless(const Stateless& s) {
  std::lock_guard lock(mu_);
  std::vector<int32_t> prompt;
  if (!s.bot.empty()) {
    SegmentId id;
    if (Status st = ensure_chain_locked(s.bot, &id, &prompt); !st.ok()) return st;
  } else {
    prompt = s.base;
    if (!prompt.empty()) {
      // The system block as a segment of its own, so requests sharing it share its KV.
      SegmentOptions o;
      o.format = config_.depth.transcript;
      o.label = "prompt";
      auto id = pool_.add(kNoSegment, prompt, o);
      if (!id.ok()) return id.status();
    }
  }
  prompt.insert(prompt.end(), s.rest.begin(), s.rest.end());
  return prompt;
}

void Catalog::finish_stateless(GenOutcome& out, Lease* lease) {
  if (!lease || !out.error.ok() || config_.prompt_cache_segments == 0) return;
  // Keep the prompt (not the reply: a client resends the reply as text, tokenized anew) for reuse.
  const size_t cached = lease->cached_tokens;
  if (out.prompt.size() <= cached) return;
  lease->tower->truncate(static_cast<int32_t>(out.prompt.size()));
  std::vector<int32_t> rest(out.prompt.begin() + static_cast<std::ptrdiff_t>(cached), out.prompt.end());
  SegmentOptions o;
  o.label = "prompt";
  auto id = pool_.seal(*lease, std::move(rest), o);
  if (!id.ok()) return;
  std::lock_guard lock(mu_);
  prompt_cache_.push_back(id.value());
  while (prompt_cache_.size() > static_cast<size_t>(config_.prompt_cache_segments)) {
    SegmentId old = prompt_cache_.front();
    prompt_cache_.pop_front();
    (void)pool_.remove(old);  // refused while used or extended: then it stays until the budget moves it
  }
}

std::vector<std::pair<RecordType, json>> Catalog::live_records_locked() const {
  std::vector<std::pair<RecordType, json>> live;
  live.push_back({RecordType::Header, {{"model", model_.config().name}, {"fingerprint", fingerprint_}}});
  for (const char* level : {"platform", "community", "bot"}) {
    for (const auto& [n, d] : defs_) {
      if (d.level == level) {
        live.push_back({RecordType::SegmentPut, {{"name", d.name}, {"level", d.level}, {"parent", d.parent},
                                                 {"text", d.text}, {"updated", d.updated}}});
        if (!d.coded.empty()) live.push_back({RecordType::SegmentTier, {{"name", d.name}, {"coded", base64_encode(d.coded)}}});
      }
    }
  }
  for (const auto& [id, s] : sessions_) {
    json msgs = json::array();
    for (const auto& m : s.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    live.push_back({RecordType::SessionSnapshot, {{"id", s.id}, {"bot", s.bot}, {"created", s.created},
                                                  {"updated", s.updated}, {"messages", msgs},
                                                  {"transcript", s.transcript}, {"seals", s.seals}}});
  }
  return live;
}

size_t Catalog::live_estimate_locked() const {
  size_t n = 64;
  for (const auto& [k, d] : defs_) n += d.text.size() + d.coded.size() * 4 / 3 + 96;
  for (const auto& [k, s] : sessions_) {
    n += 128 + s.transcript.size() * 7;
    for (const auto& m : s.messages) n += m.content.size() + 32;
  }
  return n;
}

void Catalog::maybe_compact() {
  std::lock_guard lock(mu_);
  const uint64_t bytes = store_.bytes();
  if (bytes < config_.compact_bytes || live_estimate_locked() * 2 > bytes) return;
  auto live = live_records_locked();
  if (Status st = store_.compact(live); !st.ok()) {
    log_error("log compaction failed (the old log stays): " + st.message());
    return;
  }
  log_info("compacted the state log from " + format_size(bytes) + " to " + format_size(store_.bytes()));
}

std::string Catalog::cold_mismatch_locked(const SegmentDef& d, std::span<const int32_t> context) const {
  auto c = read_codec_container(d.coded);
  if (!c.ok()) return "is damaged (" + c.error() + ")";
  if (c->store.fingerprint != fingerprint_) return "was coded with another model";
  if (c->key.tokens != static_cast<int64_t>(d.tokens.size()) || !record_codes(c->record, d.tokens)) {
    return "codes other tokens (the text or the tokenizer changed)";
  }
  if (c->key != codec_segment_key(context, d.tokens)) return "was coded under another parent chain";
  return "";
}

Status Catalog::record_tier_locked(SegmentDef& d, std::vector<uint8_t> coded) {
  json body = {{"name", d.name}, {"at", now_s()}};
  if (!coded.empty()) body["coded"] = base64_encode(coded);
  if (Status st = store_.append(RecordType::SegmentTier, body); !st.ok()) return st;
  d.coded = std::move(coded);
  return Status::Ok();
}

std::vector<std::string> Catalog::record_cold_tiers() {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (auto& [name, d] : defs_) {
    if (!d.coded.empty() || d.pool_id == kNoSegment) continue;
    auto info = pool_.info(d.pool_id);
    if (!info || info->tier != Tier::Cold) continue;
    std::vector<uint8_t> coded = pool_.coded(d.pool_id);
    if (coded.empty()) continue;
    if (Status st = record_tier_locked(d, std::move(coded)); !st.ok()) {
      log_error("cannot record segment \"" + name + "\" as cold: " + st.message());
      continue;
    }
    names.push_back(name);
  }
  return names;
}

Status Catalog::set_hot(const std::string& name) {
  std::lock_guard lock(mu_);
  SegmentDef* d = find_def(name);
  if (!d) return Status::Error("segment \"" + name + "\" does not exist");
  return d->coded.empty() ? Status::Ok() : record_tier_locked(*d, {});
}

Result<size_t> Catalog::encode_cold(const std::string& name, const Codec& codec, Forward& forward,
                                    const CodecOptions& options) {
  std::lock_guard lock(mu_);
  auto chain = chain_locked(name);
  if (chain.empty()) return Status::Error("segment \"" + name + "\" does not exist");
  std::vector<int32_t> context;
  for (SegmentDef* d : chain) {
    if (d->tokens.empty()) {
      if (Status st = tokenize_def_locked(*d); !st.ok()) return Status::Error("segment \"" + d->name + "\": " + st.message());
    }
    if (d != chain.back()) context.insert(context.end(), d->tokens.begin(), d->tokens.end());
  }
  SegmentDef& d = *chain.back();
  auto coded = codec.encode(forward, context, d.tokens, options);
  if (!coded.ok()) return coded.status();
  const size_t bytes = coded->size();
  if (Status st = record_tier_locked(d, std::move(coded.value())); !st.ok()) return st;
  return bytes;
}

std::vector<std::string> Catalog::idle_segments(int64_t idle_seconds, int64_t now) const {
  std::lock_guard lock(mu_);
  std::map<std::string, int64_t> last;  // newest change or session turn in each definition's subtree
  for (const auto& [name, d] : defs_) last[name] = d.updated;
  auto touch = [&](std::string name, int64_t at) {
    for (int depth = 0; !name.empty() && depth < 8; ++depth) {
      auto it = last.find(name);
      if (it == last.end()) break;
      it->second = std::max(it->second, at);
      name = defs_.at(name).parent;
    }
  };
  for (const auto& [name, d] : defs_) touch(d.parent, d.updated);
  for (const auto& [id, s] : sessions_) touch(s.bot, s.updated);
  std::vector<std::string> out;
  for (const char* level : {"bot", "community", "platform"}) {
    for (const auto& [name, d] : defs_) {
      if (d.level == level && d.coded.empty() && now - last.at(name) >= idle_seconds) out.push_back(name);
    }
  }
  return out;
}

}  // namespace towers::daemon

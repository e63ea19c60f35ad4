#include "daemon/catalog.h"

#include <algorithm>
#include <ctime>
#include <random>
#include <set>

#include "daemon/log.h"
#include "daemon/random_id.h"

namespace towers::daemon {

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

// The oldest `turns` turns (and `tokens` transcript tokens) leave the session: it had reached the context.
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
  s.messages.push_back({"user", t.user});
  s.messages.push_back({"assistant", t.assistant});
  s.transcript.insert(s.transcript.end(), t.delta.begin(), t.delta.end());
  s.transcript.insert(s.transcript.end(), t.generated.begin(), t.generated.end());
  if (s.turn_ends.size() * 2 + 2 == s.messages.size()) s.turn_ends.push_back(s.transcript.size());
  else s.turn_ends.clear();  // turns of an older log, whose ends were not kept: not truncatable
  s.seals = t.seals;
  s.seal_ids.assign(t.segments.begin(), t.segments.end());
  s.updated = t.at;
}

Status no_segment(const std::string& name) { return Status::NotFound("segment \"" + name + "\" does not exist"); }
Status no_session(const std::string& id) { return Status::NotFound("session \"" + id + "\" does not exist"); }
Status not_recorded(const std::string& what, const Status& st) {
  return Status::IOError("cannot record " + what + " in the state log: " + st.message());
}
}  // namespace

Catalog::Catalog(const Model& model, SegmentPool& pool, const PromptBuilder& prompts, StateStore& store,
                 const Config& config, uint64_t fingerprint)
    : model_(model), pool_(pool), prompts_(prompts), store_(store), config_(config),
      fingerprint_(fingerprint) {}

size_t Catalog::prompt_limit() const {
  const int n_ctx = model_.config().n_ctx_train;
  return static_cast<size_t>(config_.max_prompt_tokens > 0 ? std::min(config_.max_prompt_tokens, n_ctx) : n_ctx);
}

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
  auto t = prompts_.level(d.text, d.parent.empty(), d.level == Level::Bot);
  if (!t.ok()) return t.status();
  d.tokens = std::move(t.value());
  return Status::Ok();
}

SegmentOptions Catalog::def_options_locked(const SegmentDef& d) const {
  SegmentOptions o;
  o.label = std::string(to_string(d.level)) + ":" + d.name;
  o.pinned = std::find(config_.pin_levels.begin(), config_.pin_levels.end(), d.level) != config_.pin_levels.end();
  return o;
}

SegmentOptions Catalog::transcript_options(const Session& s) const {
  SegmentOptions o;
  o.format = config_.depth.transcript;
  o.label = "session:" + s.id;
  o.lineage = o.label;
  return o;
}

void Catalog::record_binding_locked(SegmentDef& d) {
  if (d.pool_id == d.recorded_id) return;
  // Not waited for: a binding lost in a crash only costs a rebuild of this segment at the next start.
  store_.append_async(record::SegmentPut{d.name, d.level, d.parent, d.text, d.updated, d.pool_id}, nullptr);
  d.recorded_id = d.pool_id;
}

Status Catalog::ensure_chain_locked(const std::string& name, SegmentId* id, std::vector<int32_t>* base) {
  auto chain = chain_locked(name);
  if (chain.empty()) return no_segment(name);
  SegmentId parent = kNoSegment;
  std::vector<int32_t> context;
  for (SegmentDef* d : chain) {
    if (d->tokens.empty()) {
      if (Status st = tokenize_def_locked(*d); !st.ok()) return st;
    }
    if (d->pool_id == kNoSegment || !pool_.info(d->pool_id)) {
      SegmentOptions o = def_options_locked(*d);
      o.id = d->pool_id;  // the same id (and file name) across rebuilds when it is free
      if (!d->coded.empty()) {
        if (std::string why = cold_mismatch_locked(*d, context); why.empty()) {
          o.cold = d->coded;  // its arithmetic-coded tokens at rest
        } else {
          log_warn("segment \"" + d->name + "\" restarts hot: its cold copy " + why);
          d->coded.clear();
        }
      }
      if (d->modular_source != kNoSegment && o.cold == std::nullopt) {
        o.modular_from = {d->modular_source};
        o.repair = config_.modular.repair_tokens;
      }
      d->modular_source = kNoSegment;  // one placement; after it, builds are ordinary prefills
      auto added = pool_.add_cold(parent, d->tokens, o);
      if (!added.ok() && !o.modular_from.empty()) {
        o.modular_from.clear();  // its old segment left the pool: an ordinary prefill
        added = pool_.add_cold(parent, d->tokens, o);
      }
      if (!added.ok() && o.id != kNoSegment) {
        o.id = kNoSegment;  // its old segment is still in use (a lease): a new id
        added = pool_.add_cold(parent, d->tokens, o);
      }
      if (!added.ok()) return added.status().prefixed("segment \"" + d->name + "\": ");
      d->pool_id = added.value();
      record_binding_locked(*d);
    }
    parent = d->pool_id;
    context.insert(context.end(), d->tokens.begin(), d->tokens.end());
  }
  if (base) base->insert(base->end(), context.begin(), context.end());
  if (id) *id = parent;
  return Status::Ok();
}

record::Header Catalog::header() const { return {model_.config().name, fingerprint_}; }

Status Catalog::apply(const Record& r) {
  std::lock_guard lock(mu_);
  struct Apply {
    Catalog& c;
    Status operator()(const record::Header& h) {
      if (h.fingerprint != c.fingerprint_) c.model_changed_ = true;
      return Status::Ok();
    }
    Status operator()(const record::SegmentPut& p) {
      if (!valid_name(p.name)) return Status::Corruption("segment record without a valid name; skipped");
      SegmentDef d;
      d.name = p.name, d.level = p.level, d.parent = p.parent, d.text = p.text, d.updated = p.updated;
      d.pool_id = d.recorded_id = p.segment;
      c.defs_[p.name] = std::move(d);
      return Status::Ok();
    }
    Status operator()(const record::SegmentDelete& d) {
      c.defs_.erase(d.name);
      return Status::Ok();
    }
    Status operator()(const record::SegmentTier& t) {
      SegmentDef* d = c.find_def(t.name);
      if (!d) return Status::Corruption("tier of unknown segment \"" + t.name + "\"; skipped");
      d->coded = t.coded;
      return Status::Ok();
    }
    Status operator()(const record::SessionCreate& r) {
      if (r.id.empty()) return Status::Corruption("session record without an id; skipped");
      Session s;
      s.id = r.id, s.bot = r.bot, s.created = s.updated = r.created;
      c.sessions_[s.id] = std::move(s);
      return Status::Ok();
    }
    Status operator()(const record::SessionSnapshot& r) {
      if (r.id.empty()) return Status::Corruption("session snapshot without an id; skipped");
      Session s;
      s.id = r.id, s.bot = r.bot, s.created = r.created, s.updated = r.updated;
      s.messages = r.messages, s.transcript = r.transcript, s.seals = r.seals;
      s.seal_ids.assign(r.segments.begin(), r.segments.end());
      s.turns = r.turns ? r.turns : r.messages.size() / 2;
      s.turn_ends = r.turn_ends;
      if (s.turn_ends.size() != r.messages.size() / 2) s.turn_ends.clear();  // an older log: not truncatable
      c.sessions_[s.id] = std::move(s);
      return Status::Ok();
    }
    Status operator()(const record::SessionTurn& t) {
      auto it = c.sessions_.find(t.id);
      if (it == c.sessions_.end()) return Status::Corruption("turn of unknown session \"" + t.id + "\"; skipped");
      Session& s = it->second;
      if (s.cut) return Status::Corruption("session \"" + t.id + "\": turn " + std::to_string(t.n) + " skipped (the session was cut at a damaged record)");
      if (t.n != 0 && t.n != s.turns + 1) {
        // A turn is missing (its record was damaged): replaying this one would serve a conversation
        // that never happened. The session ends after its last whole turn.
        s.cut = true;
        return Status::Corruption("session \"" + t.id + "\": turn " + std::to_string(s.turns + 1) +
                                  " is missing (a damaged record); its history is cut after turn " +
                                  std::to_string(s.turns) + ", later turns dropped");
      }
      if (Status st = drop_oldest(s, t.dropped, t.dropped_tokens); !st.ok()) {
        s.cut = true;
        return st.prefixed("session \"" + t.id + "\": turn " + std::to_string(t.n) + ": ");
      }
      append_turn(s, t);
      s.turns++;
      return Status::Ok();
    }
    Status operator()(const record::SessionDelete& d) {
      c.sessions_.erase(d.id);
      return Status::Ok();
    }
  };
  return std::visit(Apply{*this}, r);
}

Result<Catalog::Restored> Catalog::restore() {
  std::lock_guard lock(mu_);
  Restored out;
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
  bool rewrite = model_changed_;
  if (model_changed_) {
    for (auto& [id, s] : sessions_) {
      std::vector<ChatMessage> turns = s.messages;
      s.transcript.clear();
      s.seals.clear();
      s.seal_ids.clear();
      // Re-tokenize each turn from its text.
      for (size_t i = 0; i < turns.size(); i += 2) {
        auto d = prompts_.last_turn(true, i / 2 + 1, turns[i].content);
        if (!d.ok()) break;
        s.transcript.insert(s.transcript.end(), d->begin(), d->end());
        if (i + 1 < turns.size()) {
          auto a = model_.tokenizer().encode(prompts_.trim_content(turns[i + 1].content), false, false);
          s.transcript.insert(s.transcript.end(), a.begin(), a.end());
        }
      }
    }
    for (auto& [name, d] : defs_) d.pool_id = kNoSegment;  // files of another model: none fits
  }
  SegmentId highest = 0;
  for (const auto& [id, s] : sessions_) {
    if (s.cut) ++out.sessions_cut, rewrite = true;
    for (SegmentId i : s.seal_ids) highest = std::max(highest, i);
  }
  for (const auto& [name, d] : defs_) highest = std::max(highest, d.pool_id);
  pool_.reserve_ids(highest);  // ids allocated from here on never take a recorded one
  {
    // Every file the loops below open, read ahead at once: one disk latency for all, not one each.
    std::vector<SegmentId> files;
    for (const auto& [name, d] : defs_) {
      if (d.pool_id != kNoSegment && d.coded.empty()) files.push_back(d.pool_id);
    }
    for (const auto& [id, s] : sessions_) files.insert(files.end(), s.seal_ids.begin(), s.seal_ids.end());
    pool_.prefetch_headers(files);
  }
  // Hierarchy segments, parents first: adopt each one's file, or put it in the pool cold.
  std::vector<SegmentDef*> order;
  for (auto& [name, d] : defs_) order.push_back(&d);
  std::stable_sort(order.begin(), order.end(), [](const SegmentDef* a, const SegmentDef* b) { return a->level < b->level; });
  for (SegmentDef* d : order) {
    if (Status st = tokenize_def_locked(*d); !st.ok()) {
      log_error("segment \"" + d->name + "\": " + st.message());
      continue;
    }
    const SegmentDef* parent = d->parent.empty() ? nullptr : find_def(d->parent);
    if (parent && !pool_.info(parent->pool_id)) continue;  // its parent failed: so does it
    const SegmentId parent_id = parent ? parent->pool_id : kNoSegment;
    if (d->pool_id != kNoSegment && d->coded.empty()) {
      AdoptSpec spec;
      spec.id = d->pool_id;
      spec.parent = parent_id;
      spec.tokens = d->tokens;
      spec.options = def_options_locked(*d);
      Status st = pool_.adopt(spec);
      if (st.ok()) {
        ++out.adopted;
        if (auto info = pool_.info(d->pool_id); info && info->modular) out.exact.push_back(d->pool_id);
        continue;
      }
      log_warn("segment \"" + d->name + "\": its stored KV cannot be used (" + st.message() +
               "); it is recomputed in the background");
    }
    if (Status st = ensure_chain_locked(d->name, nullptr, nullptr); !st.ok()) {
      log_error("cannot restore segment \"" + d->name + "\": " + st.message());
      continue;
    }
    ++out.cold;
    if (d->coded.empty()) out.rebuild.push_back(d->pool_id);
  }
  // Sessions: each transcript segment from its file, or cold (rebuilt on the session's next message).
  for (auto& [id, s] : sessions_) {
    SegmentId parent = kNoSegment;
    if (!find_def(s.bot) || !ensure_chain_locked(s.bot, &parent, nullptr).ok()) continue;
    const bool named = s.seal_ids.size() == s.seals.size();
    size_t at = 0;
    bool adopting = named;
    for (size_t i = 0; i < s.seals.size(); ++i) {
      const size_t end = s.seals[i];
      if (end <= at || end > s.transcript.size()) break;
      std::span<const int32_t> toks = std::span<const int32_t>(s.transcript).subspan(at, end - at);
      if (adopting) {
        AdoptSpec spec;
        spec.id = s.seal_ids[i];
        spec.parent = parent;
        spec.tokens.assign(toks.begin(), toks.end());
        spec.options = transcript_options(s);
        Status st = pool_.adopt(spec);
        if (st.ok()) {
          ++out.adopted;
          if (auto info = pool_.info(spec.id); info && info->modular) out.exact.push_back(spec.id);
          parent = spec.id;
          at = end;
          continue;
        }
        log_warn("session \"" + s.id + "\": transcript segment " + std::to_string(i + 1) + " cannot be used (" +
                 st.message() + "); it is recomputed on the session's next message");
        adopting = false;
      }
      SegmentOptions o = transcript_options(s);
      o.id = named ? s.seal_ids[i] : kNoSegment;
      auto added = pool_.add_cold(parent, toks, o);
      if (!added.ok()) break;
      ++out.cold;
      parent = added.value();
      if (named) s.seal_ids[i] = parent;
      at = end;
    }
    s.tail_segment = s.seals.empty() ? kNoSegment : parent;
  }
  const size_t garbage = pool_.collect_garbage();
  if (garbage) log_info("removed " + std::to_string(garbage) + " segment file(s) the state log does not name");
  size_t cold_at_rest = 0;
  for (const auto& [name, d] : defs_) cold_at_rest += !d.coded.empty();
  if (cold_at_rest) log_info(std::to_string(cold_at_rest) + " segment(s) restarted cold (each thaws on first use)");
  if (rewrite) {
    // The log is rewritten to the state served: another model's transcripts re-tokenized, or
    // sessions cut at a damaged record (their dropped turns must not come back later).
    if (Status st = store_.compact(live_records_locked()); !st.ok()) log_error("cannot rewrite the state log: " + st.message());
    for (auto& [id, s] : sessions_) s.cut = false;
    model_changed_ = false;
  }
  return out;
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
  SessionView v{s.id, s.bot, s.created, s.updated, s.messages.size(), s.transcript.size(), s.busy, false, std::nullopt};
  if (s.tail_segment) {
    auto info = pool_.info(s.tail_segment);
    v.warm = info && info->tier == Tier::Hot;
  }
  if (with_transcript) v.transcript = s.messages;
  return v;
}

std::vector<std::string> Catalog::forget_pool_subtree_locked(const std::string& name, bool modular, SegmentId self_source,
                                                             std::vector<SegmentId>* retired) {
  // Old pool segments of this definition and everything below it go; the definitions below it keep
  // their tokens and, with `modular`, are placed on the new parent from their old KV (computed or on
  // disk: a cold one has none to reuse). The rest is recomputed on next use.
  std::vector<std::string> todo = {name};
  std::vector<std::string> placed;
  std::vector<SegmentId> old;
  std::set<SegmentId> sources;
  if (self_source != kNoSegment) sources.insert(self_source);
  for (size_t i = 0; i < todo.size(); ++i) {
    for (auto& [n, d] : defs_) {
      if (d.parent == todo[i]) todo.push_back(n);
    }
    if (SegmentDef* d = find_def(todo[i])) {
      const auto info = d->pool_id ? pool_.info(d->pool_id) : std::nullopt;
      if (info) old.push_back(d->pool_id);  // the id is reused by the rebuilt segment when free
      SegmentId source = kNoSegment;
      if (modular && i > 0 && info && !d->tokens.empty()) {
        // Not built yet since an earlier edit: its recipe's segment is the one to reuse.
        source = info->tier != Tier::Cold ? info->id : info->modular_from.size() == 1 ? info->modular_from[0] : kNoSegment;
      }
      d->modular_source = source;
      if (source != kNoSegment) sources.insert(source), placed.push_back(d->name);
      if (i > 0 && source == kNoSegment) d->tokens.clear();
    }
    for (auto& [id, s] : sessions_) {
      if (s.bot != todo[i]) continue;
      for (SegmentId seg : session_segments_locked(s)) old.push_back(seg);  // root first
      s.tail_segment = kNoSegment;
      s.modular_sources.clear();
      if (!modular || s.seal_ids.size() != s.seals.size()) continue;
      size_t at = 0;
      for (size_t k = 0; k < s.seals.size(); at = s.seals[k++]) {
        auto info = pool_.info(s.seal_ids[k]);
        const bool reusable = info && info->tier != Tier::Cold && info->length == static_cast<int32_t>(s.seals[k] - at);
        s.modular_sources.push_back(reusable ? s.seal_ids[k] : kNoSegment);
        if (reusable) sources.insert(s.seal_ids[k]);
      }
    }
  }
  for (auto it = old.rbegin(); it != old.rend(); ++it) {  // leaves first
    if (!sources.count(*it) && pool_.remove(*it).ok()) continue;
    retired_.push_back(*it);
    retired->push_back(*it);
  }
  for (const std::string& n : todo) {
    SegmentDef* d = find_def(n);
    if (d && d->pool_id != kNoSegment && pool_.info(d->pool_id)) d->pool_id = kNoSegment;  // still there: a new id
  }
  return placed;
}

size_t Catalog::collect_retired() {
  std::lock_guard lock(mu_);
  if (retired_.empty()) return 0;
  std::set<SegmentId> reused;  // sources of modular placements not built yet
  for (const auto& [n, d] : defs_) {
    if (d.modular_source != kNoSegment) reused.insert(d.modular_source);
    if (auto info = d.pool_id ? pool_.info(d.pool_id) : std::nullopt; info && info->tier == Tier::Cold) {
      reused.insert(info->modular_from.begin(), info->modular_from.end());
    }
  }
  for (const auto& [id, s] : sessions_) {
    reused.insert(s.modular_sources.begin(), s.modular_sources.end());
    for (SegmentId seg : s.seal_ids) {
      if (auto info = pool_.info(seg); info && info->tier == Tier::Cold) {
        reused.insert(info->modular_from.begin(), info->modular_from.end());
      }
    }
  }
  // Session-less prompts sealed over a retired segment are never asked for again (their tokens start
  // with the old text) and would keep it, and its chain, from going.
  const std::set<SegmentId> retired(retired_.begin(), retired_.end());
  for (auto it = prompt_cache_.begin(); it != prompt_cache_.end();) {
    bool over_retired = false;
    for (auto info = pool_.info(*it); info && !over_retired; info = pool_.info(info->parent)) {
      over_retired = retired.count(info->parent) > 0;
    }
    if (over_retired && pool_.remove(*it).ok()) it = prompt_cache_.erase(it);
    else ++it;
  }
  std::vector<SegmentId> left;
  for (SegmentId id : retired_) {
    if (reused.count(id)) {
      left.push_back(id);
      continue;
    }
    Status st = pool_.remove(id);
    if (!st.ok() && st.code() != Status::Code::kNotFound) st = pool_.retire(id);  // only if it must: retire scans the pool
    if (!st.ok() && st.code() != Status::Code::kNotFound) left.push_back(id);
  }
  retired_ = std::move(left);
  return retired_.size();
}

Result<Catalog::Put> Catalog::link_segment(const std::string& source, const std::string& name, const std::string& parent) {
  Level level;
  std::string text;
  {
    std::lock_guard lock(mu_);
    const SegmentDef* s = find_def(source);
    if (!s) return no_segment(source);
    if (s->level == Level::Platform) return Status::InvalidArgument("a platform segment has no parent to link under");
    if (s->parent == parent) return Status::InvalidArgument("segment \"" + source + "\" is under \"" + parent + "\" already");
    if (find_def(name)) return Status::Conflict("segment \"" + name + "\" exists already");
    level = s->level;
    text = s->text;
  }
  return put_segment(name, level, parent, text, source);
}

Result<Catalog::Put> Catalog::put_segment(const std::string& name, Level level, const std::string& parent,
                                          const std::string& text, const std::string& like) {
  if (!valid_name(name)) {
    return Status::InvalidArgument("segment name must be 1-64 characters of letters, digits, '-', '_', '.'");
  }
  if (text.size() > static_cast<size_t>(config_.max_segment_chars)) {
    return Status::InvalidArgument("segment text of " + std::to_string(text.size()) +
                                   " bytes exceeds limits.max_segment_chars (" +
                                   std::to_string(config_.max_segment_chars) + ")");
  }
  if (!is_valid_utf8(text)) return Status::InvalidArgument("segment text is not valid UTF-8");
  std::lock_guard lock(mu_);
  if (level == Level::Platform && !parent.empty()) return Status::InvalidArgument("a platform segment has no parent");
  if (level != Level::Platform) {
    const SegmentDef* p = find_def(parent);
    if (parent.empty()) return Status::InvalidArgument("a " + std::string(to_string(level)) + " segment needs a parent");
    if (!p) return Status::NotFound("parent segment \"" + parent + "\" does not exist");
    if (level == Level::Community && p->level != Level::Platform) {
      return Status::InvalidArgument("a community's parent must be a platform");
    }
    if (level == Level::Bot && p->level == Level::Bot) {
      return Status::InvalidArgument("a bot's parent must be a community or a platform");
    }
  }
  auto built = [&](SegmentDef& d) {
    Put put;
    put.view = view_locked(d);
    if (put.view.pool && put.view.pool->tier != Tier::Hot) put.build = d.pool_id;
    return put;
  };
  SegmentDef* existing = find_def(name);
  if (existing) {
    bool has_children = false;
    for (const auto& [n, d] : defs_) has_children |= d.parent == name;
    if (existing->level != level && has_children) {
      return Status::Conflict("segment \"" + name + "\" has children; its level cannot change");
    }
    for (const auto& [id, s] : sessions_) {
      if (s.bot == name && level != Level::Bot) return Status::Conflict("segment \"" + name + "\" has sessions; it must stay a bot");
      if (s.bot == name && s.busy) return Status::Conflict("a session of \"" + name + "\" is generating; try again");
    }
    if (existing->text == text && existing->parent == parent && existing->level == level) {
      if (Status st = ensure_chain_locked(name, nullptr, nullptr); !st.ok()) return st;
      return built(*existing);
    }
  }
  SegmentDef d;
  d.name = name, d.level = level, d.parent = parent, d.text = text, d.updated = now_s();
  if (Status st = tokenize_def_locked(d); !st.ok()) return st;
  SegmentDef backup;
  std::vector<std::string> placed;
  std::vector<SegmentId> retired;
  if (existing) {
    backup = *existing;
    // Moved to another parent with the same text: placed there modularly from its old KV.
    const auto old = existing->pool_id ? pool_.info(existing->pool_id) : std::nullopt;
    if (config_.modular.enabled && old && old->tier != Tier::Cold && d.tokens == existing->tokens) {
      d.modular_source = old->id;
    }
    placed = forget_pool_subtree_locked(name, config_.modular.enabled, d.modular_source, &retired);
    if (d.modular_source != kNoSegment) placed.insert(placed.begin(), name);
    d.pool_id = existing->pool_id;  // the same id (and file name) when its old segment could go
    d.recorded_id = existing->recorded_id;
  }
  if (const SegmentDef* l = like.empty() ? nullptr : find_def(like); l && l->pool_id != kNoSegment && l->tokens == d.tokens) {
    if (auto info = pool_.info(l->pool_id); info && info->tier != Tier::Cold) d.modular_source = l->pool_id;
  }
  const bool placed_like = d.modular_source != kNoSegment && !like.empty();
  defs_[name] = d;
  SegmentDef& def = defs_[name];
  Status st = ensure_chain_locked(name, nullptr, nullptr);
  if (st.ok()) {
    st = store_.append(record::SegmentPut{name, level, parent, text, def.updated, def.pool_id});
    if (st.ok()) def.recorded_id = def.pool_id;
    else st = not_recorded("the segment", st);
  }
  if (!st.ok()) {
    if (existing) defs_[name] = backup;
    else defs_.erase(name);
    return st;
  }
  log_info(std::string(existing ? "updated " : "defined ") + std::string(to_string(level)) + " segment \"" + name +
           "\" (" + std::to_string(def.tokens.size()) + " tokens, segment " + std::to_string(def.pool_id) + ")" +
           (placed.empty() ? "" : "; " + std::to_string(placed.size()) + " segment(s) placed modularly, repairing " +
                                      std::to_string(config_.modular.repair_tokens) + " tokens each") +
           (placed_like ? "; placed modularly from the KV of \"" + like + "\"" : ""));
  Put put = built(def);
  put.retired = std::move(retired);
  for (const std::string& n : placed) {
    // Into the pool now (cold, with their recipe), so that the scheduler builds them at once.
    SegmentId id = kNoSegment;
    if (Status placed_st = ensure_chain_locked(n, &id, nullptr); !placed_st.ok()) {
      log_warn("segment \"" + n + "\" is recomputed on next use: " + placed_st.message());
      continue;
    }
    if (id != kNoSegment && id != put.build) put.placed.push_back(id);
  }
  return put;
}

Status Catalog::remove_segment(const std::string& name) {
  std::lock_guard lock(mu_);
  SegmentDef* d = find_def(name);
  if (!d) return no_segment(name);
  for (const auto& [n, c] : defs_) {
    if (c.parent == name) return Status::Conflict("segment \"" + name + "\" has child segment \"" + n + "\"; remove it first");
  }
  for (const auto& [id, s] : sessions_) {
    if (s.bot == name) return Status::Conflict("segment \"" + name + "\" has session \"" + id + "\"; remove its sessions first");
  }
  if (Status st = store_.append(record::SegmentDelete{name}); !st.ok()) return not_recorded("the removal", st);
  if (d->pool_id) (void)pool_.remove(d->pool_id);
  defs_.erase(name);
  log_info("removed segment \"" + name + "\"");
  return Status::Ok();
}

Result<SegmentView> Catalog::segment(const std::string& name) const {
  std::lock_guard lock(mu_);
  const SegmentDef* d = find_def(name);
  if (!d) return no_segment(name);
  return view_locked(*d);
}

std::vector<SegmentView> Catalog::segments() const {
  std::lock_guard lock(mu_);
  std::vector<SegmentView> out;
  for (Level level : kLevels) {
    for (const auto& [n, d] : defs_) {
      if (d.level == level) out.push_back(view_locked(d));
    }
  }
  return out;
}

Result<SessionView> Catalog::create_session(const std::string& bot, const std::string& id_in) {
  std::lock_guard lock(mu_);
  const SegmentDef* b = find_def(bot);
  if (!b) return Status::NotFound("bot \"" + bot + "\" does not exist");
  if (b->level != Level::Bot) {
    return Status::InvalidArgument("segment \"" + bot + "\" is a " + std::string(to_string(b->level)) + ", not a bot");
  }
  if (static_cast<int>(sessions_.size()) >= config_.max_sessions) {
    return Status::ResourceExhausted("the session limit (limits.max_sessions = " + std::to_string(config_.max_sessions) +
                                     ") is reached");
  }
  std::string id = id_in.empty() ? random_id() : id_in;
  if (!valid_name(id)) return Status::InvalidArgument("session id must be 1-64 characters of letters, digits, '-', '_', '.'");
  if (sessions_.count(id)) return Status::Conflict("session \"" + id + "\" exists already");
  Session s;
  s.id = id, s.bot = bot, s.created = s.updated = now_s();
  if (Status st = store_.append(record::SessionCreate{id, bot, s.created}); !st.ok()) return not_recorded("the session", st);
  return view_locked(sessions_[id] = s, false);
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

Status Catalog::delete_session(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return no_session(id);
  if (it->second.busy) return Status::Conflict("session \"" + id + "\" is generating a reply; try again when it is done");
  if (Status st = store_.append(record::SessionDelete{id}); !st.ok()) return not_recorded("the removal", st);
  // Its transcript segments go unless another session's record names them (sessions with the same
  // history share segments) or something below them is still in use.
  std::set<SegmentId> shared;
  for (const auto& [other, s] : sessions_) {
    if (other == id) continue;
    shared.insert(s.seal_ids.begin(), s.seal_ids.end());
    for (SegmentId seg : session_segments_locked(s)) shared.insert(seg);
  }
  auto path = session_segments_locked(it->second);
  for (auto seg = path.rbegin(); seg != path.rend(); ++seg) {
    if (shared.count(*seg) || !pool_.remove(*seg).ok()) break;
  }
  sessions_.erase(it);
  return Status::Ok();
}

Result<SessionView> Catalog::session(const std::string& id, bool with_transcript) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return no_session(id);
  return view_locked(it->second, with_transcript);
}

std::vector<SessionView> Catalog::sessions() const {
  std::lock_guard lock(mu_);
  std::vector<SessionView> out;
  for (const auto& [id, s] : sessions_) out.push_back(view_locked(s, false));
  return out;
}

Result<Catalog::Turn> Catalog::begin_turn(const std::string& session, const std::string& user, size_t reserve) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return no_session(session);
  Session& s = it->second;
  if (s.busy) return Status::Conflict("session \"" + session + "\" is already generating a reply");
  if (!find_def(s.bot)) return Status::Conflict("the session's bot \"" + s.bot + "\" no longer exists");
  Turn t;
  t.session = session;
  t.user = user;
  auto delta = prompts_.last_turn(true, s.messages.size() / 2 + 1, user);
  if (!delta.ok()) return delta.status();
  t.delta = std::move(delta.value());
  size_t base = 0;
  for (SegmentDef* d : chain_locked(s.bot)) base += d->tokens.size();
  const size_t limit = prompt_limit();
  auto needed = [&](size_t dropped) { return base + (s.transcript.size() - dropped) + t.delta.size() + reserve; };
  if (needed(0) > limit && config_.overflow_truncate && s.turn_ends.size() * 2 == s.messages.size()) {
    // The oldest whole turns go, as few as fit: the bot's segments always stay.
    for (size_t k = 1; k <= s.turn_ends.size(); ++k) {
      t.drop_turns = k;
      t.drop_tokens = s.turn_ends[k - 1];
      if (needed(t.drop_tokens) <= limit) break;
    }
  }
  t.prompt_estimate = base + s.transcript.size() - t.drop_tokens + t.delta.size();
  if (t.prompt_estimate + reserve > limit && t.drop_turns > 0) {
    return Status::ResourceExhausted("session \"" + session + "\": even without its earlier turns, the message (" +
                                     std::to_string(t.delta.size()) + " tokens) and the bot's prompt (" +
                                     std::to_string(base) + ") leave no room for a reply in the context of " +
                                     std::to_string(limit));
  }
  s.busy = true;
  return t;
}

void Catalog::abort_turn(const std::string& session) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) it->second.busy = false;
}

Status Catalog::ensure_session_locked(Session& s, SegmentId base_id) {
  if (s.tail_segment != kNoSegment && pool_.info(s.tail_segment)) return Status::Ok();
  // Not in the pool (removed when its bot changed, or never restored): the transcript segments go in
  // cold with their recorded ids and boundaries; the scheduler recomputes them, to the same bytes.
  // After an edit above the bot, the run of old segments the transcript starts with goes in as one
  // segment placed modularly from them: one build of repair_tokens instead of a prefill of them all.
  size_t reused = 0;
  while (reused < s.modular_sources.size() && reused < s.seals.size() && s.modular_sources[reused] != kNoSegment) ++reused;
  if (reused > 0 && s.seal_ids.size() == s.seals.size()) {
    SegmentOptions o = transcript_options(s);
    o.modular_from.assign(s.modular_sources.begin(), s.modular_sources.begin() + static_cast<std::ptrdiff_t>(reused));
    o.repair = config_.modular.repair_tokens;
    auto toks = std::span<const int32_t>(s.transcript).first(std::min(s.seals[reused - 1], s.transcript.size()));
    if (auto id = pool_.add_cold(base_id, toks, o); id.ok()) {
      s.seals.erase(s.seals.begin(), s.seals.begin() + static_cast<std::ptrdiff_t>(reused - 1));
      s.seal_ids.erase(s.seal_ids.begin(), s.seal_ids.begin() + static_cast<std::ptrdiff_t>(reused - 1));
      s.seal_ids[0] = id.value();
    }
  }
  s.modular_sources.clear();
  const bool named = s.seal_ids.size() == s.seals.size();
  SegmentId parent = base_id;
  size_t at = 0;
  for (size_t i = 0; i < s.seals.size(); ++i) {
    const size_t end = s.seals[i];
    if (end <= at || end > s.transcript.size()) break;
    SegmentOptions o = transcript_options(s);
    o.id = named ? s.seal_ids[i] : kNoSegment;
    auto toks = std::span<const int32_t>(s.transcript).subspan(at, end - at);
    auto id = pool_.add_cold(parent, toks, o);
    if (!id.ok() && o.id != kNoSegment) {
      o.id = kNoSegment;
      id = pool_.add_cold(parent, toks, o);
    }
    if (!id.ok()) return id.status().prefixed("cannot restore session \"" + s.id + "\": ");
    if (named) s.seal_ids[i] = id.value();
    parent = id.value();
    at = end;
  }
  s.tail_segment = parent == base_id ? kNoSegment : parent;
  return Status::Ok();
}

Status Catalog::shift_kept_locked(const Session& s, SegmentId base_id, size_t base_len, size_t drop_tokens) {
  SegmentId parent = base_id;
  size_t at = 0;              // where the old segment starts in the transcript
  size_t pos = base_len;      // where the kept part starts now
  const bool named = s.seal_ids.size() == s.seals.size();
  for (size_t i = 0; i < s.seals.size(); ++i) {
    const size_t end = s.seals[i];
    if (end <= at || end > s.transcript.size()) break;
    const size_t from = std::max(at, drop_tokens);
    if (end > from) {
      auto toks = std::span<const int32_t>(s.transcript).subspan(from, end - from);
      SegmentOptions o = transcript_options(s);
      // The kept rows, rotated to their new positions (the RoPE shift) instead of recomputed: what
      // they attend to stays what they were computed with. Whatever tier the old segment is in (a
      // restart leaves it warm): the scheduler pages it in (or computes it) before the shift, so the
      // result never depends on what happened to be in memory.
      auto old = named ? pool_.info(s.seal_ids[i]) : std::nullopt;
      if (old && old->length == static_cast<int32_t>(end - at)) {
        o.format = old->format;
        o.derive_from = old->id;
        o.derive_skip = static_cast<int32_t>(from - at);
      }
      auto id = pool_.add_cold(parent, toks, o);
      if (!id.ok()) return id.status().prefixed("cannot move session \"" + s.id + "\" up: ");
      if (o.derive_from != kNoSegment) (void)pool_.derive(id.value());  // now when the old one is in memory
      parent = id.value();
      pos += end - from;
    }
    at = end;
  }
  return Status::Ok();  // tokens after the last seal (a reply that was not sealed) are prefilled with the message
}

Result<std::vector<int32_t>> Catalog::prepare_turn(const Turn& t) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(t.session);
  if (it == sessions_.end()) return Status::NotFound("session \"" + t.session + "\" was removed");
  Session& s = it->second;
  SegmentId base_id;
  std::vector<int32_t> prompt;
  if (Status st = ensure_chain_locked(s.bot, &base_id, &prompt); !st.ok()) return st;
  if (t.drop_tokens > 0) {
    if (Status st = shift_kept_locked(s, base_id, prompt.size(), t.drop_tokens); !st.ok()) return st;
  } else if (Status st = ensure_session_locked(s, base_id); !st.ok()) {
    return st;
  }
  prompt.insert(prompt.end(), s.transcript.begin() + static_cast<std::ptrdiff_t>(t.drop_tokens), s.transcript.end());
  prompt.insert(prompt.end(), t.delta.begin(), t.delta.end());
  return prompt;
}

void Catalog::finish_turn(const Turn& t, const GenOutcome& out, Lease* lease, const std::string& reply_text,
                          std::function<void(const Status&)> done) {
  std::unique_lock lock(mu_);
  auto it = sessions_.find(t.session);
  if (it == sessions_.end()) {
    lock.unlock();
    if (done) done(Status::NotFound("session \"" + t.session + "\" was removed"));
    return;
  }
  Session& s = it->second;
  if (!out.error.ok() || out.finish_reason == FinishReason::Cancelled || !lease) {
    s.busy = false;
    lock.unlock();
    if (done) done(out.error.ok() ? Status::Cancelled("the reply was cancelled") : out.error);
    return;
  }
  // Seal what was evaluated so the next turn starts from it.
  size_t base_len = 0;
  for (SegmentDef* d : chain_locked(s.bot)) base_len += d->tokens.size();
  std::vector<size_t> seals = s.seals;
  std::vector<SegmentId> seal_ids = s.seal_ids;
  SegmentId tail = s.tail_segment;
  if (!out.tail.empty()) {
    // The seals are the lease's chain after the bot's segments (the tower the turn ran on, plus the
    // sealed tail): never the old seals, which do not fit the transcript once turns were dropped.
    auto id = pool_.seal(*lease, out.tail, transcript_options(s));
    if (!id.ok()) log_warn("session \"" + s.id + "\": cannot seal the reply: " + id.error());
    seals.clear();
    seal_ids.clear();
    for (SegmentId p : lease->path) {
      auto info = pool_.info(p);
      if (!info) continue;
      const size_t end = static_cast<size_t>(info->begin + info->length);
      if (end > base_len) seals.push_back(end - base_len), seal_ids.push_back(p);
    }
    tail = seal_ids.empty() ? kNoSegment : seal_ids.back();
  }
  record::SessionTurn rec{s.id,  s.turns + 1, t.drop_turns, t.drop_tokens, t.user, reply_text, t.delta, out.tokens,
                          seals, std::vector<uint64_t>(seal_ids.begin(), seal_ids.end()), now_s()};
  // Segments the record names that no prefill could give back (the kept turns, RoPE-shifted after a
  // drop): the record waits for their files, so a crash never leaves it naming one that is missing.
  // The others are recomputed from the log's tokens, to the same bytes, when their file is missing.
  std::vector<SegmentId> derived;
  for (SegmentId p : seal_ids) {
    auto info = pool_.info(p);
    if (info && info->derived) derived.push_back(p);
  }
  lock.unlock();
  // The turn joins the session once it is durable (on the log's completion thread); the session
  // stays busy until then, so no other turn can interleave.
  auto settle = std::make_shared<std::function<void(const Status&)>>([this, rec, tail, done = std::move(done)](const Status& st) {
    std::unique_lock lock(mu_);
    auto it = sessions_.find(rec.id);
    if (it != sessions_.end()) {
      Session& s = it->second;
      s.busy = false;
      if (st.ok()) {
        (void)drop_oldest(s, rec.dropped, rec.dropped_tokens);
        append_turn(s, rec);
        s.tail_segment = tail;
        s.turns = rec.n;
      } else {
        log_error("session \"" + rec.id + "\": cannot record the turn: " + st.message());
        s.tail_segment = kNoSegment;  // rebuilt from the recorded transcript on the next turn
      }
    }
    lock.unlock();
    if (done) done(st.ok() ? st : not_recorded("the reply", st));
  });
  auto record = [this, rec, settle](const Status& files) {
    if (!files.ok()) return (*settle)(files.prefixed("a moved transcript segment has no file: "));
    store_.append_async(rec, [settle](const Status& st) { (*settle)(st); });
  };
  if (derived.empty()) record(Status::Ok());
  else pool_.when_durable(derived, std::move(record));
}

Result<Catalog::Stateless> Catalog::begin_stateless(const std::string& bot, std::vector<ChatMessage> messages) {
  Stateless s;
  s.bot = bot;
  std::lock_guard lock(mu_);
  if (!bot.empty()) {
    const SegmentDef* b = find_def(bot);
    if (!b) return Status::NotFound("bot \"" + bot + "\" does not exist");
    if (b->level != Level::Bot) {
      return Status::InvalidArgument("segment \"" + bot + "\" is a " + std::string(to_string(b->level)) + ", not a bot");
    }
  }
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    if (!bot.empty()) {
      return Status::InvalidArgument("the bot's segments are the system prompt: remove the system message or the bot");
    }
    s.system = messages[0].content;
    i = 1;
  }
  s.turns.assign(messages.begin() + static_cast<std::ptrdiff_t>(i), messages.end());
  auto rest = prompts_.turns(!bot.empty() || s.system.has_value(), s.turns);
  if (!rest.ok()) return rest.status();
  s.rest = std::move(rest.value());
  size_t base = 0;
  if (!bot.empty()) {
    for (SegmentDef* d : chain_locked(bot)) base += d->tokens.size();
  } else {
    auto block = prompts_.system_block(s.system ? &*s.system : nullptr);
    if (!block.ok()) return block.status();
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
      // The system block as a segment of its own, so requests sharing it share its KV (the scheduler
      // computes it when it is new).
      SegmentOptions o;
      o.format = config_.depth.transcript;
      o.label = "prompt";
      auto id = pool_.add_cold(kNoSegment, prompt, o);
      if (!id.ok()) return id.status();
    }
  }
  prompt.insert(prompt.end(), s.rest.begin(), s.rest.end());
  return prompt;
}

void Catalog::finish_stateless(GenOutcome& out, Lease* lease) {
  if (!out.error.ok() || config_.prompt_cache_segments == 0) return;
  // Keep the prompt (not the reply: a client resends the reply as text, tokenized anew) for reuse.
  // Several choices (n > 1) sealed it already, to share it.
  Result<SegmentId> id = out.sealed_prompt;
  if (out.sealed_prompt == kNoSegment) {
    if (!lease || out.prompt.size() <= lease->cached_tokens) return;
    const size_t cached = lease->cached_tokens;
    lease->tower->truncate(static_cast<int32_t>(out.prompt.size()));
    std::vector<int32_t> rest(out.prompt.begin() + static_cast<std::ptrdiff_t>(cached), out.prompt.end());
    SegmentOptions o;
    o.label = "prompt";
    id = pool_.seal(*lease, std::move(rest), o);
  }
  if (!id.ok()) return;
  std::lock_guard lock(mu_);
  if (std::find(prompt_cache_.begin(), prompt_cache_.end(), id.value()) != prompt_cache_.end()) return;
  prompt_cache_.push_back(id.value());
  while (prompt_cache_.size() > static_cast<size_t>(config_.prompt_cache_segments)) {
    SegmentId old = prompt_cache_.front();
    prompt_cache_.pop_front();
    (void)pool_.remove(old);  // refused while used or extended: then it stays until the budget moves it
  }
}

std::vector<Record> Catalog::live_records_locked() const {
  std::vector<Record> live;
  live.push_back(header());
  for (Level level : kLevels) {
    for (const auto& [n, d] : defs_) {
      if (d.level != level) continue;
      live.push_back(record::SegmentPut{d.name, d.level, d.parent, d.text, d.updated, d.pool_id});
      if (!d.coded.empty()) live.push_back(record::SegmentTier{d.name, d.coded, d.updated});
    }
  }
  for (const auto& [id, s] : sessions_) {
    live.push_back(record::SessionSnapshot{s.id, s.bot, s.created, s.updated, s.messages, s.transcript, s.seals,
                                           std::vector<uint64_t>(s.seal_ids.begin(), s.seal_ids.end()), s.turns,
                                           s.turn_ends});
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
  if (Status st = store_.append(record::SegmentTier{d.name, coded, now_s()}); !st.ok()) return not_recorded("the tier", st);
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
  if (!d) return no_segment(name);
  return d->coded.empty() ? Status::Ok() : record_tier_locked(*d, {});
}

Result<size_t> Catalog::encode_cold(const std::string& name, const Codec& codec, Forward& forward,
                                    const CodecOptions& options) {
  std::lock_guard lock(mu_);
  auto chain = chain_locked(name);
  if (chain.empty()) return no_segment(name);
  std::vector<int32_t> context;
  for (SegmentDef* d : chain) {
    if (d->tokens.empty()) {
      if (Status st = tokenize_def_locked(*d); !st.ok()) return st.prefixed("segment \"" + d->name + "\": ");
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
  for (Level level : {Level::Bot, Level::Community, Level::Platform}) {
    for (const auto& [name, d] : defs_) {
      if (d.level == level && d.coded.empty() && now - last.at(name) >= idle_seconds) out.push_back(name);
    }
  }
  return out;
}

}  // namespace towers::daemon

// The segment hierarchy: definitions (platform → community → bot), their pool segments, edits (the
// subtree placed modularly from its old KV), links (a bot under a second parent) and removal.
#include <algorithm>
#include <set>

#include "daemon/catalog.h"
#include "daemon/catalog_internal.h"
#include "daemon/log.h"

namespace towers::daemon {

using namespace catalog_detail;

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

std::vector<std::string> Catalog::forget_pool_subtree_locked(const std::string& name, bool modular, SegmentId self_source,
                                                             std::vector<SegmentId>* remove,
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
      if (info) old.push_back(d->pool_id);
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
    if (!sources.count(*it)) {
      remove->push_back(*it);  // once the lock is released (remove_segments)
      continue;
    }
    retired_.push_back(*it);
    retired->push_back(*it);
  }
  // Every definition of the subtree gets a new segment: its old one is still in the pool until then.
  for (const std::string& n : todo) {
    SegmentDef* d = find_def(n);
    if (d && d->pool_id != kNoSegment && pool_.info(d->pool_id)) d->pool_id = kNoSegment;
  }
  return placed;
}

size_t Catalog::collect_retired() {
  std::vector<SegmentId> todo, prompts;
  {
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
      if (over_retired) prompts.push_back(*it), it = prompt_cache_.erase(it);
      else ++it;
    }
    std::vector<SegmentId> left;
    for (SegmentId id : retired_) (reused.count(id) ? left : todo).push_back(id);
    retired_ = std::move(left);
  }
  // The pool's work, without the lock (removing a segment deletes its file).
  std::vector<SegmentId> prompts_left, left;
  for (SegmentId id : prompts) {
    if (Status st = pool_.remove(id); !st.ok() && st.code() != Status::Code::kNotFound) prompts_left.push_back(id);
  }
  for (SegmentId id : todo) {
    Status st = pool_.remove(id);
    if (!st.ok() && st.code() != Status::Code::kNotFound) st = pool_.retire(id);  // only if it must: retire scans the pool
    if (!st.ok() && st.code() != Status::Code::kNotFound) left.push_back(id);
  }
  std::lock_guard lock(mu_);
  prompt_cache_.insert(prompt_cache_.begin(), prompts_left.begin(), prompts_left.end());
  retired_.insert(retired_.end(), left.begin(), left.end());
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
  Put put;
  std::vector<SegmentId> remove;  // the old segments of the edited subtree
  std::future<Status> durable;
  std::optional<SegmentDef> backup;
  int64_t updated = 0;
  std::string done_line;
  Status chain_st;
  bool existed = false, placed_like = false;
  std::vector<std::string> placed;
  std::vector<SegmentId> retired;
  {
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
      Put p;
      p.view = view_locked(d);
      if (p.view.pool && p.view.pool->tier != Tier::Hot) p.build = d.pool_id;
      return p;
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
    d.name = name, d.level = level, d.parent = parent, d.text = text, d.updated = updated = now_s();
    if (Status st = tokenize_def_locked(d); !st.ok()) return st;
    existed = existing != nullptr;
    if (existing) {
      // The sessions below keep their transcripts through the edit: a session at rest has its own
      // only in records coded under the old chain (the edge wakes them before an edit: a race).
      if (auto resting = sessions_at_rest_below_locked(name); !resting.empty()) {
        return Status::Unavailable(std::to_string(resting.size()) + " session(s) below \"" + name + "\" went to rest " +
                                   "while this request was read; send it again");
      }
      backup = *existing;
      // Moved to another parent with the same text: placed there modularly from its old KV.
      const auto old = existing->pool_id ? pool_.info(existing->pool_id) : std::nullopt;
      if (config_.modular.enabled && old && old->tier != Tier::Cold && d.tokens == existing->tokens) {
        d.modular_source = old->id;
      }
      placed = forget_pool_subtree_locked(name, config_.modular.enabled, d.modular_source, &remove, &retired);
      if (d.modular_source != kNoSegment) placed.insert(placed.begin(), name);
      d.pool_id = existing->pool_id;  // kNoSegment now unless its old segment had left the pool already
      d.recorded_id = existing->recorded_id;
    }
    if (const SegmentDef* l = like.empty() ? nullptr : find_def(like); l && l->pool_id != kNoSegment && l->tokens == d.tokens) {
      if (auto info = pool_.info(l->pool_id); info && info->tier != Tier::Cold) d.modular_source = l->pool_id;
    }
    placed_like = d.modular_source != kNoSegment && !like.empty();
    defs_[name] = d;
    chain_st = ensure_chain_locked(name, nullptr, nullptr);
    if (!chain_st.ok()) {
      if (backup) defs_[name] = *backup;
      else defs_.erase(name);
    } else {
      SegmentDef& def = defs_[name];
      durable = queue_record_locked(record::SegmentPut{name, level, parent, text, def.updated, def.pool_id});
      def.recorded_id = def.pool_id;
      done_line = std::string(existed ? "updated " : "defined ") + std::string(to_string(level)) + " segment \"" +
                  name + "\" (" + std::to_string(def.tokens.size()) + " tokens, segment " +
                  std::to_string(def.pool_id) + ")" +
                  (placed.empty() ? "" : "; " + std::to_string(placed.size()) + " segment(s) placed modularly, repairing " +
                                             std::to_string(config_.modular.repair_tokens) + " tokens each") +
                  (placed_like ? "; placed modularly from the KV of \"" + like + "\"" : "");
      put = built(def);
      put.retired = std::move(retired);
      put.retired.insert(put.retired.end(), remove.begin(), remove.end());  // no exact rebuild of any of them
      for (const std::string& n : placed) {
        // Into the pool now (cold, with their recipe), so that the scheduler builds them at once.
        SegmentId id = kNoSegment;
        if (Status placed_st = ensure_chain_locked(n, &id, nullptr); !placed_st.ok()) {
          log_warn("segment \"" + n + "\" is recomputed on next use: " + placed_st.message());
          continue;
        }
        if (id != kNoSegment && id != put.build) put.placed.push_back(id);
      }
    }
  }
  // The subtree's old segments go whether or not the edit could be made (their definitions get new
  // ones on use), once the lock is released: removing one deletes its file.
  remove_segments(remove);
  if (!chain_st.ok()) return chain_st;
  if (Status st = durable.get(); !st.ok()) {
    std::lock_guard lock(mu_);
    if (SegmentDef* d = find_def(name); d && d->updated == updated && d->text == text && d->parent == parent) {
      if (backup) *d = *backup;
      else defs_.erase(name);
    }
    return not_recorded("the segment", st);
  }
  log_info(done_line);
  return put;
}

Status Catalog::remove_segment(const std::string& name) {
  SegmentDef gone;
  std::future<Status> durable;
  {
    std::lock_guard lock(mu_);
    SegmentDef* d = find_def(name);
    if (!d) return no_segment(name);
    for (const auto& [n, c] : defs_) {
      if (c.parent == name) return Status::Conflict("segment \"" + name + "\" has child segment \"" + n + "\"; remove it first");
    }
    for (const auto& [id, s] : sessions_) {
      if (s.bot == name) return Status::Conflict("segment \"" + name + "\" has session \"" + id + "\"; remove its sessions first");
    }
    durable = queue_record_locked(record::SegmentDelete{name});
    gone = std::move(*d);
    defs_.erase(name);
  }
  if (Status st = durable.get(); !st.ok()) {
    std::lock_guard lock(mu_);
    if (!find_def(name)) defs_[name] = std::move(gone);
    return not_recorded("the removal", st);
  }
  remove_segments({gone.pool_id});
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

}  // namespace towers::daemon

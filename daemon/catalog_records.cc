// The record side of the catalog: replaying the log at start (apply), putting every segment back in
// the pool from its file (restore), the live state as records (compaction), and the cold tier at
// rest (segment_tier records: record_cold_tiers, set_hot, encode_cold).
#include <algorithm>
#include <map>

#include "daemon/catalog.h"
#include "daemon/catalog_internal.h"
#include "daemon/log.h"

namespace towers::daemon {

using namespace catalog_detail;

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
      s.tools = r.tools;
      if (s.turn_ends.size() != r.messages.size() / 2) s.turn_ends.clear();  // an older log: not truncatable
      c.sessions_[s.id] = std::move(s);
      return Status::Ok();
    }
    Status operator()(const record::SessionTurn& t) {
      auto it = c.sessions_.find(t.id);
      if (it == c.sessions_.end()) return Status::Corruption("turn of unknown session \"" + t.id + "\"; skipped");
      Session& s = it->second;
      if (s.cut) return Status::Corruption("session \"" + t.id + "\": turn " + std::to_string(t.n) + " skipped (the session was cut at a damaged record)");
      if (s.rest) {
        // A live turn wakes its session and records it whole first (wake_session): never a turn
        // straight after a session_rest record.
        s.cut = true;
        return Status::Corruption("session \"" + t.id + "\": turn " + std::to_string(t.n) +
                                  " follows its at-rest record without the session recorded whole; skipped");
      }
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
    Status operator()(const record::SessionRest& r) {
      if (r.id.empty()) return Status::Corruption("session_rest record without an id; skipped");
      if (r.seals.empty() || r.segments.size() != r.seals.size() || r.turn_ends.size() * 2 != r.messages.size()) {
        return Status::Corruption("session \"" + r.id + "\": its at-rest record does not describe a transcript; skipped");
      }
      Session s;
      s.id = r.id, s.bot = r.bot, s.created = r.created, s.updated = r.updated;
      s.seals = r.seals;
      s.seal_ids.assign(r.segments.begin(), r.segments.end());
      s.turns = r.turns;
      s.turn_ends = r.turn_ends;
      s.tools = r.tools;
      s.rest = Session::Rest{r.seals.back() + r.tail.size(), r.tail, r.messages, ""};
      c.sessions_[s.id] = std::move(s);
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
  // No lock: nothing else uses the catalog yet, and this reads files (adopt) and may rewrite the log.
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
      if (s.rest) continue;  // (open_state refuses another model while sessions are at rest)
      std::vector<ChatMessage> turns = s.messages;
      s.transcript.clear();
      s.seals.clear();
      s.seal_ids.clear();
      // Re-tokenize each turn from its text.
      for (size_t i = 0; i < turns.size(); i += 2) {
        auto d = turn_delta_locked(i / 2, turns[i].role, turns[i].content);
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
    for (const auto& [id, s] : sessions_) {
      if (!s.rest) files.insert(files.end(), s.seal_ids.begin(), s.seal_ids.end());
    }
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
  std::vector<const Session*> repaired;  // a transcript file unusable: recorded again below
  for (auto& [id, s] : sessions_) {
    SegmentId parent = kNoSegment;
    if (!find_def(s.bot) || !session_base_locked(s.bot, s.tools, &parent, nullptr).ok()) {
      if (s.rest) s.rest->damaged = "its bot \"" + s.bot + "\" cannot be restored";
      continue;
    }
    if (s.rest) {
      // At rest: its segments come back from the packs' index alone (no token to check them against:
      // the wake checks each record's count and hash); one that cannot is reported, never dropped.
      for (SegmentId seg : s.seal_ids) {
        Status st = pool_.adopt_at_rest(seg, parent, transcript_options(s), {});
        if (!st.ok()) {
          s.rest->damaged = "its transcript segment " + std::to_string(seg) + " is not in the cold packs (" + st.message() + ")";
          log_error("session \"" + s.id + "\" is at rest and " + s.rest->damaged + "; it is kept and cannot be served");
          break;
        }
        ++out.at_rest;
        parent = seg;
      }
      s.tail_segment = s.rest->damaged.empty() ? parent : kNoSegment;
      continue;
    }
    const bool named = s.seal_ids.size() == s.seals.size();
    // The session's last segments whose records are in the cold packs and whose KV files are gone
    // (it went to rest from its last turn up) come back at rest: no file, no tokens in the pool.
    size_t first_at_rest = s.seals.size();
    while (named && first_at_rest > 0) {
      const SegmentId id = s.seal_ids[first_at_rest - 1];
      std::error_code ec;
      if (id == kNoSegment || !pool_.packed(id) || std::filesystem::exists(pool_.file_path(id), ec)) break;
      --first_at_rest;
    }
    size_t at = 0;
    bool adopting = named;
    for (size_t i = 0; i < s.seals.size(); ++i) {
      const size_t end = s.seals[i];
      if (end <= at || end > s.transcript.size()) break;
      std::span<const int32_t> toks = std::span<const int32_t>(s.transcript).subspan(at, end - at);
      if (i >= first_at_rest) {
        Status st = pool_.adopt_at_rest(s.seal_ids[i], parent, transcript_options(s), toks);
        if (st.ok()) {
          ++out.at_rest;
          parent = s.seal_ids[i];
          at = end;
          continue;
        }
        log_warn("session \"" + s.id + "\": transcript segment " + std::to_string(i + 1) +
                 " cannot come back at rest (" + st.message() + "); it is recomputed on the session's next message");
        first_at_rest = s.seals.size();
      }
      // A segment without an id (kNoSegment): a start before this one found its file unusable.
      adopting = adopting && s.seal_ids[i] != kNoSegment;
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
        repaired.push_back(&s);
      }
      // Cold, with the same boundaries: the session's next message recomputes it, to the same bytes.
      SegmentOptions o = transcript_options(s);
      auto added = pool_.add_cold(parent, toks, o);
      if (!added.ok()) break;
      ++out.cold;
      parent = added.value();
      if (named) s.seal_ids[i] = kNoSegment;  // no file names it (it gets one once it is computed and recorded)
      at = end;
    }
    s.tail_segment = s.seals.empty() ? kNoSegment : parent;
  }
  const size_t garbage = pool_.collect_garbage();
  if (garbage) log_info("removed " + std::to_string(garbage) + " segment file(s) the state log does not name");
  size_t cold_at_rest = 0;
  for (const auto& [name, d] : defs_) cold_at_rest += !d.coded.empty();
  if (cold_at_rest) log_info(std::to_string(cold_at_rest) + " segment(s) restarted cold (each thaws on first use)");
  // Repaired once: a session whose transcript file cannot be used is recorded again, with that
  // segment and the ones after it named by no file (their files were removed just above), so the next
  // start neither looks for them nor logs them. Queued together: one sync for all.
  out.sessions_repaired = repaired.size();
  if (!rewrite && !repaired.empty()) {
    std::vector<std::future<Status>> durable;
    for (const Session* s : repaired) durable.push_back(queue_record_locked(snapshot_of(*s)));
    Status st;
    for (auto& d : durable) {
      const Status one = d.get();
      if (st.ok()) st = one;
    }
    if (st.ok()) log_info("recorded " + std::to_string(repaired.size()) + " session(s) without the transcript files that cannot be used");
    else log_error("cannot record the repaired sessions: " + st.message());
  }
  if (rewrite) {
    // The log is rewritten to the state served: another model's transcripts re-tokenized, or
    // sessions cut at a damaged record (their dropped turns must not come back later); repaired
    // sessions with them.
    if (Status st = store_.compact(live_records_locked()); !st.ok()) log_error("cannot rewrite the state log: " + st.message());
    for (auto& [id, s] : sessions_) s.cut = false;
    model_changed_ = false;
  }
  return out;
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
  for (const auto& [id, session] : sessions_) {
    // A turn whose record is queued (ahead of the compaction that takes this snapshot) is part of it.
    const Session* s = &session;
    Session with_turn;
    if (session.recording) {
      with_turn = session;
      (void)drop_oldest(with_turn, session.recording->dropped, session.recording->dropped_tokens);
      append_turn(with_turn, *session.recording);
      with_turn.turns = session.recording->n;
      s = &with_turn;
    }
    if (s->rest) live.push_back(rest_record_of(*s));
    else live.push_back(snapshot_of(*s));
  }
  return live;
}

size_t Catalog::live_estimate_locked() const {
  size_t n = 64;
  for (const auto& [k, d] : defs_) n += d.text.size() + d.coded.size() * 4 / 3 + 96;
  for (const auto& [k, s] : sessions_) {
    if (s.rest) n += s.rest->where.size() * 24 + s.seals.size() * 16;
    n += 128 + s.transcript.size() * 7;
    for (const auto& m : s.messages) n += m.content.size() + 32;
  }
  return n;
}

void Catalog::maybe_compact(bool now) {
  const uint64_t bytes = store_.bytes();  // never waits for the log's writer
  if (bytes < config_.compact_bytes && !now) return;
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> compacted = done->get_future();
  {
    std::lock_guard lock(mu_);
    if (live_estimate_locked() * 2 > bytes && !now) return;
    // Queued behind every record of the state it snapshots, ahead of every later one.
    store_.compact_async(live_records_locked(), [done](const Status& st) { done->set_value(st); });
  }
  if (Status st = compacted.get(); !st.ok()) {
    log_error("log compaction failed (the old log stays): " + st.message());
    return;
  }
  log_info("compacted the state log from " + format_size(bytes) + " to " + format_size(store_.bytes()));
}

std::string Catalog::cold_mismatch_locked(const SegmentDef& d, std::span<const int32_t> context) const {
  auto c = read_codec_container(d.coded);
  if (!c.ok()) return "is damaged (" + c.error() + ")";
  if (c->store.fingerprint != coder_fingerprint_) return "was coded with another model than the cold tier's coder";
  if (c->key.tokens != static_cast<int64_t>(d.tokens.size()) || !record_codes(c->record, d.tokens)) {
    return "codes other tokens (the text or the tokenizer changed)";
  }
  if (c->key != codec_segment_key(context, d.tokens)) return "was coded under another parent chain";
  return "";
}

std::future<Status> Catalog::record_tier_locked(SegmentDef& d, std::vector<uint8_t> coded) {
  auto f = queue_record_locked(record::SegmentTier{d.name, coded, now_s()});
  d.coded = std::move(coded);
  return f;
}

std::vector<std::string> Catalog::record_cold_tiers() {
  std::vector<std::pair<std::string, std::future<Status>>> queued;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, d] : defs_) {
      if (!d.coded.empty() || d.pool_id == kNoSegment) continue;
      auto info = pool_.info(d.pool_id);
      if (!info || info->tier != Tier::Cold) continue;
      std::vector<uint8_t> coded = pool_.coded(d.pool_id);
      if (coded.empty()) continue;
      queued.emplace_back(name, record_tier_locked(d, std::move(coded)));
    }
  }
  std::vector<std::string> names;
  for (auto& [name, durable] : queued) {
    if (Status st = durable.get(); !st.ok()) {
      log_error("cannot record segment \"" + name + "\" as cold: " + not_recorded("the tier", st).message());
      std::lock_guard lock(mu_);
      if (SegmentDef* d = find_def(name)) d->coded.clear();
      continue;
    }
    names.push_back(name);
  }
  return names;
}

Status Catalog::set_hot(const std::string& name) {
  std::future<Status> durable;
  {
    std::lock_guard lock(mu_);
    SegmentDef* d = find_def(name);
    if (!d) return no_segment(name);
    if (d->coded.empty()) return Status::Ok();
    durable = record_tier_locked(*d, {});
  }
  if (Status st = durable.get(); !st.ok()) return not_recorded("the tier", st);
  return Status::Ok();
}

Result<size_t> Catalog::encode_cold(const std::string& name, const Codec& codec, Forward& forward,
                                    const CodecOptions& options) {
  // The chain's tokens under the lock, the model without it, then the record if nothing changed.
  auto chain_tokens = [&](std::vector<int32_t>* context, std::vector<int32_t>* tokens) -> Status {
    auto chain = chain_locked(name);
    if (chain.empty()) return no_segment(name);
    for (SegmentDef* d : chain) {
      if (d->tokens.empty()) {
        if (Status st = tokenize_def_locked(*d); !st.ok()) return st.prefixed("segment \"" + d->name + "\": ");
      }
      if (d != chain.back()) context->insert(context->end(), d->tokens.begin(), d->tokens.end());
    }
    *tokens = chain.back()->tokens;
    return Status::Ok();
  };
  std::vector<int32_t> context, tokens;
  {
    std::lock_guard lock(mu_);
    if (Status st = chain_tokens(&context, &tokens); !st.ok()) return st;
  }
  auto coded = codec.encode(forward, context, tokens, options);
  if (!coded.ok()) return coded.status();
  const size_t bytes = coded->size();
  std::future<Status> durable;
  {
    std::lock_guard lock(mu_);
    std::vector<int32_t> context_now, tokens_now;
    if (Status st = chain_tokens(&context_now, &tokens_now); !st.ok()) return st;
    if (context_now != context || tokens_now != tokens) {
      return Status::Conflict("segment \"" + name + "\" changed while it was being coded; try again");
    }
    durable = record_tier_locked(*find_def(name), std::move(coded.value()));
  }
  if (Status st = durable.get(); !st.ok()) return not_recorded("the tier", st);
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

// Sessions and their turns: creation and removal, a turn's begin / prepare / finish (sealing the
// reply, recording the turn, moving the kept transcript up when old turns are dropped, letting go of
// the segments the session no longer uses), and session-less requests (the prompt cache).
#include <algorithm>
#include <future>
#include <set>

#include "daemon/catalog.h"
#include "daemon/catalog_internal.h"
#include "daemon/log.h"
#include "daemon/random_id.h"

namespace towers::daemon {

using namespace catalog_detail;

SegmentOptions Catalog::transcript_options(const Session& s) const {
  SegmentOptions o;
  o.format = config_.depth.transcript;
  o.label = "session:" + s.id;
  o.lineage = o.label;
  return o;
}

Result<SessionView> Catalog::create_session(const std::string& bot, const std::string& id) {
  std::promise<Result<SessionView>> created;
  auto f = created.get_future();
  create_session_async(bot, id, [&created](Result<SessionView> r) { created.set_value(std::move(r)); });
  return f.get();
}

void Catalog::create_session_async(const std::string& bot, const std::string& id_in, SessionCreated done) {
  Status refused;
  {
    std::lock_guard lock(mu_);
    refused = [&]() -> Status {
      const SegmentDef* b = find_def(bot);
      if (!b) return Status::NotFound("bot \"" + bot + "\" does not exist");
      if (b->level != Level::Bot) {
        return Status::InvalidArgument("segment \"" + bot + "\" is a " + std::string(to_string(b->level)) + ", not a bot");
      }
      if (static_cast<int>(sessions_.size()) >= config_.max_sessions) {
        return Status::ResourceExhausted("the session limit (limits.max_sessions = " +
                                         std::to_string(config_.max_sessions) + ") is reached");
      }
      const std::string id = id_in.empty() ? random_hex_id("s-") : id_in;
      if (!valid_name(id)) return Status::InvalidArgument("session id must be 1-64 characters of letters, digits, '-', '_', '.'");
      if (sessions_.count(id)) return Status::Conflict("session \"" + id + "\" exists already");
      Session s;
      s.id = id, s.bot = bot, s.created = s.updated = now_s();
      SessionView view = view_locked(sessions_[id] = s, false);
      // Queued under the lock (the log's order is the state's). The callback runs on the log's
      // completion thread, which nobody waits for, and takes the lock again only to undo.
      store_.append_async(record::SessionCreate{id, bot, s.created},
                          [this, id, created = s.created, view = std::move(view), done](const Status& st) {
                            if (st.ok()) return done(view);
                            {
                              std::lock_guard lock(mu_);
                              if (auto it = sessions_.find(id); it != sessions_.end() && it->second.created == created &&
                                                                it->second.turns == 0 && !it->second.busy) {
                                sessions_.erase(it);
                              }
                            }
                            done(not_recorded("the session", st));
                          });
      return Status::Ok();
    }();
  }
  if (!refused.ok()) done(refused);  // outside the lock: done answers a client
}

Status Catalog::delete_session(const std::string& id) {
  std::future<Status> durable;
  std::vector<SegmentId> remove;  // its transcript segments, leaves first
  std::optional<Session> gone;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return no_session(id);
    if (it->second.busy) return Status::Conflict("session \"" + id + "\" is generating a reply; try again when it is done");
    durable = queue_record_locked(record::SessionDelete{id});
    // Its transcript segments go unless another session's record names them (sessions with the same
    // history share segments): the leaves up to the first shared one.
    const std::set<SegmentId> shared = sessions_segments_locked(id);
    auto path = session_segments_locked(it->second);
    for (auto seg = path.rbegin(); seg != path.rend() && !shared.count(*seg); ++seg) remove.push_back(*seg);
    gone = std::move(it->second);
    sessions_.erase(it);
  }
  if (Status st = durable.get(); !st.ok()) {
    std::lock_guard lock(mu_);
    if (!sessions_.count(id)) sessions_[id] = std::move(*gone);
    return not_recorded("the removal", st);
  }
  remove_segments(remove);
  return Status::Ok();
}

Result<SessionView> Catalog::session(const std::string& id, bool with_transcript) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return no_session(id);
  if (with_transcript && it->second.rest) return rest_unavailable(id);
  return view_locked(it->second, with_transcript);
}

std::vector<SessionView> Catalog::sessions() const {
  std::lock_guard lock(mu_);
  std::vector<SessionView> out;
  for (const auto& [id, s] : sessions_) out.push_back(view_locked(s, false));
  return out;
}

Result<Catalog::Turn> Catalog::begin_turn(const std::string& session, const TurnInput& input, size_t reserve) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return no_session(session);
  Session& s = it->second;
  if (s.busy) return Status::Conflict("session \"" + session + "\" is already generating a reply");
  if (!find_def(s.bot)) return Status::Conflict("the session's bot \"" + s.bot + "\" no longer exists");
  if (s.rest) return rest_unavailable(session);
  Turn t;
  t.session = session;
  t.role = input.role;
  t.user = input.content;
  t.number = s.turns + 1;
  t.tools = s.tools;
  if (!input.tools.empty() && input.tools != s.tools) {
    // The tools are in the session's system block, below which its whole transcript was computed.
    if (!s.tools.empty()) {
      return Status::InvalidArgument("session \"" + session + "\" has other tools: a session's tools are part of its "
                                     "system block and fixed by its first turn; send the same tools, none (the "
                                     "session's stay), or start a new session");
    }
    if (s.turns > 0 || !s.transcript.empty()) {
      return Status::InvalidArgument("session \"" + session + "\" has turns without tools: a session's tools are part of "
                                     "its system block and given by its first turn; start a new session with them");
    }
    t.tools = input.tools;
    t.sets_tools = true;
  }
  auto delta = turn_delta_locked(s.messages.size() / 2, t.role, t.user);
  if (!delta.ok()) return delta.status();
  t.delta = std::move(delta.value());
  auto base_tokens = base_tokens_locked(s.bot, t.tools);
  if (!base_tokens.ok()) return base_tokens.status();
  const size_t base = base_tokens.value();
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
                                     std::to_string(limit) + " (" + prompt_limit_why() + ")");
  }
  s.busy = true;
  return t;
}

void Catalog::abort_turn(const std::string& session) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) it->second.busy = false;
}

Result<Catalog::BasePlan> Catalog::base_plan_locked(const std::string& bot, const std::string& tools) {
  BasePlan plan;
  plan.chain = bot;
  if (tools.empty()) return plan;
  const SegmentDef* b = find_def(bot);
  if (!b) return no_segment(bot);
  auto defs = parse_tools_json(tools);
  if (!defs.ok()) return defs.status();
  auto block = tools_block(tool_format_for(prompts_.family()), defs.value());
  if (!block.ok()) return block.status();
  auto segment = prompts_.tools_segment(block.value());
  if (!segment.ok()) return segment.status();
  if (block->place == ToolsBlock::Place::SystemEnd) {
    // The tools close the system block: the bot's level goes in open, under its parent.
    auto open = prompts_.level(b->text, b->parent.empty(), /*closes=*/false);
    if (!open.ok()) return open.status();
    plan.chain = b->parent;
    plan.pieces.push_back(std::move(open.value()));
    plan.labels.push_back("bot-open:" + bot);
  }
  plan.pieces.push_back(std::move(segment.value()));
  plan.labels.push_back("tools:" + bot);
  return plan;
}

Status Catalog::session_base_locked(const std::string& bot, const std::string& tools, SegmentId* id,
                                    std::vector<int32_t>* base) {
  auto plan = base_plan_locked(bot, tools);
  if (!plan.ok()) return plan.status();
  SegmentId parent = kNoSegment;
  if (!plan->chain.empty()) {
    if (Status st = ensure_chain_locked(plan->chain, &parent, base); !st.ok()) return st;
  }
  for (size_t i = 0; i < plan->pieces.size(); ++i) {
    SegmentOptions o;
    o.label = plan->labels[i];
    auto added = pool_.add_cold(parent, plan->pieces[i], o);  // the same tokens under the same parent: the same segment
    if (!added.ok()) return added.status().prefixed("session tools: ");
    parent = added.value();
    if (base) base->insert(base->end(), plan->pieces[i].begin(), plan->pieces[i].end());
  }
  if (id) *id = parent;
  return Status::Ok();
}

Result<size_t> Catalog::base_tokens_locked(const std::string& bot, const std::string& tools) {
  auto plan = base_plan_locked(bot, tools);
  if (!plan.ok()) return plan.status();
  size_t n = 0;
  for (SegmentDef* d : chain_locked(plan->chain)) {
    if (d->tokens.empty()) {
      if (Status st = tokenize_def_locked(*d); !st.ok()) return st;
    }
    n += d->tokens.size();
  }
  for (const auto& p : plan->pieces) n += p.size();
  return n;
}

Result<std::vector<int32_t>> Catalog::turn_delta_locked(size_t n_before, const std::string& role,
                                                        const std::string& content) const {
  if (role == "user") return prompts_.last_turn(true, n_before + 1, content);
  if (role != "tool") return Status::InvalidArgument("a session turn brings a user message or tool results, not \"" + role + "\"");
  if (n_before == 0) return Status::InvalidArgument("tool results answer a reply's tool calls, and the session has no reply yet");
  auto results = parse_tool_results_json(content);
  if (!results.ok()) return results.status();
  auto rendered = render_tool_messages(prompts_.family(), results.value(), {}, ToolChoice{ToolChoice::Mode::None, ""}, "");
  if (!rendered.ok()) return rendered.status();
  return prompts_.next_turn(true, n_before, rendered.value());
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

Status Catalog::shift_kept_locked(Session& s, SegmentId base_id, size_t drop_tokens, std::vector<SegmentId>* derive) {
  SegmentId parent = base_id;
  size_t at = 0;              // where the old segment starts in the transcript
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
      s.shifted.push_back(id.value());
      if (o.derive_from != kNoSegment) derive->push_back(id.value());  // shifted at once when the old one is in memory
      parent = id.value();
    }
    at = end;
  }
  return Status::Ok();  // tokens after the last seal (a reply that was not sealed) are prefilled with the message
}

Result<std::vector<int32_t>> Catalog::prepare_turn(const Turn& t) {
  std::vector<int32_t> prompt;
  std::vector<SegmentId> derive;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(t.session);
    if (it == sessions_.end()) return Status::NotFound("session \"" + t.session + "\" was removed");
    Session& s = it->second;
    SegmentId base_id;
    if (Status st = session_base_locked(s.bot, t.tools, &base_id, &prompt); !st.ok()) return st;
    if (t.drop_tokens > 0) {
      if (Status st = shift_kept_locked(s, base_id, t.drop_tokens, &derive); !st.ok()) return st;
    } else if (Status st = ensure_session_locked(s, base_id); !st.ok()) {
      return st;
    }
    prompt.insert(prompt.end(), s.transcript.begin() + static_cast<std::ptrdiff_t>(t.drop_tokens), s.transcript.end());
    prompt.insert(prompt.end(), t.delta.begin(), t.delta.end());
  }
  // The shifts whose old segment is in memory now, without the lock (a copy of its rows); the
  // scheduler pages in (or builds) the others and shifts them before the tower is assembled.
  for (SegmentId id : derive) (void)pool_.derive(id);
  return prompt;
}

void Catalog::finish_turn(const Turn& t, const GenOutcome& out, Lease* lease, const std::string& reply_text,
                          std::function<void(const Status&)> done) {
  const bool failed = !out.error.ok() || out.finish_reason == FinishReason::Cancelled || !lease;
  size_t base_len = 0;
  SegmentOptions options;
  std::vector<size_t> seals;
  std::vector<SegmentId> seal_ids;
  SegmentId tail = kNoSegment;
  uint64_t n = 0;
  std::vector<SegmentId> unused;  // a failed turn's shifted segments
  bool missing = false;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(t.session);
    if (it == sessions_.end()) {
      missing = true;
    } else if (failed) {
      Session& s = it->second;
      s.busy = false;
      const std::set<SegmentId> others = s.shifted.empty() ? std::set<SegmentId>{} : sessions_segments_locked(s.id);
      for (auto seg = s.shifted.rbegin(); seg != s.shifted.rend(); ++seg) {
        if (!others.count(*seg)) unused.push_back(*seg);
      }
      s.shifted.clear();
    } else {
      const Session& s = it->second;
      auto base_tokens = base_tokens_locked(s.bot, t.tools);
      base_len = base_tokens.ok() ? base_tokens.value() : 0;
      options = transcript_options(s);
      seals = s.seals;
      seal_ids = s.seal_ids;
      tail = s.tail_segment;
      n = s.turns + 1;
    }
  }
  if (missing) {
    if (done) done(Status::NotFound("session \"" + t.session + "\" was removed"));
    return;
  }
  if (failed) {
    remove_segments(unused);
    if (done) done(out.error.ok() ? Status::Cancelled("the reply was cancelled") : out.error);
    return;
  }
  // Seal what was evaluated so the next turn starts from it (a copy of the tail's KV: without the
  // lock). The seals are the lease's chain after the bot's segments (the tower the turn ran on, plus
  // the sealed tail): never the old seals, which do not fit the transcript once turns were dropped.
  if (!out.tail.empty()) {
    auto id = pool_.seal(*lease, out.tail, options);
    if (!id.ok()) log_warn("session \"" + t.session + "\": cannot seal the reply: " + id.error());
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
  record::SessionTurn rec{t.session, n,          t.drop_turns, t.drop_tokens, t.user,
                          reply_text, t.delta,   out.tokens,   seals,         std::vector<uint64_t>(seal_ids.begin(), seal_ids.end()),
                          now_s(),   t.role == "user" ? "" : t.role, t.sets_tools ? t.tools : ""};
  // Segments the record names that no prefill could give back (the kept turns, RoPE-shifted after a
  // drop): the record waits for their files, so a crash never leaves it naming one that is missing.
  // The others are recomputed from the log's tokens, to the same bytes, when their file is missing.
  std::vector<SegmentId> derived;
  for (SegmentId p : seal_ids) {
    auto info = pool_.info(p);
    if (info && info->derived) derived.push_back(p);
  }
  // The turn joins the session once it is durable (on the log's completion thread); the session
  // stays busy until then, so no other turn can interleave.
  auto settle = std::make_shared<std::function<void(const Status&)>>([this, rec, tail, done = std::move(done)](const Status& st) {
    std::vector<SegmentId> unused;
    {
      std::lock_guard lock(mu_);
      auto it = sessions_.find(rec.id);
      if (it != sessions_.end()) {
        Session& s = it->second;
        s.busy = false;
        s.recording.reset();
        std::vector<SegmentId> before = session_segments_locked(s);  // root first
        before.insert(before.begin(), s.seal_ids.begin(), s.seal_ids.end());
        std::set<SegmentId> kept;
        if (st.ok()) {
          (void)drop_oldest(s, rec.dropped, rec.dropped_tokens);
          append_turn(s, rec);
          s.tail_segment = tail;
          s.turns = rec.n;
          kept.insert(rec.segments.begin(), rec.segments.end());
        } else {
          log_error("session \"" + rec.id + "\": cannot record the turn: " + st.message());
          s.tail_segment = kNoSegment;  // rebuilt from the recorded transcript on the next turn
          kept.insert(s.seal_ids.begin(), s.seal_ids.end());
          before = s.shifted;
        }
        // What the session no longer uses goes (leaves first): after a drop, the chain it moved up
        // from; after a failure, the segments the move added. Otherwise every turn past the context
        // would leave a copy of the kept transcript behind.
        kept.insert(s.modular_sources.begin(), s.modular_sources.end());
        std::set<SegmentId> seen;
        for (auto seg = before.rbegin(); seg != before.rend(); ++seg) {
          if (*seg != kNoSegment && !kept.count(*seg) && seen.insert(*seg).second) unused.push_back(*seg);
        }
        if (!unused.empty()) {  // (only then: this looks at every session)
          const std::set<SegmentId> others = sessions_segments_locked(s.id);
          std::erase_if(unused, [&](SegmentId seg) { return others.count(seg) > 0; });
        }
        s.shifted.clear();
      }
    }
    remove_segments(unused);
    if (done) done(st.ok() ? st : not_recorded("the reply", st));
  });
  // Queued under the lock, so that a compaction queued later snapshots the session with this turn
  // (and one queued earlier is followed by it in the log).
  auto record = [this, rec, settle](const Status& files) {
    if (!files.ok()) return (*settle)(files.prefixed("a moved transcript segment has no file: "));
    std::lock_guard lock(mu_);
    if (auto it = sessions_.find(rec.id); it != sessions_.end()) it->second.recording = std::make_shared<const record::SessionTurn>(rec);
    store_.append_async(rec, [settle](const Status& st) { (*settle)(st); });
  };
  if (derived.empty()) record(Status::Ok());
  else pool_.when_durable(derived, std::move(record));
}

Result<Catalog::Stateless> Catalog::begin_stateless(const std::string& bot, std::vector<ChatMessage> messages,
                                                    const std::string& tools) {
  Stateless s;
  s.bot = bot;
  s.tools = tools;
  std::lock_guard lock(mu_);
  if (!bot.empty()) {
    const SegmentDef* b = find_def(bot);
    if (!b) return Status::NotFound("bot \"" + bot + "\" does not exist");
    if (b->level != Level::Bot) {
      return Status::InvalidArgument("segment \"" + bot + "\" is a " + std::string(to_string(b->level)) + ", not a bot");
    }
  } else if (!tools.empty()) {
    return Status::InvalidArgument("internal: session-less tools without a bot go in the system block");
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
  const bool plain = std::all_of(s.turns.begin(), s.turns.end(), [](const ChatMessage& m) {
    return m.role == "user" || m.role == "assistant";
  });
  // Turns of other roles (tool results) render where the template puts them, after the system block.
  auto rest = plain && tools.empty() ? prompts_.turns(!bot.empty() || s.system.has_value(), s.turns)
                                     : prompts_.next_turn(!bot.empty() || s.system.has_value(), 0, s.turns);
  if (!rest.ok()) return rest.status();
  s.rest = std::move(rest.value());
  size_t base = 0;
  if (!bot.empty()) {
    auto n = base_tokens_locked(bot, tools);
    if (!n.ok()) return n.status();
    base = n.value();
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
    if (Status st = session_base_locked(s.bot, s.tools, &id, &prompt); !st.ok()) return st;
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
  std::vector<SegmentId> old;
  {
    std::lock_guard lock(mu_);
    if (std::find(prompt_cache_.begin(), prompt_cache_.end(), id.value()) != prompt_cache_.end()) return;
    prompt_cache_.push_back(id.value());
    while (prompt_cache_.size() > static_cast<size_t>(config_.prompt_cache_segments)) {
      old.push_back(prompt_cache_.front());
      prompt_cache_.pop_front();
    }
  }
  // Refused while used or extended: then it stays until the budget moves it.
  for (SegmentId seg : old) (void)pool_.remove(seg);
}

}  // namespace towers::daemon

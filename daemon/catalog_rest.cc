// Sessions at rest (daemon/catalog.h): a session whose transcript lives only in its segments' coded
// records goes to rest (rest_sessions) and comes back by decoding them (wake_session).
#include <chrono>
#include <future>
#include <set>

#include "daemon/catalog.h"
#include "daemon/catalog_internal.h"
#include "daemon/log.h"
#include "daemon/rest_text.h"

namespace towers::daemon {

using namespace catalog_detail;

namespace {
// Its text and tokens go (their memory too); `rest` says where they come back from.
void put_at_rest(Session& s, Session::Rest rest) {
  s.rest = std::move(rest);
  std::vector<ChatMessage>().swap(s.messages);
  std::vector<int32_t>().swap(s.transcript);
}
}  // namespace

size_t Catalog::rest_sessions() {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (auto& [id, s] : sessions_) {
    if (s.rest || s.busy || s.recording || !s.shifted.empty() || !s.modular_sources.empty() || s.seals.empty() ||
        s.seal_ids.size() != s.seals.size() || s.seals.back() > s.transcript.size() || s.cut ||
        s.turn_ends.size() * 2 != s.messages.size() ||  // (an older log's session: its turn ends unknown)
        !pool_.at_rest(s.seal_ids.back())) {  // (segments go to rest leaves first: none of its are)
      continue;
    }
    SegmentId parent = kNoSegment;
    if (!find_def(s.bot) || !session_base_locked(s.bot, s.tools, &parent, nullptr).ok()) continue;
    // Every segment at rest, durable in the packs, coding exactly its part of the transcript under
    // the one before it: then the records give the tokens back, and nothing else need keep them.
    bool coded = true;
    size_t at = 0;
    for (size_t i = 0; coded && i < s.seals.size(); at = s.seals[i++]) {
      const SegmentId seg = s.seal_ids[i];
      coded = seg != kNoSegment && s.seals[i] > at &&
              pool_.rests_as(seg, parent, std::span<const int32_t>(s.transcript).subspan(at, s.seals[i] - at));
      parent = seg;
    }
    if (!coded) continue;
    const std::string text = model_.tokenizer().decode(s.transcript);
    Session::Rest rest;
    rest.tokens = s.transcript.size();
    rest.tail.assign(s.transcript.begin() + static_cast<std::ptrdiff_t>(s.seals.back()), s.transcript.end());
    rest.where = locate_messages(text, s.messages);
    put_at_rest(s, std::move(rest));
    ++n;
  }
  return n;
}

bool Catalog::at_rest(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.rest.has_value();
}

std::vector<std::string> Catalog::sessions_at_rest_below(const std::string& name) const {
  std::lock_guard lock(mu_);
  return sessions_at_rest_below_locked(name);
}

std::vector<std::string> Catalog::sessions_at_rest_below_locked(const std::string& name) const {
  std::set<std::string> below = {name};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [n, d] : defs_) {
      if (!below.count(n) && below.count(d.parent)) grew = below.insert(n).second;
    }
  }
  std::vector<std::string> out;
  for (const auto& [id, s] : sessions_) {
    if (s.rest && below.count(s.bot)) out.push_back(id);
  }
  return out;
}

Status Catalog::unrest_locked(Session& s) {
  if (pool_.at_rest(s.seal_ids.back())) return Status::Unavailable("its last segment went back to rest");
  auto seq = pool_.sequence(s.seal_ids.back());
  if (!seq.ok()) return seq.status();
  const size_t sealed = s.seals.back();
  if (seq->size() < sealed || sealed + s.rest->tail.size() != s.rest->tokens) {
    return Status::Corruption("its decoded transcript has " + std::to_string(seq->size()) + " tokens with its base; " +
                              std::to_string(sealed) + " recorded");
  }
  std::vector<int32_t> transcript(seq->end() - static_cast<std::ptrdiff_t>(sealed), seq->end());
  transcript.insert(transcript.end(), s.rest->tail.begin(), s.rest->tail.end());
  auto messages = messages_at(model_.tokenizer().decode(transcript), s.rest->where);
  if (!messages.ok()) return messages.status();
  s.transcript = std::move(transcript);
  s.messages = std::move(messages.value());
  s.tail_segment = s.seal_ids.back();
  s.rest.reset();
  return Status::Ok();
}

Status Catalog::wake_session(const std::string& id) {
  const auto started = std::chrono::steady_clock::now();
  // A woken segment may go back to rest before its tokens are read here (the compressor runs
  // beside): then it is decoded again, a few times at most.
  for (int attempt = 0; attempt < 3; ++attempt) {
    SegmentId tail = kNoSegment;
    {
      std::lock_guard lock(mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) return no_session(id);
      const Session& s = it->second;
      if (!s.rest) return Status::Ok();
      if (!s.rest->damaged.empty()) return Status::Corruption("session \"" + id + "\" is at rest and " + s.rest->damaged);
      tail = s.seal_ids.back();
      if (attempt == 0) {
        log_info("waking session \"" + id + "\" from rest: decoding its " + std::to_string(s.rest->tokens) +
                 " transcript tokens");
      }
    }
    const Status woke = waker_ ? waker_(tail) : pool_.wake(tail).status();
    if (!woke.ok()) return woke.prefixed("session \"" + id + "\": its transcript cannot be decoded: ");
    std::future<Status> durable;
    std::optional<Session::Rest> was;
    {
      std::lock_guard lock(mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) return no_session(id);
      Session& s = it->second;
      if (!s.rest) return Status::Ok();  // woken by another request meanwhile
      was = s.rest;
      if (Status st = unrest_locked(s); !st.ok()) {
        if (st.code() == Status::Code::kNotFound || st.code() == Status::Code::kUnavailable) continue;
        s.rest->damaged = "its decoded records do not give its transcript back (" + st.message() + ")";
        log_error("session \"" + id + "\" " + s.rest->damaged);
        return Status::Corruption("session \"" + id + "\" is at rest and " + s.rest->damaged);
      }
      // Whole again in the log before any turn follows it (a turn never replays onto a session at rest).
      durable = queue_record_locked(snapshot_of(s));
    }
    if (Status st = durable.get(); !st.ok()) {
      std::lock_guard lock(mu_);
      if (auto it = sessions_.find(id); it != sessions_.end() && !it->second.busy && !it->second.rest) {
        put_at_rest(it->second, std::move(*was));
      }
      return not_recorded("the woken session", st);
    }
    log_info("session \"" + id + "\" woken from rest in " +
             std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()) + " s");
    return Status::Ok();
  }
  return Status::Unavailable("session \"" + id + "\" went back to rest while it was being woken; try again");
}

}  // namespace towers::daemon

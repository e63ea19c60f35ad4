// The tiers of the pool: paging warm segments in (one batch per path, off the lock), releasing them
// under the RAM budget (eviction policy from mmapstore/eviction.h), deleting files under the disk
// budget, and the cold tier (freeze to coded tokens, thaw by prefill). See segment_pool.h.
#include <algorithm>

#include "engine/base/no_wait_lock.h"
#include "mmapstore/eviction.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_pool.h"
#include "mmapstore/segment_pool_entry.h"
#include "mmapstore/segment_writer.h"

namespace towers {

Status SegmentPool::page_in(std::span<const SegmentId> ids) {
  check_may_wait("SegmentPool::page_in");
  struct Job {
    SegmentExpect expect;
    std::vector<int32_t> tokens;
    uint64_t context_xxh3 = 0;
    std::shared_ptr<SegmentFile> file;
    std::shared_ptr<const Segment> segment;
    Status status;
  };
  std::vector<Job> jobs;
  {
    std::lock_guard lock(mu_);
    for (SegmentId id : ids) {
      auto it = entries_.find(id);
      if (it == entries_.end() || it->second->tier() != Tier::Warm || it->second->loading) continue;
      Entry& e = *it->second;
      auto seq = trie_.sequence(id);
      if (!seq.ok()) continue;
      Job j;
      j.expect.id = id;
      j.expect.parent = e.parent;
      j.expect.computed_pos = e.computed_pos;
      j.expect.format = e.format;
      j.context_xxh3 = xxh3_tokens(std::span<const int32_t>(seq.value()).first(e.computed_pos));
      j.tokens.assign(seq.value().begin() + e.computed_pos, seq.value().end());
      e.loading = true;
      (void)trie_.acquire(id);  // nobody removes it while the lock is down
      jobs.push_back(std::move(j));
    }
  }
  if (jobs.empty()) return Status::Ok();
  for (Job& j : jobs) {  // without the lock: map, fault every page in, verify once
    j.expect.tokens = j.tokens;
    j.expect.context_xxh3 = j.context_xxh3;
    auto f = SegmentFile::open(file_path(j.expect.id), model_.config(), options_.model_fingerprint, &j.expect);
    if (!f.ok()) {
      j.status = f.status();
      continue;
    }
    f.value()->populate();
    // Every page-in checks the payload (XXH3 runs at memory speed): bytes that changed on disk since
    // they were last read are never served.
    j.status = f.value()->verify();
    if (j.status.ok()) {
      auto s = f.value()->segment(model_.config());
      if (s.ok()) j.file = f.value(), j.segment = s.value();
      else j.status = s.status();
    }
  }
  Status failed;
  std::lock_guard lock(mu_);
  for (Job& j : jobs) {
    Entry& e = *entries_.at(j.expect.id);
    e.loading = false;
    (void)trie_.release(j.expect.id);
    if (!j.status.ok()) {
      // A bad file is never served: the segment goes cold (a build recomputes it) and the file goes.
      counters_.page_in_error = j.status.message();
      failed = Status::Corruption("cannot page in segment " + std::to_string(e.id) + ": " + j.status.message());
      delete_file_locked(e);
      // A derived segment's KV is lost with its file: the build that comes next (a prefill) defines it.
      e.derived = false;
      continue;
    }
    e.segment = std::move(j.segment);
    e.file = std::move(j.file);
    e.verified = true;
    counters_.page_ins++;
  }
  assert_invariants_locked();
  return failed;
}

void SegmentPool::delete_file_locked(Entry& e) {
  mu_.assert_held();
  e.file.reset();
  if (e.durable || e.writing) (void)fs_.remove(file_path(e.id));  // a write in flight is removed by on_written
  e.durable = false;
  e.verified = false;
  e.file_bytes = 0;
}

void SegmentPool::drop_kv_locked(Entry& e) {
  mu_.assert_held();
  if (e.file) e.file->release();
  e.segment.reset();
  e.file.reset();
}

size_t SegmentPool::resident_locked() const {
  mu_.assert_held();
  size_t n = tail_bytes_;
  for (const auto& [id, e] : entries_) n += e->resident_bytes();
  return n;
}

// Every entry that `may_leave` admits, described for the eviction policy (mmapstore/eviction.h), with
// `bytes` what its leaving frees. Segments of one owner are one lineage (SegmentOptions::lineage,
// e.g. a session's transcript): their age is the owner's age.
template <typename MayLeave, typename Bytes>
std::vector<EvictionCandidate> SegmentPool::candidates_locked(MayLeave may_leave, Bytes bytes) const {
  mu_.assert_held();
  struct Lineage {
    std::chrono::steady_clock::time_point born = std::chrono::steady_clock::time_point::max();
    uint64_t uses = 0;
  };
  std::map<std::string, Lineage> lineages;
  for (const auto& [id, e] : entries_) {
    if (e->lineage.empty()) continue;
    Lineage& l = lineages[e->lineage];
    l.born = std::min(l.born, e->created);
    l.uses += e->hits;
  }
  std::vector<EvictionCandidate> candidates;
  for (const auto& [id, e] : entries_) {
    if (!may_leave(*e)) continue;
    auto info = trie_.info(id);
    if (!info.ok()) continue;
    EvictionCandidate c;
    c.id = id;
    c.bytes = bytes(*e);
    c.tokens = e->length;
    c.depth = depth_locked(id);
    c.pinned = e->pinned;
    c.leases = info.value().refcount;
    c.fan_out = info.value().fan_out;
    c.has_children = info.value().fan_out > 0 || info.value().children > 0;
    c.created = e->created;
    c.last_used = e->last_used;
    c.uses = e->hits;
    if (auto l = lineages.find(e->lineage); l != lineages.end()) {
      c.lineage = std::hash<std::string>{}(e->lineage) | 1;
      c.lineage_born = l->second.born;
      c.lineage_uses = l->second.uses;
    }
    candidates.push_back(c);
  }
  return candidates;
}

EvictionRules SegmentPool::eviction_rules_locked() const {
  mu_.assert_held();
  EvictionRules rules;
  rules.policy = options_.eviction;
  rules.now = std::chrono::steady_clock::now();
  rules.pin_fan_out = options_.pin_fan_out;
  return rules;
}

size_t SegmentPool::enforce_budget() {
  check_may_wait("SegmentPool::enforce_budget");
  std::lock_guard lock(mu_);
  if (options_.ram_budget_bytes == 0) return 0;
  size_t resident = resident_locked();
  if (resident <= options_.ram_budget_bytes) return 0;
  const bool store = !options_.store_dir.empty();
  // Only what holds memory and can leave it: in memory, not being paged in, and with a durable file
  // to come back from (or, without a store, gone for good; a derived segment could not be computed
  // again).
  const auto candidates = candidates_locked(
      [store](const Entry& e) { return e.segment && !e.loading && (store ? e.durable : !e.derived); },
      [](const Entry& e) { return e.resident_bytes(); });
  EvictionRules rules = eviction_rules_locked();
  rules.leaves_only = !store;
  size_t moved = 0;
  for (SegmentId id : choose_victims(candidates, rules, resident - options_.ram_budget_bytes)) {
    Entry& victim = *entries_.at(id);
    const size_t bytes = victim.resident_bytes();
    if (store) {
      drop_kv_locked(victim);
      counters_.page_outs++;
    } else {
      if (!trie_.evict(id).ok()) continue;
      counters_.evictions++;
      entries_.erase(id);
    }
    resident -= bytes;
    ++moved;
  }
  assert_invariants_locked();
  return moved;
}

size_t SegmentPool::disk_bytes_locked() const {
  mu_.assert_held();
  size_t on_disk = 0;
  for (const auto& [id, e] : entries_) {
    if (e->durable) on_disk += e->file_bytes;
  }
  return on_disk;
}

size_t SegmentPool::disk_over_budget() const {
  std::lock_guard lock(mu_);
  if (options_.disk_budget_bytes == 0) return 0;
  const size_t on_disk = disk_bytes_locked();
  return on_disk > options_.disk_budget_bytes ? on_disk - options_.disk_budget_bytes : 0;
}

size_t SegmentPool::enforce_disk_budget(double slack) {
  check_may_wait("SegmentPool::enforce_disk_budget");
  std::lock_guard lock(mu_);
  if (options_.disk_budget_bytes == 0) return 0;
  size_t on_disk = disk_bytes_locked();
  const auto limit = static_cast<size_t>(static_cast<double>(options_.disk_budget_bytes) * std::max(1.0, slack));
  if (on_disk <= limit) return 0;
  // Warm files go cold in the policy's order, as RAM's victims do. A derived segment's file is its
  // only copy: no prefill would give its KV back.
  const auto candidates = candidates_locked(
      [](const Entry& e) { return e.durable && e.tier() == Tier::Warm && !e.loading && !e.derived; },
      [](const Entry& e) { return e.file_bytes; });
  size_t frozen = 0;
  for (SegmentId id : choose_victims(candidates, eviction_rules_locked(), on_disk - options_.disk_budget_bytes)) {
    Entry& e = *entries_.at(id);
    on_disk -= e.file_bytes;
    delete_file_locked(e);
    counters_.freezes++;
    ++frozen;
  }
  assert_invariants_locked();
  return frozen;
}

std::vector<SegmentId> SegmentPool::idle(std::chrono::steady_clock::duration idle_for) const {
  std::lock_guard lock(mu_);
  const auto cutoff = std::chrono::steady_clock::now() - idle_for;
  // Pinned, leased and high fan-out segments are the policy's to keep out (evictable()).
  const auto candidates = candidates_locked(
      [cutoff](const Entry& e) { return !e.derived && e.tier() != Tier::Cold && e.last_used <= cutoff; },
      [](const Entry& e) { return std::max(e.file_bytes, e.kv_bytes); });
  return eviction_order(candidates, eviction_rules_locked());
}

Status SegmentPool::freeze(SegmentId id, std::vector<uint8_t> coded) {
  check_may_wait("SegmentPool::freeze");
  std::unique_lock lock(mu_);
  if (rest_.find(id)) return Status::Conflict("segment " + std::to_string(id) + " is cold already (at rest)");
  auto it = entries_.find(id);
  if (it == entries_.end()) return Status::NotFound("unknown segment " + std::to_string(id));
  Entry& e = *it->second;
  auto info = trie_.info(id);
  if (!info.ok()) return info.status();
  if (info.value().refcount > 0 || e.loading) return Status::Conflict("segment " + std::to_string(id) + " is in use");
  if (e.pinned || info.value().fan_out >= options_.pin_fan_out) {
    return Status::Conflict("segment " + std::to_string(id) + " is pinned");
  }
  if (e.tier() == Tier::Cold) return Status::Conflict("segment " + std::to_string(id) + " is cold already");
  if (e.derived) {
    return Status::Conflict("segment " + std::to_string(id) +
                            " is a shifted copy (derived): no prefill would give its KV back, so it never goes cold");
  }
  drop_kv_locked(e);
  delete_file_locked(e);
  e.coded = std::move(coded);
  e.coded.shrink_to_fit();  // kept for as long as the segment is cold: no slack (the coder's doubled ~2x)
  counters_.freezes++;
  rest_locked(id);  // out of the trie (and its parents with it) when nothing there needs its tokens
  assert_invariants_locked();
  lock.unlock();
  pack_resting();  // what went to rest, into the cold packs (then out of RAM)
  return Status::Ok();
}

Status SegmentPool::thaw(SegmentId id) {
  check_may_wait("SegmentPool::thaw");
  return compute_chain(id, kNoSegment);
}

Status SegmentPool::compute_chain(SegmentId id, SegmentId fresh) {
  std::vector<SegmentId> ids;
  if (auto woken = wake(id); !woken.ok()) return woken.status();  // at rest: decoded back into the trie
  {
    std::lock_guard lock(mu_);
    if (rest_.find(id)) return Status::Unavailable("segment " + std::to_string(id) + " went to rest again");
    if (!entries_.count(id)) return Status::NotFound("unknown segment " + std::to_string(id));
    ids = chain_ids_locked(id);
  }
  Status paged = page_in(ids);  // a bad file leaves its segment cold: the loop below recomputes it
  std::unique_lock lock(mu_);
  for (SegmentId s : ids) {
    if (rest_.find(s)) return Status::Unavailable("segment " + std::to_string(s) + " went to rest again");
    auto it = entries_.find(s);
    if (it == entries_.end()) return Status::NotFound("segment " + std::to_string(s) + " left the pool");
    if (it->second->tier() == Tier::Warm) return paged.ok() ? Status::Unavailable("segment is being paged in") : paged;
    if (it->second->tier() != Tier::Cold) continue;
    if (const SegmentId from = it->second->derive_from; from != kNoSegment) {
      // Shifted rows of another segment: that one in memory first (paged in, or computed itself).
      lock.unlock();
      Status src = compute_chain(from, kNoSegment);
      lock.lock();
      Status st = src.ok() ? derive_locked(s, lock) : src;
      if (st.ok() || st.code() != Status::Code::kNotFound) {
        if (!st.ok()) return st;
        continue;
      }
      // Its source left the pool: computed by prefill like any other.
      if (!entries_.count(s)) return st;
    }
    if (Status st = prefill_under_chain(s, s != fresh, lock); !st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace towers

#include "mmapstore/segment_pool.h"

#include <algorithm>

#include "mmapstore/segment_file.h"

namespace towers {

struct SegmentPool::Entry {
  std::shared_ptr<const Segment> segment;  // null while warm
  SegmentId id = kNoSegment, parent = kNoSegment;
  int32_t length = 0, computed_pos = 0;
  KvQuant format = KvQuant::F32;
  size_t kv_bytes = 0;
  std::filesystem::path file;  // written once, kept while the segment lives
  std::vector<uint8_t> coded;  // cold: the compressor's coded tokens
  Tier tier() const { return segment ? Tier::Hot : (file.empty() ? Tier::Cold : Tier::Warm); }
  std::string label;
  bool pinned = false;
  uint64_t hits = 0;
  std::chrono::steady_clock::time_point created, last_used;
};

std::string_view to_string(Tier t) {
  switch (t) {
    case Tier::Hot: return "hot";
    case Tier::Warm: return "warm";
    case Tier::Cold: return "cold";
  }
  return "?";
}

std::string_view to_string(EvictionPolicy p) { return p == EvictionPolicy::Lindy ? "lindy" : "lru"; }

std::optional<EvictionPolicy> parse_eviction_policy(std::string_view s) {
  if (s == "lru") return EvictionPolicy::Lru;
  if (s == "lindy") return EvictionPolicy::Lindy;
  return std::nullopt;
}

SegmentPool::SegmentPool(const Model& model, Forward& forward, PoolOptions options)
    : model_(model), forward_(forward), options_(std::move(options)) {
  if (!options_.warm_dir.empty()) reader_ = std::make_unique<FileReader>();
}

// Warm files are this pool's spill space, not a store: they go with it (persistence is the daemon's log).
SegmentPool::~SegmentPool() {
  for (auto& [id, e] : entries_) drop_file(*e);
}

Result<std::vector<std::shared_ptr<const Segment>>> SegmentPool::chain_locked(SegmentId id,
                                                                           std::unique_lock<std::mutex>& lock) {
  std::vector<SegmentId> ids;
  for (SegmentId at = id; at != kNoSegment;) {
    auto it = entries_.find(at);
    if (it == entries_.end()) return Status::Error("internal: segment " + std::to_string(at) + " missing from the pool");
    ids.push_back(at);
    at = it->second->parent;
  }
  std::reverse(ids.begin(), ids.end());
  if (Status st = page_in_locked(ids); !st.ok()) return st;
  if (Status st = thaw_locked(ids, lock); !st.ok()) return st;
  std::vector<std::shared_ptr<const Segment>> chain;
  for (SegmentId i : ids) {
    auto it = entries_.find(i);
    if (it == entries_.end() || !it->second->segment) return Status::Error("segment " + std::to_string(i) + " left the pool");
    chain.push_back(it->second->segment);
  }
  return chain;
}

Status SegmentPool::thaw_locked(std::span<const SegmentId> ids, std::unique_lock<std::mutex>& lock) {
  std::vector<SegmentId> todo;
  for (SegmentId id : ids) {
    if (entries_.at(id)->tier() == Tier::Cold) todo.push_back(id);
  }
  if (todo.empty()) return Status::Ok();
  std::vector<SegmentId> pinned(ids.begin(), ids.end());
  for (SegmentId id : pinned) (void)trie_.acquire(id);
  Status result;
  for (SegmentId id : todo) {
    Entry& e = *entries_.at(id);  // pinned: cannot be removed while unlocked
    auto seq = trie_.sequence(id);
    if (!seq.ok()) {
      result = seq.status();
      break;
    }
    std::vector<int32_t> tokens(seq.value().begin() + e.computed_pos, seq.value().end());
    std::vector<std::shared_ptr<const Segment>> parents;
    for (SegmentId p : ids) {
      if (p == id) break;
      parents.push_back(entries_.at(p)->segment);
    }
    const KvQuant format = e.format;
    lock.unlock();
    Tower tower(model_.config(), parents, static_cast<int32_t>(tokens.size()));
    std::vector<float> logits;
    Status st = forward_.eval(tower, tokens, Logits::Last, logits);
    std::shared_ptr<const Segment> seg;
    if (st.ok()) seg = tower.seal_tail(std::move(tokens), format, id);
    lock.lock();
    if (!st.ok() || !seg) {
      result = Status::Error("cannot thaw segment " + std::to_string(id) + ": " + (st.ok() ? "seal failed" : st.message()));
      break;
    }
    e.kv_bytes = seg->kv_bytes();  // unknown until now for a segment added cold
    e.segment = std::move(seg);
    e.coded.clear();
    counters_.thaws++;
    counters_.thaw_tokens += e.length;
  }
  for (SegmentId id : pinned) (void)trie_.release(id);
  return result;
}

std::vector<SegmentId> SegmentPool::idle(std::chrono::steady_clock::duration idle_for) const {
  std::lock_guard lock(mu_);
  const auto cutoff = std::chrono::steady_clock::now() - idle_for;
  std::vector<std::pair<std::chrono::steady_clock::time_point, SegmentId>> found;
  for (const auto& [id, e] : entries_) {
    if (e->pinned || e->tier() == Tier::Cold || e->last_used > cutoff) continue;
    auto info = trie_.info(id);
    if (!info.ok() || info.value().refcount > 0 || info.value().fan_out >= options_.pin_fan_out) continue;
    found.emplace_back(e->last_used, id);
  }
  std::sort(found.begin(), found.end());
  std::vector<SegmentId> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

Status SegmentPool::freeze(SegmentId id, std::vector<uint8_t> coded) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return Status::Error("unknown segment " + std::to_string(id));
  Entry& e = *it->second;
  auto info = trie_.info(id);
  if (!info.ok()) return info.status();
  if (info.value().refcount > 0) return Status::Error("segment " + std::to_string(id) + " is in use");
  if (e.pinned || info.value().fan_out >= options_.pin_fan_out) return Status::Error("segment " + std::to_string(id) + " is pinned");
  if (e.tier() == Tier::Cold) return Status::Error("segment " + std::to_string(id) + " is cold already");
  e.segment.reset();
  drop_file(e);
  e.coded = std::move(coded);
  counters_.freezes++;
  return Status::Ok();
}

Status SegmentPool::thaw(SegmentId id) {
  std::unique_lock lock(mu_);
  if (!entries_.count(id)) return Status::Error("unknown segment " + std::to_string(id));
  auto chain = chain_locked(id, lock);
  return chain.ok() ? Status::Ok() : chain.status();
}

std::vector<uint8_t> SegmentPool::coded(SegmentId id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? std::vector<uint8_t>{} : it->second->coded;
}

Status SegmentPool::page_in_locked(std::span<const SegmentId> ids) {
  std::vector<std::filesystem::path> paths;
  std::vector<Entry*> cold;
  for (SegmentId id : ids) {
    Entry& e = *entries_.at(id);
    if (e.tier() != Tier::Warm) continue;
    paths.push_back(e.file);
    cold.push_back(&e);
  }
  if (cold.empty()) return Status::Ok();
  // One batch of reads for the whole path (io_uring when permitted). The pool lock stays held: paging
  // a tower in is milliseconds, and leases of other sessions would wait for the same bytes anyway.
  auto files = reader_->read_all(paths);
  Status failed;
  for (size_t i = 0; i < cold.size(); ++i) {
    Result<std::shared_ptr<const Segment>> seg =
        files[i].ok() ? decode_segment(model_.config(), files[i].value(), options_.model_fingerprint)
                      : Result<std::shared_ptr<const Segment>>(files[i].status());
    std::string why;
    if (!seg.ok()) why = seg.error();
    else if (seg.value()->id() != cold[i]->id || seg.value()->length() != cold[i]->length) why = "the file holds another segment";
    if (!why.empty()) {
      counters_.page_in_error = paths[i].string() + ": " + why;
      failed = Status::Error("cannot page in segment " + std::to_string(cold[i]->id) + ": " + counters_.page_in_error);
      continue;
    }
    cold[i]->segment = std::move(seg.value());
    counters_.page_ins++;
  }
  return failed;
}

Status SegmentPool::page_out_locked(SegmentId id, Entry& e) {
  if (e.tier() == Tier::Cold) return Status::Ok();
  if (e.file.empty()) {
    auto path = options_.warm_dir / ("segment-" + std::to_string(id) + ".tws");
    if (Status st = write_segment_file(*e.segment, path, options_.model_fingerprint); !st.ok()) return st;
    e.file = path;
  }
  e.segment.reset();
  counters_.page_outs++;
  return Status::Ok();
}

size_t SegmentPool::depth_locked(SegmentId id) const {
  auto info = trie_.info(id);
  return info.ok() ? info.value().depth : 0;
}

std::unique_ptr<SegmentPool::Entry> SegmentPool::make_entry(std::shared_ptr<const Segment> seg,
                                                            const SegmentOptions& options) {
  auto e = std::make_unique<Entry>();
  e->id = seg->id();
  e->parent = seg->parent();
  e->length = seg->length();
  e->computed_pos = seg->computed_pos();
  e->format = seg->format();
  e->kv_bytes = seg->kv_bytes();
  e->segment = std::move(seg);
  e->label = options.label;
  e->pinned = options.pinned;
  e->created = e->last_used = std::chrono::steady_clock::now();
  return e;
}

Result<SegmentId> SegmentPool::allocate_id_locked(const SegmentOptions& options) {
  if (options.id != kNoSegment && (entries_.count(options.id) || trie_.contains(options.id))) {
    return Status::Error("segment id " + std::to_string(options.id) + " is already in use");
  }
  const SegmentId id = options.id != kNoSegment ? options.id : next_id_;
  next_id_ = std::max(next_id_, id + 1);
  return id;
}

Result<SegmentId> SegmentPool::add(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options) {
  std::unique_lock lock(mu_);
  return add_locked(parent, tokens, options, lock);
}

Result<SegmentId> SegmentPool::add_locked(SegmentId parent, std::span<const int32_t> tokens,
                                          const SegmentOptions& options, std::unique_lock<std::mutex>& lock) {
  const ModelConfig& cfg = model_.config();
  if (tokens.empty()) return Status::Error("segment has no tokens");
  if (static_cast<int64_t>(tokens.size()) > options_.max_segment_tokens) {
    return Status::Error("segment of " + std::to_string(tokens.size()) + " tokens exceeds the limit of " +
                         std::to_string(options_.max_segment_tokens));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= cfg.n_vocab) return Status::Error("token id " + std::to_string(t) + " is outside the vocabulary");
  }
  if (parent != kNoSegment && !entries_.count(parent)) {
    return Status::Error("unknown parent segment " + std::to_string(parent));
  }
  std::vector<int32_t> sequence;
  if (parent != kNoSegment) {
    auto seq = trie_.sequence(parent);
    if (!seq.ok()) return seq.status();
    sequence = std::move(seq.value());
  }
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  if (cfg.n_ctx_train > 0 && static_cast<int64_t>(sequence.size()) > cfg.n_ctx_train) {
    return Status::Error("segment would end at position " + std::to_string(sequence.size()) +
                         ", beyond the model's context of " + std::to_string(cfg.n_ctx_train));
  }
  auto m = trie_.match(sequence);
  if (m.length == sequence.size()) return m.segment;  // already resident under the same chain
  auto id_or = allocate_id_locked(options);
  if (!id_or.ok()) return id_or.status();
  const SegmentId id = id_or.value();
  if (options.cold) return add_cold_locked(id, parent, sequence, tokens.size(), options);

  // Prefill outside the lock (readers of stats keep going); the parent chain stays pinned meanwhile.
  auto chain_or = chain_locked(parent, lock);
  if (!chain_or.ok()) return chain_or.status();
  auto chain = std::move(chain_or.value());
  for (const auto& s : chain) (void)trie_.acquire(s->id());
  const KvQuant format = options.format.value_or(options_.depth.at_depth(chain.size()));
  lock.unlock();
  Tower tower(cfg, chain, static_cast<int32_t>(tokens.size()));
  std::vector<float> logits;
  Status st = forward_.eval(tower, tokens, Logits::Last, logits);
  std::shared_ptr<const Segment> seg;
  if (st.ok()) seg = tower.seal_tail({tokens.begin(), tokens.end()}, format, id);
  lock.lock();
  for (const auto& s : chain) (void)trie_.release(s->id());
  if (!st.ok()) return st;
  if (!seg) return Status::Error("internal: sealing the prefilled segment failed");

  auto ins = trie_.insert(sequence, id);
  if (!ins.ok()) return ins.status();
  if (!ins.value().inserted) return ins.value().segment;
  entries_.emplace(id, make_entry(std::move(seg), options));
  return id;
}

Result<SegmentId> SegmentPool::add_cold_locked(SegmentId id, SegmentId parent, std::span<const int32_t> sequence,
                                               size_t length, const SegmentOptions& options) {
  auto ins = trie_.insert(sequence, id);
  if (!ins.ok()) return ins.status();
  if (!ins.value().inserted) return ins.value().segment;
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->parent = parent;
  e->length = static_cast<int32_t>(length);
  e->computed_pos = static_cast<int32_t>(sequence.size() - length);
  e->format = options.format.value_or(options_.depth.at_depth(parent == kNoSegment ? 0 : depth_locked(parent) + 1));
  e->coded = *options.cold;
  e->label = options.label;
  e->pinned = options.pinned;
  e->created = e->last_used = std::chrono::steady_clock::now();
  entries_.emplace(id, std::move(e));
  return id;
}

Result<Lease> SegmentPool::assemble(std::span<const int32_t> tokens, int32_t extra_capacity) {
  if (extra_capacity < 0) return Status::Error("negative extra capacity");
  std::vector<std::shared_ptr<const Segment>> segs;
  Lease lease;
  {
    std::unique_lock lock(mu_);
    auto m = trie_.match(tokens);
    if (!m.path.empty() && m.path.back().end == tokens.size()) m.path.pop_back();
    std::vector<SegmentId> ids;
    for (const auto& step : m.path) ids.push_back(step.segment);
    // A segment that cannot be paged in (its file went bad) ends the reusable prefix there: the
    // caller prefills the rest, which costs time but never serves wrong KV.
    (void)page_in_locked(ids);
    // Thawing (prefill) stops at the first warm segment that failed to page in: a cold segment's
    // parents must be hot before it can be recomputed under them.
    std::vector<SegmentId> thawable;
    for (SegmentId id : ids) {
      if (entries_.at(id)->tier() == Tier::Warm) break;
      thawable.push_back(id);
    }
    (void)thaw_locked(thawable, lock);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& step : m.path) {
      auto it = entries_.find(step.segment);
      if (it == entries_.end() || !it->second->segment) break;
      if (!trie_.acquire(step.segment).ok()) break;
      it->second->hits++;
      it->second->last_used = now;
      segs.push_back(it->second->segment);
      lease.path.push_back(step.segment);
      lease.cached_tokens = step.end;
    }
    counters_.leases++;
    if (!lease.path.empty()) counters_.lease_hits++;
    counters_.cached_tokens += lease.cached_tokens;
    counters_.prefill_tokens += tokens.size() - lease.cached_tokens;
  }
  const int64_t tail = static_cast<int64_t>(tokens.size() - lease.cached_tokens) + extra_capacity;
  lease.tower = std::make_unique<Tower>(model_.config(), std::move(segs), static_cast<int32_t>(tail));
  return lease;
}

void SegmentPool::release(Lease& lease) {
  std::lock_guard lock(mu_);
  for (SegmentId id : lease.path) (void)trie_.release(id);
  lease.path.clear();
  lease.tower.reset();
  lease.cached_tokens = 0;
}

Result<SegmentId> SegmentPool::seal(Lease& lease, std::vector<int32_t> tail_tokens, const SegmentOptions& options) {
  if (!lease.tower) return Status::Error("seal: empty lease");
  if (tail_tokens.empty() || static_cast<int32_t>(tail_tokens.size()) != lease.tower->tail_length()) {
    return Status::Error("seal: " + std::to_string(tail_tokens.size()) + " tokens given for a tail of " +
                         std::to_string(lease.tower->tail_length()));
  }
  std::unique_lock lock(mu_);
  const SegmentId parent = lease.path.empty() ? kNoSegment : lease.path.back();
  std::vector<int32_t> sequence;
  if (parent != kNoSegment) {
    auto seq = trie_.sequence(parent);
    if (!seq.ok()) return seq.status();
    sequence = std::move(seq.value());
  }
  sequence.insert(sequence.end(), tail_tokens.begin(), tail_tokens.end());
  auto m = trie_.match(sequence);
  SegmentId id;
  if (m.length == sequence.size()) {
    id = m.segment;  // someone sealed the same tokens already: use theirs, drop our copy of the rows
    auto it = entries_.find(id);
    if (it == entries_.end()) return Status::Error("internal: trie names a missing segment");
    auto chain = chain_locked(id, lock);  // pages in or thaws it when it left RAM
    if (!chain.ok()) return chain.status();
    std::vector<std::shared_ptr<const Segment>> segs = lease.tower->segments();
    segs.push_back(chain.value().back());
    auto tower = std::make_unique<Tower>(model_.config(), std::move(segs), lease.tower->capacity() - lease.tower->size());
    lease.tower = std::move(tower);
  } else {
    auto id_or = allocate_id_locked(options);
    if (!id_or.ok()) return id_or.status();
    id = id_or.value();
    const KvQuant format = options.format.value_or(options_.depth.transcript);
    auto seg = lease.tower->seal_tail(std::move(tail_tokens), format, id);
    if (!seg) return Status::Error("internal: sealing the tail failed");
    auto ins = trie_.insert(sequence, id);
    if (!ins.ok()) return ins.status();
    entries_.emplace(id, make_entry(std::move(seg), options));
  }
  if (!trie_.acquire(id).ok()) return Status::Error("internal: cannot pin the sealed segment");
  lease.path.push_back(id);
  lease.cached_tokens = static_cast<size_t>(lease.tower->base_length());
  return id;
}

Status SegmentPool::remove(SegmentId id) {
  std::lock_guard lock(mu_);
  if (!entries_.count(id)) return Status::Error("unknown segment " + std::to_string(id));
  Status st = trie_.evict(id);
  if (!st.ok()) return st;
  drop_file(*entries_.at(id));
  entries_.erase(id);
  return Status();
}

size_t SegmentPool::enforce_budget() {
  std::lock_guard lock(mu_);
  if (options_.ram_budget_bytes == 0) return 0;
  const bool warm = !options_.warm_dir.empty();
  size_t resident = 0;
  for (const auto& [id, e] : entries_) resident += e->segment ? e->kv_bytes : 0;
  size_t moved = 0;
  while (resident > options_.ram_budget_bytes) {
    Entry* victim = nullptr;
    for (const auto& [id, e] : entries_) {
      if (!e->segment || e->pinned) continue;
      auto info = trie_.info(id);
      if (!info.ok() || info.value().refcount > 0 || info.value().fan_out >= options_.pin_fan_out) continue;
      // Evicting for good is only possible for leaves; going warm keeps the segment in the trie.
      if (!warm && (info.value().fan_out > 0 || info.value().children > 0)) continue;
      bool better = victim == nullptr ||
                    (options_.eviction == EvictionPolicy::Lru ? e->last_used < victim->last_used
                                                              : e->created > victim->created);
      if (better) victim = e.get();
    }
    if (!victim) break;  // everything left is pinned, leased or a parent
    const size_t bytes = victim->kv_bytes;
    if (warm) {
      if (!page_out_locked(victim->id, *victim).ok()) break;  // disk trouble: keep it hot
    } else {
      if (!trie_.evict(victim->id).ok()) break;
      counters_.evictions++;
      entries_.erase(victim->id);
    }
    resident -= bytes;
    ++moved;
  }
  return moved;
}

void SegmentPool::drop_file(Entry& e) {
  if (e.file.empty()) return;
  std::error_code ec;
  std::filesystem::remove(e.file, ec);
  e.file.clear();
}

std::shared_ptr<const Segment> SegmentPool::get(SegmentId id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || !page_in_locked(std::span(&id, 1)).ok()) return nullptr;
  return it->second->segment;
}

SegmentInfo SegmentPool::info_locked(const Entry& e) const {
  SegmentInfo s;
  s.id = e.id;
  s.parent = e.parent;
  s.label = e.label;
  s.length = e.length;
  s.begin = e.computed_pos;
  s.format = e.format;
  s.kv_bytes = e.kv_bytes;
  s.pinned = e.pinned;
  s.tier = e.tier();
  s.hits = e.hits;
  s.created = e.created;
  s.last_used = e.last_used;
  if (auto t = trie_.info(s.id); t.ok()) {
    s.depth = t.value().depth;
    s.refcount = t.value().refcount;
    s.fan_out = t.value().fan_out;
  }
  if (s.fan_out >= options_.pin_fan_out) s.pinned = true;
  return s;
}

std::optional<SegmentInfo> SegmentPool::info(SegmentId id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return info_locked(*it->second);
}

std::vector<SegmentInfo> SegmentPool::list() const {
  std::lock_guard lock(mu_);
  std::vector<SegmentInfo> out;
  trie_.for_each([&](const CacheTrie::PayloadInfo& p) {
    auto it = entries_.find(p.segment);
    if (it != entries_.end()) out.push_back(info_locked(*it->second));
  });
  return out;
}

Result<std::vector<int32_t>> SegmentPool::sequence(SegmentId id) const {
  std::lock_guard lock(mu_);
  return trie_.sequence(id);
}

PoolStats SegmentPool::stats() const {
  std::lock_guard lock(mu_);
  PoolStats s = counters_;
  s.segments = entries_.size();
  for (const auto& [id, e] : entries_) {
    const size_t b = e->kv_bytes, d = depth_locked(id);
    s.count_by_depth[d] += 1;
    if (e->tier() != Tier::Cold) {
      s.kv_bytes += b;
      s.bytes_by_depth[d] += b;
      s.bytes_by_format[simd::kv_quant_name(e->format)] += b;
    }
    switch (e->tier()) {
      case Tier::Hot: s.hot_segments++, s.hot_bytes += b; break;
      case Tier::Warm: s.warm_segments++, s.warm_bytes += b; break;
      case Tier::Cold: s.cold_segments++, s.cold_bytes += e->coded.size(); break;
    }
  }
  s.trie_bytes = trie_.stats().bytes;
  return s;
}

PoolOptions SegmentPool::options() const {
  std::lock_guard lock(mu_);
  return options_;
}

void SegmentPool::set_eviction(EvictionPolicy policy) {
  std::lock_guard lock(mu_);
  options_.eviction = policy;
}

void SegmentPool::set_ram_budget(size_t bytes) {
  std::lock_guard lock(mu_);
  options_.ram_budget_bytes = bytes;
}

}  // namespace towers

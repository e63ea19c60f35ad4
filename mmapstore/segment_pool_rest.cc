// The pool's segments at rest: cold segments with a coded copy that leave the cache trie, so their
// tokens are no longer held in RAM; found again by the hash of their tokens under their parent, and
// brought back by decoding their coded record under their parents (wake). See segment_pool.h.
#include <algorithm>

#include "engine/base/no_wait_lock.h"
#include "mmapstore/cold_pack.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_pool.h"
#include "mmapstore/segment_pool_entry.h"

namespace towers {

namespace {
std::string segment_name(SegmentId id, const std::string& label) {
  return "segment " + std::to_string(id) + (label.empty() ? "" : " (" + label + ")");
}
}  // namespace

void SegmentPool::set_cold_decoder(ColdDecode decode) {
  std::lock_guard lock(mu_);
  decode_ = std::move(decode);
}

bool SegmentPool::at_rest(SegmentId id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second->at_rest;
}

size_t SegmentPool::rest_locked(SegmentId id) {
  mu_.assert_held();
  if (!decode_) return 0;  // nothing could bring it back
  size_t n = 0;
  for (SegmentId at = id; at != kNoSegment;) {
    auto it = entries_.find(at);
    if (it == entries_.end()) break;
    Entry& e = *it->second;
    // A recipe (derive, modular placement) needs the segment's own rows, not its tokens: it stays.
    if (e.at_rest || e.tier() != Tier::Cold || !e.has_record() || e.derive_from != kNoSegment || !e.modular_from.empty()) break;
    auto seq = trie_.sequence(at);
    if (!seq.ok()) break;
    // The trie refuses while it is leased or a segment still in the trie extends its tokens (its
    // children, or another chain's segments): those need its node.
    if (!trie_.evict(at).ok()) break;
    e.tokens_xxh3 = xxh3_tokens(std::span<const int32_t>(seq.value()).subspan(static_cast<size_t>(e.computed_pos)));
    e.at_rest = true;
    e.damage.clear();
    Resting& r = resting_[e.parent];
    r.lengths[e.length]++;
    r.by_hash.emplace(e.tokens_xxh3, at);
    // A session's record goes to the cold packs (hierarchy segments restart cold from the log's
    // segment_tier records); one already there is the same record: its bytes leave RAM now.
    if (cold_pack_ && !e.lineage.empty()) {
      if (e.packed) {
        e.coded.clear();
        e.coded.shrink_to_fit();
      } else {
        to_pack_.push_back(at);
      }
    }
    ++n;
    at = e.parent;
  }
  return n;
}

void SegmentPool::unrest_locked(Entry& e) {
  mu_.assert_held();
  auto it = resting_.find(e.parent);
  if (it != resting_.end()) {
    Resting& r = it->second;
    if (auto l = r.lengths.find(e.length); l != r.lengths.end() && --l->second == 0) r.lengths.erase(l);
    auto [b, end] = r.by_hash.equal_range(e.tokens_xxh3);
    for (auto h = b; h != end; ++h) {
      if (h->second == e.id) {
        r.by_hash.erase(h);
        break;
      }
    }
    if (r.by_hash.empty()) resting_.erase(it);
  }
  e.at_rest = false;
  e.tokens_xxh3 = 0;
  e.damage.clear();
}

Status SegmentPool::attach_locked(Entry& e, std::span<const int32_t> own_tokens) {
  mu_.assert_held();
  if (static_cast<int32_t>(own_tokens.size()) != e.length || xxh3_tokens(own_tokens) != e.tokens_xxh3) {
    return Status::Corruption(segment_name(e.id, e.label) + ": the tokens given are not its tokens");
  }
  std::vector<int32_t> sequence;
  if (e.parent != kNoSegment) {
    auto seq = trie_.sequence(e.parent);
    if (!seq.ok()) return seq.status().prefixed(segment_name(e.id, e.label) + ": its parent is not in the trie: ");
    sequence = std::move(seq.value());
  }
  sequence.insert(sequence.end(), own_tokens.begin(), own_tokens.end());
  auto ins = trie_.insert(sequence, e.id);
  if (!ins.ok()) return ins.status();
  if (!ins.value().inserted) {
    // Added again meanwhile (add_cold does not see segments at rest): that one serves these tokens.
    return Status::Conflict(segment_name(e.id, e.label) + ": its tokens are segment " +
                            std::to_string(ins.value().segment) + " now");
  }
  unrest_locked(e);
  return Status::Ok();
}

void SegmentPool::extend_at_rest_locked(std::span<const int32_t> tokens, std::vector<SegmentId>& chain) const {
  mu_.assert_held();
  for (;;) {
    const SegmentId tip = chain.empty() ? kNoSegment : chain.back();
    const size_t end = tip == kNoSegment ? 0 : static_cast<size_t>(entries_.at(tip)->computed_pos + entries_.at(tip)->length);
    auto it = resting_.find(tip);
    if (it == resting_.end()) return;
    SegmentId next = kNoSegment;
    // Longest first (siblings whose tokens extend one another: the one that covers more). One hash
    // per distinct length, whatever the number of segments at rest below `tip`.
    for (auto l = it->second.lengths.rbegin(); l != it->second.lengths.rend() && next == kNoSegment; ++l) {
      const size_t n = static_cast<size_t>(l->first);
      if (end + n >= tokens.size()) continue;  // at least one token is left to prefill
      const uint64_t h = xxh3_tokens(tokens.subspan(end, n));
      auto [b, e] = it->second.by_hash.equal_range(h);
      for (auto c = b; c != e; ++c) {
        if (entries_.at(c->second)->length == l->first) {
          next = c->second;
          break;
        }
      }
    }
    if (next == kNoSegment) return;
    chain.push_back(next);
  }
}

Result<std::vector<int32_t>> SegmentPool::wake(SegmentId id, Forward* forward) {
  check_may_wait("SegmentPool::wake");
  struct Job {
    SegmentId id = kNoSegment;
    int32_t length = 0;
    uint64_t xxh3 = 0;
    std::vector<uint8_t> coded;  // empty: read it from the packs
    ColdRecordRef packed;
    std::string name;
  };
  std::vector<Job> jobs;
  std::vector<int32_t> context;  // the tokens before the next job: its parents'
  ColdDecode decode;
  {
    std::lock_guard lock(mu_);
    if (!entries_.count(id)) return Status::NotFound("unknown segment " + std::to_string(id));
    const std::vector<SegmentId> ids = chain_ids_locked(id);
    size_t first = 0;
    while (first < ids.size() && !entries_.at(ids[first])->at_rest) ++first;
    if (first == ids.size()) return trie_.sequence(id);
    if (first > 0) {
      auto seq = trie_.sequence(ids[first - 1]);
      if (!seq.ok()) return seq.status();
      context = std::move(seq.value());
    }
    for (size_t i = first; i < ids.size(); ++i) {
      const Entry& e = *entries_.at(ids[i]);
      if (!e.damage.empty()) return Status::Corruption(e.damage);
      jobs.push_back({e.id, e.length, e.tokens_xxh3, e.coded,
                      {.id = e.id, .parent = e.parent, .tokens_xxh3 = e.tokens_xxh3, .tokens = e.length, .pack = e.pack,
                       .offset = e.pack_offset, .length = e.pack_length, .crc = e.pack_crc},
                      segment_name(e.id, e.label)});
    }
    decode = decode_;
  }
  if (!decode) return Status::Unavailable("segment " + std::to_string(id) + " is at rest and no decoder is set");
  // Without the lock (the model runs): root first, each under the tokens of all before it. The
  // record's own checks (its CRC, its context's CRC, the tokens check) run inside the decoder; the
  // token count and the 64-bit hash kept here are checked after it.
  Status failed;
  std::vector<size_t> starts;  // where each decoded segment's tokens start in `context`
  for (Job& j : jobs) {
    std::string why;
    if (j.coded.empty()) {
      auto record = cold_pack_ ? cold_pack_->read(j.packed) : Result<std::vector<uint8_t>>(Status::NotFound("no cold packs"));
      if (record.ok()) j.coded = std::move(record.value());
      else why = record.error();
    }
    auto tokens = why.empty() ? decode(forward ? *forward : forward_, context, j.coded)
                              : Result<std::vector<int32_t>>(Status::Corruption(why));
    if (!tokens.ok()) why = tokens.error();
    else if (tokens->size() != static_cast<size_t>(j.length)) {
      why = "it decoded to " + std::to_string(tokens->size()) + " tokens, not " + std::to_string(j.length);
    } else if (xxh3_tokens(tokens.value()) != j.xxh3) {
      why = "its tokens do not match their recorded hash";
    }
    if (!why.empty()) {
      failed = Status::Corruption(j.name + ": its coded record cannot be decoded (" + why + "); its tokens are not served");
      break;
    }
    starts.push_back(context.size());
    context.insert(context.end(), tokens->begin(), tokens->end());
  }
  const size_t decoded = starts.size();
  std::lock_guard lock(mu_);
  // Back in the trie, root first, what decoded.
  for (size_t i = 0; i < decoded; ++i) {
    auto it = entries_.find(jobs[i].id);
    if (it == entries_.end()) return Status::NotFound(jobs[i].name + " left the pool while it was decoded");
    Entry& e = *it->second;
    if (!e.at_rest) continue;  // woken meanwhile
    if (Status st = attach_locked(e, std::span<const int32_t>(context).subspan(starts[i], static_cast<size_t>(e.length))); !st.ok()) {
      return st;
    }
    // Cold in the trie, its record at hand again (read from the packs) until a build computes it.
    if (e.coded.empty()) e.coded = std::move(jobs[i].coded);
    counters_.wakes++;
    counters_.wake_tokens += static_cast<uint64_t>(e.length);
  }
  if (!failed.ok()) {
    counters_.wake_errors++;
    if (auto it = entries_.find(jobs[decoded].id); it != entries_.end() && it->second->at_rest) {
      it->second->damage = failed.message();
    }
    assert_invariants_locked();
    return failed;
  }
  assert_invariants_locked();
  return trie_.sequence(id);
}

void SegmentPool::erase_at_rest_locked(SegmentId id) {
  mu_.assert_held();
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second->at_rest) return;
  unrest_locked(*it->second);
  if (it->second->packed) unpack_.push_back(id);
  entries_.erase(it);
}

Status SegmentPool::adopt_at_rest(SegmentId id, SegmentId parent, const SegmentOptions& options,
                                  std::span<const int32_t> own_tokens) {
  std::lock_guard lock(mu_);
  auto name = [&] { return segment_name(id, options.label); };  // for errors only: a restart adopts millions
  ColdRecordRef r;
  if (!cold_pack_ || !cold_pack_->find(id, &r)) return Status::NotFound(name() + " has no record in the cold packs");
  if (r.parent != parent) return Status::NotFound(name() + ": its cold record was coded under another parent");
  const Entry* up = nullptr;
  if (parent != kNoSegment) {
    auto p = entries_.find(parent);
    if (p == entries_.end()) return Status::NotFound(name() + ": unknown parent segment " + std::to_string(parent));
    up = p->second.get();
  }
  if (!own_tokens.empty() && (static_cast<int32_t>(own_tokens.size()) != r.tokens || xxh3_tokens(own_tokens) != r.tokens_xxh3)) {
    return Status::Corruption(name() + ": its cold record codes other tokens than the log's");
  }
  if (r.tokens <= 0 || r.tokens > options_.max_segment_tokens) {
    return Status::Corruption(name() + ": its cold record has " + std::to_string(r.tokens) + " tokens");
  }
  SegmentOptions o = options;
  o.id = id;
  auto allocated = allocate_id_locked(o);
  if (!allocated.ok()) return allocated.status();
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->parent = parent;
  e->length = r.tokens;
  e->computed_pos = up ? up->computed_pos + up->length : 0;
  e->format = options.format.value_or(options_.depth.at_depth(parent == kNoSegment ? 0 : depth_locked(parent) + 1));
  e->packed = true;
  e->pack = r.pack, e->pack_offset = r.offset, e->pack_length = r.length, e->pack_crc = r.crc;
  e->at_rest = true;
  e->tokens_xxh3 = r.tokens_xxh3;
  e->label = options.label;
  e->lineage = options.lineage;
  e->created = e->last_used = std::chrono::steady_clock::now();
  Resting& rest = resting_[parent];
  rest.lengths[e->length]++;
  rest.by_hash.emplace(e->tokens_xxh3, id);
  entries_.emplace_hint(entries_.end(), id, std::move(e));  // a restart adopts them in id order
  assert_invariants_locked();
  return Status::Ok();
}

bool SegmentPool::packed(SegmentId id) const {
  return cold_pack_ && cold_pack_->find(id, nullptr);
}

std::vector<std::string> SegmentPool::cold_pack_problems() const {
  std::lock_guard lock(mu_);
  return cold_pack_problems_;
}

void SegmentPool::pack_resting() {
  if (!cold_pack_) return;
  std::vector<SegmentId> dead;
  std::vector<std::vector<uint8_t>> records;
  std::vector<ColdPut> puts;
  {
    std::lock_guard lock(mu_);
    dead.swap(unpack_);
    for (SegmentId id : to_pack_) {
      auto it = entries_.find(id);
      // Woken meanwhile (its hash is only kept at rest): packed when it goes to rest again.
      if (it == entries_.end() || it->second->packed || !it->second->at_rest || it->second->coded.empty()) continue;
      const Entry& e = *it->second;
      records.push_back(e.coded);
      puts.push_back({e.id, e.parent, e.tokens_xxh3, e.length, {}});
    }
    to_pack_.clear();
  }
  for (size_t i = 0; i < puts.size(); ++i) puts[i].record = records[i];
  const Status removed = dead.empty() ? Status::Ok() : cold_pack_->remove(dead);
  auto refs = puts.empty() ? Result<std::vector<ColdRecordRef>>(std::vector<ColdRecordRef>{}) : cold_pack_->append(puts);
  std::lock_guard lock(mu_);
  if (!removed.ok()) counters_.pack_error = removed.message();
  if (!refs.ok()) {
    counters_.pack_error = refs.error();  // their records stay in RAM, and restart from the log
    return;
  }
  for (const ColdRecordRef& r : refs.value()) {
    auto it = entries_.find(r.id);
    if (it == entries_.end()) {
      unpack_.push_back(r.id);  // removed meanwhile: dead at the next pass
      continue;
    }
    Entry& e = *it->second;
    e.packed = true;
    e.pack = r.pack, e.pack_offset = r.offset, e.pack_length = r.length, e.pack_crc = r.crc;
    if (e.at_rest) {
      e.coded.clear();
      e.coded.shrink_to_fit();
    }
  }
}

}  // namespace towers

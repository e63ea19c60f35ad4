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
  return rest_.find(id) != nullptr;
}

bool SegmentPool::known_locked(SegmentId id) const {
  mu_.assert_held();
  return entries_.count(id) || rest_.find(id);
}

SegmentId SegmentPool::parent_locked(SegmentId id) const {
  mu_.assert_held();
  if (auto it = entries_.find(id); it != entries_.end()) return it->second->parent;
  const RestRecord* r = rest_.find(id);
  return r ? r->parent : kNoSegment;
}

size_t SegmentPool::end_locked(SegmentId id) const {
  mu_.assert_held();
  if (auto it = entries_.find(id); it != entries_.end()) return static_cast<size_t>(it->second->computed_pos + it->second->length);
  const RestRecord* r = rest_.find(id);
  return r ? static_cast<size_t>(r->computed_pos + r->length) : 0;
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
    if (e.tier() != Tier::Cold || (e.coded.empty() && !e.packed) || e.derive_from != kNoSegment || !e.modular_from.empty()) break;
    auto seq = trie_.sequence(at);
    if (!seq.ok()) break;
    // The trie refuses while it is leased or a segment still in the trie extends its tokens (its
    // children, or another chain's segments): those need its node.
    if (!trie_.evict(at).ok()) break;
    const bool session = !e.lineage.empty();
    RestRecord r;
    r.id = at;
    r.parent = e.parent;
    r.tokens_xxh3 = xxh3_tokens(std::span<const int32_t>(seq.value()).subspan(static_cast<size_t>(e.computed_pos)));
    r.length = e.length;
    r.computed_pos = e.computed_pos;
    r.format = e.format;
    r.packed = e.packed;
    r.pack = e.pack, r.pack_offset = e.pack_offset, r.pack_length = e.pack_length, r.pack_crc = e.pack_crc;
    r.lineage_is_label = e.lineage == e.label;
    r.label = std::move(e.label);
    // A record already in the packs is the same record: its bytes leave RAM now. Otherwise they stay
    // beside the record, and a session's (a segment with a lineage) go to the cold packs (hierarchy
    // segments restart cold from the log's segment_tier records).
    if (!r.packed || !r.lineage_is_label) {
      RestExtra& x = rest_extra_[at];
      if (!r.packed) x.coded = std::move(e.coded);
      if (!r.lineage_is_label) x.lineage = std::move(e.lineage);
    }
    if (cold_pack_ && session && !r.packed) to_pack_.push_back(at);
    entries_.erase(it);
    rest_.insert(std::move(r));
    ++n;
    at = rest_.find(at)->parent;
  }
  return n;
}

Result<SegmentPool::Entry*> SegmentPool::attach_locked(SegmentId id, std::span<const int32_t> own_tokens) {
  mu_.assert_held();
  const RestRecord* r = rest_.find(id);
  if (!r) return Status::NotFound("segment " + std::to_string(id) + " is not at rest");
  if (static_cast<int32_t>(own_tokens.size()) != r->length || xxh3_tokens(own_tokens) != r->tokens_xxh3) {
    return Status::Corruption(segment_name(id, r->label) + ": the tokens given are not its tokens");
  }
  std::vector<int32_t> sequence;
  if (r->parent != kNoSegment) {
    auto seq = trie_.sequence(r->parent);
    if (!seq.ok()) return seq.status().prefixed(segment_name(id, r->label) + ": its parent is not in the trie: ");
    sequence = std::move(seq.value());
  }
  sequence.insert(sequence.end(), own_tokens.begin(), own_tokens.end());
  auto ins = trie_.insert(sequence, id);
  if (!ins.ok()) return ins.status();
  if (!ins.value().inserted) {
    // Added again meanwhile (add_cold does not see segments at rest): that one serves these tokens.
    return Status::Conflict(segment_name(id, r->label) + ": its tokens are segment " +
                            std::to_string(ins.value().segment) + " now");
  }
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->parent = r->parent;
  e->length = r->length;
  e->computed_pos = r->computed_pos;
  e->format = r->format;
  e->packed = r->packed;
  e->pack = r->pack, e->pack_offset = r->pack_offset, e->pack_length = r->pack_length, e->pack_crc = r->pack_crc;
  e->label = r->label;
  if (r->lineage_is_label) e->lineage = r->label;
  if (auto x = rest_extra_.find(id); x != rest_extra_.end()) {
    e->coded = std::move(x->second.coded);
    if (!r->lineage_is_label) e->lineage = std::move(x->second.lineage);
    rest_extra_.erase(x);
  }
  e->created = e->last_used = std::chrono::steady_clock::now();
  rest_.erase(id);
  Entry* out = e.get();
  entries_.emplace(id, std::move(e));
  return out;
}

void SegmentPool::extend_at_rest_locked(std::span<const int32_t> tokens, std::vector<SegmentId>& chain) const {
  mu_.assert_held();
  for (;;) {
    const SegmentId tip = chain.empty() ? kNoSegment : chain.back();
    const size_t end = tip == kNoSegment ? 0 : end_locked(tip);
    const auto* lengths = rest_.lengths_below(tip);
    if (!lengths) return;
    SegmentId next = kNoSegment;
    // Longest first (siblings whose tokens extend one another: the one that covers more). One hash
    // per distinct length, whatever the number of segments at rest below `tip`.
    for (auto l = lengths->rbegin(); l != lengths->rend() && next == kNoSegment; ++l) {
      const size_t n = static_cast<size_t>(l->first);
      if (end + n >= tokens.size()) continue;  // at least one token is left to prefill
      rest_.find_by_hash(tip, xxh3_tokens(tokens.subspan(end, n)), [&](const RestRecord& r) {
        if (r.length == l->first) next = r.id;
        return next != kNoSegment;
      });
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
    if (!known_locked(id)) return Status::NotFound("unknown segment " + std::to_string(id));
    const std::vector<SegmentId> ids = chain_ids_locked(id);
    size_t first = 0;
    while (first < ids.size() && !rest_.find(ids[first])) ++first;
    if (first == ids.size()) return trie_.sequence(id);
    if (first > 0) {
      auto seq = trie_.sequence(ids[first - 1]);
      if (!seq.ok()) return seq.status();
      context = std::move(seq.value());
    }
    for (size_t i = first; i < ids.size(); ++i) {
      const RestRecord& r = *rest_.find(ids[i]);
      Job j{r.id, r.length, r.tokens_xxh3, {},
            {.id = r.id, .parent = r.parent, .tokens_xxh3 = r.tokens_xxh3, .tokens = r.length, .pack = r.pack,
             .offset = r.pack_offset, .length = r.pack_length, .crc = r.pack_crc},
            segment_name(r.id, r.label)};
      if (auto x = rest_extra_.find(r.id); x != rest_extra_.end()) {
        if (!x->second.damage.empty()) return Status::Corruption(x->second.damage);
        j.coded = x->second.coded;
      }
      jobs.push_back(std::move(j));
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
    if (!known_locked(jobs[i].id)) return Status::NotFound(jobs[i].name + " left the pool while it was decoded");
    if (!rest_.find(jobs[i].id)) continue;  // woken meanwhile
    auto e = attach_locked(jobs[i].id, std::span<const int32_t>(context).subspan(starts[i], static_cast<size_t>(jobs[i].length)));
    if (!e.ok()) return e.status();
    // Cold in the trie, its record at hand again (read from the packs) until a build computes it.
    if (e.value()->coded.empty()) e.value()->coded = std::move(jobs[i].coded);
    counters_.wakes++;
    counters_.wake_tokens += static_cast<uint64_t>(jobs[i].length);
  }
  if (!failed.ok()) {
    counters_.wake_errors++;
    if (rest_.find(jobs[decoded].id)) rest_extra_[jobs[decoded].id].damage = failed.message();
    assert_invariants_locked();
    return failed;
  }
  assert_invariants_locked();
  return trie_.sequence(id);
}

void SegmentPool::erase_at_rest_locked(SegmentId id) {
  mu_.assert_held();
  const RestRecord* r = rest_.find(id);
  if (!r) return;
  if (r->packed) unpack_.push_back(id);
  rest_extra_.erase(id);
  rest_.erase(id);
}

Status SegmentPool::adopt_at_rest(SegmentId id, SegmentId parent, const SegmentOptions& options,
                                  std::span<const int32_t> own_tokens) {
  std::lock_guard lock(mu_);
  auto name = [&] { return segment_name(id, options.label); };  // for errors only: a restart adopts millions
  ColdRecordRef r;
  if (!cold_pack_ || !cold_pack_->find(id, &r)) return Status::NotFound(name() + " has no record in the cold packs");
  if (r.parent != parent) return Status::NotFound(name() + ": its cold record was coded under another parent");
  if (parent != kNoSegment && !known_locked(parent)) {
    return Status::NotFound(name() + ": unknown parent segment " + std::to_string(parent));
  }
  if (!own_tokens.empty() && (static_cast<int32_t>(own_tokens.size()) != r.tokens || xxh3_tokens(own_tokens) != r.tokens_xxh3)) {
    return Status::Corruption(name() + ": its cold record codes other tokens than the log's");
  }
  if (r.tokens <= 0 || r.tokens > options_.max_segment_tokens) {
    return Status::Corruption(name() + ": its cold record has " + std::to_string(r.tokens) + " tokens");
  }
  SegmentOptions o;
  o.id = id;
  auto allocated = allocate_id_locked(o);
  if (!allocated.ok()) return allocated.status();
  RestRecord rest;
  rest.id = id;
  rest.parent = parent;
  rest.tokens_xxh3 = r.tokens_xxh3;
  rest.length = r.tokens;
  rest.computed_pos = parent == kNoSegment ? 0 : static_cast<int32_t>(end_locked(parent));
  rest.format = options.format.value_or(options_.depth.at_depth(parent == kNoSegment ? 0 : depth_locked(parent) + 1));
  rest.packed = true;
  rest.pack = r.pack, rest.pack_offset = r.offset, rest.pack_length = r.length, rest.pack_crc = r.crc;
  rest.lineage_is_label = options.lineage == options.label;
  rest.label = options.label;
  if (!rest.lineage_is_label) rest_extra_[id].lineage = options.lineage;
  rest_.insert(std::move(rest));
  assert_invariants_locked();
  return Status::Ok();
}

bool SegmentPool::rests_as(SegmentId id, SegmentId parent, std::span<const int32_t> own_tokens) const {
  std::lock_guard lock(mu_);
  const RestRecord* r = rest_.find(id);
  return r && r->packed && r->parent == parent && r->length == static_cast<int32_t>(own_tokens.size()) &&
         r->tokens_xxh3 == xxh3_tokens(own_tokens);
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
      const RestRecord* r = rest_.find(id);
      auto x = rest_extra_.find(id);
      // Woken meanwhile (its hash is only kept at rest): packed when it goes to rest again.
      if (!r || r->packed || x == rest_extra_.end() || x->second.coded.empty()) continue;
      records.push_back(x->second.coded);
      puts.push_back({r->id, r->parent, r->tokens_xxh3, r->length, {}});
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
  for (const ColdRecordRef& ref : refs.value()) {
    if (RestRecord* r = rest_.find(ref.id)) {
      r->packed = true;
      r->pack = ref.pack, r->pack_offset = ref.offset, r->pack_length = ref.length, r->pack_crc = ref.crc;
      // At rest: its bytes leave RAM.
      if (auto x = rest_extra_.find(ref.id); x != rest_extra_.end()) {
        x->second.coded = {};
        if (x->second.damage.empty() && x->second.lineage.empty()) rest_extra_.erase(x);
      }
    } else if (auto it = entries_.find(ref.id); it != entries_.end()) {
      Entry& e = *it->second;  // woken meanwhile: keeps its place in the packs
      e.packed = true;
      e.pack = ref.pack, e.pack_offset = ref.offset, e.pack_length = ref.length, e.pack_crc = ref.crc;
    } else {
      unpack_.push_back(ref.id);  // removed meanwhile: dead at the next pass
    }
  }
}

}  // namespace towers

// The segment pool: every resident segment, the cache trie that finds them by token prefix, and the
// policy that decides their format and which ones leave memory first.
//
// Sessions never own shared KV. They lease a tower: the pool matches the longest cached prefix of the
// session's tokens, pins the segments on that path (so they cannot be evicted while in use) and hands
// out a Tower whose own tail holds only what was not cached. Exact mode only: a segment is found under
// the same parent chain it was computed under, so a leased tower computes what monolithic prefill of
// the same tokens computes (modular placement is an explicit, separate API: engine/modular.h).
//
// Threading: every method may be called from any thread (one internal mutex), but methods that run
// the model (add) use the Forward given at construction, which is single-threaded by contract: the
// daemon calls them from its scheduler thread only.
#pragma once
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/forward.h"
#include "engine/segment.h"
#include "mmapstore/cache_trie.h"

namespace towers {

class FileReader;

enum class EvictionPolicy {
  Lru,    // least recently used first
  Lindy,  // youngest first: what has stayed in use longer is expected to stay longer
};
std::string_view to_string(EvictionPolicy p);
std::optional<EvictionPolicy> parse_eviction_policy(std::string_view s);

struct PoolOptions {
  DepthPolicy depth;                       // format by depth (platform Q4, community Q6, bot Q8, ...)
  size_t ram_budget_bytes = 0;             // resident segment KV; 0 = unlimited
  EvictionPolicy eviction = EvictionPolicy::Lru;
  size_t pin_fan_out = 8;                  // segments with at least this many children are never evicted
  int32_t max_segment_tokens = 1 << 16;    // refuse longer segments
  // Warm tier: when set, segments over the budget are written here (same bytes, mmapstore/segment_file.h)
  // and dropped from RAM instead of being evicted; a lease pages them back in. Empty: budget evicts.
  std::filesystem::path warm_dir;
  uint64_t model_fingerprint = 0;          // stamped into segment files; a file of another model is refused
};

// Hot: KV in RAM. Warm: the same KV bytes in a file only. Cold: no KV anywhere; the tokens (kept by
// the trie, and optionally an arithmetic-coded copy handed in by the compressor) are thawed by one
// prefill under the segment's parent chain, which recomputes the same bytes (deterministic kernels).
enum class Tier { Hot, Warm, Cold };
std::string_view to_string(Tier t);

struct SegmentOptions {
  std::optional<KvQuant> format;  // overrides the depth policy
  SegmentId id = kNoSegment;      // restore with a known id (persistence); kNoSegment = allocate
  bool pinned = false;            // never evicted (hierarchy bases defined by the operator)
  std::string label;              // free text for listings ("platform", "bot:helper", ...)
  // Add the segment cold, without running the model: it holds these coded tokens (a cold tier kept
  // on disk) and thaws by prefill on its first lease. The caller has checked that they code `tokens`.
  std::optional<std::vector<uint8_t>> cold;
};

struct SegmentInfo {
  SegmentId id = kNoSegment;
  SegmentId parent = kNoSegment;
  std::string label;
  size_t depth = 0;               // 0 = top of the hierarchy
  int32_t begin = 0;              // first position (= length of the parent chain)
  int32_t length = 0;             // tokens
  KvQuant format = KvQuant::F32;
  size_t kv_bytes = 0;
  uint64_t refcount = 0;          // leases holding it
  size_t fan_out = 0;             // segments directly below
  bool pinned = false;
  Tier tier = Tier::Hot;
  uint64_t hits = 0;              // leases that used it
  std::chrono::steady_clock::time_point created, last_used;
};

struct PoolStats {
  size_t segments = 0;
  size_t kv_bytes = 0;                      // KV of hot and warm segments
  std::map<size_t, size_t> bytes_by_depth;  // depth -> bytes
  std::map<size_t, size_t> count_by_depth;
  std::map<std::string, size_t> bytes_by_format;
  size_t hot_segments = 0, hot_bytes = 0;    // KV resident in RAM
  size_t warm_segments = 0, warm_bytes = 0;  // KV on disk only
  size_t cold_segments = 0, cold_bytes = 0;  // cold_bytes: their coded form, when given
  uint64_t page_ins = 0, page_outs = 0;      // warm -> hot, hot -> warm
  uint64_t freezes = 0, thaws = 0, thaw_tokens = 0;
  std::string page_in_error;                 // the last failure to page a segment in, if any
  uint64_t leases = 0;                      // assemble() calls
  uint64_t lease_hits = 0;                  // ... that reused at least one segment
  uint64_t cached_tokens = 0;               // tokens served from segments instead of prefilled
  uint64_t prefill_tokens = 0;              // tokens left for the caller to prefill
  uint64_t evictions = 0;
  size_t trie_bytes = 0;
};

// A session's view of the pool: a tower over pinned segments. Give it back with SegmentPool::release.
struct Lease {
  std::unique_ptr<Tower> tower;
  std::vector<SegmentId> path;  // pinned segments, root first
  size_t cached_tokens = 0;     // tokens covered by the segments (tower->base_length())
};

class SegmentPool {
 public:
  SegmentPool(const Model& model, Forward& forward, PoolOptions options = {});
  ~SegmentPool();

  // Prefills `tokens` after the whole chain of `parent` (kNoSegment: at the top; the caller includes
  // BOS in a top segment's tokens) and keeps the result as a segment in the format of its depth.
  // Returns the existing id when exactly this (parent chain, tokens) is already resident.
  // Errors: unknown parent, empty or too long tokens, a token outside the vocabulary, id in use.
  Result<SegmentId> add(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options = {});

  // Longest resident prefix of `tokens` as a tower with room for the rest plus `extra_capacity`
  // tokens. At least one token is always left to prefill (the caller needs its logits), so a fully
  // cached prompt backs off to the previous segment. The caller prefills
  // tokens[lease.cached_tokens, ...) into lease.tower.
  Result<Lease> assemble(std::span<const int32_t> tokens, int32_t extra_capacity);
  // Unpins the lease's segments (the tower is destroyed). Safe on an empty lease.
  void release(Lease& lease);

  // Turns the lease's tail (whose tokens the caller passes) into a resident segment under the lease's
  // last segment, so later requests with this prefix find it; the lease keeps working on it.
  Result<SegmentId> seal(Lease& lease, std::vector<int32_t> tail_tokens, const SegmentOptions& options = {});

  // Removes a segment nobody leases and nothing depends on. The error says why it refused.
  Status remove(SegmentId id);
  // Brings resident bytes within the budget, choosing unpinned, unleased segments by the policy: with a
  // warm tier they are written to disk and dropped from RAM (any depth: they stay in the trie); without
  // one, leaves are evicted. Returns how many segments left RAM.
  size_t enforce_budget();

  // Cold tier. Segments nobody leased for `idle_for` (unpinned, not cold yet), least recent first.
  std::vector<SegmentId> idle(std::chrono::steady_clock::duration idle_for) const;
  // Drops a segment's KV (RAM and warm file) and keeps `coded` (its tokens arithmetic-coded by the
  // caller; may be empty). Refused while it is leased or pinned. The next lease through it thaws it.
  Status freeze(SegmentId id, std::vector<uint8_t> coded);
  // Brings a segment (and its parents) back to RAM: pages in warm ones, thaws cold ones by prefill.
  // Runs the model: scheduler thread only.
  Status thaw(SegmentId id);
  // The coded form given to freeze (empty when none or not cold).
  std::vector<uint8_t> coded(SegmentId id) const;

  // The segment, paged in when warm; nullptr when unknown, cold or unreadable.
  std::shared_ptr<const Segment> get(SegmentId id);
  std::optional<SegmentInfo> info(SegmentId id) const;
  std::vector<SegmentInfo> list() const;  // parents before children
  // The full token sequence (parent chain + own tokens) a segment stands for.
  Result<std::vector<int32_t>> sequence(SegmentId id) const;
  PoolStats stats() const;

  PoolOptions options() const;
  void set_eviction(EvictionPolicy policy);
  void set_ram_budget(size_t bytes);

 private:
  struct Entry;
  Result<SegmentId> add_locked(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options,
                               std::unique_lock<std::mutex>& lock);
  // The segments from the top down to id, paged in when warm and thawed when cold.
  Result<SegmentId> add_cold_locked(SegmentId id, SegmentId parent, std::span<const int32_t> sequence, size_t length,
                                    const SegmentOptions& options);
  Result<std::vector<std::shared_ptr<const Segment>>> chain_locked(SegmentId id, std::unique_lock<std::mutex>& lock);
  Status page_in_locked(std::span<const SegmentId> ids);
  // Thaws the cold ones among ids (root first, each id's parent before it) by prefill. Unlocks while
  // the model runs; the ids are pinned meanwhile. Stops at the first failure.
  Status thaw_locked(std::span<const SegmentId> ids, std::unique_lock<std::mutex>& lock);
  Status page_out_locked(SegmentId id, Entry& e);
  static void drop_file(Entry& e);
  // options.id when free (restoring), else the next unused id.
  Result<SegmentId> allocate_id_locked(const SegmentOptions& options);
  static std::unique_ptr<Entry> make_entry(std::shared_ptr<const Segment> seg, const SegmentOptions& options);
  SegmentInfo info_locked(const Entry& e) const;
  size_t depth_locked(SegmentId id) const;

  const Model& model_;
  Forward& forward_;
  PoolOptions options_;
  mutable std::mutex mu_;
  CacheTrie trie_;
  std::map<SegmentId, std::unique_ptr<Entry>> entries_;
  SegmentId next_id_ = 1;
  PoolStats counters_;
  std::unique_ptr<FileReader> reader_;
};

}  // namespace towers

// The segment pool: every segment of the store, the cache trie that finds them by token prefix, the
// files that keep them across restarts, and the policy that decides their format and which ones leave
// memory first.
//
// Sessions never own shared KV. They lease a tower: the pool matches the longest cached prefix of the
// session's tokens, pins the segments on that path (so they cannot leave memory while in use) and
// hands out a Tower whose own tail holds only what was not cached. A segment is found under the
// same parent chain it was computed under. Its KV is exact (a leased tower computes what monolithic
// prefill of the same tokens computes) unless it was installed as a modular placement after an edit
// above it (SegmentInfo::modular, engine/model/modular.h): then it is served as it is until replace()
// swaps the exact KV in.
//
// The store (PoolOptions::store_dir set): every segment gets a file (mmapstore/segment_format.h),
// written once by the writer thread after the segment is created; until the file is durable the
// segment is served from RAM, then from a read-only mapping of its file (attention reads the mapped
// bytes in place). A restart adopts the files the daemon's record log names (adopt(): header checks
// only, O(1) per file) and verifies each payload checksum on its first page-in.
//
// Tiers of a segment:  hot   its bytes are in memory: owned RAM, or a mapped and populated file
//                      warm  its file only (leaving RAM unmaps it; page_in maps, populates, verifies)
//                      cold  no KV at all: the trie keeps its tokens (and maybe an arithmetic-coded
//                            copy); it comes back by prefill under its parent chain
//                      at rest  a cold segment with a coded copy, below which everything is at rest
//                            too, leaves the trie: the pool keeps a fixed-size entry (parent, token
//                            count, a 64-bit hash of its tokens, its coded record). plan() finds it
//                            by hashing the query's tokens after its parent; wake() decodes it under
//                            its parents (checked by the hash and the record's CRC) and puts it back
//                            in the trie, cold; a build then prefills it as any cold segment.
//                            With a store, a session's record (a segment with a lineage) is
//                            appended to the cold packs (mmapstore/cold_pack.h) as it goes to rest,
//                            and once durable there it leaves RAM too; a restart brings it back at
//                            rest from the packs' index (adopt_at_rest) without reading it.
//
// Threading: every method may be called from any thread (one internal mutex, never held across model
// work or file I/O), but the methods that run the model (add, thaw) use the Forward given at
// construction, which is single-threaded by contract: the daemon runs them through its scheduler, and
// uses the non-blocking pieces (add_cold, page_in, assemble, install) for everything else.
#pragma once
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/model/forward.h"
#include "engine/model/rope.h"
#include "engine/model/segment.h"
#include "mmapstore/cache_trie.h"
#include "mmapstore/eviction.h"
#include "mmapstore/mutex.h"
#include "mmapstore/posix_file.h"
#include "mmapstore/rest_table.h"

namespace towers {

class ColdPack;
class SegmentFile;
class SegmentWriter;

struct PoolOptions {
  DepthPolicy depth;                       // format by depth (platform Q4, community Q6, bot Q8, ...)
  size_t ram_budget_bytes = 0;             // resident segment KV plus lease tails; 0 = unlimited
  size_t disk_budget_bytes = 0;            // segment files; beyond it warm segments go cold; 0 = unlimited
  EvictionPolicy eviction = EvictionPolicy::Lru;
  size_t pin_fan_out = 8;                  // segments with at least this many children never leave RAM
  int32_t max_segment_tokens = 1 << 16;    // refuse longer segments
  // The store: segment files live here (seg-<id>.tws) and survive the pool. Empty: RAM only, and
  // the budget evicts leaves instead of unmapping.
  std::filesystem::path store_dir;
  FileSystem* fs = nullptr;                // the file seam (nullptr: posix_fs())
  bool uring_writes = false;               // segment files written through io_uring (mmapstore/segment_writer.h)
  // Lease tails (a request's own KV until it is sealed): F32, or F16 at half the bytes
  // (engine/model/kv_cache.h); every tower of the pool (SegmentPool::new_tower).
  KvQuant tail_format = KvQuant::F32;
  uint64_t model_fingerprint = 0;          // stamped into segment files; a file of another model is refused
};

enum class Tier { Hot, Warm, Cold };
std::string_view to_string(Tier t);

struct SegmentOptions {
  std::optional<KvQuant> format;  // overrides the depth policy
  SegmentId id = kNoSegment;      // restore with a known id (persistence); kNoSegment = allocate
  bool pinned = false;            // never evicted (hierarchy bases defined by the operator)
  std::string label;              // free text for listings ("platform", "bot:helper", "session:ID", ...)
  // The owner whose segments are one lineage for eviction (mmapstore/eviction.h: under lindy they age
  // as one, from the first of them), e.g. a session whose transcript is sealed turn by turn; set by
  // whoever adds them. Empty: the segment is its own lineage.
  std::string lineage;
  // Add the segment cold (add_cold), with its tokens arithmetic-coded (may be empty: none kept).
  std::optional<std::vector<uint8_t>> cold;
  // Compute it (derive(), or a thaw) as a RoPE-shifted copy of rows [derive_skip, derive_skip +
  // length) of segment derive_from instead of by prefill: a session's kept turns, moved up after
  // older turns were dropped, keep the KV they were computed with. The result is *derived*: no
  // prefill of its tokens gives it, so it never goes cold (see SegmentInfo::derived).
  SegmentId derive_from = kNoSegment;
  int32_t derive_skip = 0;
  // Compute it as a modular placement of the segments modular_from (one after another they hold
  // these tokens, under another parent chain: before that parent was edited): its first `repair`
  // tokens prefilled under its own chain, the rest of their rows reused, RoPE-shifted (the
  // scheduler's modular build). The result is approximate (SegmentInfo::modular) until replace()
  // swaps in the exact KV.
  std::vector<SegmentId> modular_from;
  int32_t repair = 0;
};

struct SegmentInfo {
  SegmentId id = kNoSegment;
  SegmentId parent = kNoSegment;
  std::string label;
  std::string lineage;            // SegmentOptions::lineage
  size_t depth = 0;               // 0 = top of the hierarchy
  int32_t begin = 0;              // first position (= length of the parent chain)
  int32_t length = 0;             // tokens
  KvQuant format = KvQuant::F32;
  size_t kv_bytes = 0;            // of the KV (0 while cold and never computed)
  uint64_t refcount = 0;          // leases holding it
  size_t fan_out = 0;             // segments directly below
  bool pinned = false;
  Tier tier = Tier::Hot;
  bool durable = false;           // its file is written and synced
  // Its KV is a RoPE-shifted copy (SegmentOptions::derive_from), which a prefill of its tokens would
  // not reproduce: it leaves memory only to the warm tier (never frozen, never dropped under the
  // disk budget), its file says so (segment_format::kFlagDerived), and a record should name it only
  // once that file is durable (when_durable).
  bool derived = false;
  SegmentId derive_from = kNoSegment;  // cold, waiting to be derived from this segment
  // Its KV is a modular placement (SegmentOptions::modular_from), approximate until replace() gives
  // it the exact KV; its file says so (segment_format::kFlagModular). Going cold ends it: a build
  // computes the exact KV.
  bool modular = false;
  std::vector<SegmentId> modular_from;  // cold, waiting for a modular build from these segments
  int32_t repair = 0;                   // ... that prefills this many of its first tokens
  // Its KV is (or, once built, will be) a modular placement: not exact yet.
  bool approximate() const { return modular || !modular_from.empty(); }
  uint64_t hits = 0;              // leases that used it
  std::chrono::steady_clock::time_point created, last_used;
};

struct PoolStats {
  size_t segments = 0;
  size_t kv_bytes = 0;                      // KV of hot and warm segments
  std::map<size_t, size_t> bytes_by_depth;  // depth -> bytes (hot and warm)
  std::map<size_t, size_t> count_by_depth;
  std::map<std::string, size_t> bytes_by_format;
  size_t hot_segments = 0, hot_bytes = 0;    // KV in memory (owned, or mapped and populated)
  size_t owned_bytes = 0;                    // ... of which in RAM waiting for their file
  size_t warm_segments = 0, warm_bytes = 0;  // KV on disk only
  size_t cold_segments = 0, cold_bytes = 0;  // cold_bytes: their coded form, when given
  size_t modular_segments = 0;               // SegmentInfo::approximate(): not exact yet ...
  size_t placements_pending = 0;             // ... of which cold, waiting for their modular build
  size_t disk_bytes = 0;                     // segment files on disk (hot and warm)
  size_t tail_bytes = 0;                     // lease tails (private F32 KV of the requests running)
  size_t resident_bytes = 0;                 // what the budget counts: hot_bytes + tail_bytes
  // By depth: bytes in memory (mincore for mappings), mapped but not in memory (the kernel reclaimed
  // pages of a mapping), and in files on disk.
  std::map<size_t, size_t> resident_by_depth, mapped_by_depth, disk_by_depth;
  uint64_t page_ins = 0, page_outs = 0;      // warm -> hot, hot -> warm
  uint64_t files_written = 0, write_errors = 0;
  uint64_t freezes = 0, thaws = 0, thaw_tokens = 0;
  std::string page_in_error;                 // the last failure to page a segment in, if any
  std::string write_error;                   // the last failure to write a segment file, if any
  uint64_t leases = 0;                      // assemble() calls
  uint64_t lease_hits = 0;                  // ... that reused at least one segment
  uint64_t cached_tokens = 0;               // tokens served from segments instead of prefilled
  uint64_t prefill_tokens = 0;              // tokens left for the caller to prefill
  uint64_t evictions = 0;
  size_t trie_bytes = 0;
  size_t token_bytes = 0;                   // token ids the trie holds (4 bytes each)
  size_t entry_bytes = 0;                   // the pool's record of each segment, coded bytes included (estimate)
  size_t at_rest_segments = 0, at_rest_bytes = 0;  // cold segments out of the trie; their coded bytes
  uint64_t wakes = 0, wake_tokens = 0, wake_errors = 0;  // at rest -> cold by decoding (wake)
  // Cold packs (mmapstore/cold_pack.h): segments whose record is there, the records' bytes, the
  // packs' and index's bytes on disk, pack bytes of records no segment uses any more.
  size_t packed_segments = 0;
  uint64_t pack_record_bytes = 0, pack_disk_bytes = 0, pack_dead_bytes = 0;
  std::string pack_error;  // the last failure to open or write the packs, if any
};

// A session's view of the pool: a tower over pinned segments. Give it back with SegmentPool::release.
struct Lease {
  std::unique_ptr<Tower> tower;
  std::vector<SegmentId> path;  // pinned segments, root first
  size_t cached_tokens = 0;     // tokens covered by the segments (tower->base_length())
  size_t tail_bytes = 0;        // counted against the budget while leased
};

// Where a token sequence stands in the pool: the longest cached path and each step's tier.
struct PathPlan {
  std::vector<SegmentId> path;  // root first
  std::vector<Tier> tiers;
  std::vector<size_t> ends;     // token offset where each step ends
  bool all_hot() const;
  // A step at rest whose coded record failed to decode (SegmentPool::wake): the error naming it.
  // The path must not be served (its tokens cannot be known).
  std::string damaged;
};

// What the record log says of a segment file at a restart (adopt).
struct AdoptSpec {
  SegmentId id = kNoSegment, parent = kNoSegment;
  std::vector<int32_t> tokens;  // this segment's own tokens
  SegmentOptions options;       // label, pinned, format
};

class SegmentPool {
 public:
  SegmentPool(const Model& model, Forward& forward, PoolOptions options = {});
  ~SegmentPool();  // waits for the files being written; the files stay (they are the store)

  // Prefills `tokens` after the whole chain of `parent` (kNoSegment: at the top; the caller includes
  // BOS in a top segment's tokens) and keeps the result as a segment in the format of its depth.
  // Returns the existing id when this token sequence (parent chain's tokens + tokens) is already in
  // the pool; that segment's own parent may differ from `parent` (its chain ends elsewhere).
  // Runs the model (add_cold + thaw).
  Result<SegmentId> add(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options = {});
  // The same segment, cold: indexed by the trie, no KV yet (a build or a thaw computes it). Never
  // runs the model. An existing identical segment's id is returned as it is.
  Result<SegmentId> add_cold(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options = {});
  // A restart: registers the segment from its file, warm, after the open-time checks of
  // mmapstore/segment_format.h against the spec (parents must be adopted or added first). An error
  // says why the file cannot be used (the caller adds the segment cold instead and rebuilds it).
  Status adopt(const AdoptSpec& spec);
  // Asks the kernel to read the start (header and tokens) of these segments' files ahead, all at once
  // (posix_fadvise WILLNEED, no waiting): a restart's adopt() then finds them in the page cache
  // instead of waiting for one disk read after another.
  void prefetch_headers(std::span<const SegmentId> ids) const;
  // Ids allocated from now on are above `id` (a restart: ids its record log names stay free).
  void reserve_ids(SegmentId id);
  // Removes files in the store directory that no segment of the pool names (crashed writes, removed
  // segments whose unlink did not happen, and stray .tmp files), and marks dead the cold packs'
  // records of segments not in the pool. Returns how many files went.
  size_t collect_garbage();

  // Where `tokens` stands: the chain (parent chain, root first, any tier) of the deepest segment
  // whose sequence is a prefix of them, backed off so that at least one token is left to prefill.
  // Never the trie's payload path as such: a payload may sit below another one whose KV it was not
  // computed after (two sessions sealed [hi r1..r9] and [hi r1..r19] under one bot).
  PathPlan plan(std::span<const int32_t> tokens) const;
  // The chain root .. id and each step's tier (what a build under `id` needs in memory).
  PathPlan plan_chain(SegmentId id) const;
  // Brings warm segments into memory: maps, populates and, the first time, verifies each file's
  // payload checksum. File I/O runs without the pool lock, so another thread may call this while the
  // model runs. A segment whose file fails is dropped to cold (Corruption: the caller rebuilds it).
  Status page_in(std::span<const SegmentId> ids);

  // The longest cached prefix of `tokens` whose segments are all in memory, as a tower over that
  // segment's parent chain (lease.path, root first: exactly plan()'s path when it is all hot) with
  // room for the rest plus `extra_capacity` tokens. Matching segments are tried deepest first; the
  // first whose whole chain is hot wins. Never runs the model and never waits for the disk: a warm
  // or cold segment makes a shorter prefix win (plan + page_in + thaw first to avoid that). At least
  // one token is always left to prefill.
  Result<Lease> assemble(std::span<const int32_t> tokens, int32_t extra_capacity);
  // A tower over exactly the chain root .. id (all hot), with room for `extra_capacity` tokens: what
  // a build of a segment under `id` prefills into. NotFound / Unavailable (not hot) otherwise.
  Result<Lease> lease_chain(SegmentId id, int32_t extra_capacity);
  // Unpins the lease's segments (the tower is destroyed). Safe on an empty lease.
  void release(Lease& lease);

  // Turns the lease's tail (whose tokens the caller passes) into a segment under the lease's last
  // segment, so later requests with this prefix find it; the lease keeps working on it. When the
  // same tokens are a segment already under another chain, the lease switches to that segment's
  // chain (its path changes) if it is all in memory, and the seal is refused (Conflict) otherwise.
  Result<SegmentId> seal(Lease& lease, std::vector<int32_t> tail_tokens, const SegmentOptions& options = {});
  // Completes a build: the cold segment `id` gets its KV (computed under its parent chain); it is
  // hot now and its file is queued for writing.
  // modular: the KV is a modular placement (SegmentInfo::modular).
  Status install(SegmentId id, std::shared_ptr<const Segment> segment, bool modular = false);
  // Swaps the exact KV in for a modular segment's (a background exact rebuild): new leases get it,
  // leases in flight keep the rows they hold; its file is written again. Ok and nothing changes when
  // the segment is not modular any more (it went cold and was rebuilt meanwhile). Unavailable while
  // its previous file is still being written (try again later).
  Status replace(SegmentId id, std::shared_ptr<const Segment> segment);
  // Computes a cold segment added with SegmentOptions::derive_from from its source's rows (no model
  // run; the shift runs without the pool lock). Ok when it is not cold (nothing to do). Unavailable
  // while the source is not in memory (page it in, or build it, first); NotFound when the source
  // left the pool (the recipe is dropped: the segment is then computed by prefill like any other).
  Status derive(SegmentId id);
  // Runs `done` once the files of all `ids` are durable (written, synced, renamed, directory synced):
  // at once, on this thread, when they are (or when the pool has no store: no file will ever exist),
  // else on the writer thread after the last one. A segment in memory without a file and no write
  // queued (a write that failed) is written again. An error when one of them cannot get a file: it
  // is unknown, cold, removed or frozen meanwhile, or its write fails. What the record log names
  // must exist (LevelDB's rule): a record naming derived segments is appended from `done`.
  void when_durable(std::span<const SegmentId> ids, std::function<void(const Status&)> done);

  // A segment an edit replaced: removed like remove() when nothing uses it and no segment was
  // computed on top of it; when the trie alone keeps it (other chains' segments extend its tokens:
  // an edit that appended to the text), its KV and file go and its tokens stay, cold and unpinned.
  Status retire(SegmentId id);
  // Removes a segment nobody leases and nothing depends on, and its file. The error says why not.
  Status remove(SegmentId id);
  // Brings resident bytes (hot KV + lease tails) within the budget, choosing unpinned, unleased
  // segments by the policy (mmapstore/eviction.h; a session's segments are one lineage): durable ones
  // are unmapped (warm); without a store, leaves are evicted.
  // Cheap when within budget. Returns how many segments left memory.
  size_t enforce_budget();
  // Brings segment files within `slack` times the disk budget: warm segments (not in memory) go cold
  // in the policy's order (their files are deleted; their tokens stay in the trie, and a build
  // recomputes them). Returns how many went cold. With the cold tier coding idle segments down to the
  // budget itself (Compressor::Options::while_over_disk_budget), this is the backstop above it.
  size_t enforce_disk_budget(double slack = 1.0);
  // Bytes of segment files beyond the disk budget (0: within it, or no budget).
  size_t disk_over_budget() const;

  // Cold tier. Segments nobody leased for `idle_for` (unpinned, not cold yet), in the eviction
  // policy's order (first to go first).
  std::vector<SegmentId> idle(std::chrono::steady_clock::duration idle_for) const;
  // Drops a segment's KV (RAM and file) and keeps `coded` (its tokens arithmetic-coded by the
  // caller; may be empty). Refused while it is leased or pinned. A thaw brings it back.
  Status freeze(SegmentId id, std::vector<uint8_t> coded);
  // Brings a segment (and its parents) back to memory: pages in warm ones, thaws cold ones by
  // prefill. Runs the model.
  Status thaw(SegmentId id);
  // The coded form given to freeze (empty when none or not cold).
  std::vector<uint8_t> coded(SegmentId id) const;

  // At rest. The decoder gives a frozen segment's tokens back from its coded form given the tokens
  // before it (the codec's decode with the model that coded it); it runs on the thread that calls
  // wake, with the Forward wake is given. Without one nothing goes to rest (nothing could come back).
  using ColdDecode = std::function<Result<std::vector<int32_t>>(Forward& forward, std::span<const int32_t> context,
                                                                std::span<const uint8_t> coded)>;
  void set_cold_decoder(ColdDecode decode);
  // Brings the segments at rest on the chain root .. id back into the trie, cold: decodes each under
  // its parents (root first, with the lock released), checks its token count and hash, and inserts
  // it. Ok when none is at rest. Runs the model (the pool's Forward). Corruption naming the segment
  // (and its label: "session:ID") when its record does not decode to its tokens: it is marked
  // damaged (plan() reports it) and never served.
  // Returns its full token sequence (parent chain + own tokens), as sequence() does.
  // forward: the Forward to decode with (null: the pool's; another thread's own lets the model thread
  // go on meanwhile: daemon/scheduler.h's waker).
  Result<std::vector<int32_t>> wake(SegmentId id, Forward* forward = nullptr);
  bool at_rest(SegmentId id) const;
  // A restart: the segment comes back at rest from its record in the cold packs (no file, no tokens,
  // no record read: the packs' index says its parent, token count and hash). Its parent must be in
  // the pool (in the trie or at rest itself) with nothing of the trie below it. own_tokens, when
  // given, must be its tokens (count and hash). NotFound when the packs hold no record of it, or one
  // under another parent.
  Status adopt_at_rest(SegmentId id, SegmentId parent, const SegmentOptions& options,
                       std::span<const int32_t> own_tokens = {});
  // Whether the cold packs hold a record of this segment id (read at construction from the index).
  bool packed(SegmentId id) const;
  // `id` is at rest, its record durable in the cold packs, coding exactly `own_tokens` under
  // `parent` (what a session needs before its text and tokens may go: daemon/catalog.h). In memory.
  bool rests_as(SegmentId id, SegmentId parent, std::span<const int32_t> own_tokens) const;
  // What opening the cold packs found (torn tails cut, damaged entries), one line each.
  std::vector<std::string> cold_pack_problems() const;

  // The segment, paged in when warm; nullptr when unknown, cold or unreadable.
  std::shared_ptr<const Segment> get(SegmentId id);
  // The segment when it is in memory now; nullptr otherwise (never pages in: no I/O).
  std::shared_ptr<const Segment> get_hot(SegmentId id) const;
  std::optional<SegmentInfo> info(SegmentId id) const;
  std::vector<SegmentInfo> list() const;  // parents before children
  // The full token sequence (parent chain + own tokens) a segment stands for.
  Result<std::vector<int32_t>> sequence(SegmentId id) const;
  PoolStats stats() const;
  // Waits until every segment file queued so far is written (tests, shutdown, benchmarks).
  void flush_writes();
  // The store file of a segment id (whether or not it exists).
  std::filesystem::path file_path(SegmentId id) const;

  PoolOptions options() const;
  // How segment files are written: "io_uring", "write() and fdatasync()", or why not io_uring.
  std::string segment_writes() const;
  void set_eviction(EvictionPolicy policy);
  void set_ram_budget(size_t bytes);
  void set_disk_budget(size_t bytes);
  // The RAM budget in force (0: none), readable without the pool's lock (admission reads it under
  // the catalog's, where no pool call may wait).
  size_t ram_budget_bytes() const { return ram_budget_.load(std::memory_order_relaxed); }
  // Debug builds check the pool's invariants after every change; tests call it too.
  Status check_invariants() const;

 private:
  struct Entry;
  Result<SegmentId> add_cold_locked(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options);
  // Prefills the cold segment `id` under its (hot) parent chain and installs it (a thaw when it had
  // been computed before). Unlocks while the model runs; the chain is pinned meanwhile.
  Status prefill_under_chain(SegmentId id, bool thawing, std::unique_lock<Mutex>& lock);
  // Pages in and computes every segment of the chain root .. id; `fresh` is being added (not a thaw).
  Status compute_chain(SegmentId id, SegmentId fresh);
  // derive() with the lock held (unlocked while the rows are shifted; both segments pinned).
  Status derive_locked(SegmentId id, std::unique_lock<Mutex>& lock);
  std::vector<SegmentId> chain_ids_locked(SegmentId id) const;  // root first
  // The chain (root first) of the deepest segment whose sequence is a prefix of `tokens` (leaving at
  // least one token) and, when hot_only, whose whole chain is in memory; empty when none.
  std::vector<SegmentId> usable_chain_locked(std::span<const int32_t> tokens, bool hot_only) const;
  // The entry `segment` is the KV of (install, replace: `verb` names the caller in the error).
  Result<Entry*> entry_for_kv_locked(SegmentId id, const Segment* segment, const char* verb);
  // Gives e its KV (derived: a shifted copy; modular: a modular placement) and queues its file.
  void install_locked(Entry& e, std::shared_ptr<const Segment> seg, bool derived = false, bool modular = false);
  // After seal() gave the lease a new tower: its cached length and its tail's share of the budget.
  void retower_locked(Lease& lease);
  // Every tower of the pool, with its tail in options_.tail_format (so a segment's bytes never depend
  // on which lease computed it).
  std::unique_ptr<Tower> new_tower(std::vector<std::shared_ptr<const Segment>> segments, int32_t tail_capacity) const;
  void submit_write_locked(Entry& e);
  void on_written(SegmentId id, const std::filesystem::path& path, const Status& status);
  // when_durable callers waiting for files: the ids not durable yet.
  struct DurableWaiter {
    std::vector<SegmentId> pending;
    std::function<void(const Status&)> done;
  };
  void drop_kv_locked(Entry& e);  // to warm (when durable) or cold
  void delete_file_locked(Entry& e);
  Result<SegmentId> allocate_id_locked(const SegmentOptions& options);
  size_t resident_locked() const;
  size_t disk_bytes_locked() const;  // segment files, durable ones
  // Entries `may_leave` admits as the eviction policy's candidates; `bytes`: what leaving frees.
  template <typename MayLeave, typename Bytes>
  std::vector<EvictionCandidate> candidates_locked(MayLeave may_leave, Bytes bytes) const;
  EvictionRules eviction_rules_locked() const;
  SegmentInfo info_locked(const Entry& e) const;
  void plan_step_locked(SegmentId id, PathPlan& p) const;  // appends one step of a path
  size_t depth_locked(SegmentId id) const;
  uint64_t context_xxh3_locked(SegmentId parent) const;
  void assert_invariants_locked() const;
  // At rest (segment_pool_rest.cc). Moves e and then its parents out of the trie while each is cold,
  // coded, unused and has nothing attached below it. Returns how many went.
  size_t rest_locked(SegmentId id);
  // Extends `chain` (a usable chain of `tokens`, root first) by the segments at rest whose parent is
  // its last one and whose tokens hash like the query's next ones (leaving one token to prefill).
  void extend_at_rest_locked(std::span<const int32_t> tokens, std::vector<SegmentId>& chain) const;
  // Removes a segment at rest (the caller checked it has no children).
  void erase_at_rest_locked(SegmentId id);
  // Whether the pool knows the segment (in the trie or at rest); its parent, and where it ends.
  bool known_locked(SegmentId id) const;
  SegmentId parent_locked(SegmentId id) const;
  size_t end_locked(SegmentId id) const;
  Status remove_entry(SegmentId id);  // remove() but the packs' part (pack_resting)
  // Appends the records of segments gone to rest (to_pack_) to the cold packs, without the lock;
  // once durable their coded bytes leave RAM. Records of segments removed meanwhile are marked dead.
  void pack_resting();
  // Puts the segment at rest `id` back in the trie with its own tokens (checked against its hash)
  // after its parent's sequence (the parent must be in the trie), cold, as a full entry. Conflict
  // when the same tokens were added again meanwhile as another segment (it then stays at rest).
  Result<Entry*> attach_locked(SegmentId id, std::span<const int32_t> own_tokens);
  SegmentInfo info_locked(const RestRecord& r) const;

  const Model& model_;
  Forward& forward_;
  Rope rope_;
  PoolOptions options_;
  FileSystem& fs_;
  mutable Mutex mu_;
  CacheTrie trie_;
  std::map<SegmentId, std::unique_ptr<Entry>> entries_;
  SegmentId next_id_ = 1;
  size_t tail_bytes_ = 0;  // of leases not yet released
  PoolStats counters_;
  std::vector<DurableWaiter> waiters_;
  ColdDecode decode_;
  // Segments at rest (not in entries_ nor the trie): one compact record each, found by id and by the
  // hash of their tokens under their parent (plan() looks below a matched segment).
  RestTable rest_;
  // What few segments at rest have beyond their record: coded bytes not in the packs (yet), why the
  // record cannot be decoded, a lineage other than the label.
  struct RestExtra {
    std::vector<uint8_t> coded;
    std::string damage;
    std::string lineage;
  };
  std::unordered_map<SegmentId, RestExtra> rest_extra_;
  std::unique_ptr<ColdPack> cold_pack_;  // with a store: <store_dir>/cold
  std::vector<std::string> cold_pack_problems_;
  std::vector<SegmentId> to_pack_;       // gone to rest, record not in the packs yet
  std::vector<SegmentId> unpack_;        // removed: their records in the packs are dead
  std::atomic<size_t> ram_budget_{0};      // options_.ram_budget_bytes, mirrored (ram_budget_bytes())
  std::unique_ptr<SegmentWriter> writer_;  // last member: its thread calls back into the pool
};

}  // namespace towers

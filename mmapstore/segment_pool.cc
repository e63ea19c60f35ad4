#include "mmapstore/segment_pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "engine/base/no_wait_lock.h"
#include "engine/model/modular.h"
#include "mmapstore/cold_pack.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_pool_entry.h"
#include "mmapstore/segment_writer.h"

namespace towers {

namespace {
constexpr const char* kFilePrefix = "seg-";
constexpr const char* kFileSuffix = ".tws";
}  // namespace

std::string_view to_string(Tier t) {
  switch (t) {
    case Tier::Hot: return "hot";
    case Tier::Warm: return "warm";
    case Tier::Cold: return "cold";
  }
  return "?";
}

bool PathPlan::all_hot() const {
  return std::all_of(tiers.begin(), tiers.end(), [](Tier t) { return t == Tier::Hot; });
}

SegmentPool::SegmentPool(const Model& model, Forward& forward, PoolOptions options)
    : model_(model), forward_(forward), rope_(model.config()), options_(std::move(options)),
      fs_(options_.fs ? *options_.fs : posix_fs()) {
  ram_budget_.store(options_.ram_budget_bytes, std::memory_order_relaxed);
  if (!options_.store_dir.empty()) {
    writer_ = std::make_unique<SegmentWriter>(
        fs_, options_.model_fingerprint,
        [this](const SegmentWriter::Job& job, const Status& st) { on_written(job.segment->id(), job.path, st); },
        options_.uring_writes ? SegmentWriter::Io::Uring : SegmentWriter::Io::Posix);
    ColdPackReport report;
    auto pack = ColdPack::open(options_.store_dir / "cold", fs_, {}, &report);
    cold_pack_problems_ = report.problems;
    if (pack.ok()) {
      cold_pack_ = std::move(pack.value());
      rest_.reserve(report.live);  // a restart brings (most of) them back at rest: no regrowing
    } else {
      counters_.pack_error = pack.error();
      cold_pack_problems_.push_back("the cold packs cannot be opened (records at rest stay in RAM): " + pack.error());
    }
  }
}

SegmentPool::~SegmentPool() { writer_.reset(); }

std::string SegmentPool::segment_writes() const {
  if (!writer_) return "none (no store)";
  if (writer_->io() == SegmentWriter::Io::Uring) return "io_uring batches (a write and its fdatasync linked per file)";
  return writer_->io_note().empty() ? "write() and fdatasync(), one file after another" : writer_->io_note();
}

std::filesystem::path SegmentPool::file_path(SegmentId id) const {
  return options_.store_dir / (kFilePrefix + std::to_string(id) + kFileSuffix);
}

std::vector<SegmentId> SegmentPool::chain_ids_locked(SegmentId id) const {
  mu_.assert_held();
  std::vector<SegmentId> ids;
  for (SegmentId at = id; at != kNoSegment && known_locked(at); at = parent_locked(at)) ids.push_back(at);
  std::reverse(ids.begin(), ids.end());
  return ids;
}

uint64_t SegmentPool::context_xxh3_locked(SegmentId parent) const {
  mu_.assert_held();
  if (parent == kNoSegment) return xxh3_tokens({});
  auto seq = trie_.sequence(parent);
  return xxh3_tokens(seq.ok() ? std::span<const int32_t>(seq.value()) : std::span<const int32_t>());
}

size_t SegmentPool::depth_locked(SegmentId id) const {
  mu_.assert_held();
  // Along the segments' own parents, not the trie's payload ancestors: a payload may sit below
  // another one whose KV it was not computed after (tokens [0, 10) and [0, 20) of one session each).
  size_t depth = 0;
  for (SegmentId at = parent_locked(id); at != kNoSegment; at = parent_locked(at)) ++depth;
  return depth;
}

std::vector<SegmentId> SegmentPool::usable_chain_locked(std::span<const int32_t> tokens, bool hot_only) const {
  mu_.assert_held();
  auto m = trie_.match(tokens);
  if (!m.path.empty() && m.path.back().end == tokens.size()) m.path.pop_back();  // leave a token to prefill
  // The payloads on the matched path all hold a prefix of `tokens`, but the trie's path is not a
  // chain of KV: a payload's KV was computed after its own parent, which need not be the payload
  // above it in the trie. Each payload's own parent chain is. The deepest one whose whole chain is
  // usable wins.
  for (auto step = m.path.rbegin(); step != m.path.rend(); ++step) {
    auto ids = chain_ids_locked(step->segment);
    if (ids.empty() || ids.back() != step->segment) continue;
    const Entry& last = *entries_.at(step->segment);
    if (static_cast<size_t>(last.computed_pos + last.length) != step->end) continue;  // cannot happen
    const bool usable = !hot_only || std::all_of(ids.begin(), ids.end(), [&](SegmentId s) {
      return entries_.at(s)->segment != nullptr;
    });
    if (usable) return ids;
  }
  return {};
}

Result<SegmentId> SegmentPool::allocate_id_locked(const SegmentOptions& options) {
  mu_.assert_held();
  if (options.id != kNoSegment && (known_locked(options.id) || trie_.contains(options.id))) {
    return Status::Conflict("segment id " + std::to_string(options.id) + " is already in use");
  }
  const SegmentId id = options.id != kNoSegment ? options.id : next_id_;
  next_id_ = std::max(next_id_, id + 1);
  return id;
}

void SegmentPool::install_locked(Entry& e, std::shared_ptr<const Segment> seg, bool derived, bool modular) {
  mu_.assert_held();
  e.kv_bytes = seg->kv_bytes();
  e.segment = std::move(seg);
  e.file.reset();
  e.coded.clear();
  e.derived = derived;
  e.derive_from = kNoSegment;
  e.derive_skip = 0;
  e.modular = modular;
  e.modular_from.clear();
  e.repair = 0;
  submit_write_locked(e);
}

void SegmentPool::submit_write_locked(Entry& e) {
  mu_.assert_held();
  if (!writer_ || !e.segment) return;
  e.writing = true;
  const uint8_t flags = (e.derived ? segment_format::kFlagDerived : 0) | (e.modular ? segment_format::kFlagModular : 0);
  writer_->submit({e.segment, file_path(e.id), context_xxh3_locked(e.parent), flags});
}

void SegmentPool::on_written(SegmentId id, const std::filesystem::path& path, const Status& status) {
  // Writer thread. The mapping is opened and checked without the lock.
  std::shared_ptr<SegmentFile> file;
  std::shared_ptr<const Segment> mapped;
  Status st = status;
  if (st.ok()) {
    auto f = SegmentFile::open(path, model_.config(), options_.model_fingerprint);
    if (f.ok()) st = f.value()->verify();
    else st = f.status();
    if (st.ok()) {
      auto s = f.value()->segment(model_.config());
      if (s.ok()) file = f.value(), mapped = s.value();
      else st = s.status();
    }
  }
  // when_durable callers to answer once the lock is released (they may append records).
  std::vector<std::pair<std::function<void(const Status&)>, Status>> answers;
  {
    std::lock_guard lock(mu_);
    Status outcome = Status::Ok();
    auto it = entries_.find(id);
    if (it == entries_.end()) {  // removed while it was being written
      (void)fs_.remove(path);
      outcome = Status::NotFound("segment " + std::to_string(id) + " was removed before its file was written");
    } else {
      Entry& e = *it->second;
      e.writing = false;
      if (!st.ok()) {
        counters_.write_errors++;
        counters_.write_error = st.message();
        // It stays hot in RAM; it cannot leave memory but by eviction (when_durable writes it again).
        outcome = st.prefixed("segment " + std::to_string(id) + ": ");
      } else {
        counters_.files_written++;
        if (!e.segment) {  // frozen while it was being written: the file goes with the KV
          (void)fs_.remove(path);
          outcome = Status::Unavailable("segment " + std::to_string(id) + " left memory before its file was written");
        } else {
          e.durable = true;
          e.verified = true;
          e.file_bytes = file->file_bytes();
          if (mapped->id() == e.segment->id() && mapped->length() == e.segment->length()) {
            // From now on attention reads the mapping; leases holding the RAM copy keep it until released.
            e.segment = std::move(mapped);
            e.file = std::move(file);
          }
        }
      }
    }
    for (auto w = waiters_.begin(); w != waiters_.end();) {
      auto at = std::find(w->pending.begin(), w->pending.end(), id);
      const bool waits = at != w->pending.end();
      if (waits && outcome.ok()) w->pending.erase(at);
      if (waits && (!outcome.ok() || w->pending.empty())) {
        answers.emplace_back(std::move(w->done), outcome);
        w = waiters_.erase(w);
      } else {
        ++w;
      }
    }
    assert_invariants_locked();
  }
  for (auto& [done, outcome] : answers) {
    if (done) done(outcome);
  }
}

void SegmentPool::when_durable(std::span<const SegmentId> ids, std::function<void(const Status&)> done) {
  Status st = Status::Ok();
  {
    std::lock_guard lock(mu_);
    DurableWaiter w;
    for (SegmentId id : ids) {
      if (!writer_) break;  // no store: nothing is ever written, nothing to wait for
      auto it = entries_.find(id);
      if (it == entries_.end()) {
        st = Status::NotFound("segment " + std::to_string(id) + " is not in the pool");
        break;
      }
      Entry& e = *it->second;
      if (e.durable) continue;
      if (!e.writing) {
        if (!e.segment) {
          st = Status::Unavailable("segment " + std::to_string(id) + " has neither KV in memory nor a file");
          break;
        }
        submit_write_locked(e);  // its write failed before: once more
      }
      if (std::find(w.pending.begin(), w.pending.end(), id) == w.pending.end()) w.pending.push_back(id);
    }
    if (st.ok() && !w.pending.empty()) {
      w.done = std::move(done);
      waiters_.push_back(std::move(w));
      return;
    }
  }
  if (done) done(st);
}

Result<SegmentId> SegmentPool::add_cold(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options) {
  std::lock_guard lock(mu_);
  return add_cold_locked(parent, tokens, options);
}

Result<SegmentId> SegmentPool::add_cold_locked(SegmentId parent, std::span<const int32_t> tokens,
                                               const SegmentOptions& options) {
  mu_.assert_held();
  const ModelConfig& cfg = model_.config();
  if (tokens.empty()) return Status::InvalidArgument("segment has no tokens");
  if (static_cast<int64_t>(tokens.size()) > options_.max_segment_tokens) {
    return Status::InvalidArgument("segment of " + std::to_string(tokens.size()) + " tokens exceeds the limit of " +
                                   std::to_string(options_.max_segment_tokens));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= cfg.n_vocab) return Status::InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary");
  }
  if (parent != kNoSegment && !known_locked(parent)) {
    return Status::NotFound("unknown parent segment " + std::to_string(parent));
  }
  if (parent != kNoSegment && rest_.find(parent)) {
    return Status::Unavailable("parent segment " + std::to_string(parent) + " is at rest (coded only): wake it first");
  }
  if (options.derive_from != kNoSegment) {
    if (!known_locked(options.derive_from)) {
      return Status::NotFound("unknown segment " + std::to_string(options.derive_from) + " to derive from");
    }
    const int64_t rows = static_cast<int64_t>(end_locked(options.derive_from) - end_locked(parent_locked(options.derive_from)));
    if (options.derive_skip < 0 || options.derive_skip + static_cast<int64_t>(tokens.size()) > rows) {
      return Status::InvalidArgument("rows " + std::to_string(options.derive_skip) + " + " + std::to_string(tokens.size()) +
                                     " are outside segment " + std::to_string(options.derive_from));
    }
  }
  if (!options.modular_from.empty()) {
    int64_t rows = 0;
    for (SegmentId from : options.modular_from) {
      if (!known_locked(from)) return Status::NotFound("unknown segment " + std::to_string(from) + " to place modularly");
      rows += static_cast<int64_t>(end_locked(from) - end_locked(parent_locked(from)));
    }
    if (rows != static_cast<int64_t>(tokens.size()) || options.repair < 0) {
      return Status::InvalidArgument("the segments to place modularly do not hold these tokens");
    }
  }
  std::vector<int32_t> sequence;
  if (parent != kNoSegment) {
    auto seq = trie_.sequence(parent);
    if (!seq.ok()) return seq.status();
    sequence = std::move(seq.value());
  }
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  if (cfg.n_ctx_train > 0 && static_cast<int64_t>(sequence.size()) > cfg.n_ctx_train) {
    return Status::InvalidArgument("segment would end at position " + std::to_string(sequence.size()) +
                                   ", beyond the model's context of " + std::to_string(cfg.n_ctx_train));
  }
  // At rest under the same parent (the trie does not see it): that one, as below. A seal of the same
  // tokens gives it its KV (install puts it back in the trie); anything else wakes it first.
  SegmentId resting = kNoSegment;
  rest_.find_by_hash(parent, xxh3_tokens(tokens), [&](const RestRecord& r) {
    if (r.length == static_cast<int32_t>(tokens.size())) resting = r.id;
    return resting != kNoSegment;
  });
  if (resting != kNoSegment) return resting;
  auto m = trie_.match(sequence);
  // Already in the pool: one segment per token sequence (it may have been computed after another
  // chain of segments than `parent`'s; its own chain is what a tower over it holds).
  if (m.length == sequence.size()) {
    Entry& e = *entries_.at(m.segment);
    if (options.derive_from != kNoSegment && e.tier() == Tier::Cold && e.parent == parent && e.derive_from == kNoSegment) {
      // Waiting to be computed anyway (restored without a file, or a turn that failed): from the
      // source's rows, as a new one would be.
      e.derive_from = options.derive_from;
      e.derive_skip = options.derive_skip;
    }
    if (!options.modular_from.empty() && e.tier() == Tier::Cold && e.parent == parent && e.derive_from == kNoSegment) {
      e.modular_from = options.modular_from;
      e.repair = options.repair;
    }
    return m.segment;
  }
  auto id_or = allocate_id_locked(options);
  if (!id_or.ok()) return id_or.status();
  const SegmentId id = id_or.value();
  auto ins = trie_.insert(sequence, id);
  if (!ins.ok()) return ins.status();
  if (!ins.value().inserted) return ins.value().segment;
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->parent = parent;
  e->length = static_cast<int32_t>(tokens.size());
  e->computed_pos = static_cast<int32_t>(sequence.size() - tokens.size());
  e->format = options.format.value_or(options_.depth.at_depth(parent == kNoSegment ? 0 : depth_locked(parent) + 1));
  if (options.cold) e->coded = *options.cold;
  e->derive_from = options.derive_from;
  e->derive_skip = options.derive_skip;
  e->modular_from = options.modular_from;
  e->repair = options.repair;
  e->label = options.label;
  e->lineage = options.lineage;
  e->pinned = options.pinned;
  e->created = e->last_used = std::chrono::steady_clock::now();
  entries_.emplace(id, std::move(e));
  assert_invariants_locked();
  return id;
}

std::unique_ptr<Tower> SegmentPool::new_tower(std::vector<std::shared_ptr<const Segment>> segments,
                                              int32_t tail_capacity) const {
  return std::make_unique<Tower>(model_.config(), std::move(segments), tail_capacity, options_.tail_format);
}

Status SegmentPool::prefill_under_chain(SegmentId id, bool thawing, std::unique_lock<Mutex>& lock) {
  mu_.assert_held();
  auto ids = chain_ids_locked(id);
  if (ids.empty() || ids.back() != id) return Status::NotFound("unknown segment " + std::to_string(id));
  ids.pop_back();
  if (rest_.find(id)) return Status::Unavailable("segment " + std::to_string(id) + " went to rest again");
  std::vector<std::shared_ptr<const Segment>> parents;
  for (SegmentId p : ids) {
    if (rest_.find(p)) return Status::Unavailable("segment " + std::to_string(p) + " is not in memory");
    const Entry& pe = *entries_.at(p);
    if (!pe.segment) return Status::Unavailable("segment " + std::to_string(p) + " is not in memory");
    parents.push_back(pe.segment);
  }
  auto seq = trie_.sequence(id);
  if (!seq.ok()) return seq.status();
  Entry& e = *entries_.at(id);
  std::vector<int32_t> tokens(seq.value().begin() + e.computed_pos, seq.value().end());
  const KvQuant format = e.format;
  for (SegmentId p : ids) (void)trie_.acquire(p);
  (void)trie_.acquire(id);  // pinned: nobody removes it while the lock is down
  lock.unlock();
  auto tower = new_tower(std::move(parents), static_cast<int32_t>(tokens.size()));
  std::vector<float> logits;
  Status st = forward_.eval(*tower, tokens, Logits::Last, logits);
  std::shared_ptr<const Segment> seg;
  if (st.ok()) seg = tower->seal_tail(std::move(tokens), format, id);
  lock.lock();
  for (SegmentId p : ids) (void)trie_.release(p);
  (void)trie_.release(id);
  if (!st.ok()) return st.prefixed("cannot compute segment " + std::to_string(id) + ": ");
  if (!seg) return Status::Error("internal: sealing segment " + std::to_string(id) + " failed");
  if (e.tier() == Tier::Cold) {
    install_locked(e, std::move(seg));
    if (thawing) counters_.thaws++, counters_.thaw_tokens += e.length;
  }
  assert_invariants_locked();
  return Status::Ok();
}

Result<SegmentId> SegmentPool::add(SegmentId parent, std::span<const int32_t> tokens, const SegmentOptions& options) {
  check_may_wait("SegmentPool::add");
  SegmentOptions o = options;
  const bool stay_cold = o.cold.has_value();
  auto id = add_cold(parent, tokens, o);
  if (!id.ok() || stay_cold) return id;
  if (Status st = compute_chain(id.value(), id.value()); !st.ok()) return st;
  return id;
}

Status SegmentPool::adopt(const AdoptSpec& spec) {
  check_may_wait("SegmentPool::adopt");
  std::vector<int32_t> sequence;
  SegmentExpect expect;
  {
    std::lock_guard lock(mu_);
    if (spec.parent != kNoSegment && !entries_.count(spec.parent)) {  // in the trie: not at rest
      return Status::NotFound("its parent segment " + std::to_string(spec.parent) + " is not in the pool");
    }
    if (spec.parent != kNoSegment) {
      auto seq = trie_.sequence(spec.parent);
      if (!seq.ok()) return seq.status();
      sequence = std::move(seq.value());
    }
    expect.context_xxh3 = xxh3_tokens(sequence);
    if (auto it = entries_.find(spec.id); it != entries_.end()) {
      // Adopted already (sessions with the same transcript share segments): the same one, or a clash.
      auto seq = trie_.sequence(spec.id);
      std::vector<int32_t> want = sequence;
      want.insert(want.end(), spec.tokens.begin(), spec.tokens.end());
      if (it->second->parent == spec.parent && seq.ok() && seq.value() == want) return Status::Ok();
      return Status::Conflict("segment id " + std::to_string(spec.id) + " is in use by another segment");
    }
  }
  expect.id = spec.id;
  expect.parent = spec.parent;
  expect.computed_pos = static_cast<int32_t>(sequence.size());
  expect.tokens = spec.tokens;
  expect.format = spec.options.format;
  // Header checks only: O(1) per file, so a start maps thousands of them in well under a second.
  auto file = SegmentFile::open(file_path(spec.id), model_.config(), options_.model_fingerprint, &expect);
  if (!file.ok()) return file.status();
  const auto& h = file.value()->header();
  std::lock_guard lock(mu_);
  sequence.insert(sequence.end(), spec.tokens.begin(), spec.tokens.end());
  SegmentOptions o = spec.options;
  o.id = spec.id;
  o.format = static_cast<KvQuant>(h.format);
  auto added = add_cold_locked(spec.parent, spec.tokens, o);
  if (!added.ok()) return added.status();
  if (added.value() != spec.id) {
    return Status::Conflict("segment " + std::to_string(spec.id) + " duplicates segment " + std::to_string(added.value()));
  }
  Entry& e = *entries_.at(spec.id);
  e.durable = true;
  e.derived = (h.flags & segment_format::kFlagDerived) != 0;
  e.modular = (h.flags & segment_format::kFlagModular) != 0;
  e.file_bytes = file.value()->file_bytes();
  e.kv_bytes = 2 * h.kv_bytes + 4 * h.n_scales;
  assert_invariants_locked();
  return Status::Ok();
}

void SegmentPool::prefetch_headers(std::span<const SegmentId> ids) const {
  if (options_.store_dir.empty()) return;
  // The header and tokens of a segment of up to ~16k tokens; larger ones read the rest on demand.
  constexpr off_t kHeadBytes = 64 << 10;
  for (SegmentId id : ids) {
    const int fd = ::open(file_path(id).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // adopt() says why
    (void)::posix_fadvise(fd, 0, kHeadBytes, POSIX_FADV_WILLNEED);
    ::close(fd);
  }
}

void SegmentPool::reserve_ids(SegmentId id) {
  std::lock_guard lock(mu_);
  next_id_ = std::max(next_id_, id + 1);
}

size_t SegmentPool::collect_garbage() {
  check_may_wait("SegmentPool::collect_garbage");
  if (options_.store_dir.empty()) return 0;
  std::vector<std::filesystem::path> doomed;
  {
    std::lock_guard lock(mu_);
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(options_.store_dir, ec)) {
      const std::string name = f.path().filename().string();
      if (name.ends_with(".tmp")) {
        doomed.push_back(f.path());
        continue;
      }
      if (!name.starts_with(kFilePrefix) || !name.ends_with(kFileSuffix)) continue;
      SegmentId id = 0;
      const std::string num = name.substr(4, name.size() - 4 - 4);
      auto [p, err] = std::from_chars(num.data(), num.data() + num.size(), id);
      auto it = err == std::errc() && p == num.data() + num.size() ? entries_.find(id) : entries_.end();
      if (it == entries_.end() || (!it->second->durable && !it->second->writing)) doomed.push_back(f.path());
    }
  }
  for (const auto& p : doomed) (void)fs_.remove(p);
  if (!doomed.empty()) (void)fs_.sync_dir(options_.store_dir);
  // Records in the cold packs of segments no record names any more: dead.
  if (cold_pack_) {
    std::lock_guard lock(mu_);
    for (const ColdRecordRef& r : cold_pack_->entries()) {
      if (!known_locked(r.id)) unpack_.push_back(r.id);
    }
  }
  pack_resting();
  return doomed.size();
}

void SegmentPool::plan_step_locked(SegmentId id, PathPlan& p) const {
  mu_.assert_held();
  auto it = entries_.find(id);
  if (it == entries_.end()) {  // at rest
    if (auto x = rest_extra_.find(id); x != rest_extra_.end() && !x->second.damage.empty() && p.damaged.empty()) {
      p.damaged = x->second.damage;
    }
  }
  p.path.push_back(id);
  p.tiers.push_back(it == entries_.end() ? Tier::Cold : it->second->tier());
  p.ends.push_back(end_locked(id));
}

PathPlan SegmentPool::plan(std::span<const int32_t> tokens) const {
  std::lock_guard lock(mu_);
  PathPlan p;
  std::vector<SegmentId> chain = usable_chain_locked(tokens, false);
  extend_at_rest_locked(tokens, chain);
  for (SegmentId s : chain) plan_step_locked(s, p);
  return p;
}

PathPlan SegmentPool::plan_chain(SegmentId id) const {
  std::lock_guard lock(mu_);
  PathPlan p;
  for (SegmentId s : chain_ids_locked(id)) plan_step_locked(s, p);
  return p;
}

Result<Lease> SegmentPool::assemble(std::span<const int32_t> tokens, int32_t extra_capacity) {
  if (extra_capacity < 0) return Status::InvalidArgument("negative extra capacity");
  std::vector<std::shared_ptr<const Segment>> segs;
  Lease lease;
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (SegmentId s : usable_chain_locked(tokens, true)) {
      Entry& e = *entries_.at(s);
      (void)trie_.acquire(s);
      e.hits++;
      e.last_used = now;
      segs.push_back(e.segment);
      lease.path.push_back(s);
      lease.cached_tokens = static_cast<size_t>(e.computed_pos + e.length);
    }
    counters_.leases++;
    if (!lease.path.empty()) counters_.lease_hits++;
    counters_.cached_tokens += lease.cached_tokens;
    counters_.prefill_tokens += tokens.size() - lease.cached_tokens;
  }
  const int64_t tail = static_cast<int64_t>(tokens.size() - lease.cached_tokens) + extra_capacity;
  lease.tower = new_tower(std::move(segs), static_cast<int32_t>(tail));
  lease.tail_bytes = lease.tower->tail_bytes();
  std::lock_guard lock(mu_);
  tail_bytes_ += lease.tail_bytes;
  return lease;
}

Result<Lease> SegmentPool::lease_chain(SegmentId id, int32_t extra_capacity) {
  if (extra_capacity < 0) return Status::InvalidArgument("negative extra capacity");
  std::vector<std::shared_ptr<const Segment>> segs;
  Lease lease;
  {
    std::lock_guard lock(mu_);
    auto ids = id == kNoSegment ? std::vector<SegmentId>{} : chain_ids_locked(id);
    if (id != kNoSegment && (ids.empty() || ids.back() != id)) return Status::NotFound("unknown segment " + std::to_string(id));
    for (SegmentId s : ids) {
      auto it = entries_.find(s);
      if (it == entries_.end() || !it->second->segment) return Status::Unavailable("segment " + std::to_string(s) + " is not in memory");
    }
    const auto now = std::chrono::steady_clock::now();
    for (SegmentId s : ids) {
      Entry& e = *entries_.at(s);
      (void)trie_.acquire(s);
      e.last_used = now;
      segs.push_back(e.segment);
      lease.path.push_back(s);
      lease.cached_tokens += static_cast<size_t>(e.length);
    }
  }
  lease.tower = new_tower(std::move(segs), extra_capacity);
  lease.tail_bytes = lease.tower->tail_bytes();
  std::lock_guard lock(mu_);
  tail_bytes_ += lease.tail_bytes;
  return lease;
}

void SegmentPool::release(Lease& lease) {
  std::lock_guard lock(mu_);
  for (SegmentId id : lease.path) (void)trie_.release(id);
  tail_bytes_ -= std::min(tail_bytes_, lease.tail_bytes);
  lease.path.clear();
  lease.tower.reset();
  lease.cached_tokens = 0;
  lease.tail_bytes = 0;
}

Result<SegmentId> SegmentPool::seal(Lease& lease, std::vector<int32_t> tail_tokens, const SegmentOptions& options) {
  check_may_wait("SegmentPool::seal");
  if (!lease.tower) return Status::InvalidArgument("seal: empty lease");
  if (tail_tokens.empty() || static_cast<int32_t>(tail_tokens.size()) != lease.tower->tail_length()) {
    return Status::InvalidArgument("seal: " + std::to_string(tail_tokens.size()) + " tokens given for a tail of " +
                                   std::to_string(lease.tower->tail_length()));
  }
  std::lock_guard lock(mu_);
  const SegmentId parent = lease.path.empty() ? kNoSegment : lease.path.back();
  SegmentOptions o = options;
  if (!o.format) o.format = options_.depth.transcript;
  o.cold.reset();
  auto id = add_cold_locked(parent, tail_tokens, o);
  if (!id.ok()) return id.status();
  if (rest_.find(id.value())) {
    // These tokens went to rest under the same parent: back in the trie, and this tail is their KV.
    auto attached = attach_locked(id.value(), tail_tokens);
    if (!attached.ok()) return attached.status();
  }
  Entry& e = *entries_.at(id.value());
  if (e.parent != parent) {
    // These tokens are cached already as a segment computed after another chain (another session's
    // turns ended elsewhere). Its own chain is a valid tower for them; ours plus it would not be.
    auto ids = chain_ids_locked(e.id);
    for (SegmentId s : ids) {
      if (!entries_.at(s)->segment) {
        return Status::Conflict("seal: these tokens are segment " + std::to_string(e.id) +
                                " already, under another chain that is not in memory");
      }
    }
    std::vector<std::shared_ptr<const Segment>> segs;
    for (SegmentId s : ids) {
      (void)trie_.acquire(s);
      entries_.at(s)->last_used = std::chrono::steady_clock::now();
      segs.push_back(entries_.at(s)->segment);
    }
    for (SegmentId s : lease.path) (void)trie_.release(s);
    lease.tower = new_tower(std::move(segs), lease.tower->capacity() - lease.tower->size());
    lease.path = std::move(ids);
    retower_locked(lease);
    return e.id;
  }
  if (e.segment) {
    // Someone sealed the same tokens already: the tower switches to theirs, our copy of the rows goes.
    std::vector<std::shared_ptr<const Segment>> segs = lease.tower->segments();
    segs.push_back(e.segment);
    lease.tower = new_tower(std::move(segs), lease.tower->capacity() - lease.tower->size());
  } else {
    auto seg = lease.tower->seal_tail(std::move(tail_tokens), e.format, e.id);
    if (!seg) return Status::Error("internal: sealing the tail failed");
    if (e.tier() == Tier::Warm) delete_file_locked(e);  // ours is the same KV, in memory already
    install_locked(e, std::move(seg));
  }
  (void)trie_.acquire(e.id);
  e.last_used = std::chrono::steady_clock::now();
  lease.path.push_back(e.id);
  retower_locked(lease);
  return e.id;
}

void SegmentPool::retower_locked(Lease& lease) {
  mu_.assert_held();
  lease.cached_tokens = static_cast<size_t>(lease.tower->base_length());
  const size_t tail = lease.tower->tail_bytes();
  tail_bytes_ = tail_bytes_ - std::min(tail_bytes_, lease.tail_bytes) + tail;
  lease.tail_bytes = tail;
  assert_invariants_locked();
}

Result<SegmentPool::Entry*> SegmentPool::entry_for_kv_locked(SegmentId id, const Segment* segment, const char* verb) {
  mu_.assert_held();
  if (const RestRecord* r = rest_.find(id)) {
    if (!segment || segment->id() != id || segment->length() != r->length || segment->computed_pos() != r->computed_pos) {
      return Status::InvalidArgument(std::string(verb) + ": the KV given is not segment " + std::to_string(id));
    }
    // Gone to rest while it was being computed (its parents were leased, not it): back in the trie
    // with the tokens its KV was computed from. Refused only when the same tokens were added again
    // meanwhile: then it stays at rest (its record still brings it back) and that one serves them.
    auto attached = attach_locked(id, segment->tokens());
    return attached.ok() ? attached.value() : nullptr;
  }
  auto it = entries_.find(id);
  if (it == entries_.end()) return Status::NotFound("segment " + std::to_string(id) + " left the pool");
  Entry& e = *it->second;
  if (!segment || segment->id() != id || segment->length() != e.length || segment->computed_pos() != e.computed_pos) {
    return Status::InvalidArgument(std::string(verb) + ": the KV given is not segment " + std::to_string(id));
  }
  return &e;
}

Status SegmentPool::install(SegmentId id, std::shared_ptr<const Segment> segment, bool modular) {
  check_may_wait("SegmentPool::install");
  std::lock_guard lock(mu_);
  auto found = entry_for_kv_locked(id, segment.get(), "install");
  if (!found.ok()) return found.status();
  if (!found.value()) return Status::Ok();  // stays at rest: another segment serves its tokens
  Entry& e = *found.value();
  if (e.tier() != Tier::Cold) return Status::Ok();  // built twice, or paged in meanwhile: same bytes
  install_locked(e, std::move(segment), false, modular);
  counters_.thaws++;
  counters_.thaw_tokens += e.length;
  assert_invariants_locked();
  return Status::Ok();
}

Status SegmentPool::replace(SegmentId id, std::shared_ptr<const Segment> segment) {
  check_may_wait("SegmentPool::replace");
  std::lock_guard lock(mu_);
  auto found = entry_for_kv_locked(id, segment.get(), "replace");
  if (!found.ok()) return found.status();
  if (!found.value()) return Status::Ok();  // stays at rest: another segment serves its tokens
  Entry& e = *found.value();
  if (e.tier() == Tier::Cold) {
    install_locked(e, std::move(segment));
    return Status::Ok();
  }
  if (!e.modular) return Status::Ok();
  // One write per file at a time: a second one queued behind it would race it for the same path.
  if (e.writing) return Status::Unavailable("segment " + std::to_string(id) + ": its file is being written");
  // The old file stays until the new one is renamed over it: a crash meanwhile restarts modular.
  e.durable = false;
  e.verified = false;
  e.file_bytes = 0;
  install_locked(e, std::move(segment));
  assert_invariants_locked();
  return Status::Ok();
}

Status SegmentPool::derive(SegmentId id) {
  check_may_wait("SegmentPool::derive");
  std::unique_lock lock(mu_);
  return derive_locked(id, lock);
}

Status SegmentPool::derive_locked(SegmentId id, std::unique_lock<Mutex>& lock) {
  mu_.assert_held();
  auto it = entries_.find(id);
  if (it == entries_.end()) return Status::NotFound("unknown segment " + std::to_string(id));
  Entry* e = it->second.get();
  if (e->tier() != Tier::Cold) return Status::Ok();
  if (e->derive_from == kNoSegment) return Status::InvalidArgument("segment " + std::to_string(id) + " is not derived");
  if (rest_.find(e->derive_from)) return Status::Unavailable("segment " + std::to_string(e->derive_from) + " is not in memory");
  auto src_it = entries_.find(e->derive_from);
  if (src_it == entries_.end()) {
    e->derive_from = kNoSegment;
    return Status::NotFound("segment " + std::to_string(id) + ": the segment it is derived from left the pool");
  }
  std::shared_ptr<const Segment> src = src_it->second->segment;
  if (!src) return Status::Unavailable("segment " + std::to_string(e->derive_from) + " is not in memory");
  const SegmentId from = e->derive_from, parent = e->parent;
  const int32_t skip = e->derive_skip, length = e->length, pos = e->computed_pos;
  (void)trie_.acquire(id);
  (void)trie_.acquire(from);  // neither is removed while the lock is down
  lock.unlock();
  // The rows as they were computed, rotated to their new positions (the RoPE shift).
  std::shared_ptr<const Segment> part =
      skip > 0 || length != src->length() ? slice_segment(*src, skip, skip + length, id) : src;
  std::shared_ptr<const Segment> seg = part ? part->shifted(pos, rope_, id, parent) : nullptr;
  lock.lock();
  (void)trie_.release(id);
  (void)trie_.release(from);
  e = entries_.at(id).get();
  if (!seg || seg->length() != e->length) return Status::Error("internal: deriving segment " + std::to_string(id) + " failed");
  if (e->tier() == Tier::Cold) install_locked(*e, std::move(seg), true, false);
  assert_invariants_locked();
  return Status::Ok();
}

Status SegmentPool::remove(SegmentId id) {
  check_may_wait("SegmentPool::remove");
  Status st = remove_entry(id);
  pack_resting();  // its parent may have gone to rest; its own record is dead
  return st;
}

Status SegmentPool::remove_entry(SegmentId id) {
  std::lock_guard lock(mu_);
  if (rest_.find(id)) {
    if (rest_.has_children(id)) return Status::Conflict("segment " + std::to_string(id) + " has segments computed on top of it");
    erase_at_rest_locked(id);
    assert_invariants_locked();
    return Status::Ok();
  }
  auto it = entries_.find(id);
  if (it == entries_.end()) return Status::NotFound("unknown segment " + std::to_string(id));
  if (it->second->loading) return Status::Conflict("segment " + std::to_string(id) + " is being paged in");
  if (Status st = trie_.evict(id); !st.ok()) return Status::Conflict(st.message());
  const SegmentId parent = it->second->parent;
  delete_file_locked(*it->second);
  if (it->second->packed) unpack_.push_back(id);
  entries_.erase(it);
  if (parent != kNoSegment) rest_locked(parent);  // its last child in the trie may have gone
  assert_invariants_locked();
  return Status::Ok();
}

Status SegmentPool::retire(SegmentId id) {
  check_may_wait("SegmentPool::retire");
  std::lock_guard lock(mu_);
  if (rest_.has_children(id)) return Status::Conflict("segments at rest were computed on top of segment " + std::to_string(id));
  if (rest_.find(id)) {
    erase_at_rest_locked(id);
    assert_invariants_locked();
    return Status::Ok();
  }
  auto it = entries_.find(id);
  if (it == entries_.end()) return Status::NotFound("unknown segment " + std::to_string(id));
  Entry& e = *it->second;
  if (e.loading) return Status::Conflict("segment " + std::to_string(id) + " is being paged in");
  if (auto t = trie_.info(id); t.ok() && t.value().refcount > 0) return Status::Conflict("segment " + std::to_string(id) + " is in use");
  for (const auto& [other, o] : entries_) {
    if (o->parent == id) return Status::Conflict("segment " + std::to_string(other) + " was computed on top of it");
  }
  if (trie_.evict(id).ok()) {
    delete_file_locked(e);
    if (e.packed) unpack_.push_back(id);
    entries_.erase(it);
  } else {
    // Only the trie holds on to it: segments of other chains extend its tokens (the text was edited
    // by appending to it). Its KV and file go; its tokens stay, cold (a prefill brings it back).
    drop_kv_locked(e);
    delete_file_locked(e);
    e.pinned = false;
    e.modular = false;
    e.coded.clear();
  }
  assert_invariants_locked();
  return Status::Ok();
}

std::vector<uint8_t> SegmentPool::coded(SegmentId id) const {
  std::lock_guard lock(mu_);
  if (auto x = rest_extra_.find(id); x != rest_extra_.end()) return x->second.coded;
  auto it = entries_.find(id);
  return it == entries_.end() ? std::vector<uint8_t>{} : it->second->coded;
}

std::shared_ptr<const Segment> SegmentPool::get(SegmentId id) {
  (void)page_in(std::span(&id, 1));
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second->segment;
}

std::shared_ptr<const Segment> SegmentPool::get_hot(SegmentId id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second->segment;
}

SegmentInfo SegmentPool::info_locked(const RestRecord& r) const {
  mu_.assert_held();
  SegmentInfo s;
  s.id = r.id;
  s.parent = r.parent;
  s.label = r.label;
  if (r.lineage_is_label) s.lineage = r.label;
  else if (auto x = rest_extra_.find(r.id); x != rest_extra_.end()) s.lineage = x->second.lineage;
  s.length = r.length;
  s.begin = r.computed_pos;
  s.format = r.format;
  s.tier = Tier::Cold;
  s.depth = depth_locked(r.id);
  return s;
}

SegmentInfo SegmentPool::info_locked(const Entry& e) const {
  mu_.assert_held();
  SegmentInfo s;
  s.id = e.id;
  s.parent = e.parent;
  s.label = e.label;
  s.lineage = e.lineage;
  s.length = e.length;
  s.begin = e.computed_pos;
  s.format = e.format;
  s.kv_bytes = e.kv_bytes;
  s.pinned = e.pinned;
  s.tier = e.tier();
  s.durable = e.durable;
  s.derived = e.derived;
  s.derive_from = e.derive_from;
  s.modular = e.modular && e.tier() != Tier::Cold;
  s.modular_from = e.modular_from;
  s.repair = e.repair;
  s.hits = e.hits;
  s.created = e.created;
  s.last_used = e.last_used;
  s.depth = depth_locked(e.id);
  if (auto t = trie_.info(s.id); t.ok()) {
    s.refcount = t.value().refcount;
    s.fan_out = t.value().fan_out;
  }
  if (s.fan_out >= options_.pin_fan_out) s.pinned = true;
  return s;
}

std::optional<SegmentInfo> SegmentPool::info(SegmentId id) const {
  std::lock_guard lock(mu_);
  if (const RestRecord* r = rest_.find(id)) return info_locked(*r);
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
  // Then those at rest, parents before children (a parent ends before its children start).
  std::vector<const RestRecord*> resting;
  for (const RestRecord& r : rest_.records()) resting.push_back(&r);
  std::sort(resting.begin(), resting.end(), [](const RestRecord* a, const RestRecord* b) {
    return std::pair(a->computed_pos, a->id) < std::pair(b->computed_pos, b->id);
  });
  for (const RestRecord* r : resting) out.push_back(info_locked(*r));
  return out;
}

Result<std::vector<int32_t>> SegmentPool::sequence(SegmentId id) const {
  std::lock_guard lock(mu_);
  return trie_.sequence(id);
}

PoolStats SegmentPool::stats() const {
  PoolStats s;
  std::vector<std::pair<size_t, std::shared_ptr<SegmentFile>>> mapped;  // depth, file
  {
    std::lock_guard lock(mu_);
    s = counters_;
    s.segments = entries_.size() + rest_.size();
    for (const auto& [id, e] : entries_) {
      const size_t b = e->kv_bytes, d = depth_locked(id);
      s.count_by_depth[d] += 1;
      if (e->tier() != Tier::Cold) {
        s.kv_bytes += b;
        s.bytes_by_depth[d] += b;
        s.bytes_by_format[simd::kv_quant_name(e->format)] += b;
      }
      if (e->durable) {
        s.disk_bytes += e->file_bytes;
        s.disk_by_depth[d] += e->file_bytes;
      }
      switch (e->tier()) {
        case Tier::Hot:
          s.hot_segments++, s.hot_bytes += e->resident_bytes();
          if (e->owned()) s.owned_bytes += e->kv_bytes, s.resident_by_depth[d] += e->kv_bytes;
          else mapped.emplace_back(d, e->file);
          break;
        case Tier::Warm: s.warm_segments++, s.warm_bytes += e->file_bytes; break;
        case Tier::Cold: s.cold_segments++, s.cold_bytes += e->coded.size(); break;
      }
      s.packed_segments += e->packed;
      // The entry, its node in entries_ (key, links, colour: ~48 bytes) and what it owns on the heap
      // (strings beyond their in-place buffer of 15 characters).
      auto heap = [](const std::string& t) { return t.size() > 15 ? t.capacity() + 1 : 0; };
      s.entry_bytes += sizeof(Entry) + 48 + e->coded.capacity() + heap(e->label) + heap(e->lineage) +
                       e->modular_from.capacity() * sizeof(SegmentId);
      const bool pending = e->tier() == Tier::Cold && !e->modular_from.empty();
      s.modular_segments += pending || (e->tier() != Tier::Cold && e->modular);
      s.placements_pending += pending;
    }
    // At rest: a compact record each (mmapstore/rest_table.h), and the few extras beside them.
    for (const RestRecord& r : rest_.records()) {
      s.count_by_depth[depth_locked(r.id)] += 1;
      s.packed_segments += r.packed;
    }
    s.at_rest_segments = rest_.size();
    s.cold_segments += rest_.size();
    s.entry_bytes += rest_.bytes() + rest_extra_.bucket_count() * sizeof(void*);
    for (const auto& [id, x] : rest_extra_) {
      s.at_rest_bytes += x.coded.size();
      s.cold_bytes += x.coded.size();
      s.entry_bytes += sizeof(RestExtra) + 32 + x.coded.capacity() + x.damage.capacity() + x.lineage.capacity();
    }
    s.tail_bytes = tail_bytes_;
    const CacheTrie::Stats trie = trie_.stats();
    s.trie_bytes = trie.bytes;
    s.token_bytes = trie.edge_tokens * sizeof(int32_t);
  }
  if (cold_pack_) {
    const ColdPackStats p = cold_pack_->stats();
    s.pack_record_bytes = p.record_bytes;
    s.pack_disk_bytes = p.pack_bytes + p.index_bytes;
    s.pack_dead_bytes = p.dead_bytes;
  }
  // What the kernel really holds of the mappings (it may reclaim pages of a mapped file).
  for (const auto& [d, f] : mapped) {
    const size_t resident = f->resident_bytes();
    s.resident_by_depth[d] += resident;
    s.mapped_by_depth[d] += f->file_bytes() - resident;
  }
  s.resident_bytes = s.hot_bytes + s.tail_bytes;
  return s;
}

void SegmentPool::flush_writes() {
  if (writer_) writer_->flush();
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
  ram_budget_.store(bytes, std::memory_order_relaxed);
}

void SegmentPool::set_disk_budget(size_t bytes) {
  std::lock_guard lock(mu_);
  options_.disk_budget_bytes = bytes;
}

Status SegmentPool::check_invariants() const {
  std::lock_guard lock(mu_);
  if (Status st = trie_.check_invariants(); !st.ok()) return st;
  if (trie_.size() != entries_.size()) {
    return Status::Corruption("the trie holds " + std::to_string(trie_.size()) + " segments, the pool " +
                              std::to_string(entries_.size()) + " (and " + std::to_string(rest_.size()) + " at rest)");
  }
  for (const RestRecord& r : rest_.records()) {
    const std::string which = "segment " + std::to_string(r.id) + ": ";
    if (rest_.find(r.id) != &r) return Status::Corruption(which + "its record at rest is not indexed");
    if (trie_.contains(r.id) || entries_.count(r.id)) return Status::Corruption(which + "at rest and in the trie");
    bool indexed = false;
    rest_.find_by_hash(r.parent, r.tokens_xxh3, [&](const RestRecord& o) { return indexed = &o == &r; });
    if (!indexed) return Status::Corruption(which + "at rest but not found by its hash");
    auto x = rest_extra_.find(r.id);
    if (!r.packed && (x == rest_extra_.end() || x->second.coded.empty())) {
      return Status::Corruption(which + "at rest without a coded record");
    }
    if (r.parent != kNoSegment && !known_locked(r.parent)) return Status::Corruption(which + "its parent is gone");
    if (r.computed_pos != static_cast<int32_t>(r.parent == kNoSegment ? 0 : end_locked(r.parent))) {
      return Status::Corruption(which + "at rest at the wrong position");
    }
  }
  for (const auto& [id, x] : rest_extra_) {
    if (!rest_.find(id)) return Status::Corruption("segment " + std::to_string(id) + ": notes at rest, but it is not");
  }
  for (const auto& [id, e] : entries_) {
    const std::string which = "segment " + std::to_string(id) + ": ";
    if (e->parent != kNoSegment && rest_.find(e->parent)) return Status::Corruption(which + "in the trie below a segment at rest");
    if (!trie_.contains(id)) return Status::Corruption(which + "missing from the trie");
    if (e->parent != kNoSegment && !entries_.count(e->parent)) return Status::Corruption(which + "its parent is gone");
    if (e->segment && (e->segment->id() != id || e->segment->length() != e->length)) {
      return Status::Corruption(which + "holds another segment's KV");
    }
    if (e->file && !e->durable) return Status::Corruption(which + "mapped but not durable");
    if (e->file && !e->segment) return Status::Corruption(which + "mapped without a segment");
  }
  return Status::Ok();
}

void SegmentPool::assert_invariants_locked() const {
  mu_.assert_held();
#ifndef NDEBUG
  // Debug builds check after every change (LevelDB style); the trie's own check is the costly part.
  assert(trie_.check_invariants().ok());
  for (const auto& [id, e] : entries_) {
    assert(trie_.contains(id));
    assert(!e->segment || e->segment->id() == id);
    assert(!e->file || (e->durable && e->segment));
  }
#endif
}

}  // namespace towers

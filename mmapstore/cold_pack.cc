#include "mmapstore/cold_pack.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>

#include "mmapstore/record_log.h"

namespace towers {

namespace {

constexpr const char* kIndexName = "index.twi";
constexpr const char* kPackPrefix = "pack-";
constexpr const char* kPackSuffix = ".twp";
constexpr size_t kEntryBodyBytes = kColdIndexEntryBytes - 4;
// The index is rewritten at open when it holds this many times more entries than live segments.
constexpr size_t kIndexRewriteFactor = 2;
constexpr size_t kIndexRewriteMinEntries = 4096;

template <typename T>
void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
}
template <typename T>
T get(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return static_cast<T>(v);
}

std::string encode_entry(const ColdRecordRef& r) {
  std::string e;
  e.reserve(kColdIndexEntryBytes);
  put<uint64_t>(e, r.id);
  put<uint64_t>(e, r.parent);
  put<uint64_t>(e, r.tokens_xxh3);
  put<uint64_t>(e, r.offset);
  put<uint32_t>(e, r.length);
  put<uint32_t>(e, r.crc);
  put<uint32_t>(e, static_cast<uint32_t>(r.tokens));
  put<uint32_t>(e, r.pack);
  put<uint32_t>(e, crc32c(e));
  return e;
}

bool decode_entry(const char* p, ColdRecordRef* r) {
  if (get<uint32_t>(p + kEntryBodyBytes) != crc32c(std::string_view(p, kEntryBodyBytes))) return false;
  r->id = get<uint64_t>(p);
  r->parent = get<uint64_t>(p + 8);
  r->tokens_xxh3 = get<uint64_t>(p + 16);
  r->offset = get<uint64_t>(p + 24);
  r->length = get<uint32_t>(p + 32);
  r->crc = get<uint32_t>(p + 36);
  r->tokens = static_cast<int32_t>(get<uint32_t>(p + 40));
  r->pack = get<uint32_t>(p + 44);
  return true;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

uint32_t record_crc(std::span<const uint8_t> record) {
  return crc32c(std::string_view(reinterpret_cast<const char*>(record.data()), record.size()));
}

}  // namespace

std::filesystem::path ColdPack::pack_path(uint32_t pack) const {
  return dir_ / (kPackPrefix + std::to_string(pack) + kPackSuffix);
}

Result<std::unique_ptr<ColdPack>> ColdPack::open(const std::filesystem::path& dir, FileSystem& fs,
                                                 ColdPackOptions options, ColdPackReport* report) {
  ColdPackReport local;
  ColdPackReport& rep = report ? *report : local;
  std::error_code ec;
  std::unique_ptr<ColdPack> p(new ColdPack(dir, fs, options));
  // Nothing was ever packed here: the directory and index are made by the first append.
  if (!std::filesystem::exists(dir / kIndexName, ec)) return p;
  const auto index_path = dir / kIndexName;

  // The index: whole entries whose CRC holds; the tail after the last good one is torn.
  std::string index;
  {
    std::ifstream in(index_path, std::ios::binary | std::ios::ate);
    if (in) {
      index.resize(static_cast<size_t>(in.tellg()));
      in.seekg(0);
      in.read(index.data(), static_cast<std::streamsize>(index.size()));
      index.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
    }
  }
  p->live_.reserve(index.size() / kColdIndexEntryBytes);
  uint64_t valid_end = 0;
  std::map<uint32_t, uint64_t> indexed_end;  // per pack: end of the last record an entry names
  size_t entries = 0;
  for (size_t at = 0; at + kColdIndexEntryBytes <= index.size(); at += kColdIndexEntryBytes) {
    ColdRecordRef r;
    if (!decode_entry(index.data() + at, &r)) {
      ++rep.damaged;
      rep.problems.push_back("cold index entry at byte " + std::to_string(at) + ": checksum mismatch; skipped");
      continue;
    }
    ++entries;
    valid_end = at + kColdIndexEntryBytes;
    if (r.length == 0) {
      p->drop_live_locked(r.id);
      continue;
    }
    p->put_live_locked(r);
    uint64_t& end = indexed_end[r.pack];
    end = std::max(end, r.offset + r.length);
  }
  // Damaged entries after the last good one are the torn tail, not damage in the middle.
  if (index.size() > valid_end) {
    const size_t tail_entries = (index.size() - valid_end) / kColdIndexEntryBytes;
    rep.damaged -= std::min(rep.damaged, tail_entries);
    rep.problems.resize(rep.problems.size() - std::min(rep.problems.size(), tail_entries));
    rep.torn_index_bytes = index.size() - valid_end;
    rep.problems.push_back("cold index: torn tail of " + std::to_string(rep.torn_index_bytes) + " bytes cut");
  }
  rep.entries = entries;
  rep.live = p->live_.size();

  // Pack files: bytes after the last record an entry names were never acknowledged.
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(kPackPrefix, 0) != 0 || name.size() <= std::string_view(kPackPrefix).size() + 4 ||
        name.substr(name.size() - 4) != kPackSuffix) {
      continue;
    }
    uint32_t n = 0;
    const char* b = name.data() + std::string_view(kPackPrefix).size();
    const char* e = name.data() + name.size() - 4;
    if (auto [ptr, err] = std::from_chars(b, e, n); err != std::errc() || ptr != e) continue;
    const uint64_t size = f.file_size(ec);
    const uint64_t keep = indexed_end.count(n) ? indexed_end[n] : 0;
    if (size > keep) {
      auto w = fs.open_append(f.path());
      if (!w.ok()) return w.status();
      if (Status st = w.value()->truncate(keep); !st.ok()) return st;
      if (Status st = w.value()->sync(); !st.ok()) return st;
      rep.torn_pack_bytes += size - keep;
    }
    p->pack_sizes_[n] = std::min(size, keep);
    p->current_ = std::max(p->current_, n);
  }

  const bool rewrite = entries >= kIndexRewriteMinEntries && entries > kIndexRewriteFactor * p->live_.size();
  if (rewrite) {
    std::string live;
    live.reserve(p->live_.size() * kColdIndexEntryBytes);
    for (const ColdRecordRef& r : p->entries()) live += encode_entry(r);
    const std::span<const uint8_t> parts[] = {bytes_of(live)};
    if (Status st = write_file_atomic(fs, index_path, parts); !st.ok()) return st;
    rep.rewrote_index = true;
  }
  auto w = fs.open_append(index_path);
  if (!w.ok()) return w.status();
  p->index_ = std::move(w.value());
  if (!rewrite && p->index_->size() > valid_end) {
    if (Status st = p->index_->truncate(valid_end); !st.ok()) return st;
    if (Status st = p->index_->sync(); !st.ok()) return st;
  }
  return p;
}

Status ColdPack::ensure_index_locked() {
  if (index_) return Status::Ok();
  std::error_code ec;
  if (!std::filesystem::exists(dir_, ec)) {
    std::filesystem::create_directories(dir_, ec);
    if (ec) return Status::IOError("cannot create " + dir_.string() + ": " + ec.message());
    if (Status st = fs_.sync_dir(dir_.parent_path()); !st.ok()) return st;
  }
  // Its name is made durable with the first pack's (append syncs the directory before any entry).
  auto w = fs_.open_append(dir_ / kIndexName);
  if (!w.ok()) return w.status();
  index_ = std::move(w.value());
  index_is_new_ = true;
  return Status::Ok();
}

ColdPack::~ColdPack() {
  for (auto& [n, fd] : read_fds_) ::close(fd);
}

Status ColdPack::append_entries_locked(std::span<const ColdRecordRef> refs) {
  std::string entries;
  entries.reserve(refs.size() * kColdIndexEntryBytes);
  for (const ColdRecordRef& r : refs) entries += encode_entry(r);
  const uint64_t before = index_->size();
  if (Status st = index_->append(bytes_of(entries)); !st.ok()) {
    // Cut back so a half entry never precedes later ones; if even that fails, stop writing.
    if (!index_->truncate(before).ok()) failed_ = st;
    return st;
  }
  if (Status st = index_->sync(); !st.ok()) {
    failed_ = st;
    return st;
  }
  return Status::Ok();
}

Result<std::vector<ColdRecordRef>> ColdPack::append(std::span<const ColdPut> puts) {
  std::lock_guard lock(mu_);
  if (!failed_.ok()) return failed_;
  if (Status st = ensure_index_locked(); !st.ok()) return st;
  std::vector<ColdRecordRef> refs;
  refs.reserve(puts.size());
  bool made_file = index_is_new_;
  auto sync_pack = [&]() -> Status {
    if (!pack_) return Status::Ok();
    if (Status st = pack_->sync(); !st.ok()) {
      failed_ = st;
      return st;
    }
    return Status::Ok();
  };
  for (const ColdPut& put : puts) {
    if (put.record.empty() || put.record.size() > UINT32_MAX) {
      return Status::InvalidArgument("cold record of segment " + std::to_string(put.id) + " has " +
                                     std::to_string(put.record.size()) + " bytes");
    }
    if (pack_ && pack_->size() >= options_.pack_bytes) {
      if (Status st = sync_pack(); !st.ok()) return st;
      pack_.reset();
      ++current_;
    }
    while (!pack_) {
      const auto path = pack_path(current_);
      std::error_code ec;
      made_file = made_file || !std::filesystem::exists(path, ec);
      auto w = fs_.open_append(path);
      if (!w.ok()) return w.status();
      pack_ = std::move(w.value());
      if (pack_->size() >= options_.pack_bytes) {  // full from an earlier run: the next one
        pack_.reset();
        ++current_;
      }
    }
    const uint64_t offset = pack_->size();
    if (Status st = pack_->append(put.record); !st.ok()) {
      if (!pack_->truncate(offset).ok()) failed_ = st;
      return st;
    }
    pack_sizes_[current_] = pack_->size();
    refs.push_back({put.id, put.parent, put.tokens_xxh3, put.tokens, current_, offset,
                    static_cast<uint32_t>(put.record.size()), record_crc(put.record)});
  }
  // The records first, then the entries that name them (an entry never names bytes not on disk).
  // A pack closed above was synced when it was closed.
  if (Status st = sync_pack(); !st.ok()) return st;
  if (made_file) {
    if (Status st = fs_.sync_dir(dir_); !st.ok()) {
      failed_ = st;
      return st;
    }
    index_is_new_ = false;
  }
  if (Status st = append_entries_locked(refs); !st.ok()) return st;
  for (const ColdRecordRef& r : refs) put_live_locked(r);
  return refs;
}

Status ColdPack::remove(std::span<const uint64_t> ids) {
  std::lock_guard lock(mu_);
  if (!failed_.ok()) return failed_;
  std::vector<ColdRecordRef> gone;
  for (uint64_t id : ids) {
    if (live_.find(id)) gone.push_back({.id = id});
  }
  if (gone.empty()) return Status::Ok();
  if (Status st = append_entries_locked(gone); !st.ok()) return st;
  for (const ColdRecordRef& r : gone) drop_live_locked(r.id);
  return Status::Ok();
}

int ColdPack::read_fd_locked(uint32_t pack) const {
  if (auto it = read_fds_.find(pack); it != read_fds_.end()) return it->second;
  const int fd = ::open(pack_path(pack).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) read_fds_[pack] = fd;
  return fd;
}

Result<std::vector<uint8_t>> ColdPack::read(const ColdRecordRef& ref) const {
  const std::string who = "segment " + std::to_string(ref.id) + "'s cold record (" + pack_path(ref.pack).string() +
                          " at " + std::to_string(ref.offset) + ")";
  int fd = -1;
  {
    std::lock_guard lock(mu_);
    fd = read_fd_locked(ref.pack);
    if (fd < 0) return errno_status("cannot open " + who + ":", pack_path(ref.pack), errno);
  }
  // Pack files are only ever appended to (never rewritten while open): the fd stays valid unlocked.
  std::vector<uint8_t> out(ref.length);
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(ref.offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_status("cannot read " + who + ":", pack_path(ref.pack), errno);
    if (r == 0) return Status::Corruption(who + ": the pack ends " + std::to_string(out.size() - done) + " bytes early");
    done += static_cast<size_t>(r);
  }
  if (record_crc(out) != ref.crc) return Status::Corruption(who + ": CRC mismatch");
  return out;
}

void ColdPack::put_live_locked(const ColdRecordRef& r) {
  if (ColdRecordRef* old = live_.find(r.id)) {
    live_bytes_ -= old->length;
    *old = r;
  } else {
    live_.insert(r);
  }
  live_bytes_ += r.length;
}

void ColdPack::drop_live_locked(uint64_t id) {
  if (const ColdRecordRef* old = live_.find(id)) {
    live_bytes_ -= old->length;
    live_.erase(id);
  }
}

bool ColdPack::find(uint64_t id, ColdRecordRef* ref) const {
  std::lock_guard lock(mu_);
  const ColdRecordRef* r = live_.find(id);
  if (r && ref) *ref = *r;
  return r != nullptr;
}

std::vector<ColdRecordRef> ColdPack::entries() const {
  std::vector<ColdRecordRef> out;
  {
    std::lock_guard lock(mu_);
    out = live_.items();
  }
  std::sort(out.begin(), out.end(), [](const ColdRecordRef& a, const ColdRecordRef& b) { return a.id < b.id; });
  return out;
}

ColdPackStats ColdPack::stats() const {
  std::lock_guard lock(mu_);
  ColdPackStats s;
  s.records = live_.size();
  s.record_bytes = live_bytes_;
  s.index_bytes = index_ ? index_->size() : 0;
  for (const auto& [n, size] : pack_sizes_) s.pack_bytes += size;
  s.packs = pack_sizes_.size();
  s.dead_bytes = s.pack_bytes - std::min(s.pack_bytes, live_bytes_);
  return s;
}

}  // namespace towers

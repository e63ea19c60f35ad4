#include "daemon/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace towers::daemon {

Result<std::unique_ptr<StateStore>> StateStore::open(const std::filesystem::path& dir, std::vector<Record>& records,
                                                     std::vector<std::string>& problems) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error("cannot create state directory " + dir.string() + ": " + ec.message());
  auto store = std::unique_ptr<StateStore>(new StateStore());
  // One writer per state directory: a second towerd, or an offline towerctl verb while towerd runs,
  // would interleave records with ours. The lock goes when the process does (even on a crash).
  const auto lock_path = dir / "towerd.lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (store->lock_fd_ < 0) return Status::Error("cannot open " + lock_path.string() + ": " + std::strerror(errno));
  if (flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status::Error(dir.string() + " is in use by another process (a running towerd, or a towerctl verb on it): " +
                         std::strerror(errno));
  }
  store->path_ = dir / "towerd.log";
  auto rep = read_record_log(store->path_, [&](const LogRecord& r) {
    auto rec = parse_record(static_cast<RecordType>(r.type), r.payload);
    if (!rec.ok()) {
      problems.push_back(store->path_.string() + ": record at offset " + std::to_string(r.offset) + ": " +
                         rec.error() + "; skipped");
      return;
    }
    records.push_back(std::move(rec.value()));
  });
  if (!rep.ok()) return rep.status();
  for (auto& p : rep->problems) problems.push_back(p);
  auto w = RecordLogWriter::open(store->path_);
  if (!w.ok()) return w.status();
  store->writer_ = std::move(w.value());
  return store;
}

StateStore::~StateStore() {
  writer_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status StateStore::append(const Record& record) {
  const std::string payload = record_payload(record);
  std::lock_guard lock(mu_);
  return writer_->append(static_cast<uint8_t>(type_of(record)), payload, /*sync=*/true);
}

Status StateStore::compact(const std::vector<Record>& live) {
  std::vector<RecordToWrite> recs;
  recs.reserve(live.size());
  for (const auto& r : live) recs.push_back({static_cast<uint8_t>(type_of(r)), record_payload(r)});
  std::lock_guard lock(mu_);
  if (Status st = rewrite_record_log(path_, recs); !st.ok()) return st;
  auto w = RecordLogWriter::open(path_);
  if (!w.ok()) return w.status();
  writer_ = std::move(w.value());
  return Status::Ok();
}

uint64_t StateStore::bytes() const {
  std::lock_guard lock(mu_);
  return writer_->size();
}

}  // namespace towers::daemon

#include "daemon/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace towers::daemon {

Result<std::unique_ptr<StateStore>> StateStore::open(const std::filesystem::path& dir, std::vector<Record>& records,
                                                     std::vector<std::string>& problems, FileSystem& fs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error("cannot create state directory " + dir.string() + ": " + ec.message());
  auto store = std::unique_ptr<StateStore>(new StateStore(fs));
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
  auto w = RecordLogWriter::open(store->path_, nullptr, fs);
  if (!w.ok()) return w.status();
  store->writer_ = std::move(w.value());
  store->completer_ = std::thread([s = store.get()] { s->complete_loop(); });
  store->thread_ = std::thread([s = store.get()] { s->loop(); });
  return store;
}

StateStore::~StateStore() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  if (completer_.joinable()) {  // after the writer: its last callbacks are queued by now
    {
      std::lock_guard lock(completions_mu_);
      completions_stop_ = true;
    }
    completions_wake_.notify_all();
    completer_.join();
  }
  writer_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void StateStore::append_async(const Record& record, std::function<void(const Status&)> done) {
  Pending p{static_cast<uint8_t>(type_of(record)), record_payload(record), std::move(done)};
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(p));
  }
  wake_.notify_all();
}

Status StateStore::append(const Record& record) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Status> result;
  Pending p{static_cast<uint8_t>(type_of(record)), record_payload(record), [&](const Status& st) {
              std::lock_guard lock(m);
              result = st;
              cv.notify_all();
            },
            /*signal_only=*/true};
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(p));
  }
  wake_.notify_all();
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return result.has_value(); });
  return *result;
}

void StateStore::loop() {
  for (;;) {
    std::deque<Pending> batch;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      batch.swap(queue_);  // group commit: everything that queued up meanwhile
    }
    std::vector<Status> result(batch.size());
    {
      std::lock_guard lock(write_mu_);
      Status st;
      size_t written = 0;
      for (; written < batch.size() && st.ok(); ++written) {
        if (batch[written].type == 0) continue;  // a barrier (compact): nothing to write
        st = writer_->append(batch[written].type, batch[written].payload, /*sync=*/false);
        if (!st.ok()) result[written] = st;
      }
      if (st.ok()) {
        st = writer_->sync();
        ++syncs_;
      }
      // One failure fails the batch from there on: what follows a record that is not durable must
      // not be acknowledged either (a later record behind a hole would replay without it).
      for (size_t i = 0; i < batch.size(); ++i) {
        if (result[i].ok()) result[i] = st.ok() ? Status::Ok() : st;
      }
    }
    bool queued = false;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].done) continue;
      if (batch[i].signal_only) {
        batch[i].done(result[i]);
        continue;
      }
      std::lock_guard lock(completions_mu_);
      completions_.emplace_back(std::move(batch[i].done), result[i]);
      queued = true;
    }
    if (queued) completions_wake_.notify_all();
  }
}

void StateStore::complete_loop() {
  for (;;) {
    std::pair<std::function<void(const Status&)>, Status> c;
    {
      std::unique_lock lock(completions_mu_);
      completions_wake_.wait(lock, [&] { return completions_stop_ || !completions_.empty(); });
      if (completions_.empty()) return;
      c = std::move(completions_.front());
      completions_.pop_front();
    }
    c.first(c.second);
  }
}

Status StateStore::compact(const std::vector<Record>& live) {
  std::vector<RecordToWrite> recs;
  recs.reserve(live.size());
  for (const auto& r : live) recs.push_back({static_cast<uint8_t>(type_of(r)), record_payload(r)});
  // Records queued before the compaction were already applied to the state `live` describes: let the
  // writer finish them first, so none lands in the old file after the rewrite.
  (void)append_barrier();
  std::lock_guard lock(write_mu_);
  if (Status st = rewrite_record_log(path_, recs, fs_); !st.ok()) return st;
  auto w = RecordLogWriter::open(path_, nullptr, fs_);
  if (!w.ok()) return w.status();
  writer_ = std::move(w.value());
  return Status::Ok();
}

Status StateStore::append_barrier() {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Pending{0, {}, [&](const Status&) {
                               std::lock_guard l(m);
                               done = true;
                               cv.notify_all();
                             },
                             /*signal_only=*/true});
  }
  wake_.notify_all();
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return done; });
  return Status::Ok();
}

uint64_t StateStore::bytes() const {
  std::lock_guard lock(write_mu_);
  return writer_->size();
}

uint64_t StateStore::syncs() const {
  std::lock_guard lock(write_mu_);
  return syncs_;
}

}  // namespace towers::daemon

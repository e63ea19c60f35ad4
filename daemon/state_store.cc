#include "daemon/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "engine/base/no_wait_lock.h"

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
  store->bytes_ = store->writer_->size();
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

void StateStore::enqueue(Pending p) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(p));
  }
  wake_.notify_all();
}

Status StateStore::enqueue_and_wait(Pending p) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Status> result;
  p.done = [&](const Status& st) {
    std::lock_guard lock(m);
    result = st;
    cv.notify_all();
  };
  p.signal_only = true;
  enqueue(std::move(p));
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return result.has_value(); });
  return *result;
}

void StateStore::append_async(const Record& record, std::function<void(const Status&)> done) {
  Pending p;
  p.type = static_cast<uint8_t>(type_of(record));
  p.payload = record_payload(record);
  p.done = std::move(done);
  enqueue(std::move(p));
}

Status StateStore::append(const Record& record) {
  check_may_wait("StateStore::append");
  Pending p;
  p.type = static_cast<uint8_t>(type_of(record));
  p.payload = record_payload(record);
  return enqueue_and_wait(std::move(p));
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
      // Once an append or a sync fails, everything after it in the batch fails too: what follows a
      // record that is not durable must not be acknowledged (a later record behind a hole would replay
      // without it). failed_: a compacted log that could not be reopened.
      Status st = failed_;
      std::vector<size_t> unsynced;  // appended since the last sync
      auto sync = [&] {
        if (unsynced.empty()) return;
        if (st.ok()) {
          st = writer_->sync();
          syncs_.fetch_add(1, std::memory_order_relaxed);
        }
        for (size_t i : unsynced) {
          if (result[i].ok()) result[i] = st;
        }
        unsynced.clear();
      };
      for (size_t i = 0; i < batch.size(); ++i) {
        Pending& p = batch[i];
        if (p.compaction) {
          sync();  // the records before it are durable in the old file before the file is replaced
          result[i] = st.ok() ? rewrite_locked(*p.compaction) : st;
          st = failed_.ok() ? st : failed_;
          continue;
        }
        if (!st.ok()) {
          result[i] = st;
          continue;
        }
        st = writer_->append(p.type, p.payload, /*sync=*/false);
        if (!st.ok()) result[i] = st;
        else unsynced.push_back(i);
      }
      sync();
      bytes_.store(writer_->size(), std::memory_order_relaxed);
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

Status StateStore::rewrite_locked(const std::vector<Record>& live) {
  std::vector<RecordToWrite> recs;
  recs.reserve(live.size());
  for (const auto& r : live) recs.push_back({static_cast<uint8_t>(type_of(r)), record_payload(r)});
  if (Status st = rewrite_record_log(path_, recs, fs_); !st.ok()) return st;  // the old log stays
  auto w = RecordLogWriter::open(path_, nullptr, fs_);
  if (!w.ok()) {
    // The old writer's file was renamed over: appending to it would lose records. Refuse instead.
    failed_ = w.status().prefixed("the compacted log cannot be reopened: ");
    return failed_;
  }
  writer_ = std::move(w.value());
  return Status::Ok();
}

void StateStore::compact_async(std::vector<Record> live, std::function<void(const Status&)> done) {
  Pending p;
  p.compaction = std::make_shared<const std::vector<Record>>(std::move(live));
  p.done = std::move(done);
  enqueue(std::move(p));
}

Status StateStore::compact(const std::vector<Record>& live) {
  check_may_wait("StateStore::compact");
  Pending p;
  p.compaction = std::make_shared<const std::vector<Record>>(live);
  return enqueue_and_wait(std::move(p));
}

uint64_t StateStore::bytes() const { return bytes_.load(std::memory_order_relaxed); }

uint64_t StateStore::syncs() const { return syncs_.load(std::memory_order_relaxed); }

}  // namespace towers::daemon

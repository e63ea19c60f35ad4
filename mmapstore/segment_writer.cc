#include "mmapstore/segment_writer.h"

#include <map>

#include "mmapstore/segment_file.h"

namespace towers {

SegmentWriter::SegmentWriter(FileSystem& fs, uint64_t model_fingerprint, Done done)
    : fs_(fs), fingerprint_(model_fingerprint), done_(std::move(done)) {
  thread_ = std::thread([this] { loop(); });
}

SegmentWriter::~SegmentWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void SegmentWriter::submit(Job job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
  }
  wake_.notify_all();
}

void SegmentWriter::flush() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && in_flight_ == 0; });
}

size_t SegmentWriter::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + in_flight_;
}

void SegmentWriter::loop() {
  for (;;) {
    std::deque<Job> batch;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      batch.swap(queue_);
      in_flight_ = batch.size();
    }
    write_batch(batch);
    {
      std::lock_guard lock(mu_);
      in_flight_ = 0;
    }
    idle_.notify_all();
  }
}

void SegmentWriter::write_batch(std::deque<Job>& batch) {
  std::vector<Status> status(batch.size());
  // Phase 1: each file's bytes to its .tmp, synced.
  for (size_t i = 0; i < batch.size(); ++i) {
    const Job& j = batch[i];
    const std::filesystem::path tmp = j.path.string() + ".tmp";
    auto file = fs_.create(tmp);
    if (!file.ok()) {
      status[i] = file.status();
      continue;
    }
    Status st = append_segment(*file.value(), *j.segment, fingerprint_, j.context_xxh3, j.flags);
    if (st.ok()) st = file.value()->sync();
    if (!st.ok()) {
      file.value().reset();
      (void)fs_.remove(tmp);
      status[i] = st;
    }
  }
  // Phase 2: renames, then one fsync per directory covers them all.
  std::map<std::filesystem::path, std::vector<size_t>> by_dir;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!status[i].ok()) continue;
    const std::filesystem::path tmp = batch[i].path.string() + ".tmp";
    if (Status st = fs_.rename(tmp, batch[i].path); !st.ok()) {
      (void)fs_.remove(tmp);
      status[i] = st;
      continue;
    }
    by_dir[batch[i].path.parent_path()].push_back(i);
  }
  for (const auto& [dir, ids] : by_dir) {
    if (Status st = fs_.sync_dir(dir); !st.ok()) {
      for (size_t i : ids) status[i] = st;
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) done_(batch[i], status[i]);
}

}  // namespace towers

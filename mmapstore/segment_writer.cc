#include "mmapstore/segment_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "mmapstore/segment_file.h"
#include "mmapstore/uring_io.h"

namespace towers {

namespace {
// io_uring writes take each file's bytes encoded in memory: at most this much of a batch at once.
constexpr size_t kUringGroupBytes = size_t{64} << 20;
}  // namespace

SegmentWriter::SegmentWriter(FileSystem& fs, uint64_t model_fingerprint, Done done, Io io)
    : fs_(fs), fingerprint_(model_fingerprint), done_(std::move(done)) {
  if (io == Io::Uring) {
    if (&fs_ != &posix_fs()) {
      io_note_ = "io_uring writes need the real file system; writing through the file seam";
    } else if (auto ring = Ring::open(64); ring.ok()) {
      ring_ = std::move(ring.value());
    } else {
      io_note_ = ring.status().message() + "; writing with write() and fdatasync()";
    }
  }
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

void SegmentWriter::write_posix(const std::deque<Job>& batch, std::vector<Status>& status) {
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
}

void SegmentWriter::write_uring(const std::deque<Job>& batch, std::vector<Status>& status) {
  for (size_t i = 0; i < batch.size();) {
    std::vector<size_t> index;
    std::vector<int> fds;
    std::vector<std::vector<uint8_t>> bytes;
    for (size_t group = 0; i < batch.size() && (index.empty() || group < kUringGroupBytes); ++i) {
      const std::filesystem::path tmp = batch[i].path.string() + ".tmp";
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        status[i] = errno_status("cannot create", tmp, errno);
        continue;
      }
      bytes.push_back(encode_segment(*batch[i].segment, fingerprint_, batch[i].context_xxh3, batch[i].flags));
      group += bytes.back().size();
      fds.push_back(fd);
      index.push_back(i);
    }
    std::vector<Ring::Write> writes;
    for (size_t k = 0; k < index.size(); ++k) writes.push_back({fds[k], 0, bytes[k], true});
    const std::vector<Status> written = ring_->write_all(writes);
    for (size_t k = 0; k < index.size(); ++k) {
      ::close(fds[k]);
      if (written[k].ok()) continue;
      const std::filesystem::path tmp = batch[index[k]].path.string() + ".tmp";
      (void)fs_.remove(tmp);
      status[index[k]] = Status::WithCode(written[k].code(), tmp.string() + ": " + written[k].message());
    }
  }
}

void SegmentWriter::write_batch(std::deque<Job>& batch) {
  std::vector<Status> status(batch.size());
  // Phase 1: each file's bytes to its .tmp, synced.
  if (ring_) write_uring(batch, status);
  else write_posix(batch, status);
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

#include "mmapstore/uring_io.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string>

namespace towers {

namespace {

// Reads are cut into pieces of this size so that one large file's read proceeds as many requests
// in flight at once (the device queue), not one after another.
constexpr uint64_t kReadPiece = 1 << 20;

enum Kind : uint64_t { kRead = 0, kWrite = 1, kSync = 2 };
uint64_t tag(size_t index, Kind kind) { return static_cast<uint64_t>(index) << 2 | kind; }
size_t tag_index(uint64_t t) { return static_cast<size_t>(t >> 2); }
Kind tag_kind(uint64_t t) { return static_cast<Kind>(t & 3); }

Status uring_error(const char* what, int err) {
  std::string m = std::string("io_uring ") + what + ": " + std::strerror(err);
  return err == ENOSPC || err == EDQUOT ? Status::ResourceExhausted(std::move(m)) : Status::IOError(std::move(m));
}

}  // namespace

struct Ring::Impl {
  io_uring ring{};
  unsigned depth = 0;

  // Submits what is queued and waits for at least one completion; calls on_cqe for each one ready.
  template <class OnCqe>
  Status reap(OnCqe&& on_cqe) {
    int r = io_uring_submit_and_wait(&ring, 1);
    // EINTR, EAGAIN, EBUSY: nothing was lost, the completions below are reaped and the caller goes on.
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) return uring_error("submit", -r);
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      on_cqe(cqe->user_data, cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
    return Status::Ok();
  }

  // After a failed submit: waits for the requests of the `n` queued that reached the kernel, so that
  // none writes into a buffer its caller has freed (those never submitted stay in the ring, unread).
  void drain(size_t n) {
    n -= std::min<size_t>(n, io_uring_sq_ready(&ring));
    io_uring_cqe* cqe = nullptr;
    while (n > 0 && io_uring_wait_cqe(&ring, &cqe) == 0) {
      io_uring_cqe_seen(&ring, cqe);
      --n;
    }
  }
};

Ring::Ring(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Ring::~Ring() { io_uring_queue_exit(&impl_->ring); }

Result<std::unique_ptr<Ring>> Ring::open(unsigned depth) {
  auto impl = std::make_unique<Impl>();
  impl->depth = std::clamp(depth, 4u, 4096u);
  if (int r = io_uring_queue_init(impl->depth, &impl->ring, 0); r < 0) {
    return Status::Unimplemented(std::string("io_uring is not available here: ") + std::strerror(-r));
  }
  return std::unique_ptr<Ring>(new Ring(std::move(impl)));
}

Result<std::vector<uint64_t>> Ring::read_all(std::span<const Read> reads) {
  struct Piece {
    size_t read;
    uint64_t at, len;          // offset within the read's `into`
    bool after_short = false;  // the rest of a piece that came back short
  };
  std::deque<Piece> todo;
  for (size_t i = 0; i < reads.size(); ++i) {
    for (uint64_t at = 0; at < reads[i].into.size(); at += kReadPiece) {
      todo.push_back({i, at, std::min<uint64_t>(kReadPiece, reads[i].into.size() - at)});
    }
  }
  std::vector<uint64_t> got(reads.size(), 0);
  // In flight, by slot: the tag's index names a slot, so a completion finds its piece.
  std::vector<Piece> slots(impl_->depth);
  std::vector<size_t> free_slots;
  for (size_t s = 0; s < slots.size(); ++s) free_slots.push_back(slots.size() - 1 - s);
  size_t in_flight = 0;
  Status failed;
  while ((!todo.empty() && failed.ok()) || in_flight > 0) {
    while (!todo.empty() && failed.ok() && !free_slots.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring);
      if (sqe == nullptr) break;
      const Piece p = todo.front();
      todo.pop_front();
      const size_t slot = free_slots.back();
      free_slots.pop_back();
      slots[slot] = p;
      const Read& r = reads[p.read];
      io_uring_prep_read(sqe, r.fd, r.into.data() + p.at, static_cast<unsigned>(p.len), r.offset + p.at);
      sqe->user_data = tag(slot, kRead);
      ++in_flight;
    }
    Status st = impl_->reap([&](uint64_t t, int res) {
      const size_t slot = tag_index(t);
      Piece p = slots[slot];
      free_slots.push_back(slot);
      --in_flight;
      if (res == -EAGAIN || res == -EINTR) {
        todo.push_front(p);
      } else if (res == -EINVAL && p.after_short) {
        // The rest of a short O_DIRECT read starts off the block grid: the short read was the end.
      } else if (res < 0) {
        if (failed.ok()) failed = uring_error("read", -res);
      } else if (res > 0) {
        got[p.read] += static_cast<uint64_t>(res);
        // A short read before the end of the file: read the rest (a read at the end gets 0).
        if (static_cast<uint64_t>(res) < p.len) todo.push_front({p.read, p.at + res, p.len - res, true});
      }
    });
    if (!st.ok()) {  // the ring refuses submissions: wait out what is in flight, then fail
      impl_->drain(in_flight);
      return st;
    }
  }
  if (!failed.ok()) return failed;
  return got;
}

std::vector<Status> Ring::write_all(std::span<const Write> writes) {
  struct State {
    uint64_t done = 0;    // bytes written
    int outstanding = 0;  // completions still to come
    bool synced = false;
    Status status;
  };
  std::vector<State> state(writes.size());
  std::deque<size_t> todo;  // requests whose (rest of the) write and sync are to be submitted
  for (size_t i = 0; i < writes.size(); ++i) todo.push_back(i);
  size_t outstanding = 0;
  // Each submission is a write and, linked behind it, its sync: two entries at most.
  auto submit = [&](size_t i) {
    const Write& w = writes[i];
    State& s = state[i];
    const uint64_t rest = w.bytes.size() - s.done;
    const bool sync = w.datasync;
    if (rest > 0) {
      io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring);
      io_uring_prep_write(sqe, w.fd, w.bytes.data() + s.done, static_cast<unsigned>(std::min<uint64_t>(rest, 1u << 30)),
                          w.offset + s.done);
      sqe->user_data = tag(i, kWrite);
      if (sync) sqe->flags |= IOSQE_IO_LINK;
      ++s.outstanding;
    }
    if (sync) {
      io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring);
      io_uring_prep_fsync(sqe, w.fd, IORING_FSYNC_DATASYNC);
      sqe->user_data = tag(i, kSync);
      ++s.outstanding;
    }
    outstanding += static_cast<size_t>(s.outstanding);
  };
  while (!todo.empty() || outstanding > 0) {
    while (!todo.empty() && io_uring_sq_space_left(&impl_->ring) >= 2 && outstanding + 2 <= impl_->depth) {
      submit(todo.front());
      todo.pop_front();
    }
    if (outstanding == 0) continue;
    Status st = impl_->reap([&](uint64_t t, int res) {
      const size_t i = tag_index(t);
      State& s = state[i];
      --s.outstanding;
      --outstanding;
      if (tag_kind(t) == kWrite) {
        if (res == -EAGAIN || res == -EINTR) {
          // Nothing written: submitted again below (with its sync, which the kernel cancelled).
        } else if (res < 0) {
          if (s.status.ok()) s.status = uring_error("write", -res);
        } else {
          s.done += static_cast<uint64_t>(res);
          if (res == 0 && s.done < writes[i].bytes.size() && s.status.ok()) s.status = uring_error("write", EIO);
        }
      } else if (res == 0) {
        s.synced = true;
      } else if (res != -ECANCELED && s.status.ok()) {
        s.status = uring_error("fdatasync", -res);
      }
      // All of this submission's completions are in: a short or interrupted write goes again with
      // its sync (the kernel cancelled the sync linked behind it).
      if (s.outstanding == 0 && s.status.ok() && (s.done < writes[i].bytes.size() || (writes[i].datasync && !s.synced))) {
        todo.push_back(i);
      }
    });
    if (!st.ok()) {
      impl_->drain(outstanding);
      for (State& s : state) {
        if (s.status.ok()) s.status = st;
      }
      break;
    }
  }
  std::vector<Status> out;
  out.reserve(state.size());
  for (State& s : state) out.push_back(std::move(s.status));
  return out;
}

}  // namespace towers

#include "mmapstore/segment_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <deque>

namespace towers {

static_assert(std::endian::native == std::endian::little, "segment files are little-endian");

namespace {

constexpr char kMagic[8] = {'T', 'W', 'R', 'S', 'E', 'G', '\n', '\0'};

struct SegmentFileHeader {
  char magic[8];
  uint32_t version;
  uint8_t format;
  uint8_t reserved[3];
  uint64_t model_fingerprint;
  uint64_t id, parent;
  int32_t computed_pos;
  uint32_t n_layer, n_head_kv, head_dim;
  uint64_t n_tokens, kv_bytes, n_scales;  // kv_bytes: K and V each
  uint64_t payload_xxh3;
  uint64_t header_xxh3;  // of every byte above
};
static_assert(sizeof(SegmentFileHeader) == 96, "header layout is part of the file format");

uint64_t header_checksum(const SegmentFileHeader& h) {
  return xxh3_64({reinterpret_cast<const uint8_t*>(&h), offsetof(SegmentFileHeader, header_xxh3)});
}

std::string errno_text(int e) { return std::strerror(e); }

Status write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::Error(errno_text(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

uint64_t xxh3_64(std::span<const uint8_t> bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

std::vector<uint8_t> encode_segment(const Segment& s, uint64_t model_fingerprint) {
  SegmentFileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kSegmentFileVersion;
  h.format = static_cast<uint8_t>(s.format());
  h.model_fingerprint = model_fingerprint;
  h.id = s.id();
  h.parent = s.parent();
  h.computed_pos = s.computed_pos();
  h.n_layer = static_cast<uint32_t>(s.n_layer());
  h.n_head_kv = static_cast<uint32_t>(s.n_head_kv());
  h.head_dim = static_cast<uint32_t>(s.head_dim());
  h.n_tokens = s.tokens().size();
  h.kv_bytes = s.k_bytes().size();
  h.n_scales = s.k_scales().size();
  const size_t payload = h.n_tokens * 4 + 2 * h.kv_bytes + h.n_scales * 4;
  std::vector<uint8_t> out(sizeof h + payload);
  uint8_t* p = out.data() + sizeof h;
  auto put = [&](const void* src, size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  };
  put(s.tokens().data(), h.n_tokens * 4);
  put(s.k_bytes().data(), h.kv_bytes);
  put(s.v_bytes().data(), h.kv_bytes);
  put(s.k_scales().data(), h.n_scales * 4);
  h.payload_xxh3 = xxh3_64({out.data() + sizeof h, payload});
  h.header_xxh3 = header_checksum(h);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

Result<std::shared_ptr<const Segment>> decode_segment(const ModelConfig& c, std::span<const uint8_t> bytes,
                                                      uint64_t model_fingerprint) {
  SegmentFileHeader h;
  if (bytes.size() < sizeof h) return Status::Error("truncated segment file (" + std::to_string(bytes.size()) + " bytes)");
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return Status::Error("not a segment file (bad magic)");
  if (h.header_xxh3 != header_checksum(h)) return Status::Error("segment file header checksum mismatch");
  if (h.version != kSegmentFileVersion) {
    return Status::Error("segment file version " + std::to_string(h.version) + " is not supported (expected " +
                         std::to_string(kSegmentFileVersion) + ")");
  }
  if (h.model_fingerprint != model_fingerprint) {
    return Status::Error("segment file was computed by another model (fingerprint mismatch)");
  }
  if (h.n_layer != static_cast<uint32_t>(c.n_layer) || h.n_head_kv != static_cast<uint32_t>(c.n_head_kv) ||
      h.head_dim != static_cast<uint32_t>(c.head_dim)) {
    return Status::Error("segment file shape does not match the model");
  }
  // Sizes are checked against the file length before any allocation (no overflow: each is bounded).
  const uint64_t avail = bytes.size() - sizeof h;
  if (h.n_tokens > avail / 4 || h.kv_bytes > avail / 2 || h.n_scales > avail / 4 ||
      h.n_tokens * 4 + 2 * h.kv_bytes + h.n_scales * 4 != avail) {
    return Status::Error("segment file sizes do not match its length (truncated or corrupt)");
  }
  const uint8_t* p = bytes.data() + sizeof h;
  if (xxh3_64({p, avail}) != h.payload_xxh3) return Status::Error("segment file payload checksum mismatch");
  if (h.format > static_cast<uint8_t>(KvQuant::Q4)) return Status::Error("segment file has an unknown format");
  Segment::Parts parts;
  parts.id = h.id;
  parts.parent = h.parent;
  parts.computed_pos = h.computed_pos;
  parts.format = static_cast<KvQuant>(h.format);
  parts.tokens.resize(h.n_tokens);
  parts.k.resize(h.kv_bytes);
  parts.v.resize(h.kv_bytes);
  parts.k_scale.resize(h.n_scales);
  auto take = [&](void* dst, size_t n) {
    if (n) std::memcpy(dst, p, n);
    p += n;
  };
  take(parts.tokens.data(), h.n_tokens * 4);
  take(parts.k.data(), h.kv_bytes);
  take(parts.v.data(), h.kv_bytes);
  take(parts.k_scale.data(), h.n_scales * 4);
  for (int32_t t : parts.tokens) {
    if (t < 0 || t >= c.n_vocab) return Status::Error("segment file holds a token outside the vocabulary");
  }
  return Segment::from_parts(c, std::move(parts));
}

Status write_segment_file(const Segment& segment, const std::filesystem::path& path, uint64_t model_fingerprint) {
  const auto bytes = encode_segment(segment, model_fingerprint);
  const std::string tmp = path.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return Status::Error("cannot create " + tmp + ": " + errno_text(errno));
  Status st = write_all(fd, bytes.data(), bytes.size());
  if (st.ok() && ::fsync(fd) != 0) st = Status::Error(errno_text(errno));
  ::close(fd);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return Status::Error("cannot write " + tmp + ": " + st.message());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Status::Error("cannot rename " + tmp + ": " + errno_text(e));
  }
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename durable
    ::close(dfd);
  }
  return Status::Ok();
}

struct FileReader::Ring {
  io_uring ring;
  unsigned depth;
};

FileReader::FileReader(unsigned queue_depth) {
  auto r = std::make_unique<Ring>();
  r->depth = queue_depth;
  if (io_uring_queue_init(queue_depth, &r->ring, 0) == 0) ring_ = std::move(r);  // else: pread fallback
}

FileReader::~FileReader() {
  if (ring_) io_uring_queue_exit(&ring_->ring);
}

std::vector<Result<std::vector<uint8_t>>> FileReader::read_all(std::span<const std::filesystem::path> paths,
                                                               size_t max_bytes) {
  struct Job {
    int fd = -1;
    std::vector<uint8_t> buf;
    size_t done = 0;
    std::string error;
  };
  std::vector<Job> jobs(paths.size());
  std::deque<size_t> todo;
  for (size_t i = 0; i < paths.size(); ++i) {
    Job& j = jobs[i];
    j.fd = ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (j.fd < 0) {
      j.error = "cannot open " + paths[i].string() + ": " + errno_text(errno);
      continue;
    }
    struct stat st;
    if (::fstat(j.fd, &st) != 0) {
      j.error = "cannot stat " + paths[i].string() + ": " + errno_text(errno);
    } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
      j.error = paths[i].string() + " is larger than the " + std::to_string(max_bytes) + "-byte limit";
    } else {
      j.buf.resize(static_cast<size_t>(st.st_size));
      if (!j.buf.empty()) todo.push_back(i);
    }
  }
  constexpr size_t kMaxOp = size_t{1} << 30;
  auto fail = [&](Job& j, size_t i, const std::string& why) {
    j.error = "cannot read " + paths[i].string() + ": " + why;
  };
  if (ring_) {
    unsigned in_flight = 0;
    while (!todo.empty() || in_flight > 0) {
      while (!todo.empty() && in_flight < ring_->depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
        if (!sqe) break;
        const size_t i = todo.front();
        todo.pop_front();
        Job& j = jobs[i];
        const size_t len = std::min(kMaxOp, j.buf.size() - j.done);
        io_uring_prep_read(sqe, j.fd, j.buf.data() + j.done, static_cast<unsigned>(len), j.done);
        io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(i));
        ++in_flight;
      }
      int rc = io_uring_submit(&ring_->ring);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
        // The ring refused work: finish everything still queued with plain reads below.
        break;
      }
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_wait_cqe(&ring_->ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      const size_t i = reinterpret_cast<size_t>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_->ring, cqe);
      --in_flight;
      Job& j = jobs[i];
      if (res == -EINTR || res == -EAGAIN) {
        todo.push_back(i);
      } else if (res < 0) {
        fail(j, i, errno_text(-res));
      } else if (res == 0) {
        fail(j, i, "file shrank while being read");
      } else {
        j.done += static_cast<size_t>(res);
        if (j.done < j.buf.size()) todo.push_back(i);
      }
    }
    // Anything still in flight after a ring failure is drained before the buffers go away.
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_->ring, &cqe) != 0) break;
      const size_t i = reinterpret_cast<size_t>(io_uring_cqe_get_data(cqe));
      if (cqe->res > 0) jobs[i].done += static_cast<size_t>(cqe->res);
      io_uring_cqe_seen(&ring_->ring, cqe);
      --in_flight;
      if (jobs[i].done < jobs[i].buf.size() && jobs[i].error.empty()) todo.push_back(i);
    }
  }
  for (size_t i : todo) {  // pread: no ring, or what the ring left
    Job& j = jobs[i];
    while (j.error.empty() && j.done < j.buf.size()) {
      ssize_t r = ::pread(j.fd, j.buf.data() + j.done, std::min(kMaxOp, j.buf.size() - j.done), j.done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(j, i, errno_text(errno));
      else if (r == 0) fail(j, i, "file shrank while being read");
      else j.done += static_cast<size_t>(r);
    }
  }
  std::vector<Result<std::vector<uint8_t>>> out;
  out.reserve(jobs.size());
  for (auto& j : jobs) {
    if (j.fd >= 0) ::close(j.fd);
    if (!j.error.empty()) out.emplace_back(Status::Error(j.error));
    else out.emplace_back(std::move(j.buf));
  }
  return out;
}

Result<std::shared_ptr<const Segment>> read_segment_file(FileReader& reader, const ModelConfig& config,
                                                         const std::filesystem::path& path, uint64_t model_fingerprint) {
  auto files = reader.read_all(std::span(&path, 1));
  if (!files[0].ok()) return files[0].status();
  auto seg = decode_segment(config, files[0].value(), model_fingerprint);
  if (!seg.ok()) return Status::Error(path.string() + ": " + seg.error());
  return seg;
}

}  // namespace towers

#include "mmapstore/segment_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <bit>
#include <cerrno>
#include <cstring>

namespace towers {

static_assert(std::endian::native == std::endian::little, "segment files are little-endian");

namespace fmt = segment_format;

namespace {

uint64_t header_checksum(const fmt::Header& h) {
  return xxh3_64({reinterpret_cast<const uint8_t*>(&h), offsetof(fmt::Header, header_xxh3)});
}

template <class T>
std::span<const uint8_t> bytes_of(std::span<const T> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size_bytes()};
}

// The header of `s`, with every offset laid out and the payload checksum computed.
fmt::Header make_header(const Segment& s, uint64_t fingerprint, uint64_t context_xxh3, uint8_t flags) {
  fmt::Header h{};
  h.flags = flags;
  std::memcpy(h.magic, fmt::kMagic, sizeof fmt::kMagic);
  h.version = fmt::kVersion;
  h.format = static_cast<uint8_t>(s.format());
  h.model_fingerprint = fingerprint;
  h.id = s.id();
  h.parent = s.parent();
  h.computed_pos = s.computed_pos();
  h.n_layer = static_cast<uint32_t>(s.n_layer());
  h.n_head_kv = static_cast<uint32_t>(s.n_head_kv());
  h.head_dim = static_cast<uint32_t>(s.head_dim());
  h.n_tokens = s.tokens().size();
  h.kv_bytes = s.k_bytes().size();
  h.n_scales = s.k_scales().size();
  h.tokens_offset = sizeof(fmt::Header);
  h.k_offset = fmt::align_up(h.tokens_offset + 4 * h.n_tokens);
  h.v_offset = fmt::align_up(h.k_offset + h.kv_bytes);
  h.scales_offset = fmt::align_up(h.v_offset + h.kv_bytes);
  h.file_bytes = h.scales_offset + 4 * h.n_scales;
  h.tokens_xxh3 = xxh3_tokens(s.tokens());
  h.context_xxh3 = context_xxh3;
  return h;
}

// The payload as the file holds it: sections with their zero gaps, in order.
struct Payload {
  std::vector<std::span<const uint8_t>> parts;
  std::vector<uint8_t> zeros;
  Payload(const fmt::Header& h, const Segment& s) : zeros(fmt::kSectionAlign, 0) {
    uint64_t at = h.tokens_offset;
    auto put = [&](uint64_t offset, std::span<const uint8_t> bytes) {
      if (offset > at) parts.push_back({zeros.data(), offset - at});
      if (!bytes.empty()) parts.push_back(bytes);
      at = offset + bytes.size();
    };
    put(h.tokens_offset, bytes_of(std::span<const int32_t>(s.tokens())));
    put(h.k_offset, s.k_bytes());
    put(h.v_offset, s.v_bytes());
    put(h.scales_offset, bytes_of(s.k_scales()));
  }
  uint64_t checksum() const {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (auto p : parts) XXH3_64bits_update(st, p.data(), p.size());
    const uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
  }
};

std::string shape_mismatch(const fmt::Header& h, const ModelConfig& c) {
  if (h.n_layer != static_cast<uint32_t>(c.n_layer) || h.n_head_kv != static_cast<uint32_t>(c.n_head_kv) ||
      h.head_dim != static_cast<uint32_t>(c.head_dim)) {
    return "its shape (" + std::to_string(h.n_layer) + " layers, " + std::to_string(h.n_head_kv) + "x" +
           std::to_string(h.head_dim) + ") is not the model's";
  }
  return "";
}

// Why the header's sizes and offsets cannot describe a file of `size` bytes ("" when they can).
std::string layout_problem(const fmt::Header& h, uint64_t size) {
  if (h.format > static_cast<uint8_t>(KvQuant::Q4)) return "unknown KV format " + std::to_string(h.format);
  if (h.file_bytes != size) return "it is " + std::to_string(size) + " bytes, its header says " + std::to_string(h.file_bytes);
  if (h.n_tokens == 0 || h.n_tokens > size / 4 || h.kv_bytes > size || h.n_scales > size / 4) return "impossible sizes";
  if (h.tokens_offset != sizeof(fmt::Header)) return "bad tokens offset";
  for (uint64_t off : {h.k_offset, h.v_offset, h.scales_offset}) {
    if (off % fmt::kSectionAlign != 0) return "unaligned section";
  }
  if (h.k_offset < h.tokens_offset + 4 * h.n_tokens || h.v_offset < h.k_offset + h.kv_bytes ||
      h.scales_offset < h.v_offset + h.kv_bytes || h.scales_offset + 4 * h.n_scales != h.file_bytes) {
    return "overlapping or misplaced sections";
  }
  return "";
}

}  // namespace

uint64_t xxh3_64(std::span<const uint8_t> bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

uint64_t xxh3_tokens(std::span<const int32_t> tokens) { return xxh3_64(bytes_of(tokens)); }

namespace {
// Header and payload as the parts of one file.
struct FileParts {
  fmt::Header header;
  Payload payload;
  std::vector<std::span<const uint8_t>> parts;
  FileParts(const Segment& s, uint64_t fingerprint, uint64_t context_xxh3, uint8_t flags)
      : header(make_header(s, fingerprint, context_xxh3, flags)), payload(header, s) {
    header.payload_xxh3 = payload.checksum();
    header.header_xxh3 = header_checksum(header);
    parts.push_back({reinterpret_cast<const uint8_t*>(&header), sizeof header});
    parts.insert(parts.end(), payload.parts.begin(), payload.parts.end());
  }
};
}  // namespace

std::vector<uint8_t> encode_segment(const Segment& s, uint64_t model_fingerprint, uint64_t context_xxh3,
                                    uint8_t flags) {
  FileParts f(s, model_fingerprint, context_xxh3, flags);
  std::vector<uint8_t> out;
  for (auto part : f.parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

Status append_segment(WritableFile& file, const Segment& s, uint64_t model_fingerprint, uint64_t context_xxh3,
                      uint8_t flags) {
  FileParts f(s, model_fingerprint, context_xxh3, flags);
  for (auto part : f.parts) {
    if (Status st = file.append(part); !st.ok()) return st;
  }
  return Status::Ok();
}

Status write_segment_file(FileSystem& fs, const Segment& s, const std::filesystem::path& path,
                          uint64_t model_fingerprint, uint64_t context_xxh3, uint8_t flags) {
  FileParts f(s, model_fingerprint, context_xxh3, flags);
  return write_file_atomic(fs, path, f.parts);
}

Result<std::shared_ptr<SegmentFile>> SegmentFile::open(const std::filesystem::path& path, const ModelConfig& c,
                                                       uint64_t fingerprint, const SegmentExpect* expect) {
  auto bad = [&](const std::string& why) { return Status::Corruption(path.string() + ": " + why); };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound(path.string() + " does not exist");
    return errno_status("cannot open", path, e);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return errno_status("cannot stat", path, e);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  fmt::Header h{};
  if (size < sizeof h) {
    ::close(fd);
    return bad("truncated (" + std::to_string(size) + " bytes)");
  }
  if (size > fmt::kMaxFileBytes) {
    ::close(fd);
    return bad("larger than the " + std::to_string(fmt::kMaxFileBytes) + "-byte limit");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) return errno_status("cannot map", path, map_errno);
  std::shared_ptr<SegmentFile> f(new SegmentFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = size;
  std::memcpy(&h, f->base_, sizeof h);
  if (std::memcmp(h.magic, fmt::kMagic, sizeof fmt::kMagic) != 0) return bad("not a segment file (bad magic)");
  if (h.header_xxh3 != header_checksum(h)) return bad("header checksum mismatch");
  if (h.version != fmt::kVersion) {
    return bad("format version " + std::to_string(h.version) + " (this towerd reads " + std::to_string(fmt::kVersion) + ")");
  }
  if (h.model_fingerprint != fingerprint) return bad("computed by another model (fingerprint mismatch)");
  if (std::string why = shape_mismatch(h, c); !why.empty()) return bad(why);
  if (std::string why = layout_problem(h, size); !why.empty()) return bad(why);
  f->header_ = h;
  const auto tokens = f->tokens();
  if (xxh3_tokens(tokens) != h.tokens_xxh3) return bad("tokens checksum mismatch");
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.n_vocab) return bad("holds a token outside the vocabulary");
  }
  if (expect) {
    if (h.id != expect->id) return bad("holds segment " + std::to_string(h.id) + ", not " + std::to_string(expect->id));
    if (h.parent != expect->parent || h.computed_pos != expect->computed_pos || h.context_xxh3 != expect->context_xxh3) {
      return bad("was computed under another parent chain");
    }
    if (h.n_tokens != expect->tokens.size() || h.tokens_xxh3 != xxh3_tokens(expect->tokens)) {
      return bad("holds other tokens than the record log's");
    }
    if (expect->format && h.format != static_cast<uint8_t>(*expect->format)) return bad("holds another KV format");
  }
  return f;
}

SegmentFile::~SegmentFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

std::span<const int32_t> SegmentFile::tokens() const {
  return {reinterpret_cast<const int32_t*>(base_ + header_.tokens_offset), header_.n_tokens};
}

Status SegmentFile::verify() {
  if (verified()) return Status::Ok();
  const uint64_t from = header_.tokens_offset;
  if (xxh3_64({base_ + from, size_ - from}) != header_.payload_xxh3) {
    return Status::Corruption(path_.string() + ": payload checksum mismatch");
  }
  verified_.store(true, std::memory_order_release);
  return Status::Ok();
}

Result<std::shared_ptr<const Segment>> SegmentFile::segment(const ModelConfig& config) {
  const auto& h = header_;
  Segment::View v;
  v.id = h.id;
  v.parent = h.parent;
  auto t = tokens();
  v.tokens.assign(t.begin(), t.end());
  v.computed_pos = h.computed_pos;
  v.format = static_cast<KvQuant>(h.format);
  v.k = {base_ + h.k_offset, h.kv_bytes};
  v.v = {base_ + h.v_offset, h.kv_bytes};
  v.k_scale = {reinterpret_cast<const float*>(base_ + h.scales_offset), h.n_scales};
  auto s = Segment::from_view(config, std::move(v), shared_from_this());
  if (!s.ok()) return Status::Corruption(path_.string() + ": " + s.error());
  return s;
}

void SegmentFile::populate() {
  auto* p = const_cast<uint8_t*>(base_);
#ifdef MADV_POPULATE_READ
  if (::madvise(p, size_, MADV_POPULATE_READ) == 0) return;
#endif
  (void)::madvise(p, size_, MADV_WILLNEED);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint8_t touched = 0;
  for (uint64_t at = 0; at < size_; at += static_cast<uint64_t>(page)) touched ^= base_[at];
  volatile uint8_t sink = touched;
  (void)sink;
}

void SegmentFile::release() { (void)::madvise(const_cast<uint8_t*>(base_), size_, MADV_DONTNEED); }

size_t SegmentFile::resident_bytes() const {
  const long page = ::sysconf(_SC_PAGESIZE);
  const size_t pages = (size_ + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  if (::mincore(const_cast<uint8_t*>(base_), size_, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return std::min<size_t>(n * page, size_);
}

}  // namespace towers

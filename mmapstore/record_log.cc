#include "mmapstore/record_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace towers {

namespace {

constexpr uint8_t kMagic0 = 0x57, kMagic1 = 0x7E;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t get32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

std::string errno_text(const std::string& what, const std::filesystem::path& path) {
  return what + " " + path.string() + ": " + std::strerror(errno);
}

// Why the bytes at pos are not a valid record ("" when they are); *end receives the record's end.
std::string check_record(const uint8_t* data, uint64_t n, uint64_t pos, uint64_t* end) {
  if (n - pos < kRecordHeaderBytes) return "truncated header";
  const uint8_t* p = data + pos;
  if (p[0] != kMagic0 || p[1] != kMagic1) return "bad record marker";
  const uint32_t len = get32(p + 6);
  if (len > kMaxRecordBytes) return "impossible length " + std::to_string(len);
  if (p[10] == 0) return "record type 0";
  if (n - pos - kRecordHeaderBytes < len) return "record of " + std::to_string(len) + " bytes runs past the end of the file";
  const uint32_t crc = crc32c(std::string_view(reinterpret_cast<const char*>(p + 6), 5 + len));
  if (mask_crc(crc) != get32(p + 2)) return "checksum mismatch";
  *end = pos + kRecordHeaderBytes + len;
  return "";
}

Status write_all(int fd, const std::string& bytes, const std::filesystem::path& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::Error(errno_text("cannot write", path));
    }
    done += static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_table();
  uint32_t c = ~crc;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return ~c;
}

std::string encode_record(uint8_t type, std::string_view payload) {
  std::string body;
  put32(body, static_cast<uint32_t>(payload.size()));
  body.push_back(static_cast<char>(type));
  body.append(payload);
  std::string out;
  out.reserve(kRecordHeaderBytes + payload.size());
  out.push_back(static_cast<char>(kMagic0));
  out.push_back(static_cast<char>(kMagic1));
  put32(out, mask_crc(crc32c(body)));
  out.append(body);
  return out;
}

Result<LogReadReport> read_record_log(const std::filesystem::path& path,
                                      const std::function<void(const LogRecord&)>& fn) {
  LogReadReport report;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return report;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(errno_text("cannot open", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::Error(errno_text("cannot read", path));
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint64_t n = bytes.size();
  report.file_bytes = n;
  uint64_t pos = 0;
  while (pos < n) {
    uint64_t end = 0;
    std::string why = check_record(data, n, pos, &end);
    if (why.empty()) {
      LogRecord r;
      r.type = data[pos + 10];
      r.payload.assign(bytes, pos + kRecordHeaderBytes, end - pos - kRecordHeaderBytes);
      r.offset = pos;
      fn(r);
      report.records++;
      report.valid_end = end;
      pos = end;
      continue;
    }
    // Resynchronise: the next offset where a valid record starts.
    uint64_t next = pos + 1;
    for (; next + kRecordHeaderBytes <= n; ++next) {
      if (data[next] != kMagic0 || data[next + 1] != kMagic1) continue;
      uint64_t e2 = 0;
      if (check_record(data, n, next, &e2).empty()) break;
    }
    if (next + kRecordHeaderBytes > n) {
      report.torn_tail = true;
      report.skipped_bytes += n - pos;
      report.problems.push_back(path.string() + ": torn tail at offset " + std::to_string(pos) + " (" +
                                std::to_string(n - pos) + " bytes, " + why + ") ignored");
      break;
    }
    report.damaged++;
    report.skipped_bytes += next - pos;
    report.problems.push_back(path.string() + ": damaged record at offset " + std::to_string(pos) + " (" + why +
                              "); skipped " + std::to_string(next - pos) + " bytes, reading resumes at offset " +
                              std::to_string(next));
    pos = next;
  }
  return report;
}

Status fsync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Error(errno_text("cannot open directory", d));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::Error(errno_text("cannot fsync directory", d));
  return Status::Ok();
}

Result<std::unique_ptr<RecordLogWriter>> RecordLogWriter::open(const std::filesystem::path& path,
                                                              LogReadReport* report_out) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  auto report = read_record_log(path, [](const LogRecord&) {});
  if (!report.ok()) return report.status();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Error(errno_text("cannot open", path));
  uint64_t size = report->file_bytes;
  if (report->torn_tail) {
    if (::ftruncate(fd, static_cast<off_t>(report->valid_end)) != 0 || ::fdatasync(fd) != 0) {
      Status st = Status::Error(errno_text("cannot cut the torn tail of", path));
      ::close(fd);
      return st;
    }
    size = report->valid_end;
  }
  if (::lseek(fd, static_cast<off_t>(size), SEEK_SET) < 0) {
    Status st = Status::Error(errno_text("cannot seek in", path));
    ::close(fd);
    return st;
  }
  if (!existed) {
    if (Status st = fsync_directory(path.parent_path()); !st.ok()) {
      ::close(fd);
      return st;
    }
  }
  if (report_out) *report_out = *report;
  return std::unique_ptr<RecordLogWriter>(new RecordLogWriter(path, fd, size));
}

RecordLogWriter::~RecordLogWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status RecordLogWriter::append(uint8_t type, std::string_view payload, bool sync) {
  if (type == 0) return Status::Error("record type 0 is reserved");
  if (payload.size() > kMaxRecordBytes) {
    return Status::Error("record of " + std::to_string(payload.size()) + " bytes exceeds the limit of " +
                         std::to_string(kMaxRecordBytes));
  }
  const std::string rec = encode_record(type, payload);
  Status st = write_all(fd_, rec, path_);
  if (!st.ok()) {
    // Cut back to the last whole record so the next append does not follow garbage.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0) (void)::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
    return st;
  }
  size_ += rec.size();
  return sync ? this->sync() : Status::Ok();
}

Status RecordLogWriter::sync() {
  if (::fdatasync(fd_) != 0) return Status::Error(errno_text("cannot fdatasync", path_));
  return Status::Ok();
}

Status rewrite_record_log(const std::filesystem::path& path, std::span<const RecordToWrite> records) {
  std::filesystem::path tmp = path;
  tmp += ".compact.tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Error(errno_text("cannot create", tmp));
  std::string buf;
  Status st;
  for (const auto& r : records) {
    if (r.type == 0 || r.payload.size() > kMaxRecordBytes) {
      st = Status::Error("invalid record (type 0 or too long) in compaction");
      break;
    }
    buf += encode_record(r.type, r.payload);
    if (buf.size() >= (1u << 20)) {
      if (st = write_all(fd, buf, tmp); !st.ok()) break;
      buf.clear();
    }
  }
  if (st.ok()) st = write_all(fd, buf, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = Status::Error(errno_text("cannot fsync", tmp));
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Status::Error(errno_text("cannot rename over", path));
  if (!st.ok()) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return st;
  }
  return fsync_directory(path.parent_path());
}

}  // namespace towers

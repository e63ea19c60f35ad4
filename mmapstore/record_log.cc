#include "mmapstore/record_log.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>
#include <fstream>

namespace towers {

namespace {

constexpr uint8_t kMagic0 = 0x57, kMagic1 = 0x7E;

// Slicing-by-8 tables: t[0] is the byte-at-a-time table, t[k][i] the CRC of byte i followed by k
// zero bytes, so eight bytes take eight lookups and no dependency chain between them (~4x the
// byte-at-a-time loop: a restart checks 52 MB of cold index entries for 10^6 sessions at rest).
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;
CrcTables make_tables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
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

std::span<const uint8_t> bytes_of(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  static const CrcTables t = make_tables();
  uint32_t c = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][p[4]] ^ t[2][p[5]] ^
        t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
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

Result<std::unique_ptr<RecordLogWriter>> RecordLogWriter::open(const std::filesystem::path& path,
                                                              LogReadReport* report_out, FileSystem& fs) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  auto report = read_record_log(path, [](const LogRecord&) {});
  if (!report.ok()) return report.status();
  auto file = fs.open_append(path);
  if (!file.ok()) return file.status();
  if (report->torn_tail) {
    Status st = file.value()->truncate(report->valid_end);
    if (st.ok()) st = file.value()->sync();
    if (!st.ok()) return st.prefixed("cannot cut the torn tail: ");
  }
  if (!existed) {
    if (Status st = fs.sync_dir(path.parent_path()); !st.ok()) return st;
  }
  if (report_out) *report_out = *report;
  return std::unique_ptr<RecordLogWriter>(new RecordLogWriter(path, std::move(file.value())));
}

RecordLogWriter::~RecordLogWriter() = default;

Status RecordLogWriter::append(uint8_t type, std::string_view payload, bool sync) {
  if (!failed_.ok()) return failed_;
  if (type == 0) return Status::InvalidArgument("record type 0 is reserved");
  if (payload.size() > kMaxRecordBytes) {
    return Status::InvalidArgument("record of " + std::to_string(payload.size()) + " bytes exceeds the limit of " +
                                   std::to_string(kMaxRecordBytes));
  }
  const std::string rec = encode_record(type, payload);
  const uint64_t before = file_->size();
  Status st = file_->append(bytes_of(rec));
  if (!st.ok()) {
    // Cut back to the last whole record so the next append does not follow garbage; if even that
    // fails, nothing more is written (a later record behind a hole would replay out of order).
    if (!file_->truncate(before).ok()) failed_ = st.prefixed("the log is read-only until restart: ");
    return st;
  }
  return sync ? this->sync() : Status::Ok();
}

Status RecordLogWriter::sync() {
  if (!failed_.ok()) return failed_;
  Status st = file_->sync();
  // After a failed fsync the kernel may have dropped the dirty pages and a later fsync may succeed
  // without them: records acknowledged after that would sit behind a hole. Stop writing instead.
  if (!st.ok()) failed_ = st.prefixed("the log is read-only until restart: ");
  return st;
}

uint64_t RecordLogWriter::size() const { return file_->size(); }

Status rewrite_record_log(const std::filesystem::path& path, std::span<const RecordToWrite> records, FileSystem& fs) {
  std::vector<std::string> encoded;
  std::vector<std::span<const uint8_t>> parts;
  encoded.reserve(records.size());
  for (const auto& r : records) {
    if (r.type == 0 || r.payload.size() > kMaxRecordBytes) {
      return Status::InvalidArgument("invalid record (type 0 or too long) in compaction");
    }
    encoded.push_back(encode_record(r.type, r.payload));
  }
  for (const auto& e : encoded) parts.push_back(bytes_of(e));
  return write_file_atomic(fs, path, parts);
}

}  // namespace towers

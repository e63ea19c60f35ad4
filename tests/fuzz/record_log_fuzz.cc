// libFuzzer target for the record log reader (mmapstore/record_log.h): the input is a whole log file.
// Reading delivers records in file order, never a damaged one, and accounts for every byte (those of
// delivered records plus the skipped ones make the file). Opening it for writing cuts a torn tail,
// and a record appended then reads back as the last one, after the same records as before.
#include "fuzz/fuzz_support.h"
#include "mmapstore/record_log.h"

using namespace towers;

namespace {
// Logs of valid records, one with a damaged record between good ones, one with a torn tail.
fuzz::Seeds seeds() {
  const std::string a = encode_record(1, "{\"model\":\"m\"}"), b = encode_record(5, std::string(40, 'x')),
                    c = encode_record(255, "");
  std::string damaged = a + b + c;
  damaged[a.size() + 13] ^= 0x20;
  return {fuzz::bytes_of(a), fuzz::bytes_of(a + b + c), fuzz::bytes_of(damaged),
          fuzz::bytes_of(a + b + c.substr(0, 7)), fuzz::bytes_of(a + "\x57\x7E" + b)};
}
}  // namespace

TOWERS_FUZZ_SEEDS(seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "record_log_fuzz";
  static const auto path = fuzz::scratch_path(kTarget);
  fuzz::write_file(path, {data, size});
  std::vector<LogRecord> records;
  auto report = read_record_log(path, [&](const LogRecord& r) { records.push_back(r); });
  if (!report.ok()) fuzz::die(kTarget, "an unreadable log: " + report.error());
  uint64_t record_bytes = 0, last_end = 0;
  for (const auto& r : records) {
    if (r.type == 0) fuzz::die(kTarget, "a record of type 0 delivered");
    if (r.offset < last_end) fuzz::die(kTarget, "records out of order or overlapping");
    last_end = r.offset + kRecordHeaderBytes + r.payload.size();
    if (last_end > size) fuzz::die(kTarget, "a record past the end of the file");
    if (encode_record(r.type, r.payload) != std::string_view(reinterpret_cast<const char*>(data) + r.offset,
                                                             last_end - r.offset)) {
      fuzz::die(kTarget, "a delivered record is not the bytes at its offset");
    }
    record_bytes += last_end - r.offset;
  }
  if (report->records != records.size() || report->file_bytes != size || report->valid_end != last_end ||
      record_bytes + report->skipped_bytes != size) {
    fuzz::die(kTarget, "the report does not account for every byte");
  }
  if (report->problems.size() != report->damaged + (report->torn_tail ? 1 : 0)) {
    fuzz::die(kTarget, "a skipped region without its problem line");
  }

  LogReadReport opened;
  auto writer = RecordLogWriter::open(path, &opened);
  if (!writer.ok()) fuzz::die(kTarget, "cannot open the log for writing: " + writer.error());
  const std::string payload = "appended after the fuzzed bytes";
  if (Status st = (*writer)->append(7, payload, /*sync=*/false); !st.ok()) fuzz::die(kTarget, st.message());
  writer->reset();
  std::vector<LogRecord> after;
  auto again = read_record_log(path, [&](const LogRecord& r) { after.push_back(r); });
  if (!again.ok() || again->torn_tail) fuzz::die(kTarget, "the log after an append has a torn tail");
  if (after.size() != records.size() + 1 || after.back().type != 7 || after.back().payload != payload) {
    fuzz::die(kTarget, "the appended record does not read back last, after the same records");
  }
  for (size_t i = 0; i < records.size(); ++i) {
    if (after[i].offset != records[i].offset || after[i].payload != records[i].payload) {
      fuzz::die(kTarget, "an append changed the records before it");
    }
  }
  return 0;
}

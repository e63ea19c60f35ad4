// libFuzzer target for the payloads of towerd's state log (daemon/records.h): what replay reads back
// after the record log's checksum passed (a log written by another version, or edited by hand).
// Input: the record's type byte, then its payload. parse_record either refuses it with a message or
// returns a record of that type whose payload, written and parsed again, is a fixed point.
#include "daemon/records.h"
#include "fuzz/fuzz_support.h"

using namespace towers;
using namespace towers::daemon;

namespace {
// One record of every type, as towerd writes it.
fuzz::Seeds seeds() {
  using namespace towers::daemon::record;
  const std::vector<Record> records = {
      Header{"stories260K", 0x1234567890ABCDEFull},
      SegmentPut{"acme", Level::Platform, "", "You work for Acme.", 1700000000, 3},
      SegmentPut{"hal", Level::Bot, "acme", "Your name is Hal. \u00e9\n", 1700000001, 0},
      SegmentDelete{"hal"},
      SessionCreate{"s1", "hal", 1700000002},
      SessionTurn{"s1", 2, 1, 12, "Hi", "Hello!", {1, 2, 3}, {4, 5}, {3, 5}, {7, 8}, 1700000003, "", ""},
      SessionDelete{"s1"},
      SessionSnapshot{"s2", "hal", 1700000004, 1700000005, {{"user", "Hi"}, {"assistant", "Hey"}}, {1, 2, 3, 4},
                      {2, 4}, {9, 10}, 1, {4}},
      SegmentTier{"acme", {0x54, 0x57, 0x43, 0x31}, 1700000006},
      SegmentTier{"acme", {}, 1700000007},
  };
  fuzz::Seeds out;
  for (const Record& r : records) {
    std::vector<uint8_t> seed = {static_cast<uint8_t>(type_of(r))};
    const std::string payload = record_payload(r);
    seed.insert(seed.end(), payload.begin(), payload.end());
    out.push_back(seed);
  }
  return out;
}
}  // namespace

TOWERS_FUZZ_SEEDS(seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "records_fuzz";
  if (size == 0) return 0;
  const auto type = static_cast<RecordType>(data[0]);
  auto r = parse_record(type, fuzz::text_of(data + 1, size - 1));
  if (!r.ok()) {
    if (r.error().empty()) fuzz::die(kTarget, "a refused record without a message");
    return 0;
  }
  if (type_of(*r) != type) fuzz::die(kTarget, "a record of another type than its type byte");
  const std::string payload = record_payload(*r);
  auto again = parse_record(type, payload);
  if (!again.ok()) fuzz::die(kTarget, "a record's own payload does not parse: " + again.error() + "\n" + payload);
  if (record_payload(*again) != payload) fuzz::die(kTarget, "a record's payload is not a fixed point\n" + payload);
  return 0;
}

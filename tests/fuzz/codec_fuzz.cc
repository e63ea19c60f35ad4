// libFuzzer target for the cold-tier codec's containers and records (engine/codec/codec.h), read
// without a model: read_codec_container, read_codec_store_header, read_codec_record and
// record_codes on arbitrary bytes. Each either fails with a message or returns fields that lie
// inside the input; a container read back is written again byte for byte.
#include <cstring>

#include "engine/codec/codec.h"
#include "fuzz/fuzz_support.h"

using namespace towers;

namespace {
constexpr const char* kTarget = "codec_fuzz";

template <class R>
void must_explain(const R& r, const char* what) {
  if (!r.ok() && r.error().empty()) fuzz::die(kTarget, std::string(what) + " failed without a message");
}

void check_container(std::span<const uint8_t> in) {
  auto container = read_codec_container(in);
  must_explain(container, "read_codec_container");
  if (!container.ok()) return;
  const auto& c = *container;
  if (!c.record.empty() && (c.record.data() < in.data() || c.record.data() + c.record.size() > in.data() + in.size())) {
    fuzz::die(kTarget, "the container's record lies outside the input");
  }
  if (write_codec_container(c.store, c.key, c.record) != std::vector<uint8_t>(in.begin(), in.end())) {
    fuzz::die(kTarget, "a container read back is not written again byte for byte");
  }
}

void put_crc(std::vector<uint8_t>& bytes, size_t at, uint32_t crc) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<uint8_t>(crc >> (8 * i));
}
}  // namespace

namespace {
// Records of no tokens, of one stream, and chunked; containers around them; bare records behind
// their token count.
fuzz::Seeds seeds() {
  const std::vector<uint8_t> empty = {0x34, 0x12};
  const std::vector<uint8_t> one = {0x34, 0x12, 0xA1, 0xB2, 0xC3};
  // 10 tokens in chunks of 4: check | flag, chunk 4, sizes of chunks 0 and 1, then 2 + 1 + 2 bytes.
  const std::vector<uint8_t> chunked = {0x34, 0x92, 4, 2, 1, 0xA1, 0xA2, 0xB1, 0xC1, 0xC2};
  CodecStoreHeader store;
  store.fingerprint = 0x1234567890ABCDEFull;
  store.target_tag = 3;
  store.window = 64;
  fuzz::Seeds out;
  out.push_back(write_codec_store_header(store));
  out.push_back(write_codec_container(store, {0, 0, 0}, empty));
  out.push_back(write_codec_container(store, {10, 5, 0xCAFEF00D}, one));
  out.push_back(write_codec_container(store, {10, 300, 0xCAFEF00D}, chunked));
  // The first finding: a token count written with a zero byte after it (10 as 0x8A 0x00) was read,
  // then written back shorter. The reader now takes only the shortest encoding.
  std::vector<uint8_t> padded = write_codec_container(store, {10, 5, 0xCAFEF00D}, one);
  padded.insert(padded.begin() + codec::kStoreHeaderBytes + 1, 0x00);
  padded[codec::kStoreHeaderBytes] |= 0x80;
  padded.resize(padded.size() - 4);
  const uint32_t crc = codec::crc32(padded);
  for (int i = 0; i < 4; ++i) padded.push_back(static_cast<uint8_t>(crc >> (8 * i)));
  out.push_back(padded);
  for (const auto& [tokens, record] : {std::pair<uint32_t, std::vector<uint8_t>>{0, empty}, {10, one}, {10, chunked}}) {
    std::vector<uint8_t> bare(4);
    std::memcpy(bare.data(), &tokens, 4);
    bare.insert(bare.end(), record.begin(), record.end());
    out.push_back(bare);
  }
  return out;
}
}  // namespace

TOWERS_FUZZ_SEEDS(seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  check_container(in);
  must_explain(read_codec_store_header(in), "read_codec_store_header");
  // The same bytes with both CRCs made right (store header, container), so the fields behind them
  // are fuzzed too: a forged CRC must not get past the field checks.
  constexpr size_t kStoreCrcAt = 20;
  if (size >= kStoreCrcAt + 8) {
    std::vector<uint8_t> forged(in.begin(), in.end());
    put_crc(forged, kStoreCrcAt, codec::crc32(std::span(forged).first(kStoreCrcAt)));
    put_crc(forged, size - 4, codec::crc32(std::span(forged).first(size - 4)));
    check_container(forged);
    must_explain(read_codec_store_header(forged), "read_codec_store_header (forged CRC)");
  }
  // A bare record: the first 4 bytes are the token count the store's index would give.
  if (size >= 4) {
    uint32_t n = 0;
    std::memcpy(&n, data, 4);
    const int64_t tokens = n % (1u << 20);
    const auto record = in.subspan(4);
    auto r = read_codec_record(record, tokens);
    must_explain(r, "read_codec_record");
    if (r.ok() && r->chunk < 0) fuzz::die(kTarget, "a record with a negative chunk size");
    std::vector<int32_t> some(static_cast<size_t>(std::min<int64_t>(tokens, 4096)), 7);
    (void)record_codes(record, some);
  }
  return 0;
}

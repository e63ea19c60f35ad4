// libFuzzer target for segment files (mmapstore/segment_file.h, layout in segment_format.h): the
// open-time checks of the header and tokens, the payload checksum, and the Segment the pool would
// serve from the mapped bytes. The first input byte picks how the rest becomes a file:
//   0: the rest as it is (the checks in their order: magic, header checksum, ...);
//   1: the rest with the magic, version, model fingerprint, shape and both checksums made right, so
//      the size and offset checks behind them are fuzzed too;
//   2: a file laid out from a few fuzzed numbers (format, token count, and sizes that are right or
//      fuzzed), with right checksums: the Segment over the mapping is built and its every row read.
// A file the checks pass must be one whose every section lies inside the mapping.
#include <cstring>

#include "engine/model/segment.h"
#include "fuzz/fuzz_support.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_format.h"
#include "simd/kv_quant.h"

using namespace towers;
namespace fmt = towers::segment_format;

namespace {
constexpr const char* kTarget = "segment_file_fuzz";
constexpr uint64_t kFingerprint = 0x70E75F022;

ModelConfig tiny_config() {
  ModelConfig c;
  c.n_vocab = 300;
  c.n_layer = 2;
  c.n_head_kv = 2;
  c.head_dim = 32;
  return c;
}

uint64_t header_checksum(const fmt::Header& h) {
  return xxh3_64({reinterpret_cast<const uint8_t*>(&h), offsetof(fmt::Header, header_xxh3)});
}

// What every file of this model's store shares: magic, version, fingerprint, shape.
void set_identity(fmt::Header& h, const ModelConfig& c) {
  std::memcpy(h.magic, fmt::kMagic, sizeof h.magic);
  h.version = fmt::kVersion;
  h.model_fingerprint = kFingerprint;
  h.n_layer = static_cast<uint32_t>(c.n_layer);
  h.n_head_kv = static_cast<uint32_t>(c.n_head_kv);
  h.head_dim = static_cast<uint32_t>(c.head_dim);
}

// Magic, version, fingerprint, shape and checksums right; the rest of the header as fuzzed.
void make_plausible(std::vector<uint8_t>& file, const ModelConfig& c) {
  fmt::Header h;
  std::memcpy(&h, file.data(), sizeof h);
  set_identity(h, c);
  if (h.tokens_offset <= file.size() && h.n_tokens <= (file.size() - h.tokens_offset) / 4) {
    h.tokens_xxh3 = xxh3_64({file.data() + h.tokens_offset, 4 * h.n_tokens});
  }
  if (h.tokens_offset <= file.size()) h.payload_xxh3 = xxh3_64({file.data() + h.tokens_offset, file.size() - h.tokens_offset});
  h.header_xxh3 = header_checksum(h);
  std::memcpy(file.data(), &h, sizeof h);
}

// A file laid out as towerd writes one, from fuzzed numbers and bytes.
std::vector<uint8_t> laid_out(std::span<const uint8_t> in, const ModelConfig& c) {
  auto take = [&](size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n && !in.empty(); ++i, in = in.subspan(1)) v |= uint64_t{in[0]} << (8 * i);
    return v;
  };
  fmt::Header h{};
  set_identity(h, c);
  const uint64_t choice = take(1);
  h.format = static_cast<uint8_t>(take(1) % 6);  // one past the last format too
  h.flags = static_cast<uint8_t>(take(1));
  h.id = take(1);
  h.parent = take(1);
  h.computed_pos = static_cast<int32_t>(take(4));
  h.n_tokens = take(1) % 65;
  const auto format = static_cast<simd::KvQuant>(std::min<uint8_t>(h.format, 4));
  const uint64_t row = simd::kv_vec_bytes(format, c.head_dim) * c.n_head_kv;
  h.kv_bytes = (choice & 1) ? take(2) : c.n_layer * h.n_tokens * row;
  const bool scaled = format == simd::KvQuant::Q8 || format == simd::KvQuant::Q6 || format == simd::KvQuant::Q4;
  h.n_scales = (choice & 2) ? take(2) : (scaled ? uint64_t(c.n_layer) * c.kv_dim() : 0);
  h.tokens_offset = sizeof(fmt::Header);
  h.k_offset = fmt::align_up(h.tokens_offset + 4 * h.n_tokens);
  h.v_offset = fmt::align_up(h.k_offset + h.kv_bytes);
  h.scales_offset = fmt::align_up(h.v_offset + h.kv_bytes);
  h.file_bytes = h.scales_offset + 4 * h.n_scales;
  std::vector<uint8_t> file(h.file_bytes, 0);
  for (uint64_t i = 0; i < h.n_tokens; ++i) {
    const int32_t t = static_cast<int32_t>(take(2) % (c.n_vocab + 2));  // and a couple outside
    std::memcpy(file.data() + h.tokens_offset + 4 * i, &t, 4);
  }
  for (uint64_t at = h.k_offset; at < file.size() && !in.empty(); ++at) file[at] = static_cast<uint8_t>(take(1));
  h.tokens_xxh3 = xxh3_64({file.data() + h.tokens_offset, 4 * h.n_tokens});
  h.context_xxh3 = xxh3_64({});
  h.payload_xxh3 = xxh3_64({file.data() + h.tokens_offset, file.size() - h.tokens_offset});
  h.header_xxh3 = header_checksum(h);
  std::memcpy(file.data(), &h, sizeof h);
  return file;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto path = fuzz::scratch_path(kTarget);
  static const ModelConfig config = tiny_config();
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  std::vector<uint8_t> file;
  switch (data[0] % 3) {
    case 0: file.assign(rest.begin(), rest.end()); break;
    case 1:
      file.assign(rest.begin(), rest.end());
      if (file.size() >= sizeof(fmt::Header)) make_plausible(file, config);
      break;
    case 2: file = laid_out(rest, config); break;
  }
  if (file.size() > (size_t(1) << 22)) return 0;  // sizes the fuzzer chose: keep inputs small
  fuzz::write_file(path, file);
  auto opened = SegmentFile::open(path, config, kFingerprint);
  if (!opened.ok()) {
    if (opened.error().empty()) fuzz::die(kTarget, "a refused file without a message");
    return 0;
  }
  SegmentFile& f = **opened;
  const auto& h = f.header();
  if (h.file_bytes != file.size() || h.scales_offset + 4 * h.n_scales > file.size()) {
    fuzz::die(kTarget, "an accepted header whose sections leave the file");
  }
  for (int32_t t : f.tokens()) {
    if (t < 0 || t >= config.n_vocab) fuzz::die(kTarget, "an accepted token outside the vocabulary");
  }
  if (!f.verify().ok()) return 0;
  auto segment = f.segment(config);
  if (!segment.ok()) return 0;
  const Segment& s = **segment;
  for (int layer = 0; layer < config.n_layer; ++layer) {
    for (int32_t row = 0; row < s.length(); ++row) (void)s.key_row(layer, row);
  }
  return 0;
}

#include "engine/codec/codec.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "engine/generate/perplexity.h"
#include "engine/codec/range_coder.h"
#include "engine/model/segment.h"
#include "engine/text/tokenizer.h"
#include "simd/ops.h"

namespace towers {

// ------------------------------------------------------------------------------------ fingerprint

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t load64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);  // little-endian hosts (x86-64, ARM64) read the same words
  return w;
}

// Four independent multiply-xorshift lanes over 8-byte words (no dependency chain between lanes, so
// it runs at memory speed), folded with a strong finalizer. Not cryptographic: it tells models apart.
uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t seed) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  // Four named lanes, not an array: compilers keep them in registers at -O2 (2.7x faster).
  uint64_t h0 = seed ^ 0x243F6A8885A308D3ull, h1 = seed ^ 0x13198A2E03707344ull,
           h2 = seed ^ 0xA4093822299F31D0ull, h3 = seed ^ 0x082EFA98EC4E6C89ull;
  auto lane = [](uint64_t h, uint64_t w) {
    h = (h ^ w) * kMul;
    return h ^ (h >> 29);
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    h0 = lane(h0, load64(p + i));
    h1 = lane(h1, load64(p + i + 8));
    h2 = lane(h2, load64(p + i + 16));
    h3 = lane(h3, load64(p + i + 24));
  }
  if (i < n) {
    uint8_t tail[32] = {};
    std::memcpy(tail, p + i, n - i);
    h0 = lane(h0, load64(tail));
    h1 = lane(h1, load64(tail + 8));
    h2 = lane(h2, load64(tail + 16));
    h3 = lane(h3, load64(tail + 24));
  }
  uint64_t r = mix64(n ^ seed);
  for (uint64_t x : {h0, h1, h2, h3}) r = mix64(r ^ mix64(x));
  return r;
}

void put_bytes(std::string& s, const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }
template <class T>
void put_pod(std::string& s, T v) { put_bytes(s, &v, sizeof v); }
void put_str(std::string& s, std::string_view v) {
  put_pod<uint64_t>(s, v.size());
  s.append(v);
}

bool metadata_affects_logits(std::string_view key) {
  if (key == "general.architecture") return true;
  if (key.starts_with("general.")) return false;
  if (key.starts_with("tokenizer.chat_template")) return false;
  return true;
}

}  // namespace

uint64_t model_fingerprint(const Model& model, ThreadPool* pool) {
  const GgufFile& f = model.file();
  // Metadata first: serialised key, type and value of every key that matters, in file order.
  std::string meta;
  for (const GgufKV& kv : f.metadata()) {
    if (!metadata_affects_logits(kv.key)) continue;
    const GgufValue& v = kv.value;
    put_str(meta, kv.key);
    put_pod<uint32_t>(meta, static_cast<uint32_t>(v.type));
    switch (v.type) {
      case GgufValueType::STRING: put_str(meta, v.str); break;
      case GgufValueType::ARRAY:
        put_pod<uint32_t>(meta, static_cast<uint32_t>(v.elem_type));
        put_pod<uint64_t>(meta, v.count);
        if (v.elem_type == GgufValueType::STRING) {
          for (std::string_view s : v.strings) put_str(meta, s);
        } else if (v.data) {
          put_bytes(meta, v.data, v.count * gguf_scalar_size(v.elem_type));
        }
        break;
      default:
        put_pod(meta, v.u);
        put_pod(meta, v.i);
        put_pod(meta, v.f);
    }
  }
  uint64_t h = hash_bytes(reinterpret_cast<const uint8_t*>(meta.data()), meta.size(), 1);

  // Tensor bytes in blocks of 1 MiB, hashed in parallel; blocks are combined in file order.
  constexpr size_t kBlock = size_t{1} << 20;
  struct Block { const uint8_t* p; size_t n; };
  std::vector<Block> blocks;
  std::string desc;
  for (const GgufTensorInfo& t : f.tensors()) {
    put_str(desc, t.name);
    put_pod<uint32_t>(desc, static_cast<uint32_t>(t.type));
    for (uint64_t d : t.ne) put_pod(desc, d);
    put_pod(desc, t.nbytes);
    for (uint64_t off = 0; off < t.nbytes; off += kBlock) {
      blocks.push_back({t.data + off, static_cast<size_t>(std::min<uint64_t>(kBlock, t.nbytes - off))});
    }
  }
  h = mix64(h ^ hash_bytes(reinterpret_cast<const uint8_t*>(desc.data()), desc.size(), 2));
  std::vector<uint64_t> bh(blocks.size());
  auto work = [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) bh[i] = hash_bytes(blocks[i].p, blocks[i].n, i);
  };
  if (pool && pool->size() > 1 && blocks.size() > 1) {
    pool->parallel_for(blocks.size(), work);
  } else {
    work(0, blocks.size(), 0);
  }
  for (uint64_t x : bh) h = mix64(h ^ x) + 0x9E3779B97F4A7C15ull;
  return mix64(h);
}

Status check_same_vocabulary(const Model& serving, const Model& coder) {
  const Tokenizer& a = serving.tokenizer();
  const Tokenizer& b = coder.tokenizer();
  if (a.n_vocab() != b.n_vocab() || serving.config().n_vocab != coder.config().n_vocab) {
    return Status::Error("the coder model's vocabulary has " + std::to_string(coder.config().n_vocab) +
                         " tokens, the serving model's " + std::to_string(serving.config().n_vocab));
  }
  for (int32_t i = 0; i < a.n_vocab(); ++i) {
    if (a.token_text(i) != b.token_text(i)) {
      return Status::Error("the coder model's token " + std::to_string(i) + " differs from the serving model's");
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------------------- CRC, tables

namespace codec {

namespace {
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// 2^(f / 65536) for f in [0, 65536), in Q30: the degree-7 Taylor polynomial of 2^x in integer Horner
// form (relative error < 2e-6, which only costs ~3e-6 bits per token; what matters is that it is the
// same integer on every machine). Coefficients: round(ln2^k / k! * 2^30).
uint64_t exp2_frac_q30(uint32_t f) {
  static constexpr int64_t c[8] = {1073741824, 744261118, 257941248, 59597083, 10327387, 1431680, 165394, 16377};
  int64_t acc = c[7];
  for (int k = 6; k >= 0; --k) acc = c[k] + ((acc * static_cast<int64_t>(f)) >> 16);
  return static_cast<uint64_t>(acc);
}
}  // namespace

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc) {
  crc = ~crc;
  for (uint8_t b : bytes) crc = kCrcTable[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32_tokens(std::span<const int32_t> tokens) {
  uint32_t crc = 0;
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    const uint8_t le[4] = {uint8_t(u), uint8_t(u >> 8), uint8_t(u >> 16), uint8_t(u >> 24)};
    crc = crc32(le, crc);
  }
  return crc;
}

uint16_t tokens_check(std::span<const int32_t> tokens) {
  return static_cast<uint16_t>(crc32_tokens(tokens) & ((1u << kCheckBits) - 1));
}

void frequencies(std::span<const float> logits, std::vector<uint32_t>& freq) {
  const size_t V = logits.size();
  freq.assign(V, 1);
  if (V == 0) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits) mx = x > mx ? x : mx;  // NaN never wins
  // Weights w_i ~ 2^30 * exp(l_i - max) in fixed point: the difference is clamped to [-64, 0] nats and
  // scaled by 2^16 (exact in float), then everything is integer. exp(-64) is far below the floor of 1.
  std::vector<uint64_t> w(V, 1);
  if (std::isfinite(mx)) {
    constexpr int64_t kLog2eQ30 = 1549082005;  // round(log2(e) * 2^30)
    for (size_t i = 0; i < V; ++i) {
      const float d = logits[i] - mx;
      const int64_t q = d > -64.0f ? static_cast<int64_t>(d * 65536.0f) : int64_t{-64} * 65536;  // Q16 nats
      const int64_t y = (q * kLog2eQ30) >> 30;  // Q16 log2 units, <= 0 (arithmetic shift: floor)
      const int64_t n = -(y >> 16);             // integer part, as a right shift 0..93
      const uint32_t fr = static_cast<uint32_t>(y & 0xFFFF);
      w[i] = n >= 40 ? 0 : exp2_frac_q30(fr) >> n;
    }
  }
  uint64_t total_w = 0;
  size_t argmax = 0;
  for (size_t i = 0; i < V; ++i) {
    total_w += w[i];
    if (w[i] > w[argmax]) argmax = i;
  }
  // Every token gets 1, the rest of 2^31 is shared in proportion to the weights (rounded down); what
  // the rounding leaves goes to the most likely token. w < 2^31 and spare < 2^31: no overflow.
  const uint64_t total = uint64_t{1} << kFreqBits;
  const uint64_t spare = total - V;
  uint64_t sum = 0;
  for (size_t i = 0; i < V; ++i) {
    freq[i] = static_cast<uint32_t>(1 + w[i] * spare / total_w);
    sum += freq[i];
  }
  freq[argmax] += static_cast<uint32_t>(total - sum);
}

}  // namespace codec

namespace {
uint16_t target_tag_of(std::string_view name) {
  return static_cast<uint16_t>(codec::crc32(std::span(reinterpret_cast<const uint8_t*>(name.data()), name.size())) &
                               0xFFFF);
}
}  // namespace

uint16_t codec_target_tag() { return target_tag_of(simd::target_name()); }

std::string codec_target_name(uint16_t tag) {
  // Highway's target names (hwy::TargetName), listed here because Highway names only the targets of
  // the architecture it was compiled for, and a container may come from another.
  struct Known {
    const char* name;
    const char* family;
  };
  static constexpr Known kKnown[] = {
      {"SSSE3", "x86-64"}, {"SSE4", "x86-64"},   {"AVX2", "x86-64"},    {"AVX3", "x86-64"},
      {"AVX3_DL", "x86-64"}, {"NEON", "ARM64"}, {"SVE", "ARM64"},     {"SVE2", "ARM64"},
      {"SVE_256", "ARM64"}, {"SVE2_128", "ARM64"}, {"PPC8", "POWER"}, {"WASM", "WebAssembly"},
      {"WASM_EMU256", "WebAssembly"}, {"RVV", "RISC-V"}, {"EMU128", "portable"}, {"SCALAR", "portable"}};
  for (const Known& k : kKnown) {
    if (target_tag_of(k.name) == tag) return std::string(k.name) + " (" + k.family + ")";
  }
  return "an unknown target";
}

// --------------------------------------------------------------------------------- container

namespace {

constexpr uint8_t kMagic[4] = {'T', 'W', 'C', 'Z'};
// Store header flags (byte 5).
constexpr uint8_t kFlagFast = 1;          // the fast kernels (else the reference ones)
constexpr uint8_t kFlagGgmlRounding = 2;  // Rounding::Ggml (else F32: stores written before 2026-11-27)
// Bits 2-3: the PackedSet number (0 = Classic: every store written before the field existed).
constexpr int kFlagPackedSetShift = 2;
constexpr uint8_t kFlagPackedSetMask = 3 << kFlagPackedSetShift;
constexpr uint16_t kChunkedFlag = 0x8000;  // in a record's first two bytes, above the tokens check

void put_le(std::vector<uint8_t>& o, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) o.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_varint(std::vector<uint8_t>& o, uint64_t v) {
  while (v >= 0x80) {
    o.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  o.push_back(static_cast<uint8_t>(v));
}

// Bounds-checked reading; the first failure sticks.
struct Reader {
  std::span<const uint8_t> in;
  size_t pos = 0;
  bool ok = true;
  size_t left() const { return in.size() - pos; }
  uint64_t le(int bytes) {
    if (!ok || left() < size_t(bytes)) return ok = false, 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{in[pos++]} << (8 * i);
    return v;
  }
  // Only the shortest encoding of a value is read (as put_varint writes it): a last byte of zero
  // after others, or bits beyond 64, fail, so every container has one byte string (codec_fuzz).
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; ok && shift < 64; shift += 7) {
      if (pos >= in.size()) return ok = false, 0;
      const uint8_t b = in[pos++];
      if (shift == 63 && b > 1) return ok = false, 0;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) {
        if (b == 0 && shift > 0) return ok = false, 0;
        return v;
      }
    }
    return ok = false, 0;
  }
};

Status corrupt(const std::string& what) { return Status::Error("codec: corrupt container: " + what); }
Status corrupt_record(const std::string& what) { return Status::Error("codec: corrupt record: " + what); }

// Magic and version come first in every container and store header, so their errors name them.
Status check_magic_and_version(std::span<const uint8_t> bytes) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return Status::Error("codec: not a Towers codec container (bad magic; expected \"TWCZ\")");
  }
  if (bytes.size() > 4 && bytes[4] != codec::kVersion) {
    return Status::Error("codec: container version " + std::to_string(bytes[4]) + "; this build reads version " +
                         std::to_string(codec::kVersion) + " (re-encode it)");
  }
  return Status::Ok();
}

}  // namespace

std::vector<uint8_t> write_codec_store_header(const CodecStoreHeader& h) {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  out.push_back(h.version);
  out.push_back(static_cast<uint8_t>((h.kernels == Kernels::Fast ? kFlagFast : 0) |
                                     (h.rounding == Rounding::Ggml ? kFlagGgmlRounding : 0) |
                                     (static_cast<uint8_t>(h.packed_set) << kFlagPackedSetShift)));
  put_le(out, h.fingerprint, 8);
  put_le(out, h.target_tag, 2);
  put_le(out, static_cast<uint32_t>(h.window), 4);
  put_le(out, codec::crc32(out), 4);
  return out;
}

Result<CodecStoreHeader> read_codec_store_header(std::span<const uint8_t> bytes) {
  if (Status st = check_magic_and_version(bytes); !st) return st;
  if (bytes.size() < codec::kStoreHeaderBytes) return corrupt("store header truncated");
  Reader r{bytes.first(codec::kStoreHeaderBytes), 5};
  const uint8_t flags = static_cast<uint8_t>(r.le(1));
  CodecStoreHeader h;
  h.version = bytes[4];
  h.fingerprint = r.le(8);
  h.target_tag = static_cast<uint16_t>(r.le(2));
  const uint64_t window = r.le(4);
  if (codec::crc32(bytes.first(r.pos)) != r.le(4)) return corrupt("store header CRC mismatch (damaged)");
  if ((flags & ~uint8_t{kFlagFast | kFlagGgmlRounding | kFlagPackedSetMask}) != 0) return corrupt("unknown flags");
  const int packed_set = (flags & kFlagPackedSetMask) >> kFlagPackedSetShift;
  if (packed_set > static_cast<int>(kLatestPackedSet)) {
    return Status::Error("codec: the store was coded with packed kernel set " + std::to_string(packed_set) +
                         "; this build knows sets up to " + std::to_string(static_cast<int>(kLatestPackedSet)) +
                         " (a newer towerd wrote it: decode it with that version)");
  }
  if (window < 2 || window > (uint64_t{1} << 24)) return corrupt("window " + std::to_string(window));
  h.kernels = (flags & kFlagFast) ? Kernels::Fast : Kernels::Reference;
  h.rounding = (flags & kFlagGgmlRounding) ? Rounding::Ggml : Rounding::F32;
  h.packed_set = static_cast<PackedSet>(packed_set);
  h.window = static_cast<int32_t>(window);
  return h;
}

CodecSegmentKey codec_segment_key(std::span<const int32_t> context, std::span<const int32_t> tokens) {
  return {static_cast<int64_t>(tokens.size()), static_cast<int64_t>(context.size()), codec::crc32_tokens(context)};
}

// [u16 check | chunked flag] [chunked: varint chunk, varint bytes of every chunk but the last] [streams]
Result<CodecRecord> read_codec_record(std::span<const uint8_t> record, int64_t tokens) {
  if (tokens < 0 || tokens > codec::kMaxTokens) return corrupt_record("token count " + std::to_string(tokens));
  Reader r{record};
  const uint16_t tag = static_cast<uint16_t>(r.le(2));
  if (!r.ok) return corrupt_record("shorter than its 2-byte check");
  CodecRecord rec;
  rec.tokens_check = tag & ~kChunkedFlag;
  if (tokens == 0) {
    if (tag & kChunkedFlag || r.left() != 0) return corrupt_record("coded bytes for no tokens");
    rec.header_bytes = r.pos;
    return rec;
  }
  uint64_t chunk = static_cast<uint64_t>(tokens), n_chunks = 1;
  if (tag & kChunkedFlag) {
    chunk = r.varint();
    if (!r.ok || chunk == 0 || chunk >= static_cast<uint64_t>(tokens)) return corrupt_record("chunk size");
    n_chunks = (static_cast<uint64_t>(tokens) + chunk - 1) / chunk;
    // Every chunk costs at least one byte of table (but the last) and one of data: bound the table
    // by the input before allocating.
    if (n_chunks > (r.left() + 1) / 2) return corrupt_record("chunk table larger than the record");
  }
  rec.chunk = static_cast<int32_t>(chunk);
  rec.chunk_bytes.reserve(n_chunks);
  uint64_t listed = 0;
  for (uint64_t i = 0; i + 1 < n_chunks; ++i) {
    const uint64_t n = r.varint();
    if (!r.ok || n == 0 || n > std::numeric_limits<uint32_t>::max()) return corrupt_record("chunk " + std::to_string(i) + " size");
    rec.chunk_bytes.push_back(static_cast<uint32_t>(n));
    listed += n;
  }
  rec.header_bytes = r.pos;
  if (listed >= r.left() || r.left() - listed > std::numeric_limits<uint32_t>::max()) {
    return corrupt_record("the chunk table lists " + std::to_string(listed) + " bytes, the record has " +
                          std::to_string(r.left()) + " (the last chunk needs at least one)");
  }
  rec.chunk_bytes.push_back(static_cast<uint32_t>(r.left() - listed));
  return rec;
}

bool record_codes(std::span<const uint8_t> record, std::span<const int32_t> tokens) {
  auto rec = read_codec_record(record, static_cast<int64_t>(tokens.size()));
  return rec.ok() && rec->tokens_check == codec::tokens_check(tokens);
}

std::vector<uint8_t> write_codec_container(const CodecStoreHeader& store, const CodecSegmentKey& key,
                                           std::span<const uint8_t> record) {
  std::vector<uint8_t> out = write_codec_store_header(store);
  put_varint(out, static_cast<uint64_t>(key.tokens));
  put_varint(out, static_cast<uint64_t>(key.context_length));
  put_le(out, key.context_crc, 4);
  out.insert(out.end(), record.begin(), record.end());
  put_le(out, codec::crc32(out), 4);
  return out;
}

Result<CodecContainer> read_codec_container(std::span<const uint8_t> bytes) {
  // Magic and version first, then one CRC over everything catches any damage or truncation before a
  // field is believed.
  if (Status st = check_magic_and_version(bytes); !st) return st;
  if (bytes.size() < codec::kStoreHeaderBytes + 1 + 1 + 4 + 2 + 4) return corrupt("too short (truncated?)");
  const size_t body = bytes.size() - 4;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= uint32_t{bytes[body + i]} << (8 * i);
  if (codec::crc32(bytes.first(body)) != stored) return corrupt("CRC mismatch (damaged or truncated)");

  // The CRC can be forged: every field is still checked before it is used.
  auto store = read_codec_store_header(bytes);
  if (!store) return store.status();
  Reader r{bytes.first(body), codec::kStoreHeaderBytes};
  CodecContainer c;
  c.store = *store;
  const uint64_t tokens = r.varint();
  const uint64_t context_length = r.varint();
  c.key.context_crc = static_cast<uint32_t>(r.le(4));
  if (!r.ok) return corrupt("header truncated");
  if (tokens > uint64_t(codec::kMaxTokens)) return corrupt("token count " + std::to_string(tokens) + " is absurd");
  if (context_length > (uint64_t{1} << 40)) return corrupt("context length");
  c.key.tokens = static_cast<int64_t>(tokens);
  c.key.context_length = static_cast<int64_t>(context_length);
  c.record = bytes.subspan(r.pos, body - r.pos);
  if (auto rec = read_codec_record(c.record, c.key.tokens); !rec) return rec.status();
  return c;
}

// ------------------------------------------------------------------------ chunked model runs

namespace {

// What every chunk starts from: the last window/2 tokens of the context (or BOS for an empty one),
// their KV computed once and shared read-only, and the distribution of each chunk's first token.
struct Start {
  int32_t window = 0, keep = 0;
  std::vector<int32_t> prefix;
  std::shared_ptr<const Segment> prefix_kv;  // nullptr when the prefix is empty
  std::vector<float> first_logits;           // all zeros (uniform) when the prefix is empty
};

// A codec pass runs the store's arithmetic, and restores the Forward's own after it:
// - never the oneDNN prefill kernels: their arithmetic depends on whether a step has enough tokens
//   (Forward::set_onednn_min_tokens), and encoding prefills chunks where decoding goes token by token,
//   so only the fast kernels give both sides the same probabilities (docs/codec.md);
// - the rounding and the packed kernel set the store header records (Rounding::Ggml since 2026-11-27,
//   F32 before; PackedSet::Extended since later that day, Classic before), so a record decodes with the
//   arithmetic that coded it.
class StoreArithmetic {
 public:
  StoreArithmetic(Forward& f, const CodecStoreHeader& store)
      : f_(f), saved_min_tokens_(f.onednn_min_tokens()), saved_rounding_(f.rounding()),
        saved_packed_set_(f.packed_set()) {
    f.set_onednn_min_tokens(0);
    f.set_rounding(store.rounding);
    f.set_packed_set(store.packed_set);
  }
  ~StoreArithmetic() {
    f_.set_onednn_min_tokens(saved_min_tokens_);
    f_.set_rounding(saved_rounding_);
    f_.set_packed_set(saved_packed_set_);
  }
  StoreArithmetic(const StoreArithmetic&) = delete;
  StoreArithmetic& operator=(const StoreArithmetic&) = delete;

 private:
  Forward& f_;
  int saved_min_tokens_;
  Rounding saved_rounding_;
  PackedSet saved_packed_set_;
};

Result<Start> make_start(Forward& fwd, const Model& model, std::span<const int32_t> context, int32_t window) {
  const ModelConfig& cfg = model.config();
  Start s;
  s.window = window;
  s.keep = window / 2;
  if (!context.empty()) {
    const size_t n = std::min(context.size(), static_cast<size_t>(s.keep));
    s.prefix.assign(context.end() - n, context.end());
  } else if (model.tokenizer().bos() >= 0) {
    s.prefix = {model.tokenizer().bos()};
  }
  s.first_logits.assign(cfg.n_vocab, 0.0f);
  if (!s.prefix.empty()) {
    DenseKvCache cache(cfg, static_cast<int32_t>(s.prefix.size()));
    if (Status st = fwd.eval(cache, s.prefix, Logits::Last, s.first_logits); !st) return st;
    s.prefix_kv = Segment::from_cache(cfg, cache, 0, s.prefix, KvQuant::F32, 0, 0);
  }
  return s;
}

// One chunk's walk through the model, the same for encoder and decoder. The chunk x[0..m) is coded
// token by token; feeding x[j] yields the distribution of x[j+1]. The model attends to at most
// `window` tokens: the first window holds the shared prefix and then the chunk; when it is full the
// window restarts from the chunk's last window/2 tokens (re-prefilled). Every decision depends on
// positions only, so both sides evaluate the same tokens in the same caches.
class ChunkWalk {
 public:
  ChunkWalk(const ModelConfig& cfg, const Start& start, int32_t m) : cfg_(cfg), start_(start), m_(m) {
    const int32_t p = static_cast<int32_t>(start.prefix.size());
    const int32_t feeds = m - 1;
    if (feeds <= 0) return;
    if (start.prefix_kv) {
      cache_ = std::make_unique<Tower>(cfg, std::vector{start.prefix_kv}, std::min(start.window - p, feeds));
    } else {
      cache_ = std::make_unique<DenseKvCache>(cfg, std::min(start.window, feeds));
    }
    used_ = p;
  }

  struct Piece {
    KvCache* cache;
    std::span<const int32_t> tokens;
    int32_t feeds;  // 0: a restart's re-prefill, whose logits are not needed
  };
  // The next evaluation when x[0..j) have been fed: either a restart's re-prefill of x[j-keep..j), or
  // up to max_feeds tokens x[j..] (never past the window, never past x[m-2]).
  Piece next(const int32_t* x, int32_t j, int32_t max_feeds) {
    if (used_ == start_.window) {
      const int32_t keep = start_.keep;
      cache_ = std::make_unique<DenseKvCache>(cfg_, std::min(start_.window, keep + (m_ - 1 - j)));
      used_ = keep;
      return {cache_.get(), std::span(x + j - keep, keep), 0};
    }
    const int32_t feeds = std::min({max_feeds, start_.window - used_, m_ - 1 - j});
    used_ += feeds;
    return {cache_.get(), std::span(x + j, feeds), feeds};
  }

 private:
  const ModelConfig& cfg_;
  const Start& start_;
  int32_t m_;
  int32_t used_ = 0;  // tokens in the current window (prefix included)
  std::unique_ptr<KvCache> cache_;
};

double nll_bits(const float* logits, int n_vocab, int32_t token) {
  return token_nll(logits, n_vocab, token) / std::log(2.0);
}

void encode_symbol(RangeEncoder& enc, const std::vector<uint32_t>& freq, int32_t token) {
  uint64_t cum = 0;
  for (int32_t i = 0; i < token; ++i) cum += freq[i];
  enc.encode(cum, freq[token], codec::kFreqBits);
}

// -1 when the stream is corrupt.
int32_t decode_symbol(RangeDecoder& dec, const std::vector<uint32_t>& freq) {
  uint64_t slot;
  if (!dec.target(codec::kFreqBits, slot)) return -1;
  uint64_t cum = 0;
  for (size_t i = 0; i < freq.size(); ++i) {
    if (slot < cum + freq[i]) {
      dec.consume(cum, freq[i]);
      return static_cast<int32_t>(i);
    }
    cum += freq[i];
  }
  return -1;
}

int32_t default_window(const ModelConfig& cfg) {
  return std::max(2, std::min(cfg.n_ctx_train > 0 ? cfg.n_ctx_train : codec::kDefaultWindowCap,
                              codec::kDefaultWindowCap));
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

// -------------------------------------------------------------------------------------- Codec

Codec::Codec(const Model& model, ThreadPool* pool) : model_(model), fingerprint_(model_fingerprint(model, pool)) {}
Codec::Codec(const Model& model, uint64_t fingerprint) : model_(model), fingerprint_(fingerprint) {}

Status Codec::check_store(const CodecStoreHeader& store, Kernels kernels) const {
  auto hex = [](uint64_t v) {
    char b[19];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return std::string(b);
  };
  if (store.fingerprint != fingerprint_) {
    return Status::Error("codec: the container was coded with another model (fingerprint " + hex(store.fingerprint) +
                         ", this model's is " + hex(fingerprint_) + ")");
  }
  if (store.kernels != kernels) {
    return Status::Error(std::string("codec: the container was coded with the ") +
                         (store.kernels == Kernels::Fast ? "fast" : "reference") +
                         " kernels; use the same kernel set");
  }
  const int32_t n_ctx = model_.config().n_ctx_train;
  if (store.window < 2 || (n_ctx > 0 && store.window > n_ctx)) {
    return Status::Error("codec: window " + std::to_string(store.window) + " must be in 2.." + std::to_string(n_ctx) +
                         " (the model's context)");
  }
  const int V = model_.config().n_vocab;
  if (V < 1 || V > (1 << 24)) return Status::Error("codec: vocabularies of 1..2^24 tokens only");
  return Status::Ok();
}

Result<CodecStoreHeader> Codec::store_header(const Forward& forward, const CodecOptions& o) const {
  CodecStoreHeader h;
  h.kernels = forward.kernels();
  h.rounding = forward.rounding();
  h.packed_set = forward.packed_set();
  h.fingerprint = fingerprint_;
  h.target_tag = codec_target_tag();
  h.window = o.window > 0 ? o.window : default_window(model_.config());
  if (Status st = check_store(h, forward.kernels()); !st) return st;
  return h;
}

Result<std::vector<uint8_t>> Codec::encode(Forward& fwd, std::span<const int32_t> context,
                                           std::span<const int32_t> tokens, const CodecOptions& o,
                                           CodecStats* stats) const {
  auto store = store_header(fwd, o);
  if (!store) return store.status();
  auto record = encode_record(fwd, *store, context, tokens, o, stats);
  if (!record) return record.status();
  std::vector<uint8_t> out = write_codec_container(*store, codec_segment_key(context, tokens), *record);
  if (stats) stats->bytes = out.size();
  return out;
}

Result<std::vector<uint8_t>> Codec::encode_record(Forward& fwd, const CodecStoreHeader& store,
                                                  std::span<const int32_t> context, std::span<const int32_t> tokens,
                                                  const CodecOptions& o, CodecStats* stats) const {
  const auto t0 = Clock::now();
  StoreArithmetic exact(fwd, store);
  const ModelConfig& cfg = model_.config();
  const int V = cfg.n_vocab;
  const int64_t N = static_cast<int64_t>(tokens.size());
  if (Status st = check_store(store, fwd.kernels()); !st) return st;
  if (N > codec::kMaxTokens) return Status::Error("codec: more than 2^26 tokens in one record");
  for (int32_t t : tokens) {
    if (t < 0 || t >= V) return Status::Error("codec: token id " + std::to_string(t) + " is outside the vocabulary");
  }
  const int32_t window = store.window;
  if (o.chunk < 0) return Status::Error("codec: chunk size must be >= 0");
  const int32_t chunk = N == 0 ? 0 : static_cast<int32_t>(o.chunk > 0 ? std::min<int64_t>(o.chunk, N) : N);
  const int64_t n_chunks = N == 0 ? 0 : (N + chunk - 1) / chunk;

  std::vector<std::vector<uint8_t>> streams(n_chunks);
  double nll = 0;
  if (N > 0) {
    auto start = make_start(fwd, model_, context, window);
    if (!start) return start.status();
    const Start& st = *start;
    // Logits are kept for every fed token of a step: bound a step to ~128 MiB of them.
    const int32_t step_tokens = static_cast<int32_t>(std::clamp<int64_t>((int64_t{1} << 25) / V, 1, 512));
    const int32_t batch = std::max(1, o.batch);
    std::vector<uint32_t> freq;
    std::vector<float> logits;
    int64_t done = 0;
    for (int64_t g0 = 0; g0 < n_chunks; g0 += batch) {
      const int64_t g1 = std::min<int64_t>(n_chunks, g0 + batch);
      struct Job {
        const int32_t* x;
        int32_t m, fed = 0;
        RangeEncoder enc;
        std::unique_ptr<ChunkWalk> walk;
      };
      std::vector<Job> jobs(g1 - g0);
      codec::frequencies(st.first_logits, freq);
      for (int64_t c = g0; c < g1; ++c) {
        Job& jb = jobs[c - g0];
        jb.x = tokens.data() + c * chunk;
        jb.m = static_cast<int32_t>(std::min<int64_t>(chunk, N - c * chunk));
        jb.walk = std::make_unique<ChunkWalk>(cfg, st, jb.m);
        encode_symbol(jb.enc, freq, jb.x[0]);
        nll += nll_bits(st.first_logits.data(), V, jb.x[0]);
        ++done;
      }
      for (;;) {
        std::vector<Forward::Sequence> seqs;
        std::vector<std::pair<Job*, ChunkWalk::Piece>> pieces;
        int32_t active = 0;
        for (Job& jb : jobs) active += jb.fed < jb.m - 1;
        if (active == 0) break;
        const int32_t per = std::max(1, step_tokens / active);
        for (Job& jb : jobs) {
          if (jb.fed >= jb.m - 1) continue;
          ChunkWalk::Piece p = jb.walk->next(jb.x, jb.fed, per);
          seqs.push_back({p.cache, p.tokens, p.feeds ? Logits::All : Logits::Last});
          pieces.emplace_back(&jb, p);
        }
        if (Status s = fwd.eval_batch(seqs, logits); !s) return s;
        size_t row = 0;
        for (auto& [jb, p] : pieces) {
          if (p.feeds == 0) {
            ++row;
            continue;
          }
          for (int32_t r = 0; r < p.feeds; ++r, ++row) {
            const float* l = &logits[row * V];
            const int32_t t = jb->x[jb->fed + r + 1];
            codec::frequencies(std::span(l, V), freq);
            encode_symbol(jb->enc, freq, t);
            nll += nll_bits(l, V, t);
          }
          jb->fed += p.feeds;
          done += p.feeds;
        }
        if (o.progress) o.progress(done, N);
      }
      for (int64_t c = g0; c < g1; ++c) streams[c] = jobs[c - g0].enc.finish();
    }
  }

  std::vector<uint8_t> out;
  put_le(out, codec::tokens_check(tokens) | (n_chunks > 1 ? kChunkedFlag : 0), 2);
  if (n_chunks > 1) {
    put_varint(out, static_cast<uint64_t>(chunk));
    for (int64_t c = 0; c + 1 < n_chunks; ++c) put_varint(out, streams[c].size());
  }
  for (const auto& s : streams) out.insert(out.end(), s.begin(), s.end());
  if (stats) {
    stats->tokens = N;
    stats->chunks = static_cast<int32_t>(n_chunks);
    stats->bytes = stats->record_bytes = out.size();
    stats->nll_bits = nll;
    stats->seconds = since(t0);
  }
  return out;
}

Result<std::vector<int32_t>> Codec::decode(Forward& fwd, std::span<const int32_t> context,
                                           std::span<const uint8_t> bytes, const CodecOptions& o,
                                           CodecStats* stats) const {
  auto c = read_codec_container(bytes);
  if (!c) return c.status();
  if (Status st = check_store(c->store, fwd.kernels()); !st) return Status::Error(st.message() + "; refusing to decode");
  if (c->key.context_length != static_cast<int64_t>(context.size()) ||
      c->key.context_crc != codec::crc32_tokens(context)) {
    return Status::Error("codec: the container was coded under another context (" +
                         std::to_string(c->key.context_length) + " tokens) than the one given (" +
                         std::to_string(context.size()) + " tokens)");
  }
  auto tokens = decode_record(fwd, c->store, context, c->key.tokens, c->record, o, stats);
  if (tokens && stats) stats->bytes = bytes.size();
  return tokens;
}

Result<std::vector<int32_t>> Codec::decode_record(Forward& fwd, const CodecStoreHeader& store,
                                                  std::span<const int32_t> context, int64_t n_tokens,
                                                  std::span<const uint8_t> record, const CodecOptions& o,
                                                  CodecStats* stats) const {
  const auto t0 = Clock::now();
  StoreArithmetic exact(fwd, store);
  if (Status st = check_store(store, fwd.kernels()); !st) return st;
  if (store.target_tag != codec_target_tag() && !o.any_target) {
    return Status::Error("codec: coded on a CPU with another SIMD target (" + codec_target_name(store.target_tag) +
                         ", tag " + std::to_string(store.target_tag) + "; this machine runs " +
                         codec_target_name(codec_target_tag()) + ", tag " + std::to_string(codec_target_tag()) +
                         "), whose logits differ: refusing to decode (the tokens check alone is 15 bits)");
  }
  auto rec = read_codec_record(record, n_tokens);
  if (!rec) return rec.status();
  const CodecRecord& h = *rec;
  const ModelConfig& cfg = model_.config();
  const int V = cfg.n_vocab;

  std::vector<int32_t> tokens;
  const int64_t n_chunks = static_cast<int64_t>(h.chunk_bytes.size());
  if (n_tokens > 0) {
    auto start = make_start(fwd, model_, context, store.window);
    if (!start) return start.status();
    const Start& st = *start;
    std::vector<size_t> offset(n_chunks);
    for (int64_t c = 0, at = static_cast<int64_t>(h.header_bytes); c < n_chunks; at += h.chunk_bytes[c], ++c) {
      offset[c] = static_cast<size_t>(at);
    }
    struct Job {
      int64_t index;
      int32_t m;
      std::vector<int32_t> x;
      RangeDecoder dec;
      std::unique_ptr<ChunkWalk> walk;
      std::vector<float> logits;  // the distribution of x[x.size()]
    };
    std::vector<std::vector<int32_t>> out(n_chunks);
    std::vector<std::unique_ptr<Job>> active;
    const size_t batch = static_cast<size_t>(std::max(1, o.batch));
    int64_t next_chunk = 0, done = 0;
    std::vector<uint32_t> freq;
    std::vector<float> logits;
    std::vector<Forward::Sequence> seqs;
    for (;;) {
      while (active.size() < batch && next_chunk < n_chunks) {
        const int64_t c = next_chunk++;
        const int32_t m = static_cast<int32_t>(std::min<int64_t>(h.chunk, n_tokens - c * h.chunk));
        auto jb = std::make_unique<Job>(Job{c, m, {}, RangeDecoder(record.subspan(offset[c], h.chunk_bytes[c])),
                                            std::make_unique<ChunkWalk>(cfg, st, m), st.first_logits});
        jb->x.reserve(static_cast<size_t>(std::min<int32_t>(m, 1 << 16)));
        active.push_back(std::move(jb));
      }
      if (active.empty()) break;
      // One token from every active chunk.
      for (auto& jb : active) {
        codec::frequencies(jb->logits, freq);
        const int32_t t = decode_symbol(jb->dec, freq);
        if (t < 0 || jb->dec.overrun() > 8) {
          return corrupt_record("chunk " + std::to_string(jb->index) + " does not decode (damaged coded bytes)");
        }
        jb->x.push_back(t);
        ++done;
      }
      // Finished chunks leave; the others feed their new token to the model, all in one batch.
      seqs.clear();
      std::vector<Job*> fed;
      for (size_t i = 0; i < active.size();) {
        Job& jb = *active[i];
        if (static_cast<int32_t>(jb.x.size()) == jb.m) {
          out[jb.index] = std::move(jb.x);
          active.erase(active.begin() + static_cast<ptrdiff_t>(i));
          continue;
        }
        const int32_t j = static_cast<int32_t>(jb.x.size()) - 1;
        ChunkWalk::Piece p = jb.walk->next(jb.x.data(), j, 1);
        if (p.feeds == 0) {  // a window restart: re-prefill and feed x[j] in the same evaluation
          const ChunkWalk::Piece f = jb.walk->next(jb.x.data(), j, 1);
          p.tokens = std::span(p.tokens.data(), p.tokens.size() + f.tokens.size());
          p.feeds = f.feeds;
        }
        seqs.push_back({p.cache, p.tokens, Logits::Last});
        fed.push_back(&jb);
        ++i;
      }
      if (!seqs.empty()) {
        if (Status s = fwd.eval_batch(seqs, logits); !s) return s;
        for (size_t i = 0; i < fed.size(); ++i) {
          fed[i]->logits.assign(logits.begin() + static_cast<ptrdiff_t>(i * V),
                                logits.begin() + static_cast<ptrdiff_t>((i + 1) * V));
        }
      }
      if (o.progress) o.progress(done, n_tokens);
    }
    tokens.reserve(static_cast<size_t>(n_tokens));
    for (auto& v : out) tokens.insert(tokens.end(), v.begin(), v.end());
  }
  if (codec::tokens_check(tokens) != h.tokens_check) {
    std::string why = "the decoded tokens fail their check: the coded bytes are damaged, were coded under another "
                      "context or token count, or this machine's logits differ from the encoder's";
    if (store.target_tag != codec_target_tag()) why += " (it ran another SIMD target)";
    return Status::Error("codec: " + why + "; refusing to return them");
  }
  if (stats) {
    stats->tokens = n_tokens;
    stats->chunks = static_cast<int32_t>(n_chunks);
    stats->bytes = stats->record_bytes = record.size();
    stats->seconds = since(t0);
  }
  return tokens;
}

}  // namespace towers

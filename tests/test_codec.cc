// The cold-tier codec: the range coder alone, the integer frequency tables, round trips through a
// model (random and very unlikely tokens, empty and 1-token segments, every chunk size, window
// restarts), bit-identity across thread counts and batch shapes (encode one way, decode the others),
// and refusal of every damaged, truncated, forged or mismatched container. Runs on a tiny synthetic
// model; the stories260K checks skip when ../shared is absent.
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/codec/codec.h"
#include "engine/generate/perplexity.h"
#include "engine/codec/range_coder.h"
#include "engine/model/synth.h"
#include "engine/text/tokenizer.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

std::unique_ptr<Model> synth_model(uint64_t seed) {
  SynthOptions o;
  o.shape = "tiny";
  o.type = "q8_0";  // quantized: the fast and reference kernels give different logits
  o.seed = seed;
  o.out = (test::temp_dir() / ("codec-tiny-q8_0-seed" + std::to_string(seed) + ".gguf")).string();
  o.shared_dir = test::shared_dir().string();
  if (!std::filesystem::exists(o.out)) REQUIRE(synthesize_model(o).ok());
  auto m = Model::load(o.out);
  REQUIRE_MESSAGE(m.ok(), m.error());
  return std::move(m.value());
}

const Model& tiny() {
  static std::unique_ptr<Model> model = synth_model(1);
  return *model;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(rng() % vocab);
  return v;
}

// Each token the model's least likely next token: the worst case for the coder.
std::vector<int32_t> least_likely(const Model& model, ThreadPool& pool, int n) {
  Forward fwd(model, pool);
  DenseKvCache cache(model.config(), n + 1);
  std::vector<int32_t> out;
  std::vector<float> logits;
  int32_t t = model.tokenizer().bos() >= 0 ? model.tokenizer().bos() : 0;
  for (int i = 0; i < n; ++i) {
    REQUIRE(fwd.eval(cache, std::span(&t, 1), Logits::Last, logits).ok());
    t = static_cast<int32_t>(std::min_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
  }
  return out;
}

std::vector<uint8_t> encode_ok(const Codec& codec, Forward& fwd, std::span<const int32_t> ctx,
                               std::span<const int32_t> toks, const CodecOptions& o = {}, CodecStats* st = nullptr) {
  auto r = codec.encode(fwd, ctx, toks, o, st);
  REQUIRE_MESSAGE(r.ok(), r.error());
  return std::move(r.value());
}

std::vector<int32_t> decode_ok(const Codec& codec, Forward& fwd, std::span<const int32_t> ctx,
                               std::span<const uint8_t> bytes, const CodecOptions& o = {}) {
  auto r = codec.decode(fwd, ctx, bytes, o);
  REQUIRE_MESSAGE(r.ok(), r.error());
  return std::move(r.value());
}

// toks after ctx coded by `encoder` in chunks of 16 (several chunks: the codec's prefill side too).
std::vector<uint8_t> encode_chunked(const Model& model, ThreadPool& pool, Forward& encoder,
                                    std::span<const int32_t> ctx, std::span<const int32_t> toks) {
  CodecOptions o;
  o.chunk = 16;
  return encode_ok(Codec(model, &pool), encoder, ctx, toks, o);
}

// Logits of every token of toks, from an empty cache.
std::vector<float> logits_from_start(Forward& fwd, const Model& model, std::span<const int32_t> toks) {
  DenseKvCache cache(model.config(), 64);
  return test::eval_all(fwd, cache, toks);
}

// Rewrites the CRC in the 4 bytes after [begin, end) of c (forged containers and store headers).
void fix_crc_at(std::vector<uint8_t>& c, size_t end, size_t begin = 0) {
  const uint32_t crc = codec::crc32(std::span(c.data() + begin, end - begin));
  for (int i = 0; i < 4; ++i) c[end + i] = static_cast<uint8_t>(crc >> (8 * i));
}
// The trailing container CRC, after a deliberate edit.
void fix_crc(std::vector<uint8_t>& c) { fix_crc_at(c, c.size() - 4); }
// Both CRCs, after an edit of the store header.
void fix_crcs(std::vector<uint8_t>& c) {
  fix_crc_at(c, codec::kStoreHeaderBytes - 4);
  fix_crc(c);
}

// The coded streams' bytes in a standalone container: its record minus the record's own header.
size_t stream_bytes(std::span<const uint8_t> container) {
  auto c = read_codec_container(container);
  REQUIRE_MESSAGE(c.ok(), c.error());
  auto rec = read_codec_record(c->record, c->key.tokens);
  REQUIRE(rec.ok());
  return c->record.size() - rec->header_bytes;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("range coder: random tables of every total size round-trip at their information content") {
  std::mt19937_64 rng(7);
  for (int bits : {1, 2, 8, 16, 24, 31, 32}) {
    CAPTURE(bits);
    const uint64_t total = uint64_t{1} << bits;
    struct Sym { uint64_t cum, freq; };
    std::vector<Sym> syms;
    double ideal = 0;
    RangeEncoder enc;
    for (int i = 0; i < 3000; ++i) {
      // A random interval, biased towards extremes: frequency 1, or nearly all of the total.
      uint64_t freq;
      switch (rng() % 3) {
        case 0: freq = 1; break;
        case 1: freq = total - rng() % std::min<uint64_t>(total, 3); break;
        default: freq = 1 + rng() % total;
      }
      freq = std::min(freq, total);
      const uint64_t cum = rng() % (total - freq + 1);
      syms.push_back({cum, freq});
      ideal += std::log2(static_cast<double>(total) / static_cast<double>(freq));
      enc.encode(cum, freq, bits);
    }
    const std::vector<uint8_t> bytes = enc.finish();
    CHECK(bytes.size() * 8.0 <= ideal + 16.0 + 3000 * 1e-6);
    RangeDecoder dec(bytes);
    for (const Sym& s : syms) {
      uint64_t slot;
      REQUIRE(dec.target(bits, slot));
      REQUIRE(slot >= s.cum);
      REQUIRE(slot < s.cum + s.freq);
      dec.consume(s.cum, s.freq);
    }
    CHECK(dec.overrun() <= 8);
  }
  RangeEncoder empty;
  CHECK(empty.finish().size() == 1);
}

TEST_CASE("frequency tables: total 2^31, every token >= 1, ordered like the logits, close to softmax") {
  std::mt19937 rng(3);
  std::vector<uint32_t> freq;
  for (int V : {1, 2, 512, 32000}) {
    CAPTURE(V);
    std::vector<float> logits(V);
    for (auto& x : logits) x = std::normal_distribution<float>(0.0f, 4.0f)(rng);
    codec::frequencies(logits, freq);
    uint64_t sum = 0;
    uint32_t lowest = ~0u;
    for (uint32_t f : freq) sum += f, lowest = std::min(lowest, f);
    CHECK(lowest >= 1);
    CHECK(sum == uint64_t{1} << codec::kFreqBits);
    for (int i = 0; i + 1 < V; ++i) {
      if (logits[i] < logits[i + 1]) REQUIRE(freq[i] <= freq[i + 1]);
    }
    // KL(softmax || table) in bits: the whole cost of quantising, tiny.
    if (V > 1) {
      double mx = *std::max_element(logits.begin(), logits.end()), z = 0, kl = 0;
      for (float x : logits) z += std::exp(x - mx);
      for (int i = 0; i < V; ++i) {
        const double p = std::exp(logits[i] - mx) / z, q = freq[i] / std::ldexp(1.0, codec::kFreqBits);
        if (p > 0) kl += p * std::log2(p / q);
      }
      CHECK(kl < 1e-4);
    }
    std::vector<uint32_t> again;
    codec::frequencies(logits, again);
    CHECK(again == freq);
  }
  // Degenerate logits still give a valid table.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::vector<float> l : {std::vector<float>{nan, 1, 2}, {inf, 0, -inf}, {-inf, -inf, -inf}, {nan, nan, nan},
                               {0, 0, 0}, {-1e30f, 1e30f, 0}}) {
    codec::frequencies(l, freq);
    uint64_t sum = 0;
    uint32_t lowest = ~0u;
    for (uint32_t f : freq) sum += f, lowest = std::min(lowest, f);
    CHECK(lowest >= 1);
    CHECK(sum == uint64_t{1} << codec::kFreqBits);
  }
}

TEST_CASE("round trip: random and very unlikely tokens, empty and 1-token segments, every chunk size") {
  const Model& model = tiny();
  const int V = model.config().n_vocab;
  ThreadPool pool(2);
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  std::mt19937 rng(11);
  const std::vector<std::vector<int32_t>> segments = {
      random_tokens(rng, 40, V), least_likely(model, pool, 24), {}, {static_cast<int32_t>(V - 1)}, {0}};
  const std::vector<std::vector<int32_t>> contexts = {{}, random_tokens(rng, 9, V)};
  for (const auto& ctx : contexts) {
    for (const auto& toks : segments) {
      for (int chunk : {0, 1, 2, 7, 64, 1000}) {
        CAPTURE(ctx.size());
        CAPTURE(toks.size());
        CAPTURE(chunk);
        CodecOptions o;
        o.chunk = chunk;
        CodecStats st;
        const auto bytes = encode_ok(codec, fwd, ctx, toks, o, &st);
        CHECK(decode_ok(codec, fwd, ctx, bytes) == toks);
        const int64_t expect_chunks = toks.empty() ? 0 : chunk == 0 ? 1 : (toks.size() + chunk - 1) / chunk;
        CHECK(st.chunks == expect_chunks);
        auto c = read_codec_container(bytes);
        REQUIRE(c.ok());
        CHECK(c->key.tokens == static_cast<int64_t>(toks.size()));
        CHECK(c->record.size() == st.record_bytes);
        // The coded part costs the model's NLL plus at most 2 bytes per chunk of flushing.
        const double coded_bits = 8.0 * stream_bytes(bytes);
        CHECK(coded_bits <= st.nll_bits * 1.0001 + 16.0 * st.chunks);
        // A record's fixed overhead is its 2-byte check; more only with a chunk table.
        if (st.chunks <= 1) CHECK(c->record.size() == 2 + stream_bytes(bytes));
      }
    }
  }
  // The unlikely segment really is unlikely, and still costs only its surprisal.
  CodecStats st;
  const auto unlikely = least_likely(model, pool, 24);
  encode_ok(codec, fwd, {}, unlikely, {}, &st);
  CHECK(st.nll_bits / 24 > 8.0);
}

TEST_CASE("window restarts: chunks longer than a small window, under a context longer than it") {
  const Model& model = tiny();
  const int V = model.config().n_vocab;
  ThreadPool pool(1);  // threads are the next test's business; spinning workers only slow this one
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  std::mt19937 rng(5);
  const auto ctx = random_tokens(rng, 30, V), toks = random_tokens(rng, 70, V);
  for (int window : {2, 3, 8, 16}) {
    for (int chunk : {0, 5, 13, 70}) {
      CAPTURE(window);
      CAPTURE(chunk);
      CodecOptions o;
      o.window = window;
      o.chunk = chunk;
      const auto bytes = encode_ok(codec, fwd, ctx, toks, o);
      CHECK(read_codec_container(bytes)->store.window == window);
      CodecOptions one;
      one.batch = 1;
      CHECK(decode_ok(codec, fwd, ctx, bytes) == toks);
      CHECK(decode_ok(codec, fwd, ctx, bytes, one) == toks);
    }
  }
  CodecOptions bad;
  bad.window = model.config().n_ctx_train + 1;
  CHECK_FALSE(codec.encode(fwd, ctx, toks, bad).ok());
  bad.window = 1;
  CHECK_FALSE(codec.encode(fwd, ctx, toks, bad).ok());
}

TEST_CASE("tables are bit-identical across thread counts and batch shapes: encode one way, decode others") {
  const Model& model = tiny();
  const int V = model.config().n_vocab;
  std::mt19937 rng(9);
  const auto ctx = random_tokens(rng, 12, V), toks = random_tokens(rng, 90, V);
  for (int chunk : {0, 7, 30}) {
    CAPTURE(chunk);
    CodecOptions seq;  // one chunk per step
    seq.chunk = chunk;
    seq.window = 24;   // restarts inside the longer chunks
    seq.batch = 1;
    CodecOptions wide = seq;
    wide.batch = 64;   // every chunk in one step
    std::vector<uint8_t> reference;
    {
      ThreadPool pool(1);
      Forward fwd(model, pool);
      reference = encode_ok(Codec(model, &pool), fwd, ctx, toks, seq);
    }
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      ThreadPool pool(threads);
      Forward fwd(model, pool);
      Codec codec(model, &pool);
      // Same bytes whoever encodes: the tables did not move by one unit.
      CHECK(encode_ok(codec, fwd, ctx, toks, wide) == reference);
      CHECK(encode_ok(codec, fwd, ctx, toks, seq) == reference);
      CHECK(decode_ok(codec, fwd, ctx, reference, wide) == toks);
      CHECK(decode_ok(codec, fwd, ctx, reference, seq) == toks);
    }
  }
}

TEST_CASE("damaged containers are refused: every flipped bit, every truncation, appended bytes") {
  const Model& model = tiny();
  ThreadPool pool(2);
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  std::mt19937 rng(13);
  const auto ctx = random_tokens(rng, 3, model.config().n_vocab);
  const auto toks = random_tokens(rng, 12, model.config().n_vocab);
  CodecOptions o;
  o.chunk = 4;
  const auto good = encode_ok(codec, fwd, ctx, toks, o);
  REQUIRE(decode_ok(codec, fwd, ctx, good) == toks);
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = good;
      bad[i] ^= static_cast<uint8_t>(1u << bit);
      auto r = codec.decode(fwd, ctx, bad);
      CHECK_FALSE(r.ok());
      refused += !r.ok();
    }
  }
  CHECK(refused == static_cast<int>(good.size() * 8));
  for (size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(codec.decode(fwd, ctx, std::span(good.data(), n)).ok());
    CHECK_FALSE(read_codec_container(std::span(good.data(), n)).ok());
  }
  auto longer = good;
  longer.push_back(0);
  CHECK_FALSE(codec.decode(fwd, ctx, longer).ok());
  auto r = codec.decode(fwd, ctx, std::span(good.data(), good.size() - 1));
  CHECK(r.error().find("CRC") != std::string::npos);
}

TEST_CASE("forged headers (valid CRC) with absurd sizes or garbage coded bytes are refused") {
  const Model& model = tiny();
  ThreadPool pool(2);
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  std::mt19937 rng(17);
  const auto toks = random_tokens(rng, 10, model.config().n_vocab);
  CodecOptions o;
  o.chunk = 5;
  const auto good = encode_ok(codec, fwd, {}, toks, o);
  // Layout: store header (24) | tokens (varint) | context length (varint) | context CRC (4) |
  // record: check (2, bit 15 = chunked) [chunk (varint), bytes of all chunks but the last (varints)]
  // coded bytes | CRC (4).
  const size_t H = codec::kStoreHeaderBytes;
  auto forge = [&](std::vector<uint8_t> key_and_record) {
    std::vector<uint8_t> c(good.begin(), good.begin() + H);
    c.insert(c.end(), key_and_record.begin(), key_and_record.end());
    c.insert(c.end(), 4, 0);
    fix_crc(c);
    return c;
  };
  auto varint = [](uint64_t v) {
    std::vector<uint8_t> o;
    for (; v >= 0x80; v >>= 7) o.push_back(static_cast<uint8_t>(v | 0x80));
    o.push_back(static_cast<uint8_t>(v));
    return o;
  };
  auto cat = [](std::initializer_list<std::vector<uint8_t>> parts) {
    std::vector<uint8_t> o;
    for (const auto& p : parts) o.insert(o.end(), p.begin(), p.end());
    return o;
  };
  const std::vector<uint8_t> crc4 = {0, 0, 0, 0}, one = {0x01, 0x00}, chunked = {0x01, 0x80};
  const std::vector<std::vector<uint8_t>> forged = {
      forge(cat({varint(uint64_t{1} << 40), varint(0), crc4, one, {7}})),                        // absurd count
      forge(cat({varint(1 << 25), varint(0), crc4, chunked, varint(1), varint(1), {7, 7}})),     // huge table
      forge(cat({varint(10), varint(0), crc4, chunked, varint(0), varint(1), {7, 7}})),          // chunk 0
      forge(cat({varint(10), varint(0), crc4, chunked, varint(10), {7, 7}})),                    // chunk = count
      forge(cat({varint(10), varint(0), crc4, chunked, varint(5), varint(0), {7, 7}})),          // empty chunk
      forge(cat({varint(10), varint(0), crc4, chunked, varint(5), varint(5), {7, 7}})),          // sizes disagree
      forge(cat({varint(10), varint(0), crc4, chunked, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                                        0xFF, 0x01}})),                            // overlong
      forge(cat({{0x8A, 0x00}, varint(0), crc4, one, {7}})),                                      // 10, padded
      forge(cat({varint(10), {0x80, 0x80, 0x00}, crc4, one, {7}})),                              // 0, padded
      forge(cat({varint(10), varint(0), crc4, chunked, {0x85, 0x00}, varint(1), {7, 7}})),       // chunk padded
      forge(cat({varint(10), varint(0), crc4, one})),                                            // no coded bytes
      forge(cat({varint(0), varint(0), crc4, one, {7}})),                                        // bytes for none
      forge(cat({varint(0), varint(0), crc4, chunked})),                                         // chunks of none
      forge(cat({varint(1), varint(0), crc4, {7}})),                                             // no room for check
      forge(cat({varint(1 << 30), varint(0)})),                                                  // key truncated
      forge({}),
  };
  for (size_t i = 0; i < forged.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(read_codec_container(forged[i]).ok());
    CHECK_FALSE(codec.decode(fwd, {}, forged[i]).ok());
  }
  // The store header has its own CRC and checks: a window of 1, unknown flags, another version.
  CodecStoreHeader bad_window = *read_codec_store_header(good);
  bad_window.window = 1;
  CHECK_FALSE(read_codec_store_header(write_codec_store_header(bad_window)).ok());
  auto flags = good;
  flags[5] |= 0x80;
  fix_crcs(flags);
  CHECK_FALSE(read_codec_container(flags).ok());
  CHECK_FALSE(codec.decode(fwd, {}, flags).ok());
  auto newer_set = good;  // a packed kernel set this build does not know: named, not decoded
  newer_set[5] |= 0x0C;
  fix_crcs(newer_set);
  CHECK(read_codec_container(newer_set).error().find("packed kernel set 3") != std::string::npos);
  auto header_only = good;
  header_only[8] ^= 1;  // inside the fingerprint, with the container CRC (not the header's) fixed
  fix_crc(header_only);
  CHECK(read_codec_container(header_only).error().find("store header CRC") != std::string::npos);
  auto version = good;
  version[4] = 99;
  fix_crcs(version);
  auto rv = codec.decode(fwd, {}, version);
  CHECK(rv.error().find("version 99") != std::string::npos);
  CHECK(read_codec_container(std::vector<uint8_t>{'n', 'o', 'p', 'e', 1, 2, 3}).error().find("magic") !=
        std::string::npos);
  // A well-formed header over random coded bytes: decodes to something, which fails the tokens check.
  const size_t streams_at = good.size() - 4 - stream_bytes(good);
  for (int trial = 0; trial < 20; ++trial) {
    auto c = good;
    for (size_t i = streams_at; i + 4 < c.size(); ++i) c[i] = static_cast<uint8_t>(rng());
    fix_crc(c);
    auto r = codec.decode(fwd, {}, c);
    if (r.ok()) CHECK(*r == toks);  // only acceptable if the garbage happened to code the same tokens
  }
}

TEST_CASE("a store: one header, records of 2 bytes + streams, checked without a model") {
  const Model& model = tiny();
  const int V = model.config().n_vocab;
  ThreadPool pool(2);
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  std::mt19937 rng(23);
  auto store = codec.store_header(fwd);
  REQUIRE_MESSAGE(store.ok(), store.error());
  CHECK(store->fingerprint == codec.fingerprint());
  CHECK(store->target_tag == codec_target_tag());
  const auto header = write_codec_store_header(*store);
  REQUIRE(header.size() == codec::kStoreHeaderBytes);
  auto back = read_codec_store_header(header);
  REQUIRE(back.ok());
  CHECK((back->fingerprint == store->fingerprint && back->window == store->window && back->kernels == store->kernels));
  for (size_t i = 0; i < header.size(); ++i) {  // its own CRC: every flipped bit is refused
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = header;
      bad[i] ^= static_cast<uint8_t>(1u << bit);
      CHECK_FALSE(read_codec_store_header(bad).ok());
    }
  }

  // Segments of a tower: each coded under the tokens before it, all under the one header.
  const auto base = random_tokens(rng, 20, V), bot = random_tokens(rng, 15, V), turn = random_tokens(rng, 30, V);
  std::vector<int32_t> context;
  for (const auto* seg : {&base, &bot, &turn}) {
    for (int chunk : {0, 8}) {
      CAPTURE(seg->size());
      CAPTURE(chunk);
      CodecOptions o;
      o.chunk = chunk;
      CodecStats st;
      auto rec = codec.encode_record(fwd, *store, context, *seg, o, &st);
      REQUIRE_MESSAGE(rec.ok(), rec.error());
      auto layout = read_codec_record(*rec, static_cast<int64_t>(seg->size()));
      REQUIRE(layout.ok());
      CHECK(layout->header_bytes == (chunk == 0 ? 2u : 2u + 1u + (seg->size() + 7) / 8 - 1));
      CHECK(record_codes(*rec, *seg));
      auto other = *seg;
      other.back() = (other.back() + 1) % V;
      REQUIRE(codec::tokens_check(other) != codec::tokens_check(*seg));
      CHECK_FALSE(record_codes(*rec, other));
      CHECK_FALSE(record_codes(*rec, std::span(seg->data(), seg->size() - 1)));
      auto decoded = codec.decode_record(fwd, *store, context, static_cast<int64_t>(seg->size()), *rec, o);
      REQUIRE_MESSAGE(decoded.ok(), decoded.error());
      CHECK(*decoded == *seg);
      // The index's token count must be right: one fewer decodes a prefix that fails the check.
      CHECK_FALSE(codec.decode_record(fwd, *store, context, static_cast<int64_t>(seg->size()) - 1, *rec, o).ok());
      // Every flip of the check bits is refused for sure; a flip in the coded bytes decodes garbage,
      // which the 15-bit check refuses but for a chance of 2^-15 each (the store's own checksums are
      // what catch flipped bits; this shows the check is applied).
      int wrong = 0;
      for (size_t i = 0; i < rec->size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) {
          auto bad = *rec;
          bad[i] ^= static_cast<uint8_t>(1u << bit);
          auto r = codec.decode_record(fwd, *store, context, static_cast<int64_t>(seg->size()), bad, o);
          if (i < 2) CHECK_FALSE(r.ok());
          wrong += r.ok() && *r != *seg;
        }
      }
      CHECK(wrong <= 1);
    }
    context.insert(context.end(), seg->begin(), seg->end());
  }
  // A record of no tokens is its 2-byte check.
  auto empty = codec.encode_record(fwd, *store, context, {});
  REQUIRE(empty.ok());
  CHECK(empty->size() == 2);
  CHECK(codec.decode_record(fwd, *store, context, 0, *empty)->empty());
  // Another model's, or another kernel set's, store header is refused before decoding.
  auto rec = codec.encode_record(fwd, *store, {}, turn);
  REQUIRE(rec.ok());
  CodecStoreHeader other_model = *store;
  other_model.fingerprint ^= 1;
  CHECK(codec.decode_record(fwd, other_model, {}, 30, *rec).error().find("another model") != std::string::npos);
  CHECK_FALSE(codec.encode_record(fwd, other_model, {}, turn).ok());
  Forward ref(model, pool, Kernels::Reference);
  CHECK(codec.decode_record(ref, *store, {}, 30, *rec).error().find("kernels") != std::string::npos);
  // Another SIMD target is refused up front unless asked for (here the logits are this machine's).
  CodecStoreHeader other_target = *store;
  other_target.target_tag ^= 1;
  CHECK(codec.decode_record(fwd, other_target, {}, 30, *rec).error().find("SIMD target") != std::string::npos);
  CodecOptions any;
  any.any_target = true;
  auto tried = codec.decode_record(fwd, other_target, {}, 30, *rec, any);
  REQUIRE_MESSAGE(tried.ok(), tried.error());
  CHECK(*tried == turn);
  CodecOptions big;
  big.window = model.config().n_ctx_train + 1;
  CHECK_FALSE(codec.store_header(fwd, big).ok());
}

TEST_CASE("a record decodes with the rounding it was coded with: F32 (older stores) or ggml's") {
  // Q8_0 llama: the activation block scales differ; F16 gemma2: GeGLU's f16 table differs.
  const auto gemma = test::synth_shape("codec", "tiny-gemma2-l26", "f16");
  for (const Model* model : std::vector<const Model*>{&tiny(), gemma.get()}) {
    CAPTURE(model->config().arch_name);
    const int V = model->config().n_vocab;
    ThreadPool pool(2);
    std::mt19937 rng(31);
    const auto ctx = random_tokens(rng, 6, V), toks = random_tokens(rng, 40, V);
    Forward fwd(*model, pool);
    REQUIRE(fwd.rounding() == Rounding::Ggml);  // the default
    // The two roundings give other logits here (else this test would show nothing).
    Forward old(*model, pool);
    old.set_rounding(Rounding::F32);
    CHECK(logits_from_start(fwd, *model, toks) != logits_from_start(old, *model, toks));

    for (Rounding coded : {Rounding::F32, Rounding::Ggml}) {
      CAPTURE(static_cast<int>(coded));
      Forward encoder(*model, pool);
      encoder.set_rounding(coded);
      const auto bytes = encode_chunked(*model, pool, encoder, ctx, toks);
      auto c = read_codec_container(bytes);
      REQUIRE(c.ok());
      CHECK(c->store.rounding == coded);
      // Store header flags: bit 0 the fast kernels, bit 1 ggml's rounding, bits 2-3 the packed set (1).
      CHECK(bytes[5] == ((coded == Rounding::Ggml ? 3 : 1) | 1 << 2));
      // A Forward on the default decodes either: the codec runs the header's rounding for its pass,
      // then gives the Forward back its own.
      Forward decoder(*model, pool);
      CHECK(decode_ok(Codec(*model, &pool), decoder, ctx, bytes) == toks);
      CHECK(decoder.rounding() == Rounding::Ggml);
      CHECK(encoder.rounding() == coded);
    }
  }
}

TEST_CASE("a record decodes with the packed kernel set it was coded with: gemm_q (older stores) or packed") {
  // Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS matrices: packed copies since 2026-11-27
  // (PackedSet::Extended), gemm_q's rows before.
  for (const char* type : {"q5_1", "iq4_nl", "iq4_xs", "q2_k", "q3_k_m", "q5_k_m"}) {
    CAPTURE(type);
    const auto model = test::synth_shape("codec", "tiny-llama-256", type);
    const int V = model->config().n_vocab;
    ThreadPool pool(2);
    std::mt19937 rng(37);
    const auto ctx = random_tokens(rng, 6, V), toks = random_tokens(rng, 40, V);
    Forward fwd(*model, pool);
    REQUIRE(fwd.packed_set() == kLatestPackedSet);
    Forward old(*model, pool);
    old.set_packed_set(PackedSet::Classic);
    // The two kernel sets round differently here.
    CHECK(logits_from_start(fwd, *model, toks) != logits_from_start(old, *model, toks));
    for (PackedSet coded : {PackedSet::Classic, PackedSet::Extended}) {
      CAPTURE(static_cast<int>(coded));
      Forward encoder(*model, pool);
      encoder.set_packed_set(coded);
      const auto bytes = encode_chunked(*model, pool, encoder, ctx, toks);
      auto c = read_codec_container(bytes);
      REQUIRE(c.ok());
      CHECK(c->store.packed_set == coded);
      CHECK(bytes[5] == (3 | static_cast<int>(coded) << 2));
      Forward decoder(*model, pool);
      CHECK(decode_ok(Codec(*model, &pool), decoder, ctx, bytes) == toks);
      CHECK(decoder.packed_set() == kLatestPackedSet);
      CHECK(encoder.packed_set() == coded);
    }
  }
}

TEST_CASE("another model, kernel set or context is refused with a clear error") {
  const Model& model = tiny();
  ThreadPool pool(2);
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  std::mt19937 rng(19);
  const auto ctx = random_tokens(rng, 5, model.config().n_vocab);
  const auto toks = random_tokens(rng, 20, model.config().n_vocab);
  const auto bytes = encode_ok(codec, fwd, ctx, toks);

  // The fingerprint: stable, independent of the pool, different for other weights.
  auto other = synth_model(2);
  CHECK(model_fingerprint(model) == codec.fingerprint());
  CHECK(model_fingerprint(model, &pool) == codec.fingerprint());
  CHECK(model_fingerprint(*other) != codec.fingerprint());
  CHECK(check_same_vocabulary(model, *other).ok());
  Forward other_fwd(*other, pool);
  auto r = Codec(*other, &pool).decode(other_fwd, ctx, bytes);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("another model") != std::string::npos);
  CHECK_FALSE(Codec(model, codec.fingerprint() ^ 1).decode(fwd, ctx, bytes).ok());

  Forward ref(model, pool, Kernels::Reference);
  r = codec.decode(ref, ctx, bytes);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("kernels") != std::string::npos);
  // ...and a container coded with the reference kernels decodes with them.
  const auto ref_bytes = encode_ok(codec, ref, ctx, toks);
  CHECK(decode_ok(codec, ref, ctx, ref_bytes) == toks);
  CHECK(read_codec_container(ref_bytes)->store.kernels == Kernels::Reference);

  auto wrong_ctx = ctx;
  wrong_ctx[0] ^= 1;
  r = codec.decode(fwd, wrong_ctx, bytes);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("context") != std::string::npos);
  CHECK_FALSE(codec.decode(fwd, std::span(ctx.data(), 4), bytes).ok());

  std::vector<int32_t> out_of_vocab = {1, model.config().n_vocab};
  CHECK_FALSE(codec.encode(fwd, {}, out_of_vocab).ok());
}

TEST_CASE("stories260K: the passage codes at its NLL (843.1 bits) within 1% + 64 bits and round-trips") {
  const auto model_path = test::shared_file("models/stories260K.gguf");
  const auto text_path = test::shared_file("reference/stories260K.passage.txt");
  if (model_path.empty() || text_path.empty()) return;
  auto loaded = Model::load(model_path.string());
  REQUIRE(loaded.ok());
  const Model& model = **loaded;
  const Tokenizer& tok = model.tokenizer();
  const std::string text = read_text(text_path);
  // No BOS in the segment: an empty context makes the coder start from BOS, as the reference did.
  const auto toks = tok.encode(text, /*add_bos=*/false, /*parse_special=*/false);
  REQUIRE(toks.size() == 449);
  CHECK(tok.decode(toks) == text);
  ThreadPool pool(2);
  Forward fwd(model, pool);
  Codec codec(model, &pool);
  CodecStats st;
  const auto bytes = encode_ok(codec, fwd, {}, toks, {}, &st);
  CHECK(std::abs(st.nll_bits - 843.1) < 0.5);  // the reference's NLL: the coder sees the same logits
  const double coded_bits = 8.0 * stream_bytes(bytes);
  MESSAGE("stories260K passage: " << toks.size() << " tokens, NLL " << st.nll_bits << " bits, coded "
                                  << coded_bits << " bits; record " << st.record_bytes << " bytes, file "
                                  << bytes.size() << " bytes");
  CHECK(coded_bits <= 1.01 * st.nll_bits + 64);
  // In a store the passage costs its record: at most 109 bytes, 1/4 of zstd -19's 439 (docs/codec.md).
  CHECK(st.record_bytes <= 109);
  CHECK(decode_ok(codec, fwd, {}, bytes) == toks);
  // Chunked, decoded one chunk at a time and all at once.
  CodecOptions o;
  o.chunk = 64;
  const auto chunked = encode_ok(codec, fwd, {}, toks, o);
  CodecOptions one;
  one.batch = 1;
  CHECK(decode_ok(codec, fwd, {}, chunked) == toks);
  CHECK(decode_ok(codec, fwd, {}, chunked, one) == toks);
  // A bot segment costs its conditional surprisal: cheaper under the text that precedes it.
  const std::span<const int32_t> first(toks.data(), 200), rest(toks.data() + 200, toks.size() - 200);
  CodecStats alone, under;
  encode_ok(codec, fwd, {}, rest, {}, &alone);
  const auto cond = encode_ok(codec, fwd, first, rest, {}, &under);
  CHECK(under.nll_bits < alone.nll_bits);
  CHECK(decode_ok(codec, fwd, first, cond) == std::vector<int32_t>(rest.begin(), rest.end()));

  // SentencePiece's dummy prefix: the detokenizer drops the one leading space it adds, so leading
  // spaces and newlines survive the text round trip (what towerctl codec relies on).
  for (const char* s : {" Once", "  two spaces", "\nnewline first", "trailing space ", "", " "}) {
    CAPTURE(s);
    CHECK(tok.decode(tok.encode(s, false, false)) == s);
  }
  // A vocabulary mismatch is named.
  CHECK_FALSE(check_same_vocabulary(model, tiny()).ok());
}

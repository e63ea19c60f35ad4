// What the cold-tier codec promises across CPU families (docs/codec.md, "Portability"), checked against
// tests/data/codec_portable.golden, a file written on x86-64 and committed:
// - the frequency tables are an integer function of the logits' bits and the range coder is integer
//   arithmetic, so every machine (x86-64, ARM64 under qemu in scripts/test-arm64.sh) must give the
//   same tables and the same coded bytes, bit for bit;
// - the logits are not portable across SIMD targets, so a container coded on another target is
//   refused before decoding, naming both targets; on the target that coded it, the same model codes
//   the same bytes again and decodes them (stories260K; skipped when ../shared is absent).
// Regenerate the file (only when the format changes on purpose, on x86-64):
//   TOWERS_WRITE_GOLDEN=1 build/tests/test_codec_portable
#include <bit>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "engine/codec/codec.h"
#include "engine/codec/range_coder.h"
#include "engine/text/tokenizer.h"
#include "test_support.h"

using namespace towers;

namespace {

const std::filesystem::path kGolden = std::filesystem::path(TOWERS_TEST_DATA_DIR) / "codec_portable.golden";

struct SplitMix : test::SplitMix64 {
  // An exactly representable float in [lo, lo + span) with 16 fractional bits (int -> float and the
  // power-of-two scale are exact, so no rounding mode or libm is involved).
  float fixed(int lo, int span) {
    const int64_t q = static_cast<int64_t>(next() % (static_cast<uint64_t>(span) << 16));
    return static_cast<float>(q) * (1.0f / 65536.0f) + static_cast<float>(lo);
  }
};

struct LogitCase {
  std::string name;
  std::vector<std::vector<float>> rows;
};

// Logit rows that exercise every branch of codec::frequencies: real vocabulary sizes, peaked and flat
// rows, ties, the -64-nat clamp, and arbitrary float bit patterns (NaN, infinities, denormals, -0).
std::vector<LogitCase> logit_cases() {
  SplitMix rng{26};
  std::vector<LogitCase> cases;
  auto add = [&](std::string name, int rows, int V, auto&& gen) {
    LogitCase c{std::move(name), {}};
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i) row[i] = gen(i);
      c.rows.push_back(std::move(row));
    }
    cases.push_back(std::move(c));
  };
  add("flat-512", 8, 512, [&](int) { return rng.fixed(-128, 256); });
  add("peaked-32000", 3, 32000, [&](int i) { return i % 997 == 5 ? 15.0f : rng.fixed(-40, 40); });
  add("llama3-128256", 2, 128256, [&](int) { return rng.fixed(-20, 40); });
  add("clamped-4096", 2, 4096, [&](int i) { return i % 3 ? rng.fixed(-200, 130) : rng.fixed(-1, 2); });
  add("float-bits-4096", 3, 4096, [&](int) { return std::bit_cast<float>(static_cast<uint32_t>(rng.next())); });
  add("ties-1000", 1, 1000, [&](int i) { return i % 2 ? 3.0f : -3.0f; });
  add("one-token", 1, 1, [&](int) { return 0.5f; });
  add("two-tokens", 4, 2, [&](int) { return rng.fixed(-70, 140); });
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan, inf, -inf, -0.0f, 0.0f, std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1e-30f,
                            -64.0f, -64.00001f, -63.99999f};
  add("specials-12", 1, 12, [&](int i) { return specials[i]; });
  return cases;
}

std::string hex(std::span<const uint8_t> bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) s += d[b >> 4], s += d[b & 15];
  return s;
}

std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

// The golden file: "key value..." lines; '#' starts a comment.
std::map<std::string, std::string> read_golden() {
  std::ifstream in(kGolden);
  REQUIRE_MESSAGE(in.good(), kGolden.string() << " is missing (it is committed; see this file's head)");
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    kv[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
  }
  return kv;
}

bool writing_golden() {
  const char* w = std::getenv("TOWERS_WRITE_GOLDEN");
  return w && *w && std::string(w) != "0";
}

// What this machine computes for the golden file's table lines: per case the CRC-32 of its tables
// (uint32 little-endian), and one range-coded stream of a pseudo-random symbol per row.
struct Tables {
  std::map<std::string, uint32_t> crc;
  std::vector<uint8_t> stream;
  std::vector<std::vector<uint32_t>> freqs;  // every row's table, in order
  std::vector<uint32_t> symbols;             // the symbol coded for each row
};

Tables compute_tables() {
  Tables t;
  SplitMix pick{2026};
  RangeEncoder enc;
  for (const LogitCase& c : logit_cases()) {
    uint32_t crc = 0;
    for (const auto& row : c.rows) {
      std::vector<uint32_t> freq;
      codec::frequencies(row, freq);
      std::vector<uint8_t> le;
      for (uint32_t f : freq) {
        for (int b = 0; b < 4; ++b) le.push_back(static_cast<uint8_t>(f >> (8 * b)));
      }
      crc = codec::crc32(le, crc);
      const auto s = static_cast<uint32_t>(pick.next() % freq.size());
      uint64_t cum = 0;
      for (uint32_t i = 0; i < s; ++i) cum += freq[i];
      enc.encode(cum, freq[s], codec::kFreqBits);
      t.freqs.push_back(std::move(freq));
      t.symbols.push_back(s);
    }
    t.crc[c.name] = crc;
  }
  t.stream = enc.finish();
  return t;
}

struct Passage {
  std::unique_ptr<Model> model;
  std::vector<int32_t> tokens;
};

// stories260K (an F32 file: the same bytes, so the same fingerprint, everywhere) and the reference
// passage; no model when ../shared is absent.
Passage passage() {
  const auto model_path = test::shared_file("models/stories260K.gguf");
  const auto text_path = test::shared_file("reference/stories260K.passage.txt");
  if (model_path.empty() || text_path.empty()) return {};
  auto loaded = Model::load(model_path.string());
  REQUIRE_MESSAGE(loaded.ok(), loaded.error());
  std::ifstream in(text_path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  Passage p{std::move(loaded.value()), {}};
  p.tokens = p.model->tokenizer().encode(ss.str(), /*add_bos=*/false, /*parse_special=*/false);
  return p;
}

}  // namespace

TEST_CASE("golden file: written on x86-64 when asked (TOWERS_WRITE_GOLDEN=1)") {
  if (!writing_golden()) return;
  const Tables t = compute_tables();
  std::ostringstream out;
  out << "# tests/test_codec_portable.cc's golden file, written on " << codec_target_name(codec_target_tag())
      << ".\n# Frequency tables and range coder: every machine must reproduce these bytes.\n";
  for (const auto& [name, crc] : t.crc) out << "table-crc32:" << name << ' ' << crc << '\n';
  out << "stream " << hex(t.stream) << '\n';
  Passage p = passage();
  REQUIRE_MESSAGE(p.model, "writing the golden file needs ../shared (stories260K)");
  ThreadPool pool(1);
  Forward fwd(*p.model, pool);
  Codec codec(*p.model, &pool);
  auto bytes = codec.encode(fwd, {}, p.tokens);
  REQUIRE_MESSAGE(bytes.ok(), bytes.error());
  out << "# stories260K's reference passage (" << p.tokens.size()
      << " tokens), a standalone container: only this target may decode it.\n";
  out << "container " << hex(*bytes) << '\n';
  std::ofstream(kGolden) << out.str();
  MESSAGE("wrote " << kGolden.string());
}

TEST_CASE("frequency tables and the range coder give x86-64's bytes, bit for bit") {
  const auto golden = read_golden();
  const Tables t = compute_tables();
  MESSAGE("this machine: " << codec_target_name(codec_target_tag()));
  for (const auto& entry : t.crc) {  // not a structured binding: CAPTURE's lambda (clang 14)
    const auto& name = entry.first;
    const auto& crc = entry.second;
    CAPTURE(name);
    const auto it = golden.find("table-crc32:" + name);
    REQUIRE(it != golden.end());
    CHECK(std::to_string(crc) == it->second);
  }
  REQUIRE(golden.count("stream"));
  CHECK(hex(t.stream) == golden.at("stream"));
  // And x86-64's stream decodes here to the same symbols under this machine's tables.
  const std::vector<uint8_t> stream = unhex(golden.at("stream"));
  RangeDecoder dec(stream);
  for (size_t r = 0; r < t.freqs.size(); ++r) {
    CAPTURE(r);
    uint64_t slot;
    REQUIRE(dec.target(codec::kFreqBits, slot));
    uint64_t cum = 0;
    uint32_t s = 0;
    while (cum + t.freqs[r][s] <= slot) cum += t.freqs[r][s++];
    REQUIRE(s == t.symbols[r]);
    dec.consume(cum, t.freqs[r][s]);
  }
  CHECK(dec.overrun() <= 8);
}

TEST_CASE("target names: every Highway target's tag is named with its family, whatever CPU reads it") {
  CHECK(codec_target_name(codec_target_tag()).find('(') != std::string::npos);  // this machine's is known
  const auto golden = read_golden();
  REQUIRE(golden.count("container"));
  const std::vector<uint8_t> container = unhex(golden.at("container"));  // c->record points into it
  auto c = read_codec_container(container);
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(codec_target_name(c->store.target_tag).find("(x86-64)") != std::string::npos);
  uint16_t unknown = 0;
  while (codec_target_name(unknown) != "an unknown target") ++unknown;
  CHECK(codec_target_name(unknown) == "an unknown target");
}

TEST_CASE("a container from x86-64: decoded on its own target, refused by name on another") {
  const auto golden = read_golden();
  REQUIRE(golden.count("container"));
  const std::vector<uint8_t> container = unhex(golden.at("container"));
  auto c = read_codec_container(container);
  REQUIRE_MESSAGE(c.ok(), c.error());  // the container itself parses the same everywhere
  Passage p = passage();
  if (!p.model) return;
  REQUIRE(c->key.tokens == static_cast<int64_t>(p.tokens.size()));
  ThreadPool pool(1);  // qemu emulates a spinning second worker slowly; the result is the same
  Forward fwd(*p.model, pool);
  Codec codec(*p.model, &pool);
  REQUIRE(codec.fingerprint() == c->store.fingerprint);  // the same model file everywhere
  auto decoded = codec.decode(fwd, {}, container);
  if (c->store.target_tag == codec_target_tag()) {
    MESSAGE("same target as the golden file's (" << codec_target_name(codec_target_tag()) << "): bit for bit");
    REQUIRE_MESSAGE(decoded.ok(), decoded.error());
    CHECK(*decoded == p.tokens);
    fwd.set_rounding(c->store.rounding);  // the golden's arithmetic, so its header's bytes too
    fwd.set_packed_set(c->store.packed_set);
    auto again = codec.encode(fwd, {}, p.tokens);
    REQUIRE(again.ok());
    CHECK(hex(*again) == golden.at("container"));
    return;
  }
  MESSAGE("another target than the golden file's: " << codec_target_name(codec_target_tag()) << " here");
  REQUIRE_FALSE(decoded.ok());
  const std::string& why = decoded.error();
  CHECK(why.find("another SIMD target") != std::string::npos);
  CHECK(why.find(codec_target_name(c->store.target_tag)) != std::string::npos);
  CHECK(why.find(codec_target_name(codec_target_tag())) != std::string::npos);
  // Asked to try anyway: the right tokens, or an error; never wrong tokens on this passage.
  CodecOptions any;
  any.any_target = true;
  auto tried = codec.decode(fwd, {}, container, any);
  if (tried.ok()) {
    CHECK(*tried == p.tokens);
    MESSAGE("--any-target: the x86-64 container decoded here (the logits' tables agreed on this passage)");
  } else {
    MESSAGE("--any-target: refused: " << tried.error());
  }
}

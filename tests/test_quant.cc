// Block formats: hand-built blocks against the documented formulas, f16/bf16 conversions against
// independent integer/double references, round-trip error bounds, and golden hashes of ggml's own
// reference functions (ggml-quants.c) on deterministic inputs.
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/gguf/quant.h"
#include "test_support.h"

using namespace towers;

namespace {

// ---- helpers ------------------------------------------------------------------------------------

void put16(std::vector<uint8_t>& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v & 0xFF);
  b[off + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& bytes, size_t n) {
  REQUIRE(bytes.size() == row_bytes(t, n));
  std::vector<float> y(n);
  dequantize_row(t, bytes.data(), y.data(), n);
  return y;
}

std::vector<uint8_t> quant(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> b(row_bytes(t, x.size()));
  quantize_row(t, x.data(), b.data(), x.size());
  return b;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Exact comparison element by element (also tells +0 from -0 apart only when asked).
void check_equal(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (++bad <= 5) FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
    }
  }
  CHECK(bad == 0);
}

// Deterministic on every platform (unlike std::normal_distribution).
struct Rng : test::SplitMix64 {
  float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }  // [0, 1), exact
  double gauss() {  // Box-Muller
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
uint64_t hash_floats(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (float f : v) {
    const uint32_t u = bits(f);
    const uint8_t le[4] = {uint8_t(u), uint8_t(u >> 8), uint8_t(u >> 16), uint8_t(u >> 24)};
    h = fnv1a(le, 4, h);
  }
  return h;
}

// Independent decoding of a half: sign, 5-bit exponent, 10-bit mantissa.
double half_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) v = std::ldexp(m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

// Independent f32 -> half, round to nearest even, computed in double (exact for these ranges).
uint16_t half_ref(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7E00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;  // 65520 is the tie between 65504 and 2^16: rounds to inf
  if (a < 0x1.0p-14) return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1.0p24));
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): leading bit is 2^(e-1)
  double q = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits: [1024, 2048]
  int exp = e - 1;
  if (q == 2048) {
    q = 1024;
    ++exp;
  }
  return sign | static_cast<uint16_t>(((exp + 15) << 10) | (static_cast<int>(q) - 1024));
}

uint16_t bf16_ref(float f) {
  const uint32_t u = bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t t = u >> 16;
  const uint32_t rem = u & 0xFFFF;
  if (rem > 0x8000 || (rem == 0x8000 && (t & 1))) ++t;
  return static_cast<uint16_t>(t);
}

}  // namespace

// ---- f16 / bf16 --------------------------------------------------------------------------------

TEST_CASE("fp16 known values") {
  CHECK(f32_to_fp16(1.0f) == 0x3C00);
  CHECK(fp16_to_f32(0x3C00) == 1.0f);
  CHECK(f32_to_fp16(-2.0f) == 0xC000);
  CHECK(fp16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f32_to_fp16(65504.0f) == 0x7BFF);
  CHECK(f32_to_fp16(65519.0f) == 0x7BFF);        // below the midpoint to 2^16
  CHECK(f32_to_fp16(65520.0f) == 0x7C00);        // the tie rounds to even = infinity
  CHECK(f32_to_fp16(1e10f) == 0x7C00);
  CHECK(f32_to_fp16(-INFINITY) == 0xFC00);
  CHECK(fp16_to_f32(0x7C00) == INFINITY);
  CHECK(fp16_to_f32(0xFC00) == -INFINITY);
  CHECK(fp16_to_f32(0x0001) == 0x1.0p-24f);      // smallest subnormal
  CHECK(f32_to_fp16(0x1.0p-24f) == 0x0001);
  CHECK(fp16_to_f32(0x03FF) == 1023 * 0x1.0p-24f);  // largest subnormal
  CHECK(fp16_to_f32(0x0400) == 0x1.0p-14f);      // smallest normal
  CHECK(f32_to_fp16(0x1.0p-25f) == 0x0000);      // tie between 0 and 2^-24: even is 0
  CHECK(f32_to_fp16(0x1.000002p-25f) == 0x0001); // just above the tie
  CHECK(f32_to_fp16(3 * 0x1.0p-25f) == 0x0002);  // tie between 1 and 2 ulps: even is 2
  CHECK(f32_to_fp16(1.0f + 0x1.0p-11f) == 0x3C00);      // tie: 1.0 (even) wins over 1+2^-10
  CHECK(f32_to_fp16(1.0f + 3 * 0x1.0p-11f) == 0x3C02);  // tie: 0x3C02 (even) wins over 0x3C01
  CHECK(f32_to_fp16(1.0f + 0x1.0p-11f + 0x1.0p-20f) == 0x3C01);
  CHECK(f32_to_fp16(0.1f) == 0x2E66);
  CHECK(f32_to_fp16(1e-10f) == 0x0000);
  CHECK(f32_to_fp16(-1e-10f) == 0x8000);
  CHECK(f32_to_fp16(-0.0f) == 0x8000);
  CHECK(bits(fp16_to_f32(0x8000)) == 0x80000000u);
  CHECK(f32_to_fp16(NAN) == 0x7E00);
  CHECK(f32_to_fp16(-NAN) == 0xFE00);
  CHECK(bits(fp16_to_f32(0x7E00)) == 0x7FC00000u);
  CHECK(bits(fp16_to_f32(0x7C01)) == 0x7FC02000u);  // signaling NaN comes out quiet, payload kept
}

TEST_CASE("fp16 -> f32 exhaustive, and round trip of every non-NaN half") {
  int bad_value = 0, bad_trip = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    const double want = half_value(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 31) == 31 && (h & 1023);
    if (nan) {
      // NaN: quiet, sign and payload kept (what ggml's conversion gives on IEEE hardware).
      const uint32_t expect = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 1023u) << 13);
      if (bits(f) != expect) ++bad_value;
      if (f32_to_fp16(f) != ((h & 0x8000u) | 0x7E00u)) ++bad_trip;
      continue;
    }
    if (static_cast<double>(f) != want || std::signbit(f) != bool(h & 0x8000)) ++bad_value;
    if (f32_to_fp16(f) != h) ++bad_trip;
  }
  CHECK(bad_value == 0);
  CHECK(bad_trip == 0);
}

TEST_CASE("f32 -> fp16 against an independent rounding reference") {
  int bad = 0;
  auto check = [&](float f) {
    const uint16_t got = f32_to_fp16(f), want = half_ref(f);
    if (got != want && ++bad <= 5) FAIL_CHECK("f32 bits " << std::hex << bits(f) << ": got " << got << " want " << want);
  };
  // Every midpoint between adjacent finite halves (exact in f32), and its f32 neighbours.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float lo = fp16_to_f32(static_cast<uint16_t>(h));
    const float hi = h + 1 < 0x7C00 ? fp16_to_f32(static_cast<uint16_t>(h + 1)) : 65536.0f;
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    REQUIRE(static_cast<double>(mid) == (static_cast<double>(lo) + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), lo}) {
      check(f);
      check(-f);
    }
  }
  // A stride through all f32 bit patterns (all exponents, NaNs and infinities included).
  for (uint64_t u = 0; u < (1ull << 32); u += 251) check(std::bit_cast<float>(static_cast<uint32_t>(u)));
  CHECK(bad == 0);
}

TEST_CASE("bf16 conversions") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(bf16_to_f32(0xC040) == -3.0f);
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3F808000u)) == 0x3F80);  // tie, even stays
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3F818000u)) == 0x3F82);  // tie, rounds up to even
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3F808001u)) == 0x3F81);  // above the tie
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3F807FFFu)) == 0x3F80);  // below the tie
  CHECK(f32_to_bf16(std::bit_cast<float>(0x7F7FFFFFu)) == 0x7F80);  // FLT_MAX rounds to inf
  CHECK(f32_to_bf16(INFINITY) == 0x7F80);
  CHECK(f32_to_bf16(-INFINITY) == 0xFF80);
  CHECK(f32_to_bf16(std::bit_cast<float>(0x7F800001u)) == 0x7FC0);  // sNaN -> quiet NaN
  CHECK(f32_to_bf16(std::bit_cast<float>(0xFF812345u)) == 0xFFC1);  // sign and top payload kept
  CHECK(f32_to_bf16(std::bit_cast<float>(0x00000001u)) == 0x0000);  // subnormals round, not flush
  CHECK(f32_to_bf16(std::bit_cast<float>(0x00008001u)) == 0x0001);

  int bad_trip = 0, bad_ref = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (bits(f) != h << 16) ++bad_trip;
    if (!std::isnan(f) && f32_to_bf16(f) != h) ++bad_trip;
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 251) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(u));
    if (f32_to_bf16(f) != bf16_ref(f)) ++bad_ref;
  }
  CHECK(bad_trip == 0);
  CHECK(bad_ref == 0);
}

// ---- hand-built blocks -------------------------------------------------------------------------

TEST_CASE("plain float rows") {
  std::vector<uint8_t> f32(8);
  const float a = 1.5f, b = -0.0f;
  std::memcpy(f32.data(), &a, 4);
  std::memcpy(f32.data() + 4, &b, 4);
  auto y = dequant(GgmlType::F32, f32, 2);
  CHECK(y[0] == 1.5f);
  CHECK(bits(y[1]) == 0x80000000u);

  std::vector<uint8_t> f16(6), bf16(6);
  put16(f16, 0, 0x3C00); put16(f16, 2, 0xC500); put16(f16, 4, 0x0001);   // 1, -5, 2^-24
  put16(bf16, 0, 0x3F80); put16(bf16, 2, 0xC0A0); put16(bf16, 4, 0x0001);  // 1, -5, 2^-133
  check_equal(dequant(GgmlType::F16, f16, 3), {1.0f, -5.0f, 0x1.0p-24f});
  check_equal(dequant(GgmlType::BF16, bf16, 3), {1.0f, -5.0f, 0x1.0p-133f});
  CHECK(quant(GgmlType::F16, {1.0f, -5.0f, 0x1.0p-24f}) == f16);
  CHECK(quant(GgmlType::BF16, {1.0f, -5.0f, 0x1.0p-133f}) == bf16);
}

TEST_CASE("Q4_0 block: (nibble - 8) * d") {
  std::vector<uint8_t> b(18);
  put16(b, 0, 0x3800);  // d = 0.5
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = (j - 8) * 0.5f;              // low nibbles: elements 0..15
    want[j + 16] = ((15 - j) - 8) * 0.5f;  // high nibbles: elements 16..31
  }
  check_equal(dequant(GgmlType::Q4_0, b, 32), want);
}

TEST_CASE("Q4_1 block: nibble * d + m") {
  std::vector<uint8_t> b(20);
  put16(b, 0, 0x3400);  // d = 0.25
  put16(b, 2, 0xBE00);  // m = -1.5
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((j ^ 0xA) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = j * 0.25f - 1.5f;
    want[j + 16] = (j ^ 0xA) * 0.25f - 1.5f;
  }
  check_equal(dequant(GgmlType::Q4_1, b, 32), want);
}

TEST_CASE("Q5_0 block: ((nibble | high bit << 4) - 16) * d") {
  std::vector<uint8_t> b(22);
  put16(b, 0, 0x4000);  // d = 2
  const uint8_t qh[4] = {0x0F, 0xF0, 0xA5, 0x3C};  // bit j of the little-endian u32 = element j
  std::memcpy(&b[2], qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(((3 * j) & 0xF) | (((j + 5) & 0xF) << 4));
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) {
    const int nibble = e < 16 ? (3 * e) & 0xF : ((e - 16) + 5) & 0xF;
    const int high = (qh[e / 8] >> (e % 8)) & 1;
    want[e] = ((nibble | (high << 4)) - 16) * 2.0f;
  }
  check_equal(dequant(GgmlType::Q5_0, b, 32), want);
}

TEST_CASE("Q8_0 blocks: q * d") {
  std::vector<uint8_t> b(68);
  put16(b, 0, 0xB000);  // d = -0.125
  const int8_t q[32] = {-128, 127, 0, -1, 1, 2, -2, 64, -64, 100, -100, 33, -33, 5, 6, 7,
                        8, 9, 10, 11, 12, 13, 14, 15, -16, -17, -18, -19, -20, 120, -127, 3};
  std::memcpy(&b[2], q, 32);
  put16(b, 34, 0x0001);  // second block: d = 2^-24 (subnormal half)
  for (int j = 0; j < 32; ++j) b[36 + j] = static_cast<uint8_t>(q[31 - j]);
  std::vector<float> want(64);
  for (int j = 0; j < 32; ++j) {
    want[j] = q[j] * -0.125f;
    want[32 + j] = q[31 - j] * 0x1.0p-24f;
  }
  check_equal(dequant(GgmlType::Q8_0, b, 64), want);
}

namespace {

// Six-bit scales and mins of the 8 sub-blocks, and their packing by hand:
//   bytes 0-3:  scale[j] low 6 bits | (scale[j+4] >> 4) << 6
//   bytes 4-7:  min[j] low 6 bits   | (min[j+4] >> 4) << 6
//   bytes 8-11: scale[j+4] & 15     | (min[j+4] & 15) << 4
const int kSc[8] = {1, 2, 63, 0, 17, 33, 48, 62};
const int kMin[8] = {3, 0, 63, 5, 16, 47, 1, 63};
const uint8_t kPacked[12] = {0x41, 0x82, 0xFF, 0xC0, 0x43, 0x80, 0x3F, 0xC5, 0x01, 0xF1, 0x10, 0xFE};

// Expected value of a q4_K/q5_K element in ggml's operation order: (d*scale) * q - (dmin*min).
float k_value(float d, float dmin, int sub, int q) {
  const float ds = d * static_cast<float>(kSc[sub]);
  const float dm = dmin * static_cast<float>(kMin[sub]);
  return ds * static_cast<float>(q) - dm;
}

}  // namespace

TEST_CASE("Q4_K block: packed 6-bit scales/mins, 4-bit quants") {
  // {d, dmin} as halves: exact powers of two, then values that are not (0.1, 0.3).
  for (const auto& halves : {std::pair<uint16_t, uint16_t>{0x3800, 0x3400}, {0x2E66, 0x34CD}}) {
    const uint16_t hd = halves.first, hm = halves.second;
    CAPTURE(hd);
    std::vector<uint8_t> b(144);
    put16(b, 0, hd);
    put16(b, 2, hm);
    std::memcpy(&b[4], kPacked, 12);
    for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>(i * 7 + 3);
    const float d = fp16_to_f32(hd), dmin = fp16_to_f32(hm);
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
      const int sub = e / 32, pair = sub / 2, l = e % 32;
      const uint8_t byte = b[16 + 32 * pair + l];
      const int q = sub % 2 == 0 ? byte & 0xF : byte >> 4;  // even sub-block: low nibbles
      want[e] = k_value(d, dmin, sub, q);
    }
    check_equal(dequant(GgmlType::Q4_K, b, 256), want);
  }
}

TEST_CASE("Q5_K block: q4_K plus one high bit per element in qh") {
  for (const auto& halves : {std::pair<uint16_t, uint16_t>{0x3800, 0x3400}, {0x2E66, 0x34CD}}) {
    const uint16_t hd = halves.first, hm = halves.second;
    CAPTURE(hd);
    std::vector<uint8_t> b(176);
    put16(b, 0, hd);
    put16(b, 2, hm);
    std::memcpy(&b[4], kPacked, 12);
    for (int i = 0; i < 32; ++i) b[16 + i] = static_cast<uint8_t>(i * 29 + 5);   // qh
    for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>(i * 7 + 3);  // qs
    const float d = fp16_to_f32(hd), dmin = fp16_to_f32(hm);
    std::vector<float> want(256);
    int high_bits = 0;
    for (int e = 0; e < 256; ++e) {
      const int sub = e / 32, pair = sub / 2, l = e % 32;
      const uint8_t byte = b[48 + 32 * pair + l];
      const int low = sub % 2 == 0 ? byte & 0xF : byte >> 4;
      const int high = (b[16 + l] >> sub) & 1;  // sub-block s uses bit s of qh[l]
      high_bits += high;
      want[e] = k_value(d, dmin, sub, low + 16 * high);
    }
    REQUIRE(high_bits > 64);
    check_equal(dequant(GgmlType::Q5_K, b, 256), want);
  }
}

TEST_CASE("Q6_K block: (d * scale) * (6-bit q - 32), 16 int8 scales") {
  const int8_t scales[16] = {1, -1, 127, -128, 2, 3, -7, 64, 0, 5, -64, 100, 17, -33, 8, 1};
  for (uint16_t hd : {uint16_t(0x3800), uint16_t(0x2E66)}) {
    CAPTURE(hd);
    std::vector<uint8_t> b(210);
    for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i * 11 + 1);          // ql
    for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>(i * 37 + 200);  // qh
    std::memcpy(&b[192], scales, 16);
    put16(b, 208, hd);
    const float d = fp16_to_f32(hd);
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
      // Each half of 128 has 64 ql bytes and 32 qh bytes; quarter k of a half takes element l from
      // ql[l + 32*(k&1)] (low nibble for k < 2, high for k >= 2) and bits 2k..2k+1 of qh[l].
      const int half = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t lo_byte = b[64 * half + 32 * (k & 1) + l];
      const int lo = k < 2 ? lo_byte & 0xF : lo_byte >> 4;
      const int hi = (b[128 + 32 * half + l] >> (2 * k)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      want[e] = d * static_cast<float>(scales[e / 16]) * static_cast<float>(q);
    }
    check_equal(dequant(GgmlType::Q6_K, b, 256), want);
  }
}

TEST_CASE("unaligned source and destination give the same results") {
  const GgmlType types[] = {GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,   GgmlType::Q4_1,
                            GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  Rng rng{7};
  std::vector<float> x(512);
  for (auto& v : x) v = static_cast<float>(rng.gauss());
  for (GgmlType t : types) {
    CAPTURE(ggml_type_name(t));
    const auto aligned = quant(t, x);
    std::vector<uint8_t> shifted(aligned.size() + 3);
    quantize_row(t, x.data(), shifted.data() + 3, x.size());
    CHECK(std::equal(aligned.begin(), aligned.end(), shifted.begin() + 3));
    std::vector<float> y0(x.size()), y1(x.size());
    dequantize_row(t, aligned.data(), y0.data(), x.size());
    dequantize_row(t, shifted.data() + 3, y1.data(), x.size());
    check_equal(y1, y0);
  }
}

TEST_CASE("quantize_row writes exactly row_bytes, all of them") {
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  Rng rng{11};
  std::vector<float> x(768);
  for (auto& v : x) v = static_cast<float>(rng.gauss());
  for (size_t i = 256; i < 512; ++i) x[i] = 0;  // an all-zero super-block too
  for (GgmlType t : types) {
    CAPTURE(ggml_type_name(t));
    const size_t nb = row_bytes(t, x.size());
    std::vector<uint8_t> a(nb + 16, 0x00), b(nb + 16, 0xFF);
    quantize_row(t, x.data(), a.data(), x.size());
    quantize_row(t, x.data(), b.data(), x.size());
    CHECK(std::equal(a.begin(), a.begin() + nb, b.begin()));  // every byte written
    for (size_t i = nb; i < nb + 16; ++i) {
      CHECK(a[i] == 0x00);
      CHECK(b[i] == 0xFF);
    }
  }
}

TEST_CASE("unsupported types dequantize to NaN") {
  std::vector<uint8_t> b(row_bytes(GgmlType::IQ2_XXS, 256), 0);
  std::vector<float> y(256, 0.0f);
  dequantize_row(GgmlType::IQ2_XXS, b.data(), y.data(), 256);
  for (float v : y) CHECK(std::isnan(v));
}

// ---- round trips --------------------------------------------------------------------------------

namespace {

double rel_rms_error(GgmlType t, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  const auto b = quant(t, x);
  dequantize_row(t, b.data(), y.data(), x.size());
  double se = 0, ss = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    ss += double(x[i]) * x[i];
  }
  return std::sqrt(se / ss);
}

struct Bound {
  GgmlType type;
  double gauss, uniform, varied;  // relative RMS error bounds
};

}  // namespace

TEST_CASE("quantize -> dequantize error bounds") {
  // Relative RMS error measured with these inputs (the quantizers are ggml-identical, except Q2_K,
  // Q3_K, IQ4_NL and IQ4_XS: our reference quantizers, quant.cc), and bounds about 1.25x above:
  //   type  gaussian  uniform  varied
  //   F16   0.00021   0.00021  0.00020
  //   BF16  0.0017    0.0017   0.0016
  //   Q8_0  0.0053    0.0038   0.0053
  //   Q6_K  0.0176    0.0133   0.0173
  //   Q5_K  0.036     0.028    0.035
  //   Q5_0  0.042     0.031    0.042
  //   Q4_K  0.072     0.054    0.069
  //   Q4_1  0.079     0.060    0.074
  //   Q4_0  0.086     0.065    0.084
  //   Q5_1  0.038     0.029    0.036
  //   Q2_K  0.284     0.226    0.274
  //   Q3_K  0.153     0.123    0.150
  //   IQ4_NL 0.076    0.065    0.074
  //   IQ4_XS 0.077    0.065    0.076
  const Bound bounds[] = {
      {GgmlType::F16, 0.0003, 0.0003, 0.0003},   {GgmlType::BF16, 0.0022, 0.0022, 0.0022},
      {GgmlType::Q8_0, 0.007, 0.005, 0.007},     {GgmlType::Q6_K, 0.022, 0.017, 0.022},
      {GgmlType::Q5_K, 0.045, 0.035, 0.045},     {GgmlType::Q5_0, 0.052, 0.04, 0.052},
      {GgmlType::Q4_K, 0.09, 0.07, 0.09},        {GgmlType::Q4_1, 0.095, 0.075, 0.095},
      {GgmlType::Q4_0, 0.105, 0.08, 0.105},
      {GgmlType::Q5_1, 0.048, 0.037, 0.045},     {GgmlType::Q2_K, 0.36, 0.29, 0.35},
      {GgmlType::Q3_K, 0.19, 0.155, 0.19},       {GgmlType::IQ4_NL, 0.095, 0.081, 0.093},
      {GgmlType::IQ4_XS, 0.096, 0.082, 0.096},
  };
  const size_t n = 256 * 64;
  Rng rng{12345};
  std::vector<float> gauss(n), uniform(n), varied(n);
  for (size_t i = 0; i < n; ++i) {
    gauss[i] = static_cast<float>(rng.gauss());
    uniform[i] = (2 * rng.uniform() - 1) * 0.0346f;  // like the synthetic model weights
    // Sub-blocks of 32 with magnitudes over two decades and shifted means: exercises the whole
    // range of the 6-bit k-quant scales and mins.
    const size_t g = i / 32;
    const float scale = std::ldexp(1.0f, static_cast<int>(g % 8) - 4) * (1 + static_cast<float>(g % 5));
    const float offset = (g % 3 == 0 ? 0.5f : g % 3 == 1 ? -0.25f : 0.0f) * scale;
    varied[i] = static_cast<float>(rng.gauss()) * scale + offset;
  }
  CHECK(rel_rms_error(GgmlType::F32, gauss) == 0.0);
  for (const Bound& b : bounds) {
    const double eg = rel_rms_error(b.type, gauss), eu = rel_rms_error(b.type, uniform),
                 ev = rel_rms_error(b.type, varied);
    MESSAGE(ggml_type_name(b.type) << ": gaussian " << eg << ", uniform " << eu << ", varied " << ev);
    CHECK(eg < b.gauss);
    CHECK(eu < b.uniform);
    CHECK(ev < b.varied);
  }
}

TEST_CASE("quantize of zeros dequantizes to zeros") {
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  std::vector<float> zeros(512, 0.0f);
  for (GgmlType t : types) {
    CAPTURE(ggml_type_name(t));
    const auto b = quant(t, zeros);
    std::vector<float> y(zeros.size(), 1.0f);
    dequantize_row(t, b.data(), y.data(), y.size());
    for (float v : y) CHECK(v == 0.0f);
  }
}

TEST_CASE("a constant row survives the asymmetric and k-quant formats") {
  // Exercises the max == min paths: q4_1 with d = 0, k-quants with a zero sub-block scale.
  std::vector<float> x(256, 0.75f);
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0,
                     GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    CAPTURE(ggml_type_name(t));
    CHECK(rel_rms_error(t, x) < 0.01);
  }
}

// ---- golden hashes from ggml ---------------------------------------------------------------------
// Produced by linking ggml's own ggml-quants.c (ggml-org/ggml commit 9a4acb37, Feb 2025, built with
// -ffp-contract=off, scalar fp16 conversions) against these exact inputs: the FNV-1a hash of
// dequantize_row_* over deterministic blocks, and of quantize_row_*_ref over a deterministic row.

namespace {

// Deterministic blocks: random bytes, with every half field (d, dmin/m) replaced by a finite half.
std::vector<uint8_t> golden_blocks(GgmlType t, size_t n) {
  std::vector<uint8_t> b(row_bytes(t, n));
  Rng rng{0xB10C5};
  for (auto& v : b) v = static_cast<uint8_t>(rng.next());
  const auto tr = traits(t);
  auto finite_half = [&](size_t off) {
    uint16_t h = static_cast<uint16_t>(rng.next());
    if (((h >> 10) & 31) == 31) h &= 0xBFFF;  // clear the top exponent bit: no inf/NaN
    put16(b, off, h);
  };
  for (size_t blk = 0; blk < n / tr.block_elems; ++blk) {
    const size_t base = blk * tr.block_bytes;
    switch (t) {
      case GgmlType::Q6_K: finite_half(base + 208); break;
      case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        finite_half(base);
        finite_half(base + 2);
        break;
      default: finite_half(base); break;
    }
  }
  return b;
}

// Deterministic row built with exact float operations only (no libm).
std::vector<float> golden_row(size_t n) {
  std::vector<float> x(n);
  Rng rng{0x60D};
  for (size_t i = 0; i < n; ++i) {
    const size_t g = i / 32;
    if (g % 7 == 6) continue;  // some all-zero sub-blocks
    const float u = rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform() - 2.0f;
    const float scale = 1.0f + 0.75f * static_cast<float>(g % 8);
    x[i] = u * scale + (g % 3 == 0 ? 0.5f : 0.0f);
  }
  return x;
}

struct Golden {
  GgmlType type;
  uint64_t dequant_hash, quant_hash;
};

}  // namespace

TEST_CASE("bit-identical to ggml's dequantize_row_* and quantize_row_*_ref") {
  const Golden goldens[] = {
      {GgmlType::Q4_0, 0x77f8a057c39e43bbull, 0x0c78a04ec10b62d7ull},
      {GgmlType::Q4_1, 0x3d2a6c984d3143cfull, 0x44f975aba3369d78ull},
      {GgmlType::Q5_0, 0xf660f6142eab864dull, 0x1bee009e4efe1f99ull},
      {GgmlType::Q8_0, 0x59848f2498d5ebc1ull, 0x6bdfa8a22859727full},
      {GgmlType::Q4_K, 0x0b6a1d6fe1fbd028ull, 0xe5dee2191864baafull},
      {GgmlType::Q5_K, 0x8acee5156a7090c6ull, 0x190cd8a0d774c27dull},
      {GgmlType::Q6_K, 0xc18c5045e9d8c3b5ull, 0x8f51d162b8513358ull},
  };
  const size_t n = 256 * 16;
  const auto x = golden_row(n);
  for (const Golden& g : goldens) {
    CAPTURE(ggml_type_name(g.type));
    const auto blocks = golden_blocks(g.type, n);
    const auto y = dequant(g.type, blocks, n);
    const auto q = quant(g.type, x);
    CHECK(hash_floats(y) == g.dequant_hash);
    CHECK(fnv1a(q.data(), q.size()) == g.quant_hash);
  }
}

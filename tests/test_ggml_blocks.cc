// simd/ggml_blocks.h: the block structs have ggml's byte offsets (as ggml-quants.c indexes them), the
// geometry engine/ggml_type reports comes from them, and the 6-bit scale/min packing of Q4_K/Q5_K is
// ggml's get_scale_min_k4 (written out here per element) and its inverse.
#include <cstddef>
#include <cstdint>
#include <random>

#include <doctest/doctest.h>

#include "engine/gguf/ggml_type.h"
#include "simd/ggml_blocks.h"

using namespace towers;
using namespace towers::simd;

namespace {

// ggml's get_scale_min_k4, element by element.
void ggml_scale_min(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

TEST_CASE("ggml_blocks: field offsets are ggml's") {
  // The byte offsets ggml-quants.c's readers use (x[i].d, x[i].qs, ... from the block start).
  CHECK(offsetof(BlockQ4_0, qs) == 2);
  CHECK(offsetof(BlockQ4_1, m) == 2);
  CHECK(offsetof(BlockQ4_1, qs) == 4);
  CHECK(offsetof(BlockQ5_0, qh) == 2);
  CHECK(offsetof(BlockQ5_0, qs) == 6);
  CHECK(offsetof(BlockQ5_1, qh) == 4);
  CHECK(offsetof(BlockQ5_1, qs) == 8);
  CHECK(offsetof(BlockQ8_0, qs) == 2);
  CHECK(offsetof(BlockQ8_1, qs) == 4);
  CHECK(offsetof(BlockQ2_K, qs) == 16);
  CHECK(offsetof(BlockQ2_K, d) == 80);
  CHECK(offsetof(BlockQ3_K, scales) == 96);
  CHECK(offsetof(BlockQ3_K, d) == 108);
  CHECK(offsetof(BlockQ4_K, dmin) == 2);
  CHECK(offsetof(BlockQ4_K, scales) == 4);
  CHECK(offsetof(BlockQ4_K, qs) == 16);
  CHECK(offsetof(BlockQ5_K, qh) == 16);
  CHECK(offsetof(BlockQ5_K, qs) == 48);
  CHECK(offsetof(BlockQ6_K, qh) == 128);
  CHECK(offsetof(BlockQ6_K, scales) == 192);
  CHECK(offsetof(BlockQ6_K, d) == 208);
  CHECK(offsetof(BlockQ8_K, bsums) == 260);
  CHECK(offsetof(BlockIQ4_NL, qs) == 2);
  CHECK(offsetof(BlockIQ4_XS, scales_h) == 2);
  CHECK(offsetof(BlockIQ4_XS, scales_l) == 4);
  CHECK(offsetof(BlockIQ4_XS, qs) == 8);
  // Alignment 1: a block may start at any byte of a mapped file.
  CHECK(alignof(BlockQ4_0) == 1);
  CHECK(alignof(BlockQ6_K) == 1);
  CHECK(alignof(BlockQ8_K) == 1);
}

TEST_CASE("ggml_blocks: ggml_type_traits reports the structs' geometry") {
  // Every id GGUF numbers 0..39: known ones have the struct's shape, the others none.
  for (uint32_t raw = 0; raw < 40; ++raw) {
    CAPTURE(raw);
    const auto tr = ggml_type_traits(raw);
    const BlockShape shape = block_shape(static_cast<GgmlType>(raw));
    CHECK(tr.has_value() == (shape.elems != 0));
    if (!tr) continue;
    CHECK(tr->block_elems == shape.elems);
    CHECK(tr->block_bytes == shape.bytes);
  }
  CHECK(block_shape(GgmlType::Q4_K).bytes == 144);
  // The types we refuse still have ggml's geometry (ggml-common.h), so their files parse.
  CHECK(block_shape(GgmlType::IQ2_XXS).bytes == 66);
  CHECK(block_shape(GgmlType::IQ3_S).bytes == 110);
  CHECK(block_shape(GgmlType::IQ1_M).bytes == 56);
  CHECK(block_shape(GgmlType::TQ1_0).bytes == 54);
  CHECK(block_shape(GgmlType::IQ4_XS).bytes == 136);
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
                     GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::TQ1_0, GgmlType::TQ2_0}) {
    CAPTURE(ggml_type_name(t));
    CHECK_FALSE(traits(t).supported);
    CHECK(supported_ggml_types().find(ggml_type_name(t)) == std::string_view::npos);
  }
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    CAPTURE(ggml_type_name(t));
    CHECK(traits(t).supported);
    CHECK(supported_ggml_types().find(ggml_type_name(t)) != std::string_view::npos);
  }
  CHECK(block_shape(GgmlType::Q6_K).elems == 256);
  CHECK(row_bytes(GgmlType::Q8_0, 64) == 68);
}

TEST_CASE("ggml_blocks: Half is two little-endian bytes") {
  Half h{};
  h.set(1.0f);
  CHECK(h.bytes[0] == 0x00);
  CHECK(h.bytes[1] == 0x3C);
  CHECK(h.bits() == 0x3C00);
  CHECK(h.to_f32() == 1.0f);
  h.set_bits(0xC000);
  CHECK(h.to_f32() == -2.0f);
}

TEST_CASE("ggml_blocks: unpack_scale_min_k4 is ggml's get_scale_min_k4, pack_scale_min_k4 inverts it") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255), six(0, 63);
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t q[kKScaleBytes];
    for (auto& b : q) b = static_cast<uint8_t>(byte(rng));
    uint8_t sc[8], mn[8];
    unpack_scale_min_k4(q, sc, mn);
    for (int j = 0; j < 8; ++j) {
      int want_sc, want_mn;
      ggml_scale_min(j, q, want_sc, want_mn);
      REQUIRE(sc[j] == want_sc);
      REQUIRE(mn[j] == want_mn);
    }
    // Any 8 + 8 six-bit values survive pack then unpack.
    uint8_t ls[8], lm[8], packed[kKScaleBytes], sc2[8], mn2[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(six(rng));
      lm[j] = static_cast<uint8_t>(six(rng));
    }
    pack_scale_min_k4(ls, lm, packed);
    unpack_scale_min_k4(packed, sc2, mn2);
    for (int j = 0; j < 8; ++j) {
      REQUIRE(sc2[j] == ls[j]);
      REQUIRE(mn2[j] == lm[j]);
    }
  }
}

TEST_CASE("ggml_blocks: unpack_scales_q3k is dequantize_row_q3_K's unpacking, pack_scales_q3k inverts it") {
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> byte(0, 255), six(0, 63);
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t q[12];
    for (auto& b : q) b = static_cast<uint8_t>(byte(rng));
    // ggml's kmask dance on four 32-bit words, written out per scale: scale j has its low 4 bits in
    // q[j % 8] (low nibble for j < 8) and its top 2 at bits 2 (j / 4) of q[8 + j % 4].
    uint8_t sc[16];
    unpack_scales_q3k(q, sc);
    for (int j = 0; j < 16; ++j) {
      const int low = j < 8 ? q[j] & 15 : q[j - 8] >> 4;
      const int top = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
      REQUIRE(sc[j] == (low | top << 4));
    }
    uint8_t ls[16], packed[12], back[16];
    for (auto& l : ls) l = static_cast<uint8_t>(six(rng));
    pack_scales_q3k(ls, packed);
    unpack_scales_q3k(packed, back);
    for (int j = 0; j < 16; ++j) REQUIRE(back[j] == ls[j]);
  }
}

TEST_CASE("ggml_blocks: iq4xs_scale reads ggml's scales_l and scales_h") {
  BlockIQ4_XS b{};
  // ls_j = 10 + 7j: low 4 bits in nibble j % 2 of scales_l[j / 2], top 2 at bits 2j of scales_h.
  uint16_t h = 0;
  for (int j = 0; j < 8; ++j) {
    const int ls = 10 + 7 * j;
    b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | (ls & 15) << (4 * (j % 2)));
    h = static_cast<uint16_t>(h | (ls >> 4) << (2 * j));
  }
  b.scales_h[0] = static_cast<uint8_t>(h);
  b.scales_h[1] = static_cast<uint8_t>(h >> 8);
  for (int j = 0; j < 8; ++j) CHECK(iq4xs_scale(b, j) == 10 + 7 * j);
  // All codes at once, and their int8 values minus 32, over random bytes.
  std::mt19937 rng(8);
  for (int trial = 0; trial < 20000; ++trial) {
    for (auto& v : b.scales_l) v = static_cast<uint8_t>(rng());
    for (auto& v : b.scales_h) v = static_cast<uint8_t>(rng());
    const uint64_t codes = iq4xs_scale_codes(b), signed_codes = minus32_codes(codes);
    for (int j = 0; j < 8; ++j) {
      REQUIRE(static_cast<int>((codes >> (8 * j)) & 0xFF) == iq4xs_scale(b, j));
      REQUIRE(static_cast<int8_t>(signed_codes >> (8 * j)) == iq4xs_scale(b, j) - 32);
    }
  }
  CHECK(kIq4nlValues[0] == -127);
  CHECK(kIq4nlValues[15] == 113);
}

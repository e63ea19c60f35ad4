// ggml's tensor element types and block formats, as they are in GGUF files: one struct per format,
// with ggml's field names in ggml's order and its size asserted (the reference is ggml's
// ggml-common.h). The one place that knows these layouts: engine/gguf/quant.cc (scalar readers and
// writers), engine/gguf/ggml_type.cc (geometry) and the simd/ kernels all read the structs below.
//
// Every field is a byte array or a Half (two bytes), so every struct has alignment 1 and a block may
// start at any byte of a mapped file. Multi-byte values are little-endian, as in GGUF.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "simd/f16.h"

namespace towers::simd {

// Type ids as numbered in GGUF files (ggml's enum ggml_type).
// Every id ggml defines, so that a file holding a type we do not read is refused by its name.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
};

inline constexpr size_t kQK = 32;     // elements per block of the legacy formats (Q4_0 .. Q8_1)
inline constexpr size_t kQK_K = 256;  // elements per super-block of the K formats
inline constexpr size_t kKScaleBytes = 12;  // Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins

// An IEEE binary16 value as stored in a block (ggml_half).
struct Half {
  uint8_t bytes[2];

  uint16_t bits() const { return static_cast<uint16_t>(bytes[0] | bytes[1] << 8); }
  float to_f32() const { return fp16_to_f32(bits()); }
  void set_bits(uint16_t h) {
    bytes[0] = static_cast<uint8_t>(h);
    bytes[1] = static_cast<uint8_t>(h >> 8);
  }
  void set(float f) { set_bits(f32_to_fp16(f)); }  // round to nearest even
};
static_assert(sizeof(Half) == 2 && alignof(Half) == 1);

// ---------------------------------------------------------------------------------------------
// Legacy formats: blocks of 32. "qs[j] low | high nibble" means element j is in the low nibble of
// qs[j] and element j + 16 in its high nibble.

// x = d * (q - 8), q 4 bits (qs[j] low | high nibble).
struct BlockQ4_0 {
  Half d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// x = d * q + m, q 4 bits (qs[j] low | high nibble).
struct BlockQ4_1 {
  Half d;
  Half m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// x = d * (q - 16), q 5 bits: the low 4 as Q4_0, the fifth of element j at bit j of the
// little-endian 32-bit word qh.
struct BlockQ5_0 {
  Half d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// x = d * q + m, q 5 bits as in Q5_0.
struct BlockQ5_1 {
  Half d;
  Half m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// x = d * q, q int8.
struct BlockQ8_0 {
  Half d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// ggml's activation format for Q4_1/Q5_1 dot products: s = d * sum(qs).
struct BlockQ8_1 {
  Half d;
  Half s;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_1) == 36);

// ---------------------------------------------------------------------------------------------
// K formats: super-blocks of 256.

// Q2_K and Q3_K: 16 sub-blocks of 16. Each half h of 128 elements uses qs[32h .. 32h + 31]: element
// 128h + 32j + 16k + l (j < 4, k < 2, l < 16) is bits 2j..2j+1 of qs[32h + 16k + l], and sub-block
// 8h + 2j + k holds elements 16 (8h + 2j + k) .. + 15, i.e. sub-block s = element / 16.

// x = (d * (scales[s] & 15)) * q - dmin * (scales[s] >> 4), q 2 bits.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  Half d;
  Half dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// x = (d * (scale_s - 32)) * (q - 4), q 3 bits: the low 2 in qs (as Q2_K), the third of element e at
// bit e / 32 of hmask[e % 32] (set: q >= 4). The 16 six-bit scales are packed in 12 bytes
// (unpack_scales_q3k).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  Half d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 8 sub-blocks of 32: x = (d * scale_j) * q - dmin * min_j, q 4 bits; scale_j and min_j are 6 bits
// each, packed into `scales` (unpack_scale_min_k4). Sub-blocks 2k and 2k+1 share qs[32k .. 32k+31]:
// low nibbles for 2k, high nibbles for 2k+1.
struct BlockQ4_K {
  Half d;
  Half dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K with a fifth bit per element: element l of sub-block 2k at bit 2k of qh[l], of sub-block
// 2k+1 at bit 2k+1.
struct BlockQ5_K {
  Half d;
  Half dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16 with int8 scales: x = (d * scales[j]) * (q - 32), q 6 bits. Each half h of 128
// elements uses ql[64h ..] and qh[32h ..]; element l < 32 of its four quarters is
//   quarter 0: ql[l] low nibble,      qh[l] bits 0-1
//   quarter 1: ql[l + 32] low nibble, qh[l] bits 2-3
//   quarter 2: ql[l] high nibble,     qh[l] bits 4-5
//   quarter 3: ql[l + 32] high nibble, qh[l] bits 6-7
// (offsets relative to the half), and sub-block j covers elements 16j .. 16j + 15.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  Half d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// ---------------------------------------------------------------------------------------------
// Non-linear formats: 4-bit indices into kIq4nlValues (ggml's kvalues_iq4nl).
alignas(16) inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Blocks of 32: x = d * kIq4nlValues[i], i 4 bits (qs[j] low | high nibble, as Q4_0).
struct BlockIQ4_NL {
  Half d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// Super-blocks of 256 = 8 sub-blocks of 32: x = (d * (ls_j - 32)) * kIq4nlValues[i]; ls_j 6 bits, the
// low 4 in scales_l[j / 2] (low nibble for even j), the top 2 at bits 2j of the little-endian 16-bit
// scales_h; sub-block j's indices in qs[16j .. 16j + 15] (low | high nibble, as IQ4_NL).
struct BlockIQ4_XS {
  Half d;
  uint8_t scales_h[2];
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// ggml's activation format for K dot products (never stored in model files): f32 d, int8 quants, int16
// sums of each 16, all little-endian bytes here.
struct BlockQ8_K {
  uint8_t d[4];
  int8_t qs[kQK_K];
  uint8_t bsums[2 * kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// The block struct of a type id (BlockOf<GgmlType::Q4_0> is BlockQ4_0).
template <GgmlType> struct BlockTypeOf;
template <> struct BlockTypeOf<GgmlType::Q4_0> { using type = BlockQ4_0; };
template <> struct BlockTypeOf<GgmlType::Q4_1> { using type = BlockQ4_1; };
template <> struct BlockTypeOf<GgmlType::Q5_0> { using type = BlockQ5_0; };
template <> struct BlockTypeOf<GgmlType::Q5_1> { using type = BlockQ5_1; };
template <> struct BlockTypeOf<GgmlType::Q8_0> { using type = BlockQ8_0; };
template <> struct BlockTypeOf<GgmlType::Q8_1> { using type = BlockQ8_1; };
template <> struct BlockTypeOf<GgmlType::Q2_K> { using type = BlockQ2_K; };
template <> struct BlockTypeOf<GgmlType::Q3_K> { using type = BlockQ3_K; };
template <> struct BlockTypeOf<GgmlType::Q4_K> { using type = BlockQ4_K; };
template <> struct BlockTypeOf<GgmlType::Q5_K> { using type = BlockQ5_K; };
template <> struct BlockTypeOf<GgmlType::Q6_K> { using type = BlockQ6_K; };
template <> struct BlockTypeOf<GgmlType::Q8_K> { using type = BlockQ8_K; };
template <> struct BlockTypeOf<GgmlType::IQ4_NL> { using type = BlockIQ4_NL; };
template <> struct BlockTypeOf<GgmlType::IQ4_XS> { using type = BlockIQ4_XS; };
template <GgmlType t>
using BlockOf = typename BlockTypeOf<t>::type;

// Elements and bytes per block of a type (plain numbers: 1 element); {0, 0} for ids not listed above.
// The formats we do not read (IQ1/IQ2/IQ3, TQ) are sized from ggml-common.h's static_asserts, so that
// a file holding them parses and is then refused by name.
struct BlockShape {
  uint32_t elems;
  uint32_t bytes;
};
constexpr BlockShape block_shape(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return {1, 4};
    case GgmlType::F16: return {1, 2};
    case GgmlType::BF16: return {1, 2};
    case GgmlType::Q4_0: return {kQK, sizeof(BlockQ4_0)};
    case GgmlType::Q4_1: return {kQK, sizeof(BlockQ4_1)};
    case GgmlType::Q5_0: return {kQK, sizeof(BlockQ5_0)};
    case GgmlType::Q5_1: return {kQK, sizeof(BlockQ5_1)};
    case GgmlType::Q8_0: return {kQK, sizeof(BlockQ8_0)};
    case GgmlType::Q8_1: return {kQK, sizeof(BlockQ8_1)};
    case GgmlType::Q2_K: return {kQK_K, sizeof(BlockQ2_K)};
    case GgmlType::Q3_K: return {kQK_K, sizeof(BlockQ3_K)};
    case GgmlType::Q4_K: return {kQK_K, sizeof(BlockQ4_K)};
    case GgmlType::Q5_K: return {kQK_K, sizeof(BlockQ5_K)};
    case GgmlType::Q6_K: return {kQK_K, sizeof(BlockQ6_K)};
    case GgmlType::Q8_K: return {kQK_K, sizeof(BlockQ8_K)};
    case GgmlType::IQ4_NL: return {kQK, sizeof(BlockIQ4_NL)};
    case GgmlType::IQ4_XS: return {kQK_K, sizeof(BlockIQ4_XS)};
    case GgmlType::IQ2_XXS: return {kQK_K, 66};
    case GgmlType::IQ2_XS: return {kQK_K, 74};
    case GgmlType::IQ2_S: return {kQK_K, 82};
    case GgmlType::IQ3_XXS: return {kQK_K, 98};
    case GgmlType::IQ3_S: return {kQK_K, 110};
    case GgmlType::IQ1_S: return {kQK_K, 50};
    case GgmlType::IQ1_M: return {kQK_K, 56};
    case GgmlType::TQ1_0: return {kQK_K, 54};
    case GgmlType::TQ2_0: return {kQK_K, 66};
    case GgmlType::I8: return {1, 1};
    case GgmlType::I16: return {1, 2};
    case GgmlType::I32: return {1, 4};
    case GgmlType::I64: return {1, 8};
    case GgmlType::F64: return {1, 8};
  }
  return {0, 0};
}

// Q4_K/Q5_K: the 8 six-bit scales and mins packed in 12 bytes (ggml's get_scale_min_k4 for j < 8):
//   j < 4:  scale = q[j] & 63,                           min = q[j + 4] & 63
//   j >= 4: scale = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, min = (q[j + 4] >> 4) | (q[j] >> 6) << 4
// Four lanes of a 32-bit word at a time (little-endian bytes).
inline void unpack_scale_min_k4(const uint8_t* q, uint8_t* scale, uint8_t* min) {
  uint32_t u[3];
  std::memcpy(u, q, kKScaleBytes);
  constexpr uint32_t k6 = 0x3F3F3F3Fu, k4 = 0x0F0F0F0Fu, k2 = 0x03030303u;
  const uint32_t sc_lo = u[0] & k6;                                       // q[0..3] & 63
  const uint32_t mn_lo = u[1] & k6;                                       // q[4..7] & 63
  const uint32_t sc_hi = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);         // q[8..11] low | q[0..3] top
  const uint32_t mn_hi = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);  // q[8..11] high | q[4..7] top
  std::memcpy(scale, &sc_lo, 4);
  std::memcpy(scale + 4, &sc_hi, 4);
  std::memcpy(min, &mn_lo, 4);
  std::memcpy(min + 4, &mn_hi, 4);
}

// The inverse: packs 8 scales and 8 mins (each in [0, 63]) into 12 bytes.
inline void pack_scale_min_k4(const uint8_t* scale, const uint8_t* min, uint8_t* q) {
  std::memset(q, 0, kKScaleBytes);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = static_cast<uint8_t>(q[j] | scale[j]);
      q[j + 4] = static_cast<uint8_t>(q[j + 4] | min[j]);
    } else {
      q[j + 4] = static_cast<uint8_t>((scale[j] & 0xF) | ((min[j] & 0xF) << 4));
      q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((scale[j] >> 4) << 6));
      q[j] = static_cast<uint8_t>(q[j] | ((min[j] >> 4) << 6));
    }
  }
}

// Q3_K: the 16 six-bit scales (0..63; the scale is the value - 32) packed in 12 bytes, as ggml's
// dequantize_row_q3_K unpacks them: the low 4 bits of scale j in q[j % 8] (low nibble for j < 8, high
// for j >= 8), its top 2 bits at bits 2 (j / 4) of q[8 + j % 4].
// As two little-endian 64-bit words (scales 0..7, 8..15): whole-word stores, so that a kernel's 8-byte
// loads of them are forwarded from the store.
inline void unpack_scales_q3k_words(const uint8_t* q, uint64_t* w) {
  uint64_t lo;
  uint32_t top;
  std::memcpy(&lo, q, 8);
  std::memcpy(&top, q + 8, 4);
  constexpr uint64_t k4 = 0x0F0F0F0F0F0F0F0Full;
  constexpr uint32_t k2 = 0x03030303u;
  const auto spread = [](uint32_t a, uint32_t b) { return (uint64_t{a} | uint64_t{b} << 32) << 4; };
  w[0] = (lo & k4) | spread(top & k2, (top >> 2) & k2);
  w[1] = ((lo >> 4) & k4) | spread((top >> 4) & k2, (top >> 6) & k2);
}
inline void unpack_scales_q3k(const uint8_t* q, uint8_t* scale) {
  uint64_t w[2];
  unpack_scales_q3k_words(q, w);
  std::memcpy(scale, w, 16);
}

// The inverse: packs 16 scales (each in [0, 63]) into 12 bytes.
inline void pack_scales_q3k(const uint8_t* scale, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 16; ++j) {
    q[j % 8] = static_cast<uint8_t>(q[j % 8] | (scale[j] & 15) << (j < 8 ? 0 : 4));
    q[8 + j % 4] = static_cast<uint8_t>(q[8 + j % 4] | (scale[j] >> 4) << (2 * (j / 4)));
  }
}

// IQ4_XS: the 6-bit scale code ls_j (0..63; the scale is ls_j - 32) of sub-block j < 8.
inline int iq4xs_scale(const BlockIQ4_XS& b, int j) {
  const int h = b.scales_h[0] | b.scales_h[1] << 8;
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 15) | ((h >> (2 * j)) & 3) << 4;
}
// All 8 codes, byte j of a little-endian 64-bit word (the nibbles of scales_l and the 2-bit fields of
// scales_h spread to one byte each).
inline uint64_t iq4xs_scale_codes(const BlockIQ4_XS& b) {
  uint32_t l;
  std::memcpy(&l, b.scales_l, 4);
  uint64_t lo = l;  // byte i to 16-bit slot i, then its two nibbles to bytes 2i, 2i + 1
  lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull;
  lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
  lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
  uint64_t hi = static_cast<uint64_t>(b.scales_h[0] | b.scales_h[1] << 8);  // 2-bit field j to byte j
  hi = (hi | hi << 24) & 0x000000FF000000FFull;
  hi = (hi | hi << 12) & 0x000F000F000F000Full;
  hi = (hi | hi << 6) & 0x0303030303030303ull;
  return lo | hi << 4;
}
// Bytes of 6-bit codes c (0..63) to the int8 bytes of c - 32, all 8 at once.
inline uint64_t minus32_codes(uint64_t codes) {
  const uint64_t s = codes ^ 0x2020202020202020ull;  // c - 32 as 6-bit two's complement
  return s | (s & 0x2020202020202020ull) * 6;         // sign bit 5 copied to bits 6, 7
}

}  // namespace towers::simd

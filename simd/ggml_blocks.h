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
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
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

// 16 sub-blocks of 16; scales[j]: 4-bit scale (low) and min (high) of sub-block j; 2-bit quants.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  Half d;
  Half dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16 with 6-bit scales; 2 low bits in qs, the third in hmask.
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
template <GgmlType t>
using BlockOf = typename BlockTypeOf<t>::type;

// Elements and bytes per block of a type (plain floats: 1 element); {0, 0} for ids not listed above.
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

}  // namespace towers::simd

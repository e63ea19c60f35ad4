// Scalar IEEE binary16 (f16) and bfloat16 (bf16) conversions, the one copy for engine/ and simd/.
//
// fp16_to_f32 is exact for every f16 (a signaling NaN comes out quiet, payload kept, as F16C's
// vcvtph2ps and Highway's PromoteTo give it), so vector kernels that widen f16 with Highway get the
// same f32 values. f32_to_fp16 rounds to nearest, ties to even (ggml's GGML_FP32_TO_FP16): above
// 65504 to the largest half or infinity, NaN to a quiet NaN of the same sign. Both are ggml's portable
// conversions (after Maratyszcza's FP16 library): branch-free float arithmetic, no table.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace towers::simd {

inline float fp16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent and mantissa at the top, sign shifted out

  // Normal numbers, inf and NaN: move exponent and mantissa into f32 position and rebias with an
  // exponent offset of 224 followed by a multiply by 2^-112 (which also quiets a signaling NaN).
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = std::bit_cast<float>((two_w >> 4) + exp_offset) * exp_scale;

  // Zero and subnormals: put the mantissa into a float of magnitude [0.5, 1) and subtract 0.5.
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | magic_mask) - magic_bias;

  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t bits = sign | (two_w < denormalized_cutoff ? std::bit_cast<uint32_t>(denormalized)
                                                            : std::bit_cast<uint32_t>(normalized));
  return std::bit_cast<float>(bits);
}

inline uint16_t f32_to_fp16(float f) {
  // |f| * 2^112 overflows to inf exactly when |f| is too large for a half; the product * 2^-110
  // is then |f| * 4 (or inf).
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;

  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;  // subnormal halves share the smallest bias

  // Adding a power of two 11 binary places above |f|'s leading bit (or the fixed one used for half
  // subnormals) makes the float adder round |f| to 10 mantissa bits, nearest even; the half's
  // exponent and mantissa are then read off the sum's bits.
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  const bool is_nan = shl1_w > 0xFF000000u;
  return static_cast<uint16_t>((sign >> 16) | (is_nan ? 0x7E00u : nonsign));
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest, ties to even (overflows to inf like ggml); NaN stays NaN (quiet bit forced).
inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 64u);
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace towers::simd

// Scalar readers and writers of ggml's tensor block formats.
//
// Dequantization reproduces ggml's dequantize_row_* (ggml-quants.c) bit for bit: same block layouts,
// same float operations in the same order. Note that in every format the products (half d times an
// integer scale times an integer quant: at most 11 + 7 + 5 significant bits) are exact in f32, so
// each element is the correctly rounded value of its formula, with at most one rounding (the final
// "+ m" / "- dmin*min"). Faster kernels may therefore reassociate the products or use FMA and still
// match bit for bit.
// Quantization follows ggml's *_ref quantizers (quantize_row_q4_0_ref, ..., quantize_row_q6_K_ref)
// step by step, so in practice it also writes the same bytes as ggml.
//
// Blocks are read and written byte by byte at fixed offsets: no struct overlays, no alignment
// assumptions, multi-byte fields are little-endian as in GGUF files.
#include "engine/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace towers {

// ---------------------------------------------------------------------------------------------
// f16 / bf16 scalars
// ---------------------------------------------------------------------------------------------

// The portable conversion ggml uses when the CPU has no F16C instruction (after Maratyszcza's FP16
// library); ggml fills its fp16->f32 table with it, and uses the f32->fp16 direction directly.
float fp16_to_f32(uint16_t h) {
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

uint16_t f32_to_fp16(float f) {
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

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncate and force the quiet bit
    return static_cast<uint16_t>((u >> 16) | 64u);
  }
  // Round to nearest, ties to even (overflows to inf like ggml).
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Byte access
// ---------------------------------------------------------------------------------------------

inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline void store_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline float load_half(const uint8_t* p) { return fp16_to_f32(load_u16(p)); }
inline void store_half(uint8_t* p, float v) { store_u16(p, f32_to_fp16(v)); }

// ---------------------------------------------------------------------------------------------
// Block layouts (offsets in bytes). Sizes match ggml_type.cc.
// ---------------------------------------------------------------------------------------------

constexpr int QK = 32;    // elements per block of the simple formats
constexpr int QK_K = 256; // elements per super-block of the k-quants

// block_q4_0 { half d; uint8 qs[16]; }                               18 bytes
// block_q4_1 { half d; half m; uint8 qs[16]; }                       20 bytes
// block_q5_0 { half d; uint8 qh[4]; uint8 qs[16]; }                  22 bytes
// block_q8_0 { half d; int8 qs[32]; }                                34 bytes
// block_q4_K { half d; half dmin; uint8 scales[12]; uint8 qs[128]; } 144 bytes
// block_q5_K { half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; } 176 bytes
// block_q6_K { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d; }             210 bytes
constexpr size_t kQ4_0Bytes = 18, kQ4_1Bytes = 20, kQ5_0Bytes = 22, kQ8_0Bytes = 34;
constexpr size_t kQ4_KBytes = 144, kQ5_KBytes = 176, kQ6_KBytes = 210;

// The 8 six-bit (scale, min) pairs of a q4_K/q5_K super-block packed in 12 bytes:
//   j < 4:  scale = q[j] & 63,                          min = q[j+4] & 63
//   j >= 4: scale = (q[j+4] & 15) | (q[j-4] >> 6) << 4, min = (q[j+4] >> 4) | (q[j] >> 6) << 4
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Inverse of get_scale_min_k4 for all 8 pairs (each value already in [0, 63]).
void pack_scale_min_k4(const uint8_t* scales, const uint8_t* mins, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = scales[j], lm = mins[j];
    if (j < 4) {
      q[j] = static_cast<uint8_t>(q[j] | ls);
      q[j + 4] = static_cast<uint8_t>(q[j + 4] | lm);
    } else {
      q[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((ls >> 4) << 6));
      q[j] = static_cast<uint8_t>(q[j] | ((lm >> 4) << 6));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dequantization (one block each; y receives the block's elements)
// ---------------------------------------------------------------------------------------------

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < QK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + QK / 2] = static_cast<float>(x1) * d;
  }
}

void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float m = load_half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < QK / 2; ++j) {
    const int x0 = qs[j] & 0x0F;
    const int x1 = qs[j] >> 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + QK / 2] = static_cast<float>(x1) * d + m;
  }
}

void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint32_t qh = load_u32(b + 2);  // bit j = 5th bit of element j
  const uint8_t* qs = b + 6;
  for (int j = 0; j < QK / 2; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + QK / 2)) & 1u) << 4;
    const int x0 = ((qs[j] & 0x0F) | h0) - 16;
    const int x1 = ((qs[j] >> 4) | h1) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + QK / 2] = static_cast<float>(x1) * d;
  }
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  for (int j = 0; j < QK; ++j) {
    y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}

// q4_K: 8 sub-blocks of 32; x = (d*scale_j) * q - (dmin*min_j). Sub-blocks 2k and 2k+1 share the
// 32 bytes qs[32k..32k+31]: low nibbles for 2k, high nibbles for 2k+1.
void dequant_q4_K(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float dmin = load_half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, m;
    get_scale_min_k4(is, scales, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    get_scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
  }
}

// q5_K: like q4_K with a fifth bit per element in qh[l]: bit 2k for sub-block 2k, bit 2k+1 for
// sub-block 2k+1 (element l of each).
void dequant_q5_K(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const float dmin = load_half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, m;
    get_scale_min_k4(is, scales, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    get_scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const uint8_t u1 = static_cast<uint8_t>(1u << is), u2 = static_cast<uint8_t>(2u << is);
    for (int l = 0; l < 32; ++l) {
      const int v = (ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0);
      *y++ = d1 * static_cast<float>(v) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int v = (ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0);
      *y++ = d2 * static_cast<float>(v) - m2;
    }
    ql += 32;
  }
}

// q6_K: 16 sub-blocks of 16 with int8 scales; x = (d*scale) * (q - 32), q 6 bits. Each half of
// 128 elements uses 64 bytes of ql and 32 of qh: element l (l < 32) of the four quarters is
//   quarter 0: ql[l] low nibble,    qh[l] bits 0-1
//   quarter 1: ql[l+32] low nibble, qh[l] bits 2-3
//   quarter 2: ql[l] high nibble,   qh[l] bits 4-5
//   quarter 3: ql[l+32] high nibble, qh[l] bits 6-7
void dequant_q6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_half(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// ---------------------------------------------------------------------------------------------
// Quantization helpers (ggml's, same arithmetic)
// ---------------------------------------------------------------------------------------------

constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5*2^23 leaves the integer in the low
// mantissa bits.
inline int nearest_int(float v) {
  const float t = v + 12582912.f;
  return static_cast<int>(std::bit_cast<uint32_t>(t) & 0x007FFFFFu) - 0x00400000;
}

// Symmetric quantization of n values to L[i] in [0, 2*nmax) meaning (L[i] - nmax) * scale; returns
// scale. Tries 19 candidate inverse scales around nmax/max and keeps the one with the smallest
// error weighted by x^2 (ggml's make_qx_quants with rmse_type 1 and no importance weights).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  auto level = [nmax](float v) { return std::max(-nmax, std::min(nmax - 1, nearest_int(v))); };

  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale * x[i]);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale * x[i]);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale * x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Asymmetric quantization of n values to L[i] in [0, nmax] meaning scale * L[i] - the_min, with
// the_min >= 0; returns scale. Starts from the min/max grid, then tries nstep+1 grids with
// (nmax + rmin + rdelta*is) levels over [min, max], fitting scale and min by weighted least squares
// for each and keeping the one with the smallest weighted squared error (ggml's make_qkx2_quants
// with use_mad = false).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = diff * diff;
    best_err += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = diff * diff;
        err += weights[i] * diff;
      }
      if (err < best_err) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_err = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ---------------------------------------------------------------------------------------------
// Quantization (one block each)
// ---------------------------------------------------------------------------------------------

// Value of largest magnitude (first one on ties), as in ggml's q4_0/q5_0 quantizers.
float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// q4_0: d = max / -8 so the extreme value maps to level 0 exactly; q = trunc(x/d + 8.5) clamped.
void quant_q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, QK) / -8;
  const float id = d ? 1.0f / d : 0.0f;
  store_half(b, d);
  for (int j = 0; j < QK / 2; ++j) {
    const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int q1 = std::min(15, static_cast<int>(x[j + QK / 2] * id + 8.5f));
    b[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

void quant_q4_1(const float* x, uint8_t* b) {
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int j = 0; j < QK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15;
  const float id = d ? 1.0f / d : 0.0f;
  store_half(b, d);
  store_half(b + 2, min);
  for (int j = 0; j < QK / 2; ++j) {
    const int q0 = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
    const int q1 = std::min(15, static_cast<int>((x[j + QK / 2] - min) * id + 0.5f));
    b[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

void quant_q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, QK) / -16;
  const float id = d ? 1.0f / d : 0.0f;
  store_half(b, d);
  uint32_t qh = 0;
  for (int j = 0; j < QK / 2; ++j) {
    const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    const int q1 = std::min(31, static_cast<int>(x[j + QK / 2] * id + 16.5f));
    b[6 + j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + QK / 2);
  }
  store_u32(b + 2, qh);
}

void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  store_half(b, d);
  for (int j = 0; j < QK; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  }
}

// Shared by q4_K (nmax 15) and q5_K (nmax 31): per-sub-block scale/min search, then 6-bit scales
// and mins relative to the super-block's d and dmin, then the final levels with those rounded
// scales. L receives the 256 levels.
void quant_k_scales(const float* x, int nmax, float rmin, int nstep, uint8_t* b, uint8_t* L) {
  float scales[8], mins[8], weights[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;  // scales are positive since the min is subtracted
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::clamp(nearest_int(inv_scale * scales[j]), 0, 63));
    lm[j] = static_cast<uint8_t>(std::clamp(nearest_int(inv_min * mins[j]), 0, 63));
  }
  pack_scale_min_k4(ls, lm, b + 4);
  store_half(b, max_scale / 63.f);
  store_half(b + 2, max_min / 63.f);

  const float d_all = load_half(b), dmin_all = load_half(b + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, b + 4, sc, m);
    const float d = d_all * static_cast<float>(sc);
    if (!d) continue;  // keep make_qkx2_quants' levels (they decode to -dm anyway)
    const float dm = dmin_all * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
    }
  }
}

void quant_q4_K(const float* x, uint8_t* b) {
  uint8_t L[QK_K];
  quant_k_scales(x, 15, -1.f, 20, b, L);
  uint8_t* q = b + 16;
  for (int j = 0; j < QK_K; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

void quant_q5_K(const float* x, uint8_t* b) {
  uint8_t L[QK_K];
  quant_k_scales(x, 31, -0.5f, 15, b, L);
  uint8_t* qh = b + 16;
  uint8_t* ql = b + 48;
  std::memset(qh, 0, 32);
  for (int n = 0, pair = 0; n < QK_K; n += 64, ++pair) {
    const uint8_t m1 = static_cast<uint8_t>(1u << (2 * pair)), m2 = static_cast<uint8_t>(2u << (2 * pair));
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] |= m1;
      }
      if (l2 > 15) {
        l2 -= 16;
        qh[j] |= m2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    ql += 32;
  }
}

void quant_q6_K(const float* x, uint8_t* b) {
  int8_t L[QK_K];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    if (std::fabs(scale) > max_abs_scale) {
      max_abs_scale = std::fabs(scale);
      max_scale = scale;
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(b, 0, kQ6_KBytes);
    store_half(b + 208, 0.f);
    return;
  }
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  const float iscale = -128.f / max_scale;
  store_half(b + 208, 1 / iscale);
  for (int ib = 0; ib < 16; ++ib) {
    sc[ib] = static_cast<int8_t>(std::clamp(nearest_int(iscale * scales[ib]), -128, 127));
  }
  const float d_all = load_half(b + 208);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (!d) continue;
    for (int l = 0; l < 16; ++l) {
      const int q = std::clamp(nearest_int(x[16 * j + l] / d), -32, 31);
      L[16 * j + l] = static_cast<int8_t>(q + 32);
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < QK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

// Applies a per-block function over a row.
template <typename Fn>
void for_blocks_dequant(const void* src, float* dst, size_t n, size_t block_elems, size_t block_bytes, Fn fn) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n / block_elems; ++i) fn(p + i * block_bytes, dst + i * block_elems);
}

template <typename Fn>
void for_blocks_quant(const float* src, void* dst, size_t n, size_t block_elems, size_t block_bytes, Fn fn) {
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n / block_elems; ++i) fn(src + i * block_elems, p + i * block_bytes);
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, size_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(p + 2 * i));
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(p + 2 * i));
      return;
    case GgmlType::Q4_0: return for_blocks_dequant(src, dst, n, QK, kQ4_0Bytes, dequant_q4_0);
    case GgmlType::Q4_1: return for_blocks_dequant(src, dst, n, QK, kQ4_1Bytes, dequant_q4_1);
    case GgmlType::Q5_0: return for_blocks_dequant(src, dst, n, QK, kQ5_0Bytes, dequant_q5_0);
    case GgmlType::Q8_0: return for_blocks_dequant(src, dst, n, QK, kQ8_0Bytes, dequant_q8_0);
    case GgmlType::Q4_K: return for_blocks_dequant(src, dst, n, QK_K, kQ4_KBytes, dequant_q4_K);
    case GgmlType::Q5_K: return for_blocks_dequant(src, dst, n, QK_K, kQ5_KBytes, dequant_q5_K);
    case GgmlType::Q6_K: return for_blocks_dequant(src, dst, n, QK_K, kQ6_KBytes, dequant_q6_K);
    default:
      // Unsupported (callers check first): make any accidental use loud rather than plausible.
      std::fill(dst, dst + n, std::numeric_limits<float>::quiet_NaN());
      return;
  }
}

void quantize_row(GgmlType type, const float* src, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) store_u16(p + 2 * i, f32_to_fp16(src[i]));
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) store_u16(p + 2 * i, f32_to_bf16(src[i]));
      return;
    case GgmlType::Q4_0: return for_blocks_quant(src, dst, n, QK, kQ4_0Bytes, quant_q4_0);
    case GgmlType::Q4_1: return for_blocks_quant(src, dst, n, QK, kQ4_1Bytes, quant_q4_1);
    case GgmlType::Q5_0: return for_blocks_quant(src, dst, n, QK, kQ5_0Bytes, quant_q5_0);
    case GgmlType::Q8_0: return for_blocks_quant(src, dst, n, QK, kQ8_0Bytes, quant_q8_0);
    case GgmlType::Q4_K: return for_blocks_quant(src, dst, n, QK_K, kQ4_KBytes, quant_q4_K);
    case GgmlType::Q5_K: return for_blocks_quant(src, dst, n, QK_K, kQ5_KBytes, quant_q5_K);
    case GgmlType::Q6_K: return for_blocks_quant(src, dst, n, QK_K, kQ6_KBytes, quant_q6_K);
    default: {
      // Unsupported: write zero bytes if the geometry is known (callers check support first).
      const auto tr = ggml_type_traits(static_cast<uint32_t>(type));
      if (tr && tr->block_elems) std::memset(dst, 0, n / tr->block_elems * tr->block_bytes);
      return;
    }
  }
}

}  // namespace towers

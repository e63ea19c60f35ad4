// Scalar readers and writers of ggml's tensor block formats.
//
// Dequantization reproduces ggml's dequantize_row_* (ggml-quants.c) bit for bit: same block layouts,
// same float operations in the same order. Note that in every format the products (half d times an
// integer scale times an integer quant: at most 11 + 7 + 5 significant bits) are exact in f32, so
// each element is the correctly rounded value of its formula, with at most one rounding (the final
// "+ m" / "- dmin*min"). Faster kernels may therefore reassociate the products or use FMA and still
// match bit for bit.
// Quantization of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K follows ggml's *_ref quantizers
// step by step, so in practice it also writes the same bytes as ggml. Q2_K, Q3_K, IQ4_NL and IQ4_XS
// have simpler reference quantizers of our own (a per-sub-block scale search, then the super-block
// scales, then the levels again with the stored scales): valid blocks in ggml's layout, close to but
// not the bytes llama-quantize writes (its searches are longer, and it can use an importance matrix).
//
// Blocks are the structs of simd/ggml_blocks.h (alignment 1, little-endian fields), so a row may
// start at any address.
#include "engine/gguf/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "simd/ggml_blocks.h"

namespace towers {

namespace {

using simd::BlockIQ4_NL;
using simd::BlockIQ4_XS;
using simd::BlockQ2_K;
using simd::BlockQ3_K;
using simd::BlockQ4_0;
using simd::BlockQ4_1;
using simd::BlockQ4_K;
using simd::BlockQ5_0;
using simd::BlockQ5_1;
using simd::BlockQ5_K;
using simd::BlockQ6_K;
using simd::BlockQ8_0;
using simd::kQK;
using simd::kQK_K;

constexpr int QK = static_cast<int>(kQK);      // elements per block of the simple formats
constexpr int QK_K = static_cast<int>(kQK_K);  // elements per super-block of the k-quants

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// ---------------------------------------------------------------------------------------------
// Dequantization (one block each; y receives the block's elements). Layouts: simd/ggml_blocks.h.
// ---------------------------------------------------------------------------------------------

void dequant_q4_0(const BlockQ4_0& b, float* y) {
  const float d = b.d.to_f32();
  for (int j = 0; j < QK / 2; ++j) {
    const int x0 = (b.qs[j] & 0x0F) - 8;
    const int x1 = (b.qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + QK / 2] = static_cast<float>(x1) * d;
  }
}

void dequant_q4_1(const BlockQ4_1& b, float* y) {
  const float d = b.d.to_f32();
  const float m = b.m.to_f32();
  for (int j = 0; j < QK / 2; ++j) {
    const int x0 = b.qs[j] & 0x0F;
    const int x1 = b.qs[j] >> 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + QK / 2] = static_cast<float>(x1) * d + m;
  }
}

void dequant_q5_0(const BlockQ5_0& b, float* y) {
  const float d = b.d.to_f32();
  const uint32_t qh = load_u32(b.qh);  // bit j = 5th bit of element j
  for (int j = 0; j < QK / 2; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + QK / 2)) & 1u) << 4;
    const int x0 = ((b.qs[j] & 0x0F) | h0) - 16;
    const int x1 = ((b.qs[j] >> 4) | h1) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + QK / 2] = static_cast<float>(x1) * d;
  }
}

void dequant_q5_1(const BlockQ5_1& b, float* y) {
  const float d = b.d.to_f32();
  const float m = b.m.to_f32();
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < QK / 2; ++j) {
    const int x0 = (b.qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1u) << 4;
    const int x1 = (b.qs[j] >> 4) | static_cast<int>((qh >> (j + QK / 2)) & 1u) << 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + QK / 2] = static_cast<float>(x1) * d + m;
  }
}

void dequant_iq4_nl(const BlockIQ4_NL& b, float* y) {
  const float d = b.d.to_f32();
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * static_cast<float>(simd::kIq4nlValues[b.qs[j] & 0xF]);
    y[j + QK / 2] = d * static_cast<float>(simd::kIq4nlValues[b.qs[j] >> 4]);
  }
}

void dequant_iq4_xs(const BlockIQ4_XS& b, float* y) {
  const float d = b.d.to_f32();
  for (int ib = 0; ib < 8; ++ib) {
    const float dl = d * static_cast<float>(simd::iq4xs_scale(b, ib) - 32);
    const uint8_t* qs = b.qs + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * static_cast<float>(simd::kIq4nlValues[qs[j] & 0xF]);
      y[32 * ib + j + 16] = dl * static_cast<float>(simd::kIq4nlValues[qs[j] >> 4]);
    }
  }
}

// Q2_K and Q3_K: the 2-bit field of element e (layout in simd/ggml_blocks.h).
inline int low2_k(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

void dequant_q2_K(const BlockQ2_K& b, float* y) {
  const float d = b.d.to_f32();
  const float dmin = b.dmin.to_f32();
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(b.scales[s] & 0xF), ml = dmin * static_cast<float>(b.scales[s] >> 4);
    for (int l = 0; l < 16; ++l) y[16 * s + l] = dl * static_cast<float>(low2_k(b.qs, 16 * s + l)) - ml;
  }
}

void dequant_q3_K(const BlockQ3_K& b, float* y) {
  const float d = b.d.to_f32();
  uint8_t sc[16];
  simd::unpack_scales_q3k(b.scales, sc);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(sc[s] - 32);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * s + l;
      const int high = (b.hmask[e % 32] >> (e / 32)) & 1;
      y[e] = dl * static_cast<float>(low2_k(b.qs, e) - (high ? 0 : 4));
    }
  }
}

void dequant_q8_0(const BlockQ8_0& b, float* y) {
  const float d = b.d.to_f32();
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

// Q4_K and Q5_K: x = (d * scale_j) * q - dmin * min_j per sub-block j of 32; q5 adds the fifth bits.
template <class Block>
void dequant_k45(const Block& b, float* y) {
  const float d = b.d.to_f32();
  const float dmin = b.dmin.to_f32();
  uint8_t sc[8], mn[8];
  simd::unpack_scale_min_k4(b.scales, sc, mn);
  const uint8_t* q = b.qs;
  for (int is = 0; is < 8; is += 2) {
    const float d1 = d * static_cast<float>(sc[is]), m1 = dmin * static_cast<float>(mn[is]);
    const float d2 = d * static_cast<float>(sc[is + 1]), m2 = dmin * static_cast<float>(mn[is + 1]);
    int hi1[32] = {}, hi2[32] = {};  // fifth bits, as 16 or 0
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {
      for (int l = 0; l < 32; ++l) {
        hi1[l] = (b.qh[l] >> is) & 1 ? 16 : 0;
        hi2[l] = (b.qh[l] >> (is + 1)) & 1 ? 16 : 0;
      }
    }
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] & 0xF) + hi1[l]) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((q[l] >> 4) + hi2[l]) - m2;
    q += 32;
  }
}

void dequant_q6_K(const BlockQ6_K& b, float* y) {
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  const int8_t* sc = b.scales;
  const float d = b.d.to_f32();
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
void quant_q4_0(const float* x, BlockQ4_0& b) {
  const float d = signed_absmax(x, QK) / -8;
  const float id = d ? 1.0f / d : 0.0f;
  b.d.set(d);
  for (int j = 0; j < QK / 2; ++j) {
    const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int q1 = std::min(15, static_cast<int>(x[j + QK / 2] * id + 8.5f));
    b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// Q4_1 and Q5_1: d = (max - min) / nmax, m = min, q = trunc((x - min) / d + 0.5) clamped; Q5_1's
// fifth bits as Q5_0's.
template <class Block>
void quant_affine(const float* x, Block& b) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_1>;
  constexpr int nmax = kQ5 ? 31 : 15;
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int j = 0; j < QK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / nmax;
  const float id = d ? 1.0f / d : 0.0f;
  b.d.set(d);
  b.m.set(min);
  uint32_t qh = 0;
  for (int j = 0; j < QK / 2; ++j) {
    const int q0 = std::min(nmax, static_cast<int>((x[j] - min) * id + 0.5f));
    const int q1 = std::min(nmax, static_cast<int>((x[j + QK / 2] - min) * id + 0.5f));
    b.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + QK / 2);
  }
  if constexpr (kQ5) store_u32(b.qh, qh);
}

void quant_q5_0(const float* x, BlockQ5_0& b) {
  const float d = signed_absmax(x, QK) / -16;
  const float id = d ? 1.0f / d : 0.0f;
  b.d.set(d);
  uint32_t qh = 0;
  for (int j = 0; j < QK / 2; ++j) {
    const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    const int q1 = std::min(31, static_cast<int>(x[j + QK / 2] * id + 16.5f));
    b.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + QK / 2);
  }
  store_u32(b.qh, qh);
}

void quant_q8_0(const float* x, BlockQ8_0& b) {
  float amax = 0;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  b.d.set(d);
  for (int j = 0; j < QK; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
}

// Shared by q4_K (nmax 15) and q5_K (nmax 31): per-sub-block scale/min search, then 6-bit scales
// and mins relative to the super-block's d and dmin, then the final levels with those rounded
// scales. L receives the 256 levels.
template <class Block>
void quant_k_scales(const float* x, int nmax, float rmin, int nstep, Block& b, uint8_t* L) {
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
  simd::pack_scale_min_k4(ls, lm, b.scales);
  b.d.set(max_scale / 63.f);
  b.dmin.set(max_min / 63.f);

  const float d_all = b.d.to_f32(), dmin_all = b.dmin.to_f32();
  uint8_t sc[8], mn[8];
  simd::unpack_scale_min_k4(b.scales, sc, mn);
  for (int j = 0; j < 8; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (!d) continue;  // keep make_qkx2_quants' levels (they decode to -dm anyway)
    const float dm = dmin_all * static_cast<float>(mn[j]);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
    }
  }
}

void quant_q4_K(const float* x, BlockQ4_K& b) {
  uint8_t L[QK_K];
  quant_k_scales(x, 15, -1.f, 20, b, L);
  uint8_t* q = b.qs;
  for (int j = 0; j < QK_K; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

void quant_q5_K(const float* x, BlockQ5_K& b) {
  uint8_t L[QK_K];
  quant_k_scales(x, 31, -0.5f, 15, b, L);
  uint8_t* qh = b.qh;
  uint8_t* ql = b.qs;
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

void quant_q6_K(const float* x, BlockQ6_K& b) {
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
    std::memset(&b, 0, sizeof(b));
    b.d.set(0.f);
    return;
  }
  int8_t* sc = b.scales;
  const float iscale = -128.f / max_scale;
  b.d.set(1 / iscale);
  for (int ib = 0; ib < 16; ++ib) {
    sc[ib] = static_cast<int8_t>(std::clamp(nearest_int(iscale * scales[ib]), -128, 127));
  }
  const float d_all = b.d.to_f32();
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (!d) continue;
    for (int l = 0; l < 16; ++l) {
      const int q = std::clamp(nearest_int(x[16 * j + l] / d), -32, 31);
      L[16 * j + l] = static_cast<int8_t>(q + 32);
    }
  }
  uint8_t* ql = b.ql;
  uint8_t* qh = b.qh;
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

// Q2_K and Q3_K: writes the 256 levels L (2 bits) into qs (layout in simd/ggml_blocks.h).
void pack_low2_k(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* Lh = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(Lh[0] | Lh[32] << 2 | Lh[64] << 4 | Lh[96] << 6);
    }
  }
}

// Q2_K: per sub-block of 16 an asymmetric 2-bit fit (make_qkx2_quants, weights |x|), 4-bit scales
// and mins relative to d and dmin, then the levels again with the stored scales.
void quant_q2_K(const float* x, BlockQ2_K& b) {
  uint8_t L[QK_K], Laux[16];
  float scales[16], mins[16], weights[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 15.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 15.f / max_min : 0.f;
  for (int j = 0; j < 16; ++j) {
    const int ls = std::clamp(nearest_int(inv_scale * scales[j]), 0, 15);
    const int lm = std::clamp(nearest_int(inv_min * mins[j]), 0, 15);
    b.scales[j] = static_cast<uint8_t>(ls | lm << 4);
  }
  b.d.set(max_scale / 15.f);
  b.dmin.set(max_min / 15.f);
  const float d_all = b.d.to_f32(), dmin_all = b.dmin.to_f32();
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(b.scales[j] & 0xF);
    if (!d) continue;
    const float dm = dmin_all * static_cast<float>(b.scales[j] >> 4);
    for (int l = 0; l < 16; ++l) {
      L[16 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
    }
  }
  pack_low2_k(L, b.qs);
}

// Q3_K: per sub-block of 16 a symmetric 3-bit fit (make_qx_quants), 6-bit signed scales relative to
// d, then the levels again with the stored scales.
void quant_q3_K(const float* x, BlockQ3_K& b) {
  int8_t Ls[QK_K];
  float scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = make_qx_quants(16, 4, x + 16 * j, Ls + 16 * j);
    if (std::fabs(scales[j]) > amax) {
      amax = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::memset(&b, 0, sizeof(b));
  uint8_t sc[16];
  const float iscale = amax < kGroupMaxEps ? 0.f : -32.f / max_scale;
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * scales[j]), -32, 31) + 32);
  simd::pack_scales_q3k(sc, b.scales);
  b.d.set(iscale ? 1 / iscale : 0.f);
  const float d_all = b.d.to_f32();
  uint8_t L[QK_K];
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(sc[j] - 32);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * j + l;
      L[e] = static_cast<uint8_t>(d ? std::clamp(nearest_int(x[e] / d), -4, 3) + 4 : 4);
    }
  }
  for (int e = 0; e < QK_K; ++e) {
    if (L[e] > 3) {
      b.hmask[e % 32] = static_cast<uint8_t>(b.hmask[e % 32] | 1u << (e / 32));
      L[e] = static_cast<uint8_t>(L[e] - 4);
    }
  }
  pack_low2_k(L, b.qs);
}

// Index of the IQ4 value nearest to v (ties to the lower index).
uint8_t iq4_index(float v) {
  const int8_t* k = simd::kIq4nlValues;
  int lo = 0;
  while (lo < 15 && std::fabs(static_cast<float>(k[lo + 1]) - v) < std::fabs(static_cast<float>(k[lo]) - v)) ++lo;
  return static_cast<uint8_t>(lo);
}

// The scale of 32 values as x ~ scale * kIq4nlValues[L]: tries 15 inverse scales around the one that
// maps the value of largest magnitude onto -127 and keeps the weighted (x^2) least-squares best.
float iq4_fit(const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, 32);
    return 0.f;
  }
  float best = -1, scale = 0;
  uint8_t Lt[32];
  for (int itry = -7; itry <= 7; ++itry) {
    const float id = (static_cast<float>(itry) + simd::kIq4nlValues[0]) / max;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      Lt[j] = iq4_index(id * x[j]);
      const float q = simd::kIq4nlValues[Lt[j]], w = x[j] * x[j];
      sumqx += w * q * x[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      scale = sumqx / sumq2;
      best = scale * sumqx;
      std::memcpy(L, Lt, 32);
    }
  }
  return scale;
}

// IQ4 indices of 32 values for the stored scale d (low | high nibble pairs, as Q4_0).
void iq4_pack(const float* x, float d, uint8_t* qs) {
  const float id = d ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(iq4_index(id * x[j]) | iq4_index(id * x[j + 16]) << 4);
}

void quant_iq4_nl(const float* x, BlockIQ4_NL& b) {
  uint8_t L[32];
  b.d.set(iq4_fit(x, L));
  iq4_pack(x, b.d.to_f32(), b.qs);
}

void quant_iq4_xs(const float* x, BlockIQ4_XS& b) {
  uint8_t L[32];
  float scales[8], max_scale = 0, amax = 0;
  for (int j = 0; j < 8; ++j) {
    scales[j] = iq4_fit(x + 32 * j, L);
    if (std::fabs(scales[j]) > amax) {
      amax = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::memset(&b, 0, sizeof(b));
  b.d.set(amax < kGroupMaxEps ? 0.f : -max_scale / 32);
  const float d = b.d.to_f32(), id = d ? 1.0f / d : 0.0f;
  uint16_t h = 0;
  for (int j = 0; j < 8; ++j) {
    const int l = std::clamp(nearest_int(id * scales[j]), -32, 31);
    b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | ((l + 32) & 15) << (4 * (j % 2)));
    h = static_cast<uint16_t>(h | ((l + 32) >> 4) << (2 * j));
    iq4_pack(x + 32 * j, d * static_cast<float>(l), b.qs + 16 * j);
  }
  b.scales_h[0] = static_cast<uint8_t>(h);
  b.scales_h[1] = static_cast<uint8_t>(h >> 8);
}

// Applies a per-block function over a row of Block structs (n elements, kElems per block).
template <class Block, size_t kElems>
void for_blocks_dequant(const void* src, float* dst, size_t n, void (*fn)(const Block&, float*)) {
  const auto* blocks = static_cast<const Block*>(src);
  for (size_t i = 0; i < n / kElems; ++i) fn(blocks[i], dst + i * kElems);
}

template <class Block, size_t kElems>
void for_blocks_quant(const float* src, void* dst, size_t n, void (*fn)(const float*, Block&)) {
  auto* blocks = static_cast<Block*>(dst);
  for (size_t i = 0; i < n / kElems; ++i) fn(src + i * kElems, blocks[i]);
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, size_t n) {
  const auto* halves = static_cast<const simd::Half*>(src);  // F16 and BF16: two bytes each
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = halves[i].to_f32();
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(halves[i].bits());
      return;
    case GgmlType::Q4_0: return for_blocks_dequant<BlockQ4_0, kQK>(src, dst, n, dequant_q4_0);
    case GgmlType::Q4_1: return for_blocks_dequant<BlockQ4_1, kQK>(src, dst, n, dequant_q4_1);
    case GgmlType::Q5_0: return for_blocks_dequant<BlockQ5_0, kQK>(src, dst, n, dequant_q5_0);
    case GgmlType::Q5_1: return for_blocks_dequant<BlockQ5_1, kQK>(src, dst, n, dequant_q5_1);
    case GgmlType::Q8_0: return for_blocks_dequant<BlockQ8_0, kQK>(src, dst, n, dequant_q8_0);
    case GgmlType::IQ4_NL: return for_blocks_dequant<BlockIQ4_NL, kQK>(src, dst, n, dequant_iq4_nl);
    case GgmlType::Q2_K: return for_blocks_dequant<BlockQ2_K, kQK_K>(src, dst, n, dequant_q2_K);
    case GgmlType::Q3_K: return for_blocks_dequant<BlockQ3_K, kQK_K>(src, dst, n, dequant_q3_K);
    case GgmlType::IQ4_XS: return for_blocks_dequant<BlockIQ4_XS, kQK_K>(src, dst, n, dequant_iq4_xs);
    case GgmlType::Q4_K: return for_blocks_dequant<BlockQ4_K, kQK_K>(src, dst, n, dequant_k45<BlockQ4_K>);
    case GgmlType::Q5_K: return for_blocks_dequant<BlockQ5_K, kQK_K>(src, dst, n, dequant_k45<BlockQ5_K>);
    case GgmlType::Q6_K: return for_blocks_dequant<BlockQ6_K, kQK_K>(src, dst, n, dequant_q6_K);
    default:
      // Unsupported (callers check first): make any accidental use loud rather than plausible.
      std::fill(dst, dst + n, std::numeric_limits<float>::quiet_NaN());
      return;
  }
}

void quantize_row(GgmlType type, const float* src, void* dst, size_t n) {
  auto* halves = static_cast<simd::Half*>(dst);  // F16 and BF16: two bytes each
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) halves[i].set_bits(f32_to_fp16(src[i]));
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) halves[i].set_bits(f32_to_bf16(src[i]));
      return;
    case GgmlType::Q4_0: return for_blocks_quant<BlockQ4_0, kQK>(src, dst, n, quant_q4_0);
    case GgmlType::Q4_1: return for_blocks_quant<BlockQ4_1, kQK>(src, dst, n, quant_affine<BlockQ4_1>);
    case GgmlType::Q5_0: return for_blocks_quant<BlockQ5_0, kQK>(src, dst, n, quant_q5_0);
    case GgmlType::Q5_1: return for_blocks_quant<BlockQ5_1, kQK>(src, dst, n, quant_affine<BlockQ5_1>);
    case GgmlType::Q8_0: return for_blocks_quant<BlockQ8_0, kQK>(src, dst, n, quant_q8_0);
    case GgmlType::IQ4_NL: return for_blocks_quant<BlockIQ4_NL, kQK>(src, dst, n, quant_iq4_nl);
    case GgmlType::Q2_K: return for_blocks_quant<BlockQ2_K, kQK_K>(src, dst, n, quant_q2_K);
    case GgmlType::Q3_K: return for_blocks_quant<BlockQ3_K, kQK_K>(src, dst, n, quant_q3_K);
    case GgmlType::IQ4_XS: return for_blocks_quant<BlockIQ4_XS, kQK_K>(src, dst, n, quant_iq4_xs);
    case GgmlType::Q4_K: return for_blocks_quant<BlockQ4_K, kQK_K>(src, dst, n, quant_q4_K);
    case GgmlType::Q5_K: return for_blocks_quant<BlockQ5_K, kQK_K>(src, dst, n, quant_q5_K);
    case GgmlType::Q6_K: return for_blocks_quant<BlockQ6_K, kQK_K>(src, dst, n, quant_q6_K);
    default: {
      // Unsupported: write zero bytes if the geometry is known (callers check support first).
      const auto tr = ggml_type_traits(static_cast<uint32_t>(type));
      if (tr && tr->block_elems) std::memset(dst, 0, n / tr->block_elems * tr->block_bytes);
      return;
    }
  }
}

}  // namespace towers

// int8 attention for long prefill (kv_attend_int8): another arithmetic than kv_attend's, used only in
// the steps that take the oneDNN prefill kernels, never by the codec (docs/numerics.md, "int8
// prefill attention"). Per block of up to kInt8MaxKeys rows of F32 or F16 K and V:
//
// Scores. mu = the block's mean key; each key's centred elements k - mu are quantized per 32-element
// group to int8 (sk = max|k - mu| / 127, round to nearest even), each query's elements likewise (once
// per call, sq). Then
//   score(q, k) = q·mu + sum_b (sk_b * sq_b) * sum_{e in b} q8_e * k8_e
// Why centre the keys: keys of real models carry large per-channel offsets, the same sign in most
// tokens (RoPE'd outlier channels); the block's mean takes them out of the int8 range, and q·mu,
// which is the same for every key of the block, is added back in f32.
//
// Weighted sums. Each value row is quantized to int8 with one scale (sv = max|v| / 127); per query
// and block the weights p'_j = p_j * sv_j are quantized to u8 (sp = max_j p'_j / 255, round to
// nearest even: the largest weight of the block gets 255 steps, one below 1/510 of it becomes 0), and
//   acc[e] = fma(sum_j p8_j * v8_j[e], sp, acc[e])
//
// The integer sums are exact (VNNI vpdpbusd: 4 products per lane where f32 does one; keys as
// u8 = k8 + 128, the offset taken back with 128 * sum q8) and every float step has a fixed order, so
// a result depends only on the query and the block's rows: never on the threads, the other queries of
// the call or how they are grouped.
//
// The kernels are x86 AVX-512 VNNI (raw intrinsics, like gemm_packed_vnni-inl.h);
// int8_attention_available says whether this CPU runs them. The *_reference functions give the same
// bits in portable C++ (the tests compare them).
#pragma once
#include <cstddef>
#include <cstdint>

#include "simd/kv_quant.h"

namespace towers::simd {

inline constexpr int kInt8MaxQueries = 64;
inline constexpr int kInt8MaxKeys = 128;
inline constexpr int kInt8Group = 32;  // elements per scale

// Up to kInt8MaxQueries queries of `dim` elements, quantized once per call.
struct Int8Queries {
  int n = 0, dim = 0;
  alignas(64) int32_t words[kInt8MaxQueries][kKvMaxDim / 4];  // codes of elements 4w .. 4w + 3, bits 0-7 first
  float scale[kInt8MaxQueries][kKvMaxDim / kInt8Group];       // sq_b
  int32_t offset[kInt8MaxQueries][kKvMaxDim / kInt8Group];    // 128 * sum of the group's codes
};

// One block of keys, centred and quantized, keys in lanes: 16 keys per group t. The arrays are
// packed for the block's dim (only their first (n / 16) * dim / 4 * 16 words are written), so a
// vector of them built for a long span touches ~dim bytes per key.
struct Int8Keys {
  Int8Keys() {}  // user-provided: a vector of them does not zero (touch) the arrays
  int n = 0, dim = 0;
  alignas(64) float mean[kKvMaxDim];
  alignas(64) uint32_t words[kInt8MaxKeys / 16 * kKvMaxDim / 4 * 16];        // [t][w][key]: codes + 128 of 4w .. 4w + 3
  alignas(64) float scale[kInt8MaxKeys / 16 * kKvMaxDim / kInt8Group * 16];  // [t][b][key]: sk_b, 0 past n
  uint32_t* word(int t, int w) { return words + (size_t(t) * (dim / 4) + w) * 16; }
  const uint32_t* word(int t, int w) const { return words + (size_t(t) * (dim / 4) + w) * 16; }
  float* scales(int t, int b) { return scale + (size_t(t) * ((dim + kInt8Group - 1) / kInt8Group) + b) * 16; }
  const float* scales(int t, int b) const {
    return scale + (size_t(t) * ((dim + kInt8Group - 1) / kInt8Group) + b) * 16;
  }
};

// One block of values: row j quantized to int8 with one scale, four rows per 32-bit word: word (i, e)
// holds the codes of rows 4i .. 4i + 3 at element e, row 4i in bits 0-7 (zeros past n). Packed for
// the block's dim like Int8Keys.
struct Int8Values {
  Int8Values() {}  // user-provided: a vector of them does not zero (touch) the arrays
  int n = 0, dim = 0;
  alignas(64) uint32_t words[kInt8MaxKeys / 4 * kKvMaxDim];  // [i][e]
  alignas(64) float scale[kInt8MaxKeys];                     // sv_j, 0 past n
  uint32_t* word(int i) { return words + size_t(i) * dim; }
  const uint32_t* word(int i) const { return words + size_t(i) * dim; }
};

// True when the int8 kernels run on this CPU (x86 with AVX-512 VNNI).
bool int8_attention_available();

// The kernels below run only when int8_attention_available() (elsewhere they give the reference's bits).
// Queries qv[g * dim ..] for g < n_q (n_q <= kInt8MaxQueries; F32/F16 dims, multiples of 8 up to 256).
void int8_queries(const float* qv, int n_q, int dim, Int8Queries* out);
// Keys k + j * stride for j < n (n <= kInt8MaxKeys), format F32 or F16 (kv_quant.h).
void int8_keys(KvQuant format, const uint8_t* k, size_t stride, int n, int dim, Int8Keys* out);
// s[(g - g0) * s_stride + j] = score of query g (g0 <= g < g0 + n_g) against key j < keys.n. qv: the
// f32 queries int8_queries was given (for q·mu).
void int8_scores(const Int8Queries& q, const float* qv, int g0, int n_g, const Int8Keys& keys, float* s,
                 size_t s_stride);
// Values v + j * stride for j < n (n <= kInt8MaxKeys), format F32 or F16.
void int8_values(KvQuant format, const uint8_t* v, size_t stride, int n, int dim, Int8Values* out);
// acc[g * dim + e] += the weighted sum of the values' rows for query g < n_g, weights p[g * p_stride + j]
// for j < values.n (those past it are not read).
void int8_accumulate(const float* p, size_t p_stride, int n_g, const Int8Values& values, float* acc);
// The same bits in portable scalar C++ (tests).
void int8_queries_reference(const float* qv, int n_q, int dim, Int8Queries* out);
void int8_keys_reference(KvQuant format, const uint8_t* k, size_t stride, int n, int dim, Int8Keys* out);
void int8_scores_reference(const Int8Queries& q, const float* qv, int g0, int n_g, const Int8Keys& keys, float* s,
                           size_t s_stride);
void int8_values_reference(KvQuant format, const uint8_t* v, size_t stride, int n, int dim, Int8Values* out);
void int8_accumulate_reference(const float* p, size_t p_stride, int n_g, const Int8Values& values, float* acc);

}  // namespace towers::simd

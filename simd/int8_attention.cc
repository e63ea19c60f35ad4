#include "simd/int8_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <hwy/targets.h>

#include "simd/f16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace towers::simd {
namespace {

int groups_of(int dim) { return (dim + kInt8Group - 1) / kInt8Group; }

// max|x| / levels and its inverse (0 and 0 for a group of zeros); the code of x is round(x * inv).
// levels: 127 for int8 codes, 255 for the u8 weights.
struct Int8Scale {
  float scale, inv;
};
Int8Scale int8_scale(float amax, float levels = 127.0f) {
  if (!(amax > 0)) return {0.0f, 0.0f};
  return {amax / levels, levels / amax};
}

int32_t int8_code(float x, float inv) {
  const float r = std::nearbyint(x * inv);  // ties to even (the default rounding mode)
  if (std::isnan(r)) return -127;           // what cvtps_epi32's 0x80000000 clamps to (no UB on NaN)
  return static_cast<int32_t>(std::clamp(r, -127.0f, 127.0f));
}

// q·mu in 16 lanes (lane i: elements i, 16 + i, ... as fused multiply-adds, zeros past dim), then the
// lanes added pairwise (i + 8, i + 4, i + 2, i + 1): the order the vector kernel uses.
float centre_dot(const float* q, const float* mean, int dim) {
  float part[16] = {};
  for (int e0 = 0; e0 < dim; e0 += 16) {
    for (int i = 0; i < 16; ++i) {
      const int e = e0 + i;
      part[i] = std::fma(e < dim ? q[e] : 0.0f, e < dim ? mean[e] : 0.0f, part[i]);
    }
  }
  for (int w = 8; w > 0; w /= 2) {
    for (int i = 0; i < w; ++i) part[i] = part[i] + part[i + w];
  }
  return part[0];
}

// Row j of F32/F16 vectors as f32 (F16 widens exactly).
void load_row(KvQuant format, const uint8_t* row, int dim, float* out) {
  if (format == KvQuant::F32) {
    std::memcpy(out, row, size_t(dim) * sizeof(float));
  } else {
    for (int e = 0; e < dim; ++e) {
      uint16_t h;
      std::memcpy(&h, row + 2 * size_t(e), 2);
      out[e] = fp16_to_f32(h);
    }
  }
}

// The u8 weights of one query over a block: p'_j = p_j * sv_j, sp = max p' / 255, codes round(p' * inv).
struct Int8Weights {
  float sp;
  uint8_t code[kInt8MaxKeys];
};
void int8_weights(const float* p, const Int8Values& values, Int8Weights* w) {
  float pq[kInt8MaxKeys];
  float pmax = 0;
  for (int j = 0; j < values.n; ++j) {
    pq[j] = p[j] * values.scale[j];
    pmax = std::max(pmax, pq[j]);
  }
  const Int8Scale s = int8_scale(pmax, 255.0f);
  w->sp = s.scale;
  for (int j = 0; j < kInt8MaxKeys; ++j) {
    const float r = j < values.n ? std::nearbyint(pq[j] * s.inv) : 0.0f;
    w->code[j] = std::isnan(r) ? 0 : static_cast<uint8_t>(std::clamp(r, 0.0f, 255.0f));
  }
}
}  // namespace

void int8_queries_reference(const float* qv, int n_q, int dim, Int8Queries* out) {
  out->n = n_q;
  out->dim = dim;
  const int ng = groups_of(dim);
  for (int g = 0; g < n_q; ++g) {
    const float* q = qv + size_t(g) * dim;
    for (int b = 0; b < ng; ++b) {
      const int e0 = b * kInt8Group, e1 = std::min(dim, e0 + kInt8Group);
      float amax = 0;
      for (int e = e0; e < e1; ++e) amax = std::max(amax, std::fabs(q[e]));
      const Int8Scale s = int8_scale(amax);
      int32_t sum = 0;
      for (int w = e0 / 4; w < e1 / 4; ++w) {
        uint32_t word = 0;
        for (int i = 0; i < 4; ++i) {
          const int32_t c = int8_code(q[4 * w + i], s.inv);
          sum += c;
          word |= static_cast<uint32_t>(static_cast<uint8_t>(static_cast<int8_t>(c))) << (8 * i);
        }
        out->words[g][w] = static_cast<int32_t>(word);
      }
      out->scale[g][b] = s.scale;
      out->offset[g][b] = 128 * sum;
    }
  }
}

void int8_keys_reference(KvQuant format, const uint8_t* k, size_t stride, int n, int dim, Int8Keys* out) {
  out->n = n;
  out->dim = dim;
  const int ng = groups_of(dim);
  // The keys as f32, rows of kKvMaxDim (F16 widens exactly).
  thread_local float rows[kInt8MaxKeys][kKvMaxDim];
  for (int j = 0; j < n; ++j) load_row(format, k + size_t(j) * stride, dim, rows[j]);
  // The block's mean: rows added in order, then divided by n.
  float* mean = out->mean;
  std::fill(mean, mean + dim, 0.0f);
  for (int j = 0; j < n; ++j) {
    for (int e = 0; e < dim; ++e) mean[e] += rows[j][e];
  }
  const float fn = static_cast<float>(n);
  for (int e = 0; e < dim; ++e) mean[e] = mean[e] / fn;
  // Lanes past n: codes 0 (u8 128) and scale 0.
  const int n_groups16 = (n + 15) / 16;
  for (int j = n; j < n_groups16 * 16; ++j) {
    for (int w = 0; w < dim / 4; ++w) out->word(j / 16, w)[j % 16] = 0x80808080u;
    for (int b = 0; b < ng; ++b) out->scales(j / 16, b)[j % 16] = 0.0f;
  }
  for (int j = 0; j < n; ++j) {
    float d[kKvMaxDim];
    for (int e = 0; e < dim; ++e) d[e] = rows[j][e] - mean[e];
    for (int b = 0; b < ng; ++b) {
      const int e0 = b * kInt8Group, e1 = std::min(dim, e0 + kInt8Group);
      float amax = 0;
      for (int e = e0; e < e1; ++e) amax = std::max(amax, std::fabs(d[e]));
      const Int8Scale s = int8_scale(amax);
      for (int w = e0 / 4; w < e1 / 4; ++w) {
        uint32_t word = 0;
        for (int i = 0; i < 4; ++i) {
          word |= static_cast<uint32_t>(int8_code(d[4 * w + i], s.inv) + 128) << (8 * i);
        }
        out->word(j / 16, w)[j % 16] = word;
      }
      out->scales(j / 16, b)[j % 16] = s.scale;
    }
  }
}

void int8_scores_reference(const Int8Queries& q, const float* qv, int g0, int n_g, const Int8Keys& keys, float* s,
                           size_t s_stride) {
  const int dim = keys.dim, ng = groups_of(dim);
  for (int g = g0; g < g0 + n_g; ++g) {
    const float qmu = centre_dot(qv + size_t(g) * dim, keys.mean, dim);
    for (int j = 0; j < keys.n; ++j) {
      const int t = j / 16, lane = j % 16;
      float acc = qmu;
      for (int b = 0; b < ng; ++b) {
        int32_t dot = 0;
        for (int w = b * kInt8Group / 4; w < std::min(dim, (b + 1) * kInt8Group) / 4; ++w) {
          const uint32_t kw = keys.word(t, w)[lane], qw = static_cast<uint32_t>(q.words[g][w]);
          for (int i = 0; i < 4; ++i) {
            dot += static_cast<int32_t>(static_cast<uint8_t>(kw >> (8 * i))) *
                   static_cast<int32_t>(static_cast<int8_t>(static_cast<uint8_t>(qw >> (8 * i))));
          }
        }
        acc = std::fma(static_cast<float>(dot - q.offset[g][b]), keys.scales(t, b)[lane] * q.scale[g][b], acc);
      }
      s[size_t(g - g0) * s_stride + j] = acc;
    }
  }
}

void int8_values_reference(KvQuant format, const uint8_t* v, size_t stride, int n, int dim, Int8Values* out) {
  out->n = n;
  out->dim = dim;
  std::fill(out->words, out->words + size_t((n + 3) / 4) * dim, 0u);
  for (int j = 0; j < kInt8MaxKeys; ++j) out->scale[j] = 0.0f;
  for (int j = 0; j < n; ++j) {
    float x[kKvMaxDim];
    load_row(format, v + size_t(j) * stride, dim, x);
    float amax = 0;
    for (int e = 0; e < dim; ++e) amax = std::max(amax, std::fabs(x[e]));
    const Int8Scale s = int8_scale(amax);
    for (int e = 0; e < dim; ++e) {
      out->word(j / 4)[e] |= static_cast<uint32_t>(static_cast<uint8_t>(static_cast<int8_t>(int8_code(x[e], s.inv))))
                             << (8 * (j % 4));
    }
    out->scale[j] = s.scale;
  }
}

void int8_accumulate_reference(const float* p, size_t p_stride, int n_g, const Int8Values& values, float* acc) {
  const int dim = values.dim;
  for (int g = 0; g < n_g; ++g) {
    Int8Weights w;
    int8_weights(p + size_t(g) * p_stride, values, &w);
    for (int e = 0; e < dim; ++e) {
      int32_t sum = 0;
      for (int j = 0; j < values.n; ++j) {
        sum += int32_t{w.code[j]} * static_cast<int8_t>(static_cast<uint8_t>(values.word(j / 4)[e] >> (8 * (j % 4))));
      }
      float& a = acc[size_t(g) * dim + e];
      a = std::fma(static_cast<float>(sum), w.sp, a);
    }
  }
}

#if defined(__x86_64__)
#define TOWERS_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
// GCC 12 warns that the intrinsics' _mm512_undefined_ps() pass-through "may be used uninitialized";
// the unmasked forms write every lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

// Lanes [e0, e0 + 16) of a vector of dim elements that exist (none when e0 >= dim).
TOWERS_INT8_TARGET inline __mmask16 LanesFrom(int e0, int dim) {
  if (dim - e0 >= 16) return __mmask16(0xFFFF);
  return dim <= e0 ? __mmask16(0) : static_cast<__mmask16>((1u << (dim - e0)) - 1);
}

// Elements [e0, e0 + 16) of an F32 or F16 vector as f32 (zeros past dim).
TOWERS_INT8_TARGET inline __m512 LoadKey(KvQuant format, const uint8_t* row, int e0, int dim) {
  const __mmask16 m = LanesFrom(e0, dim);
  if (format == KvQuant::F32) return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + e0);
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + e0));
}

// Elements [e0, e0 + 16) of a key minus the block's mean (zeros past dim: both load as zeros).
TOWERS_INT8_TARGET inline __m512 Centred(KvQuant format, const uint8_t* key, const float* mean, int e0, int dim) {
  return _mm512_sub_ps(LoadKey(format, key, e0, dim), _mm512_maskz_loadu_ps(LanesFrom(e0, dim), mean + e0));
}

// One 32-element group of x (in two vectors, zeros past dim): its scale and its codes round(x * inv)
// clamped to +-127 as int32 lanes: int8_code's operations, elementwise (max is exact in any order).
struct GroupCodes {
  Int8Scale s;
  __m512i c0, c1;
};
// int8_code on 16 lanes: round(x * inv) (ties to even), clamped to [lo, hi].
TOWERS_INT8_TARGET inline __m512i Codes(__m512 x, float inv, int lo, int hi) {
  const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inv)));
  return _mm512_min_epi32(_mm512_set1_epi32(hi), _mm512_max_epi32(_mm512_set1_epi32(lo), c));
}

TOWERS_INT8_TARGET inline GroupCodes QuantizeGroup(__m512 x0, __m512 x1) {
  const __m512 amax = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
  GroupCodes g;
  g.s = int8_scale(_mm512_reduce_max_ps(amax));
  g.c0 = Codes(x0, g.s.inv, -127, 127);
  g.c1 = Codes(x1, g.s.inv, -127, 127);
  return g;
}

TOWERS_INT8_TARGET void QueriesVnni(const float* qv, int n_q, int dim, Int8Queries* out) {
  out->n = n_q;
  out->dim = dim;
  const int ng = groups_of(dim);
  for (int g = 0; g < n_q; ++g) {
    const float* q = qv + size_t(g) * dim;
    for (int b = 0; b < ng; ++b) {
      const int e0 = b * kInt8Group;
      // Past dim the masked loads give zeros.
      const GroupCodes c = QuantizeGroup(_mm512_maskz_loadu_ps(LanesFrom(e0, dim), q + e0),
                                         _mm512_maskz_loadu_ps(LanesFrom(e0 + 16, dim), q + e0 + 16));
      // Codes past dim are 0: they add nothing to the sum and are not stored.
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(c.c0, c.c1));
      alignas(64) int8_t bytes[32];
      _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm512_cvtepi32_epi8(c.c0));
      _mm_store_si128(reinterpret_cast<__m128i*>(bytes + 16), _mm512_cvtepi32_epi8(c.c1));
      std::memcpy(&out->words[g][e0 / 4], bytes, size_t(std::min(dim, e0 + kInt8Group) - e0));
      out->scale[g][b] = c.s.scale;
      out->offset[g][b] = 128 * sum;
    }
  }
}

TOWERS_INT8_TARGET void KeysVnni(KvQuant format, const uint8_t* k, size_t stride, int n, int dim, Int8Keys* out) {
  out->n = n;
  out->dim = dim;
  const int ng = groups_of(dim), nv = (dim + 15) / 16;
  // The block's mean: rows added in order, then divided by n (the reference's operations per element).
  __m512 sum[kKvMaxDim / 16];
  for (int v = 0; v < nv; ++v) sum[v] = _mm512_setzero_ps();
  for (int j = 0; j < n; ++j) {
    const uint8_t* kj = k + size_t(j) * stride;
    for (int v = 0; v < nv; ++v) sum[v] = _mm512_add_ps(sum[v], LoadKey(format, kj, 16 * v, dim));
  }
  const __m512 fn = _mm512_set1_ps(static_cast<float>(n));
  for (int v = 0; v < nv; ++v)
    _mm512_mask_storeu_ps(out->mean + 16 * v, LanesFrom(16 * v, dim), _mm512_div_ps(sum[v], fn));
  for (int j = n; j < (n + 15) / 16 * 16; ++j) {
    for (int w = 0; w < dim / 4; ++w) out->word(j / 16, w)[j % 16] = 0x80808080u;
    for (int b = 0; b < ng; ++b) out->scales(j / 16, b)[j % 16] = 0.0f;
  }
  const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
  for (int j = 0; j < n; ++j) {
    const uint8_t* kj = k + size_t(j) * stride;
    const int lane = j % 16;
    for (int b = 0; b < ng; ++b) {
      const int e0 = b * kInt8Group;
      const GroupCodes c =
          QuantizeGroup(Centred(format, kj, out->mean, e0, dim), Centred(format, kj, out->mean, e0 + 16, dim));
      alignas(64) uint32_t w32[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(w32), _mm_xor_si128(_mm512_cvtepi32_epi8(c.c0), bias));
      _mm_store_si128(reinterpret_cast<__m128i*>(w32 + 4), _mm_xor_si128(_mm512_cvtepi32_epi8(c.c1), bias));
      const int nw = (std::min(dim, e0 + kInt8Group) - e0) / 4;
      for (int w = 0; w < nw; ++w) out->word(j / 16, e0 / 4 + w)[lane] = w32[w];
      out->scales(j / 16, b)[lane] = c.s.scale;
    }
  }
}

// NQ queries from g against the 16 * NK keys of groups t .. t + NK - 1: the reference's operations,
// 16 keys per vector. Each key word loaded serves NQ queries and each query word broadcast NK key
// groups; the loops over them are unrolled so that the NQ * NK accumulators live in registers.
template <int NQ, int NK>
TOWERS_INT8_TARGET inline void ScoresVnni(const Int8Queries& q, const float* qmu, int g, const Int8Keys& keys, int t,
                                          float* s, size_t s_stride) {
  const int dim = keys.dim, ng = groups_of(dim), words = dim / 4;
  __m512 sc[NQ][NK];
#pragma GCC unroll 16
  for (int i = 0; i < NQ; ++i) {
#pragma GCC unroll 16
    for (int u = 0; u < NK; ++u) sc[i][u] = _mm512_set1_ps(qmu[i]);
  }
  for (int b = 0; b < ng; ++b) {
    __m512i dot[NQ][NK];
#pragma GCC unroll 16
    for (int i = 0; i < NQ; ++i) {
#pragma GCC unroll 16
      for (int u = 0; u < NK; ++u) dot[i][u] = _mm512_setzero_si512();
    }
    const int w1 = std::min(words, (b + 1) * kInt8Group / 4);
#pragma GCC unroll 8
    for (int w = b * kInt8Group / 4; w < w1; ++w) {
      __m512i kw[NK];
#pragma GCC unroll 16
      for (int u = 0; u < NK; ++u) kw[u] = _mm512_load_si512(keys.word(t + u, w));
#pragma GCC unroll 16
      for (int i = 0; i < NQ; ++i) {
        const __m512i qw = _mm512_set1_epi32(q.words[g + i][w]);
#pragma GCC unroll 16
        for (int u = 0; u < NK; ++u) dot[i][u] = _mm512_dpbusd_epi32(dot[i][u], kw[u], qw);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NQ; ++i) {
      const __m512i off = _mm512_set1_epi32(q.offset[g + i][b]);
      const __m512 sq = _mm512_set1_ps(q.scale[g + i][b]);
#pragma GCC unroll 16
      for (int u = 0; u < NK; ++u) {
        const __m512 d = _mm512_maskz_cvtepi32_ps(__mmask16(0xFFFF), _mm512_sub_epi32(dot[i][u], off));
        sc[i][u] = _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_load_ps(keys.scales(t + u, b)), sq), sc[i][u]);
      }
    }
  }
#pragma GCC unroll 16
  for (int u = 0; u < NK; ++u) {
    const int cnt = std::min(16, keys.n - 16 * (t + u));
    const __mmask16 mask = static_cast<__mmask16>((1u << cnt) - 1);
#pragma GCC unroll 16
    for (int i = 0; i < NQ; ++i) _mm512_mask_storeu_ps(s + size_t(i) * s_stride + 16 * (t + u), mask, sc[i][u]);
  }
}

TOWERS_INT8_TARGET float CentreDotVnni(const float* q, const float* mean, int dim) {
  __m512 part = _mm512_setzero_ps();
  for (int e0 = 0; e0 < dim; e0 += 16) {
    const __mmask16 m = LanesFrom(e0, dim);
    part = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + e0), _mm512_maskz_loadu_ps(m, mean + e0), part);
  }
  // centre_dot's tree: lanes i + 8, then i + 4, i + 2, i + 1 added to lane i.
  part = _mm512_add_ps(part, _mm512_shuffle_f32x4(part, part, _MM_SHUFFLE(1, 0, 3, 2)));
  part = _mm512_add_ps(part, _mm512_shuffle_f32x4(part, part, _MM_SHUFFLE(2, 3, 0, 1)));
  part = _mm512_add_ps(part, _mm512_permute_ps(part, _MM_SHUFFLE(1, 0, 3, 2)));
  part = _mm512_add_ps(part, _mm512_permute_ps(part, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(part);
}

TOWERS_INT8_TARGET void ScoresAllVnni(const Int8Queries& q, const float* qv, int g0, int n_g, const Int8Keys& keys,
                                      float* s, size_t s_stride) {
  float qmu[kInt8MaxQueries];
  for (int g = 0; g < n_g; ++g) qmu[g] = CentreDotVnni(qv + size_t(g0 + g) * keys.dim, keys.mean, keys.dim);
  const int n_t = (keys.n + 15) / 16;
  int t = 0;
  for (; t + 4 <= n_t; t += 4) {
    int g = 0;
    for (; g + 4 <= n_g; g += 4) ScoresVnni<4, 4>(q, qmu + g, g0 + g, keys, t, s + size_t(g) * s_stride, s_stride);
    for (; g < n_g; ++g) ScoresVnni<1, 4>(q, qmu + g, g0 + g, keys, t, s + size_t(g) * s_stride, s_stride);
  }
  for (; t < n_t; ++t) {
    int g = 0;
    for (; g + 4 <= n_g; g += 4) ScoresVnni<4, 1>(q, qmu + g, g0 + g, keys, t, s + size_t(g) * s_stride, s_stride);
    for (; g < n_g; ++g) ScoresVnni<1, 1>(q, qmu + g, g0 + g, keys, t, s + size_t(g) * s_stride, s_stride);
  }
}

TOWERS_INT8_TARGET void ValuesVnni(KvQuant format, const uint8_t* v, size_t stride, int n, int dim, Int8Values* out) {
  out->n = n;
  out->dim = dim;
  for (int j = 0; j < kInt8MaxKeys; j += 16) _mm512_store_ps(out->scale + j, _mm512_setzero_ps());
  const int nc = (dim + 15) / 16;
  for (int i = 0; i < (n + 3) / 4; ++i) {
    float inv[4];
    for (int r = 0; r < 4; ++r) {  // the quad's scales (rows past n: 0, so their codes are 0)
      const int j = 4 * i + r;
      __m512 amax = _mm512_setzero_ps();
      for (int c = 0; j < n && c < nc; ++c)
        amax = _mm512_max_ps(amax, _mm512_abs_ps(LoadKey(format, v + size_t(j) * stride, 16 * c, dim)));
      const Int8Scale s = int8_scale(_mm512_reduce_max_ps(amax));  // past n: amax 0, so {0, 0}
      if (j < n) out->scale[j] = s.scale;
      inv[r] = s.inv;
    }
    const __m512i byte = _mm512_set1_epi32(0xFF);
    for (int c = 0; c < nc; ++c) {
      __m512i word = _mm512_setzero_si512();
      for (int r = 0; r < 4 && 4 * i + r < n; ++r) {
        const __m512i code = Codes(LoadKey(format, v + size_t(4 * i + r) * stride, 16 * c, dim), inv[r], -127, 127);
        word = _mm512_or_si512(word, _mm512_slli_epi32(_mm512_and_si512(code, byte), 8 * r));
      }
      _mm512_mask_storeu_epi32(out->word(i) + 16 * c, LanesFrom(16 * c, dim), word);
    }
  }
}

// NQ queries from g, elements [16 * c0, 16 * (c0 + NC)): the reference's integer sums over the
// block's quads, then acc = fma(sum, sp, acc). codes: each query's u8 weights (kInt8MaxKeys bytes).
template <int NQ, int NC>
TOWERS_INT8_TARGET inline void AccumulateVnniG(const uint8_t (*codes)[kInt8MaxKeys], const float* sp, int g,
                                               const Int8Values& values, int c0, float* acc) {
  const int dim = values.dim, quads = (values.n + 3) / 4;
  __mmask16 mask[NC];
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c) mask[c] = LanesFrom(16 * (c0 + c), dim);
  __m512i sum[NQ][NC];
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) sum[q][c] = _mm512_setzero_si512();
  }
  for (int i = 0; i < quads; ++i) {
    __m512i vw[NC];
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) vw[c] = _mm512_maskz_loadu_epi32(mask[c], values.word(i) + 16 * (c0 + c));
#pragma GCC unroll 16
    for (int q = 0; q < NQ; ++q) {
      uint32_t pw;
      std::memcpy(&pw, &codes[g + q][4 * i], 4);
      const __m512i p4 = _mm512_set1_epi32(static_cast<int32_t>(pw));
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) sum[q][c] = _mm512_dpbusd_epi32(sum[q][c], p4, vw[c]);
    }
  }
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) {
    const __m512 s = _mm512_set1_ps(sp[g + q]);
    float* a = acc + size_t(g + q) * dim + 16 * c0;
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) {
      const __m512 d = _mm512_maskz_cvtepi32_ps(__mmask16(0xFFFF), sum[q][c]);
      _mm512_mask_storeu_ps(a + 16 * c, mask[c], _mm512_fmadd_ps(d, s, _mm512_maskz_loadu_ps(mask[c], a + 16 * c)));
    }
  }
}

TOWERS_INT8_TARGET void AccumulateVnni(const float* p, size_t p_stride, int n_g, const Int8Values& values, float* acc) {
  alignas(64) uint8_t codes[kInt8MaxQueries][kInt8MaxKeys];
  float sp[kInt8MaxQueries];
  const int n = values.n;
  for (int g = 0; g < n_g; ++g) {  // int8_weights' operations, 16 weights per vector
    const float* pg = p + size_t(g) * p_stride;
    __m512 pq[kInt8MaxKeys / 16];
    __m512 pmax = _mm512_setzero_ps();
    for (int v = 0; v < kInt8MaxKeys / 16; ++v) {
      const __mmask16 m = LanesFrom(16 * v, n);
      pq[v] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pg + 16 * v), _mm512_maskz_loadu_ps(m, values.scale + 16 * v));
      pmax = _mm512_max_ps(pmax, pq[v]);
    }
    const Int8Scale s = int8_scale(_mm512_reduce_max_ps(pmax), 255.0f);
    sp[g] = s.scale;
    for (int v = 0; v < kInt8MaxKeys / 16; ++v) {
      const __m128i c = _mm512_cvtepi32_epi8(Codes(pq[v], s.inv, 0, 255));
      _mm_store_si128(reinterpret_cast<__m128i*>(&codes[g][16 * v]), c);
    }
  }
  const int nc = (values.dim + 15) / 16;
  for (int c0 = 0; c0 < nc; c0 += 4) {
    int g = 0;
    for (; g + 4 <= n_g; g += 4) AccumulateVnniG<4, 4>(codes, sp, g, values, c0, acc);
    for (; g < n_g; ++g) AccumulateVnniG<1, 4>(codes, sp, g, values, c0, acc);
  }
}

}  // namespace

#pragma GCC diagnostic pop

bool int8_attention_available() {
  // Highway's AVX3_DL requires AVX512-VNNI. Asked once: hwy::SupportedTargets() runs CPUID on
  // every call (it was 30% of a tile's time when asked per block).
  static const bool available = (hwy::SupportedTargets() & HWY_AVX3_DL) != 0;
  return available;
}

#undef TOWERS_INT8_TARGET
#else
bool int8_attention_available() { return false; }
#endif

// The kernels this build has: the VNNI ones on x86-64 (run only where int8_attention_available()),
// the reference elsewhere.
namespace {
struct Int8Kernels {
  decltype(&int8_queries_reference) queries;
  decltype(&int8_keys_reference) keys;
  decltype(&int8_scores_reference) scores;
  decltype(&int8_values_reference) values;
  decltype(&int8_accumulate_reference) accumulate;
};
#if defined(__x86_64__)
constexpr Int8Kernels kKernels{QueriesVnni, KeysVnni, ScoresAllVnni, ValuesVnni, AccumulateVnni};
#else
constexpr Int8Kernels kKernels{int8_queries_reference, int8_keys_reference, int8_scores_reference,
                               int8_values_reference, int8_accumulate_reference};
#endif
}  // namespace

void int8_queries(const float* qv, int n_q, int dim, Int8Queries* out) { kKernels.queries(qv, n_q, dim, out); }
void int8_keys(KvQuant format, const uint8_t* k, size_t stride, int n, int dim, Int8Keys* out) {
  kKernels.keys(format, k, stride, n, dim, out);
}
void int8_scores(const Int8Queries& q, const float* qv, int g0, int n_g, const Int8Keys& keys, float* s,
                 size_t s_stride) {
  kKernels.scores(q, qv, g0, n_g, keys, s, s_stride);
}
void int8_values(KvQuant format, const uint8_t* v, size_t stride, int n, int dim, Int8Values* out) {
  kKernels.values(format, v, stride, n, dim, out);
}
void int8_accumulate(const float* p, size_t p_stride, int n_g, const Int8Values& values, float* acc) {
  kKernels.accumulate(p, p_stride, n_g, values, acc);
}

}  // namespace towers::simd

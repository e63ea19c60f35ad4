// The packed kernels' exact int32 block sums on AVX3_DL (AVX-512 VNNI), included by gemm_packed.cc
// for that target only.
//
// Raw intrinsics, because Highway 1.0.3 cannot express these kernels: it has no u8 x i8 dot product
// into int32 lanes (vpdpbusd; later Highway releases added SumOfMulQuadAccumulate) and no 16-bit lane
// permutation across a whole 512-bit vector (vpermw) that pairs each row's bytes of two chunks. Every
// sum is the same integer as PackedSums computes with Highway's int16 madd on the other targets, so
// the results are the same bits (test "packed: bit-identical across x86 targets").
//
// simd/vnni_target-inl.h enables VNNI on that target (Highway's target string lacks it).
#if defined(TOWERS_SIMD_GEMM_PACKED_VNNI_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TOWERS_SIMD_GEMM_PACKED_VNNI_INL_H_
#undef TOWERS_SIMD_GEMM_PACKED_VNNI_INL_H_
#else
#define TOWERS_SIMD_GEMM_PACKED_VNNI_INL_H_
#endif

#include <cstring>
#include <type_traits>

#include <hwy/highway.h>

#include "simd/quant_dot-inl.h"
#include "simd/quant_layout.h"

HWY_BEFORE_NAMESPACE();
#include "simd/vnni_target-inl.h"
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3_DL
using namespace qd;  // NOLINT

// VNNI (vpdpbusd: u8 x s8, 4 products summed into each int32 lane) for every packed type. A 64-byte
// load covers two chunks of the packed layout (rows' byte pairs 2p, 2p+1 and 2p+2, 2p+3); one vpermw
// puts each row's 4 bytes in its int32 lane. The weights are the unsigned operand: 2- to 6-bit codes
// as they are (the K types, Q4_1, Q5_1), Q8_0 + 128 (xor 0x80), IQ4 nibbles looked up as value + 128
// (vpshufb). The activations' int8 copy (q8) gives the signed operand, 4 consecutive elements
// broadcast to all lanes. Offsets are exact int32 terms: Q4_0 -8 * sum(x), Q5_0 -16 * sum(x), Q8_0 and
// IQ4 -128 * sum(x), Q3_K -4 and Q6_K -32 times 16-element sums. Every sum is the same integer as on
// the other targets.

// Lane r (of 16) = words r and 16 + r of v: row r's bytes of chunk p, then of chunk p + 1.
HWY_INLINE __m512i PairChunks(const uint8_t* HWY_RESTRICT p) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(p));
}
HWY_INLINE __m512i Bcast4(const int8_t* HWY_RESTRICT p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
// The IQ4 codebook + 128 (xor 0x80: the values as VNNI's unsigned operand) in every 128-bit lane, and
// the lookup of 4-bit indices (bytes 0..15) in it.
HWY_INLINE __m512i Iq4Lut() {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  return _mm512_xor_si512(_mm512_broadcast_i32x4(v), _mm512_set1_epi8(static_cast<char>(0x80)));
}
HWY_INLINE __m512i Iq4(__m512i lut, __m512i idx) { return _mm512_shuffle_epi8(lut, idx); }
using V512 = hn::Vec512<int32_t>;
HWY_INLINE V512 Dp(V512 acc, __m512i w, const int8_t* HWY_RESTRICT x) {
  return V512{_mm512_dpbusd_epi32(acc.raw, w, Bcast4(x))};
}

// Q2_K / Q3_K sub-block sb = 8h + 2j + k of block b for R activation rows: the 2-bit codes (bits 2j of
// the quant chunk pairs v of (h, k); Q3_K: | bit 4h + j of the hmask pairs hb, at bit 2) as the
// unsigned operand, so Q3_K's sum of (q - 4) * x is minus 4 * A256's 16-element sum; then the scales
// (LowBitScales). Up to 2 tokens the pairs 0-1 and 2-3 go to separate sums (shorter chains). A function
// (always inlined), not a lambda: GCC stopped inlining PackedSumsVnni with the lambdas (prefill -30%).
template <GgmlType kType, size_t R, class D32, class V32>
HWY_INLINE void LowBitSubBlock(D32 d32, const __m512i* HWY_RESTRICT v, const __m512i* HWY_RESTRICT hb, int h, int k,
                               int j, const ActRow* A, size_t b, size_t e, const uint8_t* HWY_RESTRICT sc, TOWERS_V8(s),
                               TOWERS_V8(m)) {
  const __m512i k03 = _mm512_set1_epi8(3), k04 = _mm512_set1_epi8(4);
  const size_t sb = static_cast<size_t>(8 * h + 2 * j + k);
  const __m128i qshift = _mm_cvtsi32_si128(2 * j);
  // Q3_K's high bit: bit hbit of each hmask byte shifted straight to bit 2 (within its byte: hbit <= 7),
  // then OR'ed in under the mask 4 by one ternary-logic op (q | (hs & 4): 0xF8).
  const int hbit = 4 * h + j;
  const __m128i hshift = _mm_cvtsi32_si128(hbit >= 2 ? hbit - 2 : 2 - hbit);
  auto codes = [&](size_t pp) {
    const __m512i w = _mm512_and_si512(_mm512_srl_epi16(v[pp], qshift), k03);
    if constexpr (kType == kQ3_K) {
      const __m512i hs = hbit >= 2 ? _mm512_srl_epi16(hb[pp], hshift) : _mm512_sll_epi16(hb[pp], hshift);
      return _mm512_ternarylogic_epi32(w, hs, k04, 0xF8);
    }
    return w;
  };
  const auto z = hn::Zero(d32);
  TOWERS_ZERO8(l, z)
  TOWERS_ZERO8(h, z)
  const size_t es = e + 16 * sb;
  for (size_t pp = 0; pp < 2; ++pp) {
    const __m512i wa = codes(pp), wb = codes(pp + 2);
    if constexpr (R <= 2) {
#define TOWERS_MAC(i) l##i = Dp(l##i, wa, A[i].q8 + es + 4 * pp); h##i = Dp(h##i, wb, A[i].q8 + es + 4 * pp + 8);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    } else {
#define TOWERS_MAC(i) l##i = Dp(Dp(l##i, wa, A[i].q8 + es + 4 * pp), wb, A[i].q8 + es + 4 * pp + 8);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
  }
#define TOWERS_FIN(i) l##i = hn::Add(l##i, h##i);
  TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  LowBitScales<kType, R>(d32, sc + kPackRows * sb, A, b, sb, l0, l1, l2, l3, l4, l5, l6, l7, s0, s1, s2, s3, s4, s5,
                         s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
}

// Q2_K / Q3_K: the 4 sub-blocks j of (h, k) from its 4 chunk pairs (elements 4pp .. 4pp + 3 of each
// sub-block) and Q3_K's hmask pairs, loaded once. Up to 2 tokens the sub-blocks are unrolled, so every
// shift is an immediate (GCC kept the loop and its shift counts in registers: Q3_K decode ran at 24
// GB/s from L2, Q4_K at 63); with more, the loop stays (unrolled, prefill lost 8%).
template <GgmlType kType, size_t R, class D32, class V32>
HWY_INLINE void LowBitHalf(D32 d32, const uint8_t* HWY_RESTRICT q, const uint8_t* HWY_RESTRICT hm, int h, int k,
                           const ActRow* A, size_t b, size_t e, const uint8_t* HWY_RESTRICT sc, TOWERS_V8(s),
                           TOWERS_V8(m)) {
  __m512i v[4], hb[4];
#pragma GCC unroll 4
  for (size_t pp = 0; pp < 4; ++pp) {
    v[pp] = PairChunks(q + 32 * (16 * h + 8 * k + 2 * pp));
    hb[pp] = kType == kQ3_K ? PairChunks(hm + 32 * (8 * k + 2 * pp)) : v[pp];
  }
#define TOWERS_SUB(j)                                                                                              \
  LowBitSubBlock<kType, R, D32, V32>(d32, v, hb, h, k, j, A, b, e, sc, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, \
                                     m3, m4, m5, m6, m7);
  if constexpr (R <= 2) {
    TOWERS_SUB(0) TOWERS_SUB(1) TOWERS_SUB(2) TOWERS_SUB(3)
  } else {
    for (int j = 0; j < 4; ++j) TOWERS_SUB(j)
  }
#undef TOWERS_SUB
}

template <GgmlType kType, size_t R, class D32, class V32>
HWY_INLINE void PackedSumsVnni(D32 d32, const uint8_t* HWY_RESTRICT blk, const ActRow* A, size_t b,
                               TOWERS_V8(s), TOWERS_V8(m)) {
  static_assert(std::is_same_v<V32, V512>, "one 16-row slice per vector");
  const size_t e = b * act_block(kType);
#define TOWERS_X8(i) const int8_t* HWY_RESTRICT x##i = A[i].q8 + e; (void)x##i;
  TOWERS_ALL8(TOWERS_X8)
#undef TOWERS_X8
  const auto z = hn::Zero(d32);
  s0 = z, s1 = z, s2 = z, s3 = z, s4 = z, s5 = z, s6 = z, s7 = z;
  m0 = z, m1 = z, m2 = z, m3 = z, m4 = z, m5 = z, m6 = z, m7 = z;
  const __m512i k0F = _mm512_set1_epi8(0x0F);
  if constexpr (R == 1 && (kType == kQ8_0 || kType == kQ4_0 || kType == kIQ4_NL)) {
    // Decode: one row of activations would make each block one chain of 8 dependent vpdpbusd
    // (latency-bound at ~1/4 of their throughput). Four independent int32 sums instead; integer
    // addition is exact, so s0 is the same integer as below and on the other targets.
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    if constexpr (kType == kQ8_0) {
      const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
      for (size_t p = 0; p < 16; p += 8) {
        a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(PairChunks(qs + 32 * p), k80), Bcast4(x0 + 2 * p));
        a1 = _mm512_dpbusd_epi32(a1, _mm512_xor_si512(PairChunks(qs + 32 * p + 64), k80), Bcast4(x0 + 2 * p + 4));
        a2 = _mm512_dpbusd_epi32(a2, _mm512_xor_si512(PairChunks(qs + 32 * p + 128), k80), Bcast4(x0 + 2 * p + 8));
        a3 = _mm512_dpbusd_epi32(a3, _mm512_xor_si512(PairChunks(qs + 32 * p + 192), k80), Bcast4(x0 + 2 * p + 12));
      }
    } else {
      // Q4_0's nibbles as they are; IQ4_NL's looked up (codebook + 128).
      const __m512i lut = kType == kIQ4_NL ? Iq4Lut() : _mm512_setzero_si512();
      auto w = [&](__m512i nibbles) { return kType == kIQ4_NL ? Iq4(lut, nibbles) : nibbles; };
      for (size_t p = 0; p < 8; p += 4) {
        const __m512i v = PairChunks(qs + 32 * p), u = PairChunks(qs + 32 * p + 64);
        a0 = _mm512_dpbusd_epi32(a0, w(_mm512_and_si512(v, k0F)), Bcast4(x0 + 2 * p));
        a1 = _mm512_dpbusd_epi32(a1, w(_mm512_and_si512(_mm512_srli_epi16(v, 4), k0F)), Bcast4(x0 + 16 + 2 * p));
        a2 = _mm512_dpbusd_epi32(a2, w(_mm512_and_si512(u, k0F)), Bcast4(x0 + 2 * p + 4));
        a3 = _mm512_dpbusd_epi32(a3, w(_mm512_and_si512(_mm512_srli_epi16(u, 4), k0F)), Bcast4(x0 + 16 + 2 * p + 4));
      }
    }
    const int32_t offset = (kType == kQ4_0 ? 8 : 128) * A[0].s[b];
    s0 = hn::Sub(V512{_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3))}, hn::Set(d32, offset));
  } else if constexpr (kType == kQ8_0) {
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs;
    const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
    for (size_t p = 0; p < 16; p += 2) {
      const __m512i w = _mm512_xor_si512(PairChunks(qs + 32 * p), k80);  // q + 128 as u8
#define TOWERS_MAC(i) s##i = Dp(s##i, w, x##i + 2 * p);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
    // sum (q + 128) * x - 128 * sum x (exact).
#define TOWERS_FIN(i) s##i = hn::Sub(s##i, hn::Set(d32, 128 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ4_0) {
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs;
    for (size_t p = 0; p < 8; p += 2) {
      const __m512i v = PairChunks(qs + 32 * p);
      const __m512i lo = _mm512_and_si512(v, k0F);                         // elements 2p..2p+3
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F);  // elements 16+2p..
#define TOWERS_MAC(i) s##i = Dp(Dp(s##i, lo, x##i + 2 * p), hi, x##i + 16 + 2 * p);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i) s##i = hn::Sub(s##i, hn::Set(d32, 8 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ4_1 || kType == kQ5_0 || kType == kQ5_1) {
    // Q4_0's chunks, nibbles as they are; Q5_0 / Q5_1: | the fifth bit, 16. Each row's two plane
    // bytes (the fifth bits of the chunks' low and high nibbles) are duplicated into both words of
    // its lane and shifted per word: by p for chunk p's elements, by p + 1 for chunk p + 1's.
    const uint8_t* HWY_RESTRICT qs = blk + packed_qs_at(kType);
    const __m512i dup = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6,
                                         5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    auto plane = [&](size_t i) {
      const auto* at = reinterpret_cast<const __m256i*>(blk + packed_qh_at(kType) + 32 * i);
      return _mm512_permutexvar_epi16(dup, _mm512_castsi256_si512(_mm256_loadu_si256(at)));
    };
    const __m512i k01 = _mm512_set1_epi8(1);
    const __m512i Hlo = kType == kQ4_1 ? _mm512_setzero_si512() : plane(0);
    const __m512i Hhi = kType == kQ4_1 ? _mm512_setzero_si512() : plane(1);
    for (size_t p = 0; p < 8; p += 2) {
      const __m512i v = PairChunks(qs + 32 * p);
      __m512i lo = _mm512_and_si512(v, k0F), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F);
      if constexpr (kType != kQ4_1) {
        const __m512i shift = _mm512_set1_epi32(static_cast<int>(p | (p + 1) << 16));
        lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(Hlo, shift), k01), 4));
        hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(Hhi, shift), k01), 4));
      }
      if constexpr (R <= 2) {  // decode: the high nibbles into m (zero here), a second chain
#define TOWERS_MAC(i) s##i = Dp(s##i, lo, x##i + 2 * p); m##i = Dp(m##i, hi, x##i + 16 + 2 * p);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      } else {
#define TOWERS_MAC(i) s##i = Dp(Dp(s##i, lo, x##i + 2 * p), hi, x##i + 16 + 2 * p);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
    }
    if constexpr (R <= 2) {
#define TOWERS_FIN(i) s##i = hn::Add(s##i, m##i), m##i = z;
      TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
    }
    if constexpr (kType == kQ5_0) {
#define TOWERS_FIN(i) s##i = hn::Sub(s##i, hn::Set(d32, 16 * A[i].s[b]));
      TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
    }
  } else if constexpr (kType == kIQ4_NL) {
    // Q4_0's chunks; each nibble looked up as codebook value + 128, minus 128 * sum(x) (exact).
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs;
    const __m512i lut = Iq4Lut();
    for (size_t p = 0; p < 8; p += 2) {
      const __m512i v = PairChunks(qs + 32 * p);
      const __m512i lo = Iq4(lut, _mm512_and_si512(v, k0F));
      const __m512i hi = Iq4(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F));
#define TOWERS_MAC(i) s##i = Dp(Dp(s##i, lo, x##i + 2 * p), hi, x##i + 16 + 2 * p);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i) s##i = hn::Sub(s##i, hn::Set(d32, 128 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ2_K || kType == kQ3_K) {
    // Per (h, k): its 4 chunk pairs (and Q3_K's hmask pairs) loaded once for its 4 sub-blocks j.
    const uint8_t* HWY_RESTRICT q = blk + packed_qs_at(kType);
    const uint8_t* HWY_RESTRICT hm = blk + kQ3KHmask;
    const uint8_t* HWY_RESTRICT sc = blk + packed_scales_at(kType);
#define TOWERS_HALF(h, k) \
  LowBitHalf<kType, R, D32, V32>(d32, q, hm, h, k, A, b, e, sc, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
    TOWERS_HALF(0, 0) TOWERS_HALF(0, 1) TOWERS_HALF(1, 0) TOWERS_HALF(1, 1)
#undef TOWERS_HALF
  } else if constexpr (kType == kIQ4_XS) {
    // Per sub-block j: IQ4_NL's sum (codebook + 128, minus 128 * A256's 32-element sum), times the
    // row's int8 scale. Up to 2 tokens the low and high nibbles go to separate sums (shorter chains).
    const hn::Rebind<int8_t, D32> di8x32;
    const int8_t* HWY_RESTRICT scb = reinterpret_cast<const int8_t*>(blk + kIQ4XSScales);
    const uint8_t* HWY_RESTRICT q = blk + kIQ4XSQuants;
    const __m512i lut = Iq4Lut();
    for (size_t j = 0; j < 8; ++j) {
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(h, z)
      const uint8_t* HWY_RESTRICT qj = q + kIQ4XSSubBytes * j;
      const size_t ej = e + 32 * j;
      for (size_t p = 0; p < 8; p += 2) {
        const __m512i v = PairChunks(qj + 32 * p);
        const __m512i lo = Iq4(lut, _mm512_and_si512(v, k0F));
        const __m512i hi = Iq4(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F));
        if constexpr (R <= 2) {
#define TOWERS_MAC(i) l##i = Dp(l##i, lo, A[i].q8 + ej + 2 * p); h##i = Dp(h##i, hi, A[i].q8 + ej + 16 + 2 * p);
          TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
        } else {
#define TOWERS_MAC(i) l##i = Dp(Dp(l##i, lo, A[i].q8 + ej + 2 * p), hi, A[i].q8 + ej + 16 + 2 * p);
          TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
        }
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, scb + kPackRows * j));
#define TOWERS_SC(i) \
  s##i = hn::Add(s##i, hn::Mul(hn::Sub(hn::Add(l##i, h##i), hn::Set(d32, 128 * A[i].bs[8 * b + j])), scv));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
  } else if constexpr (kType == kQ6_K) {
    // Per 16-element scale group g: the 6-bit codes (0..63) are the unsigned operand; the exact sum
    // of code * x, minus 32 * the group's activation sum (A256 bs16), is sum (q - 32) * x, times the
    // row's int8 scale (int32), as in PackedSums. Chunks 2c and 2c+1 of the low 4 bits come from one
    // PairChunks; their top 2 bits are both in qh chunk c: each row's qh word is duplicated into its
    // lane and shifted per word (0 and 4 for the low-nibble elements, 2 and 6 for the high ones).
    const hn::Rebind<int8_t, D32> di8x32;
    const int8_t* HWY_RESTRICT scb = reinterpret_cast<const int8_t*>(blk + kQ6KScales);
    const uint8_t* HWY_RESTRICT q = blk + kQ6KGroups;
    const __m512i k03 = _mm512_set1_epi8(3);
    const __m512i dup = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6,
                                         5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i shift_lo = _mm512_set1_epi32(0x00040000), shift_hi = _mm512_set1_epi32(0x00060002);
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* HWY_RESTRICT ql = q + g * kQ6KGroupBytes;
      const uint8_t* HWY_RESTRICT qh = ql + 128;
      TOWERS_ZERO8(l, z)
      for (size_t c = 0; c < 2; ++c) {
        const __m512i L = PairChunks(ql + 64 * c);
        const __m512i H = _mm512_permutexvar_epi16(
            dup, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * c))));
        const __m512i lo = _mm512_or_si512(
            _mm512_and_si512(L, k0F), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, shift_lo), k03), 4));
        const __m512i hi =
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), k0F),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, shift_hi), k03), 4));
        const size_t eg = e + 16 * g + 4 * c;
#define TOWERS_MAC(i) l##i = Dp(Dp(l##i, lo, A[i].q8 + eg), hi, A[i].q8 + eg + 8);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, scb + 16 * g));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::Sub(l##i, hn::Set(d32, 32 * A[i].bs16[16 * b + g])), scv));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
  } else {
    static_assert(kType == kQ4_K || kType == kQ5_K);
    const hn::Rebind<uint8_t, D32> du8x32;
    const uint8_t* HWY_RESTRICT sc = blk + kQ4KScales;
    const uint8_t* HWY_RESTRICT q = blk + kQ4KQuants;
    // Q5_K: bit `bit` of the qh chunk pair at p, as 16 (the fifth bit of sub-block `bit`'s codes).
    const __m512i k10 = _mm512_set1_epi8(0x10);
    auto fifth = [&](__m512i H, int bit) {
      return _mm512_and_si512(_mm512_slli_epi16(_mm512_srl_epi16(H, _mm_cvtsi32_si128(bit)), 4), k10);
    };
    // Up to 2 tokens: both sub-blocks of a part from one load of each chunk pair.
    if constexpr (R <= 2) for (size_t c = 0; c < 4; ++c) {
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(h, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ec = 64 * c;
      for (size_t p = 0; p < 16; p += 2) {
        const __m512i v = PairChunks(qc + 32 * p);
        __m512i wl = _mm512_and_si512(v, k0F), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0F);
        if constexpr (kType == kQ5_K) {
          const __m512i H = PairChunks(blk + kQ5KQh + 32 * p);
          wl = _mm512_or_si512(wl, fifth(H, static_cast<int>(2 * c)));
          wh = _mm512_or_si512(wh, fifth(H, static_cast<int>(2 * c + 1)));
        }
#define TOWERS_MAC(i) l##i = Dp(l##i, wl, x##i + ec + 2 * p); h##i = Dp(h##i, wh, x##i + ec + 32 + 2 * p);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scl = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c));
      const auto sch = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c + 16));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Add(hn::Mul(l##i, scl), hn::Mul(h##i, sch)));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // Sub-block j = 2c + half: the low (half 0) or high (half 1) nibbles of part c. One sub-block at
    // a time keeps 8 accumulators live besides the 8 sums (the weights are loaded twice).
    if constexpr (R > 2) for (size_t j = 0; j < 8; ++j) {
      const size_t c = j / 2, half = j % 2;
      TOWERS_ZERO8(l, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ej = 64 * c + 32 * half;
      for (size_t p = 0; p < 16; p += 2) {
        const __m512i v = PairChunks(qc + 32 * p);
        __m512i w = _mm512_and_si512(half ? _mm512_srli_epi16(v, 4) : v, k0F);
        if constexpr (kType == kQ5_K) w = _mm512_or_si512(w, fifth(PairChunks(blk + kQ5KQh + 32 * p), static_cast<int>(j)));
#define TOWERS_MAC(i) l##i = Dp(l##i, w, x##i + ej + 2 * p);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scj = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 16 * j));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(l##i, scj));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // Min term as in PackedSums (int16 madd of the mins with the 32-element sums).
    Q4KMinSums<R>(d32, blk + kQ4KMins, A, b, m0, m1, m2, m3, m4, m5, m6, m7);
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target

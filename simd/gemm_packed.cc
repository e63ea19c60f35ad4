// gemm_packed (simd/quant_dot.h): packed groups of 16 rows (pack_rows.cc) times quantized activation
// rows. Per block, exact int32 sums for every (row, token) (PackedSums, or PackedSumsVnni on AVX3_DL),
// then acc += (sum as f32) * (d_w * d_x) in f32: the only rounding steps (PackedGroup).
#include "simd/quant_dot.h"

// Also compile Highway's AVX3_DL target (Icelake-class AVX-512 with VNNI and VBMI2): the packed
// kernels use vpdpbusd there (gemm_packed_vnni-inl.h). The other quant_dot files define it too, so
// quant_dot_target names the target of all of them; the other kernels keep Highway's defaults.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/gemm_packed.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include "simd/gemm_packed_sdot-inl.h"
#include "simd/gemm_packed_vnni-inl.h"
#include "simd/quant_dot-inl.h"
#include "simd/quant_layout.h"

HWY_BEFORE_NAMESPACE();
#include "simd/vnni_target-inl.h"
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace qd;  // NOLINT

// ---------------------------------------------------------------------------------------------
// int32 lane r of a slice = row r. Activation pairs (two int16 = one int32) are broadcast to all
// lanes; weights are unpacked once per block and applied to up to kPackR (8 with AVX-512's 32
// registers, else 4) activation rows. Per (row, token) and block, every type computes exact int32
// sums and then acc += (sum as f32) * (d_w * d_x); Q2_K, Q4_K and Q5_K add a second such term, their
// min sum times (-dmin_w * d_x), Q4_1 and Q5_1 add m_w * ds_x. The SCALAR target runs the same
// arithmetic with plain loops.

// The types with a min term (m sums times -dmin, at kQ4KDmin = kQ2KDmin).
template <GgmlType kType>
constexpr bool kHasMin = kType == kQ4_K || kType == kQ5_K || kType == kQ2_K;
// The 32-element types with an offset m per block (+ m_w * ds_x: A32's d * sum(q), at kPackedM) and
// those with fifth-bit planes.
template <GgmlType kType>
constexpr bool kAffine = kType == kQ4_1 || kType == kQ5_1;
template <GgmlType kType>
constexpr bool kHasQh = kType == kQ5_0 || kType == kQ5_1;

#if HWY_TARGET == HWY_SCALAR
constexpr size_t kPackR = 4;

// The f16 of row r in the array of kPackRows f16 at byte offset `at` of a packed block.
HWY_INLINE float PackedF16(const uint8_t* blk, size_t at, size_t r) {
  return LoadF16(*reinterpret_cast<const Half*>(blk + at + 2 * r));
}

// Exact int32 sums of row r of one packed block (index b) with activation row a: sum (the d_w
// term) and msum (Q4_K's min term; 0 for the other types).
template <GgmlType kType>
HWY_INLINE void ScalarPackedSums(const uint8_t* HWY_RESTRICT blk, size_t r, const ActRow& a, size_t b,
                                 int32_t& sum, int32_t& msum) {
  sum = 0;
  msum = 0;
  if constexpr (kType == kQ6_K) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + kQ6KScales);
    const int16_t* x = a.q + b * 256;
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* ql = blk + kQ6KGroups + g * kQ6KGroupBytes;
      const uint8_t* qh = ql + 128;
      int32_t gs = 0;
      for (size_t p = 0; p < 4; ++p) {
        for (size_t k = 0; k < 2; ++k) {
          const int L = ql[32 * p + 2 * r + k];
          const int H = qh[32 * (p / 2) + 2 * r + k] >> (4 * (p % 2));
          const int lo = (L & 15) | ((H & 3) << 4), hi = (L >> 4) | (((H >> 2) & 3) << 4);
          gs += (lo - 32) * x[16 * g + 2 * p + k] + (hi - 32) * x[16 * g + 8 + 2 * p + k];
        }
      }
      sum += gs * sc[16 * g + r];
    }
  } else if constexpr (kType == kQ2_K || kType == kQ3_K) {
    const int16_t* x = a.q + b * 256;
    const size_t quants = packed_qs_at(kType);
    for (size_t sb = 0; sb < 16; ++sb) {
      const size_t h = sb / 8, j = (sb % 8) / 2, k = sb % 2;
      int32_t l = 0;
      for (size_t i = 0; i < 16; ++i) {  // element 16 sb + i: ggml quant byte 32h + 16k + i, bits 2j
        const uint8_t byte = blk[quants + 32 * (16 * h + 8 * k + i / 2) + 2 * r + i % 2];
        int q = (byte >> (2 * j)) & 3;
        if constexpr (kType == kQ3_K) {  // hmask byte 16k + i, bit 4h + j
          const uint8_t hb = blk[kQ3KHmask + 32 * (8 * k + i / 2) + 2 * r + i % 2];
          q = (q | ((hb >> (4 * h + j)) & 1) << 2) - 4;
        }
        l += q * x[16 * sb + i];
      }
      if constexpr (kType == kQ2_K) {
        const uint8_t sc = blk[kQ2KScales + kPackRows * sb + r];
        sum += l * (sc & 15);
        msum += (sc >> 4) * a.bs16[16 * b + sb];
      } else {
        sum += l * static_cast<int8_t>(blk[kQ3KScales + kPackRows * sb + r]);
      }
    }
  } else if constexpr (kType == kIQ4_XS) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + kIQ4XSScales);
    const int16_t* x = a.q + b * 256;
    for (size_t j = 0; j < 8; ++j) {
      int32_t l = 0;
      for (size_t p = 0; p < 8; ++p) {
        for (size_t k = 0; k < 2; ++k) {
          const uint8_t byte = blk[kIQ4XSQuants + kIQ4XSSubBytes * j + 32 * p + 2 * r + k];
          l += kIq4nlValues[byte & 15] * x[32 * j + 2 * p + k] + kIq4nlValues[byte >> 4] * x[32 * j + 16 + 2 * p + k];
        }
      }
      sum += l * sc[kPackRows * j + r];
    }
  } else if constexpr (kType == kQ4_K || kType == kQ5_K) {
    const int16_t* x = a.q + b * 256;
    for (size_t c = 0; c < 4; ++c) {
      int32_t lo = 0, hi = 0;
      for (size_t p = 0; p < 16; ++p) {
        for (size_t k = 0; k < 2; ++k) {
          const uint8_t byte = blk[kQ4KQuants + 512 * c + 32 * p + 2 * r + k];
          int ql = byte & 15, qh = byte >> 4;
          if constexpr (kType == kQ5_K) {  // qh byte 2p + k: bit 2c for the low nibble, 2c + 1 for the high
            const uint8_t h = blk[kQ5KQh + 32 * p + 2 * r + k];
            ql |= ((h >> (2 * c)) & 1) << 4;
            qh |= ((h >> (2 * c + 1)) & 1) << 4;
          }
          lo += ql * x[64 * c + 2 * p + k];
          hi += qh * x[64 * c + 32 + 2 * p + k];
        }
      }
      sum += lo * blk[kQ4KScales + 16 * (2 * c) + r] + hi * blk[kQ4KScales + 16 * (2 * c + 1) + r];
    }
    for (size_t j = 0; j < 8; ++j) msum += blk[kQ4KMins + 32 * (j / 2) + 2 * r + j % 2] * a.bs[8 * b + j];
  } else {
    const uint8_t* qs = blk + packed_qs_at(kType);
    const int16_t* x = a.q + b * 32;
    for (size_t p = 0; p < (kType == kQ8_0 ? 16 : 8); ++p) {
      for (size_t k = 0; k < 2; ++k) {
        const uint8_t byte = qs[32 * p + 2 * r + k];
        if constexpr (kType == kQ8_0) {
          sum += static_cast<int8_t>(byte) * x[2 * p + k];
        } else if constexpr (kType == kIQ4_NL) {
          sum += kIq4nlValues[byte & 15] * x[2 * p + k] + kIq4nlValues[byte >> 4] * x[16 + 2 * p + k];
        } else {
          int lo = byte & 15, hi = byte >> 4;
          if constexpr (kHasQh<kType>) {  // bit p of the planes' byte k
            lo |= ((blk[packed_qh_at(kType) + 2 * r + k] >> p) & 1) << 4;
            hi |= ((blk[packed_qh_at(kType) + 32 + 2 * r + k] >> p) & 1) << 4;
          }
          sum += lo * x[2 * p + k] + hi * x[16 + 2 * p + k];
        }
      }
    }
    if constexpr (kType == kQ4_0) sum -= 8 * a.s[b];
    if constexpr (kType == kQ5_0) sum -= 16 * a.s[b];
  }
}

template <GgmlType kType, size_t R>
HWY_NOINLINE void PackedGroup(const uint8_t* HWY_RESTRICT grp, const ActRow* A, size_t nb,
                              float* HWY_RESTRICT y, size_t ldy) {
  constexpr size_t kGB = kPackRows * packed_block_bytes(kType);
  for (size_t i = 0; i < R; ++i) {
    for (size_t r = 0; r < kPackRows; ++r) {
      float acc = 0.f;
      for (size_t b = 0; b < nb; ++b) {
        const uint8_t* blk = grp + b * kGB;
        int32_t sum, msum;
        ScalarPackedSums<kType>(blk, r, A[i], b, sum, msum);
        const float dx = A[i].d[b];
        acc = acc + static_cast<float>(sum) * (PackedF16(blk, kPackedD, r) * dx);
        if constexpr (kHasMin<kType>) {
          acc = acc + static_cast<float>(msum) * (-PackedF16(blk, kQ4KDmin, r) * dx);
        }
        if constexpr (kAffine<kType>) acc = acc + PackedF16(blk, kPackedM, r) * A[i].ds[b];
      }
      y[i * ldy + r] = acc;
    }
  }
}
#else
// Up to 8 activation rows per unpacked weight block where there are 32 vector registers (16 rows x
// 8 tokens = 8 int32 accumulators per slice), else 4. Only the order of work depends on it.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kPackR = 8;
#else
constexpr size_t kPackR = 4;
#endif

#define TOWERS_ACT_AT(i) const int16_t* HWY_RESTRICT aq##i = A[i].q + e; (void)aq##i;
// Exact int32 sums of one slice (rows sl.., one int32 lane each) of packed block b with up to 8
// activation rows: s_i for the d_w term, m_i for Q4_K's min term (zero for the other types).
template <GgmlType kType, size_t R, class D32, class V32>
HWY_INLINE void PackedSums(D32 d32, const uint8_t* HWY_RESTRICT blk, size_t sl, const ActRow* A,
                           size_t b, TOWERS_V8(s), TOWERS_V8(m)) {
  const hn::Repartition<int16_t, D32> d16;
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const auto k15 = hn::Set(du16, uint16_t{15});
  const size_t e = b * act_block(kType);
  TOWERS_ALL8(TOWERS_ACT_AT)
  const auto z = hn::Zero(d32);
  s0 = z, s1 = z, s2 = z, s3 = z, s4 = z, s5 = z, s6 = z, s7 = z;
  m0 = z, m1 = z, m2 = z, m3 = z, m4 = z, m5 = z, m6 = z, m7 = z;
  TOWERS_ZERO8(u, z)
  if constexpr (kType == kQ8_0) {
    const hn::Rebind<int8_t, decltype(d16)> di8;
    const int8_t* HWY_RESTRICT qs = reinterpret_cast<const int8_t*>(blk + kPackedQs) + 2 * sl;
    for (size_t p = 0; p < 16; ++p) {
      const auto w = hn::PromoteTo(d16, hn::LoadU(di8, qs + 32 * p));
#define TOWERS_MAC(i) s##i = hn::ReorderWidenMulAccumulate(d32, w, PairAt(d16, aq##i + 2 * p), s##i, u##i);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i) s##i = hn::RearrangeToOddPlusEven(s##i, u##i);
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ4_0) {
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs + 2 * sl;
    for (size_t p = 0; p < 8; ++p) {
      const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qs + 32 * p));
      const auto lo = hn::BitCast(d16, hn::And(bytes, k15));       // elements 2p, 2p+1
      const auto hi = hn::BitCast(d16, hn::ShiftRight<4>(bytes));  // elements 2p+16, 2p+17
#define TOWERS_MAC(i)                                                                    \
  s##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + 2 * p), s##i, u##i); \
  s##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + 16 + 2 * p), s##i, u##i);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
    // sum (q - 8) * x = sum q * x - 8 * sum x, exactly in int32.
#define TOWERS_FIN(i) s##i = hn::Sub(hn::RearrangeToOddPlusEven(s##i, u##i), hn::Set(d32, 8 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ4_1 || kHasQh<kType>) {
    // Q4_0's chunks, nibbles as they are (Q4_1, Q5_1: + m, outside these sums), Q5_0 / Q5_1 with the
    // fifth bit of bit p of the planes (Q5_0: minus 16 * sum(x), exact).
    const uint8_t* HWY_RESTRICT qs = blk + packed_qs_at(kType) + 2 * sl;
    const uint8_t* HWY_RESTRICT qh = blk + packed_qh_at(kType) + 2 * sl;
    const auto k16 = hn::Set(du16, uint16_t{16});
    // The planes (loaded once; Q4_1 has none and ignores them), bit p as 16.
    const auto H0 = kHasQh<kType> ? hn::PromoteTo(du16, hn::LoadU(du8, qh)) : k16;
    const auto H1 = kHasQh<kType> ? hn::PromoteTo(du16, hn::LoadU(du8, qh + 32)) : k16;
    auto fifth = [&](decltype(k16) H, int p) { return hn::And(hn::ShiftLeft<4>(hn::ShiftRightSame(H, p)), k16); };
    for (size_t p = 0; p < 8; ++p) {
      const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qs + 32 * p));
      auto lo16 = hn::And(bytes, k15), hi16 = hn::ShiftRight<4>(bytes);
      if constexpr (kHasQh<kType>) {
        lo16 = hn::Or(lo16, fifth(H0, static_cast<int>(p)));
        hi16 = hn::Or(hi16, fifth(H1, static_cast<int>(p)));
      }
      const auto lo = hn::BitCast(d16, lo16), hi = hn::BitCast(d16, hi16);
#define TOWERS_MAC(i)                                                                    \
  s##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + 2 * p), s##i, u##i); \
  s##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + 16 + 2 * p), s##i, u##i);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i)                                                                                  \
  s##i = hn::RearrangeToOddPlusEven(s##i, u##i);                                                       \
  if constexpr (kType == kQ5_0) s##i = hn::Sub(s##i, hn::Set(d32, 16 * A[i].s[b]));
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kIQ4_NL) {
    // Q4_0's chunks, each nibble looked up in the codebook (int8 values, exact int32 sums).
    const uint8_t* HWY_RESTRICT qs = blk + kPackedQs + 2 * sl;
    const auto k15b = hn::Set(du8, uint8_t{15});
    for (size_t p = 0; p < 8; ++p) {
      const auto bytes = hn::LoadU(du8, qs + 32 * p);
      const auto lo = Iq4Values(d16, hn::And(bytes, k15b));        // elements 2p, 2p+1
      const auto hi = Iq4Values(d16, hn::ShiftRight<4>(bytes));    // elements 2p+16, 2p+17
#define TOWERS_MAC(i)                                                                    \
  s##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + 2 * p), s##i, u##i); \
  s##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + 16 + 2 * p), s##i, u##i);
      TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
    }
#define TOWERS_FIN(i) s##i = hn::RearrangeToOddPlusEven(s##i, u##i);
    TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
  } else if constexpr (kType == kQ2_K || kType == kQ3_K) {
    // Per sub-block sb = 8h + 2j + k of 16 (elements 16 sb + 2p, +1 in bits 2j of quant chunk
    // 16h + 8k + p; Q3_K's third bit is bit 4h + j of hmask chunk 8k + p): exact int32 sums of the
    // codes times x, then LowBitScales (Q2_K's scale and min; Q3_K's q = code - 4 and scale).
    const auto k3 = hn::Set(du16, uint16_t{3});
    const auto k1 = hn::Set(du16, uint16_t{1});
    const uint8_t* HWY_RESTRICT q = blk + packed_qs_at(kType) + 2 * sl;
    const uint8_t* HWY_RESTRICT hm = blk + kQ3KHmask + 2 * sl;
    const uint8_t* HWY_RESTRICT sc = blk + packed_scales_at(kType) + sl;
    auto codes = [&](auto c, auto hb, int h, int j) {
      auto w = hn::And(hn::ShiftRightSame(c, 2 * j), k3);
      if constexpr (kType == kQ3_K) w = hn::Or(w, hn::ShiftLeft<2>(hn::And(hn::ShiftRightSame(hb, 4 * h + j), k1)));
      return hn::BitCast(d16, w);
    };
    if constexpr (R == 1) {
      // Decode: each chunk (and hmask chunk) of (h, k) loaded and widened once for its 4 sub-blocks j,
      // whose sums stay in registers (8 vectors); unrolled, so every shift count is a constant. The
      // int32 sums are the same as the loop below (exact), added to s and m in another order.
      TOWERS_ZERO8(l, z)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
          // Sums of sub-block j = 0..3 in l<j> (even pairs) and u<j> (odd); no arrays of vectors (SVE's are sizeless).
          auto l_0 = z, l_1 = z, l_2 = z, l_3 = z, u_0 = z, u_1 = z, u_2 = z, u_3 = z;
#pragma GCC unroll 8
          for (size_t p = 0; p < 8; ++p) {
            const auto c = hn::PromoteTo(du16, hn::LoadU(du8, q + 32 * (16 * h + 8 * k + p)));
            const auto hb = kType == kQ3_K ? hn::PromoteTo(du16, hn::LoadU(du8, hm + 32 * (8 * k + p))) : c;
            auto mac = [&](auto& l, auto& u, int j) {
              const size_t sb = static_cast<size_t>(8 * h + 2 * j + k);
              l = hn::ReorderWidenMulAccumulate(d32, codes(c, hb, h, j), PairAt(d16, aq0 + 16 * sb + 2 * p), l, u);
            };
            mac(l_0, u_0, 0), mac(l_1, u_1, 1), mac(l_2, u_2, 2), mac(l_3, u_3, 3);
          }
          auto scale = [&](auto l, auto u, int j) {
            const size_t sb = static_cast<size_t>(8 * h + 2 * j + k);
            l0 = hn::RearrangeToOddPlusEven(l, u);
            LowBitScales<kType, R>(d32, sc + kPackRows * sb, A, b, sb, l0, l1, l2, l3, l4, l5, l6, l7, s0, s1, s2,
                                   s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
          };
          scale(l_0, u_0, 0), scale(l_1, u_1, 1), scale(l_2, u_2, 2), scale(l_3, u_3, 3);
        }
      }
    } else {
      for (size_t sb = 0; sb < 16; ++sb) {
        const int h = static_cast<int>(sb / 8), j = static_cast<int>(sb % 8 / 2), k = static_cast<int>(sb % 2);
        TOWERS_ZERO8(l, z)
        TOWERS_ZERO8(lu, z)
#pragma GCC unroll 8
        for (size_t p = 0; p < 8; ++p) {
          const auto c = hn::PromoteTo(du16, hn::LoadU(du8, q + 32 * (16 * h + 8 * k + p)));
          const auto hb = kType == kQ3_K ? hn::PromoteTo(du16, hn::LoadU(du8, hm + 32 * (8 * k + p))) : c;
          const auto wv = codes(c, hb, h, j);
#define TOWERS_MAC(i) l##i = hn::ReorderWidenMulAccumulate(d32, wv, PairAt(d16, aq##i + 16 * sb + 2 * p), l##i, lu##i);
          TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
        }
#define TOWERS_FIN(i) l##i = hn::RearrangeToOddPlusEven(l##i, lu##i);
        TOWERS_EACH_P(TOWERS_FIN)
#undef TOWERS_FIN
        LowBitScales<kType, R>(d32, sc + kPackRows * sb, A, b, sb, l0, l1, l2, l3, l4, l5, l6, l7, s0, s1, s2, s3, s4,
                               s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      }
    }
  } else if constexpr (kType == kIQ4_XS) {
    // Per sub-block j of 32: IQ4_NL's sums, times the row's int8 scale (|sum| <= 127 * 127 * 32, times
    // 32, times 8 sub-blocks < 2^31).
    const hn::Rebind<int8_t, D32> di8x32;
    const auto k15b = hn::Set(du8, uint8_t{15});
    const int8_t* HWY_RESTRICT sc = reinterpret_cast<const int8_t*>(blk + kIQ4XSScales) + sl;
    const uint8_t* HWY_RESTRICT q = blk + kIQ4XSQuants + 2 * sl;
    for (size_t j = 0; j < 8; ++j) {
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(lu, z)
      const uint8_t* HWY_RESTRICT qj = q + kIQ4XSSubBytes * j;
      const size_t ej = 32 * j;
      for (size_t p = 0; p < 8; ++p) {
        const auto bytes = hn::LoadU(du8, qj + 32 * p);
        const auto lo = Iq4Values(d16, hn::And(bytes, k15b));
        const auto hi = Iq4Values(d16, hn::ShiftRight<4>(bytes));
#define TOWERS_MAC(i)                                                                              \
  l##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + ej + 2 * p), l##i, lu##i);      \
  l##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + ej + 16 + 2 * p), l##i, lu##i);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scj = hn::PromoteTo(d32, hn::LoadU(di8x32, sc + kPackRows * j));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::RearrangeToOddPlusEven(l##i, lu##i), scj));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
  } else if constexpr (kType == kQ6_K) {
    // Per 16-element scale group: int32 sums of (q - 32) * x, times the row's int8 scale.
    const hn::Rebind<int8_t, D32> di8x32;
    const auto k48 = hn::Set(du16, uint16_t{48});
    const auto k32 = hn::Set(du16, uint16_t{32});
    const int8_t* HWY_RESTRICT sc = reinterpret_cast<const int8_t*>(blk + kQ6KScales) + sl;
    const uint8_t* HWY_RESTRICT q = blk + kQ6KGroups + 2 * sl;
    for (size_t g = 0; g < 16; ++g) {
      const uint8_t* HWY_RESTRICT ql = q + g * kQ6KGroupBytes;
      const uint8_t* HWY_RESTRICT qh = ql + 128;
      TOWERS_ZERO8(g, z)
      TOWERS_ZERO8(gu, z)
      const size_t eg = 16 * g;
      for (size_t ph = 0; ph < 2; ++ph) {
        const auto H = hn::PromoteTo(du16, hn::LoadU(du8, qh + 32 * ph));
        for (size_t pl = 0; pl < 2; ++pl) {
          const size_t p = 2 * ph + pl;
          const auto L = hn::PromoteTo(du16, hn::LoadU(du8, ql + 32 * p));
          const auto Hs = pl ? hn::ShiftRight<4>(H) : H;
          const auto lo = hn::BitCast(
              d16, hn::Sub(hn::Or(hn::And(L, k15), hn::And(hn::ShiftLeft<4>(Hs), k48)), k32));
          const auto hi = hn::BitCast(
              d16, hn::Sub(hn::Or(hn::ShiftRight<4>(L), hn::And(hn::ShiftLeft<2>(Hs), k48)), k32));
#define TOWERS_MAC(i)                                                                           \
  g##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + eg + 2 * p), g##i, gu##i); \
  g##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + eg + 8 + 2 * p), g##i, gu##i);
          TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
        }
      }
      const auto scv = hn::PromoteTo(d32, hn::LoadU(di8x32, sc + 16 * g));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::RearrangeToOddPlusEven(g##i, gu##i), scv));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
  } else {
    static_assert(kType == kQ4_K || kType == kQ5_K);
    // Per 32-element sub-block j: int32 sums of q * x (q in 0..15; Q5_K 0..31), times the row's 6-bit
    // scale (|sum| <= 31 * 127 * 32, times 63, times 8 sub-blocks < 2^31). Chunk p of part c holds
    // sub-block 2c's elements 2p, 2p+1 (low nibbles) and sub-block 2c+1's (high nibbles); Q5_K's
    // fifth bits of those elements are bits 2c and 2c+1 of qh chunk p.
    const hn::Rebind<uint8_t, D32> du8x32;
    const uint8_t* HWY_RESTRICT sc = blk + kQ4KScales + sl;
    const uint8_t* HWY_RESTRICT q = blk + kQ4KQuants + 2 * sl;
    const auto k16 = hn::Set(du16, uint16_t{16});
    const uint8_t* HWY_RESTRICT qh = blk + kQ5KQh + 2 * sl;
    auto fifth = [&](decltype(k16) H, int bit) {  // Q5_K: bit `bit` of a qh chunk H, as 16
      return hn::And(hn::ShiftLeft<4>(hn::ShiftRightSame(H, bit)), k16);
    };
    // Up to 4 tokens: both sub-blocks of a part at once (each chunk unpacked once).
    if constexpr (R <= 4) for (size_t c = 0; c < 4; ++c) {
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(h, z)
      TOWERS_ZERO8(lu, z)
      TOWERS_ZERO8(hu, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ec = 64 * c;
      for (size_t p = 0; p < 16; ++p) {
        const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qc + 32 * p));
        auto lo16 = hn::And(bytes, k15), hi16 = hn::ShiftRight<4>(bytes);
        if constexpr (kType == kQ5_K) {
          const auto H = hn::PromoteTo(du16, hn::LoadU(du8, qh + 32 * p));
          lo16 = hn::Or(lo16, fifth(H, static_cast<int>(2 * c)));
          hi16 = hn::Or(hi16, fifth(H, static_cast<int>(2 * c + 1)));
        }
        const auto lo = hn::BitCast(d16, lo16);
        const auto hi = hn::BitCast(d16, hi16);
#define TOWERS_MAC(i)                                                                               \
  l##i = hn::ReorderWidenMulAccumulate(d32, lo, PairAt(d16, aq##i + ec + 2 * p), l##i, lu##i);      \
  h##i = hn::ReorderWidenMulAccumulate(d32, hi, PairAt(d16, aq##i + ec + 32 + 2 * p), h##i, hu##i);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scl = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c));
      const auto sch = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 32 * c + 16));
#define TOWERS_SC(i)                                                                  \
  s##i = hn::Add(s##i, hn::Add(hn::Mul(hn::RearrangeToOddPlusEven(l##i, lu##i), scl), \
                               hn::Mul(hn::RearrangeToOddPlusEven(h##i, hu##i), sch)));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // 5 to 8 tokens: one sub-block j = 2c + half at a time (the low or high nibbles of part c's
    // chunks), so fewer accumulators are live (no spills); the chunks are unpacked once per half.
    if constexpr (R > 4) for (size_t j = 0; j < 8; ++j) {
      const size_t c = j / 2, half = j % 2;
      TOWERS_ZERO8(l, z)
      TOWERS_ZERO8(lu, z)
      const uint8_t* HWY_RESTRICT qc = q + 512 * c;
      const size_t ej = 64 * c + 32 * half;
      for (size_t p = 0; p < 16; ++p) {
        const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, qc + 32 * p));
        auto w16 = half ? hn::ShiftRight<4>(bytes) : hn::And(bytes, k15);
        if constexpr (kType == kQ5_K) {
          w16 = hn::Or(w16, fifth(hn::PromoteTo(du16, hn::LoadU(du8, qh + 32 * p)), static_cast<int>(j)));
        }
        const auto w = hn::BitCast(d16, w16);
#define TOWERS_MAC(i) l##i = hn::ReorderWidenMulAccumulate(d32, w, PairAt(d16, aq##i + ej + 2 * p), l##i, lu##i);
        TOWERS_EACH_P(TOWERS_MAC)
#undef TOWERS_MAC
      }
      const auto scj = hn::PromoteTo(d32, hn::LoadU(du8x32, sc + 16 * j));
#define TOWERS_SC(i) s##i = hn::Add(s##i, hn::Mul(hn::RearrangeToOddPlusEven(l##i, lu##i), scj));
      TOWERS_EACH_P(TOWERS_SC)
#undef TOWERS_SC
    }
    // Min term: sum_j min_j * bsum_j (the activation's 32-element sums).
    Q4KMinSums<R>(d32, blk + kQ4KMins + 2 * sl, A, b, m0, m1, m2, m3, m4, m5, m6, m7);
  }
}
#undef TOWERS_ACT_AT

constexpr size_t kPrefetchBytes = 4096;  // how far ahead PackedGroup prefetches weights (decode)

// acc (one slice of a token's 16 rows) += (s as f32) * (dw * dx): the only f32 rounding steps.
template <class DF, class V32>
HWY_INLINE void AccumulateSlice(DF df, float* HWY_RESTRICT acc, V32 s, hn::Vec<DF> dw, float dx) {
  hn::Store(hn::MulAdd(hn::ConvertTo(df, s), hn::Mul(dw, hn::Set(df, dx)), hn::Load(df, acc)), df, acc);
}

// acc += m_w * ds_x (Q4_1's and Q5_1's offsets; the same operation as the decode path's).
template <class DF>
HWY_INLINE void AccumulateOffset(DF df, float* HWY_RESTRICT acc, hn::Vec<DF> mw, float dsx) {
  hn::Store(hn::MulAdd(mw, hn::Set(df, dsx), hn::Load(df, acc)), df, acc);
}

template <GgmlType kType, size_t R>
HWY_NOINLINE void PackedGroup(const uint8_t* HWY_RESTRICT grp, const ActRow* A, size_t nb,
                              float* HWY_RESTRICT y, size_t ldy) {
  const hn::CappedTag<int32_t, kPackRows> d32;
  const hn::Rebind<float, decltype(d32)> df;
  const hn::Rebind<hwy::float16_t, decltype(d32)> dh;
  const size_t NR = hn::Lanes(d32);  // rows per slice
  using V32 = hn::Vec<decltype(d32)>;
  constexpr size_t kGB = kPackRows * packed_block_bytes(kType);
  // Exact int32 sums of slice sl of block b (blk) for every token (the target's best kernel).
#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
  const bool sdot = dotprod_enabled();  // read once per group: a setting, not per block
#endif
  auto block_sums = [&](const uint8_t* HWY_RESTRICT blk, size_t sl, size_t b, TOWERS_V8(s), TOWERS_V8(m)) {
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = hn::Zero(d32);
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = s0;
#if HWY_TARGET == HWY_AVX3_DL
    PackedSumsVnni<kType, R>(d32, blk, A, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
    return;
#endif
#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
    if (sdot) {
      PackedSumsSdot<kType, R>(d32, blk, sl, A, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      return;
    }
#endif
    PackedSums<kType, R>(d32, blk, sl, A, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
  };
  // Decode streams each weight byte once: ask for the bytes 4 KiB ahead (past the group's end, the
  // next group's). Measured with 1 GB of packed Q4_0 (2 threads, 6 interleaved pairs): +6% at 2
  // threads, +25% at 1; 1 KiB, 8 KiB and 16 KiB ahead were worse. Prefill is compute-bound (R > 2)
  // and skips it. A prefetch never faults, even past the buffer.
  auto prefetch = [](const uint8_t* blk) {
    if constexpr (R <= 2) {
      for (size_t o = 0; o < kGB; o += 64) hwy::Prefetch(blk + kPrefetchBytes + o);
    }
  };
  if (R <= 2 && NR == kPackRows) {
    // Decode, and one slice holds all 16 rows (AVX-512): the accumulators stay in registers.
    // (Through memory, each block's multiply-add waited on the previous block's store: a dependency
    // chain per block. With more tokens the extra registers made the kernels spill.) The operations
    // are those of AccumulateSlice, in the same order: the same bits.
    auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* HWY_RESTRICT blk = grp + b * kGB;
      prefetch(blk);
      const auto* HWY_RESTRICT f16 = reinterpret_cast<const hwy::float16_t*>(blk + kPackedD);
      V32 s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7;
      block_sums(blk, 0, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      const auto dw = hn::PromoteTo(df, hn::LoadU(dh, f16));
#define TOWERS_ACC(i) a##i = hn::MulAdd(hn::ConvertTo(df, s##i), hn::Mul(dw, hn::Set(df, A[i].d[b])), a##i);
      TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      if constexpr (kHasMin<kType>) {
        const auto ndmin = hn::Neg(hn::PromoteTo(df, hn::LoadU(dh, f16 + kPackRows)));
#define TOWERS_ACC(i) a##i = hn::MulAdd(hn::ConvertTo(df, m##i), hn::Mul(ndmin, hn::Set(df, A[i].d[b])), a##i);
        TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      }
      if constexpr (kAffine<kType>) {
        const auto mw = hn::PromoteTo(df, hn::LoadU(dh, f16 + kPackRows));
#define TOWERS_ACC(i) a##i = hn::MulAdd(mw, hn::Set(df, A[i].ds[b]), a##i);
        TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      }
    }
#define TOWERS_OUT(i) hn::StoreU(a##i, df, y + (i) * ldy);
    TOWERS_EACH_P(TOWERS_OUT)
#undef TOWERS_OUT
    return;
  }
  HWY_ALIGN float acc[kMaxPackR * kPackRows];
  for (size_t i = 0; i < R * kPackRows; ++i) acc[i] = 0.f;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* HWY_RESTRICT blk = grp + b * kGB;
    prefetch(blk);
    const auto* HWY_RESTRICT f16 = reinterpret_cast<const hwy::float16_t*>(blk + kPackedD);
    for (size_t sl = 0; sl < kPackRows; sl += NR) {
      V32 s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7;
      block_sums(blk, sl, b, s0, s1, s2, s3, s4, s5, s6, s7, m0, m1, m2, m3, m4, m5, m6, m7);
      const auto dw = hn::PromoteTo(df, hn::LoadU(dh, f16 + sl));
#define TOWERS_ACC(i) AccumulateSlice(df, acc + (i) * kPackRows + sl, s##i, dw, A[i].d[b]);
      TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      if constexpr (kHasMin<kType>) {
        const auto ndmin = hn::Neg(hn::PromoteTo(df, hn::LoadU(dh, f16 + kPackRows + sl)));
#define TOWERS_ACC(i) AccumulateSlice(df, acc + (i) * kPackRows + sl, m##i, ndmin, A[i].d[b]);
        TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      }
      if constexpr (kAffine<kType>) {
        const auto mw = hn::PromoteTo(df, hn::LoadU(dh, f16 + kPackRows + sl));
#define TOWERS_ACC(i) AccumulateOffset(df, acc + (i) * kPackRows + sl, mw, A[i].ds[b]);
        TOWERS_EACH_P(TOWERS_ACC)
#undef TOWERS_ACC
      }
    }
  }
  for (size_t i = 0; i < R; ++i) std::memcpy(y + i * ldy, acc + i * kPackRows, kPackRows * sizeof(float));
}
#endif  // HWY_TARGET == HWY_SCALAR

template <GgmlType kType>
void GemmPackedType(const uint8_t* packed, size_t groups, const uint8_t* act, size_t act_stride,
                    size_t T, size_t n, float* y, size_t ldy) {
  const size_t nb = n / act_block(kType);
  const size_t gbytes = nb * kPackRows * packed_block_bytes(kType);
  // Token tiles whose activations stay in L2 while the groups stream past them (order only).
  constexpr size_t kActBudget = 256 * 1024;
  // Q6_K's madd kernel spills with 8 tokens (its 6-bit unpacking needs more registers): 4; Q2_K's and
  // Q3_K's too (their m or hmask terms).
  constexpr size_t kR = (kType == kQ6_K || kType == kQ2_K || kType == kQ3_K) && HWY_TARGET != HWY_AVX3_DL
                           ? std::min<size_t>(kPackR, 4) : kPackR;
  constexpr size_t kMaxSteps = 32;  // token steps per tile (bounds the tile's ActRow table)
  const size_t tb = std::min(kMaxSteps * kR, std::max<size_t>(kR, (kActBudget / act_stride) / kR * kR));
  // The activation rows of one token tile, kR at a time (built once per tile, not once per group).
  std::array<ActRow, kMaxPackR> tiles[kMaxSteps];
  for (size_t t0 = 0; t0 < T; t0 += tb) {
    const size_t t1 = std::min(T, t0 + tb);
    for (size_t t = t0; t < t1; t += kR) {
      const size_t cnt = std::min(kR, t1 - t);
      for (size_t i = 0; i < kMaxPackR; ++i) {
        tiles[(t - t0) / kR][i] = act_row(kType, act + (t + (i < cnt ? i : 0)) * act_stride, n);
      }
    }
    for (size_t g = 0; g < groups; ++g) {
      const uint8_t* grp = packed + g * gbytes;
      for (size_t t = t0; t < t1; t += kR) {
        const size_t cnt = std::min(kR, t1 - t);
        const ActRow* A = tiles[(t - t0) / kR].data();
        float* yo = y + t * ldy + g * kPackRows;
        switch (cnt) {
          case 8: PackedGroup<kType, kR == 8 ? 8 : 1>(grp, A, nb, yo, ldy); break;
          case 7: PackedGroup<kType, kR == 8 ? 7 : 1>(grp, A, nb, yo, ldy); break;
          case 6: PackedGroup<kType, kR == 8 ? 6 : 1>(grp, A, nb, yo, ldy); break;
          case 5: PackedGroup<kType, kR == 8 ? 5 : 1>(grp, A, nb, yo, ldy); break;
          case 4: PackedGroup<kType, 4>(grp, A, nb, yo, ldy); break;
          case 3: PackedGroup<kType, 3>(grp, A, nb, yo, ldy); break;
          case 2: PackedGroup<kType, 2>(grp, A, nb, yo, ldy); break;
          default: PackedGroup<kType, 1>(grp, A, nb, yo, ldy); break;
        }
      }
    }
  }
}

void GemmPacked(uint32_t type, const void* packed, size_t groups, const void* act, size_t act_stride,
                size_t T, size_t n, float* y, size_t ldy) {
  const auto* pb = static_cast<const uint8_t*>(packed);
  const auto* ab = static_cast<const uint8_t*>(act);
  switch (static_cast<GgmlType>(type)) {
    case kQ4_0: return GemmPackedType<kQ4_0>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ8_0: return GemmPackedType<kQ8_0>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ4_K: return GemmPackedType<kQ4_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ5_K: return GemmPackedType<kQ5_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ4_1: return GemmPackedType<kQ4_1>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ5_0: return GemmPackedType<kQ5_0>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ5_1: return GemmPackedType<kQ5_1>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ6_K: return GemmPackedType<kQ6_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kIQ4_NL: return GemmPackedType<kIQ4_NL>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kIQ4_XS: return GemmPackedType<kIQ4_XS>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ2_K: return GemmPackedType<kQ2_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    case kQ3_K: return GemmPackedType<kQ3_K>(pb, groups, ab, act_stride, T, n, y, ldy);
    default: return;
  }
}


const char* QuantDotTarget() { return hwy::TargetName(HWY_TARGET); }

bool PackedUsesSdot() {
#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
  return dotprod_enabled();
#else
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace towers::simd {
namespace {
std::atomic<bool> g_dotprod_allowed{true};

bool cpu_has_dotprod() {
#if defined(__aarch64__) && defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}
}  // namespace

void set_packed_dotprod(bool allowed) { g_dotprod_allowed.store(allowed, std::memory_order_relaxed); }

bool dotprod_enabled() {
  static const bool has = cpu_has_dotprod();
  return has && g_dotprod_allowed.load(std::memory_order_relaxed);
}

HWY_EXPORT(GemmPacked);
HWY_EXPORT(QuantDotTarget);
HWY_EXPORT(PackedUsesSdot);

bool packed_dotprod() { return HWY_DYNAMIC_DISPATCH(PackedUsesSdot)(); }

const char* quant_dot_target() { return HWY_DYNAMIC_DISPATCH(QuantDotTarget)(); }

void gemm_packed(uint32_t t, const void* packed, size_t groups, const void* act, size_t act_stride,
                 size_t T, size_t n, float* y, size_t ldy) {
  if (!has_packed(t) || groups == 0 || T == 0) return;
  HWY_DYNAMIC_DISPATCH(GemmPacked)(t, packed, groups, act, act_stride, T, n, y, ldy);
}
}  // namespace towers::simd
#endif

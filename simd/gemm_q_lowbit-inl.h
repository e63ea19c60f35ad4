// gemm_q's kernels for the low-bit K formats Q2_K and Q3_K and for IQ4_XS (all against A256). Each
// weight block is unpacked once into int16 weights already multiplied by their sub-block scale
// (|q * scale| <= 4064), applied to up to 4 activation rows with int16 madd into exact int32 sums, and
// accumulated in f32 once per block, as RowK45 and RowQ6K in gemm_q.cc do. Included once per Highway
// target by gemm_q.cc.
#if defined(TOWERS_SIMD_GEMM_Q_LOWBIT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TOWERS_SIMD_GEMM_Q_LOWBIT_INL_H_
#undef TOWERS_SIMD_GEMM_Q_LOWBIT_INL_H_
#else
#define TOWERS_SIMD_GEMM_Q_LOWBIT_INL_H_
#endif

#include <cstring>

#include <hwy/highway.h>

#include "simd/ggml_blocks.h"
#include "simd/quant_dot-inl.h"
#include "simd/quant_layout.h"

HWY_BEFORE_NAMESPACE();
namespace towers::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Up to 4 activation rows: their int16 quants from element e, and the int32 accumulator pairs.
#define TOWERS_LB_MAC(i) s##i = hn::ReorderWidenMulAccumulate(d32, wv, hn::LoadU(d16, A[i].q + e), s##i, u##i);
#define TOWERS_LB_MACS TOWERS_EACH_R(TOWERS_LB_MAC)
// With one activation row, a second accumulator pair (t0, v0) halves the madd dependency chain;
// the int32 sums are exact, so how they are grouped does not change them.
#define TOWERS_LB_MAC_ALT(i)                                                                     \
  if constexpr (R == 1) {                                                                        \
    t0 = hn::ReorderWidenMulAccumulate(d32, wv, hn::LoadU(d16, A[0].q + e), t0, v0);             \
  } else {                                                                                       \
    TOWERS_LB_MAC(i)                                                                             \
  }
#define TOWERS_LB_MACS_ALT TOWERS_EACH_R(TOWERS_LB_MAC_ALT)
// Folds (t0, v0) into (s0, u0) at the end of a block, lane by lane: both pairs hold the same
// elements' products in the same lanes, so the sums are those of one pair. (Rearranging each pair
// first and then the sum again is the same only where RearrangeToOddPlusEven adds lane by lane, as
// on x86; on NEON it pairs lanes, and a second one moved the sums to other lanes: T = 1 then gave
// other bits than T = 5 after the f32 steps.)
#define TOWERS_LB_FOLD                                                                          \
  if constexpr (R == 1) {                                                                        \
    s0 = hn::Add(s0, t0);                                                                        \
    u0 = hn::Add(u0, v0);                                                                        \
  }
// After block b: acc_i += (scale * d_x) * (row i's exact int32 sums s_i + u_i).
#define TOWERS_LB_ACC1(acc, s, u, scale, i)                                                         \
  acc##i = hn::MulAdd(hn::Set(df, (scale) * A[i].d[b]),                                           \
                      hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s##i, u##i)), acc##i);
#define TOWERS_LB_ACC(i) TOWERS_LB_ACC1(acc, s, u, d, i)

// Q2_K and Q3_K (16 sub-blocks of 16; element 128h + 32j + 16k + l is bits 2j of qs[32h + 16k + l]).
// Q2_K: w = (scale & 15) * q, and the min term sum_s (scale_s >> 4) * (A256's 16-element sum s).
// Q3_K: w = (scale - 32) * (q2 | hbit << 2) - 4 * (scale - 32), the hbit from hmask[16k + l].
template <GgmlType kType, size_t R>
HWY_NOINLINE void RowQ23K(const BlockOf<kType>* HWY_RESTRICT w, const qd::ActRow* A, size_t nb,
                          float* HWY_RESTRICT out) {
  const hn::CappedTag<int16_t, 16> d16;  // a vector never straddles two 16-element sub-blocks
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const size_t N = hn::Lanes(d16);
  constexpr bool kQ2 = kType == GgmlType::Q2_K;

  auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  auto macc0 = acc0, macc1 = acc0, macc2 = acc0, macc3 = acc0;  // Q2_K's min terms
  const auto k3 = hn::Set(du16, uint16_t{3});
  const auto k4 = hn::Set(du16, uint16_t{4});
  (void)k4;

  for (size_t b = 0; b < nb; ++b) {
    const BlockOf<kType>& blk = w[b];
    const float d = LoadF16(blk.d);
    // The 16 scales as int8 (Q2_K: scale & 15; Q3_K: code - 32), written as two 64-bit words.
    uint64_t words[2];
    if constexpr (kQ2) {
      std::memcpy(words, blk.scales, 16);
      words[0] &= 0x0F0F0F0F0F0F0F0Full;
      words[1] &= 0x0F0F0F0F0F0F0F0Full;
    } else {
      unpack_scales_q3k_words(blk.scales, words);
      words[0] = minus32_codes(words[0]);
      words[1] = minus32_codes(words[1]);
    }
    HWY_ALIGN int8_t sc[16];
    std::memcpy(sc, words, 16);
    HWY_ALIGN uint32_t sc2[16];
    ScalePairs<16>(sc, sc2);
    const size_t e0 = b * 256;
    auto s0 = hn::Zero(d32), s1 = s0, s2 = s0, s3 = s0;
    auto u0 = s0, u1 = s0, u2 = s0, u3 = s0;
    auto t0 = s0, v0 = s0;
    (void)t0, (void)v0;
    for (size_t h = 0; h < 2; ++h) {
      for (size_t k = 0; k < 2; ++k) {
        for (size_t l = 0; l < 16; l += N) {
          const auto bytes = hn::PromoteTo(du16, hn::LoadU(du8, blk.qs + 32 * h + 16 * k + l));
          // Q3_K: the high bits of these elements, bit 4h + j for part j, moved to bit j + 2.
          auto hm4 = bytes;
          if constexpr (!kQ2) {
            hm4 = hn::ShiftLeft<2>(hn::PromoteTo(du16, hn::LoadU(du8, blk.hmask + 16 * k + l)));
            hm4 = hn::ShiftRightSame(hm4, static_cast<int>(4 * h));
          }
          _Pragma("GCC unroll 4") for (size_t j = 0; j < 4; ++j) {
            auto q = hn::And(hn::ShiftRightSame(bytes, static_cast<int>(2 * j)), k3);
            if constexpr (!kQ2) q = hn::Sub(hn::Or(q, hn::And(hn::ShiftRightSame(hm4, static_cast<int>(j)), k4)), k4);
            const auto wv = hn::Mul(hn::BitCast(d16, q), SetPair(d16, sc2[8 * h + 2 * j + k]));
            const size_t e = e0 + 128 * h + 32 * j + 16 * k + l;
            if (j % 2 == 0) {
              TOWERS_LB_MACS
            } else {
              TOWERS_LB_MACS_ALT
            }
          }
        }
      }
    }
    TOWERS_LB_FOLD
    TOWERS_EACH_R(TOWERS_LB_ACC)
    if constexpr (kQ2) {
      // sum_s mn[s] * bs16[s], exact int32 lanes.
      const float dmin = LoadF16(blk.dmin);
      auto ms0 = hn::Zero(d32), ms1 = ms0, ms2 = ms0, ms3 = ms0;
      auto mu0 = ms0, mu1 = ms0, mu2 = ms0, mu3 = ms0;
      for (size_t g = 0; g < 16; g += N) {
        const auto mv = hn::BitCast(d16, hn::ShiftRight<4>(hn::PromoteTo(du16, hn::LoadU(du8, blk.scales + g))));
#define TOWERS_MIN(i) ms##i = hn::ReorderWidenMulAccumulate(d32, mv, hn::LoadU(d16, A[i].bs16 + 16 * b + g), ms##i, mu##i);
        TOWERS_EACH_R(TOWERS_MIN)
#undef TOWERS_MIN
      }
#define TOWERS_MACC(i) TOWERS_LB_ACC1(macc, ms, mu, dmin, i)
      TOWERS_EACH_R(TOWERS_MACC)
#undef TOWERS_MACC
    }
  }
#define TOWERS_OUT(i) out[i] = hn::GetLane(hn::SumOfLanes(df, acc##i)) - hn::GetLane(hn::SumOfLanes(df, macc##i));
  TOWERS_EACH_R(TOWERS_OUT)
#undef TOWERS_OUT
}

// IQ4_XS (8 sub-blocks of 32; element 32j + 16k + l is nibble k of qs[16j + l]): w = (ls_j - 32) *
// kIq4nlValues[nibble].
template <size_t R>
HWY_NOINLINE void RowIQ4XS(const BlockIQ4_XS* HWY_RESTRICT w, const qd::ActRow* A, size_t nb,
                           float* HWY_RESTRICT out) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const size_t N = hn::Lanes(d16);
  const auto k15 = hn::Set(du8, uint8_t{15});

  auto acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (size_t b = 0; b < nb; ++b) {
    const BlockIQ4_XS& blk = w[b];
    const uint64_t codes = minus32_codes(iq4xs_scale_codes(blk));
    HWY_ALIGN int8_t sc[8];
    std::memcpy(sc, &codes, 8);
    HWY_ALIGN uint32_t sc2[8];
    ScalePairs<8>(sc, sc2);
    const size_t e0 = b * 256;
    auto s0 = hn::Zero(d32), s1 = s0, s2 = s0, s3 = s0;
    auto u0 = s0, u1 = s0, u2 = s0, u3 = s0;
    auto t0 = s0, v0 = s0;
    (void)t0, (void)v0;
    for (size_t j = 0; j < 8; ++j) {
      const auto vs = SetPair(d16, sc2[j]);
      for (size_t l = 0; l < 16; l += N) {
        const auto bytes = hn::LoadU(du8, blk.qs + 16 * j + l);
        {
          const auto wv = hn::Mul(Iq4Values(d16, hn::And(bytes, k15)), vs);
          const size_t e = e0 + 32 * j + l;
          TOWERS_LB_MACS
        }
        {
          const auto wv = hn::Mul(Iq4Values(d16, hn::ShiftRight<4>(bytes)), vs);
          const size_t e = e0 + 32 * j + 16 + l;
          TOWERS_LB_MACS_ALT
        }
      }
    }
    const float d = LoadF16(blk.d);
    TOWERS_LB_FOLD
    TOWERS_EACH_R(TOWERS_LB_ACC)
  }
#define TOWERS_OUT(i) out[i] = hn::GetLane(hn::SumOfLanes(df, acc##i));
  TOWERS_EACH_R(TOWERS_OUT)
#undef TOWERS_OUT
}

#undef TOWERS_LB_ACC
#undef TOWERS_LB_ACC1
#undef TOWERS_LB_FOLD
#undef TOWERS_LB_MACS_ALT
#undef TOWERS_LB_MAC_ALT
#undef TOWERS_LB_MACS
#undef TOWERS_LB_MAC

}  // namespace HWY_NAMESPACE
}  // namespace towers::simd
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
